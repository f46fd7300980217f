"""The pmapped update on 4 CPU devices, evaluation, resume, warm start and the compiles in the
background, on one tiny excavation config (cpu_demo's trench maps and action mask, 8 envs per
device, 8 steps, episodes of 12 steps so timeouts happen inside every rollout) compiled once
for the test session.

Its helpers (`TINY`, `tiny_config`, `run_train`, `load_script`, ...) are shared: the CLI and
the scripts on the same shapes are in test_trainer_cli.py, the gymnax adapter's training in
test_trainer_gymnax.py (files of their own, so that a second worker can run them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.algo.run_keys import INIT_STREAM, PARAMS_STREAM
from terra_rl.config import TrainConfig, resolve
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.device_metrics import host_metrics
from terra_rl.run.logger import RunLogger, read_metrics
from terra_rl.run.train_loop import train
from terra_rl.run.trainer import (
    EVAL_COMPILER_OPTIONS,
    INIT_COMPILER_OPTIONS,
    build_trainer,
)
from terra_rl.run.warm_start import WarmStartError, load_init_params
from terra_rl.validation.small import SMOKE_FIELDS

NUM_DEVICES = 4
# The validation gates' tiny shapes, logging, evaluating and checkpointing often.
TINY = dict(SMOKE_FIELDS, log_train_interval=1, log_eval_interval=2, checkpoint_interval=2)
TINY_UPDATES = 4

pytestmark = pytest.mark.slow  # minutes of compiles: `make test` runs it, `make test-fast` not


def tiny_config(**changes) -> TrainConfig:
    fields = dict(TINY, num_devices=NUM_DEVICES,
                  total_timesteps=TINY_UPDATES * 8 * 8 * NUM_DEVICES)
    return resolve(TrainConfig(**{**fields, **changes}), jax.local_device_count())


@pytest.fixture(scope="session")
def tiny_trainer():
    assert jax.local_device_count() >= NUM_DEVICES, "conftest forces 4 CPU devices"
    return build_trainer(tiny_config(), max_traces=1)


def test_a_second_trace_of_the_update_fails_at_once():
    """`max_traces=1` (chex.assert_max_traces): the update traced for other argument types
    raises at once instead of recompiling; the first trace counts and passes."""
    trainer = build_trainer(tiny_config(), max_traces=1)
    runner = trainer.abstract_runner()
    jax.eval_shape(trainer.update_fn, runner, trainer.env_params)
    assert trainer.trace_counts["update"] == 1
    recast = runner.replace(counters=jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.float32), runner.counters))
    with pytest.raises(AssertionError, match="traced > 1 times"):
        jax.eval_shape(trainer.update_fn, recast, trainer.env_params)
    assert trainer.trace_counts["update"] == 1  # stopped before the body ran


def leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                    strict=True))


def test_four_device_updates(tiny_trainer):
    trainer = tiny_trainer
    runner = trainer.init_runner()
    update_fn = trainer.compile_update(runner)
    params_before = jax.device_get(runner.policy.params)
    per_device = jax.tree.leaves(params_before)[0]
    assert per_device.shape[0] == NUM_DEVICES
    assert leaves_equal(
        jax.tree.map(lambda x: x[0], params_before), jax.tree.map(lambda x: x[3], params_before)
    )

    first_metrics = None
    for _ in range(2):
        previous = runner
        runner, metrics = update_fn(runner, trainer.env_params)
        # The donated runner state was consumed: its buffers are deleted.
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(previous))
        first_metrics = first_metrics or host_metrics(metrics)
    metrics = host_metrics(metrics)

    # Episodes of 12 steps cannot finish whole within the first 8-step rollout: nothing
    # is reported rather than a 0.
    assert first_metrics["train/episodes_finished"] == 0.0
    assert "train/episode_return" not in first_metrics
    for name in ("train/actor_loss", "train/value_loss", "train/entropy", "train/approx_kl",
                 "train/clip_fraction", "train/grad_norm", "train/explained_variance",
                 "sched/entropy_coef", "sched/lr", "train/done_rate", "train/timeout_rate",
                 "train/task_done_rate", "train/mean_episode_progress",
                 "train/max_episode_progress", "value_by_age/75_100pct/count"):
        assert math.isfinite(metrics[name]), name
    assert metrics["train/timeout_rate"] > 0.0  # timeouts inside the rollout
    # cpu_demo's curriculum: every env at some level, untrained envs still on the first.
    levels = [metrics[f"curriculum/{name}"] for name in trainer.config.curriculum]
    assert sum(levels) == pytest.approx(1.0) and levels[0] > 0.5
    assert metrics["curriculum/mean_level"] == pytest.approx(levels[1])
    assert metrics["precision/skipped_update_fraction"] == 0.0
    assert metrics["precision/overflow_steps"] == 0.0
    assert metrics["precision/loss_scale"] == 1.0
    for group in ("policy_head", "value_head", "encoder"):
        assert math.isfinite(metrics[f"grad_norm/{group}"]) and metrics[f"grad_norm/{group}"] > 0
    bucket_counts = sum(metrics[f"value_by_age/{b}/count"]
                        for b in ("00_25pct", "25_50pct", "50_75pct", "75_100pct"))
    assert bucket_counts == 8 * 8 * NUM_DEVICES

    params_after = jax.device_get(runner.policy.params)
    assert not leaves_equal(params_before, params_after)
    for device in range(1, NUM_DEVICES):
        assert leaves_equal(
            jax.tree.map(lambda x: x[0], params_after),
            jax.tree.map(lambda x, d=device: x[d], params_after),
        )
    assert np.all(np.asarray(runner.counters.update) == 2)
    # Envs differ per device: each device steps its own batch.
    maps = np.asarray(runner.env_state.map_index)
    assert not np.array_equal(maps[0], maps[1]) or not np.array_equal(
        np.asarray(runner.env_state.age)[0], np.asarray(runner.env_state.age)[1]
    )


def test_a_nan_gradient_skips_the_step_on_every_device(tiny_trainer):
    """float32 keeps the non-finite skip: a NaN in device 0's value head makes its values,
    its advantages and so the device-averaged gradients NaN, and every device keeps its
    parameters and optimizer state through every minibatch step."""
    trainer = tiny_trainer
    runner = trainer.init_runner()
    update_fn = trainer.compile_update(runner)
    params = jax.tree.map(np.array, jax.device_get(runner.policy.params))
    params["params"]["value_head"]["kernel"][0, 0, 0] = np.nan  # device 0 only
    runner = runner.replace(policy=runner.policy.replace(params=trainer.shard(params)))
    opt_before = jax.device_get(runner.policy.opt_state)
    runner, metrics = update_fn(runner, trainer.env_params)
    after = jax.device_get(runner.policy.params)
    assert all(np.array_equal(x, y, equal_nan=True)
               for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(after), strict=True))
    assert leaves_equal(opt_before, jax.device_get(runner.policy.opt_state))
    steps = trainer.config.update_epochs * trainer.config.num_minibatches
    np.testing.assert_array_equal(jax.device_get(runner.loss_scale.overflow_steps), steps)
    metrics = host_metrics(metrics)
    assert metrics["precision/skipped_update_fraction"] == 1.0
    assert metrics["precision/loss_scale"] == 1.0


def test_evaluation_metrics(tiny_trainer):
    trainer = tiny_trainer
    runner = trainer.init_runner()
    metrics = trainer.evaluate(runner, update=0)
    episodes = trainer.config.eval_episodes
    # The held-out pool has one map per eval env, none of them a training map.
    assert trainer.eval_env.params.num_maps == episodes
    train_maps = {m.tobytes() for m in np.asarray(trainer.train_env.params.target_map)}
    assert not any(m.tobytes() in train_maps
                   for m in np.asarray(trainer.eval_env.params.target_map))
    for prefix in ("eval/", "eval_sampled/"):
        action_share = sum(metrics[prefix + name] for name in trainer.eval_env.action_names)
        assert action_share == pytest.approx(1.0, abs=1e-5)
        rate = metrics[prefix + "completion_rate"]
        assert 0.0 <= rate <= 1.0
        assert metrics[prefix + "episode_completion_rate"] == rate
        assert 0.0 <= metrics[prefix + "positive_terminations"]
        # Fresh (unstaggered) episodes that do not succeed time out at the 12-step horizon.
        assert metrics[prefix + "episodes_finished"] == episodes
        assert math.isfinite(metrics[prefix + "rewards"])
        assert metrics[prefix + "first_episode_return"] < 0.0  # step costs, no completion
    # Trench maps and tracked excavators only: one group holds every eval env.
    assert metrics["eval/completion_rate/trenches/tracked"] == metrics["eval/completion_rate"]
    assert not any(name.startswith("eval/completion_rate/foundations") for name in metrics)
    # Greedy and sampled policies act differently.
    shares = lambda prefix: [metrics[prefix + n] for n in trainer.eval_env.action_names]  # noqa: E731
    assert shares("eval/") != shares("eval_sampled/")
    # Every eval starts the same episodes: evals of one policy repeat exactly.
    assert trainer.evaluate(runner, update=5) == metrics


def run_train(trainer, run_dir, *, resume=False, **kwargs):
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = CheckpointStore(run_dir / "checkpoints",
                                  best_metric=trainer.config.best_metric)
    with RunLogger(run_dir, trainer.config.num_updates, progress_interval_s=0) as logger:
        result = train(trainer, logger, checkpoints, resume=resume, **kwargs)
    checkpoints.close()
    return result


def stop_after_polls(polls: int):
    """A stop request that turns true on its `polls`-th poll (the trainer polls once after
    compiling, then once after every update but the last)."""
    count = iter(range(1, 1_000_000))
    return lambda: next(count) >= polls


def test_resume_after_stop_request_equals_straight_run(tiny_trainer, tmp_path):
    straight = run_train(tiny_trainer, tmp_path / "straight")
    assert straight.updates_done == TINY_UPDATES and not straight.stopped
    assert straight.env_steps == TINY_UPDATES * tiny_trainer.config.env_steps_per_update

    # A signal during update 3 (polled after it): update 3 is logged and checkpointed although
    # the checkpoint interval is 2, and the run says it stopped.
    staged_dir = tmp_path / "staged"
    first = run_train(tiny_trainer, staged_dir, stop_requested=stop_after_polls(4))
    assert first.stopped and first.updates_done == 3
    assert CheckpointStore(staged_dir / "checkpoints").latest_step() == 3
    resumed = run_train(tiny_trainer, staged_dir, resume=True)
    assert resumed.updates_done == TINY_UPDATES and resumed.resumed_from == 3
    assert leaves_equal(jax.device_get(straight.runner), jax.device_get(resumed.runner))

    records = read_metrics(staged_dir / "metrics.jsonl")
    train_records = [r for r in records if "train/actor_loss" in r]
    assert [r["update"] for r in train_records] == [1, 2, 3, 4]
    assert [r["update"] for r in records if "eval/rewards" in r] == [0, 2, 4]
    # Compile time is logged by each process (the first and the resumed), once each.
    compiled = [r["update"] for r in train_records if "performance/compile_seconds" in r]
    assert compiled == [1, 4]
    for record in train_records:
        assert math.isfinite(record["performance/wall_steps_per_second"])
        if "performance/compile_seconds" in record:
            # The first log of a process: both rates cover the same updates, and wall time
            # also holds the baseline eval and logging.
            wall_rate = record["performance/wall_steps_per_second"]
            assert 0 < wall_rate <= record["performance/steps_per_second"]

    # A stop request that came during compile: nothing trained, nothing saved.
    early = run_train(tiny_trainer, tmp_path / "early", stop_requested=lambda: True)
    assert early.stopped and early.updates_done == 0
    assert CheckpointStore(tmp_path / "early" / "checkpoints").latest_step() is None

    # Three runs, a stop, a resume, evals and checkpoints: one trace of each function.
    assert tiny_trainer.trace_counts == {"update": 1, "eval": 1}


def test_max_updates_checkpoints_off_interval_and_counts_in_total(tiny_trainer, tmp_path):
    """`--max_updates N` (`train(stop_after=N)`) ends the run after update N in total, with
    a checkpoint there even off the checkpoint interval (2 here); a resume counts from the
    run's start, not from its checkpoint. (The CLI's side: the test after the CLI run.)"""
    first = run_train(tiny_trainer, tmp_path, stop_after=1)
    assert first.updates_done == 1 and not first.stopped
    assert CheckpointStore(tmp_path / "checkpoints").all_steps() == [1]
    resumed = run_train(tiny_trainer, tmp_path, resume=True, stop_after=3)
    assert resumed.resumed_from == 1 and resumed.updates_done == 3 and not resumed.stopped
    assert resumed.env_steps == 3 * tiny_trainer.config.env_steps_per_update
    assert CheckpointStore(tmp_path / "checkpoints").all_steps() == [1, 2, 3]
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["update"] for r in records if "train/actor_loss" in r] == [1, 2, 3]
    # Already there: nothing runs, nothing is written.
    again = run_train(tiny_trainer, tmp_path, resume=True, stop_after=3)
    assert again.resumed_from == again.updates_done == 3
    assert CheckpointStore(tmp_path / "checkpoints").all_steps() == [1, 2, 3]
    assert read_metrics(tmp_path / "metrics.jsonl") == records


def test_warm_start_takes_the_parameters_and_nothing_else(tiny_trainer, tmp_path):
    """A run started from another run's checkpoint holds its parameters on every device and a
    fresh optimizer state at update 0, and its baseline eval equals the source's eval of
    those parameters (same seed, same held-out episodes)."""
    source = run_train(tiny_trainer, tmp_path / "source", stop_after=2)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                        tiny_trainer.abstract_runner().policy.params)
    params, step = load_init_params(tmp_path / "source", "latest", like)
    assert step == 2
    trained = jax.tree.map(lambda x: np.asarray(x)[0], jax.device_get(source.runner.policy.params))
    assert leaves_equal(params, trained)
    assert [p.dtype for p in jax.tree.leaves(params)] == [p.dtype for p in jax.tree.leaves(like)]

    warm = run_train(tiny_trainer, tmp_path / "warm", stop_after=0, init_params=params)
    runner = jax.device_get(warm.runner)
    for device in range(NUM_DEVICES):
        assert leaves_equal(jax.tree.map(lambda x, d=device: x[d], runner.policy.params), trained)
    fresh = jax.device_get(tiny_trainer.init_runner())
    assert leaves_equal(runner.policy.opt_state, fresh.policy.opt_state)
    assert not leaves_equal(runner.policy.params, fresh.policy.params)
    assert np.all(runner.counters.update == 0)

    def eval_at(run_dir, update):
        records = read_metrics(run_dir / "metrics.jsonl")
        (record,) = [r for r in records if r["update"] == update and "eval/rewards" in r]
        return {k: v for k, v in record.items() if k.startswith(("eval/", "eval_sampled/"))}

    assert eval_at(tmp_path / "warm", 0) == eval_at(tmp_path / "source", 2)
    assert eval_at(tmp_path / "warm", 0) != eval_at(tmp_path / "source", 0)

    errors = {
        "missing run": ((tmp_path / "nowhere", "latest", like), "holds no checkpoints/"),
        "missing step": ((tmp_path / "source", "7", like), "no checkpoint 7"),
        "another network": ((tmp_path / "source", "2", {**like, "extra": like["params"]}),
                            "lacks extra"),
    }
    kernel_path, kernel = jax.tree_util.tree_leaves_with_path(like)[0]
    wider = jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] + 1), x.dtype)
        if path == kernel_path else x, like)
    errors["a wider layer"] = ((tmp_path / "source", "best", wider), f"{kernel.shape} in")
    for name, (args, phrase) in errors.items():
        with pytest.raises(WarmStartError, match=re.escape(phrase)) as error:
            load_init_params(*args)
        assert str(error.value).startswith("--init_params: ") and "\n" not in str(error.value), name
    assert tiny_trainer.trace_counts == {"update": 1, "eval": 1}


def test_best_checkpoint_is_kept_at_any_eval_that_improves(tiny_trainer, tmp_path):
    """Evals every update, one periodic checkpoint (the last): the best checkpoint is the
    eval whose metric was highest (the first of equals), saved when it happened."""
    config = dataclasses.replace(tiny_trainer.config, log_eval_interval=1, checkpoint_interval=0,
                                 best_metric="validation/first_episode_return")
    runner = tiny_trainer.init_runner()
    tiny_trainer.compile_update(runner)
    tiny_trainer.compile_eval(runner)
    trainer = dataclasses.replace(tiny_trainer, config=config)  # the same compiled functions
    run_train(trainer, tmp_path)
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["update"] > 0
             and "eval/rewards" in r]
    values = [r[config.best_metric] for r in evals]
    best_update = evals[values.index(max(values))]["update"]
    assert best_update < TINY_UPDATES  # kept between periodic checkpoints
    store = CheckpointStore(tmp_path / "checkpoints", best_metric=config.best_metric)
    assert store.all_steps() == [TINY_UPDATES]
    assert store.best_step() == best_update and store.best_value == max(values)
    assert store.metrics(best_update)[config.best_metric] == max(values)


def test_the_update_compiles_beside_the_init_to_the_same_run(tiny_trainer, tmp_path,
                                                              capsys):
    """`Trainer.update_beside_init` (the default on an accelerator, forced here on the CPU):
    the update compiles on a thread of its own while the init compiles, the log says so,
    and the run logs the same records as the shared trainer's, which keeps the CPU's order
    (the update compiled after the init)."""
    trainer = build_trainer(tiny_config(), max_traces=1)
    trainer.update_beside_init = True
    assert trainer.compiles_update_beside_init() and not tiny_trainer.compiles_update_beside_init()
    capsys.readouterr()
    run_train(trainer, tmp_path / "beside", stop_after=2)
    out = capsys.readouterr().out
    assert re.search(r"first update after \d+\.\d s \(init \d+\.\d s, the update compiling "
                     r"beside it\)", out), out
    assert trainer.update_compile_future is None and trainer.trace_counts["update"] == 1
    assert trainer.compile_seconds > 0
    run_train(tiny_trainer, tmp_path / "after", stop_after=2)

    def records(run):  # as JSON text: NaN equals NaN
        return [json.dumps({k: v for k, v in r.items()
                            if not k.startswith(("performance/", "wall_time"))}, sort_keys=True)
                for r in read_metrics(tmp_path / run / "metrics.jsonl")]

    assert records("beside") == records("after")
    assert len(records("beside")) >= 3  # the baseline eval, two updates' train logs


def test_the_eval_compiles_beside_the_first_updates(tiny_trainer, tmp_path, capsys):
    """One process: the eval compiles in a background thread while the updates run. The
    untrained policy's eval comes from the parameters before update 1 (the runner itself
    was donated since), equals the eval run before any update, and is logged before the
    train logs held back for it, so metrics.jsonl keeps the order of a sequential run."""
    runner = tiny_trainer.init_runner()
    tiny_trainer.compile_update(runner)
    expected = tiny_trainer.evaluate(runner, 0)
    # A trainer whose eval is not compiled yet, and whose compile reports itself unfinished
    # until the first eval is due (at update 2): the baseline waits that long.
    trainer = dataclasses.replace(tiny_trainer, compiled_eval=None, eval_compile_future=None)
    trainer.eval_compiled = lambda: False
    capsys.readouterr()
    result = run_train(trainer, tmp_path)
    assert result.updates_done == TINY_UPDATES
    out = capsys.readouterr().out
    assert "eval compiling beside the first updates; first update after" in out
    assert re.search(r"eval compiled in \d+\.\d s, beside the first 2 updates", out)
    records = read_metrics(tmp_path / "metrics.jsonl")
    order = [(r["update"], "eval" if "eval/rewards" in r else "train") for r in records]
    assert order == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval"), (3, "train"),
                     (4, "train"), (4, "eval")]
    baseline = {k: v for k, v in records[0].items()
                if k.startswith(("eval/", "eval_sampled/", "validation/"))}
    assert baseline == pytest.approx(expected, rel=0, abs=0, nan_ok=True)
    assert any(records[3][name] != value for name, value in baseline.items())  # trained since
    assert tiny_trainer.trace_counts["eval"] == 1  # lowered again from jax's trace cache
    # The baseline waited for the compile: counted, to be left out of the wall rate.
    assert trainer.eval_compile_wait_seconds > 0


def test_an_eval_due_while_the_eval_compiles_runs_later_with_the_same_results(
        tiny_trainer, tmp_path, capsys):
    """The evals due at updates 1 and 2 come while the eval still compiles: the updates go
    on, and once the compile is done (here after update 3) the baseline and those evals
    run, of the parameters they had then. metrics.jsonl and the best checkpoint are those of
    a run whose eval was compiled before its first update."""
    config = dataclasses.replace(tiny_trainer.config, log_eval_interval=1,
                                 checkpoint_interval=0,
                                 best_metric="validation/first_episode_return")
    runner = tiny_trainer.init_runner()
    tiny_trainer.compile_update(runner)
    tiny_trainer.compile_eval(runner)
    straight = dataclasses.replace(tiny_trainer, config=config)
    run_train(straight, tmp_path / "straight")

    deferred = dataclasses.replace(straight, compiled_eval=None, eval_compile_future=None)
    polls = iter(range(1, 1_000_000))
    deferred.eval_compiled = lambda: next(polls) >= 4  # done from the poll after update 3 on
    capsys.readouterr()
    run_train(deferred, tmp_path / "deferred")
    assert re.search(r"eval compiled in \d+\.\d s, beside the first 3 updates",
                     capsys.readouterr().out)

    def records(run: str):
        return [{k: v for k, v in r.items()
                 if k != "wall_time" and not k.startswith("performance/")}
                for r in read_metrics(tmp_path / run / "metrics.jsonl")]

    expected = records("straight")
    assert [(r["update"], "eval/rewards" in r) for r in expected] == [
        (0, True), *[(update, is_eval) for update in range(1, 5) for is_eval in (False, True)]]
    assert records("deferred") == expected
    stores = [CheckpointStore(tmp_path / run / "checkpoints", best_metric=config.best_metric)
              for run in ("straight", "deferred")]
    best_step = stores[0].best_step()
    assert best_step is not None and stores[1].best_step() == best_step
    assert stores[1].metrics(best_step) == stores[0].metrics(best_step)
    target = straight.abstract_runner()
    states = [store.restore(best_step, target)[0] for store in stores]
    assert leaves_equal(*states)
    for store in stores:
        store.close()


@pytest.mark.parametrize("eval_interval", [2, 1])
def test_a_stop_during_the_eval_compile_waits_for_it_and_loses_no_record(
        tiny_trainer, tmp_path, eval_interval):
    """A stop request while the eval still compiles in the background: the records waiting
    for it (the baseline eval and, every update evaluated, the eval deferred from update 1)
    and the stopped update's due eval are written before the checkpoint that covers them, in
    the order of a run whose eval compiled first; a resume from that checkpoint then finds
    every record up to it (tests/test_kill_points.py kills runs at such points)."""
    runner = tiny_trainer.init_runner()
    tiny_trainer.compile_update(runner)
    config = dataclasses.replace(tiny_trainer.config, log_eval_interval=eval_interval)
    trainer = dataclasses.replace(tiny_trainer, config=config, compiled_eval=None,
                                  eval_compile_future=None)
    trainer.eval_compiled = lambda: False
    result = run_train(trainer, tmp_path, stop_requested=stop_after_polls(3))
    assert result.stopped and result.updates_done == 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    expected = {2: [(0, True), (1, False), (2, False), (2, True)],
                1: [(0, True), (1, False), (1, True), (2, False), (2, True)]}[eval_interval]
    assert [(r["update"], "eval/rewards" in r) for r in records] == expected
    store = CheckpointStore(tmp_path / "checkpoints")
    assert store.latest_step() == 2
    store.close()


def test_the_init_compiles_once_and_its_level_changes_no_bit(tiny_trainer):
    """`init_runner` compiles the init once. On CPU it compiles at LLVM level 1
    (`INIT_COMPILER_OPTIONS`; the tests' XLA_FLAGS set level 0, which it leaves alone):
    the state equals the default level 2's bit for bit."""
    first = jax.device_get(tiny_trainer.init_runner())
    compiled = tiny_trainer.compiled_init
    assert leaves_equal(first, jax.device_get(tiny_trainer.init_runner()))
    assert tiny_trainer.compiled_init is compiled
    args = tiny_trainer._init_args()
    lowered = tiny_trainer.init_fn.lower(*args)
    states = [jax.device_get(lowered.compile(compiler_options=options)(*args)) for options in
              (INIT_COMPILER_OPTIONS, {"xla_backend_optimization_level": 2})]
    assert leaves_equal(*states)


def test_the_trainers_first_state_follows_the_eager_keys(tiny_trainer):
    """Device d's key is `split(fold_in(PRNGKey(seed), 0), D)[d]`, split once into the
    reset's key and the runner's key, and every device holds the parameters drawn from
    `fold_in(PRNGKey(seed), 1)`. (tests/test_run_keys.py checks that no two consumers of
    the init and the update share a key.)"""
    runner = jax.device_get(tiny_trainer.init_runner())
    devices = tiny_trainer.num_devices
    root = jax.random.PRNGKey(tiny_trainer.config.seed)
    init_keys = jax.random.split(jax.random.fold_in(root, INIT_STREAM), devices)
    want = np.stack([np.asarray(jax.random.split(k)[1]) for k in init_keys])
    np.testing.assert_array_equal(runner.rng, want)
    params = jax.jit(tiny_trainer.policy.init)(
        jax.random.fold_in(root, PARAMS_STREAM),
        jax.tree.map(lambda x: x[0, :1], runner.last_obs))
    for got, expected in zip(jax.tree.leaves(runner.policy.params), jax.tree.leaves(params),
                             strict=True):
        for device in range(devices):
            np.testing.assert_array_equal(got[device], np.asarray(expected))


def test_the_eval_at_its_cpu_level_gives_the_default_levels_metrics(tiny_trainer):
    """The eval compiles at LLVM level 1 on CPU (`EVAL_COMPILER_OPTIONS`): its greedy and
    sampled metrics equal those of the default level 2 bit for bit."""
    params = tiny_trainer.init_runner().policy.params
    args = lambda sample: (params, tiny_trainer.run_key(),  # noqa: E731
                           tiny_trainer.eval_env_params, tiny_trainer.replicate(np.bool_(sample)))
    lowered = tiny_trainer.eval_fn.lower(*args(False))  # `sample` is traced: one program
    compiled = [lowered.compile(compiler_options=options)
                for options in (EVAL_COMPILER_OPTIONS, {"xla_backend_optimization_level": 2})]
    for sample in (False, True):
        metrics = [jax.device_get(evaluate(*args(sample))) for evaluate in compiled]
        assert metrics[0].keys() == metrics[1].keys()
        for name in metrics[0]:
            np.testing.assert_array_equal(metrics[0][name], metrics[1][name], err_msg=name)


def test_the_init_compiles_in_the_background_and_the_update_lowers_from_its_shapes(
        tiny_trainer):
    """`train` compiles the init on another thread while it lowers the update from
    `abstract_runner()`: that lowering is the same program as from the fresh state, the
    shapes come from the lowered init without a trace of their own, and `init_runner`
    waits for the background compile and returns the synchronous path's state. (Lowering
    from shapes and from arrays traces the update twice: this trainer has no trace guard.)"""
    fresh = build_trainer(tiny_config())
    fresh.start_init_compile()
    assert fresh.compiled_init is None and fresh.init_compile_future is not None
    assert fresh.init_out_info is not None
    abstract = fresh.abstract_runner()
    traced = jax.eval_shape(fresh.init_fn, *fresh._init_args())
    assert jax.tree.structure(abstract) == jax.tree.structure(traced)
    assert jax.tree.leaves(jax.tree.map(lambda x: (x.shape, x.dtype), abstract)) == \
        jax.tree.leaves(jax.tree.map(lambda x: (x.shape, x.dtype), traced))
    runner = fresh.init_runner()
    assert fresh.init_compile_future is None and fresh.init_compile_seconds > 0
    assert leaves_equal(jax.device_get(runner), jax.device_get(tiny_trainer.init_runner()))
    lowered = [fresh.update_fn.lower(state, fresh.env_params).as_text()
               for state in (abstract, runner)]
    assert lowered[0] == lowered[1]


def test_the_background_eval_lowers_the_same_program_from_the_parameters_shapes(tiny_trainer):
    """The eval's background compile lowers from the parameters' shapes (the updates donate
    the runner meanwhile): the same program as from the parameters themselves."""
    runner = tiny_trainer.init_runner()
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          runner.policy.params)
    rest = (tiny_trainer.run_key(), tiny_trainer.eval_env_params,
            tiny_trainer.replicate(np.bool_(False)))
    lowered = [tiny_trainer.eval_fn.lower(params, *rest).as_text()
               for params in (shapes, runner.policy.params)]
    assert lowered[0] == lowered[1]


def test_abstract_runner_is_the_fresh_state_without_running_init(tiny_trainer):
    """A resume restores into `abstract_runner()` instead of a fresh state it would throw
    away: the same tree, shapes and dtypes as `init_runner()`, and no arrays."""
    abstract = tiny_trainer.abstract_runner()
    fresh = tiny_trainer.init_runner()
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract))
    assert jax.tree.structure(abstract) == jax.tree.structure(fresh)
    assert jax.tree.leaves(jax.tree.map(lambda x: (x.shape, x.dtype), abstract)) == \
        jax.tree.leaves(jax.tree.map(lambda x: (x.shape, x.dtype), fresh))
    assert jax.tree.leaves(abstract)[0].shape[0] == NUM_DEVICES


def load_script(name: str):
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    script = importlib.util.module_from_spec(spec)
    sys.modules[name] = script  # a script's dataclasses look their module up there
    spec.loader.exec_module(script)
    return script
