"""What a rollout keeps of the policy inputs' work from one step to the next: the dig and
pose distances' goals (`work_in_reach`) and the flat encoder's pooled map layers
(`global_maps.pooled_map_layers`), recomputed only for the envs whose maps changed, and the
pose and dig distances' searches, swept on only as far as new queries need.

At 64x64 these were most of the policy's parameter-free inputs (docs/PERFORMANCE.md),
recomputed from scratch at every step:

- `work_in_reach` ORs the packed map shifted by each of the arm ring's offsets (224 at
  64x64). It reads only the target, action, dumpability and refused-dig maps, which change
  on a DO that digs or dumps and on a reset: in about 1.5% of env steps under random
  actions at 64x64.
- the pose distance's breadth-first search runs from the goal states until it reaches the
  agent's state and the states after its base actions (`envs.move_search.make_move_search`).
  On unchanged maps the search of the step before holds every state within its sweeps,
  with its distance in bit planes: the next step's queries, a base action away, are looked
  up, and the search sweeps on only for queries beyond it.
- the flat encoder's map input (stored on a CPU, `policy_inputs.stores_map_input`) pooled
  six map layers of every tile, 0.019 s of 0.11 s per update at 64x64, though only the
  agent's one-hot among its channels moves without a map change.

Before each choice the cache compares each env's maps (and obstacles and agent type) with
those its work was done on, as 32-bit words; the stale envs' goals and pooled maps are
recomputed and their searches restarted, and the searches that a query needs are swept on,
`chunk` envs at a time (`envs.batch.over_chunks`). The update's bootstrap refreshes the
rollout's last observation once more, and the timed-out steps' final observations from an
empty state for their rows alone (`terra_rl.algo.update.make_bootstrap_values_fn`). Every
env's goals equal `work_in_reach` of its own observation, its pose distances
`pose_distances` of it and its pooled maps `pooled_map_layers` of it, bit for bit
(tests/test_reach_cache.py), so training logs the same values.

    cache = make_reach_cache(num_envs)
    state = cache.init(obs)                 # nothing computed yet: every env is stale
    state, obs = cache.refresh(state, obs)  # obs[IN_REACH_KEY] bool [num_envs, N, N],
                                            # obs[POSE_DISTANCES_KEY] int32 [num_envs, 5]

The cache lives in the rollout's carry (`terra_rl.algo.rollout.rollout`'s `cache`), from
the first step of a rollout to its last: the runner state and the checkpoints do not hold
it, and `terra_rl.nets.models.with_derived_features` leaves its keys out of what a rollout
stores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from envs.batch import over_chunks, scatter_rows, select_where
from envs.move_search import MoveSearch
from terra_rl.features import dig_distance, pose_distance
from terra_rl.features.dig_distance import TileSearch, work_in_reach
from terra_rl.features.global_maps import pooled_map_layers

IN_REACH_KEY = "work_in_reach"
"""Where the refreshed observation holds the goals, bool [num_envs, N, N]:
`terra_rl.features.policy_inputs.derived_features` takes them from there."""

POSE_DISTANCES_KEY = "pose_distances"
"""Where it holds the pose distances, int32 [num_envs, 5] (`pose_distance.pose_distances`)."""

DIG_DISTANCES_KEY = "dig_distances"
"""Where it holds the dig-distance field at the agent's tile and the 12 next to it, int32
[num_envs, 13] (`dig_distance.field_at` at `dig_distance.feature_tiles`)."""

POOLED_MAPS_KEY = "pooled_maps"
"""Where it holds the pooled map layers, float32 [num_envs, N / pool, N / pool, 6]
(`global_maps.pooled_map_layers`)."""

CACHE_KEYS = (IN_REACH_KEY, POSE_DISTANCES_KEY, DIG_DISTANCES_KEY, POOLED_MAPS_KEY)

MAP_KEYS = ("target_map", "action_map", "dumpability", "refused_digs")
"""The observation's maps `work_in_reach` reads (`refused_digs` where present)."""

POOLED_KEYS = ("target_map", "action_map", "obstacles", "dumpability")
"""The maps `pooled_map_layers` reads."""

COMPARED_KEYS = (*MAP_KEYS, "obstacles", "agent_type")
"""What an env's cached work depends on: the goals' maps, for the pose search the obstacles
and the agent type too (the pooled maps read a subset)."""


