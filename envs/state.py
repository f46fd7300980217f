"""Dynamic environment data: per-env state and the map pool (`EnvParams`), as pytrees."""

from __future__ import annotations

import jax
from flax import struct


@struct.dataclass
class AgentState:
    """One excavator. All int32 scalars except `pos`.

    pos:           [2] (row, col) of the base centre
    base_heading:  0..11, 30-degree steps anticlockwise from +column
    cabin_heading: 0..11, relative to the base (arm heading = base + cabin mod 12)
    wheel_angle:   -limit..limit, 30 degrees of heading change per unit and move (wheeled only)
    loaded:        units of soil in the bucket
    agent_type:    0 tracked, 1 wheeled
    """

    pos: jax.Array
    base_heading: jax.Array
    cabin_heading: jax.Array
    wheel_angle: jax.Array
    loaded: jax.Array
    agent_type: jax.Array


@struct.dataclass
class CurriculumState:
    """int32 scalars: level index and the current runs of successes and timeouts."""

    level: jax.Array
    consecutive_successes: jax.Array
    consecutive_failures: jax.Array


@struct.dataclass
class EnvState:
    """State of one environment; maps are int8 `[N, N]`.

    target_map:  -1 tile to dig, 0 free, +1 dump zone
    action_map:  <0 dug (depth), >0 dumped soil (height), 0 untouched
    obstacles:   1 obstacle or padding (never traversable, diggable or dumpable)
    dumpability: 1 dumping allowed; cleared next to dug tiles
    has_dump_zones:     bool [] the map has +1 tiles, so all soil must end there
    dig_tiles_total:    int32 [] number of -1 target tiles
    dig_tiles_done:     int32 [] -1 target tiles dug so far
    misplaced_soil:     int32 [] soil units outside dump zones (0 when no dump zones)
    best_progress:      int32 [] highest (dig_tiles_done - misplaced_soil) of the episode
    steps_since_progress: int32 [] steps since `best_progress` last rose (stall truncation)
    last_actions:       int32 [K] most recent first, `NO_ACTION` at episode start
    recent_poses:       int32 [R] codes (`ExcavationEnv.pose_code`) of the poses since the
                        last dig or dump, most recent (the current pose) first, -1 unused;
                        R = max(1, `EnvConfig.revisit_memory`)
    refused_digs:       bool [N, N] targets whose dig the action mask refused since the map
                        last changed (`EnvConfig.remember_refused_digs`; else all False)
    age:                int32 [] steps taken in this episode
    map_index:          int32 [] index of the map in the pool
    """

    agent: AgentState
    target_map: jax.Array
    action_map: jax.Array
    obstacles: jax.Array
    dumpability: jax.Array
    has_dump_zones: jax.Array
    dig_tiles_total: jax.Array
    dig_tiles_done: jax.Array
    misplaced_soil: jax.Array
    best_progress: jax.Array
    steps_since_progress: jax.Array
    last_actions: jax.Array
    recent_poses: jax.Array
    refused_digs: jax.Array
    age: jax.Array
    map_index: jax.Array
    curriculum: CurriculumState


@struct.dataclass
class EnvParams:
    """The map pool reset samples from. Pass it as a jit argument, never as a closure
    constant: XLA would embed every map in the compiled program.

    target_map, obstacles, dumpability: int8 [M, N, N]
    map_type:          int8 [M] index into `envs.maps.MAP_TYPES`
    spawn_pose:        int32 [M, 2] a (row, col) with a clear square around it
    maps_of_type:      int32 [T, M] indices of maps of each type, cycled to fill M
    num_maps_of_type:  int32 [T]
    """

    target_map: jax.Array
    obstacles: jax.Array
    dumpability: jax.Array
    map_type: jax.Array
    spawn_pose: jax.Array
    maps_of_type: jax.Array
    num_maps_of_type: jax.Array

    @property
    def num_maps(self) -> int:
        return self.target_map.shape[0]

    @property
    def map_size(self) -> int:
        return self.target_map.shape[-1]
