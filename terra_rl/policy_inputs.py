"""What the excavation policy computes from the observation dict before any parameter: the
global maps as channels (`map_channels`, pooled by `pool_tiles`: the map encoder's
`map_input`), and the parameter-free inputs of `derived_features` (the flat encoder's map
input, the compass, the dig and pose distances, the egocentric view), which a rollout
computes once and stores (`terra_rl.models.with_derived_features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from terra_rl.compass import compass
from terra_rl.dig_distance import dig_distance_features, work_in_reach
from terra_rl.egocentric import egocentric_view
from terra_rl.pose_distance import pose_distance_features

if TYPE_CHECKING:
    from terra_rl.models import PolicyConfig


def map_channels(obs: dict) -> jax.Array:
    """float32 [B, N, N, 7]: the global layers as CNN channels.

    Channels: dig target, dump zone, log1p(dug depth), log1p(dumped height), obstacle,
    dumpable, and a one-hot of the agent's (row, col).
    """
    target = obs["target_map"]
    action = obs["action_map"].astype(jnp.float32)
    size = target.shape[-1]
    row_one_hot = jax.nn.one_hot(obs["agent_state"][..., 0], size, dtype=jnp.float32)
    col_one_hot = jax.nn.one_hot(obs["agent_state"][..., 1], size, dtype=jnp.float32)
    layers = [
        (target == -1).astype(jnp.float32),
        (target == 1).astype(jnp.float32),
        jnp.log1p(jnp.maximum(-action, 0.0)),
        jnp.log1p(jnp.maximum(action, 0.0)),
        (obs["obstacles"] == 1).astype(jnp.float32),
        (obs["dumpability"] == 1).astype(jnp.float32),
        row_one_hot[..., :, None] * col_one_hot[..., None, :],
    ]
    return jnp.stack(layers, axis=-1)


def pool_tiles(maps: jax.Array, factor: int) -> jax.Array:
    """[..., N, N, C] -> [..., N / factor, N / factor, C]: the mean over each `factor` x
    `factor` block of tiles."""
    if factor == 1:
        return maps
    *batch, size, _, channels = maps.shape
    if size % factor:
        raise ValueError(f"map_pool {factor} must divide the map size {size}")
    blocks = maps.reshape(*batch, size // factor, factor, size // factor, factor, channels)
    return blocks.mean(axis=(-4, -2))


def pad_channels(x: jax.Array, multiple: int = 8) -> jax.Array:
    """Zero channels up to a multiple of 8: half-precision tensor-core convolutions want
    it (the solo_excavator minibatch gradient: 2.0 -> 1.4 ms in bfloat16 on an H100)."""
    missing = -x.shape[-1] % multiple
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, missing)]) if missing else x


def map_input(obs: dict, map_pool: int) -> jax.Array:
    """The map encoder's input, float32 [..., N / map_pool, N / map_pool, 8]: `map_channels`
    pooled by `pool_tiles` and zero-padded to 8 channels."""
    return pad_channels(pool_tiles(map_channels(obs), map_pool))


def derived_features(obs: dict, config: PolicyConfig) -> dict[str, jax.Array]:
    """The parameter-free observation features `config` asks for: "compass" float32
    [..., 240], "dig_distance" float32 [..., 38], "pose_distance" float32 [..., 14],
    "egocentric_view" float32 [..., S, S, 4], and for the flat map encoder its input
    "map_input" float32 [..., M, M, 8] (`map_input`).
    A key already in `obs` is taken from it, not computed again. The dig and pose distances
    lead to the same goals (`work_in_reach`), computed once for both.

    The map input is stored only for the flat encoder on XLA:CPU. There its small maps make it
    8 KB a sample (16x16, or 32x32 pooled by 2), and building it again in each gradient pass
    took 8.5% of `cpu_demo`'s update. The convolutional encoders, meant for large maps, and
    every encoder on a GPU, where memory is what runs out and the build is cheap, recompute
    it: a 64x64 map would take 128 KB a sample."""
    enabled = {
        "map_input": config.map_encoder == "flat" and jax.default_backend() == "cpu",
        "compass": config.compass,
        "dig_distance": config.dig_distance,
        "pose_distance": config.pose_distance,
        "egocentric_view": config.egocentric_radius > 0,
    }
    missing = {key for key, on in enabled.items() if on and key not in obs}
    in_reach = work_in_reach(obs) if missing & {"dig_distance", "pose_distance"} else None
    compute = {
        "map_input": lambda: map_input(obs, config.map_pool),
        "compass": lambda: compass(obs),
        "dig_distance": lambda: dig_distance_features(obs, in_reach),
        "pose_distance": lambda: pose_distance_features(obs, in_reach, config.wheeled_agents),
        "egocentric_view": lambda: egocentric_view(obs, config.egocentric_radius),
    }
    return {key: obs[key] if key in obs else compute[key]()
            for key, on in enabled.items() if on}
