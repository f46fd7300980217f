"""The dig-distance field: how far the excavator must drive to a tile it can dig from.

The compass says in which direction undug targets lie, not from which tile the arm reaches
one, nor how to get there around the tiles that digs, dumps and obstacles have blocked. Once
the easy targets are gone, that navigation is where a reactive policy stalls
(docs/RESULTS.md). This field answers it: a breadth-first search over the map's free tiles,
in 8-connected steps, from every free tile that has an undug target within the arm's ring
(the env's workspace radii); once every target is dug, from those with soil in reach that
lies outside the dump zones, the task's last stage (and there, where possible, only from
tiles whose ring also covers a free tile of a zone). The policy gets the distance at its own
tile and at the next tile in each of 12 directions counted from its base heading, so "drive
downhill" is the same input on every map. The search ignores the footprint's length and the
heading, so it is a guide, not a plan. No parameters; computed from the observation dict
(once per rollout step, `terra_rl.nets.models.with_derived_features`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envs import move_search, reachability
from envs.config import EnvConfig

NUM_DIRECTIONS = 12  # one per base heading (30 degrees), direction 0 straight ahead
NUM_FEATURES = 2 + 3 * NUM_DIRECTIONS


def ring_offsets(map_size: int) -> tuple[tuple[int, int], ...]:
    """(row, col) offsets of the tiles within the arm's ring (the env's workspace radii,
    every arm heading) around a base tile: `envs.reachability.ring_offsets`."""
    return reachability.ring_offsets(EnvConfig(map_size=map_size))


def direction_offsets() -> np.ndarray:
    """int32 [12, 2]: the neighbouring tile (row, col step) in the direction of heading h
    (h * 30 degrees anticlockwise from +column, rows growing downwards, as the env)."""
    angles = np.arange(NUM_DIRECTIONS) * 2 * math.pi / NUM_DIRECTIONS
    steps = np.stack([-np.sin(angles), np.cos(angles)], axis=-1)
    steps = steps / np.max(np.abs(steps), axis=-1, keepdims=True)
    return np.round(steps).astype(np.int32)


def _shift(x: jax.Array, dr: int, dc: int, fill) -> jax.Array:
    """y[..., r, c] = x[..., r + dr, c + dc], `fill` outside the map."""
    n = x.shape[-1]
    pad = max(abs(dr), abs(dc))
    widths = [(0, 0)] * (x.ndim - 2) + [(pad, pad), (pad, pad)]
    padded = jnp.pad(x, widths, constant_values=fill)
    return padded[..., pad + dr : pad + dr + n, pad + dc : pad + dc + n]


def dig_distance_field(obs: dict, in_reach: jax.Array | None = None) -> jax.Array:
    """int32 [..., N, N]: 8-connected steps over free tiles from each tile to the nearest
    free tile with a work tile (`work_tiles`: an undug target, or misplaced soil once every
    target is dug) in the arm's ring; `unreachable_distance(N)` where none is reachable (or
    the tile is blocked). Free: no obstacle, not dug, soil no higher than the env's default
    `drivable_soil_height` of 1 (the config allows this field with no other).
    `in_reach` bool [..., N, N]: `work_in_reach(obs)`, where the caller has it already."""
    size = obs["target_map"].shape[-1]
    free = free_tiles(obs)
    in_reach = work_in_reach(obs) if in_reach is None else in_reach
    far = unreachable_distance(size)
    start = jnp.where(free & in_reach, 0, far).astype(jnp.int32)
    neighbours = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]

    def relax(_, dist):
        nearest = dist
        for dr, dc in neighbours:
            nearest = jnp.minimum(nearest, _shift(dist, dr, dc, far) + 1)
        return jnp.where(free, jnp.minimum(nearest, far), far)

    return jax.lax.fori_loop(0, unreachable_distance(size) - 1, relax, start)


def free_tiles(obs: dict) -> jax.Array:
    """bool [..., N, N]: the tiles the search drives over: no obstacle, not dug, soil no
    higher than the env's default `drivable_soil_height` of 1."""
    action = obs["action_map"]
    return (obs["obstacles"] == 0) & (action >= 0) & (action <= 1)


