"""Pose tables of the scripted solver (`envs.solver`), built from the env's own functions.

For one config, jitted and vmapped over every base pose once: the pose each base action
reaches (wheel angle included for wheeled agents), the footprint tiles of every pose, and the
workspace tiles of every (pose, arm heading). Shortest paths over the pose graph are numpy.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from envs import actions as A
from envs import geometry as geo
from envs.config import EnvConfig
from envs.env import ExcavationEnv
from envs.state import AgentState

H = geo.NUM_HEADINGS

@dataclasses.dataclass(frozen=True, eq=False)
class PoseGeometry:
    """Static per-config tables; pose index = (row * N + col) * 12 + base_heading and tiles
    are flat map indices, padded with the sentinel N * N.

    footprint: int32 [P, Kf]      tiles under the base
    on_map:    bool [P]           the footprint lies inside the map
    reach:     int32 [P, 12, Kr]  the workspace per absolute arm heading (before obstacles)
    """

    map_size: int
    footprint: np.ndarray
    on_map: np.ndarray
    reach: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class PoseGraph:
    """Base poses with wheel angles: node = pose * num_wheels + wheel_angle + wheel_limit.

    next_node:    int32 [V, 4] node reached by actions 0..3, -1 where the pose cannot change
    checked_pose: int32 [V, 4] pose whose footprint must be free for the action, -1 if none
    """

    num_wheels: int
    wheel_limit: int
    next_node: np.ndarray
    checked_pose: np.ndarray


def _agent(pos, heading, cabin=0, wheel=0, agent_type=A.TRACKED) -> AgentState:
    zero = jnp.zeros((), jnp.int32)
    as_int = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    return AgentState(
        pos=as_int(pos),
        base_heading=as_int(heading),
        cabin_heading=as_int(cabin),
        wheel_angle=as_int(wheel),
        loaded=zero,
        agent_type=as_int(agent_type),
    )


def _pose_masks(env: ExcavationEnv, positions, headings):
    """For poses [B]: window start [B, 2], footprint [B, W, W], on_map [B] and the workspace
    per absolute arm heading [B, 12, W, W], from the env's window, footprint and workspace."""
    cfg = env.config

    def one(pos, heading):
        window = geo.make_window(pos, cfg.map_size, cfg.window_radius)
        footprint = geo.footprint_mask(cfg, window, heading)
        on_map = geo.footprint_in_map(env._extents, pos, heading, cfg.map_size)
        no_obstacles = jnp.zeros(footprint.shape, jnp.int8)

        def workspace(arm):
            agent = _agent(pos, heading, (arm - heading) % H)
            return env._workspace(agent, window, no_obstacles)

        return window.start, footprint, on_map, jax.vmap(workspace)(jnp.arange(H))

    return jax.vmap(one)(positions, headings)


def _index_lists(mask: np.ndarray, flat: np.ndarray, sentinel: int) -> np.ndarray:
    """bool [..., T] masks over tiles `flat` int [..., T] -> sorted index lists [..., K]."""
    values = np.sort(np.where(mask, flat, sentinel), axis=-1)
    width = max(int(mask.sum(axis=-1).max()), 1)
    return values[..., :width].astype(np.int32)


def _pad(lists: list[np.ndarray], sentinel: int) -> np.ndarray:
    width = max(x.shape[-1] for x in lists)
    pad = lambda x: np.pad(  # noqa: E731
        x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])], constant_values=sentinel
    )
    return np.concatenate([pad(x) for x in lists])


@functools.cache
def pose_geometry(config: EnvConfig) -> PoseGeometry:
    """The footprint and workspace tables of every pose, one jitted call per map row."""
    env = ExcavationEnv(config)
    size, sentinel = config.map_size, config.map_size**2
    masks = jax.jit(functools.partial(_pose_masks, env))
    cols, headings = np.meshgrid(np.arange(size), np.arange(H), indexing="ij")
    footprints, on_maps, reaches = [], [], []
    for row in range(size):
        positions = np.stack([np.full(cols.size, row), cols.ravel()], -1).astype(np.int32)
        start, footprint, on_map, reach = jax.device_get(
            masks(positions, headings.ravel().astype(np.int32))
        )
        width = footprint.shape[-1]
        cells = np.arange(width)
        flat = (start[:, 0, None, None] + cells[:, None]) * size + start[:, 1, None, None] + cells
        flat = flat.reshape(-1, width * width)
        footprints.append(_index_lists(footprint.reshape(len(flat), -1), flat, sentinel))
        reaches.append(_index_lists(reach.reshape(len(flat), H, -1), flat[:, None], sentinel))
        on_maps.append(on_map)
    return PoseGeometry(
        size, _pad(footprints, sentinel), np.concatenate(on_maps), _pad(reaches, sentinel)
    )


