"""The tiny `train_mixed.py` run that the preemption, kill-point and resume-flag tests start
as real processes: cpu_demo's maps on 4 CPU devices (conftest's XLA_FLAGS) with the smoke
shapes and without the env's costly inputs, on the suite's compilation cache."""

from __future__ import annotations

from pathlib import Path

import jax

from terra_rl.validation.small import PLAIN_ENV_FLAGS, SMOKE_FIELDS

NUM_DEVICES = 4
STEPS_PER_UPDATE = SMOKE_FIELDS["num_envs_per_device"] * SMOKE_FIELDS["num_steps"] * NUM_DEVICES
# cpu_demo's own settings: not passed as flags.
CPU_DEMO_FIELDS = ("preset", "wandb_mode", "compilation_cache_dir", "map_types", "curriculum",
                   "use_action_mask", "use_compass", "use_dig_distance", "use_pose_distance",
                   "mask_cut_off_digs", "stall_steps")


def cache_flags() -> list[str]:
    """The suite's persistent compilation cache (tests/conftest.py), for the processes."""
    return ["--compilation_cache_dir", jax.config.jax_compilation_cache_dir or ""]


def train_flags(runs_dir: Path, run_name: str, updates: int, eval_interval: int = 4,
                checkpoint_interval: int = 2) -> list[str]:
    """A new run's flags: `updates` updates, every one logged."""
    flags = ["--config", "cpu_demo", "--runs_dir", str(runs_dir), "--run_name", run_name,
             "--wandb_mode", "disabled", *cache_flags()]
    for name, value in SMOKE_FIELDS.items():
        if name not in CPU_DEMO_FIELDS:
            flags += [f"--{name}", str(value)]
    return flags + [*PLAIN_ENV_FLAGS, "--num_devices", str(NUM_DEVICES), "--total_timesteps",
                    str(updates * STEPS_PER_UPDATE), "--log_train_interval", "1",
                    "--log_eval_interval", str(eval_interval), "--checkpoint_interval",
                    str(checkpoint_interval)]
