"""What the excavation policy computes from the observation dict before any parameter: the
global maps as channels (`map_channels`; pooled layer by layer by `pool_tiles`, the map
encoder's `map_input`), and the parameter-free inputs of `derived_features` (the flat encoder's map
input, the compass, the dig and pose distances, the egocentric view), which a rollout
computes once and stores (`terra_rl.nets.models.with_derived_features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from terra_rl.features.compass import compass
from terra_rl.features.dig_distance import dig_distance_features, work_in_reach
from terra_rl.features.egocentric import egocentric_view
from terra_rl.features.pose_distance import pose_distance_features
from terra_rl.features.reach_cache import DIG_DISTANCES_KEY, IN_REACH_KEY, POSE_DISTANCES_KEY

if TYPE_CHECKING:
    from terra_rl.nets.models import PolicyConfig


def map_layers(obs: dict, pool: int = 1) -> list[jax.Array]:
    """float32 [..., N / pool, N / pool] each, in `map_channels`' order: the global layers
    pooled by `pool_tiles`. The agent's tile, pooled, is 1 / pool**2 in its block."""
    target = obs["target_map"]
    action = obs["action_map"].astype(jnp.float32)
    size = target.shape[-1] // pool
    row_one_hot = jax.nn.one_hot(obs["agent_state"][..., 0] // pool, size, dtype=jnp.float32)
    col_one_hot = jax.nn.one_hot(obs["agent_state"][..., 1] // pool, size, dtype=jnp.float32)
    tiles = [
        (target == -1).astype(jnp.float32),
        (target == 1).astype(jnp.float32),
        jnp.log1p(jnp.maximum(-action, 0.0)),
        jnp.log1p(jnp.maximum(action, 0.0)),
        (obs["obstacles"] == 1).astype(jnp.float32),
        (obs["dumpability"] == 1).astype(jnp.float32),
    ]
    agent = row_one_hot[..., :, None] * col_one_hot[..., None, :]
    if pool > 1:  # the mean of one 1 and pool**2 - 1 zeros, exactly
        agent = agent / (pool * pool)
    return [pool_tiles(tile, pool) for tile in tiles] + [agent]


def map_channels(obs: dict) -> jax.Array:
    """float32 [B, N, N, 7]: the global layers as CNN channels.

    Channels: dig target, dump zone, log1p(dug depth), log1p(dumped height), obstacle,
    dumpable, and a one-hot of the agent's (row, col).
    """
    return jnp.stack(map_layers(obs), axis=-1)


def pool_tiles(tiles: jax.Array, factor: int) -> jax.Array:
    """[..., N, N] -> [..., N / factor, N / factor]: the mean over each `factor` x `factor`
    block of tiles.

    A sum of strided slices: each row of the block summed left to right, then the rows
    summed top to bottom, the order XLA:CPU's mean over reshaped block axes takes, so the
    bits are the same. At 64 envs x 32x32 it took a third of the time."""
    if factor == 1:
        return tiles
    if tiles.shape[-1] % factor:
        raise ValueError(f"map_pool {factor} must divide the map size {tiles.shape[-1]}")
    block_rows = []
    for i in range(factor):
        row = tiles[..., i::factor, 0::factor]
        for j in range(1, factor):
            row = row + tiles[..., i::factor, j::factor]
        block_rows.append(row)
    total = block_rows[0]
    for row in block_rows[1:]:
        total = total + row
    return total / (factor * factor)


def map_input(obs: dict, map_pool: int) -> jax.Array:
    """The map encoder's input, float32 [..., N / map_pool, N / map_pool, 8]: `map_channels`
    pooled by `pool_tiles` and zero-padded to 8 channels. Each layer is pooled before the
    channels are stacked: pooling the stacked channels took 3x as long."""
    layers = map_layers(obs, map_pool)
    # Zero channels up to 8: half-precision tensor-core convolutions want a multiple of 8
    # (the solo_excavator minibatch gradient: 2.0 -> 1.4 ms in bfloat16 on an H100). Stacked
    # with the rest: a pad after the stack took twice as long on XLA:CPU.
    layers += [jnp.zeros_like(layers[0])] * (-len(layers) % 8)
    return jnp.stack(layers, axis=-1)


def derived_features(obs: dict, config: PolicyConfig) -> dict[str, jax.Array]:
    """The parameter-free observation features `config` asks for: "compass" float32
    [..., 240], "dig_distance" float32 [..., 38], "pose_distance" float32 [..., 14],
    "egocentric_view" float32 [..., S, S, 4], and for the flat map encoder its input
    "map_input" float32 [..., M, M, 8] (`map_input`).
    A key already in `obs` is taken from it, not computed again. The dig and pose distances
    lead to the same goals (`work_in_reach`), computed once for both; a rollout that keeps
    them (`terra_rl.features.reach_cache`) hands them over as `obs[IN_REACH_KEY]`, the pose
    distances as `obs[POSE_DISTANCES_KEY]` and the dig-distance field at the agent's tiles as
    `obs[DIG_DISTANCES_KEY]`.

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
    in_reach = None
    if missing & {"dig_distance", "pose_distance"}:
        in_reach = obs[IN_REACH_KEY] if IN_REACH_KEY in obs else work_in_reach(obs)
    compute = {
        "map_input": lambda: map_input(obs, config.map_pool),
        "compass": lambda: compass(obs),
        "dig_distance": lambda: dig_distance_features(obs, in_reach,
                                                      obs.get(DIG_DISTANCES_KEY)),
        "pose_distance": lambda: pose_distance_features(obs, in_reach, config.wheeled_agents,
                                                        obs.get(POSE_DISTANCES_KEY)),
        "egocentric_view": lambda: egocentric_view(obs, config.egocentric_radius),
    }
    return {key: obs[key] if key in obs else compute[key]()
            for key, on in enabled.items() if on}
