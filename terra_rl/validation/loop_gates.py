"""Host-loop gates: one real update of the tiny config through `terra_rl.run.train_loop.train`,
and the step accounting of every preset on 1, 2 and 4 devices."""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from terra_rl.validation import small
from terra_rl.validation.gate import GateOptions, require

ACCOUNTING_DEVICES = (1, 2, 4)
ACCOUNTING_TOTALS = (1, 1000, 65_536, 1_000_001, 50_000_000_000)


# --------------------------------------------------------------------------- one real update


@dataclasses.dataclass(frozen=True)
class SmokeRun:
    config: object
    updates_done: int
    env_steps: int
    records: tuple[dict, ...]
    params_before: object
    params_after: object
    update_counter: int
    checkpoint_steps: tuple[int, ...]
    train_seconds: float
    """Wall time of the whole `train` call (restore, compile, update, logging, checkpoint),
    timed outside the trainer."""
    compile_seconds: float


@functools.cache
def smoke_run() -> SmokeRun:
    """One update of the tiny config through the real host loop (`terra_rl.run.train_loop.train`):
    trainer built as `train_mixed.py` builds it, metrics logged to metrics.jsonl, a
    checkpoint written; run once per process in a temporary run directory."""
    from terra_rl.run.checkpointing import CheckpointStore
    from terra_rl.run.logger import RunLogger, read_metrics
    from terra_rl.run.train_loop import train
    from terra_rl.run.trainer import build_trainer

    config = small.smoke_config(log_train_interval=1, log_eval_interval=0, checkpoint_interval=0)
    trainer = build_trainer(config)
    # The host loop compiles ahead of time, which needs jit even under --disable-jit.
    with jax.disable_jit(False), tempfile.TemporaryDirectory() as run_dir:
        params_before = jax.device_get(trainer.init_runner().policy.params)
        store = CheckpointStore(Path(run_dir) / "checkpoints")
        with RunLogger(run_dir, config.num_updates, stream=io.StringIO()) as logger:
            start = time.perf_counter()
            result = train(trainer, logger, store, stop_after=1)
            train_seconds = time.perf_counter() - start
        steps = tuple(store.all_steps())
        store.close()
        records = tuple(read_metrics(Path(run_dir) / "metrics.jsonl"))
    return SmokeRun(
        config=config,
        updates_done=result.updates_done,
        env_steps=result.env_steps,
        records=records,
        params_before=params_before,
        params_after=jax.device_get(result.runner.policy.params),
        update_counter=int(np.asarray(result.runner.counters.update).reshape(-1)[0]),
        checkpoint_steps=steps,
        train_seconds=train_seconds,
        compile_seconds=result.compile_seconds,
    )


def first_update_smoke(options: GateOptions) -> str:
    run = smoke_run()
    require(run.updates_done == 1 and run.update_counter == 1, "the update did not complete")
    train_records = [r for r in run.records if "train/actor_loss" in r]
    require(
        [r["update"] for r in train_records] == [1],
        f"train records of updates {[r['update'] for r in train_records]}, expected [1]",
    )
    metrics = train_records[0]
    required = (
        "train/actor_loss",
        "train/value_loss",
        "train/entropy",
        "train/approx_kl",
        "train/clip_fraction",
        "train/grad_norm",
        "train/reward",
        "train/timeout_rate",
        "sched/entropy_coef",
        "sched/lr",
        "performance/steps_per_second",
    )
    missing = [name for name in required if name not in metrics]
    require(not missing, f"metrics {missing} were not logged")
    # metrics.jsonl stores NaN and inf as null.
    bad = [
        name
        for name, value in metrics.items()
        if value is None or (isinstance(value, float) and not math.isfinite(value))
    ]
    require(not bad, f"non-finite metrics {bad}")
    overflows, scale = metrics.get("precision/overflow_steps"), metrics.get("precision/loss_scale")
    require(
        (overflows, scale) == (0, 1.0),
        f"float32: {overflows} skipped minibatch updates and loss scale {scale}, expected 0 and 1",
    )
    require(metrics["train/timeout_rate"] > 0, "no timeout inside the rollout")
    before, after = jax.tree.leaves(run.params_before), jax.tree.leaves(run.params_after)
    require(
        any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True)),
        "the update did not change the parameters",
    )
    require(all(np.isfinite(leaf).all() for leaf in after), "parameters are not finite")
    require(run.checkpoint_steps == (1,), f"checkpoints {run.checkpoint_steps}, expected (1,)")
    return (
        f"1 update x {run.config.env_steps_per_update} env steps, {len(metrics)} finite "
        f"metrics, actor loss {metrics['train/actor_loss']:.4f}, checkpoint 1 written"
    )


