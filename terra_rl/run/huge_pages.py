"""Huge pages for the host memory of XLA:CPU's buffers, set before the process starts.

Each call of a compiled update allocates its temporary buffers afresh (the rollout's stored
observations among them), and glibc's malloc hands blocks that large out as new mappings
that the kernel fills page by page on first touch. At 64 envs x 64x64 on a CPU that is
19.5k page faults and 0.034 s of kernel time per update, a thirteenth of it. With the tunable
`glibc.malloc.hugetlb=1` (glibc 2.35 and later) malloc asks for transparent huge pages, which
a kernel whose THP mode is `madvise` then maps 2 MB at a time: 127 faults, 0.006 s
(docs/PERFORMANCE.md). Under THP mode `always` the kernel already does so; under `never`
nothing can.

glibc reads its tunables once, when the process starts, so an entry point that wants them
calls `reexec_with_huge_pages()` first, before JAX starts a backend (`train_mixed.py` before
it imports JAX): the process replaces itself (same PID, arguments and open files) with the
tunable added to `GLIBC_TUNABLES`. Nothing changes in what is computed.
`TERRA_RL_HUGE_PAGES=0` turns it off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from terra_rl import env_vars

OPT_OUT = "TERRA_RL_HUGE_PAGES"
"""Environment variable: "0" leaves the process as it started."""

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library this process runs on, None where it is not glibc."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, OSError, ValueError):
        return None


def thp_mode(path: Path = THP_MODE_FILE) -> str | None:
    """The kernel's transparent huge page mode (the bracketed word of `path`), None where
    the file is missing or has no bracketed word."""
    try:
        words = path.read_text().split()
    except OSError:
        return None
    chosen = [word[1:-1] for word in words if word.startswith("[") and word.endswith("]")]
    return chosen[0] if chosen else None


def wants_reexec(environ: Mapping[str, str], glibc: tuple[int, int] | None,
                 mode: str | None) -> bool:
    """Whether a process started with `environ` gains from restarting with the tunable: glibc
    new enough, THP mode `madvise`, the tunable not set yet and not turned off."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    already = any(item.split("=")[0] == TUNABLE for item in tunables.split(":") if item)
    return (environ.get(OPT_OUT, "1") != "0" and not already and mode == "madvise"
            and glibc is not None and glibc >= MIN_GLIBC)


def with_tunable(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with `glibc.malloc.hugetlb=1` appended to its `GLIBC_TUNABLES`."""
    tunables = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
    return dict(environ, GLIBC_TUNABLES=":".join([*tunables, f"{TUNABLE}=1"]))


def reexec_with_huge_pages() -> None:
    """Restart this process with huge pages for malloc where that helps (`wants_reexec`);
    returns only where it does not."""
    environ = env_vars.process_environment()
    if sys.platform != "linux" or not wants_reexec(environ, glibc_version(), thp_mode()):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, with_tunable(environ))
