"""The start of an episode: which map (`sample_map_index`), where the excavator stands
(`spawn_pose`), and the state built from the maps and the agent (`initial_state`). Pure
functions of the static `EnvConfig`; `envs.env.ExcavationEnv`'s reset calls them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import action_rules
from envs import actions as A
from envs import geometry as geo
from envs.config import EnvConfig
from envs.state import AgentState, CurriculumState, EnvParams, EnvState


def initial_state(
    config: EnvConfig,
    target_map,
    obstacles,
    dumpability,
    agent: AgentState,
    *,
    action_map=None,
    age=0,
    map_index=0,
    curriculum: CurriculumState | None = None,
) -> EnvState:
    """An EnvState from maps ([N, N], any int dtype) and an agent; the progress counters
    are derived from the maps."""
    target_map = jnp.asarray(target_map, jnp.int8)
    action_map = (
        jnp.zeros_like(target_map) if action_map is None else jnp.asarray(action_map, jnp.int8)
    )
    has_dump_zones = jnp.any(target_map == 1)
    soil_outside_zones = jnp.sum(
        jnp.where(target_map == 1, 0, jnp.maximum(action_map, 0)), dtype=jnp.int32
    )
    zero = jnp.zeros((), jnp.int32)
    if curriculum is None:
        curriculum = CurriculumState(
            level=zero, consecutive_successes=zero, consecutive_failures=zero
        )
    dig_tiles_done = jnp.sum((target_map == -1) & (action_map < 0), dtype=jnp.int32)
    misplaced_soil = jnp.where(has_dump_zones, soil_outside_zones, 0)
    return EnvState(
        agent=jax.tree.map(lambda x: jnp.asarray(x, jnp.int32), agent),
        target_map=target_map,
        action_map=action_map,
        obstacles=jnp.asarray(obstacles, jnp.int8),
        dumpability=jnp.asarray(dumpability, jnp.int8),
        has_dump_zones=has_dump_zones,
        dig_tiles_total=jnp.sum(target_map == -1, dtype=jnp.int32),
        dig_tiles_done=dig_tiles_done,
        misplaced_soil=misplaced_soil,
        best_progress=dig_tiles_done - misplaced_soil,
        steps_since_progress=zero,
        last_actions=jnp.full((config.num_last_actions,), A.NO_ACTION, jnp.int32),
        recent_poses=action_rules.fresh_memory(config, action_rules.pose_code(config, agent)),
        refused_digs=jnp.zeros(target_map.shape, bool),
        age=jnp.asarray(age, jnp.int32),
        map_index=jnp.asarray(map_index, jnp.int32),
        curriculum=curriculum,
    )


def sample_map_index(config: EnvConfig, level_map_types: np.ndarray | None, key: jax.Array,
                     params: EnvParams, level) -> jax.Array:
    """int32 []: a map of the pool, uniform; with a curriculum, uniform among the maps of
    the type of `level` (`level_map_types` int32 [levels], the map type of each level)."""
    if config.curriculum is None:
        return jax.random.randint(key, (), 0, params.num_maps)
    map_type = jnp.asarray(level_map_types)[level]
    count = jnp.maximum(params.num_maps_of_type[map_type], 1)
    return params.maps_of_type[map_type, jax.random.randint(key, (), 0, count)]


def room_to_manoeuvre(config: EnvConfig) -> float:
    """Radius of the disk a spawn keeps clear of obstacles and the map's edge: every
    heading's footprint, at the spawn and one base move away (`EnvConfig.move_step`, the
    longest rounded displacement), lies inside it, so the excavator can turn and drive from
    where it starts. A spawn that only fits its footprint can be boxed in: on 64x64 trench
    maps a tracked excavator spawned between an obstacle and the map's edge could neither turn
    nor move, an episode lost before its first step (docs/RESULTS.md)."""
    steps = geo.move_displacements(config.move_step)
    return float(config.footprint_radius + np.sqrt((steps.astype(np.float64) ** 2).sum(-1)).max())


def spawn_pose(config: EnvConfig, extents: np.ndarray, key_spawn, key_heading, key_fallback,
               target_map, obstacles, fallback_pose) -> tuple[jax.Array, jax.Array]:
    """A valid (pos int32 [2], heading int32 []): the first of `config.spawn_candidates`
    random candidates whose footprint is free of targets and obstacles and whose disk of
    `room_to_manoeuvre` lies on the map, free of obstacles; else the map's guaranteed spawn
    square `fallback_pose`. Bounded work, no while loop. `extents`:
    `geometry.footprint_extents`."""
    cfg = config
    count = cfg.spawn_candidates
    lo = int(extents.max())
    rows_cols = jax.random.randint(key_spawn, (count, 2), lo, cfg.map_size - lo)
    headings = jax.random.randint(key_heading, (count,), 0, geo.NUM_HEADINGS)
    free = (obstacles == 0) & (target_map == 0)
    room = room_to_manoeuvre(cfg)
    radius = int(np.floor(room))  # the disk's farthest row or column offset
    span = np.arange(-radius, radius + 1)
    disk = span[:, None] ** 2 + span[None, :] ** 2 <= room**2  # [2r + 1, 2r + 1]

    def is_valid(pos, heading):
        window = geo.make_window(pos, cfg.map_size, radius)
        covered = geo.footprint_mask(cfg, window, heading)
        on_map = geo.footprint_in_map(extents, pos, heading, cfg.map_size)
        footprint_free = on_map & ~jnp.any(covered & ~geo.crop(free, window))
        # The window is clamped into the map: where the disk reaches past an edge, it is
        # not clear; elsewhere the window is centred on `pos` and the disk lines up with it.
        inside = jnp.all((pos - radius >= 0) & (pos + radius <= cfg.map_size - 1))
        clear = ~jnp.any(jnp.asarray(disk) & (geo.crop(obstacles, window) != 0))
        return footprint_free & inside & clear

    valid = jax.vmap(is_valid)(rows_cols, headings)
    first = jnp.argmax(valid)
    fallback_heading = jax.random.randint(key_fallback, (), 0, geo.NUM_HEADINGS)
    pos = jnp.where(jnp.any(valid), rows_cols[first], fallback_pose)
    heading = jnp.where(jnp.any(valid), headings[first], fallback_heading)
    return pos.astype(jnp.int32), heading.astype(jnp.int32)
