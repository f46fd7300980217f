"""The base actions from given states to a set of goal positions: a breadth-first search
over the states (wheel angle, base heading, row, col) on maps packed 32 tiles to a word
(`envs.reachability.pack`), each state's distance kept in bit planes, in parts a caller may
keep between queries on unchanged maps (the pose distance's search,
`terra_rl.features.pose_distance`). `record_distance` and `planes_distance` are the bit planes'
helpers, shared with the dig distance's tile search."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from envs import geometry as geo
from envs import reachability
from envs.config import EnvConfig

H = geo.NUM_HEADINGS


def record_distance(planes: jax.Array, new: jax.Array, distance: jax.Array) -> jax.Array:
    """`planes` uint32 [P, ...] (bit p of each packed state's distance) with the states of
    `new` (packed, [...]) recorded at `distance` int32 []: a breadth-first search's sweep."""
    bits = (distance >> jnp.arange(planes.shape[0], dtype=jnp.int32)) & 1
    ones = jnp.where(bits == 1, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    return planes | (new[None] & ones.reshape(-1, *(1,) * new.ndim))


def planes_distance(bits: jax.Array) -> jax.Array:
    """int32 [Q]: the distances whose bits `record_distance` kept, read at Q states as bool
    [P, Q]."""
    return jnp.sum(bits.astype(jnp.int32)
                   << jnp.arange(bits.shape[0], dtype=jnp.int32)[:, None], axis=0)


class MoveSearch(NamedTuple):
    """A breadth-first search over the states (wheel angle, base heading, row, col) from the
    goal states, as far as it has swept (`make_move_search`). Packed maps:
    [12, words, N] for one wheel angle, [wheels, 12, words, N] for the states."""

    pose_free: jax.Array
    """uint32 [12, words, N]: the free poses (`envs.reachability.make_free_poses`) of the maps
    searched."""
    reach: jax.Array
    """uint32 [wheels, 12, words, N]: the states reached within `sweeps` actions."""
    planes: jax.Array
    """uint32 [P, wheels, 12, words, N]: bit p of each reached state's distance."""
    sweeps: jax.Array
    """int32 []: the sweeps done."""
    grew: jax.Array
    """bool []: the last sweep reached a new state (False: every reachable state is in
    `reach`)."""


class MoveSearchFns(NamedTuple):
    start: Callable[..., MoveSearch]
    """`start(action_map, obstacles, goal_positions, is_wheeled) -> MoveSearch`: no sweep
    yet, the goal states reached at distance 0 (maps int8 [N, N], goal_positions bool
    [N, N], is_wheeled bool [])."""
    pending: Callable[..., jax.Array]
    """`pending(search, queries, valid) -> bool []`: `extend` would sweep."""
    extend: Callable[..., MoveSearch]
    """`extend(search, queries, valid, is_wheeled) -> MoveSearch`: swept on until every
    open query is reached, nothing new is, or `max_distance` sweeps are done."""
    lookup: Callable[..., jax.Array]
    """`lookup(search, queries, valid) -> int32 [Q]`: each query's distance once
    `pending` is False."""


@functools.cache
def make_move_search(config: EnvConfig, max_distance: int) -> MoveSearchFns:
    """The search behind `make_move_distances`, in parts that a caller may keep between
    queries on unchanged maps (`terra_rl.features.reach_cache`): `start` on the maps,
    `extend` as far as the queries need, `lookup` their distances. Each sweep ORs the states
    it reaches first into the bit planes of their distance, so a kept search answers new
    queries within its reach by lookup, and sweeps on from where it stopped for the others;
    the distances are those of one search from scratch, bit for bit.

    A state is (wheel angle, base heading, row, col), queries int32 [Q, 4] in that order,
    `valid` bool [Q] (an invalid query, e.g. off the map, gets `max_distance`, as does one on
    a blocked pose)."""
    free_poses = reachability.make_free_poses(config)
    steps = geo.move_displacements(config.move_step)  # [24, 2], per 15-degree angle
    n = config.map_size
    limit = config.wheel_angle_limit
    wheels = tuple(range(-limit, limit + 1))
    num_planes = max_distance.bit_length()

    # Layer l (wheel angle w), heading h: FORWARD by steps[2h + w] to heading h + w, BACKWARD
    # by -steps[2h - w] to heading h - w; the maps [wheels, 12] flattened to one axis.
    arcs = reachability.make_moves(
        [(layer * H + h, layer * H + (h + w) % H, *steps[(2 * h + w) % (2 * H)])
         for layer, w in enumerate(wheels) for h in range(H)]
        + [(layer * H + h, layer * H + (h - w) % H, *-steps[(2 * h - w) % (2 * H)])
           for layer, w in enumerate(wheels) for h in range(H)],
        len(wheels) * H, n)

    def grow(reach, pose_free, is_wheeled):  # reach: packed uint32 [wheels, 12, words, N]
        arrived = arcs(reach.reshape(-1, *reach.shape[2:])).reshape(reach.shape)
        none = jnp.zeros_like(reach[:1])
        wheel_turns = (jnp.concatenate([none, reach[:-1]])
                       | jnp.concatenate([reach[1:], none]))
        base_turns = jnp.roll(reach, 1, axis=1) | jnp.roll(reach, -1, axis=1)
        arrived = arrived | jnp.where(is_wheeled, wheel_turns, base_turns)
        return reach | (arrived & pose_free[None])

    def start(action_map, obstacles, goal_positions, is_wheeled) -> MoveSearch:
        pose_free = free_poses(action_map, obstacles)
        layers = jnp.where(is_wheeled, True, jnp.asarray(wheels) == 0)  # tracked: wheel 0
        goals = pose_free & reachability.pack(goal_positions)[None]
        reach = jnp.where(layers[:, None, None, None], goals[None], jnp.uint32(0))
        return MoveSearch(pose_free, reach, jnp.zeros((num_planes, *reach.shape), jnp.uint32),
                          jnp.int32(0), jnp.bool_(True))

    def bits_at(maps, queries):
        """bool [Q]: the bits of packed maps [..., wheels, 12, words, N] at the queries'
        states (clipped onto the map), per leading index."""
        layer = jnp.clip(queries[:, 0] + limit, 0, len(wheels) - 1)
        heading = queries[:, 1] % H
        row, col = jnp.clip(queries[:, 2], 0, n - 1), jnp.clip(queries[:, 3], 0, n - 1)
        bit = (col % reachability.WORD).astype(jnp.uint32)
        return ((maps[..., layer, heading, col // reachability.WORD, row] >> bit) & 1) == 1

    def open_queries(search, queries, valid):
        # A query on a blocked pose can never be reached: it must not keep the search going.
        return valid & bits_at(jnp.broadcast_to(search.pose_free, search.reach.shape), queries)

    def pending(search, queries, valid):
        unreached = open_queries(search, queries, valid) & ~bits_at(search.reach, queries)
        return search.grew & (search.sweeps < max_distance) & jnp.any(unreached)

    def extend(search, queries, valid, is_wheeled) -> MoveSearch:
        def sweep(search):
            grown = grow(search.reach, search.pose_free, is_wheeled)
            distance = search.sweeps + 1
            planes = record_distance(search.planes, grown & ~search.reach, distance)
            return MoveSearch(search.pose_free, grown, planes, distance,
                              jnp.any(grown != search.reach))

        return jax.lax.while_loop(lambda s: pending(s, queries, valid), sweep, search)

    def lookup(search, queries, valid):
        distance = planes_distance(bits_at(search.planes, queries))
        found = open_queries(search, queries, valid) & bits_at(search.reach, queries)
        return jnp.where(found, jnp.minimum(distance, max_distance), max_distance)

    return MoveSearchFns(*(jax.jit(part) for part in (start, pending, extend, lookup)))


def make_move_distances(config: EnvConfig, max_distance: int):
    """`distances(action_map, obstacles, goal_positions, queries, valid, is_wheeled) -> int32
    [Q]`: for each query state, the fewest base actions that take it to a state on a goal
    position (bool [N, N]); `max_distance` where that takes more, or none can be reached.

    A state is (wheel angle, base heading, row, col), queries int32 [Q, 4] in that order,
    `valid` bool [Q] (an invalid query, e.g. off the map, gets `max_distance`). The actions
    are the env's: tracked FORWARD/BACKWARD along the heading and CLOCK/ANTICLOCK in place,
    wheel angle 0; wheeled FORWARD/BACKWARD along the arc of its wheel angle and
    WHEELS_LEFT/RIGHT, one action per wheel step. Every state lies on a free pose
    (`envs.reachability.make_free_poses`); the load (no move while loaded) and the revisit
    rule are ignored.

    Every action has its inverse (BACKWARD undoes FORWARD at the same wheel angle), so a
    breadth-first search from the goal states gives each state's distance to them. It stops
    as soon as every query is reached, so it costs the largest query distance in sweeps
    (`make_move_search`, whose parts a caller may keep between queries).
    """
    search = make_move_search(config, max_distance)

    def distances(action_map, obstacles, goal_positions, queries, valid, is_wheeled):
        started = search.start(action_map, obstacles, goal_positions, is_wheeled)
        done = search.extend(started, queries, valid, is_wheeled)
        return search.lookup(done, queries, valid)

    return distances
