"""The scripted solver (`envs.solver`): it finishes generated maps through the real env, the
env reports task_done exactly at its last action, and its action lists replay identically."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

from envs import EnvConfig, ExcavationEnv, params_from_maps, solver
from envs import actions as A
from envs.maps import MAP_TYPES, MapSet, generate_maps

STEP_BUDGET = 400
"""Every sampled 16x16 map is solved within this many actions. scripts/solve_maps.py on 32 maps
per type (seed 0, both agents): median / p90 / max steps 68-82 / 133-141 / 275 on
foundations, 130-152 / 220-222 / 305 on trenches."""
SAMPLE_SEED = 5
MAPS_PER_TYPE = 8
AGENTS = (A.TRACKED, A.WHEELED)


@pytest.fixture(scope="module")
def env():
    return ExcavationEnv(EnvConfig(map_size=16, max_steps=STEP_BUDGET))


@pytest.fixture(scope="module")
def sample_params(env):
    maps = generate_maps(
        ("foundations", "trenches"),
        16,
        2 * MAPS_PER_TYPE,
        SAMPLE_SEED,
        env.config.spawn_clearance,
    )
    return params_from_maps(maps)


@pytest.fixture(scope="module")
def sample_results(env, sample_params):
    """{(map_index, agent_type): SolverResult} for the whole sample."""
    return {
        (index, agent): solver.solve(
            env, sample_params, index, agent, jax.random.PRNGKey(index), STEP_BUDGET
        )
        for agent in AGENTS
        for index in range(sample_params.num_maps)
    }


def test_solver_completes_every_sampled_map(env, sample_params, sample_results):
    types = np.asarray(sample_params.map_type)
    assert sorted(MAP_TYPES[t] for t in set(types.tolist())) == ["foundations", "trenches"]
    unsolved = [
        (index, MAP_TYPES[types[index]], agent, result.reason)
        for (index, agent), result in sample_results.items()
        if not result.completed
    ]
    assert unsolved == []
    for result in sample_results.values():
        assert 0 < result.steps <= STEP_BUDGET
        assert result.actions.shape == (result.steps,) and result.actions.dtype == np.int32
        assert result.progress == pytest.approx(1.0)
        assert np.isfinite(result.episode_return)


def test_task_done_exactly_at_the_last_action(env, sample_params, sample_results):
    for (index, agent), result in sample_results.items():
        done, _, first_done = solver.replay(
            env, sample_params, index, agent, jax.random.PRNGKey(index), result.actions
        )
        assert done, (index, agent)
        assert first_done == result.steps - 1, (index, agent)


def test_replay_in_a_fresh_env_is_identical(env, sample_params, sample_results):
    fresh = ExcavationEnv(EnvConfig(map_size=16, max_steps=STEP_BUDGET))
    assert solver.jitted_env_functions(fresh) is not solver.jitted_env_functions(env)
    for index, agent in [(0, A.TRACKED), (1, A.WHEELED)]:
        result = sample_results[(index, agent)]
        done, episode_return, _ = solver.replay(
            fresh, sample_params, index, agent, jax.random.PRNGKey(index), result.actions
        )
        assert done == result.completed
        assert episode_return == pytest.approx(result.episode_return, abs=1e-5)
        again = solver.solve(fresh, sample_params, index, agent, jax.random.PRNGKey(index), 400)
        np.testing.assert_array_equal(again.actions, result.actions)


def _one_tile_map(with_zones: bool) -> MapSet:
    """16x16, one dig tile at (8, 11); with zones, a dump band two tiles around it."""
    size = 16
    target = np.zeros((1, size, size), np.int8)
    if with_zones:
        target[0, 6:11, 9:14] = 1
        target[0, 7:10, 10:13] = 0
    target[0, 8, 11] = -1
    zeros = np.zeros_like(target)
    return MapSet(
        target_map=target,
        obstacles=zeros,
        dumpability=np.ones_like(target),
        map_type=np.array([MAP_TYPES.index("foundations" if with_zones else "trenches")], np.int8),
        spawn_pose=np.array([[4, 4]], np.int32),
    )


@pytest.mark.parametrize("with_zones", [False, True])
@pytest.mark.parametrize("agent", AGENTS)
def test_one_tile_map_takes_a_handful_of_steps(env, with_zones, agent):
    params = params_from_maps(_one_tile_map(with_zones))
    result = solver.solve(env, params, 0, agent, jax.random.PRNGKey(3), STEP_BUDGET)
    assert result.completed, result.reason
    assert result.steps <= 25
    assert np.sum(result.actions == A.DO) == 2  # one dig, one dump
    assert result.actions[-1] == A.DO


def test_summarize_groups_and_statistics():
    records = [
        {"map_type": "trenches", "agent": "tracked", "completed": True, "steps": s,
         "episode_return": 1.0, "seconds": 0.5}
        for s in (10, 20, 30)
    ] + [
        {"map_type": "trenches", "agent": "tracked", "completed": False, "steps": 99,
         "episode_return": 0.0, "seconds": 0.5},
        {"map_type": "foundations", "agent": "wheeled", "completed": False, "steps": 7,
         "episode_return": -1.0, "seconds": 1.0},
    ]  # fmt: skip
    rows = {(r["map_type"], r["agent"]): r for r in solver.summarize(records)}
    trenches = rows[("trenches", "tracked")]
    assert (trenches["maps"], trenches["solved"]) == (4, 3)
    assert (trenches["steps_median"], trenches["steps_max"]) == (20.0, 30.0)
    assert trenches["steps_p90"] == pytest.approx(28.0)
    assert trenches["return_mean"] == pytest.approx(0.75)
    assert np.isnan(rows[("foundations", "wheeled")]["steps_median"])


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "solve_maps.py"
    spec = importlib.util.spec_from_file_location("solve_maps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv",
    [["--map-size", "17"], ["--map-types", "trenches,castles"], ["--count", "0"],
     ["--time-limit", "-1"], ["--eval-pool", "no_such_preset"]],
)
def test_script_rejects_bad_input_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _script().main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def _reference_coverage(planner, action_map, dumpability, node):
    """`Planner.coverage`'s sector counts over every reachable pose, without its skip of
    poses with no undug target in their ring: the definition the planner is held to."""
    from envs.solver_geometry import shortest_paths

    dist, _, _ = shortest_paths(planner.graph, node, planner._free_poses(action_map))
    poses = np.unique(planner.pose_of(np.flatnonzero(dist >= 0)))
    undug = (planner.target == -1) & (action_map == 0)
    space = (dumpability == 1) & (action_map == 0) & (planner.target != -1)
    if planner.has_zones:
        space &= planner.target == 1
    soil = np.append((action_map > 0) & planner.pickable, False)
    undug, space = np.append(undug, False), np.append(space, False)
    coverage = np.zeros(planner.sentinel, np.int64)
    for pose in poses:
        sectors = planner.reach[pose]  # [12, K], sentinel-padded
        if not space[sectors].any():
            continue
        for tiles in sectors:
            if undug[tiles].any() and (planner.dig_first or not soil[tiles].any()):
                np.add.at(coverage, tiles[tiles < planner.sentinel], 1)
    return np.where(undug[:-1], coverage, 0)


@pytest.mark.parametrize("index, agent", [(0, A.TRACKED), (3, A.WHEELED), (8, A.TRACKED)])
def test_coverage_equals_the_reference_on_every_reachable_pose(env, sample_params,
                                                                sample_results, index, agent):
    """Mid-task states of solved maps: the planner's coverage (which skips poses whose ring
    holds no undug target) counts exactly what every reachable pose's sectors hold, and
    `blocked_reasons` splits exactly the targets it leaves at zero."""
    from envs.solver_planner import Planner

    key = jax.random.PRNGKey(index)
    state = solver.initial_state(env, sample_params, index, agent, key)
    host = jax.device_get(state)
    actions = sample_results[(index, agent)].actions
    _, step = solver.jitted_env_functions(env)
    checked = 0
    for config in (env.config, EnvConfig(map_size=16, dig_before_pickup=False)):
        planner = Planner(config, agent, host.target_map, host.obstacles)
        state = solver.initial_state(env, sample_params, index, agent, key)
        for count, action in enumerate(actions[: len(actions) // 2]):
            _, state, *_ = step(key, state, jax.numpy.int32(action), sample_params)
            if count % 8:
                continue
            view = planner.state_of(jax.device_get(state))
            coverage, _ = planner.coverage(view.action_map, view.dumpability, view.node)
            reference = _reference_coverage(planner, view.action_map, view.dumpability,
                                             view.node)
            undug = (planner.target == -1) & (view.action_map == 0)
            assert undug.any()
            np.testing.assert_array_equal(np.where(undug, coverage, 0), reference)
            blocked, _ = planner.blocked(view.action_map, view.dumpability, view.node)
            reasons = planner.blocked_reasons(view.action_map, view.dumpability, view.node)
            assert sum(reasons.values()) == blocked
            checked += 1
    assert checked >= 4


def test_a_time_limit_stops_the_search_with_a_reason(env, sample_params):
    result = solver.solve(env, sample_params, 0, A.TRACKED, jax.random.PRNGKey(0), STEP_BUDGET,
                          time_limit=0.0)
    assert not result.completed and result.steps == 0
    assert result.reason.startswith("time limit of 0 s after 0 backjumps:"), result.reason


def test_script_reports_an_unsolved_map_with_its_start(tmp_path, capsys):
    """A search stopped at once leaves the map unsolved: the script prints the reason and
    what was out of reach from the spawn (nothing, on a generated 16x16 trench map)."""
    import json

    out = tmp_path / "solve.json"
    argv = ["--map-size", "16", "--map-types", "trenches", "--count", "1", "--agent", "tracked",
            "--time-limit", "1e-9", "--json", str(out)]
    assert _script().main(argv) == 0
    (record,) = json.loads(out.read_text())["maps"]
    assert not record["completed"] and record["reason"].startswith("time limit")
    assert record["at_start"] == {"cut off": 0, "soil in the way": 0, "no dump space": 0}
    assert "out of reach at the start: cut off 0" in capsys.readouterr().out
