"""Every environment variable terra_rl reads or sets goes through this module, so one place
says which ones matter. (The excavation env reads `DATASET_PATH` and `DATASET_SIZE` itself, in
`envs.params`, Terra's convention for a map dataset.)

- `JAX_PLATFORMS`: set by the preflight and the gates' `--jax-platforms` before JAX loads.
- `XLA_FLAGS`: read to leave an optimisation level set there alone.
- `WANDB_MODE`: W&B's mode when `--wandb_mode` is not given.
- `LD_LIBRARY_PATH`: where the preflight looks for the CUDA libraries.
- `SLURM_*`: whether `jax.distributed.initialize` can find its job step.
- `TERRA_RL_TEST_CACHE`: the test suite's and the gates' compilation cache.
- `GLIBC_TUNABLES`, `TERRA_RL_HUGE_PAGES`: read, and the first extended for a restart of the
  process, by `terra_rl.run.huge_pages`.
- Recorded, never acted on: the run manifest's `REPRODUCIBILITY_ENV_VARS`
  (`terra_rl.run.run_dir`) and the preflight report's list (`terra_rl.ops.runtime`).
- Passed on: the GPU wait wrapper's child gets this environment with `CUDA_VISIBLE_DEVICES`
  set (`terra_rl.ops.gpu_wait`); the preflight's smoke hides `DATASET_PATH` and
  `DATASET_SIZE` while it runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

TEST_CACHE = "TERRA_RL_TEST_CACHE"


def get(name: str) -> str | None:
    """The variable's value; None when unset or empty."""
    return os.environ.get(name) or None


def values(names: Iterable[str]) -> dict[str, str | None]:
    """Each named variable's value, None where unset (for reports)."""
    return {name: os.environ.get(name) for name in names}


def set_values(names: Iterable[str]) -> dict[str, str]:
    """The named variables that are set, with their values (for a run's manifest)."""
    return {name: os.environ[name] for name in names if name in os.environ}


def all_set(names: Iterable[str]) -> bool:
    return all(name in os.environ for name in names)


def process_environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process."""
    return dict(os.environ)


def set_value(name: str, value: str) -> None:
    os.environ[name] = value


@contextlib.contextmanager
def hidden(names: Iterable[str]) -> Iterator[None]:
    """Unset the named variables inside the block; restore them after it."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