class ReachCacheState(NamedTuple):
    compared: dict
    """`COMPARED_KEYS` of the observation each env's work was done on, [num_envs, words]
    (`_compared`)."""
    in_reach: jax.Array
    """bool [num_envs, N, N]: `work_in_reach` of those maps (all False without the
    distances)."""
    pooled: jax.Array | None
    """float32 [num_envs, N / pool, N / pool, 6]: `pooled_map_layers` of those maps; None
    without `map_pool`."""
    search: MoveSearch | None
    """Each env's pose search (leading [num_envs]); None without the pose distance."""
    dig_search: TileSearch | None
    """Each env's dig-distance search (leading [num_envs]); None without the dig distance."""
    fresh: jax.Array
    """bool [num_envs]: the env's work was done (False until its first refresh)."""


class ReachCache(NamedTuple):
    init: Callable[[dict], ReachCacheState]
    """A state for a batch of observations like `obs`, every env stale (nothing computed)."""
    refresh: Callable[..., tuple[ReachCacheState, dict]]
    """`refresh(state, obs, only=None)` -> (state for `obs`, `obs` plus the cached keys): the
    stale envs' work redone, the searches that the queries need swept on, the rest kept.
    With `only` bool [num_envs], the envs outside it are neither redone nor swept: their keys
    are whatever `state` held, the rows of a caller that drops them."""


def default_chunk(num_envs: int, backend: str) -> int:
    """Envs recomputed per pass. On a CPU a sixteenth of the batch: a pass costs its envs
    times the sweeps of its slowest, plus a fixed cost per pass, and most steps have one or
    two stale envs. At 64 envs x 64x64, the full update on one core took 0.456 s with chunks
    of 4 envs, 0.458 with 2 and 0.478 with 16; at 16x16 and 32x32 chunks of 4 to 16 gave the
    same time (docs/PERFORMANCE.md). Elsewhere half the batch, as for the env's cut-off
    checks (`envs.batch.default_cut_off_checks`): one pass, at a cost that hardly depends on
    its size."""
    return max(1, -(-num_envs // (16 if backend == "cpu" else 2)))


def make_reach_cache(num_envs: int, chunk: int | None = None, *,
                     pose_distances: bool = True, wheeled_agents: bool = True,
                     dig_distances: bool = True, map_pool: int = 0) -> ReachCache:
    """The cache for a batch of `num_envs` observations; `chunk` envs recomputed per pass
    (default `default_chunk`). With `pose_distances`, the pose search too, over the states
    of `wheeled_agents` (`pose_distance.pose_distances`); with `dig_distances`, the dig
    distance's search (`dig_distance.tile_search`); the goals with either. With `map_pool`
    > 0, the map layers pooled by it (`pooled_map_layers`)."""
    chunk = default_chunk(num_envs, jax.default_backend()) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if map_pool < 0:
        raise ValueError(f"map_pool must be >= 0 (0: no pooled maps), got {map_pool}")
    needs_goals = pose_distances or dig_distances

    def search_for(obs):
        if not pose_distances:
            return None
        return pose_distance.move_search(obs["target_map"].shape[-1], wheeled_agents)

    def queries(obs):
        one_env = functools.partial(pose_distance.queries, obs["target_map"].shape[-1])
        return jax.vmap(one_env)(obs["agent_state"], obs["agent_type"])

    def dig_queries(obs, in_reach):
        rows, cols = dig_distance.feature_tiles(obs["agent_state"])
        return dig_distance.search_inputs(obs, in_reach, rows, cols)

    def zeros_like_output(fn, *args):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *args))

    def init(obs: dict) -> ReachCacheState:
        in_reach = jnp.zeros(obs["target_map"].shape, bool)
        searches = dig_searches = None
        if pose_distances:
            _, _, is_wheeled = queries(obs)
            searches = zeros_like_output(jax.vmap(search_for(obs).start), obs["action_map"],
                                         obs["obstacles"], in_reach, is_wheeled)
        if dig_distances:
            free, goals, *_ = dig_queries(obs, in_reach)
            dig_searches = zeros_like_output(jax.vmap(dig_search_for(obs).start), free, goals)
        pooled = None
        if map_pool:
            pooled = zeros_like_output(functools.partial(pooled_map_layers, pool=map_pool), obs)
        return ReachCacheState(compared=_compared(obs), in_reach=in_reach, pooled=pooled,
                               search=searches, dig_search=dig_searches,
                               fresh=jnp.zeros((num_envs,), bool))

    def dig_search_for(obs):
        return dig_distance.tile_search(obs["target_map"].shape[-1])

    def refresh(state: ReachCacheState, obs: dict, only: jax.Array | None = None
                ) -> tuple[ReachCacheState, dict]:
        if only is None:
            only = jnp.ones((num_envs,), bool)
        compared = _compared(obs)
        same = [jnp.all(value == state.compared[key], axis=1) for key, value in compared.items()]
        unchanged = functools.reduce(jnp.logical_and, same, state.fresh)
        stale = ~unchanged & only

        def recompute_maps(gather, part, kept):
            in_reach, pooled = kept
            keys = dict.fromkeys((*MAP_KEYS, *POOLED_KEYS))  # in order: one trace per config
            maps = {key: obs[key][gather] for key in keys if key in obs}
            if needs_goals:
                in_reach = scatter_rows(in_reach, part, work_in_reach(maps))
            if map_pool:
                pooled = scatter_rows(pooled, part, pooled_map_layers(maps, map_pool))
            return in_reach, pooled

        in_reach, pooled = over_chunks(stale, chunk, recompute_maps,
                                       (state.in_reach, state.pooled))
        out = dict(obs)
        if needs_goals:
            out[IN_REACH_KEY] = in_reach
        if map_pool:
            out[POOLED_MAPS_KEY] = pooled
        searches = None
        search = search_for(obs)
        if search is not None:
            states, valid, is_wheeled = queries(obs)
            needed = (stale | jax.vmap(search.pending)(state.search, states, valid)) & only

            searches = _swept_on(
                state.search, stale, needed, chunk,
                search.start, (obs["action_map"], obs["obstacles"], in_reach, is_wheeled),
                search.extend, (states, valid, is_wheeled))
            out[POSE_DISTANCES_KEY] = jax.vmap(search.lookup)(searches, states, valid)
        dig_searches = None
        if dig_distances:
            dig = dig_search_for(obs)
            free, goals, rows, cols, on_map = dig_queries(obs, in_reach)
            needed = (stale | jax.vmap(dig.pending)(state.dig_search, rows, cols, on_map)) & only

            dig_searches = _swept_on(state.dig_search, stale, needed, chunk,
                                     dig.start, (free, goals), dig.extend, (rows, cols, on_map))
            out[DIG_DISTANCES_KEY] = jax.vmap(dig.lookup)(dig_searches, rows, cols, on_map)
        new_state = ReachCacheState(compared=compared, in_reach=in_reach, pooled=pooled,
                                    search=searches, dig_search=dig_searches,
                                    fresh=unchanged | only)
        return new_state, out

    return ReachCache(init=init, refresh=refresh)


