"""The memory maps of a long-lived test process, and their release.

XLA:CPU maps each compiled program's code into memory regions of its own, and keeps them
while jax's caches hold the program. A pytest-xdist worker runs half the suite's files in one
process: three heavy files left 17,400 maps, and a worker that passes the kernel's limit
(`vm.max_map_count`, 65,530 by default) segfaults inside its next compile ("Fatal Python
error: Segmentation fault" in `backend_compile_and_load`; reproduced with the limit lowered
to 10,000). `release_if_crowded` clears jax's caches when the count nears the limit: the
maps drop to a few hundred, and a function used again compiles again."""

from __future__ import annotations

import gc
from pathlib import Path

import jax

DEFAULT_LIMIT = 65_530


def map_count() -> int:
    """The memory maps of this process (lines of /proc/self/maps; 0 where there is none)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def map_limit() -> int:
    """The kernel's limit on a process's memory maps (`vm.max_map_count`)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return DEFAULT_LIMIT


def release_if_crowded(share: float) -> bool:
    """Clears jax's caches (and collects garbage) when the maps exceed `share` of the limit;
    whether it did."""
    if map_count() <= share * map_limit():
        return False
    jax.clear_caches()
    gc.collect()
    return True