# --------------------------------------------------------------------------- accounting


def training_accounting(options: GateOptions) -> str:
    from terra_rl.config import PRESETS, ConfigError, resolve

    checked = rejected = 0
    for name, preset in PRESETS.items():
        for devices in ACCOUNTING_DEVICES:
            for total in ACCOUNTING_TOTALS:
                where = f"{name} on {devices} device(s), total {total}"
                config = dataclasses.replace(preset, num_devices=devices, total_timesteps=total)
                if total < config.env_steps_per_update:
                    try:
                        resolve(config, devices)
                    except ConfigError as error:
                        require("less than one update" in str(error), f"{where}: {error}")
                        rejected += 1
                        continue
                    require(False, f"{where}: a total below one update was accepted")
                c = resolve(config, devices)
                require(c.num_envs == c.num_envs_per_device * devices, f"{where}: num_envs")
                require(
                    c.env_steps_per_update == c.num_steps * c.num_envs,
                    f"{where}: env_steps_per_update",
                )
                covered = c.num_updates * c.env_steps_per_update
                require(
                    covered >= total > covered - c.env_steps_per_update,
                    f"{where}: {c.num_updates} updates cover {covered} steps",
                )
                require(
                    c.minibatch_size * c.num_minibatches == c.num_envs_per_device * c.num_steps,
                    f"{where}: minibatches do not split the device's batch",
                )
                checked += 1
    solo = dataclasses.replace(PRESETS["solo_excavator"], num_devices=4)
    require(
        (solo.env_steps_per_update, solo.num_updates) == (131_072, 250),
        f"solo_excavator on 4 devices: {solo.env_steps_per_update} steps per update, "
        f"{solo.num_updates} updates (expected 131072 and 250)",
    )

    # steps/s as the host loop logs it: env steps per update over seconds per update.
    run = smoke_run()
    metrics = next(r for r in run.records if "performance/steps_per_second" in r)
    steps_per_update = run.config.env_steps_per_update
    require(
        steps_per_update == 64 and run.env_steps == steps_per_update,
        f"the smoke run logged {run.env_steps} env steps for 1 update of {steps_per_update}",
    )
    require(
        metrics["env_step"] == metrics["update"] * steps_per_update,
        "logged env_step is not update x env_steps_per_update",
    )
    rate = steps_per_update / metrics["performance/seconds_per_update"]
    require(
        math.isclose(metrics["performance/steps_per_second"], rate, rel_tol=1e-9),
        "steps_per_second is not env_steps_per_update / seconds_per_update",
    )
    # Against a clock outside the trainer: the update took part of the train call after its
    # compile, so its rate is at least the call's; the wall-clock rate (host work included)
    # is at most the update-only one.
    outside = run.train_seconds - run.compile_seconds
    require(
        0 < metrics["performance/seconds_per_update"] <= outside,
        f"seconds_per_update {metrics['performance/seconds_per_update']:.3f} is not within "
        f"the {outside:.3f} s the train call spent after compiling",
    )
    require(
        metrics["performance/compile_seconds"] == run.compile_seconds,
        "the logged compile time is not the trainer's",
    )
    wall_rate = metrics["performance/wall_steps_per_second"]
    require(
        steps_per_update / outside <= wall_rate <= metrics["performance/steps_per_second"],
        f"wall steps/s {wall_rate:.1f} is not between the train call's "
        f"{steps_per_update / outside:.1f} and the update-only "
        f"{metrics['performance/steps_per_second']:.1f}",
    )
    return (
        f"{checked} preset x devices {ACCOUNTING_DEVICES} x total configs cover their "
        f"totals, {rejected} below one update rejected; the smoke update (run here) logs "
        f"steps/s = {steps_per_update} env steps / seconds per update"
    )
