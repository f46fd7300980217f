"""The trainer on gymnax's CartPole: one device's updates and eval, and several updates per
dispatch on 4 CPU devices, equal to one per dispatch. (Split from tests/test_trainer.py: these
build their own trainers, not its shared tiny one, so they can run on another worker.)"""

from __future__ import annotations

import math

import jax
import pytest
from test_trainer import NUM_DEVICES, leaves_equal, run_train, stop_after_polls

from terra_rl.config import TrainConfig, resolve
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.device_metrics import host_metrics
from terra_rl.run.logger import read_metrics
from terra_rl.run.trainer import build_trainer

pytestmark = pytest.mark.slow


def test_gymnax_cartpole_trains():
    config = resolve(
        TrainConfig(
            env="gymnax:CartPole-v1", num_devices=1, num_envs_per_device=8, num_steps=16,
            total_timesteps=3 * 16 * 8, update_epochs=2, num_minibatches=2, eval_episodes=4,
            precision="float32", compilation_cache_dir="", log_eval_interval=0,
            updates_per_dispatch=1,
        ),
        jax.local_device_count(),
    )
    trainer = build_trainer(config)
    runner = trainer.init_runner()
    update_fn = trainer.compile_update(runner)
    params_before = jax.device_get(runner.policy.params)
    for _ in range(3):
        runner, metrics = update_fn(runner, trainer.env_params)
    metrics = host_metrics(metrics)
    assert all(math.isfinite(metrics[k]) for k in ("train/actor_loss", "train/value_loss"))
    # CartPole pays 1 for every step, the last included: the adapter's episode returns must
    # equal its episode lengths, and a near-random policy balances for tens of steps.
    assert metrics["train/episodes_finished"] >= 1
    assert metrics["train/episode_return"] == pytest.approx(metrics["train/episode_length"])
    assert 8 <= metrics["train/episode_length"] <= 200
    # Every finished episode (counted when it started inside the rollout) ended with a done.
    dones = metrics["train/done_rate"] * 16 * 8
    assert dones == pytest.approx(round(dones)) and dones >= metrics["train/episodes_finished"]
    assert not leaves_equal(params_before, jax.device_get(runner.policy.params))
    # No success and no progress to report: those metrics are left out, not logged as 0.
    assert not {"train/task_done_rate", "train/mean_episode_progress",
                "train/max_episode_progress"} & set(metrics)
    evals = trainer.evaluate(runner, update=3)
    assert "eval/positive_terminations" not in evals  # gymnax has no success notion
    assert evals["eval/action_0"] + evals["eval/action_1"] == pytest.approx(1.0)


def test_several_updates_per_dispatch_match_one_per_dispatch(tmp_path):
    """CartPole on 4 devices, 10 updates, evals every 4 and checkpoints every 5: three updates
    per dispatch give the same final state and the same logged metrics, update by update,
    as one per dispatch, with evals and checkpoints on their updates and one trace each."""

    def cartpole(per_dispatch: int):
        config = TrainConfig(
            env="gymnax:CartPole-v1", num_devices=NUM_DEVICES, num_envs_per_device=4,
            num_steps=16, total_timesteps=10 * 16 * 4 * NUM_DEVICES, update_epochs=2,
            num_minibatches=2, eval_episodes=8, precision="float32", compilation_cache_dir="",
            log_train_interval=1, log_eval_interval=4, checkpoint_interval=5,
            updates_per_dispatch=per_dispatch)
        return build_trainer(resolve(config, jax.local_device_count()), max_traces=1)

    def logged(run_dir):
        skip = ("wall_time", "performance/")
        return [{k: v for k, v in record.items() if not k.startswith(skip)}
                for record in read_metrics(run_dir / "metrics.jsonl")]

    one, three = cartpole(1), cartpole(3)
    straight = run_train(one, tmp_path / "one")
    batched = run_train(three, tmp_path / "three")
    assert batched.updates_done == straight.updates_done == 10
    assert leaves_equal(jax.device_get(straight.runner), jax.device_get(batched.runner))
    records = logged(tmp_path / "three")
    assert records == logged(tmp_path / "one")
    assert [r["update"] for r in records if "train/actor_loss" in r] == list(range(1, 11))
    assert [r["update"] for r in records if "eval/rewards" in r] == [0, 4, 8, 10]
    assert CheckpointStore(tmp_path / "three" / "checkpoints").all_steps() == [5, 10]
    # Dispatches of 3, 1 (eval at 4), 1 (checkpoint at 5), 3, 2: one compiled function.
    assert three.trace_counts == {"update": 1, "eval": 1}

    # A stop request is polled after each dispatch: it stops after the first three updates.
    stopped = run_train(three, tmp_path / "stopped", stop_requested=stop_after_polls(2))
    assert stopped.stopped and stopped.updates_done == 3
    assert CheckpointStore(tmp_path / "stopped" / "checkpoints").latest_step() == 3
