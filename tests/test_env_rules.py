"""The rules that decide whether a policy can wall itself in or loop: soil one unit high is
drivable, DO digs before it picks up and picks up only misplaced soil, and the action mask
forbids returning to a recent pose (`EnvConfig.drivable_soil_height`, `dig_before_pickup`,
`pickup_misplaced_only`, `revisit_memory`), each checked against the rules switched off.
Hand-built 32x32 states as in test_env_actions."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import action_rules, reachability
from envs import actions as A
from envs.config import EnvConfig
from envs.env import ExcavationEnv
from tests.test_env_actions import CENTRE, N, blank_target, build, step


@pytest.fixture(scope="module")
def legacy_env():
    """Every rule switched off: soil blocks, any soil is picked up first, no dead-end or
    revisit mask."""
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60, drivable_soil_height=0,
                                   dig_before_pickup=False, pickup_misplaced_only=False,
                                   mask_dead_end_digs=False, mask_cut_off_digs=False,
                                   revisit_memory=0))


@pytest.fixture(scope="module")
def legacy_step(legacy_env):
    return jax.jit(legacy_env.step_no_reset)


def pos_of(state):
    return tuple(int(x) for x in np.asarray(state.agent.pos))


def test_soil_one_unit_high_is_drivable_higher_soil_and_holes_are_not(
        env32, step32, legacy_env, legacy_step):
    # BACKWARD from the centre, heading 0, covers cols 13..17 of rows 15..17.
    for value, drivable in ((1, True), (2, False), (-1, False)):
        action_map = np.zeros((N, N), np.int8)
        action_map[17, 13] = value
        obs, new, *_ = step(step32, build(env32, action_map=action_map), A.BACKWARD)
        assert (pos_of(new) == (16, 15)) == drivable, value
        mask = env32.action_mask(build(env32, action_map=action_map))
        assert bool(mask[A.BACKWARD]) == drivable, value
    action_map = np.zeros((N, N), np.int8)
    action_map[17, 13] = 1
    _, new, *_ = step(legacy_step, build(legacy_env, action_map=action_map), A.BACKWARD)
    assert pos_of(new) == CENTRE  # with drivable_soil_height 0 any soil blocks


def with_far_zone(target):
    """The map gets a dump zone out of reach, so soil anywhere else is misplaced."""
    target = target.copy()
    target[2, 2] = 1
    return target


def test_do_digs_targets_in_reach_before_it_picks_up_soil(env32, step32, legacy_env,
                                                         legacy_step):
    target = blank_target()
    target[16, 19] = -1
    target = with_far_zone(target)
    action_map = np.zeros((N, N), np.int8)
    action_map[16, 20] = 1  # misplaced soil in the same sector
    _, dug, *_ = step(step32, build(env32, target=target, action_map=action_map), A.DO)
    assert int(dug.action_map[16, 19]) == -1 and int(dug.action_map[16, 20]) == 1
    assert int(dug.agent.loaded) == 1 and int(dug.dig_tiles_done) == 1
    # Switched off, the soil is picked up first and the target stays undug.
    state = build(legacy_env, target=target, action_map=action_map)
    _, picked, *_ = step(legacy_step, state, A.DO)
    assert int(picked.action_map[16, 19]) == 0 and int(picked.action_map[16, 20]) == 0
    assert int(picked.agent.loaded) == 1 and int(picked.dig_tiles_done) == 0


@pytest.mark.parametrize(("zones", "soil_on_zone", "picked"),
                         [(False, False, False), (True, True, False), (True, False, True)])
def test_only_misplaced_soil_is_picked_up(env32, step32, legacy_env, legacy_step, zones,
                                          soil_on_zone, picked):
    """Soil outside the zones of a map with zones is picked up; soil on a zone, or on a map
    without zones, is not, and DO is masked there. Switched off, every soil tile is."""
    target = with_far_zone(blank_target()) if zones else blank_target()
    if soil_on_zone:
        target[16, 20] = 1
    action_map = np.zeros((N, N), np.int8)
    action_map[16, 20] = 1
    state = build(env32, target=target, action_map=action_map)
    assert bool(env32.action_mask(state)[A.DO]) == picked
    _, new, *_ = step(step32, state, A.DO)
    assert int(new.agent.loaded) == int(picked) and int(new.action_map[16, 20]) == 1 - picked
    legacy = build(legacy_env, target=target, action_map=action_map)
    _, taken, *_ = step(legacy_step, legacy, A.DO)
    assert int(taken.agent.loaded) == 1


def test_mask_forbids_returning_to_a_recent_pose(env32, step32, legacy_env, legacy_step):
    state = build(env32)
    assert int(state.recent_poses[0]) == int(env32.pose_code(state.agent))
    assert bool(np.all(np.asarray(state.recent_poses[1:]) == -1))
    inverse = {A.FORWARD: A.BACKWARD, A.BACKWARD: A.FORWARD, A.CLOCK: A.ANTICLOCK,
               A.ANTICLOCK: A.CLOCK, A.CABIN_CLOCK: A.CABIN_ANTICLOCK,
               A.CABIN_ANTICLOCK: A.CABIN_CLOCK}
    for action, undo in inverse.items():
        obs, new, *_ = step(step32, state, action)
        mask = np.asarray(obs["action_mask"])
        assert not mask[undo], A.TRACKED_ACTION_NAMES[action]
        others = [a for a in inverse if a != undo]
        assert mask[others].all(), A.TRACKED_ACTION_NAMES[action]
        assert (np.asarray(env32.action_mask(new)) == mask).all()
        # Without the rule the undo is allowed.
        legacy_obs, *_ = step(legacy_step, build(legacy_env), action)
        assert bool(legacy_obs["action_mask"][undo])
    # A cabin turning round: the twelfth turn would come back to the start.
    current = state
    for turn in range(11):
        obs, current, *_ = step(step32, current, A.CABIN_ANTICLOCK)
        assert bool(obs["action_mask"][A.CABIN_ANTICLOCK]) == (turn < 10), turn
    # Two moves forward: the pose one back (not only the last action's undo) is remembered.
    current = state
    for _ in range(2):
        obs, current, *_ = step(step32, current, A.FORWARD)
    assert pos_of(current) == (16, 18) and not bool(obs["action_mask"][A.BACKWARD])


def test_a_wheeled_arc_back_is_a_revisit(env32, step32):
    state = build(env32, agent_type=A.WHEELED, wheel=1)
    obs, moved, *_ = step(step32, state, A.FORWARD)
    assert pos_of(moved) != CENTRE and int(moved.agent.base_heading) == 1
    assert not bool(obs["action_mask"][A.BACKWARD])  # the arc back retraces it
    obs, turned, *_ = step(step32, state, A.WHEELS_RIGHT)
    assert not bool(obs["action_mask"][A.WHEELS_LEFT])


def test_a_dig_or_dump_clears_the_memory_and_no_pickup_undoes_a_dump(env32, step32):
    target = blank_target()
    target[16, 19] = -1
    target = with_far_zone(target)  # the dump below is misplaced soil, which may be picked up
    state = build(env32, target=target, cabin=0)
    obs, moved, *_ = step(step32, state, A.BACKWARD)
    assert not bool(obs["action_mask"][A.FORWARD])
    obs, dug, *_ = step(step32, moved, A.DO)  # digs [16, 19] from one tile back
    assert int(dug.dig_tiles_done) == 1
    assert bool(np.all(np.asarray(dug.recent_poses[1:]) == -1))
    obs, turned, *_ = step(step32, dug, A.CABIN_ANTICLOCK)
    obs, dumped, *_ = step(step32, turned, A.DO)
    assert int(dumped.agent.loaded) == 0 and int(jnp.sum(dumped.action_map > 0)) == 1
    # A DO now would pick the soil back up: masked, though the soil could be picked up.
    # Moving is allowed again (a new map).
    mask = np.asarray(obs["action_mask"])
    assert not mask[A.DO] and mask[A.FORWARD] and mask[A.BACKWARD]
    unremembered = dumped.replace(last_actions=dumped.last_actions.at[0].set(A.CABIN_CLOCK))
    assert bool(env32.action_mask(unremembered)[A.DO])
    # The dump pose itself is remembered: turning away and back is masked.
    obs, back, *_ = step(step32, dumped, A.CABIN_CLOCK)
    assert not bool(obs["action_mask"][A.CABIN_ANTICLOCK])


def test_mask_falls_back_when_every_move_would_revisit(env32):
    state = build(env32)
    agent = state.agent
    successors = [env32.pose_code(agent, delta=d, heading=h, wheel=w) for d, h, w in (
        (jnp.array([0, 1]), 0, 0), (jnp.array([0, -1]), 0, 0), (0, 11, 0), (0, 1, 0))]
    successors += [env32.pose_code(agent, cabin=c) for c in (11, 1)]
    memory = np.full(state.recent_poses.shape, -1, np.int32)
    memory[: len(successors)] = np.asarray(successors)
    cornered = state.replace(recent_poses=jnp.asarray(memory))
    mask = np.asarray(env32.action_mask(cornered))
    expected = np.asarray(env32.action_mask(state.replace(
        recent_poses=jnp.full_like(state.recent_poses, -1))))
    assert (mask == expected).all() and mask[:6].all()
    # One successor not in memory: it alone (of the moves) stays allowed.
    memory[0] = -1
    mask = np.asarray(env32.action_mask(state.replace(recent_poses=jnp.asarray(memory))))
    assert mask[A.FORWARD] and not mask[[A.BACKWARD, A.CLOCK, A.ANTICLOCK, A.CABIN_CLOCK,
                                          A.CABIN_ANTICLOCK]].any()


def test_a_dig_that_leaves_nowhere_to_dump_is_masked(env32, legacy_env):
    """After digging [16, 19] its neighbours take no soil; with no other dumpable tile in
    any sector of the pose the load could never be dumped (a loaded excavator cannot move),
    so the dig is masked, though it is valid. One dumpable tile behind the base lifts it."""
    target = blank_target()
    target[16, 19] = -1
    dumpability = np.zeros((N, N), np.int8)
    dumpability[16, 20] = 1  # next to the target: not dumpable once it is dug
    state = build(env32, target=target, dumpability=dumpability)
    assert bool(env32.valid_actions(state)[A.DO]) and not bool(env32.action_mask(state)[A.DO])
    assert bool(env32.action_mask(state)[A.CABIN_CLOCK])
    assert bool(legacy_env.action_mask(build(legacy_env, target=target,
                                             dumpability=dumpability))[A.DO])
    dumpability[16, 12] = 1  # behind the base, in reach of the cabin turned round
    state = build(env32, target=target, dumpability=dumpability)
    assert bool(env32.action_mask(state)[A.DO])


def corridor(far_target: bool):
    """A corridor 5 rows wide (rows 14..18, obstacle rows 13 and 19 to the east edge,
    closed at col 10) with the agent at the centre, heading 0. Its arm (heading 0) reaches
    every tile of col 20 inside it: a dig there walls the base into cols 11..19. With
    `far_target`, a target further east at (16, 28) is then cut off."""
    obstacles = np.zeros((N, N), np.int8)
    obstacles[[13, 19], 10:] = 1
    obstacles[13:20, 10] = 1
    target = np.zeros((N, N), np.int8)
    target[14:19, 20] = -1
    if far_target:
        target[16, 28] = -1
    return target, obstacles


@pytest.fixture(scope="module")
def cut_off_env():
    """The default env with the cut-off rule (`mask_cut_off_digs`, off by default)."""
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_digs=True))


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_a_dig_that_walls_off_the_last_targets_is_masked(cut_off_env, env32, step32,
                                                        agent_type):
    target, obstacles = corridor(far_target=True)
    state = build(cut_off_env, target=target, obstacles=obstacles, agent_type=agent_type)
    assert bool(cut_off_env.valid_actions(state)[A.DO])
    assert not bool(cut_off_env.action_mask(state)[A.DO])
    assert bool(cut_off_env.action_mask(state)[A.FORWARD])  # driving on to (16, 28) is not
    # The dig is what walls the base in (the same dynamics with the rule off).
    _, dug, *_ = step(step32, build(env32, target=target, obstacles=obstacles,
                                    agent_type=agent_type), A.DO)
    assert (np.asarray(dug.action_map)[14:19, 20] == -1).all()
    # Without the far target the same dig finishes the task; with the rule off it is allowed.
    target, obstacles = corridor(far_target=False)
    state = build(cut_off_env, target=target, obstacles=obstacles, agent_type=agent_type)
    assert bool(cut_off_env.action_mask(state)[A.DO])
    target, obstacles = corridor(far_target=True)
    default = build(env32, target=target, obstacles=obstacles, agent_type=agent_type)
    assert bool(env32.action_mask(default)[A.DO])


def wall_dump_maps() -> dict:
    """The corridor with col 20 its only dumpable tiles, all under the arm, and a target at
    (16, 28) beyond it: ten units dumped there pile 2 high across the corridor and cut the
    target off (`build` keyword arguments)."""
    _, obstacles = corridor(far_target=False)
    target = np.zeros((N, N), np.int8)
    target[16, 28] = -1
    dumpability = np.zeros((N, N), np.int8)
    dumpability[14:19, 20] = 1
    return dict(target=target, obstacles=obstacles, dumpability=dumpability)


@pytest.fixture(scope="module")
def cut_off_dumps_env():
    """The default env with only the dump half of the cut-off rule (`mask_cut_off_dumps`)."""
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_dumps=True))


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_a_dump_that_walls_off_the_targets_is_masked(cut_off_dumps_env, env32, step32,
                                                    agent_type):
    """Loaded in the corridor with col 20 the only dumpable tiles, all under the arm: 10 units
    pile 2 high across it and cut the target at (16, 28) off, so DO is masked and the cabin
    turns stay; 5 units pile 1 high, which the base drives over, and DO is allowed. With the
    rule off the wall is dumped, and the flood fill then finds the target cut off."""
    maps = dict(wall_dump_maps(), agent_type=agent_type)
    state = build(cut_off_dumps_env, loaded=10, **maps)
    assert bool(cut_off_dumps_env.valid_actions(state)[A.DO])
    mask = cut_off_dumps_env.action_mask(state)
    assert not bool(mask[A.DO])
    assert bool(mask[A.CABIN_CLOCK]) and bool(mask[A.CABIN_ANTICLOCK])
    assert bool(cut_off_dumps_env.action_mask(build(cut_off_dumps_env, loaded=5, **maps))[A.DO])

    default = build(env32, loaded=10, **maps)
    assert bool(env32.action_mask(default)[A.DO])
    _, dumped, *_ = step(step32, default, A.DO)
    assert (np.asarray(dumped.action_map)[14:19, 20] == 2).all()
    cut_off = reachability.make_targets_cut_off(env32.config)
    assert bool(cut_off(dumped.target_map, dumped.action_map, dumped.obstacles,
                        dumped.agent.pos, dumped.agent.base_heading,
                        dumped.agent.agent_type == A.WHEELED))
    assert not bool(cut_off(default.target_map, default.action_map, default.obstacles,
                            default.agent.pos, default.agent.base_heading,
                            default.agent.agent_type == A.WHEELED))
    # Digs are the other flag's: the corridor's cutting dig stays allowed under this one.
    target, obstacles = corridor(far_target=True)
    assert bool(cut_off_dumps_env.action_mask(build(
        cut_off_dumps_env, target=target, obstacles=obstacles, agent_type=agent_type))[A.DO])


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_reachable_poses_equal_the_planners_pose_graph(agent_type):
    """The flood fill of the cut-off rule and the scripted solver's pose graph (numpy, each
    move simulated by the env) agree pose for pose on random 16x16 maps with obstacles, dug
    tiles and soil piles: the fill that drives either kind by its argument, and the one
    that drives this kind alone (`BatchEnv`'s test for a batch of one kind)."""
    from envs.reachability import make_reachable_poses
    from envs.solver_geometry import shortest_paths
    from envs.solver_planner import H, Planner

    config = EnvConfig(map_size=16)
    reachable = jax.jit(make_reachable_poses(config))
    reachable_for_kind = jax.jit(make_reachable_poses(config, wheeled=agent_type == A.WHEELED))
    rng = np.random.default_rng(agent_type)
    checked = 0
    for _ in range(6):
        obstacles = (rng.random((16, 16)) < 0.08).astype(np.int8)
        action_map = rng.choice(np.array([-1, 0, 0, 0, 0, 1, 2], np.int8), size=(16, 16))
        target = np.zeros((16, 16), np.int8)
        planner = Planner(config, agent_type, target, obstacles)
        free = np.flatnonzero(planner._free_poses(action_map.ravel()))
        if free.size == 0:
            continue
        pose = int(rng.choice(free))
        pos, heading = divmod(pose // H, 16), pose % H
        node = planner.node_of(pos, heading, 0)
        dist, _, _ = shortest_paths(planner.graph, node, planner._free_poses(action_map.ravel()))
        expected = np.zeros(16 * 16 * H, bool)
        expected[planner.pose_of(np.flatnonzero(dist >= 0))] = True
        reach = reachable(jnp.asarray(action_map), jnp.asarray(obstacles),
                          jnp.asarray(pos, jnp.int32), jnp.int32(heading),
                          jnp.bool_(agent_type == A.WHEELED))
        got = np.asarray(reach).transpose(1, 2, 0).ravel()  # (row, col, heading) like the planner
        assert (got == expected).all(), (int(got.sum()), int(expected.sum()))
        # The argument says the other kind: the kind's own fill ignores it.
        reach = reachable_for_kind(jnp.asarray(action_map), jnp.asarray(obstacles),
                                   jnp.asarray(pos, jnp.int32), jnp.int32(heading),
                                   jnp.bool_(agent_type != A.WHEELED))
        np.testing.assert_array_equal(np.asarray(reach).transpose(1, 2, 0).ravel(), expected)
        checked += int(expected.sum()) > 1
    assert checked >= 3


def reference_cut_off(config, target, action_map, reachable_poses):
    """bool [B]: an undug target (target -1, action 0; int8 [B, N, N]) lies in the arm ring
    of no position of `reachable_poses` (bool [B, 12, N, N], a fill run to convergence):
    the cut-off test's answer, by numpy shifts of boolean maps, one per ring offset."""
    n = config.map_size
    positions = np.asarray(reachable_poses).any(axis=1)
    padded = np.pad(positions, [(0, 0), (n, n), (n, n)])
    covered = np.zeros_like(positions)
    for dr, dc in reachability.ring_offsets(config):
        covered |= padded[:, n - dr:2 * n - dr, n - dc:2 * n - dc]
    undug = (np.asarray(target) == -1) & (np.asarray(action_map) == 0)
    return (undug & ~covered).any(axis=(1, 2))


@pytest.mark.parametrize("size", [16, 64])
def test_a_batch_of_fills_gives_each_env_its_own_answer(size):
    """`make_batch_cut_off` sweeps a batch together until none of its fills grows: each
    env's answer and reachable poses equal its fill alone (a batch of one), in a batch whose
    fills converge after different numbers of sweeps (agents walled into a small pen, open
    maps, targets behind a wall), both kinds mixed and each kind alone."""
    config = EnvConfig(map_size=size)
    rng = np.random.default_rng(size)
    batch = 6
    blocked = 0.1 * 16 / size  # the footprint grows with the map: sparser blocks
    obstacles = (rng.random((batch, size, size)) < blocked / 2).astype(np.int8)
    action_map = np.where(rng.random((batch, size, size)) < blocked / 2,
                          rng.choice(np.array([-1, 2], np.int8), (batch, size, size)),
                          0).astype(np.int8)
    target = np.where(rng.random((batch, size, size)) < 0.02, -1, 0).astype(np.int8)
    centre = size // 2
    pos = np.full((batch, 2), centre, np.int32)
    heading = np.arange(batch, dtype=np.int32) * 2
    wheeled = np.arange(batch) % 2 == 1
    for env in range(batch):  # the agent's own footprint and its ring are free
        near = slice(centre - size // 8, centre + size // 8 + 1)
        obstacles[env, near, near] = 0
        action_map[env, near, near] = 0
    pen = slice(centre - size // 4, centre + size // 4 + 1)
    for env in (0, 1):  # a pen: a few sweeps fill it
        obstacles[env, pen, pen.start] = obstacles[env, pen, pen.stop - 1] = 1
        obstacles[env, pen.start, pen] = obstacles[env, pen.stop - 1, pen] = 1
    target[3:] = 0  # open maps, one target in reach from the start
    target[3:, centre, centre + size // 8] = -1
    wall = size * 5 // 16  # a target in a corner, walled off beyond the arm's reach
    target[2, 1, 1] = -1
    obstacles[2, :wall + 1, wall] = obstacles[2, wall, :wall + 1] = 1
    args = tuple(jnp.asarray(x) for x in (target, action_map, obstacles, pos, heading, wheeled))
    for kind in (None, False, True):
        together = np.asarray(reachability.make_batch_cut_off(config, kind)(*args))
        alone = reachability.make_targets_cut_off(config, kind)
        reach_alone = jax.jit(reachability.make_reachable_poses(config, kind))
        reach_together = np.asarray(reachability.unpack(
            reachability._make_reachable_packed(config, kind)(*args[1:]), size))
        for env in range(batch):
            one = tuple(x[env] for x in args)
            assert together[env] == bool(alone(*one)), (kind, env)
            np.testing.assert_array_equal(reach_together[env], reach_alone(*one[1:]))
        assert together[:3].all() and not together[3:].any()  # walled in, walled off; open
        np.testing.assert_array_equal(together, reference_cut_off(config, target, action_map,
                                                                  reach_together))
        counts = reach_together.sum(axis=(1, 2, 3))
        assert counts[0] * 2 < counts[3:].min()  # the pen's fill converged long before


@pytest.mark.parametrize("size", [16, 64])
def test_a_fill_stops_once_every_env_is_settled_and_not_before(size):
    """`settled` ends the sweeps early only when it holds for every env of the batch: never
    settled, the fill converges to the full reachable poses; settled from the start, it
    stops at the first test with a part of them; settled for some envs, the others still
    converge. The cut-off test's early stop (its targets all covered by a cross of the ring
    before the fill converged) keeps the answers of the fill run to convergence: on random
    maps with the targets spread at random, and on two where the agent cannot move: one
    target in its ring on a diagonal (not settled by the cross, covered by the ring) and
    one beyond it."""
    config = EnvConfig(map_size=size)
    rng = np.random.default_rng(size + 1)
    batch = 6
    obstacles = (rng.random((batch, size, size)) < 0.05 * 16 / size).astype(np.int8)
    action_map = np.zeros((batch, size, size), np.int8)
    target = np.where(rng.random((batch, size, size)) < 0.05, -1, 0).astype(np.int8)
    centre, near = size // 2, slice(size // 2 - size // 8, size // 2 + size // 8 + 1)
    obstacles[:, near, near] = 0
    wall = size * 5 // 16  # env 3: the corner behind a wall, beyond the arm's reach
    target[3, 1, 1] = -1
    obstacles[3, :wall + 1, wall] = obstacles[3, wall, :wall + 1] = 1
    # Envs 4 and 5 cannot move (obstacles all round the footprint) and have one target: in
    # the ring on a diagonal, which the cross misses (the fill converges, then the ring
    # covers it), or beyond the ring.
    obstacles[4:] = 1
    for dr, dc in set().union(*reachability.footprint_offsets(config)):
        obstacles[4:, centre + dr, centre + dc] = 0
    target[4:] = 0
    dr, dc = next((dr, dc) for dr, dc in reachability.ring_offsets(config) if dr and dc)
    target[4, centre + dr, centre + dc] = -1
    target[5, 0, 0] = -1
    obstacles[4:][target[4:] == -1] = 0
    pos = np.full((batch, 2), centre, np.int32)
    heading = np.arange(batch, dtype=np.int32) * 5 % 12
    wheeled = np.arange(batch) % 2 == 1
    args = tuple(jnp.asarray(x) for x in (target, action_map, obstacles, pos, heading, wheeled))
    fill = reachability._make_reachable_packed(config, None)
    full = np.asarray(fill(*args[1:]))
    never, done = fill(*args[1:], settled=lambda reach: jnp.zeros(reach.shape[:1], bool))
    np.testing.assert_array_equal(np.asarray(never), full)
    assert not np.asarray(done).any()
    first, done = fill(*args[1:], settled=lambda reach: jnp.ones(reach.shape[:1], bool))
    first = np.asarray(first)
    assert np.asarray(done).all()
    assert (first & ~full == 0).all() and (first != full).any()  # a part: stopped early
    some = jnp.arange(batch) < 2
    partly, done = fill(*args[1:], settled=lambda reach: some)
    np.testing.assert_array_equal(np.asarray(partly), full)  # the unsettled ran on
    np.testing.assert_array_equal(np.asarray(done), np.asarray(some))

    answers = np.asarray(reachability.make_batch_cut_off(config)(*args))
    expected = reference_cut_off(config, target, action_map,
                                 reachability.unpack(jnp.asarray(full), size))
    np.testing.assert_array_equal(answers, expected)
    assert expected[3] and expected[5] and not expected[[0, 1, 2, 4]].any()


@pytest.mark.parametrize("size", [16, 64])
def test_free_poses_equal_the_planners(size):
    """The packed free poses (`make_free_poses`, one word a row at 16x16, two at 64x64)
    equal the solver's footprint test (numpy) on random maps with obstacles, holes, and
    soil low enough to drive on and too high."""
    from envs.solver_planner import Planner

    config = EnvConfig(map_size=size)
    free_poses = jax.jit(reachability.make_free_poses(config))
    rng = np.random.default_rng(size)
    blocked = 0.12 * 16 / size  # the footprint grows with the map: sparser blocks
    for _ in range(3):
        obstacles = (rng.random((size, size)) < blocked / 3).astype(np.int8)
        action_map = rng.choice(np.array([-1, 0, 1, 2], np.int8), size=(size, size),
                                p=[blocked / 3, 0.9 - 2 * blocked / 3, 0.1, blocked / 3])
        planner = Planner(config, A.TRACKED, np.zeros((size, size), np.int8), obstacles)
        expected = planner._free_poses(action_map.ravel())
        got = reachability.unpack(free_poses(jnp.asarray(action_map), jnp.asarray(obstacles)),
                                  size)
        np.testing.assert_array_equal(np.asarray(got).transpose(1, 2, 0).ravel(), expected)
        assert 0 < expected.sum() < expected.size


@pytest.mark.parametrize("size", [16, 32, 64])
def test_packed_shifts_equal_boolean_shifts(size):
    """The searches shift maps packed 32 columns to a word; every shift they use (moves,
    footprints, the arm's ring: |offset| <= 10) equals the plain one, alone and as the moves
    of `make_moves` (each to its own map, and two into one map: their OR)."""
    from envs.reachability import make_moves, moved, pack, unpack

    rng = np.random.default_rng(size)
    x = rng.random((2, size, size)) < 0.4
    assert (np.asarray(unpack(pack(jnp.asarray(x)), size)) == x).all()
    # The layout: words [..., ceil(N / 32), N], tile (r, c) at bit c % 32 of word [c // 32, r].
    one = np.zeros((size, size), bool)
    one[size - 2, size - 1] = True
    packed = np.asarray(pack(jnp.asarray(one)))
    assert packed.shape == (-(-size // 32), size) and packed.dtype == np.uint32
    assert packed[(size - 1) // 32, size - 2] == 1 << ((size - 1) % 32)
    assert np.count_nonzero(packed) == 1
    offsets = [(0, 0), (1, 0), (-2, 0), (0, 1), (0, -1), (3, -5), (-9, 10), (10, 9), (1, 0)]
    expected = np.zeros((2, len(offsets), size, size), bool)
    for i, (dr, dc) in enumerate(offsets):
        rows = slice(max(dr, 0), size + min(dr, 0))
        cols = slice(max(dc, 0), size + min(dc, 0))
        expected[:, i, rows, cols] = x[:, max(-dr, 0):size - max(dr, 0),
                                       max(-dc, 0):size - max(dc, 0)]
        got = np.asarray(unpack(moved(pack(jnp.asarray(x)), dr, dc, size), size))
        assert (got == expected[:, i]).all(), (dr, dc)
    # The one input map moves by each offset in turn, to a map of its own.
    moves = [(0, i, dr, dc) for i, (dr, dc) in enumerate(offsets)] + [(0, 0, 1, 0)]
    apply = make_moves(moves, len(offsets), size)
    got = np.asarray(unpack(apply(pack(jnp.asarray(x[:, None]))), size))  # [2, maps, N, N]
    expected[:, 0] |= expected[:, 1]  # the extra move into map 0
    assert (got == expected).all()


@pytest.mark.parametrize("size", [16, 40, 64])
def test_start_poses_are_the_packed_one_hot_poses(size):
    """The fill's start, built as words, equals `pack` of each env's one-hot pose (heading,
    row, col), at the map's corners and edges, in either word of a row and in its last
    column (40: a part-filled second word)."""
    from envs.reachability import H, pack, start_poses

    rng = np.random.default_rng(size)
    edges = [(0, 0), (0, size - 1), (size - 1, 0), (size - 1, size - 1), (5, 31), (7, 32)]
    pos = np.concatenate([np.asarray([p for p in edges if max(p) < size], np.int32),
                          rng.integers(0, size, (10, 2), dtype=np.int32)])
    heading = rng.integers(0, H, len(pos), dtype=np.int32)
    one_hot = np.zeros((len(pos), H, size, size), bool)
    one_hot[np.arange(len(pos)), heading, pos[:, 0], pos[:, 1]] = True
    got = np.asarray(start_poses(jnp.asarray(pos), jnp.asarray(heading), size))
    expected = np.asarray(pack(jnp.asarray(one_hot)))
    assert got.dtype == np.uint32 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert (np.count_nonzero(got, axis=(1, 2, 3)) == 1).all()


@pytest.mark.parametrize("size", [16, 32, 64])
def test_the_arm_ring_is_the_or_of_the_twelve_sectors(size):
    """`geometry.arm_ring` equals the OR of the 12 arm sectors at every agent position of
    the map (windows clamped at the edges), and at a half angle below 20 degrees it is that
    OR itself (10 degrees: gaps between the sectors)."""
    import dataclasses

    from envs import geometry as geo

    config = EnvConfig(map_size=size)
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    positions = jnp.asarray(np.stack([rows.ravel(), cols.ravel()], axis=1), jnp.int32)

    def both(config, pos):
        window = geo.make_window(pos, size, config.window_radius)
        sectors = geo.sector_masks(config, window, jnp.arange(geo.NUM_HEADINGS))
        return geo.arm_ring(config, window, sectors), jnp.any(sectors, axis=0)

    ring, union = jax.jit(jax.vmap(lambda p: both(config, p)))(positions)
    np.testing.assert_array_equal(np.asarray(ring), np.asarray(union))
    assert np.asarray(ring).any(axis=(1, 2)).all()
    narrow = dataclasses.replace(config, workspace_half_angle_deg=10.0)
    window = geo.make_window(jnp.asarray([size // 2] * 2), size, config.window_radius)
    sectors = geo.sector_masks(narrow, window, jnp.arange(geo.NUM_HEADINGS))
    got = np.asarray(geo.arm_ring(narrow, window, sectors))
    np.testing.assert_array_equal(got, np.asarray(jnp.any(sectors, axis=0)))
    assert (got != np.asarray(geo.arm_ring(config, window, sectors))).any()


def test_sector_sums_equal_the_float_product():
    """`geometry.sector_sums` (int8 operands, int32 sums) equals the float32 product it
    replaced, converted to int16 the same way: on 0/1 layers, on soil heights up to 127, and
    on sums past int16's range (a 25x25 window of 127s: 79,375)."""
    from envs.geometry import sector_sums

    rng = np.random.default_rng(0)
    sectors = rng.random((3, 12, 25, 25)) < 0.3
    sectors[0, 0] = True
    layers = np.stack([rng.integers(0, 2, (3, 25, 25)), rng.integers(0, 128, (3, 25, 25)),
                       rng.integers(0, 5, (3, 25, 25))], axis=1).astype(np.int8)
    layers[0, 1] = 127
    got = np.asarray(jax.vmap(sector_sums)(jnp.asarray(sectors), jnp.asarray(layers)))
    product = jnp.einsum("bhij,blij->bhl", jnp.asarray(sectors, jnp.float32),
                         jnp.asarray(layers, jnp.float32))
    assert got.dtype == np.int16 and got.shape == (3, 12, 3)
    np.testing.assert_array_equal(got, np.asarray(product.astype(jnp.int16)))
    assert float(product[0, 0, 1]) == 25 * 25 * 127


@pytest.mark.parametrize("size", [16, 32, 64])
def test_a_dilation_equals_the_or_of_its_shifts(size):
    """`make_dilation` (runs of column shifts from doubled tables) equals the OR of one
    `moved` per offset: for the arm ring both ways round (the cut-off test and the dig
    distance's goals) and for offsets at the edges of its rules (runs across 0, single
    offsets, |dc| = 31, a row with offsets on one side only), on sparse and full maps."""
    import functools

    from envs.reachability import make_dilation, moved, pack

    ring = reachability.ring_offsets(EnvConfig(map_size=size))
    odd = [(0, -31), (0, 31), (0, 30), (1, -3), (1, -2), (1, 4), (1, 5), (1, 6), (-4, 0),
           (2, -1), (2, 0), (2, 1)]
    rng = np.random.default_rng(size)
    maps = pack(jnp.asarray(np.stack([rng.random((size, size)) < 0.03,
                                      np.ones((size, size), bool)])))
    for offsets in (ring, [(-dr, -dc) for dr, dc in ring], odd):
        expected = functools.reduce(jnp.bitwise_or, [moved(maps, dr, dc, size)
                                                      for dr, dc in offsets])
        got = make_dilation(offsets, size)(maps)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_the_fill_is_traced_once_per_config_for_every_program_that_calls_it(cut_off_env):
    """Equal configs get the one jitted cut-off test (and free poses), whichever env or
    batch asks: the reset, the step and the observation of each program that the trainer
    traces in one process then share one trace of the fill. A wheeled-only or tracked-only
    test is another function. The jit keeps the fill's values: the tests above and
    tests/test_cut_off_checks.py compare them with the planner's and the per-env path."""
    import dataclasses

    config = cut_off_env.config
    same = dataclasses.replace(config)
    assert same is not config
    assert reachability.make_targets_cut_off(config) is reachability.make_targets_cut_off(same)
    assert ExcavationEnv(same).targets_cut_off is cut_off_env.targets_cut_off
    assert reachability.make_free_poses(config) is reachability.make_free_poses(same)
    one_kind = reachability.make_targets_cut_off(config, wheeled=True)
    assert one_kind is not reachability.make_targets_cut_off(config)
    assert one_kind is not reachability.make_targets_cut_off(config, wheeled=False)
    smaller = reachability.make_targets_cut_off(dataclasses.replace(config, map_size=16))
    assert smaller is not reachability.make_targets_cut_off(config)
    # Inside the observation's program the fill is one call, not its shifts inlined.
    jaxpr = str(jax.make_jaxpr(cut_off_env.observation)(build(cut_off_env)))
    assert jaxpr.count("name=cut_off") >= 1


@pytest.fixture(scope="module")
def zone_first_env():
    """The default env with `mask_dump_outside_zones` (off by default)."""
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_dump_outside_zones=True))


def test_a_load_goes_to_a_zone_in_reach_before_anywhere_else(env32, zone_first_env):
    """Loaded at the centre with the arm east (cabin 0): where a cabin turn reaches a free
    zone tile (west, arm heading 6), the mask forbids dumping east, outside the zone; with
    the arm on the zone, or no free zone tile in reach, or the rule off, DO is allowed."""
    target = with_far_zone(blank_target())
    target[16, 12:14] = 1  # a zone west of the centre, in reach of arm heading 6
    mask = zone_first_env.action_mask(build(zone_first_env, target=target, loaded=2))
    assert not bool(mask[A.DO])
    assert bool(mask[A.CABIN_CLOCK]) and bool(mask[A.CABIN_ANTICLOCK])
    facing = build(zone_first_env, target=target, loaded=2, cabin=6)
    assert bool(zone_first_env.action_mask(facing)[A.DO])
    _, dumped, *_ = step(jax.jit(zone_first_env.step_no_reset), facing, A.DO)
    assert int(jnp.sum(dumped.action_map[16, 12:14])) == 2 and int(dumped.agent.loaded) == 0
    full = np.zeros((N, N), np.int8)
    full[16, 12:14] = 1  # the zone's tiles in reach already hold soil
    for state in (build(zone_first_env, target=with_far_zone(blank_target()), loaded=2),
                  build(zone_first_env, target=target, action_map=full, loaded=2)):
        assert bool(zone_first_env.action_mask(state)[A.DO])
    assert bool(env32.action_mask(build(env32, target=target, loaded=2))[A.DO])
    # Empty-handed, the rule does not apply: DO digs or picks up as before.
    soil = np.zeros((N, N), np.int8)
    soil[16, 20] = 1
    assert bool(zone_first_env.action_mask(
        build(zone_first_env, target=target, action_map=soil))[A.DO])


@pytest.mark.parametrize(("pile", "allowed"), [(1, True), (2, False)])
def test_a_pick_up_that_leaves_the_load_nowhere_to_go_is_masked(env32, pile, allowed):
    """Misplaced soil (the map has a zone, far off) piled `pile` high under the arm, and no
    other tile in reach takes soil. Lifting the last unit frees the tile, so the pick-up is
    allowed; lifting one of two leaves a load no heading can dump, and the base cannot move
    loaded: masked (`mask_dead_end_pickups`), allowed with the rule off."""
    action_map = np.zeros((N, N), np.int8)
    action_map[16, 20] = pile
    dumpability = np.zeros((N, N), np.int8)
    dumpability[16, 20] = 1
    maps = dict(target=with_far_zone(blank_target()), action_map=action_map,
                dumpability=dumpability)
    state = build(env32, **maps)
    assert bool(env32.valid_actions(state)[A.DO])
    assert bool(env32.action_mask(state)[A.DO]) == allowed
    legacy = ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_dead_end_pickups=False))
    assert bool(legacy.action_mask(build(legacy, **maps))[A.DO])


def turned_round(env, state, cabins):
    """`state` whose revisit memory holds its pose with each cabin heading of `cabins`, at
    wheel angle 0 (as after those cabin turns since its last dig)."""
    codes = [int(action_rules.pose_code(env.config, state.agent, cabin=c, wheel=0))
             for c in cabins]
    memory = np.full(state.recent_poses.shape, -1, np.int32)
    memory[:len(codes)] = codes
    return state.replace(recent_poses=jnp.asarray(memory))


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_the_dump_rules_yield_once_the_loaded_cabin_has_turned_full_circle(
        cut_off_dumps_env, agent_type):
    """The corridor's wall dump (every dump of the pose cuts the target off) stays masked
    while the memory holds 11 of the 12 cabin headings and is allowed at 12
    (`dump_after_full_turn`); with that rule off it stays masked."""
    maps = dict(wall_dump_maps(), agent_type=agent_type)
    env = cut_off_dumps_env
    state = build(env, loaded=10, **maps)
    assert not bool(env.action_mask(turned_round(env, state, range(11)))[A.DO])
    assert bool(env.action_mask(turned_round(env, state, range(12)))[A.DO])
    # The memory of another pose (base heading 1) does not count.
    other = state.replace(agent=state.agent.replace(base_heading=1))
    assert not bool(env.action_mask(state.replace(
        recent_poses=turned_round(env, other, range(12)).recent_poses))[A.DO])
    held = ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_dumps=True,
                                   dump_after_full_turn=False))
    assert not bool(held.action_mask(turned_round(held, build(held, loaded=10, **maps),
                                                  range(12)))[A.DO])


@pytest.fixture(scope="module")
def refusing_env():
    """The cut-off rule for digs, with the refused digs remembered (`remember_refused_digs`)."""
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_digs=True,
                                   remember_refused_digs=True))


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_the_digs_the_mask_refuses_are_remembered_until_the_map_changes(
        refusing_env, cut_off_env, agent_type):
    """The corridor's wall dig (col 20, rows 14..18) is refused: the observation marks those
    five targets, and nothing else. A cabin turn keeps them (the map is the same) and marks
    nothing new where DO is allowed or has nothing to dig; a dig that changes the map clears
    them. Without the option the observation has no such key."""
    env = refusing_env
    target, obstacles = corridor(far_target=True)
    state = build(env, target=target, obstacles=obstacles, agent_type=agent_type)
    obs = env.observation(state)
    expected = np.zeros((N, N), bool)
    expected[14:19, 20] = True
    assert obs["refused_digs"].dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(obs["refused_digs"]), expected)
    assert not bool(np.asarray(state.refused_digs).any())  # a built state remembers nothing
    assert "refused_digs" not in cut_off_env.observation(
        build(cut_off_env, target=target, obstacles=obstacles, agent_type=agent_type))

    step_env = jax.jit(env.step_no_reset)
    remembered = env.remember_refusals(state, obs)
    obs, turned, *_ = step(step_env, remembered, A.CABIN_ANTICLOCK)
    np.testing.assert_array_equal(np.asarray(turned.refused_digs), expected)
    np.testing.assert_array_equal(np.asarray(obs["refused_digs"]), expected)

    # A target the arm may dig (no far target, so the corridor's dig cuts nothing off): DO
    # digs it, the map changes, and the memory starts afresh.
    target, obstacles = corridor(far_target=False)
    fresh = build(env, target=target, obstacles=obstacles, agent_type=agent_type)
    fresh = fresh.replace(refused_digs=jnp.asarray(expected))
    obs, dug, *_ = step(step_env, fresh, A.DO)
    assert (np.asarray(dug.action_map)[14:19, 20] == -1).all()
    assert not bool(np.asarray(dug.refused_digs).any())
    assert not bool(np.asarray(obs["refused_digs"]).any())


def corridor_batch(env, agent_type: int = A.TRACKED):
    """(BatchEnv of 2 envs on the far-target corridor map, one excavator there with its cabin
    one turn short of the wall dig, that state stacked for both envs). The excavator is of
    `agent_type`, as are the batch's (`env`'s `wheeled_fraction` 0 or 1)."""
    from envs import params_from_maps
    from envs.batch import BatchEnv
    from envs.maps import MapSet

    target, obstacles = corridor(far_target=True)
    maps = MapSet(target_map=target[None], obstacles=obstacles[None],
                  dumpability=np.ones((1, N, N), np.int8), map_type=np.zeros((1,), np.int8),
                  spawn_pose=np.asarray([CENTRE], np.int32))
    batch = BatchEnv(env, params_from_maps(maps), num_envs=2)
    assert (batch.agent_types == agent_type).all()
    one = build(env, target=target, obstacles=obstacles, cabin=11, agent_type=agent_type)
    return batch, one, jax.tree.map(lambda x: jnp.stack([x, x]), one)


def test_the_batch_env_keeps_what_its_observation_refused(refusing_env):
    """`BatchEnv.step` takes the observation after its resets; the state it returns holds
    that observation's refusals: two excavators in the corridor turn their cabins onto the
    wall dig, which the mask refuses."""
    batch, one, state = corridor_batch(refusing_env)
    obs, state, *_ = jax.jit(batch.step)(jax.random.PRNGKey(1), state,
                                         jnp.full((2,), A.CABIN_ANTICLOCK, jnp.int32))
    expected = np.zeros((2, N, N), bool)
    expected[:, 14:19, 20] = True
    np.testing.assert_array_equal(np.asarray(obs["refused_digs"]), expected)
    np.testing.assert_array_equal(np.asarray(state.refused_digs), expected)


@pytest.mark.parametrize("reference", [False, True], ids=["step", "step_reference"])
def test_a_final_observation_carries_the_refusals_of_its_own_state(refusing_env, reference):
    """Two excavators turn their cabins onto the corridor's refused wall dig on their last
    step: one times out there, the other goes on. The timed-out one's `final_observation`
    holds the refusals a training observation of that state holds (those of `observation`
    of the pre-reset state), with its mask all True; the other's is its new observation."""
    batch, one, state = corridor_batch(refusing_env)
    state = state.replace(age=jnp.asarray([refusing_env.config.max_steps - 1, 0], jnp.int32))
    action = jnp.int32(A.CABIN_ANTICLOCK)
    _, last, *_ = refusing_env.step_no_reset(None, one, action, None, with_action_mask=False)
    expected = np.asarray(refusing_env.observation(last)["refused_digs"])
    assert expected[14:19, 20].all() and expected.sum() == 5

    step_fn = batch.step_reference if reference else batch.step
    obs, _, _, terminated, truncated, info = jax.jit(step_fn)(
        jax.random.PRNGKey(1), state, jnp.full((2,), action, jnp.int32))
    assert np.asarray(truncated).tolist() == [True, False]
    final = info["final_observation"]
    np.testing.assert_array_equal(np.asarray(final["refused_digs"][0]), expected)
    assert np.asarray(final["action_mask"][0]).all()
    np.testing.assert_array_equal(np.asarray(final["refused_digs"][1]),
                                  np.asarray(obs["refused_digs"][1]))
    np.testing.assert_array_equal(np.asarray(final["refused_digs"][1]), expected)

    # The policy's derived inputs of that last observation are a training observation's.
    from terra_rl.features.dig_distance import dig_distance_features
    from terra_rl.features.pose_distance import pose_distance_features

    training = jax.tree.map(lambda x: jnp.asarray(x)[None], refusing_env.observation(last))
    last_obs = jax.tree.map(lambda x: x[:1], final)
    for features in (dig_distance_features, pose_distance_features):
        np.testing.assert_array_equal(np.asarray(features(last_obs)),
                                      np.asarray(features(training)))
    # Without the refusals (as before), the way to the next dig would read otherwise.
    stale = dict(last_obs, refused_digs=jnp.zeros_like(last_obs["refused_digs"]))
    assert not np.array_equal(np.asarray(dig_distance_features(stale)),
                              np.asarray(dig_distance_features(training)))


@pytest.mark.parametrize("size", [16, 32, 64])
def test_the_footprint_box_test_equals_the_window_test(size):
    """`geometry.footprint_is_clear` (the footprint's box, read from the window padded with
    traversable tiles) equals the window-wide test it replaced, `footprint_mask` over the
    window shifted to the candidate's centre: every heading, every centre within reach of a
    move (the window clamped at the map's corner, so some boxes stick out of it), on
    random traversable tiles, and on windows free but for one tile."""
    from envs import geometry as geo

    config = EnvConfig(map_size=size)
    radius, reach = config.window_radius, config.move_step + math.ceil(config.footprint_radius)
    width = 2 * radius + 1
    rng = np.random.default_rng(size)
    traversable = rng.random((8, width, width)) > 0.1
    traversable[4:] = True
    traversable[4:, radius, radius + 2] = False  # a single blocked tile beside the agent
    agent = (2, radius)  # near the map's top edge: the window starts at row 0
    offsets = range(-config.move_step, config.move_step + 1)

    def both(trav, pos, delta, heading):
        window = geo.make_window(pos, size, radius)
        covered = geo.footprint_mask(config, window.shifted(delta), heading)
        old = ~jnp.any(covered & ~trav)
        return old, geo.footprint_is_clear(config, trav, pos + delta - window.start, heading)

    cases = [(t, (r, c), (dr, dc), h) for t in range(8) for r, c in ((radius, radius), agent)
             for dr in offsets for dc in offsets for h in range(12)]
    args = [jnp.asarray(np.stack(x)) for x in zip(*[
        (traversable[t], np.array(p, np.int32), np.array(d, np.int32), np.int32(h))
        for t, p, d, h in cases], strict=True)]
    old, new = jax.jit(jax.vmap(both))(*args)
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    assert np.asarray(old).any() and not np.asarray(old).all()
    assert reach <= radius
    assert geo.footprint_boxes(config).shape == (12, 2 * math.ceil(config.footprint_radius) + 1,
                                                 2 * math.ceil(config.footprint_radius) + 1)


def test_next_to_is_the_three_by_three_max():
    """`excavation.next_to` (a 3x1 then a 1x3 max) equals the 3x3 max it replaced, with dug
    tiles on the window's edges and corners."""
    from envs import excavation

    rng = np.random.default_rng(7)
    tiles = (rng.random((16, 25, 25)) < 0.15).astype(np.int8)
    tiles[0, 0, 0] = tiles[0, -1, -1] = tiles[1, 0, :] = tiles[2, :, -1] = 1
    got = jax.jit(jax.vmap(excavation.next_to))(jnp.asarray(tiles))
    expected = jax.vmap(lambda t: jax.lax.reduce_window(
        t, jnp.int8(0), jax.lax.max, (3, 3), (1, 1), "SAME"))(jnp.asarray(tiles))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert np.asarray(got).dtype == np.int8
