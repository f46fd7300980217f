"""Shared fixtures. Compiled functions are session-scoped: on a 2-core CPU, XLA compiles
dominate test time, so every test reuses one of two shape families (16x16 and 32x32)."""

from __future__ import annotations

import os
from pathlib import Path

# Four CPU devices for the multi-device trainer tests; set before jax initialises.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
# The suite is compile-bound: XLA:CPU's LLVM at -O0 compiles about a third faster, and
# without fast-math its arithmetic is the same IEEE arithmetic, only less vectorised. The
# test processes and the ones they start (exported) use it; training and `make gates` keep
# the default. Measured in docs/PERFORMANCE.md ("The test command").
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"

import jax  # noqa: E402
import pytest  # noqa: E402

# A persistent compilation cache outside the repo makes reruns cheap for the processes the
# tests start (train_mixed.py, the scripts, the distributed workers): one directory per
# pytest-xdist worker, since jax writes an entry without a lock or an atomic rename, exported
# as TERRA_RL_TEST_CACHE for them. The test processes themselves compile without it: in a
# pytest-xdist worker that had run other test files, XLA:CPU aborted (or segfaulted) while
# serializing an executable for the cache, and in another run while deserializing one,
# deterministically in clean-clone CI runs (2026-11-25), which then hung on the crashed
# worker. The same tests in a fresh process pass with the cache. `jax_compilation_cache_dir`
# stays set, as the directory tests hand to their subprocesses; with the cache disabled here,
# an in-process `main()` that sets a directory cannot turn it on either.
_CACHE_DIR = os.environ.get(
    "TERRA_RL_TEST_CACHE", str(Path.home() / ".cache" / "terra_rl" / "jax-test-cache")
)
if os.environ.get("PYTEST_XDIST_WORKER") and not _CACHE_DIR.endswith(
        os.environ["PYTEST_XDIST_WORKER"]):
    _CACHE_DIR = os.path.join(_CACHE_DIR, os.environ["PYTEST_XDIST_WORKER"])
os.environ["TERRA_RL_TEST_CACHE"] = _CACHE_DIR
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_enable_compilation_cache", False)

from envs import EnvConfig, ExcavationEnv  # noqa: E402
from terra_rl.validation import small  # noqa: E402


# The 16x16 family is the validation gates' (terra_rl/validation/small.py): the same objects,
# so gates and tests share compiled functions and the random rollout.
@pytest.fixture(scope="session")
def env16():
    """Mixed tracked/wheeled env on 16x16 maps, short episodes."""
    return small.small_env()


@pytest.fixture(scope="session")
def params16(env16):
    """32 generated foundations and trenches maps."""
    return small.small_params()


@pytest.fixture(scope="session")
def batch16(env16, params16):
    return small.small_batch()


@pytest.fixture(scope="session")
def env32():
    return ExcavationEnv(EnvConfig(map_size=32, max_steps=60))


@pytest.fixture(scope="session")
def step32(env32):
    """Jitted single-env step on 32x32 maps (the hand-built-state family)."""
    return jax.jit(env32.step_no_reset)
