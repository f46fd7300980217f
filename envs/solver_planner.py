"""The scripted solver's planner (see `envs.solver`): numpy planning of dig-and-dump cycles
on one map for one agent type, over the pose tables of `envs.solver_geometry`."""


from __future__ import annotations

import dataclasses
import itertools
import time
from typing import NamedTuple

import numpy as np

from envs import actions as A
from envs import geometry as geo
from envs import reachability
from envs.config import EnvConfig
from envs.solver_geometry import (
    cabin_turns,
    path_to,
    pose_geometry,
    pose_graph,
    shortest_paths,
    turn_count,
)

H = geo.NUM_HEADINGS
CANDIDATES_SIMULATED = 48
"""Candidate (pose, arm) takes simulated exactly per cycle, best progress bound first."""
CANDIDATES_CHECKED = 32
"""Simulated cycles whose after-state is checked for reachability, best take first."""
EXHAUSTIVE_CHECKS = 160
"""Further cycles checked, over every take, when none of the best ones is safe."""
RELOCATIONS_CHECKED = 8
"""Soil-moving cycles tried when no progress cycle keeps the remaining targets reachable."""
RELOCATIONS_IN_A_ROW = 8
"""A plan gives up after this many soil-moving cycles without progress in between."""
MAX_BACKJUMPS = 24
"""Dead ends a plan backs out of before it accepts cycles that block targets."""
BACKJUMP_NOISE = 0.5
"""Log-normal noise on candidate rates after a backjump."""
SCARCITY_WEIGHT = 4.0
SCARCE_QUANTILE = 0.2
"""In the take order a target weighs 1 + SCARCITY_WEIGHT * min(1, k_scarce / k), where k
counts the usable sectors holding it and k_scarce is the SCARCE_QUANTILE of k over targets:
the hardest-to-reach targets are dug while they still can be."""
DUMP_OPTIONS = 6
"""Dump headings kept per take, best first (fewest tiles covered, far from targets)."""


# ----------------------------------------------------------------------------- planning


class PlanState(NamedTuple):
    """What the planner tracks: flat maps, the agent's node and cabin heading."""

    action_map: np.ndarray
    dumpability: np.ndarray
    node: int
    cabin: int


class Plan(NamedTuple):
    """Cycles, their actions (one list per cycle), and why it stops short ('' if done)."""

    cycles: list
    actions: list
    reason: str


@dataclasses.dataclass
class Cycle:
    """Drive to `node`, turn to `take_arm`, DO, turn to `dump_arm`, DO."""

    node: int
    take_arm: int
    dump_arm: int
    gain: int  # change of (dig tiles done - misplaced soil)
    cost: int  # actions
    rate: float  # worth per action: gain, or for relocations the targets they unblock
    action_map: np.ndarray  # predicted flat maps after the cycle
    dumpability: np.ndarray
    blocked: tuple[int, int] = (0, 0)  # (uncovered targets, dump deficit) after it


