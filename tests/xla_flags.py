"""XLA_FLAGS of the test processes and of the processes they start.

The suite is compile-bound on the 2-core CPU, so the tests compile with flags that make
XLA:CPU compile faster (measured in docs/PERFORMANCE.md, "The test command"); training and
`make gates` keep XLA's defaults:

- `--xla_backend_optimization_level=0`: LLVM at -O0 compiles about a third faster. No
  fast-math either way, but the default level vectorises some reductions, which can round
  differently in the last bits.
- On jaxlib 0.10, `--xla_cpu_use_fusion_emitters=false`: the older elemental emitters
  compile a fusion in less time than the MLIR fusion emitters; and
  `--xla_cpu_parallel_codegen_split_count=1`: one LLVM module per program rather than parts
  compiled in parallel, since the two workers keep both cores busy. Both, in the processes
  tests start too: the whole suite in 9 min 8 s against 14 min 17 s. With both, 5 updates
  and an evaluation of tests/test_learning.py's trainer give the same bits as -O0 alone.
  XLA aborts on a flag it does not know, so other jaxlib versions go without them.

`as_training_compiles` gives one program back what training compiles, inside a test process
that keeps these flags (tests/test_learning.py).
"""

from __future__ import annotations

import os
from importlib.metadata import version

COMPILE_FLAGS: tuple[str, ...] = ("--xla_backend_optimization_level=0",)
if version("jaxlib").startswith("0.10."):
    COMPILE_FLAGS += ("--xla_cpu_use_fusion_emitters=false",
                      "--xla_cpu_parallel_codegen_split_count=1")


DEFAULT_OPTIMIZATION_LEVEL = 2
"""XLA:CPU's backend optimisation level when XLA_FLAGS sets none: training's."""


def as_training_compiles(options: dict) -> dict:
    """Per-program compiler options (`jax.stages.Lowered.compile`'s) that undo
    `COMPILE_FLAGS` on top of `options`, which training passes for that program: XLA's
    default level unless `options` sets one, and the fusion emitters on. The codegen split
    stays at 1, which changes how a program is compiled, not what it computes."""
    undone = {"xla_backend_optimization_level": DEFAULT_OPTIMIZATION_LEVEL}
    if "--xla_cpu_use_fusion_emitters=false" in COMPILE_FLAGS:
        undone["xla_cpu_use_fusion_emitters"] = True
    return {**undone, **options}


def with_compile_flags(flags: str) -> str:
    """`flags` (an XLA_FLAGS value) with each of `COMPILE_FLAGS` it does not set already."""
    for flag in COMPILE_FLAGS:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}"
    return flags.strip()


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a process a test starts: `COMPILE_FLAGS` and `devices` forced CPU
    devices (None: XLA's default, one)."""
    forced = "" if devices is None else f"--xla_force_host_platform_device_count={devices}"
    return with_compile_flags(forced)


def environ_with_compile_flags() -> None:
    """Adds `COMPILE_FLAGS` to this process's XLA_FLAGS (before jax initialises); exported,
    so the processes the tests start compile with them too."""
    os.environ["XLA_FLAGS"] = with_compile_flags(os.environ.get("XLA_FLAGS", ""))
