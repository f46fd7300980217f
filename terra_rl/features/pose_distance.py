"""The pose distance: how many base actions the excavator is from a pose where its arm
reaches work, and which base action brings it closer.

The dig-distance field (`terra_rl.features.dig_distance`) counts tile steps and ignores the
footprint and the heading. Where trained policies stalled on held-out maps the planner still
finishes, it read 1-5 at the agent's tile in half of them while the planner's next dig was
6-54 base actions away (docs/RESULTS.md). This counts the env's own base actions over the
states (wheel angle, base heading, row, col) (`envs.move_search.make_move_distances`) to the
nearest state whose position has a work tile in the arm's ring
(`terra_rl.features.dig_distance.work_tiles`: undug targets, or misplaced soil once every target is
dug). The policy gets it from its own state and from the state after each of its four base
actions: FORWARD, BACKWARD, and CLOCK/ANTICLOCK (tracked) or WHEELS_LEFT/RIGHT (wheeled). No
parameters; computed from the observation dict once per rollout step
(`terra_rl.nets.models.with_derived_features`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from envs import actions as A
from envs import geometry as geo
from envs.config import EnvConfig
from envs.move_search import MoveSearchFns, make_move_distances, make_move_search
from terra_rl.features.dig_distance import distance_features, work_in_reach

NUM_BASE_ACTIONS = 4  # FORWARD, BACKWARD, CLOCK or WHEELS_LEFT, ANTICLOCK or WHEELS_RIGHT
NUM_FEATURES = 2 + 3 * NUM_BASE_ACTIONS


def max_distance(map_size: int) -> int:
    """The distance reported for 'no work in reach within this many base actions'."""
    return 8 * map_size


def successor_states(config: EnvConfig, agent_state: jax.Array, is_wheeled: jax.Array):
    """(states int32 [5, 4], valid bool [5]): the agent's own state (wheel angle, heading,
    row, col) from `agent_state` int32 [6] (the observation's), then the state after each
    base action as the env's `_candidate_pose` computes it. Invalid: off the map, or a wheel
    turn past the limit (the env masks both)."""
    row, col, heading, wheel = (agent_state[i] for i in (0, 1, 2, 4))
    wheel = jnp.where(is_wheeled, wheel, 0)
    displacements = jnp.asarray(geo.move_displacements(config.move_step))
    limit, n = config.wheel_angle_limit, config.map_size
    states, valid = [jnp.stack([wheel, heading, row, col])], [jnp.bool_(True)]
    for direction in (1, -1):  # FORWARD, BACKWARD
        half_angle = (2 * heading + direction * wheel) % (2 * geo.NUM_HEADINGS)
        delta = direction * displacements[half_angle]
        new_heading = (heading + direction * wheel) % geo.NUM_HEADINGS
        new_row, new_col = row + delta[0], col + delta[1]
        states.append(jnp.stack([wheel, new_heading, new_row, new_col]))
        valid.append((new_row >= 0) & (new_row < n) & (new_col >= 0) & (new_col < n))
    for base_turn, wheel_turn in ((-1, 1), (1, -1)):  # CLOCK / WHEELS_LEFT, then the others
        new_wheel = jnp.where(is_wheeled, wheel + wheel_turn, wheel)
        new_heading = jnp.where(is_wheeled, heading, (heading + base_turn) % geo.NUM_HEADINGS)
        states.append(jnp.stack([new_wheel, new_heading, row, col]))
        valid.append(jnp.abs(new_wheel) <= limit)
    return jnp.stack(states).astype(jnp.int32), jnp.stack(valid)


def search_config(map_size: int, wheeled_agents: bool) -> EnvConfig:
    """The env geometry the search runs on. A tracked excavator drives at wheel angle 0
    only: its search never leaves that layer of the states, so without wheeled ones the
    search sweeps that layer alone (a third of the states at the default wheel limit), to
    the same distances in the same sweeps."""
    config = EnvConfig(map_size=map_size)
    return config if wheeled_agents else dataclasses.replace(config, wheel_angle_limit=0)


@functools.cache
def move_search(map_size: int, wheeled_agents: bool) -> MoveSearchFns:
    """The search's parts (`envs.move_search.make_move_search`), for a caller that keeps
    the search between steps (`terra_rl.features.reach_cache`)."""
    return make_move_search(search_config(map_size, wheeled_agents), max_distance(map_size))


def queries(map_size: int, agent_state: jax.Array, agent_type: jax.Array):
    """(states int32 [5, 4], valid bool [5], is_wheeled bool []) of one env: the query
    states of `pose_distances` (`successor_states`) from `agent_state` int32 [6] and
    `agent_type` int32 []."""
    is_wheeled = agent_type == A.WHEELED
    states, valid = successor_states(EnvConfig(map_size=map_size), agent_state, is_wheeled)
    return states, valid, is_wheeled


@functools.cache
def _distances_for(map_size: int, wheeled_agents: bool):
    distances = make_move_distances(search_config(map_size, wheeled_agents),
                                    max_distance(map_size))

    def one_env(action_map, obstacles, goal_positions, agent_state, agent_type):
        states, valid, is_wheeled = queries(map_size, agent_state, agent_type)
        return distances(action_map, obstacles, goal_positions, states, valid, is_wheeled)

    return jax.jit(jax.vmap(one_env))


def pose_distances(obs: dict, in_reach: jax.Array | None = None,
                   wheeled_agents: bool = True) -> jax.Array:
    """int32 [..., 5]: base actions from the agent's own state, then from the state after
    FORWARD, BACKWARD, CLOCK/WHEELS_LEFT and ANTICLOCK/WHEELS_RIGHT, to the nearest state
    with work in the arm's ring; `max_distance(N)` where that is farther, blocked or off
    the map. Uses the env's default geometry and `drivable_soil_height` 1 (the config
    allows this feature with no other). `in_reach` bool [..., N, N]: `work_in_reach(obs)`,
    where the caller has it already. `wheeled_agents` False promises that every agent in
    `obs` is tracked: the search then covers the wheel-0 states only, a third of the work
    (a wheeled agent would get wrong distances)."""
    batch = obs["agent_type"].shape
    size = obs["target_map"].shape[-1]
    flat = {key: obs[key].reshape(-1, *obs[key].shape[len(batch):])
            for key in ("target_map", "action_map", "obstacles", "dumpability", "agent_state",
                        "agent_type")}
    if in_reach is None:
        goal_positions = work_in_reach(flat)
    else:
        goal_positions = in_reach.reshape(-1, size, size)
    distances = _distances_for(size, wheeled_agents)(
        flat["action_map"], flat["obstacles"], goal_positions, flat["agent_state"],
        flat["agent_type"])
    return distances.reshape(*batch, 1 + NUM_BASE_ACTIONS)


def pose_distance_features(obs: dict, in_reach: jax.Array | None = None,
                           wheeled_agents: bool = True,
                           distances: jax.Array | None = None) -> jax.Array:
    """float32 [..., NUM_FEATURES] from `obs` (any leading batch dims): from the agent's own
    state, the distance / max and whether work is in reach within the max; then for each
    base action, the same two after it and the change of distance clipped to [-1, 1] (+1
    where the action is blocked or leads out of reach). `in_reach` bool [..., N, N]:
    `work_in_reach(obs)`, where the caller has it already; `wheeled_agents` as in
    `pose_distances`; `distances` int32 [..., 5]: `pose_distances(obs, ...)`, where the
    caller has them already."""
    if distances is None:
        distances = pose_distances(obs, in_reach, wheeled_agents)
    return distance_features(distances, max_distance(obs["target_map"].shape[-1]))
