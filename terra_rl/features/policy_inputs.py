"""What the excavation policy computes from the observation dict before any parameter: the
parameter-free inputs of `derived_features` (the flat encoder's map input,
`terra_rl.features.global_maps`; the compass, the dig and pose distances, the egocentric
view), which a rollout computes once and stores
(`terra_rl.nets.models.with_derived_features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

from terra_rl.features.compass import compass
from terra_rl.features.dig_distance import dig_distance_features, work_in_reach
from terra_rl.features.egocentric import egocentric_view
from terra_rl.features.global_maps import map_input
from terra_rl.features.pose_distance import pose_distance_features
from terra_rl.features.reach_cache import (
    DIG_DISTANCES_KEY,
    IN_REACH_KEY,
    POOLED_MAPS_KEY,
    POSE_DISTANCES_KEY,
)

if TYPE_CHECKING:
    from terra_rl.nets.models import PolicyConfig


def stores_map_input(config: PolicyConfig) -> bool:
    """Whether a rollout stores the map encoder's input with its observations (and its cache
    keeps the pooled map layers): for the flat encoder on XLA:CPU (`derived_features`)."""
    return config.map_encoder == "flat" and jax.default_backend() == "cpu"


def derived_features(obs: dict, config: PolicyConfig) -> dict[str, jax.Array]:
    """The parameter-free observation features `config` asks for: "compass" float32
    [..., 240], "dig_distance" float32 [..., 38], "pose_distance" float32 [..., 14],
    "egocentric_view" float32 [..., S, S, 4], and for the flat map encoder its input
    "map_input" float32 [..., M, M, 8] (`map_input`).
    A key already in `obs` is taken from it, not computed again. The dig and pose distances
    lead to the same goals (`work_in_reach`), computed once for both; a rollout that keeps
    them (`terra_rl.features.reach_cache`) hands them over as `obs[IN_REACH_KEY]`, the pose
    distances as `obs[POSE_DISTANCES_KEY]` and the dig-distance field at the agent's tiles as
    `obs[DIG_DISTANCES_KEY]`, and the flat encoder's pooled map layers as
    `obs[POOLED_MAPS_KEY]`.

    The map input is stored only for the flat encoder on XLA:CPU. There its small maps make it
    8 KB a sample (16x16, or 32x32 pooled by 2), and building it again in each gradient pass
    took 8.5% of `cpu_demo`'s update. The convolutional encoders, meant for large maps, and
    every encoder on a GPU, where memory is what runs out and the build is cheap, recompute
    it: a 64x64 map would take 128 KB a sample."""
    enabled = {
        "map_input": stores_map_input(config),
        "compass": config.compass,
        "dig_distance": config.dig_distance,
        "pose_distance": config.pose_distance,
        "egocentric_view": config.egocentric_radius > 0,
    }
    missing = {key for key, on in enabled.items() if on and key not in obs}
    in_reach = None
    if missing & {"dig_distance", "pose_distance"}:
        in_reach = obs[IN_REACH_KEY] if IN_REACH_KEY in obs else work_in_reach(obs)
    compute = {
        "map_input": lambda: map_input(obs, config.map_pool, obs.get(POOLED_MAPS_KEY)),
        "compass": lambda: compass(obs),
        "dig_distance": lambda: dig_distance_features(obs, in_reach,
                                                      obs.get(DIG_DISTANCES_KEY)),
        "pose_distance": lambda: pose_distance_features(obs, in_reach, config.wheeled_agents,
                                                        obs.get(POSE_DISTANCES_KEY)),
        "egocentric_view": lambda: egocentric_view(obs, config.egocentric_radius),
    }
    return {key: obs[key] if key in obs else compute[key]()
            for key, on in enabled.items() if on}
