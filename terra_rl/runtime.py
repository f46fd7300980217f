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
The command line (`scripts/euler/check_jax_runtime.py`) is `terra_rl.runtime_cli`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from terra_rl.cuda_libs import CUDA_WHEEL_LIBS, library_dir, nvidia_package_dirs

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


# ------------------------------------------------------------------ cuda_libs


def check_cuda_libs(options: PreflightOptions, state: PreflightState) -> str:
    if options.platform == "cpu" and not options.site_packages:
        raise SkipCheck("platform cpu: CUDA libraries not needed")
    roots = [p.parent for p in nvidia_package_dirs(options.site_packages)]
    if not roots:
        raise CheckFailed(
            f"no pip CUDA wheels (no 'nvidia' package) for {sys.executable}; "
            "install them with pip install -e '.[cuda12]'"
        )
    ld_path = os.environ.get("LD_LIBRARY_PATH", "") if options.ld_library_path is None \
        else options.ld_library_path
    on_path = {os.path.realpath(entry) for entry in ld_path.split(":") if entry}
    missing, empty, not_on_path, found = [], [], [], []
    for name, relative, pattern in CUDA_WHEEL_LIBS:
        directory = library_dir(roots, relative, pattern)
        if directory is None:
            missing.append(f"{name} ({roots[0] / relative})")
        elif not any(directory.glob(pattern)):
            empty.append(f"{name} (no {pattern} in {directory})")
        elif os.path.realpath(directory) not in on_path:
            not_on_path.append(f"{name} ({directory})")
        else:
            found.append(f"{name} ({directory.relative_to(directory.parents[2])})")
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}; reinstall with pip install -e '.[cuda12]'")
    if empty:
        problems.append(f"empty: {', '.join(empty)}")
    if not_on_path:
        problems.append(
            f"not on LD_LIBRARY_PATH: {', '.join(not_on_path)}; source scripts/euler/env.sh"
        )
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{', '.join(found)} on LD_LIBRARY_PATH (under {roots[0]})"


# ------------------------------------------------------------------ backend


def describe_devices(devices: Sequence) -> str:
    """'4 x NVIDIA GeForce RTX 4090' style summary of the device kinds."""
    kinds = collections.Counter(d.device_kind for d in devices)
    return ", ".join(f"{count} x {kind}" for kind, count in kinds.items())


def check_backend(options: PreflightOptions, state: PreflightState) -> str:
    import jax

    try:
        backend = jax.default_backend()
        devices = jax.local_devices()
    except RuntimeError as error:
        raise CheckFailed(
            f"JAX backend failed to initialize: {_first_line(error)}"
        ) from error
    if backend != options.platform:
        hint = (" (CUDA plugin not loaded: check the jax[cuda12] install, LD_LIBRARY_PATH "
                "and JAX_PLATFORMS)") if options.platform == "gpu" else ""
        raise CheckFailed(
            f"default backend is {backend} with {describe_devices(devices)}, expected "
            f"{options.platform}{hint}"
        )
    state.devices = list(devices)
    found = f"{len(devices)} {backend} device(s): {describe_devices(devices)}"
    problems = []
    if len(devices) < options.min_devices:
        problems.append(f"need at least {options.min_devices} (--min-devices)")
    if options.expect_gpu_regex:
        pattern = re.compile(options.expect_gpu_regex)
        wrong = sorted({d.device_kind for d in devices
                        if not (pattern.search(d.device_kind) or pattern.search(str(d)))})
        if wrong:
            problems.append(f"kinds {wrong} do not match --expect-gpu-regex "
                            f"{options.expect_gpu_regex!r}")
    if problems:
        raise CheckFailed(f"{found}; {'; '.join(problems)}")
    return found


# ------------------------------------------------------------------ conv


def make_conv_probe(dtype) -> Callable:
    """Jitted `(x [N, H, W, C] f32, kernels) -> (loss f32 [], grads)`: two convolutions
    (stride 2 then 1, NHWC/HWIO) computed in `dtype`, loss and grads in float32."""
    import jax
    import jax.numpy as jnp

    def conv(x, kernel, stride):
        return jax.lax.conv_general_dilated(
            x, kernel.astype(dtype), (stride, stride), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )

    def loss_fn(x, kernels):
        first, second = kernels
        hidden = jax.nn.relu(conv(x.astype(dtype), first, 2))
        out = conv(hidden, second, 1).astype(jnp.float32)
        return jnp.mean(jnp.square(out))

    return jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))


def conv_inputs() -> tuple[Any, tuple[Any, Any]]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 16, 8)).astype(np.float32)
    kernels = (
        (rng.standard_normal((3, 3, 8, 16)) / 8).astype(np.float32),
        (rng.standard_normal((3, 3, 16, 16)) / 12).astype(np.float32),
    )
    return x, kernels