@functools.cache
def pose_graph(config: EnvConfig, agent_type: int) -> PoseGraph:
    """Transitions of actions 0..3 between poses, from the env's `_candidate_pose`."""
    env = ExcavationEnv(config)
    size = config.map_size
    limit = config.wheel_angle_limit if agent_type == A.WHEELED else 0
    num_wheels = 2 * limit + 1
    rows, cols, heads, wheels = (
        g.ravel()
        for g in np.meshgrid(
            np.arange(size),
            np.arange(size),
            np.arange(H),
            np.arange(-limit, limit + 1),
            indexing="ij",
        )
    )

    def candidates(pos, heading, wheel):
        agent = _agent(pos, heading, wheel=wheel, agent_type=agent_type)
        return jax.vmap(lambda a: env._candidate_pose(agent, a))(jnp.arange(4))

    positions = np.stack([rows, cols], -1).astype(np.int32)
    delta, new_heading, new_wheel = jax.device_get(
        jax.jit(jax.vmap(candidates))(positions, heads.astype(np.int32), wheels.astype(np.int32))
    )
    if agent_type != A.WHEELED:
        new_wheel = np.zeros_like(new_wheel)  # the env changes wheel angles of tracked bases too
    new_rows, new_cols = rows[:, None] + delta[..., 0], cols[:, None] + delta[..., 1]
    inside = (new_rows >= 0) & (new_rows < size) & (new_cols >= 0) & (new_cols < size)
    new_pose = (new_rows * size + new_cols) * H + new_heading
    node = np.arange(len(rows))[:, None]
    new_node = np.where(inside, new_pose * num_wheels + new_wheel + limit, -1)
    new_node = np.where(new_node == node, -1, new_node)  # a wheel already at its limit
    base_action = np.arange(4) < (2 if agent_type == A.WHEELED else 4)
    checked = np.where(inside & base_action, new_pose, -1)
    return PoseGraph(num_wheels, limit, new_node.astype(np.int32), checked.astype(np.int32))


def cabin_turns(current: int, wanted: int) -> list[int]:
    """Shortest list of CABIN_CLOCK / CABIN_ANTICLOCK taking a cabin heading to another."""
    steps = (wanted - current) % H
    return [A.CABIN_ANTICLOCK] * steps if steps <= H // 2 else [A.CABIN_CLOCK] * (H - steps)


def turn_count(current, wanted):
    """Cabin turns (either way) from `current` to `wanted` heading; numpy, broadcasts."""
    steps = (np.asarray(wanted) - np.asarray(current)) % H
    return np.minimum(steps, H - steps)


def shortest_paths(graph: PoseGraph, start: int, free_pose: np.ndarray):
    """BFS over the pose graph. free_pose bool [P]. Returns (dist, parent, via) int32 [V]:
    dist -1 where unreachable, `via` the action taken into each node from `parent`."""
    checked = graph.checked_pose
    valid = (graph.next_node >= 0) & np.where(checked >= 0, free_pose[checked], True)
    dist = np.full(len(valid), -1, np.int32)
    parent = np.full(len(valid), -1, np.int32)
    via = np.full(len(valid), -1, np.int32)
    dist[start], frontier, depth = 0, np.array([start]), 0
    while frontier.size:
        depth += 1
        src, action = np.nonzero(valid[frontier])
        dst = graph.next_node[frontier[src], action]
        new = dist[dst] < 0
        # reversed, so the first (src, action) of a duplicate destination is written last
        src, action, dst = src[new][::-1], action[new][::-1], dst[new][::-1]
        dist[dst], parent[dst], via[dst] = depth, frontier[src], action
        frontier = np.flatnonzero(dist == depth)
    return dist, parent, via


def path_to(parent: np.ndarray, via: np.ndarray, goal: int) -> list[int]:
    actions, node = [], goal
    while parent[node] >= 0:
        actions.append(int(via[node]))
        node = parent[node]
    return actions[::-1]
