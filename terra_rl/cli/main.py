"""`train_mixed.py`: parse flags, set up the run directory, logging and checkpoints, train.

Exit codes (docs/OPERATIONS.md):

    0   done: the run reached its total (or `--max_updates`)
    2   bad input (flags, dataset, run directory, checkpoint): one line on stderr, before
        anything is compiled or written
    3   `--resume` of a run that has nothing left to do (its checkpoint is at its total)
    75  stopped by SIGTERM or SIGUSR1: the update in flight was finished and checkpointed,
        metrics and W&B flushed; `--resume RUN_DIR` continues it (the sbatch scripts requeue)

With `--distributed`, `jax.distributed.initialize()` runs first, before any other JAX work.
Every process then resolves the same config against the global device count; process 0 picks
the run name and alone writes the run directory, W&B, metrics and checkpoints. Set-up errors
are shared (`distributed.first_error`), so all processes exit together with code 2 rather than
waiting in a collective for a process that has already exited.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import traceback
from pathlib import Path

import jax

from envs.dataset import DatasetError
from terra_rl.cli.flags import parse_train_args
from terra_rl.config import ConfigError, config_from_dict, resolve
from terra_rl.run import distributed
from terra_rl.run.checkpointing import CheckpointError, CheckpointStore
from terra_rl.run.logger import NullRunLogger, RunLogger, WandbLogger, truncate_metrics
from terra_rl.run.run_dir import (
    METRICS_FILE,
    RunDirError,
    append_resume_record,
    check_writable,
    config_changes,
    create_run_dir,
    default_run_name,
    open_run_dir,
    write_config,
)
from terra_rl.run.train_loop import train
from terra_rl.run.trainer import background_compiles_running, build_trainer
from terra_rl.run.warm_start import load_init_params

PROG = "train_mixed.py"
WANDB_ID_FILE = "wandb_run_id"
EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOTHING_TO_DO = 3
EXIT_STOPPED = 75  # EX_TEMPFAIL: try again later (resume)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Set by SIGTERM or SIGUSR1 (Slurm's preemption and `--signal`); the trainer polls it
    after every update. Later signals are ignored: the checkpoint in progress must finish
    (SIGKILL, after Slurm's grace period, is the hard stop)."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        del frame
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            print(f"{PROG}: {self.signal_name} received: stopping after the current update, "
                  "with a checkpoint", file=sys.stderr, flush=True)

    def __call__(self) -> bool:
        return self.signal_name is not None


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(code)


def setup_compilation_cache(directory: str) -> None:
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def cli() -> None:
    """`train_mixed.py`'s entry: `sys.exit(main())`, except while a compile still runs in
    the background.

    A stop with no eval waiting, or an error, during the first updates can come while the
    eval still compiles beside them (a stop with evals waiting waits for the compile and
    writes their records before its checkpoint), and the interpreter waits for that
    compile's thread before it exits (XLA cannot cancel a compile): for `cpu_demo` on the
    2-core CPU 10 s after the stop's checkpoint, and past Slurm's `KillWait` (30 s by
    default) for an eval whose compile takes longer, which would turn the checkpointed
    stop's exit 75 into a kill. By the time `main` returns or raises, everything the run
    writes is saved and closed (checkpoints are synchronous), so then the output is flushed
    and the process ends at once, with the same exit code (an uncaught exception: its
    traceback and 1; Ctrl-C: 130).
    """
    try:
        code = main()
    except BaseException as error:
        if not background_compiles_running():
            raise
        if isinstance(error, SystemExit):
            code = error.code
        else:
            traceback.print_exc()
            code = 128 + signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    if not background_compiles_running():
        sys.exit(code)
    if not isinstance(code, int):  # as sys.exit: None is 0, a message goes to stderr
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Train; returns the exit code (bad input raises SystemExit(2))."""
    stop = StopRequest()
    stop.install()  # before anything slow, so an early SIGTERM is not fatal
    try:
        return _main(sys.argv[1:] if argv is None else argv, stop)
    finally:
        stop.restore()


