"""The host loop: call the trainer's pmapped update `num_updates` times, logging,
evaluating and checkpointing at their intervals.

Host transfers happen only for a log, an eval, a checkpoint or the final return.

Multi-process runs (`terra_rl.run.distributed`): every process runs this same loop, so every
collective (the update, evals, the checkpoint gather) happens on all processes in the same
order; only process 0 writes (its logger and checkpoint store; the others get a
`NullRunLogger` and a read-only store).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from terra_rl.algo.update import RunnerState
from terra_rl.config import TrainConfig
from terra_rl.nets.parameters import count_parameters
from terra_rl.run import distributed
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.device_metrics import fetch_metrics, metrics_row
from terra_rl.run.logger import RunLogger
from terra_rl.run.trainer import Trainer


@dataclasses.dataclass
class TrainResult:
    runner: RunnerState
    updates_done: int
    env_steps: int
    last_train_metrics: dict[str, float]
    last_eval_metrics: dict[str, float]
    compile_seconds: float
    stopped: bool = False
    """A stop request (a signal) ended the run before `num_updates`; `updates_done` is
    checkpointed (or 0 when it came before the first update)."""
    resumed_from: int = 0
    """The update the run started from (the checkpoint's, 0 for a fresh run)."""


def _improves(value: Any, best: float | None) -> bool:
    """Whether an eval `value` of the best-checkpoint metric beats `best` (higher is better;
    NaN and missing values never do)."""
    finite = isinstance(value, int | float) and math.isfinite(value)
    return finite and (best is None or value > best)


MAX_DEFERRED_EVALS = 8
"""Evals that may wait for the eval's background compile, each with a host copy of the runner
state; when one more comes due, the loop waits for the compile."""


def _is_due(done_updates: int, interval: int, is_last: bool) -> bool:
    return is_last or (interval > 0 and done_updates % interval == 0)


def dispatch_size(config: TrainConfig, done: int, last_update: int) -> int:
    """Updates in the next dispatch after `done`: at most `updates_per_dispatch`, ending at
    the next eval, checkpoint or cache clear (host work between updates) or `last_update`.
    Train logs may fall inside a dispatch: every update's metrics come back."""
    end = min(done + config.updates_per_dispatch, last_update)
    for interval in (config.log_eval_interval, config.checkpoint_interval,
                     config.cache_clear_interval):
        if interval > 0:
            end = min(end, (done // interval + 1) * interval)
    return end - done


def train(
    trainer: Trainer,
    logger: RunLogger,
    checkpoints: CheckpointStore,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    stop_requested: Callable[[], bool] | None = None,
    init_params: Any = None,
) -> TrainResult:
    """Run updates until `num_updates` (or `stop_after` updates in total, for tests and
    staged runs). With `resume`, continue from the latest checkpoint; otherwise start from
    `init_params` (host parameters without a device axis, `terra_rl.run.warm_start`) if given.

    Updates run `updates_per_dispatch` at a time (`dispatch_size`); every update's metrics
    are logged on the log interval. `stop_requested` is polled after every dispatch (and
    once after compiling): when it turns true (a SIGTERM), the dispatch's last update is
    logged and checkpointed and the run returns with `stopped`. The best checkpoint
    (`config.best_metric`, higher is better) is saved at every eval that improves it, between
    periodic checkpoints too.

    A checkpoint of update N is saved only once every record up to N (train logs, evals) is
    written to metrics.jsonl and flushed to disk, so a resume from it, which cuts the file
    back to N and logs what follows again, finds each record exactly once. Records that wait
    for the eval's background compile therefore hold back a checkpoint (periodic, best or a
    stop's) until the compile is done and they are written.

    Every process of a multi-process run calls this with the same config; `logger` and
    `checkpoints` write only on process 0 (`distributed.is_writer`); all processes restore.
    A stop request on any process stops them all after the same update.
    """
    config = trainer.config
    steps_per_update = config.env_steps_per_update
    num_updates = config.num_updates
    last_update = num_updates if stop_after is None else min(stop_after, num_updates)

    setup_start = time.perf_counter()
    start = 0
    if resume:
        # Shapes and dtypes are all restore needs: no init to compile or run.
        target = trainer.abstract_runner()
        restored, _ = checkpoints.restore(None, target)
        runner = trainer.shard(restored)
        start = int(np.asarray(restored.counters.update).reshape(-1)[0])
        logger.message(f"resumed at update {start} ({start * steps_per_update:,} env steps)")
        state_note = f"restore {time.perf_counter() - setup_start:.1f} s"
    else:
        beside = jax.process_count() == 1
        compiling = beside and trainer.compiles_update_beside_init()
        if beside:
            # The init compiles on another thread while this one lowers the update from the
            # init's output shapes. On an accelerator the update then compiles on a third
            # thread beside the init's compile; on a CPU after it, when the init's compile
            # memory is freed and its cores are free (docs/PERFORMANCE.md). pmap lowers
            # host-local shapes of one process only.
            trainer.start_init_compile()
            if compiling:
                trainer.start_update_compile(trainer.abstract_runner())
            else:
                trainer.lower_update(trainer.abstract_runner())
        runner = trainer.init_runner()
        if init_params is not None:
            runner = trainer.with_policy_params(runner, init_params)
        beside_note = ", the update compiling beside it" if compiling else (
            ", the update lowered beside it" if beside else "")
        state_note = f"init {time.perf_counter() - setup_start:.1f} s{beside_note}"
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                          runner.policy.params)
    processes = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
    logger.message(
        f"{config.preset or 'custom'}: {num_updates:,} updates x {steps_per_update:,} env steps "
        f"on {trainer.num_devices} {trainer.devices[0].platform} device(s){processes}, "
        f"{count_parameters(params):,} parameters"
    )

    trainer.compile_update(runner)
    compile_seconds = trainer.compile_seconds
    logger.message(f"update compiled in {compile_seconds:.1f} s")
    baseline_eval = start == 0 and config.log_eval_interval > 0
    # With one process, the eval compiles beside the first updates, and the untrained
    # policy's eval (its parameters kept on the host: the runner is donated) runs once the
    # compile is done. Processes of a multi-process run must meet in every collective in the
    # same order, so they compile it first.
    background_eval = jax.process_count() == 1 and not trainer.eval_compiled()
    baseline_params = None
    if baseline_eval or any(_is_due(done, config.log_eval_interval, done == num_updates)
                            for done in range(start + 1, last_update + 1)):
        if background_eval:
            trainer.start_eval_compile(runner)
            if baseline_eval:
                baseline_params = jax.device_get(runner.policy.params)
            eval_note = "eval compiling beside the first updates"
        else:
            trainer.compile_eval(runner)
            eval_note = f"eval compiled in {trainer.eval_compile_seconds:.1f} s"
        # Where the wait before the first update went (the update's compile is the largest
        # part, not all of it; docs/PERFORMANCE.md).
        logger.message(
            f"{eval_note}; first update after {time.perf_counter() - setup_start:.1f} s "
            f"({state_note})"
        )
    # Processes compile at different speeds; meet before the first collective.
    distributed.barrier("compiled")

    def stop_now() -> bool:
        return distributed.any_process(bool(stop_requested and stop_requested()))

    if stop_now():  # a signal during compile: nothing new to save
        logger.message(f"stop requested before update {start + 1}; nothing to checkpoint")
        return TrainResult(runner, start, start * steps_per_update, {}, {}, compile_seconds,
                           stopped=True, resumed_from=start)

    train_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}
    best_value = checkpoints.best_value
    compile_logged = False
    loop_start = time.perf_counter()
    # A wait for the eval's background compile is compile time, not training time.
    waited_before = trainer.eval_compile_wait_seconds
    # Train logs wait while an eval before them does (W&B takes steps in order only).
    pending_train_logs: list[tuple[int, dict[str, float]]] = []
    # Evals that came due while their program still compiled in the background: (update,
    # env steps, that update's runner on the host), oldest first. They run once the compile
    # is done, so the updates go on meanwhile instead of waiting for it; train logs after
    # them wait for them.
    deferred_evals: list[tuple[int, int, Any]] = []

    def log_train_up_to(update: float) -> None:
        while pending_train_logs and pending_train_logs[0][0] <= update:
            finished, row = pending_train_logs.pop(0)
            logger.log_train(finished, finished * steps_per_update, row)

    def log_baseline_eval(runner: RunnerState, updates_beside: int) -> dict[str, float]:
        """The untrained policy's eval, the baseline every later eval is compared with."""
        nonlocal baseline_params
        params = None if baseline_params is None else trainer.shard(baseline_params)
        metrics = trainer.evaluate(runner, 0, params)
        if baseline_params is not None:
            logger.message(f"eval compiled in {trainer.eval_compile_seconds:.1f} s, beside "
                           f"the first {updates_beside} updates")
        logger.log_eval(0, 0, metrics)
        baseline_params = None
        return metrics

    def save_checkpoint(update: int, host_state: Any, metrics: dict[str, float] | None,
                        periodic: bool, best: bool) -> None:
        """Saves `update`'s state (periodic: the last-K checkpoint, else only the best), once
        every record up to `update` is written: they are flushed to disk first, so no
        checkpoint covers a record that a crash could still lose. Every process calls it;
        only process 0 writes."""
        logger.sync()
        if distributed.is_writer():
            if periodic:
                checkpoints.save(update, host_state, config.to_dict(), metrics, best=best)
            else:
                checkpoints.save_best(update, host_state, config.to_dict(), metrics)
        distributed.barrier("checkpoint")  # the others wait here, not in a collective

    def log_deferred_evals(best_value: float | None) -> tuple[dict[str, float], float | None]:
        """The deferred evals, oldest first, each of the parameters of its update and logged
        after that update's train logs; a new best saves that update's state, as it would
        have then. Returns the last one's metrics and the best value."""
        while deferred_evals:
            update, env_steps, host_state = deferred_evals.pop(0)
            metrics = trainer.evaluate(runner, update, trainer.shard(host_state.policy.params))
            log_train_up_to(update)
            logger.log_eval(update, env_steps, metrics)
            if _improves(metrics.get(config.best_metric), best_value):
                best_value = metrics[config.best_metric]
                save_checkpoint(update, host_state, metrics, periodic=False, best=True)
        return metrics, best_value

    if baseline_eval and baseline_params is None:
        eval_metrics = log_baseline_eval(runner, 0)
    last_log_time, last_log_update = time.perf_counter(), start
    done, stopped = start, False
    while done < last_update:
        first = done
        count = dispatch_size(config, done, last_update)
        runner, device_metrics = trainer.run_updates(runner, count)
        done = first + count
        env_steps = done * steps_per_update
        stopped = done < last_update and stop_now()
        is_last = done == last_update or stopped
        logged = [finished for finished in range(first + 1, done + 1)
                  if _is_due(finished, config.log_train_interval, finished == done and is_last)]
        eval_due = _is_due(done, config.log_eval_interval, done == num_updates)
        checkpoint_due = _is_due(done, config.checkpoint_interval, is_last)
        if logged:
            # Fetching waits for the dispatch; its updates share one time per update.
            host = fetch_metrics(device_metrics)
            rows = {finished: metrics_row(host, finished - first - 1) for finished in logged}
            now = time.perf_counter()
            seconds_per_update = (now - last_log_time) / (done - last_log_update)
            # Everything since the compiles (evals, checkpoints, logging) counted in.
            waited = trainer.eval_compile_wait_seconds - waited_before
            for finished, train_metrics in rows.items():
                train_metrics["performance/seconds_per_update"] = seconds_per_update
                train_metrics["performance/steps_per_second"] = (
                    steps_per_update / seconds_per_update)
                train_metrics["performance/wall_steps_per_second"] = (
                    (done - start) * steps_per_update / (now - loop_start - waited))
                if not compile_logged:
                    train_metrics["performance/compile_seconds"] = compile_seconds
                    compile_logged = True
                pending_train_logs.append((finished, train_metrics))
        eval_ready = trainer.eval_compiled()
        if (eval_due and not eval_ready and len(deferred_evals) < MAX_DEFERRED_EVALS
                and not is_last and not checkpoint_due):
            host_state = distributed.gather_to_host(runner, trainer.sharding)
            deferred_evals.append((done, env_steps, host_state))
            eval_due = False
        # The records waiting for the eval's compile are written once it is done, or before
        # an eval that runs now, a checkpoint or the end (the last update or a stop): these
        # wait for the compile, since a checkpoint of `done` must follow every record up to
        # `done` (a resume logs only the updates after it again).
        catch_up = eval_ready or eval_due or checkpoint_due or is_last
        baseline_due = baseline_params is not None and catch_up
        deferred_due = bool(deferred_evals) and catch_up
        if stopped and not eval_ready and (baseline_due or deferred_due or eval_due):
            logger.message(f"stop requested at update {done}: waiting for the eval's compile, "
                           "whose records come before the checkpoint")
        if baseline_due:
            eval_metrics = log_baseline_eval(runner, done - start)
        if deferred_due:
            eval_metrics, best_value = log_deferred_evals(best_value)
        if baseline_params is None and not deferred_evals:
            log_train_up_to(math.inf)
        new_best = False
        if eval_due:
            eval_metrics = trainer.evaluate(runner, done)
            logger.log_eval(done, env_steps, eval_metrics)
            new_best = _improves(eval_metrics.get(config.best_metric), best_value)
            if new_best:
                best_value = eval_metrics[config.best_metric]
        if logged or eval_due:
            logger.progress(done, env_steps, train_metrics.get("performance/steps_per_second"))
        if checkpoint_due or new_best:
            # Every process takes part in the gather. Nothing waits for the eval's compile
            # here (`catch_up`): every record up to `done` is written.
            host_state = distributed.gather_to_host(runner, trainer.sharding)
            save_checkpoint(done, host_state, eval_metrics if eval_due else None,
                            periodic=checkpoint_due, best=new_best)
        if config.cache_clear_interval and done % config.cache_clear_interval == 0:
            jax.clear_caches()
        if logged or eval_due or checkpoint_due or new_best or baseline_due or deferred_due:
            # Restart the clock after host work, so steps/s measures training only.
            last_log_time, last_log_update = time.perf_counter(), done
        if stopped:
            logger.message(f"stop requested: checkpointed update {done} of {num_updates}")
            break
    return TrainResult(
        runner=runner,
        updates_done=done,
        env_steps=done * steps_per_update,
        last_train_metrics=train_metrics,
        last_eval_metrics=eval_metrics,
        compile_seconds=compile_seconds,
        stopped=stopped,
        resumed_from=start,
    )
