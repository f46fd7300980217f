"""`terra_rl.failure_diagnosis` and `scripts/diagnose_failures.py`: hand-built final states get
the verdict their construction implies; a tiny trained run's held-out episodes are each
played to task_done or the horizon and judged once."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from test_trainer import TINY, cli_flags, load_script

from envs.actions import TRACKED
from envs.config import EnvConfig
from envs.solver_planner import Planner
from terra_rl.failure_diagnosis import CATEGORIES, judge_final_state
from terra_rl.main import main

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


def test_script_judges_every_held_out_episode_of_a_trained_run(tmp_path, capsys):
    assert main(cli_flags(tmp_path, "diagnosed")) == 0
    script = load_script("diagnose_failures")
    out = tmp_path / "failures.json"
    capsys.readouterr()
    assert script.main(["--checkpoint", str(tmp_path / "diagnosed"), "--maps", "3",
                        "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "checkpoint of update 2, 3 held-out maps, greedy"
    report = json.loads(out.read_text())
    episodes, counts = report["episodes"], report["counts"]
    assert list(counts) == list(CATEGORIES) and sum(counts.values()) == len(episodes) == 3
    for episode in episodes:
        assert episode["category"] in CATEGORIES
        if episode["category"] == "done":
            assert episode["progress"] == 1.0 and episode["steps"] <= TINY["max_steps"]
        else:  # played to the eval horizon, no stall limit
            assert episode["steps"] == TINY["max_steps"] and episode["progress"] < 1.0
        assert (episode["solver_steps"] > 0) == (episode["category"] == "stalled while solvable")
        assert sum(episode["loop_actions"].values()) <= 40

    with pytest.raises(SystemExit) as error:
        script.main(["--checkpoint", str(tmp_path / "diagnosed"), "--maps", "99"])
    assert error.value.code == 2
    assert "more than the run's 8 held-out maps" in capsys.readouterr().err