def _main(argv: list[str], stop: StopRequest) -> int:
    args = parse_train_args(argv)
    if args.distributed.enabled:
        try:
            distributed.initialize(args.distributed)
        except distributed.DistributedError as error:
            fail(str(error))
    writer = distributed.is_writer()
    setup_errors = (ConfigError, DatasetError, RunDirError, CheckpointError, ValueError)

    error = ""
    try:
        if args.resume is not None:
            run_dir, saved = open_run_dir(args.resume)
            config = dataclasses.replace(config_from_dict(saved), **args.overrides)
            config = resolve(config, jax.device_count())
        else:
            config = resolve(args.config, jax.device_count())
            check_writable(Path(config.runs_dir))
        setup_compilation_cache(config.compilation_cache_dir)
    except setup_errors as exc:
        error = str(exc)
    stop_if_any_failed(error)

    error, latest = "", 0
    try:
        if args.resume is not None:
            with CheckpointStore(run_dir / "checkpoints", read_only=True) as store:
                latest = store.latest_step()
            if latest is None:
                raise CheckpointError(
                    f"{run_dir} has no checkpoint to resume from; start a new run instead"
                )
            end = min(config.num_updates, args.max_updates or config.num_updates)
            if latest >= end:
                fail(f"{run_dir} is already at update {latest} of {end}: nothing to do; raise "
                     "--total_timesteps (or --max_updates) to train further", EXIT_NOTHING_TO_DO)
        else:
            run_name = config.run_name or default_run_name(config.preset or "custom")
            config = dataclasses.replace(config, run_name=distributed.broadcast_text(run_name))
        trainer = build_trainer(config)
        init_params = None
        if args.resume is None and config.init_params:
            init_params, init_step = load_init_params(
                config.init_params, config.init_params_checkpoint,
                jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                             trainer.abstract_runner().policy.params),
            )
        if args.resume is None:
            run_dir = Path(config.runs_dir) / config.run_name
            if writer:
                run_dir = create_run_dir(config.runs_dir, config.run_name, config.to_dict(),
                                         [PROG, *argv])
    except setup_errors as exc:
        error = str(exc)
    stop_if_any_failed(error)

    if args.resume is not None and writer:
        resume_run_dir(run_dir, saved, config, latest, [PROG, *argv])

    checkpoints = CheckpointStore(run_dir / "checkpoints", keep_last=config.keep_checkpoints,
                                  best_metric=config.best_metric, read_only=not writer)
    eval_keys = ("eval/completion_rate", "eval/first_episode_return", "eval/rewards")
    logger = make_logger(run_dir, config, eval_keys) if writer else NullRunLogger()
    with logger:
        logger.message(f"run directory: {run_dir}")
        if init_params is not None:
            logger.message(f"policy parameters from {config.init_params} (update {init_step})")
        try:
            result = train(trainer, logger, checkpoints, resume=args.resume is not None,
                           stop_after=args.max_updates, stop_requested=stop,
                           init_params=init_params)
        except CheckpointError as error:  # e.g. a checkpoint of an incompatible network
            fail(str(error))
        if result.stopped:
            logger.message(
                f"stopped by {stop.signal_name} at update {result.updates_done} of "
                f"{config.num_updates}; continue with: {PROG} --resume {run_dir}"
            )
            checkpoints.close()
            return EXIT_STOPPED
        evals = result.last_eval_metrics
        summary = ", ".join(
            f"{name.removeprefix('eval/')} {evals[name]:.3g}"
            for name in eval_keys
            if name in evals
        )
        logger.message(
            f"done: {result.updates_done:,} updates, {result.env_steps:,} env steps; "
            f"last eval: {summary or 'none'}"
        )
    checkpoints.close()
    if writer:  # the headline last, where a user looks first
        print(f"run directory: {run_dir.resolve()}")
        if "eval/completion_rate" in evals:
            print(completion_line(evals, config.eval_episodes))
    return EXIT_OK


def resume_run_dir(run_dir: Path, saved: dict, config, latest: int, argv: list[str]) -> None:
    """Prints the flags a resume changes and persists them in config.json (the next resume
    starts from them); cuts metrics.jsonl back to the checkpoint, so the updates a crash
    lost are logged once, by the resumed run; records the resume in the manifest."""
    changes = config_changes(saved, config.to_dict())
    print(f"resuming {run_dir} from update {latest}; "
          f"config changes: {'; '.join(changes) if changes else 'none'}")
    if changes:
        write_config(run_dir, config.to_dict())
    dropped = truncate_metrics(run_dir / METRICS_FILE, latest)
    if dropped:
        print(f"dropped {dropped} metrics.jsonl record(s) after update {latest} (not in the "
              "checkpoint; the resumed run logs them again)")
    append_resume_record(run_dir, argv)


def completion_line(evals: dict[str, float], episodes: int) -> str:
    """The run's headline: completion on the held-out maps, greedy and sampled."""
    parts = [f"greedy {evals['eval/completion_rate']:.1%}"]
    if "eval_sampled/completion_rate" in evals:
        parts.append(f"sampled {evals['eval_sampled/completion_rate']:.1%}")
    return f"held-out completion rate ({episodes} maps): {', '.join(parts)}"


def stop_if_any_failed(error: str) -> None:
    """Exit 2 with `error`, or with another process's error (a collective with several
    processes, so every process stops at the same point)."""
    error = distributed.first_error(error)
    if error:
        fail(error)


def make_logger(run_dir: Path, config, eval_keys: tuple[str, ...]) -> RunLogger:
    """metrics.jsonl, W&B (continuing the run's W&B run on resume) and the progress line."""
    wandb_id_path = run_dir / WANDB_ID_FILE
    wandb = WandbLogger(
        run_dir,
        project=config.wandb_project,
        entity=config.wandb_entity or None,
        name=config.run_name,
        tags=config.wandb_tags,
        config=config.to_dict(),
        mode=config.wandb_mode or None,
        run_id=wandb_id_path.read_text().strip() if wandb_id_path.exists() else None,
    )
    if wandb.run_id:
        wandb_id_path.write_text(wandb.run_id)
    return RunLogger(run_dir, config.num_updates, wandb=wandb, eval_keys=eval_keys)