def work_in_reach(obs: dict) -> jax.Array:
    """bool [..., N, N]: the positions from which the arm's ring (every arm heading) covers a
    work tile (`work_tiles`), whatever lies under the base. In the last stage (every target
    dug, soil left outside the dump zones), only those whose ring also covers a free tile of
    a zone (untouched, dumpable), wherever any position covers both: a loaded base cannot
    move, so soil reaches a zone only from a pose whose arm reaches both."""
    target, action = obs["target_map"], obs["action_map"]
    in_reach = _ring_cover(work_tiles(target, action, obs.get("refused_digs")))
    free_zone = (target == 1) & (action == 0) & (obs["dumpability"] == 1)
    undug_left = jnp.any((target == -1) & (action == 0), axis=(-2, -1), keepdims=True)
    has_zones = jnp.any(target == 1, axis=(-2, -1), keepdims=True)
    # The zones' cover matters only in the last stage, which few envs of a batch are in: a
    # batch with none skips it (under a vmap the cond runs both branches, to the same result).
    zone_cover = jax.lax.cond(jnp.any(has_zones & ~undug_left),
                              lambda: _ring_cover(free_zone), lambda: jnp.zeros_like(free_zone))
    both = in_reach & zone_cover
    last_stage = has_zones & ~undug_left & jnp.any(both, axis=(-2, -1), keepdims=True)
    return jnp.where(last_stage, both, in_reach)


def _ring_cover(tiles: jax.Array) -> jax.Array:
    """bool [..., N, N]: the positions whose arm ring covers any of `tiles` bool [..., N, N].

    On maps packed 32 tiles to a word (`envs.reachability.pack`): the ring has 60 tiles at
    32x32, and one shift of a packed map moves a whole row in a word operation."""
    size = tiles.shape[-1]
    covered = _ring_dilation(size)(reachability.pack(tiles))
    return reachability.unpack(covered, size)


@functools.cache
def _ring_dilation(size: int):
    """The packed dilation by the arm ring seen from the tiles (`reachability.make_dilation`
    of the ring's offsets negated)."""
    return jax.jit(reachability.make_dilation([(-dr, -dc) for dr, dc in ring_offsets(size)], size))


def work_tiles(target: jax.Array, action: jax.Array, refused: jax.Array | None = None
               ) -> jax.Array:
    """bool [..., N, N]: the tiles the field leads to. The undug targets while any is left;
    after the last dig, on a map with dump zones, the soil lying outside them, which must
    still be picked up and dumped in a zone before the task is done (the env's
    `misplaced_soil`). Without this, the field went blank for that last stage, where the
    policy stalled on a fifth of the held-out foundations (docs/RESULTS.md). `refused` bool
    [..., N, N] (the observation's `refused_digs`, where present): targets the action mask
    refused to dig, left out unless every undug target was refused."""
    undug = (target == -1) & (action == 0)
    has_zones = jnp.any(target == 1, axis=(-2, -1), keepdims=True)
    misplaced = has_zones & (target != 1) & (action > 0)
    any_undug = jnp.any(undug, axis=(-2, -1), keepdims=True)
    if refused is not None:
        allowed = undug & ~refused
        undug = jnp.where(jnp.any(allowed, axis=(-2, -1), keepdims=True), allowed, undug)
    return jnp.where(any_undug, undug, misplaced)


def unreachable_distance(map_size: int) -> int:
    """The field's value for 'no diggable tile reachable'; also the number of relaxation
    sweeps + 1, so any path of up to 2N - 1 steps is found exactly."""
    return 2 * map_size


