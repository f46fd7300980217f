"""A validation gate: a named check that returns a one-line detail or raises.

A case function takes `GateOptions` and returns a short detail string on success. It
fails by raising: `GateFailure` (via `require`) or an `AssertionError` from
`numpy.testing`; any other exception is a failure too, reported with its type. Checks
never use `assert` statements, so `python -O` cannot turn a gate off.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable


class GateFailure(AssertionError):
    """A gate's check failed; the message says what was expected and what was found."""


def require(condition, message: str) -> None:
    """Raise `GateFailure(message)` unless `condition` is true."""
    if not bool(condition):
        raise GateFailure(message)


@dataclasses.dataclass(frozen=True)
class GateOptions:
    """Run-time options of every case.

    dataset_path / dataset_size: a map dataset for the cases on real maps (None: generated
    maps). disable_jit: run cases that allow it under `jax.disable_jit()`.
    """

    dataset_path: str | None = None
    dataset_size: int | None = None
    disable_jit: bool = False


@dataclasses.dataclass(frozen=True)
class Gate:
    """One case: `run(options) -> detail`. `supports_disable_jit` is False for cases that
    are far too slow op by op (a whole pmapped update) or that need compiled functions."""

    name: str
    description: str
    run: Callable[[GateOptions], str]
    supports_disable_jit: bool = True


@dataclasses.dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    seconds: float
    detail: str
    jit_disabled: bool

    @property
    def status(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def line(self, name_width: int = 0) -> str:
        """`NAME  PASS  12.3s  detail` on one line."""
        detail = " ".join(self.detail.split())
        return f"{self.name:<{name_width}}  {self.status}  {self.seconds:6.1f}s  {detail}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "jit_disabled": self.jit_disabled,
        }


def run_gate(gate: Gate, options: GateOptions = GateOptions()) -> GateResult:
    """Run one case, timing it; a raised exception becomes a FAIL with its first line."""
    import jax

    jit_disabled = options.disable_jit and gate.supports_disable_jit
    start = time.perf_counter()
    try:
        if jit_disabled:
            with jax.disable_jit():
                detail = gate.run(options)
        else:
            detail = gate.run(options)
        if options.disable_jit and not jit_disabled:
            detail = f"{detail} (jit kept: this case does not run under --disable-jit)"
        passed = True
    except Exception as error:  # noqa: BLE001 - every failure is reported, not raised
        passed = False
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        message = "; ".join(lines[:4]) if lines else ""
        detail = (
            message if isinstance(error, AssertionError) else (f"{type(error).__name__}: {message}")
        )
    return GateResult(gate.name, passed, time.perf_counter() - start, detail, jit_disabled)
