"""The rules that decide whether a policy can wall itself in or loop: soil one unit high is
drivable, DO digs before it picks up and picks up only misplaced soil, and the action mask
forbids returning to a recent pose (`EnvConfig.drivable_soil_height`, `dig_before_pickup`,
`pickup_misplaced_only`, `revisit_memory`), each checked against the rules switched off.
Hand-built 32x32 states as in test_env_actions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
                                   mask_dead_end_digs=False, revisit_memory=0))


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