def dig_distance_features(obs: dict, in_reach: jax.Array | None = None,
                          values: jax.Array | None = None) -> jax.Array:
    """float32 [..., NUM_FEATURES] from `obs` (any leading batch dims): at the agent's tile,
    the distance / far and whether a diggable tile is reachable; then for each of the 12
    directions from the base heading, the same two at the next tile in that direction and
    the change of distance clipped to [-1, 1] (+1 where that tile is blocked).
    `in_reach` bool [..., N, N]: `work_in_reach(obs)`, where the caller has it already;
    `values` int32 [..., 13]: the field at `feature_tiles`, where the caller has it (a
    rollout's kept search, `terra_rl.features.reach_cache`)."""
    if values is None:
        rows, cols = feature_tiles(obs["agent_state"])
        values = field_at(obs, rows, cols, in_reach)
    return distance_features(values, unreachable_distance(obs["target_map"].shape[-1]))


def feature_tiles(agent_state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(rows, cols) int32 [..., 13] from `agent_state` int32 [..., 6]: the agent's tile,
    then the next tile in each of the 12 directions counted from its base heading (may lie
    off the map)."""
    row, col = agent_state[..., 0], agent_state[..., 1]
    heading = agent_state[..., 2] % NUM_DIRECTIONS
    steps = jnp.asarray(direction_offsets())
    turned = steps[(heading[..., None] + jnp.arange(NUM_DIRECTIONS)) % NUM_DIRECTIONS]
    rows = jnp.concatenate([row[..., None], row[..., None] + turned[..., 0]], axis=-1)
    cols = jnp.concatenate([col[..., None], col[..., None] + turned[..., 1]], axis=-1)
    return rows, cols


def field_at(obs: dict, rows: jax.Array, cols: jax.Array,
             in_reach: jax.Array | None = None) -> jax.Array:
    """int32 [..., Q]: `dig_distance_field(obs, in_reach)` at the tiles (rows, cols) int32
    [..., Q], `unreachable_distance(N)` off the map, without building the field.

    The same breadth-first search on maps packed 32 tiles to a word
    (`envs.reachability.pack`): each sweep grows the reached set by its 8 neighbours on
    free tiles, a few word operations per row, and the search stops once every query tile
    is reached or the set stops growing. The field's 2N - 1 sweeps of [N, N] minimums cost
    as much as the rest of the policy's forward pass at 32x32 (docs/PERFORMANCE.md)."""
    in_reach = work_in_reach(obs) if in_reach is None else in_reach
    batch = rows.shape[:-1]
    flat = [x.reshape(-1, *x.shape[len(batch):])
            for x in search_inputs(obs, in_reach, rows, cols)]
    values = jax.vmap(_search)(*flat)
    return values.reshape(*batch, -1)


def search_inputs(obs: dict, in_reach: jax.Array, rows: jax.Array, cols: jax.Array):
    """(free, goals bool [..., N, N], rows, cols int32 [..., Q] clipped onto the map, on_map
    bool [..., Q]): what the field's search (`tile_search`) takes for the query tiles
    (rows, cols) of `obs`, its goals the free tiles of `in_reach` (`work_in_reach`)."""
    size = obs["target_map"].shape[-1]
    free = free_tiles(obs)
    on_map = (rows >= 0) & (rows < size) & (cols >= 0) & (cols < size)
    return (free, free & in_reach, jnp.clip(rows, 0, size - 1), jnp.clip(cols, 0, size - 1),
            on_map)


def _search(free, goals, rows, cols, on_map):
    """int32 [Q] for one map: free, goals bool [N, N]; rows, cols int32 [Q] on the map."""
    search = tile_search(free.shape[-1])
    done = search.extend(search.start(free, goals), rows, cols, on_map)
    return search.lookup(done, rows, cols, on_map)


class TileSearch(NamedTuple):
    """The field's breadth-first search from the goal tiles, as far as it has swept
    (`tile_search`). Packed maps [words, N] (`envs.reachability.pack`)."""

    free: jax.Array
    """uint32 [words, N]: the free tiles (`free_tiles`)."""
    reach: jax.Array
    """uint32 [words, N]: the tiles reached within `sweeps` steps."""
    planes: jax.Array
    """uint32 [P, words, N]: bit p of each reached tile's distance."""
    sweeps: jax.Array
    """int32 []: the sweeps done."""
    grew: jax.Array
    """bool []: the last sweep reached a new tile."""


class TileSearchFns(NamedTuple):
    start: Callable[..., TileSearch]
    """`start(free, goals) -> TileSearch`: bool [N, N] maps, no sweep yet."""
    pending: Callable[..., jax.Array]
    """`pending(search, rows, cols, on_map) -> bool []`: `extend` would sweep for the query
    tiles (rows, cols int32 [Q] clipped onto the map, on_map bool [Q])."""
    extend: Callable[..., TileSearch]
    """`extend(search, rows, cols, on_map) -> TileSearch`: swept on until every open query
    is reached, nothing new is, or 2N - 1 sweeps are done."""
    lookup: Callable[..., jax.Array]
    """`lookup(search, rows, cols, on_map) -> int32 [Q]`: the field at the queries once
    `pending` is False."""


@functools.cache
def tile_search(map_size: int) -> TileSearchFns:
    """The search behind `field_at`, in parts that a caller may keep between queries on
    unchanged maps (`terra_rl.features.reach_cache`): each sweep ORs the tiles it reaches
    first into the bit planes of their distance, so a kept search answers queries within
    its reach by lookup and sweeps on from where it stopped for the others, to the values
    of one search from scratch, bit for bit (a query on a blocked tile or off the map never
    keeps it going)."""
    far = unreachable_distance(map_size)
    num_planes = (far - 1).bit_length()

    def bits_at(maps, rows, cols):
        word = cols // reachability.WORD
        bit = (cols % reachability.WORD).astype(jnp.uint32)
        return ((maps[..., word, rows] >> bit) & 1) == 1

    def open_queries(search, rows, cols, on_map):
        return on_map & bits_at(search.free, rows, cols)

    def start(free, goals) -> TileSearch:
        free_bits = reachability.pack(free)
        reach = reachability.pack(goals)
        return TileSearch(free_bits, reach,
                          jnp.zeros((num_planes, *reach.shape), jnp.uint32), jnp.int32(0),
                          jnp.bool_(True))

    def pending(search, rows, cols, on_map):
        unreached = open_queries(search, rows, cols, on_map) & ~bits_at(search.reach, rows,
                                                                          cols)
        return search.grew & (search.sweeps < far - 1) & jnp.any(unreached)

    def grow(bits, free_bits):
        across = (bits | reachability.moved(bits, 0, 1, map_size)
                  | reachability.moved(bits, 0, -1, map_size))
        around = (across | reachability.moved(across, 1, 0, map_size)
                  | reachability.moved(across, -1, 0, map_size))
        return around & free_bits

    def extend(search, rows, cols, on_map) -> TileSearch:
        def sweep(search):
            grown = grow(search.reach, search.free)
            distance = search.sweeps + 1
            planes = move_search.record_distance(search.planes, grown & ~search.reach,
                                                  distance)
            return TileSearch(search.free, grown, planes, distance, jnp.any(grown != search.reach))

        return jax.lax.while_loop(lambda s: pending(s, rows, cols, on_map), sweep, search)

    def lookup(search, rows, cols, on_map):
        distance = move_search.planes_distance(bits_at(search.planes, rows, cols))
        found = open_queries(search, rows, cols, on_map) & bits_at(search.reach, rows, cols)
        return jnp.where(found, distance, far)

    return TileSearchFns(start, pending, extend, lookup)


def distance_features(values: jax.Array, far: int) -> jax.Array:
    """float32 [..., 2 + 3K] from int distances [..., 1 + K] (the agent's own, then K
    neighbours; `far` for none in reach): the agent's distance / far and whether it is in
    reach, the same two per neighbour, and per neighbour the change of distance clipped to
    [-1, 1] (+1 where the neighbour is out of reach or blocked)."""
    scaled = values.astype(jnp.float32) / far
    reachable = (values < far).astype(jnp.float32)
    change = jnp.clip(values[..., 1:] - values[..., :1], -1, 1).astype(jnp.float32)
    change = jnp.where(values[..., 1:] < far, change, 1.0)
    return jnp.concatenate(
        [scaled[..., :1], reachable[..., :1], scaled[..., 1:], reachable[..., 1:], change],
        axis=-1,
    )
