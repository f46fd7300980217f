"""A run's random keys from its seed, derived inside the programs that use them.

The seed's key is built on the host (`seed_key`), and the init and the eval fold and split
it themselves (`device_key`). Drawing those keys with eager `jax.random` calls compiled a
Threefry program per call before the init could start: about 0.3 s of a cold CartPole
process's start (docs/PERFORMANCE.md). The keys are bitwise the eager ones: Threefry is
integer arithmetic, the same inside a program as outside it.
"""

from __future__ import annotations

import jax
import numpy as np

INIT_STREAM = 0
"""`fold_in` data of the keys every device's envs start from (split over devices)."""
PARAMS_STREAM = 1
"""`fold_in` data of the parameters' key (the same on every device)."""
EVAL_STREAM = 2
"""`fold_in` data of the eval's keys (split over devices; the same at every eval)."""


def seed_key(seed: int) -> np.ndarray:
    """uint32 [2]: `jax.random.PRNGKey(seed)` without running a program. With 64-bit types
    off (jax's default) PRNGKey keeps the seed's low 32 bits: `[0, seed mod 2**32]`."""
    if not -(2**63) <= seed < 2**63:
        raise OverflowError(f"seed {seed} is outside the 64-bit range jax.random.PRNGKey takes")
    return np.array([0, seed & 0xFFFFFFFF], np.uint32)


def validation_key(seed: int) -> np.ndarray:
    """uint32 [2]: the validation eval's run key, `[1, seed mod 2**32]`, never a `seed_key`
    (whose first word is 0): validation episodes draw other spawns and actions than the
    reported eval's, from the same program."""
    return seed_key(seed) | np.array([1, 0], np.uint32)


def device_key(run_key: jax.Array, stream: int, axis_name: str) -> jax.Array:
    """uint32 [2], inside a `jax.pmap` over `axis_name`: this device's row of
    `jax.random.split(jax.random.fold_in(run_key, stream), number of devices)`."""
    keys = jax.random.split(jax.random.fold_in(run_key, stream), jax.lax.axis_size(axis_name))
    return keys[jax.lax.axis_index(axis_name)]