def _swept_on(searches, stale, needed, chunk: int, start, start_args, extend, query_args):
    """`searches` (leading [num_envs]) with those `needed` (bool [num_envs]) swept on as far
    as their queries need, `chunk` envs at a time; a `stale` env's search is started again
    first. `start(*start_args)` and `extend(search, *query_args)` per env, each argument
    [num_envs, ...]."""

    def sweep_chunk(gather, part, searches):
        started = jax.vmap(start)(*(x[gather] for x in start_args))
        kept = jax.tree.map(lambda x: x[gather], searches)
        begun = select_where(stale[gather], started, kept)
        swept = jax.vmap(extend)(begun, *(x[gather] for x in query_args))
        return scatter_rows(searches, part, swept)

    return over_chunks(needed, chunk, sweep_chunk, searches)


def _compared(obs: dict) -> dict[str, jax.Array]:
    """`COMPARED_KEYS` of `obs`, each env's row as 32-bit words where its bytes allow
    ([num_envs, words] uint32): one comparison per four int8 tiles. Comparing the maps tile
    by tile took 0.025 s of a 64x64 update's 0.06 s of cache refreshes on one core, in
    words 0.016 (docs/PERFORMANCE.md)."""
    return {key: _as_words(obs[key]) for key in COMPARED_KEYS if key in obs}


def _as_words(value: jax.Array) -> jax.Array:
    """[num_envs, ...] -> its rows' bytes as uint32 [num_envs, bytes / 4] (the same rows
    equal exactly where their words do), or [num_envs, -1] as it is where the bytes do not
    divide by 4."""
    rows = value.reshape(value.shape[0], -1)
    if rows.dtype == jnp.bool_:
        rows = rows.view(jnp.uint8)
    per_word = max(1, 4 // rows.dtype.itemsize)
    if per_word == 1 or rows.shape[1] % per_word:
        return rows
    return jax.lax.bitcast_convert_type(rows.reshape(rows.shape[0], -1, per_word), jnp.uint32)
