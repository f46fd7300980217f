"""The compass: where the work lies, seen from the excavator's base.

A global map in absolute coordinates makes the policy learn, for every position and heading,
which way a target lies, a mapping a small network learns slowly and does not transfer to
maps it never saw. The compass counts the tiles of a few layers (soil still to dig, free
dump space, soil lying on the map, blocked tiles) per direction and distance from the
agent, in the frame of its base heading: sector 0 is straight ahead, sector 6 behind. "Turn
towards the target" is then the same input on every map. No parameters; the counts are
observation features, computed inside the network from the observation dict.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from envs.geometry import host_constant

NUM_SECTORS = 12  # one per base heading (30 degrees)
# Distance bin edges in tiles for 16x16 maps; larger maps scale them with the map size, as
# the env scales its footprint and workspace (16x16 reach: 1.5..3 tiles).
DISTANCE_EDGES_16 = (1.5, 3.0, 5.0, 8.0)
NUM_DISTANCE_BINS = len(DISTANCE_EDGES_16) + 1
LAYERS = ("to_dig", "free_dump_space", "soil", "blocked")
NUM_FEATURES = NUM_SECTORS * NUM_DISTANCE_BINS * len(LAYERS)
# Tiles exactly between two sectors (e.g. at 45 degrees) go to the anticlockwise one on
# every backend.
_TIE_BREAK = 1e-3


def compass_layers(obs: dict) -> jax.Array:
    """float32 [..., N, N, 4]: the counted layers (see `LAYERS`).

    to_dig: dig target not dug yet. free_dump_space: dumpable, untouched, not to be dug.
    soil: dumped soil (on the map, to pick up or leave). blocked: obstacles and any tile
    dug or dumped on (the footprint cannot cross them).
    """
    target, action = obs["target_map"], obs["action_map"]
    untouched = action == 0
    layers = (
        (target == -1) & untouched,
        (obs["dumpability"] == 1) & untouched & (target != -1),
        action > 0,
        (obs["obstacles"] == 1) | ~untouched,
    )
    return jnp.stack(layers, axis=-1).astype(jnp.float32)


def bins_from_offsets(rel_r: jax.Array, rel_c: jax.Array, heading: jax.Array,
                      map_size: int) -> jax.Array:
    """int32: the bin `sector * NUM_DISTANCE_BINS + distance bin` of a tile at offset
    (rel_r, rel_c) float32 from an agent with base heading `heading` (broadcast together),
    on a map of `map_size` (the distance edges scale with it)."""
    # Heading h points at h * 30 degrees anticlockwise from +column; rows grow downwards.
    angle = jnp.arctan2(-rel_r, rel_c) / (2 * math.pi / NUM_SECTORS)
    heading = (heading % NUM_SECTORS).astype(jnp.float32)
    sector = jnp.floor(angle - heading + 0.5 + _TIE_BREAK).astype(jnp.int32) % NUM_SECTORS
    distance = jnp.sqrt(rel_r**2 + rel_c**2)
    sector = jnp.where(distance == 0, 0, sector)  # the agent's own tile has no direction
    edges = np.asarray(DISTANCE_EDGES_16, np.float32) * (map_size / 16)
    distance_bin = jnp.sum(distance[..., None] >= edges, axis=-1, dtype=jnp.int32)
    return sector * NUM_DISTANCE_BINS + distance_bin


@functools.cache
def _bins_table(map_size: int) -> np.ndarray:
    """int32 [12, 2N - 1, 2N - 1]: `bins_from_offsets` for every heading and every offset
    from -(N - 1) to N - 1, the agent at [h, N - 1, N - 1]."""
    def table():
        offsets = jnp.arange(1 - map_size, map_size, dtype=jnp.float32)
        headings = jnp.arange(NUM_SECTORS, dtype=jnp.int32)[:, None, None]
        return bins_from_offsets(offsets[:, None], offsets[None, :], headings, map_size)

    return host_constant(table)


def compass_bins(agent_state: jax.Array, map_size: int) -> jax.Array:
    """int32 [..., N, N]: each tile's bin `sector * NUM_DISTANCE_BINS + distance bin`,
    seen from the agent of `agent_state` int32 [..., 6] (row, col, base heading, ...).

    A bin depends only on the tile's offset from the agent and on the heading, so each
    agent's bins are an N x N window of one table (`_bins_table`): computing the angles and
    distances of every tile took two thirds of the compass at 64 envs x 32x32."""
    table = jnp.asarray(_bins_table(map_size))
    batch_shape = agent_state.shape[:-1]
    flat = agent_state.reshape(-1, agent_state.shape[-1])

    def window(row, col, heading):
        start = (heading % NUM_SECTORS, map_size - 1 - row, map_size - 1 - col)
        return jax.lax.dynamic_slice(table, start, (1, map_size, map_size))[0]

    bins = jax.vmap(window)(flat[:, 0], flat[:, 1], flat[:, 2])
    return bins.reshape(*batch_shape, map_size, map_size)


def compass(obs: dict) -> jax.Array:
    """float32 [..., NUM_FEATURES]: log1p of the tile count of each layer per sector and
    distance bin, ordered (sector, distance bin, layer). Any leading batch dims."""
    layers = compass_layers(obs)
    map_size = layers.shape[-2]
    batch_shape = layers.shape[:-3]
    bins = compass_bins(obs["agent_state"], map_size)
    num_bins = NUM_SECTORS * NUM_DISTANCE_BINS
    batch = int(np.prod(batch_shape, dtype=np.int64))
    # One segment per (env, bin): a scatter-add, so memory stays O(B * N * N) at 64x64.
    env_offset = (jnp.arange(batch, dtype=jnp.int32) * num_bins)[:, None]
    segments = (bins.reshape(batch, -1) + env_offset).reshape(-1)
    counts = jax.ops.segment_sum(
        layers.reshape(-1, len(LAYERS)), segments, num_segments=batch * num_bins
    )
    return jnp.log1p(counts).reshape(*batch_shape, NUM_FEATURES)
