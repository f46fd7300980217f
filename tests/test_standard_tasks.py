"""The standard-task table's data and pure parts (scripts/run_results.py runs it)."""

from __future__ import annotations

import math

import jax
import pytest

from terra_rl.analysis.standard_tasks import (
    NUM_EVALS,
    TASKS,
    markdown_table,
    run_flags,
    run_record,
    summarize,
    updates_of,
)
from terra_rl.cli.flags import parse_train_args
from terra_rl.config import resolve


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_resolves_to_a_valid_config_at_its_budget(name, tmp_path):
    task = TASKS[name]
    args = parse_train_args(run_flags(task, 2, task.budget, str(tmp_path), "r"))
    config = resolve(args.config, jax.local_device_count())
    assert config.env == task.env and config.seed == 2
    assert config.num_updates == updates_of(task, task.budget)
    # The budget is covered, and by less than one update more.
    covered = config.num_updates * config.env_steps_per_update
    assert 0 <= covered - task.budget < config.env_steps_per_update
    assert config.num_updates // config.log_eval_interval in (NUM_EVALS, NUM_EVALS + 1)
    assert not config.use_action_mask and not config.use_dig_distance
    assert not config.use_pose_distance
    if name == "Asterix-MinAtar":  # gymnax-blines' discount, lr 2e-3 annealed, 2 x 64
        assert config.image_encoder == "mlp" and config.lr_schedule == "linear"
        assert config.lr == 2e-3 and config.gamma == 0.999
        assert config.gymnax_activation == "relu" and config.gymnax_hidden_dim == 64
    elif name.endswith("-MinAtar"):  # PureJaxRL's MinAtar settings, the flattened-image MLP
        assert config.image_encoder == "mlp" and config.lr_schedule == "linear"
        assert config.lr == 5e-3 and config.gamma == 0.99
        assert config.gymnax_activation == "relu" and config.gymnax_hidden_dim == 64
    else:
        assert config.gymnax_activation == "tanh"
    # Every row bootstraps its timeouts (the trainer's rule); only MountainCar sees its
    # observations scaled to their bounds, in training and eval alike.
    assert not config.gymnax_timeouts_terminal
    assert config.gymnax_scale_observations == (name == "MountainCar-v0")
    if name == "MountainCar-v0":
        from terra_rl.adapters.train_env import make_train_envs

        train_env, eval_env = make_train_envs(config)
        assert train_env.scale_observations and eval_env.scale_observations
        assert not train_env.timeouts_terminal
    assert config.wandb_mode == "disabled" and config.precision == "float32"


def _records(returns, steps_per_second):
    records = []
    for update, value in enumerate(returns, 1):
        records.append({"update": update, "env_step": 100 * update,
                        "performance/steps_per_second": steps_per_second,
                        **({"performance/compile_seconds": 5.0} if update == 1 else {})})
        records.append({"update": update, "env_step": 100 * update,
                        "eval/first_episode_return": value})
    return records


def test_run_record_takes_the_last_eval_and_summary_spans_seeds():
    runs = [run_record(_records([1.0, 9.0], 1000.0), 60.0),
            run_record(_records([3.0, 5.0], 3000.0), 120.0),
            run_record(_records([2.0, 7.0], 2000.0), 90.0)]
    assert [run["return"] for run in runs] == [9.0, 5.0, 7.0]
    assert runs[0]["compile_seconds"] == 5.0 and runs[0]["env_steps"] == 200
    assert math.isnan(runs[0]["sampled_return"])
    row = summarize("Breakout-MinAtar", runs)
    assert (row["return_median"], row["return_min"], row["return_max"]) == (7.0, 5.0, 9.0)
    assert row["steps_per_second"] == 2000.0 and row["wall_seconds"] == 90.0
    assert row["reference"] == 28.0 and row["budget"] == 10_000_000
    table = markdown_table([row]).splitlines()
    assert len(table) == 3
    assert table[2] == ("| Breakout-MinAtar | 10,000,000 | 7.0 (5.0 to 9.0, 3 seeds) | 28 "
                        "| 2,000 | 1.5 min |")
    one = markdown_table([summarize("Breakout-MinAtar", runs[:1])]).splitlines()[2]
    assert "9.0 (9.0 to 9.0, 1 seed) |" in one
    # The rate is the median over the run's train logs, not the last log's.
    varied = _records([1.0, 2.0, 3.0], 0.0)
    for record, rate in zip([r for r in varied if "performance/steps_per_second" in r],
                            (500.0, 4000.0, 1000.0), strict=True):
        record["performance/steps_per_second"] = rate
    assert run_record(varied, 1.0)["steps_per_second"] == 1000.0
    with pytest.raises(ValueError, match="no eval"):
        run_record([r for r in _records([1.0], 1.0) if "eval/first_episode_return" not in r], 1)