class Planner:
    """Numpy planning on one map for one agent type (see the module docstring)."""

    def __init__(self, config: EnvConfig, agent_type: int, target_map, obstacles):
        self.geometry = pose_geometry(config)
        self.graph = pose_graph(config, agent_type)
        self.size = config.map_size
        self.sentinel = self.size**2
        self.target = np.asarray(target_map).ravel().astype(np.int8)
        self.obstacle = np.asarray(obstacles).ravel() > 0
        self.has_zones = bool(np.any(self.target == 1))
        self.drivable_soil_height = config.drivable_soil_height
        self.dig_first = config.dig_before_pickup
        # Tiles soil may be picked up from (`EnvConfig.pickup_misplaced_only`).
        self.pickable = np.ones(self.sentinel, bool)
        if config.pickup_misplaced_only:
            self.pickable = self.has_zones & (self.target != 1)
        self.reach_radius = config.workspace_radii[1]
        self.ring_offsets = reachability.ring_offsets(config)
        blocked = np.append(self.obstacle, True)[self.geometry.reach]
        self.reach = np.where(blocked, self.sentinel, self.geometry.reach)

    # -- helpers on flat maps ([N * N]; `_ext` appends the sentinel tile)

    def _ext(self, values, fill=False):
        return np.append(values, fill)

    def _free_poses(self, action_map):
        drivable = (action_map >= 0) & (action_map <= self.drivable_soil_height)
        traversable = self._ext(~self.obstacle & drivable, True)
        return self.geometry.on_map & traversable[self.geometry.footprint].all(axis=1)

    def _dilate(self, flat, radius):
        """bool [N * N]: tiles within Chebyshev distance `radius` of a True tile."""
        span = range(-radius, radius + 1)
        return self._spread(flat, [(dr, dc) for dr in span for dc in span], radius)

    def _near(self, flat):
        """bool [N * N]: positions whose arm ring (every sector of every heading) holds a
        True tile. Poses elsewhere cannot touch those tiles, so the per-sector work skips
        them: late in a task few positions are near what is left."""
        return self._spread(flat, self.ring_offsets, int(np.ceil(self.reach_radius)))

    def _spread(self, flat, offsets, pad):
        """bool [N * N]: tiles at one of `offsets` (|offset| <= pad) from a True tile."""
        padded = np.pad(flat.reshape(self.size, self.size), pad)
        out = np.zeros((self.size, self.size), bool)
        for dr, dc in offsets:
            out |= padded[pad + dr : pad + dr + self.size, pad + dc : pad + dc + self.size]
        return out.ravel()

    def pose_of(self, node):
        return node // self.graph.num_wheels

    def node_of(self, pos, heading, wheel):
        pose = (int(pos[0]) * self.size + int(pos[1])) * H + int(heading)
        return pose * self.graph.num_wheels + int(wheel) + self.graph.wheel_limit

    def state_of(self, env_state) -> PlanState:
        """The planner's view of an env state (on the host): flat maps, node, cabin."""
        agent = env_state.agent
        return PlanState(
            np.asarray(env_state.action_map).ravel().astype(np.int8),
            np.asarray(env_state.dumpability).ravel().astype(np.int8),
            self.node_of(agent.pos, agent.base_heading, agent.wheel_angle),
            int(agent.cabin_heading),
        )

    # -- one cycle, simulated

    def simulate(self, action_map, dumpability, pose, take_arm):
        """The take (DO with an empty bucket) of `pose` at `take_arm`: (action map,
        dumpability, load, gain) after it, or None when it would take nothing."""
        tiles = self.reach[pose, take_arm]
        tiles = tiles[tiles < self.sentinel]
        soil = tiles[(action_map[tiles] > 0) & self.pickable[tiles]]
        undug = (self.target[tiles] == -1) & (action_map[tiles] == 0)
        action_map = action_map.copy()
        if soil.size and not (self.dig_first and undug.any()):
            action_map[soil] -= 1
            gain = int(np.sum(self.target[soil] != 1)) if self.has_zones else 0
            return action_map, dumpability, soil.size, gain
        dug = tiles[undug]
        if not dug.size:
            return None
        action_map[dug] -= 1
        near = np.zeros(self.sentinel, bool)
        near[dug] = True
        dumpability = np.where(self._dilate(near, 1), 0, dumpability).astype(np.int8)
        return action_map, dumpability, dug.size, dug.size

    def dump(self, action_map, dumpability, pose, dump_arm, load):
        """(action map after the dump, tiles receiving soil, misplaced units) or None."""
        tiles = self.reach[pose, dump_arm]
        tiles = tiles[tiles < self.sentinel]
        allowed = tiles[(dumpability[tiles] == 1) & (action_map[tiles] == 0)]
        allowed = allowed[self.target[allowed] != -1]
        if not allowed.size:
            return None
        on_zone = allowed[self.target[allowed] == 1]
        dest = on_zone if on_zone.size else allowed  # sorted: row-major like the env
        share = load // dest.size + (np.arange(dest.size) < load % dest.size)
        action_map = action_map.copy()
        action_map[dest] += share.astype(np.int8)
        receiving = dest[share > 0]
        misplaced = 0 if (on_zone.size or not self.has_zones) else load
        return action_map, receiving, misplaced

    def blocked(self, action_map, dumpability, node):
        """(undug targets out of reach, dump deficit) as seen from `node`; see `coverage`."""
        coverage, deficit = self.coverage(action_map, dumpability, node)
        undug = (self.target == -1) & (action_map == 0)
        return int(np.sum(undug & (coverage == 0))), deficit

    def coverage(self, action_map, dumpability, node):
        """(int [N * N] usable sectors holding each undug target, dump deficit) as seen from
        `node`. A sector is usable when its pose is reachable, no soil in it would be picked up
        first (`EnvConfig.dig_before_pickup` off) and the pose
        has a dump tile in one of its sectors (a zone tile on maps with zones). The deficit
        is how many more units must still be dumped than dump tiles in reach of reachable
        positions could take one each."""
        (coverage,), deficit = self._sector_cover(action_map, dumpability, node)
        return coverage, deficit

    def blocked_reasons(self, action_map, dumpability, node) -> dict[str, int]:
        """Why the undug targets out of reach from `node` (coverage 0) are: `cut off` (in no
        sector of a reachable pose), `soil in the way` (only in sectors with soil that DO
        would pick up first) or `no dump space` (in soil-free sectors of reachable poses only
        where no sector of the pose has a free dump tile)."""
        (usable, anywhere, clean), _ = self._sector_cover(action_map, dumpability, node, True)
        blocked = (self.target == -1) & (action_map == 0) & (usable == 0)
        return {
            "cut off": int(np.sum(blocked & (anywhere == 0))),
            "soil in the way": int(np.sum(blocked & (anywhere > 0) & (clean == 0))),
            "no dump space": int(np.sum(blocked & (clean > 0))),
        }

    def _sector_cover(self, action_map, dumpability, node, breakdown=False):
        """((usable sectors holding each undug target: see `coverage`, and with `breakdown`
        also the sectors of reachable poses holding it and those of them without soil to pick
        up first), each int [N * N]; dump deficit)."""
        dist, _, _ = shortest_paths(self.graph, node, self._free_poses(action_map))
        poses = np.unique(self.pose_of(np.flatnonzero(dist >= 0)))
        undug = (self.target == -1) & (action_map == 0)
        space = (dumpability == 1) & (action_map == 0) & (self.target != -1)
        if self.has_zones:
            space &= self.target == 1
        soil = (action_map > 0) & self.pickable
        codes = self._ext(undug | soil << 1 | space << 2, 0).astype(np.uint8)
        reach = self.reach[poses[self._near(undug)[poses // H]]]
        bits = np.bitwise_or.reduce(codes[reach], axis=-1)  # [R, 12]
        pose_has_space = (bits & 4).any(axis=-1, keepdims=True)
        soil_hides = 0 if self.dig_first else bits & 2
        holds = bits & 1 > 0
        clean = holds & (soil_hides == 0)
        counts = tuple(
            np.bincount(reach[sectors].ravel(), minlength=self.sentinel + 1)[:-1]
            for sectors in (clean & pose_has_space, holds, clean)[: 3 if breakdown else 1]
        )
        positions = np.zeros(self.sentinel, bool)
        positions[poses // H] = True
        demand = int(undug.sum())
        if self.has_zones:
            demand += int(np.sum(np.where(self.target == 1, 0, np.maximum(action_map, 0))))
        in_reach = self._spread(positions, self.ring_offsets, int(self.reach_radius))
        space_in_reach = int(np.sum(space & in_reach))
        return counts, max(0, demand - space_in_reach)

    def _harm(self, action_map):
        """int [N * N + 1]: how much soil on each tile would be in the way of undug targets
        (reach radius + 1 - Chebyshev distance to the nearest one, at least 0)."""
        radius = int(np.ceil(self.reach_radius))
        undug = (self.target == -1) & (action_map == 0)
        harm = np.zeros(self.sentinel, np.int32)
        near = undug
        for _ in range(radius + 1):
            harm += near
            near = self._dilate(near, 1)
        return self._ext(harm, 0)

    def candidates(
        self,
        action_map,
        dumpability,
        node,
        cabin,
        relocate=False,
        takes=CANDIDATES_SIMULATED,
        noise=None,
    ):
        """Cycles from `node` (cabin heading `cabin`), best rate first, up to
        `DUMP_OPTIONS` dump headings per take. Progress cycles raise (dug - misplaced);
        with `relocate`, cycles that only move soil off sectors holding undug targets (or,
        on maps with zones, dig with the soil parked outside the zones) instead."""
        dist_nodes, parent, via = shortest_paths(self.graph, node, self._free_poses(action_map))
        reached = np.flatnonzero(dist_nodes >= 0)
        order = np.lexsort((reached, dist_nodes[reached]))  # nearest node per pose first
        poses, first = np.unique(self.pose_of(reached[order]), return_index=True)
        undug = (self.target == -1) & (action_map == 0)
        # Only poses with an undug target (or misplaced soil) in reach can have a rate > 0.
        worth_a_look = undug | (self.has_zones & (action_map > 0) & (self.target != 1))
        if noise is not None:  # drawn for every reachable pose, as before the filter
            noise_draw = noise.standard_normal((len(poses), H))
        keep = self._near(worth_a_look)[poses // H]
        poses, first = poses[keep], first[keep]
        pose_nodes = reached[order][first]
        dist = dist_nodes[pose_nodes]
        reach = self.reach[poses]  # [R, 12, K]
        undug_count = self._ext(undug)[reach].sum(axis=-1)
        # Targets that few sectors can still dig are worth more: dig them while they can be.
        coverage, _ = self.coverage(action_map, dumpability, node)
        covered = coverage[undug & (coverage > 0)]
        scarce = np.quantile(covered, SCARCE_QUANTILE) if covered.size else 1.0
        bonus = SCARCITY_WEIGHT * np.minimum(1.0, scarce / np.maximum(coverage, 1))
        scarcity = np.where(undug, 1.0 + bonus, 0.0)
        weighted_count = self._ext(scarcity, 0.0)[reach].sum(axis=-1)
        has_soil = self._ext((action_map > 0) & self.pickable)[reach].any(axis=-1)
        if self.dig_first:  # soil is picked up only from sectors without undug targets
            has_soil &= undug_count == 0
        if relocate:
            value = undug_count
        else:
            value = np.where(has_soil, 0, weighted_count)
            if self.has_zones:
                misplaced = self._ext((action_map > 0) & (self.target != 1))
                value = np.where(has_soil, misplaced[reach].sum(axis=-1), value)
        heading = poses % H
        cabin_turn_count = turn_count((heading[:, None] + cabin) % H, np.arange(H)[None])
        spent = dist[:, None] + cabin_turn_count + 2
        rate = np.where(value > 0, value / spent, -1.0)
        if noise is not None:  # a search that backjumped tries other orders
            rate = rate * np.exp(BACKJUMP_NOISE * noise_draw[keep])
        harm = self._harm(action_map)
        groups = []
        for index in np.argsort(-rate, axis=None, kind="stable")[:takes]:
            row, arm = divmod(int(index), H)
            if rate[row, arm] <= 0:
                break
            pose = int(poses[row])
            taken = self.simulate(action_map, dumpability, pose, arm)
            if taken is None:
                continue
            after_take, dump_after, load, gain = taken
            take_tiles = self.reach[pose, arm]
            options = []
            for dump_arm in range(H):
                dumped = self.dump(after_take, dump_after, pose, dump_arm, load)
                if dumped is None:
                    continue
                new_map, receiving, misplaced = dumped
                net_gain = gain - misplaced
                if net_gain < 0 or (net_gain == 0) != relocate:
                    continue
                if relocate and np.isin(receiving, take_tiles).any():
                    continue  # soil put back where it was taken from
                turns = int(turn_count(arm, dump_arm))
                penalty = turns + 2 * len(receiving) + 2 * int(harm[receiving].sum())
                options.append((net_gain, -penalty, dump_arm, new_map, turns))
            options.sort(key=lambda o: (o[0], o[1]), reverse=True)
            cabin_cost = int(cabin_turn_count[row, arm])
            group = []
            for net_gain, _, dump_arm, new_map, turns in options[:DUMP_OPTIONS]:
                cost = int(dist[row]) + cabin_cost + 1 + turns + 1
                worth = float(value[row, arm]) * (net_gain / gain if not relocate else 1.0)
                group.append(
                    Cycle(
                        int(pose_nodes[row]),
                        arm,
                        dump_arm,
                        net_gain,
                        cost,
                        worth / cost,
                        new_map,
                        dump_after,
                    )
                )
            if group:
                groups.append(group)
        # takes by the rate of their preferred dump; each take's dumps in preference order
        groups.sort(key=lambda group: -group[0].rate)
        return [cycle for group in groups for cycle in group], (parent, via)

    def choose(self, state: PlanState, noise=None, thorough=False):
        """(cycle, paths, safe) for the next cycle, or (None, reason, False).

        Safe: the best progress cycle that leaves no more targets blocked than now (the
        best takes; with `thorough`, then every take), or a relocation that unblocks targets
        or leads to progress. Otherwise the least harmful progress cycle, flagged unsafe."""
        action_map, dumpability, node, cabin = state
        before = self.blocked(action_map, dumpability, node)
        safe = lambda c: c.blocked <= before or c.blocked == (0, 0)  # noqa: E731
        cycles, paths = self.candidates(action_map, dumpability, node, cabin, noise=noise)
        checked = cycles[:CANDIDATES_CHECKED]
        for cycle in checked:
            cycle.blocked = self.blocked(cycle.action_map, cycle.dumpability, cycle.node)
            if safe(cycle):
                return cycle, paths, True
        seen = {(c.node, c.take_arm, c.dump_arm) for c in checked}
        every = (
            self.candidates(action_map, dumpability, node, cabin, takes=None)[0] if thorough else []
        )
        every = [c for c in every if (c.node, c.take_arm, c.dump_arm) not in seen]
        for cycle in every[:EXHAUSTIVE_CHECKS]:
            cycle.blocked = self.blocked(cycle.action_map, cycle.dumpability, cycle.node)
            if safe(cycle):
                return cycle, paths, True
        moves, move_paths = self.candidates(
            action_map, dumpability, node, cabin, relocate=True, noise=noise
        )
        for cycle in moves[:RELOCATIONS_CHECKED]:
            cycle.blocked = self.blocked(cycle.action_map, cycle.dumpability, cycle.node)
            if cycle.blocked < before:
                return cycle, move_paths, True
            if cycle.blocked == before and self.candidates(*self.after(cycle), takes=8)[0]:
                return cycle, move_paths, True
        if checked:
            return min(checked, key=lambda c: (c.blocked, -c.rate)), paths, False
        return None, f"stuck: {before[0]} targets out of reach, dump deficit {before[1]}", False

    def after(self, cycle: Cycle) -> PlanState:
        heading = self.pose_of(cycle.node) % H
        dump_cabin = (cycle.dump_arm - heading) % H
        return PlanState(cycle.action_map, cycle.dumpability, cycle.node, dump_cabin)

    def finished(self, action_map) -> bool:
        """All targets dug and, on maps with zones, no soil outside them."""
        if np.any((self.target == -1) & (action_map == 0)):
            return False
        return not (self.has_zones and np.any((action_map > 0) & (self.target != 1)))

    def plan(self, state: PlanState, max_steps: int, seed: int = 0,
             time_limit: float | None = None) -> Plan:
        """Cycles from `state` until the task is done, searching with backjumps: when no
        safe cycle is left, the plan goes back 1, 1, 2, 2, 4, ... cycles and continues with
        noisy candidate rates; after `MAX_BACKJUMPS`, unsafe cycles are accepted. With
        `time_limit` (seconds), the search stops there, with the plan so far."""
        rng = np.random.default_rng(seed)
        states, cycles, actions = [state], [], []
        backjumps, noise = 0, None
        deadline = None if time_limit is None else time.monotonic() + time_limit
        while not self.finished(states[-1].action_map):
            if deadline is not None and time.monotonic() >= deadline:
                last = states[-1]
                blocked, deficit = self.blocked(last.action_map, last.dumpability, last.node)
                return Plan(cycles, actions, f"time limit of {time_limit:g} s after "
                            f"{backjumps} backjumps: {blocked} targets out of reach, "
                            f"dump deficit {deficit}")
            cycle, paths, safe = self.choose(states[-1], noise, backjumps >= MAX_BACKJUMPS)
            idle = sum(1 for _ in itertools.takewhile(lambda c: c.gain == 0, cycles[::-1]))
            ok = safe and (cycle.gain > 0 or idle < RELOCATIONS_IN_A_ROW)
            if not ok and backjumps < MAX_BACKJUMPS and cycles:
                jump = min(len(cycles), 2 ** (backjumps // 2))
                backjumps += 1
                del states[-jump:], cycles[-jump:], actions[-jump:]
                noise = rng
                continue
            if cycle is None:
                return Plan(cycles, actions, paths)
            if not safe and cycle.gain == 0:
                return Plan(cycles, actions, f"{RELOCATIONS_IN_A_ROW} relocations, no progress")
            actions.append(self.cycle_actions(cycle, paths, states[-1].cabin))
            cycles.append(cycle)
            states.append(self.after(cycle))
            if sum(map(len, actions)) > max_steps:
                return Plan(cycles, actions, f"over the step budget of {max_steps}")
        return Plan(cycles, actions, "")

    def cycle_actions(self, cycle: Cycle, paths, cabin: int) -> list[int]:
        parent, via = paths
        heading = self.pose_of(cycle.node) % H
        take_cabin, dump_cabin = (cycle.take_arm - heading) % H, (cycle.dump_arm - heading) % H
        return (
            path_to(parent, via, cycle.node)
            + cabin_turns(cabin, take_cabin)
            + [A.DO]
            + cabin_turns(take_cabin, dump_cabin)
            + [A.DO]
        )
