"""`train_mixed.py`: parse flags, set up the run directory, logging and checkpoints, train.

Bad input (flags, dataset, run directory, checkpoint) exits with code 2 and one line on
stderr, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax

from envs.dataset import DatasetError
from terra_rl.checkpointing import CheckpointError, CheckpointStore
from terra_rl.config import ConfigError, config_from_dict, resolve
from terra_rl.flags import parse_train_args
from terra_rl.logger import RunLogger, WandbLogger
from terra_rl.run_dir import (
    RunDirError,
    append_resume_record,
    create_run_dir,
    default_run_name,
    open_run_dir,
)
from terra_rl.trainer import build_trainer, train

PROG = "train_mixed.py"
WANDB_ID_FILE = "wandb_run_id"


def fail(message: str) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(2)


def setup_compilation_cache(directory: str) -> None:
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_train_args(argv)
    try:
        if args.resume is not None:
            run_dir, saved = open_run_dir(args.resume)
            config = dataclasses.replace(config_from_dict(saved), **args.overrides)
            config = resolve(config, jax.local_device_count())
            if CheckpointStore(run_dir / "checkpoints").latest_step() is None:
                fail(f"{run_dir} has no checkpoint to resume from; start a new run instead")
        else:
            config = resolve(args.config, jax.local_device_count())
            run_name = config.run_name or default_run_name(config.preset or "custom")
            config = dataclasses.replace(config, run_name=run_name)
        setup_compilation_cache(config.compilation_cache_dir)
        trainer = build_trainer(config)
        if args.resume is None:
            run_dir = create_run_dir(config.runs_dir, config.run_name, config.to_dict(),
                                     [PROG, *argv])
        else:
            append_resume_record(run_dir, [PROG, *argv])
    except (ConfigError, DatasetError, RunDirError, CheckpointError, ValueError) as error:
        fail(str(error))

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
    checkpoints = CheckpointStore(run_dir / "checkpoints", keep_last=config.keep_checkpoints)
    eval_keys = ("eval/rewards", "eval/positive_terminations", "eval/episode_return")
    with RunLogger(run_dir, config.num_updates, wandb=wandb, eval_keys=eval_keys) as logger:
        logger.message(f"run directory: {run_dir}")
        result = train(trainer, logger, checkpoints, resume=args.resume is not None)
        evals = result.last_eval_metrics
        summary = ", ".join(
            f"{name.removeprefix('eval/')} {evals[name]:.3g}"
            for name in ("eval/rewards", "eval/positive_terminations", "eval/episode_return")
            if name in evals
        )
        logger.message(
            f"done: {result.updates_done:,} updates, {result.env_steps:,} env steps; "
            f"last eval: {summary or 'none'}"
        )
    checkpoints.close()
    print(f"run directory: {run_dir.resolve()}")
    return 0
