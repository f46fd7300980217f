"""`terra_rl.analysis.failure_diagnosis`: hand-built final states get the verdict their construction
implies. (`scripts/diagnose_failures.py` on a tiny trained run is tested in test_trainer.py,
beside the other scripts that read the run its session fixture trains.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from envs.actions import TRACKED
from envs.config import EnvConfig
from envs.solver_planner import Planner
from terra_rl.analysis.failure_diagnosis import judge_final_state

N = 16
AGENT = (8, 8)


def final_state(target, obstacles, dumpability, loaded=0):
    agent = SimpleNamespace(pos=np.array(AGENT), base_heading=0, cabin_heading=0,
                            wheel_angle=0, loaded=loaded)
    return SimpleNamespace(agent=agent, action_map=np.zeros((N, N), np.int8),
                           dumpability=dumpability)


def judge(target, obstacles, dumpability, loaded=0):
    planner = Planner(EnvConfig(map_size=N, max_steps=300), TRACKED, target, obstacles)
    return judge_final_state(planner, final_state(target, obstacles, dumpability, loaded), 300)


def open_map(target_tile):
    target = np.zeros((N, N), np.int8)
    target[target_tile] = -1
    return target, np.zeros((N, N), np.int8), np.ones((N, N), np.int8)


def test_a_reachable_target_is_a_stall_with_the_planners_step_count():
    category, steps = judge(*open_map((8, 12)))
    assert category == "stalled while solvable" and 1 < steps < 300


def test_a_load_with_no_dump_tile_in_any_sector_is_a_dead_end():
    target, obstacles, _ = open_map((8, 12))
    category, steps = judge(target, obstacles, np.zeros((N, N), np.int8), loaded=2)
    assert (category, steps) == ("loaded dead end", -1)


def test_a_walled_off_target_is_out_of_reach():
    target, obstacles, dumpability = open_map((0, 0))
    obstacles[:6, :6] = 1
    obstacles[0, 0] = 0  # the target itself, inside a block no pose's arm reaches into
    dumpability[obstacles == 1] = 0
    assert judge(target, obstacles, dumpability) == ("targets out of reach", -1)


def test_less_dump_space_in_reach_than_soil_to_dig_is_reported():
    target, obstacles, _ = open_map((8, 12))
    target[8, 11] = target[8, 13] = -1  # three units of soil to dig
    dumpability = np.zeros((N, N), np.int8)
    dumpability[3, 12] = 1  # one tile to dump on, in reach of a pose (6, 12) that digs all
    assert judge(target, obstacles, dumpability) == ("no dump space", -1)
    assert judge(*open_map((0, 0)))[0] == "stalled while solvable"  # with space: solvable


def test_a_load_whose_every_dump_the_mask_forbids_is_told_apart():
    """The corridor of test_env_rules, loaded with 10 units: every dump of the pose walls the
    target off, so under `mask_cut_off_dumps` without `dump_after_full_turn` the load can
    never be dumped although tiles take it. With the full-turn rule (the default), with the
    cut-off rule off, or with an empty bucket, it is not `dumps_masked`."""
    from envs.env import ExcavationEnv
    from terra_rl.analysis.failure_diagnosis import dumps_masked
    from tests.test_env_actions import N as N32
    from tests.test_env_actions import build
    from tests.test_env_rules import wall_dump_maps

    maps = wall_dump_maps()
    rule = ExcavationEnv(EnvConfig(map_size=N32, max_steps=60, mask_cut_off_dumps=True,
                                   dump_after_full_turn=False))
    yielding = ExcavationEnv(EnvConfig(map_size=N32, max_steps=60, mask_cut_off_dumps=True))
    no_rule = ExcavationEnv(EnvConfig(map_size=N32, max_steps=60))
    assert dumps_masked(rule, build(rule, loaded=10, **maps))
    assert not dumps_masked(yielding, build(yielding, loaded=10, **maps))
    assert not dumps_masked(no_rule, build(no_rule, loaded=10, **maps))
    assert not dumps_masked(rule, build(rule, loaded=0, **maps))


def blocked_reasons(target, obstacles, dumpability, action_map=None, **config):
    planner = Planner(EnvConfig(map_size=N, max_steps=300, **config), TRACKED, target, obstacles)
    state = final_state(target, obstacles, dumpability)
    if action_map is not None:
        state.action_map = action_map
    start = planner.state_of(state)
    return planner.blocked_reasons(start.action_map, start.dumpability, start.node)


def test_blocked_reasons_name_why_each_target_is_out_of_reach():
    nothing = {"cut off": 0, "soil in the way": 0, "no dump space": 0}
    assert blocked_reasons(*open_map((8, 12))) == nothing  # in reach, with dump space

    target, obstacles, dumpability = open_map((0, 0))
    obstacles[:6, :6] = 1
    obstacles[0, 0] = 0
    dumpability[obstacles == 1] = 0
    assert blocked_reasons(target, obstacles, dumpability) == {**nothing, "cut off": 1}

    target, obstacles, _ = open_map((8, 12))
    no_dump_tile = np.zeros((N, N), np.int8)
    assert blocked_reasons(target, obstacles, no_dump_tile) == {**nothing, "no dump space": 1}

    # A zone map with drivable misplaced soil on every other tile: every sector holding the
    # target holds soil, which DO picks up first unless the rule digs first.
    target, obstacles, dumpability = open_map((8, 12))
    target[15, 0] = 1
    soil = np.where(target == 0, 1, 0).astype(np.int8)
    reasons = blocked_reasons(target, obstacles, dumpability, soil, dig_before_pickup=False)
    assert reasons == {**nothing, "soil in the way": 1}
    assert blocked_reasons(target, obstacles, dumpability, soil) == {**nothing,
                                                                     "no dump space": 1}
