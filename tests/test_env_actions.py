"""Each action's effect on hand-built 32x32 states (footprint 5x3, move step 1, workspace
ring 2.5..5 tiles, 60 degrees wide). Expected workspaces come from an independent numpy
implementation, not from envs.geometry. (Timeouts versus task completion on the last step
are the terminal-reward-only-on-task-done validation gate.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import actions as A
from envs.config import EnvConfig
from envs.env import ExcavationEnv
from envs.state import AgentState

N = 32
CENTRE = (16, 16)


def agent(pos=CENTRE, heading=0, cabin=0, wheel=0, loaded=0, agent_type=A.TRACKED):
    return AgentState(
        pos=jnp.asarray(pos, jnp.int32), base_heading=heading, cabin_heading=cabin,
        wheel_angle=wheel, loaded=loaded, agent_type=agent_type,
    )


def blank_target():
    """No work in reach, but one unreachable dig tile so the task is not already done."""
    target = np.zeros((N, N), np.int8)
    target[1, 30] = -1
    return target


def build(env, *, target=None, obstacles=None, dumpability=None, action_map=None, age=0, **kw):
    target = blank_target() if target is None else target
    obstacles = np.zeros((N, N), np.int8) if obstacles is None else obstacles
    dumpability = np.ones((N, N), np.int8) if dumpability is None else dumpability
    return env.make_state(target, obstacles, dumpability, agent(**kw), action_map=action_map,
                          age=age)


def workspace_np(pos, arm_heading, base_heading, r_min=2.5, r_max=5.0, length=5, width=3):
    """bool [N, N] reference workspace: ring sector minus the agent footprint."""
    rows, cols = np.mgrid[0:N, 0:N]
    dy, dx = rows - pos[0], cols - pos[1]
    dist = np.hypot(dy, dx)
    angle = np.degrees(np.arctan2(-dy, dx))
    diff = (angle - 30 * arm_heading + 180) % 360 - 180
    sector = (dist >= r_min) & (dist <= r_max) & (np.abs(diff) <= 30 + 1e-6)
    theta = math.radians(30 * base_heading)
    along = dx * math.cos(theta) - dy * math.sin(theta)
    across = dx * math.sin(theta) + dy * math.cos(theta)
    footprint = (np.abs(along) <= length / 2 + 1e-6) & (np.abs(across) <= width / 2 + 1e-6)
    return sector & ~footprint


def step(step32, state, action):
    obs, new_state, reward, terminated, truncated, info = step32(
        None, state, jnp.int32(action), None)
    return obs, new_state, float(reward), bool(terminated), bool(truncated), info


def term(info, name, env):
    """A reward term of the step (`info["reward_terms"]`, see envs.rewards)."""
    return float(info["reward_terms"][name])


@pytest.mark.parametrize(
    ("action", "heading", "expected_pos", "expected_heading"),
    [
        (A.FORWARD, 0, (16, 17), 0),
        (A.FORWARD, 3, (15, 16), 3),  # 90 degrees: up the rows
        (A.FORWARD, 6, (16, 15), 6),
        (A.BACKWARD, 0, (16, 15), 0),
        (A.CLOCK, 0, (16, 16), 11),
        (A.ANTICLOCK, 0, (16, 16), 1),
    ],
)
def test_tracked_base_actions(env32, step32, action, heading, expected_pos, expected_heading):
    _, new, reward, *_ , info = step(step32, build(env32, heading=heading), action)
    assert tuple(np.asarray(new.agent.pos)) == expected_pos
    assert int(new.agent.base_heading) == expected_heading
    # A move or turn that happens costs the step cost, like every action, and nothing more.
    assert reward == pytest.approx(env32.config.reward.step)
    assert term(info, "collision", env32) == 0.0


@pytest.mark.parametrize(("action", "cabin"), [(A.CABIN_CLOCK, 11), (A.CABIN_ANTICLOCK, 1)])
def test_cabin_turns_leave_base_alone(env32, step32, action, cabin):
    _, new, *_ = step(step32, build(env32, heading=2), action)
    assert int(new.agent.cabin_heading) == cabin
    assert int(new.agent.base_heading) == 2
    assert tuple(np.asarray(new.agent.pos)) == CENTRE


def test_wheeled_wheels_and_arcs(env32, step32):
    state = build(env32, agent_type=A.WHEELED)
    _, state, *_ = step(step32, state, A.WHEELS_LEFT)
    assert int(state.agent.wheel_angle) == 1
    _, at_limit, *_ , info = step(step32, state, A.WHEELS_LEFT)
    assert int(at_limit.agent.wheel_angle) == 1  # limit 1: no further turn
    assert not bool(info["action_mask"][A.WHEELS_LEFT])
    # Forward with wheels left: the heading turns anticlockwise by one step and the base
    # moves along the mean heading (15 degrees, rounds to one column right).
    _, fwd, *_ = step(step32, state, A.FORWARD)
    assert int(fwd.agent.base_heading) == 1
    assert tuple(np.asarray(fwd.agent.pos)) == (16, 17)
    _, back, *_ = step(step32, state, A.BACKWARD)
    assert int(back.agent.base_heading) == 11
    assert tuple(np.asarray(back.agent.pos)) == (16, 15)
    _, right, *_ = step(step32, state, A.WHEELS_RIGHT)
    assert int(right.agent.wheel_angle) == 0


def test_blocked_move_leaves_state_unchanged_and_pays_collision(env32, step32):
    obstacles = np.zeros((N, N), np.int8)
    obstacles[16, 19] = 1  # just beyond the front edge (cols 14..18) of the footprint
    state = build(env32, obstacles=obstacles)
    _, new, reward, *_ , info = step(step32, state, A.FORWARD)
    assert tuple(np.asarray(new.agent.pos)) == CENTRE
    assert term(info, "collision", env32) == pytest.approx(env32.config.reward.collision)
    assert term(info, "progress", env32) == 0.0
    expected = env32.config.reward.step + env32.config.reward.collision
    assert reward == pytest.approx(expected)
    assert not bool(info["action_mask"][A.FORWARD])
    # Dug and dumped tiles block too.
    action_map = np.zeros((N, N), np.int8)
    action_map[17, 13] = 2
    _, new, *_ = step(step32, build(env32, action_map=action_map), A.BACKWARD)
    assert tuple(np.asarray(new.agent.pos)) == CENTRE


def test_move_off_the_map_is_rejected(env32, step32):
    state = build(env32, pos=(16, 2), heading=6)  # facing -col, footprint cols 0..4
    _, new, *_ , info = step(step32, state, A.FORWARD)
    assert tuple(np.asarray(new.agent.pos)) == (16, 2)
    assert term(info, "collision", env32) == pytest.approx(env32.config.reward.collision)


def test_loaded_agent_cannot_move_or_turn_base_but_turns_cabin(env32, step32):
    state = build(env32, loaded=3)
    for action in (A.FORWARD, A.BACKWARD, A.CLOCK, A.ANTICLOCK):
        _, new, *_ , info = step(step32, state, action)
        assert tuple(np.asarray(new.agent.pos)) == CENTRE
        assert int(new.agent.base_heading) == 0
        assert term(info, "move_while_loaded", env32) == pytest.approx(
            env32.config.reward.move_while_loaded)
        assert not bool(info["action_mask"][action])
    _, new, *_ = step(step32, state, A.CABIN_ANTICLOCK)
    assert int(new.agent.cabin_heading) == 1


def test_dig_lowers_every_target_tile_in_the_workspace(env32, step32):
    target = blank_target()
    target[14:19, 18:23] = -1
    target[16, 5] = -1  # out of reach
    state = build(env32, target=target, cabin=0)
    _, new, reward, *_ , info = step(step32, state, A.DO)
    expected = workspace_np(CENTRE, 0, 0) & (target == -1)
    action_map = np.asarray(new.action_map)
    np.testing.assert_array_equal(action_map < 0, expected)
    assert int(new.agent.loaded) == expected.sum() > 0
    assert int(new.dig_tiles_done) == expected.sum()
    # Progress: the potential (dug - misplaced) / dig tiles grows by the tiles dug.
    assert term(info, "progress", env32) == pytest.approx(
        env32.config.reward.progress_weight * expected.sum() / (target == -1).sum())
    # Tiles next to newly dug ground can no longer take soil.
    near = np.zeros_like(expected)
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            near |= np.roll(np.roll(expected, dr, 0), dc, 1)
    np.testing.assert_array_equal(np.asarray(new.dumpability) == 0, near)


def test_dig_at_another_arm_heading(env32, step32):
    target = -np.ones((N, N), np.int8)
    state = build(env32, target=target, heading=2, cabin=5)  # arm at 7 * 30 = 210 degrees
    _, new, *_ = step(step32, state, A.DO)
    np.testing.assert_array_equal(np.asarray(new.action_map) < 0, workspace_np(CENTRE, 7, 2))


def test_dump_prefers_dump_zones_and_conserves_soil(env32, step32):
    target = blank_target()
    zone = [(15, 20), (16, 20), (17, 20)]
    for tile in zone:
        target[tile] = 1
    state = build(env32, target=target, loaded=5)
    _, new, *_ , info = step(step32, state, A.DO)
    action_map = np.asarray(new.action_map)
    assert [int(action_map[t]) for t in zone] == [2, 2, 1]  # row-major remainder
    assert action_map.sum() == 5 and action_map[target != 1].sum() == 0
    assert int(new.agent.loaded) == 0
    assert int(new.misplaced_soil) == 0
    assert term(info, "progress", env32) == 0.0  # soil on the zones: the potential is unchanged


def test_dump_without_zones_spreads_over_dumpable_workspace(env32, step32):
    dumpability = np.ones((N, N), np.int8)
    dumpability[:, 20:] = 0  # a no-dump zone covering the far part of the workspace
    state = build(env32, dumpability=dumpability, loaded=7)
    _, new, *_ = step(step32, state, A.DO)
    action_map = np.asarray(new.action_map)
    allowed = workspace_np(CENTRE, 0, 0) & (dumpability == 1)
    assert action_map.sum() == 7
    assert np.all(action_map[~allowed] == 0)
    assert set(np.unique(action_map[allowed])) <= {7 // allowed.sum(), 7 // allowed.sum() + 1}


def test_misplaced_soil_picked_up_restores_the_potential(env32, step32):
    """With no target in reach, DO picks up one unit per tile of misplaced soil (digging
    comes first, and soil on zones or on maps without zones stays: test_env_rules)."""
    target = blank_target()
    target[2, 2] = 1  # a zone far away: soil anywhere else is misplaced
    action_map = np.zeros((N, N), np.int8)
    action_map[16, 20] = 2
    state = build(env32, target=target, action_map=action_map)
    assert int(state.misplaced_soil) == 2
    _, new, *_ , info = step(step32, state, A.DO)
    assert int(new.action_map[16, 20]) == 1
    assert int(new.agent.loaded) == 1 and int(new.misplaced_soil) == 1
    total = int(state.dig_tiles_total)
    assert term(info, "progress", env32) == pytest.approx(
        env32.config.reward.progress_weight / total)


def test_do_with_no_effect_is_penalised(env32, step32):
    state = build(env32)  # nothing to dig in reach
    _, new, *_ , info = step(step32, state, A.DO)
    np.testing.assert_array_equal(np.asarray(new.action_map), 0)
    assert int(new.agent.loaded) == 0
    assert term(info, "do_no_effect", env32) == pytest.approx(env32.config.reward.do_no_effect)
    assert not bool(info["action_mask"][A.DO])


def _single_tile_task(env32, zone_reachable: bool):
    target = np.zeros((N, N), np.int8)
    target[16, 19] = -1
    target[16, 21] = 1 if zone_reachable else 0
    target[2, 2] = 0 if zone_reachable else 1  # a zone far away keeps the map "with zones"
    return build(env32, target=target)


def test_task_done_needs_dug_targets_soil_on_zones_and_empty_bucket(env32, step32):
    state = _single_tile_task(env32, zone_reachable=True)
    _, dug, _, terminated, truncated, info = step(step32, state, A.DO)
    assert int(dug.dig_tiles_done) == 1 and int(dug.agent.loaded) == 1
    assert not terminated and not bool(info["task_done"])  # still loaded
    _, done, reward, terminated, truncated, info = step(step32, dug, A.DO)
    assert int(done.action_map[16, 21]) == 1 and int(done.agent.loaded) == 0
    assert terminated and not truncated and bool(info["task_done"])
    assert term(info, "terminal_success", env32) == pytest.approx(
        env32.config.reward.terminal_success)
    assert float(info["episode_progress"]) == 1.0


def test_soil_outside_dump_zones_blocks_task_done(env32, step32):
    state = _single_tile_task(env32, zone_reachable=False)
    _, dug, *_ = step(step32, state, A.DO)
    _, dumped, _, terminated, *_ , info = step(step32, dug, A.DO)
    assert int(dumped.agent.loaded) == 0 and int(dumped.misplaced_soil) == 1
    assert not terminated
    assert term(info, "terminal_success", env32) == 0.0


def test_last_actions_shift_most_recent_first(env32, step32):
    state = build(env32)
    for action in (A.CABIN_CLOCK, A.DO_NOTHING, A.CABIN_ANTICLOCK):
        obs, state, *_ = step(step32, state, action)
    np.testing.assert_array_equal(
        np.asarray(obs["last_actions"]),
        [A.CABIN_ANTICLOCK, A.DO_NOTHING, A.CABIN_CLOCK, A.NO_ACTION, A.NO_ACTION])


@pytest.mark.parametrize(
    ("case", "expected_done"),
    [("complete", True), ("undug_tile", False), ("soil_off_zone", False), ("loaded", False)],
)
def test_task_done_is_the_conjunction_of_its_conditions(env32, step32, case, expected_done):
    target = np.zeros((N, N), np.int8)
    target[2, 2:6] = -1
    target[28, 2:6] = 1
    action_map = np.zeros((N, N), np.int8)
    action_map[2, 2:6] = -1
    action_map[28, 2:6] = 1
    loaded = 0
    if case == "undug_tile":
        action_map[2, 5], action_map[28, 5] = 0, 0
    elif case == "soil_off_zone":
        action_map[28, 5], action_map[20, 5] = 0, 1
    elif case == "loaded":
        action_map[28, 5], loaded = 0, 1
    state = build(env32, target=target, action_map=action_map, loaded=loaded)
    _, _, _, terminated, truncated, info = step(step32, state, A.DO_NOTHING)
    assert terminated == expected_done and not truncated
    bonus = env32.config.reward.terminal_success
    assert term(info, "terminal_success", env32) == pytest.approx(bonus if expected_done else 0.0)


@pytest.fixture(scope="module")
def stalling_step():
    """32x32 env that truncates after 4 steps without a new best of the task potential."""
    env = ExcavationEnv(EnvConfig(map_size=N, max_steps=60, stall_steps=4))
    return env, jax.jit(env.step_no_reset)


def test_stall_truncates_after_steps_without_new_progress(stalling_step):
    env, step_fn = stalling_step
    target = blank_target()
    target[14:19, 18:23] = -1
    state = build(env, target=target)
    flags = []
    for action in (A.DO, A.CABIN_CLOCK, A.CABIN_CLOCK, A.CABIN_CLOCK, A.CABIN_CLOCK):
        _, state, _, terminated, truncated, _ = step(step_fn, state, action)
        flags.append((bool(terminated), bool(truncated), int(state.steps_since_progress)))
    # The dig is progress and resets the count; the fourth idle turn reaches the limit.
    assert flags == [(False, False, 0), (False, False, 1), (False, False, 2),
                     (False, False, 3), (False, True, 4)]
    assert int(state.age) == 5 < env.config.max_steps


def test_undoing_and_redoing_progress_is_not_new_progress(stalling_step):
    env, step_fn = stalling_step
    target = blank_target()
    target[2, 2] = 1  # a dump zone out of reach: soil dumped here is misplaced
    state = build(env, target=target, loaded=2)
    seen = []
    for _ in range(4):  # dump (potential -2), pick up (back to 0), dump, pick up
        _, state, reward, _, truncated, info = step(step_fn, state, A.DO)
        seen.append((int(state.best_progress), int(state.steps_since_progress), bool(truncated)))
    assert seen == [(0, 1, False), (0, 2, False), (0, 3, False), (0, 4, True)]


def test_evaluation_envs_never_stall():
    from terra_rl.adapters.train_env import excavation_env_config
    from terra_rl.config import TrainConfig

    config = TrainConfig(map_size=16, stall_steps=50)
    assert excavation_env_config(config, training=True).stall_steps == 50
    assert excavation_env_config(config, training=False).stall_steps == 0
    with pytest.raises(ValueError, match="stall_steps"):
        EnvConfig(map_size=16, stall_steps=-1)
