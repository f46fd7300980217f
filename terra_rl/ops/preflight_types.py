"""The runtime preflight's vocabulary: what a check gets (`PreflightOptions`, the
`PreflightState` earlier checks left), how it ends (a PASS detail, `SkipCheck`, `CheckFailed`),
what it returns (`CheckResult`) and how it is registered (`Check`). No JAX here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
PLATFORMS = ("gpu", "cpu")
EXIT_OK = 0

MAX_ERROR_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    """PASS, FAIL or SKIP."""
    seconds: float
    detail: str
    """One line: what was found, or why it failed and what to do."""
    error: str = ""
    """Full text of the exception that failed the check (for the JSON report), if any."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PreflightOptions:
    platform: str = "gpu"
    """Expected JAX backend: gpu or cpu."""
    min_devices: int = 1
    expect_gpu_regex: str = ""
    """Every device's kind (or name) must match this regex; empty = no check."""
    precision: str = ""
    """Compute dtype of the conv and train checks; empty = bfloat16 on gpu, float32 on cpu."""
    train_smoke: bool = False
    site_packages: str = ""
    """Where to look for nvidia/*/lib; empty = this interpreter's. Given: checked on cpu too."""
    ld_library_path: str | None = None
    """None = the LD_LIBRARY_PATH of this process."""

    @property
    def compute_precision(self) -> str:
        return self.precision or ("bfloat16" if self.platform == "gpu" else "float32")


@dataclasses.dataclass
class PreflightState:
    """What earlier checks found, for the later ones."""

    devices: list = dataclasses.field(default_factory=list)
    """Devices of the expected platform (empty when the backend check found none)."""
    results: dict[str, CheckResult] = dataclasses.field(default_factory=dict)


class SkipCheck(Exception):
    """Raised by a check that cannot run here; the message says why."""


class CheckFailed(Exception):
    """Raised by a check that ran and found a problem; the message is the one-line detail."""


CheckFn = Callable[[PreflightOptions, PreflightState], str]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    exit_code: int
    summary: str
    run: CheckFn
    """Returns the PASS detail; raises SkipCheck or CheckFailed (any other exception fails)."""
    requires: tuple[str, ...] = ()
    """Checks that must have passed for this one to run (else SKIP)."""
    enabled_by: str = ""
    """A boolean `PreflightOptions` field that must be true for this check to run."""


def first_line(error: BaseException) -> str:
    """An exception's first non-blank line (at most 500 characters), or its type's name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:500] if lines else type(error).__name__
