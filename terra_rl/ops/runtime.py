"""Runtime preflight: prove, inside a job's own environment, that JAX can train here.

`jax.devices()` is not a preflight. Each check below does real work on the accelerator and
returns a `CheckResult` (name, PASS/FAIL/SKIP, seconds, detail); `CHECKS` lists them in the
order they run, each with its own exit code, so a failed job says which layer broke:

    cuda_libs    pip CUDA wheel library directories exist and are on LD_LIBRARY_PATH
    backend      the default JAX backend is the expected platform with enough devices
    conv         a jitted conv forward + backward pass is finite on every device
    psum         a pmap all-reduce over all devices returns the exact sum
    train_smoke  one real trainer update at a small shape (only with --train-smoke)

Checks after `backend` skip when it found no device of the expected platform. JAX is imported
inside the functions, never at module import, so a CLI can set `JAX_PLATFORMS` first.
The checks live in `terra_rl.ops.runtime_checks`, their types in
`terra_rl.ops.preflight_types`; the command line (`scripts/euler/check_jax_runtime.py`) is
`terra_rl.ops.runtime_cli`.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from terra_rl import env_vars
from terra_rl.ops.preflight_types import (
    EXIT_OK,
    FAIL,
    MAX_ERROR_CHARS,
    PASS,
    SKIP,
    Check,
    CheckFailed,
    CheckResult,
    PreflightOptions,
    PreflightState,
    SkipCheck,
    first_line,
)
from terra_rl.ops.runtime_checks import (
    check_backend,
    check_conv,
    check_cuda_libs,
    check_psum,
    check_train_smoke,
)

# ------------------------------------------------------------------ registry and runner

CHECKS: tuple[Check, ...] = (
    Check("cuda_libs", 10, "CUDA wheel library dirs (cuDNN, CUPTI, cuBLAS, NVRTC, NCCL) exist "
          "and are on LD_LIBRARY_PATH (SKIP on cpu)", check_cuda_libs),
    Check("backend", 11, "default JAX backend is --platform with >= --min-devices devices "
          "matching --expect-gpu-regex", check_backend),
    Check("conv", 12, "jitted conv forward+backward in the compute dtype is finite on every "
          "device", check_conv),
    Check("psum", 13, "pmap psum over all devices returns the exact sum (NCCL on gpu)",
          check_psum),
    Check("train_smoke", 14, "one real trainer update at a small shape, finite metrics "
          "(only with --train-smoke)", check_train_smoke, requires=("backend", "conv", "psum"),
          enabled_by="train_smoke"),
)


def run_check(check: Check, options: PreflightOptions, state: PreflightState) -> CheckResult:
    """Run one check, timing it; exceptions become FAIL with the first line as detail."""
    unmet = [name for name in check.requires
             if name in state.results and state.results[name].status != PASS]
    start = time.perf_counter()
    status, detail, error_text = PASS, "", ""
    if check.enabled_by and not getattr(options, check.enabled_by):
        status, detail = SKIP, f"not requested (--{check.enabled_by.replace('_', '-')})"
    elif unmet:
        status, detail = SKIP, f"needs {', '.join(unmet)} to pass first"
    else:
        try:
            detail = check.run(options, state)
        except SkipCheck as skip:
            status, detail = SKIP, str(skip)
        except CheckFailed as failed:
            status, detail = FAIL, str(failed)
            if failed.__cause__ is not None:
                error_text = str(failed.__cause__)[:MAX_ERROR_CHARS]
        except Exception as error:  # noqa: BLE001 - any crash is this check's failure
            status = FAIL
            detail = f"{type(error).__name__}: {first_line(error)}"
            error_text = str(error)[:MAX_ERROR_CHARS]
    result = CheckResult(check.name, status, time.perf_counter() - start, detail, error_text)
    state.results[check.name] = result
    return result


@dataclasses.dataclass(frozen=True)
class PreflightReport:
    results: tuple[CheckResult, ...]
    exit_code: int
    failed_check: str | None
    """The first failing check (its exit code is the process's), None when all passed."""
    verdict: str
    devices: tuple[dict[str, Any], ...]
    options: PreflightOptions

    def to_dict(self) -> dict[str, Any]:
        import jax

        return {
            "verdict": self.verdict,
            "passed": self.failed_check is None,
            "exit_code": self.exit_code,
            "failed_check": self.failed_check,
            "checks": [r.to_dict() for r in self.results],
            "devices": list(self.devices),
            "options": dataclasses.asdict(self.options),
            "jax_version": jax.__version__,
            "python": sys.executable,
            "hostname": socket.gethostname(),
            "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "environment": env_vars.values((
                "JAX_PLATFORMS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                "SLURM_JOB_ID", "SLURM_JOB_NODELIST")),
        }


def format_result(result: CheckResult) -> str:
    return f"{result.status:<4} {result.name:<11} {result.seconds:7.2f} s  {result.detail}"


def exit_code_for(results: Sequence[CheckResult], checks: Sequence[Check] = CHECKS) -> int:
    """The exit code of the first failing check in registry order; 0 when none failed."""
    codes = {check.name: check.exit_code for check in checks}
    failed = [r.name for r in results if r.status == FAIL]
    order = [check.name for check in checks]
    return codes[min(failed, key=order.index)] if failed else EXIT_OK


def run_preflight(
    options: PreflightOptions,
    checks: Sequence[Check] = CHECKS,
    report: Callable[[CheckResult], None] | None = None,
) -> PreflightReport:
    """Run every check in order (`report` sees each result as it completes)."""
    state = PreflightState()
    results = []
    for check in checks:
        result = run_check(check, options, state)
        results.append(result)
        if report is not None:
            report(result)
    exit_code = exit_code_for(results, checks)
    failed = next((r for r in results if r.status == FAIL), None)
    counts = collections.Counter(r.status for r in results)
    devices = tuple({"id": d.id, "platform": d.platform, "device_kind": d.device_kind,
                     "name": str(d)} for d in state.devices)
    where = f"{len(devices)} {options.platform} device(s)"
    if failed is None:
        verdict = (f"preflight PASSED: {counts[PASS]} passed, {counts[SKIP]} skipped on "
                   f"{where}")
    else:
        verdict = (f"preflight FAILED (exit {exit_code}) at {failed.name}: {failed.detail}"
                   + (f" [{counts[FAIL]} checks failed]" if counts[FAIL] > 1 else ""))
    return PreflightReport(tuple(results), exit_code, failed and failed.name, verdict, devices,
                           options)


def write_json_report(path: str | os.PathLike, report: PreflightReport) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")