def check_conv(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    from terra_rl.precision import compute_dtype

    if not state.devices:
        raise SkipCheck(f"no {options.platform} devices (backend check failed)")
    dtype = compute_dtype(options.compute_precision)
    probe = make_conv_probe(dtype)
    x, kernels = conv_inputs()
    losses, failures = [], []
    for device in state.devices:
        try:
            loss, grads = probe(jax.device_put(x, device), jax.device_put(kernels, device))
            loss, grads = jax.device_get((loss, grads))
        except Exception as error:  # noqa: BLE001 - reported per device
            failures.append(f"{device}: {type(error).__name__}: {_first_line(error)}")
            continue
        leaves = [np.asarray(loss), *map(np.asarray, jax.tree.leaves(grads))]
        if not all(np.all(np.isfinite(leaf)) for leaf in leaves):
            failures.append(f"{device}: non-finite loss or gradient")
        elif not all(np.any(leaf != 0) for leaf in leaves[1:]):
            failures.append(f"{device}: all-zero gradient")
        else:
            losses.append(float(loss))
    if failures:
        raise CheckFailed(
            f"conv fwd+bwd ({dtype.name}) failed on {len(failures)}/{len(state.devices)} "
            f"device(s): {'; '.join(failures)}"
        )
    spread = (max(losses) - min(losses)) / max(abs(losses[0]), 1e-12)
    tolerance = 1e-5 if dtype.name == "float32" else 2e-2
    if spread > tolerance:
        raise CheckFailed(
            f"conv loss differs between devices by {spread:.2g} (relative, > {tolerance}): "
            f"{[f'{v:.6g}' for v in losses]}"
        )
    return (f"conv fwd+bwd in {dtype.name} finite on {len(losses)} device(s), "
            f"loss {losses[0]:.6g}")


# ------------------------------------------------------------------ psum


def check_psum(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    if not state.devices:
        raise SkipCheck(f"no {options.platform} devices (backend check failed)")
    num_devices = len(state.devices)
    all_reduce = jax.pmap(lambda x: jax.lax.psum(x, "devices"), axis_name="devices",
                          devices=state.devices)
    # Device i contributes i + 1 everywhere: every device must get n (n + 1) / 2 exactly.
    values = np.arange(1, num_devices + 1, dtype=np.float32)[:, None] * np.ones(
        (num_devices, 1024), np.float32
    )
    out = np.asarray(jax.device_get(all_reduce(values)))
    expected = num_devices * (num_devices + 1) / 2
    if out.shape != values.shape or not np.all(out == expected):
        wrong = sorted({float(v) for v in np.unique(out) if v != expected})[:5]
        raise CheckFailed(
            f"psum over {num_devices} device(s) gave {wrong}, expected {expected:g} everywhere"
        )
    return f"psum over {num_devices} device(s) = {expected:g} exactly"


# ------------------------------------------------------------------ train_smoke


@contextlib.contextmanager
def _procedural_maps() -> Iterator[None]:
    """Hide DATASET_PATH/DATASET_SIZE: the smoke proves the runtime, not a dataset."""
    saved = {name: os.environ.pop(name) for name in ("DATASET_PATH", "DATASET_SIZE")
             if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def smoke_config(num_devices: int, precision: str):
    """The validation gates' tiny training config (16x16 trench maps, 8 envs x 8 steps per
    device, episodes ending inside the rollout) on `num_devices` devices, one update long,
    on procedural maps, resolved."""
    from terra_rl.validation import small

    one_update = small.SMOKE_FIELDS["num_steps"] * small.SMOKE_FIELDS["num_envs_per_device"]
    with _procedural_maps():
        return small.smoke_config(num_devices=num_devices, precision=precision,
                                  eval_episodes=num_devices,
                                  total_timesteps=one_update * num_devices)


def check_train_smoke(options: PreflightOptions, state: PreflightState) -> str:
    import jax
    import numpy as np

    from terra_rl.device_metrics import host_metrics
    from terra_rl.trainer import build_trainer

    config = smoke_config(len(state.devices), options.compute_precision)
    with _procedural_maps():
        trainer = build_trainer(config)
    runner = trainer.init_runner()
    update = trainer.compile_update(runner)
    start = time.perf_counter()
    runner, device_metrics = update(runner, trainer.env_params)
    metrics = host_metrics(device_metrics)
    seconds = time.perf_counter() - start
    updates_done = np.asarray(jax.device_get(runner.counters.update)).reshape(-1)
    if not np.all(updates_done == 1):
        raise CheckFailed(f"update counter is {updates_done.tolist()} after one update, not 1")
    bad = sorted(name for name, value in metrics.items() if not math.isfinite(value))
    if bad or not metrics:
        raise CheckFailed(f"non-finite metrics after update 1: {bad or 'no metrics at all'}")
    return (
        f"update 1 of {config.env_steps_per_update} env steps on {trainer.num_devices} "
        f"device(s) ({config.precision}): compile {trainer.compile_seconds:.1f} s, "
        f"update {seconds:.2f} s, {len(metrics)} metrics finite"
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
            detail = f"{type(error).__name__}: {_first_line(error)}"
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
            "environment": {name: os.environ.get(name) for name in (
                "JAX_PLATFORMS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                "SLURM_JOB_ID", "SLURM_JOB_NODELIST")},
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


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:500] if lines else type(error).__name__
