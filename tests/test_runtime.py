"""The runtime preflight (`terra_rl.ops.runtime`, `scripts/euler/check_jax_runtime.py`).

In-process checks run on conftest's 4 forced CPU devices; failures are simulated (too many
devices asked, a fake site-packages tree, an injected NaN conv, a psum that does not sum).
A few subprocess runs prove the script's exit codes and JSON report end to end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from terra_rl.nets.precision import compute_dtype
from terra_rl.ops import cuda_libs, preflight_types, runtime, runtime_checks, runtime_cli
from terra_rl.ops.preflight_types import FAIL, PASS, SKIP, PreflightOptions, PreflightState
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "euler" / "check_jax_runtime.py"
CPU4 = PreflightOptions(platform="cpu", min_devices=4)


def statuses(report) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


def test_all_checks_on_four_cpu_devices():
    printed = []
    report = runtime.run_preflight(CPU4, report=printed.append)
    assert [r.name for r in printed] == ["cuda_libs", "backend", "conv", "psum", "train_smoke"]
    assert statuses(report) == {"cuda_libs": SKIP, "backend": PASS, "conv": PASS,
                                "psum": PASS, "train_smoke": SKIP}
    details = {r.name: r.detail for r in report.results}
    assert details["backend"] == "4 cpu device(s): 4 x cpu"
    assert details["conv"].startswith("conv fwd+bwd in float32 finite on 4 device(s)")
    assert details["psum"] == "psum over 4 device(s) = 10 exactly"
    assert details["train_smoke"] == "not requested (--train-smoke)"
    assert all(r.seconds >= 0 for r in report.results)
    assert report.exit_code == 0 and report.failed_check is None
    assert report.verdict == "preflight PASSED: 3 passed, 2 skipped on 4 cpu device(s)"
    assert [d["platform"] for d in report.devices] == ["cpu"] * 4


def test_too_few_devices_and_wrong_kind_fail_the_backend_check():
    report = runtime.run_preflight(
        dataclasses.replace(CPU4, min_devices=8, expect_gpu_regex="RTX (3090|4090)",
                            train_smoke=True))
    assert report.exit_code == 11 and report.failed_check == "backend"
    backend = report.results[1]
    assert "need at least 8 (--min-devices)" in backend.detail
    assert "kinds ['cpu'] do not match --expect-gpu-regex 'RTX (3090|4090)'" in backend.detail
    # The devices that are there are still exercised; the train smoke waits for a clean backend.
    assert statuses(report)["conv"] == PASS and statuses(report)["psum"] == PASS
    assert report.results[-1].detail == "needs backend to pass first"
    assert report.verdict.startswith("preflight FAILED (exit 11) at backend: 4 cpu device(s)")


def test_wrong_platform_skips_the_device_checks():
    report = runtime.run_preflight(PreflightOptions(platform="gpu"), checks=runtime.CHECKS[1:])
    assert statuses(report) == {"backend": FAIL, "conv": SKIP, "psum": SKIP, "train_smoke": SKIP}
    assert report.results[0].detail.startswith("default backend is cpu with 4 x cpu, expected gpu")
    assert report.results[1].detail == "no gpu devices (backend check failed)"
    assert report.exit_code == 11


def fake_site_packages(root: Path, skip: tuple[str, ...] = (), empty: tuple[str, ...] = ()):
    """A site-packages tree with the pip CUDA wheels' lib dirs; returns the lib dirs made."""
    made = []
    for name, relative, pattern in cuda_libs.CUDA_WHEEL_LIBS:
        if name in skip:
            continue
        directory = root / relative
        directory.mkdir(parents=True)
        if name not in empty:
            (directory / pattern.replace("*", ".9")).write_text("")
        made.append(str(directory))
    return made


def run_cuda_libs(site: Path, ld_path: str):
    options = PreflightOptions(platform="cpu", site_packages=str(site), ld_library_path=ld_path)
    return runtime.run_check(runtime.CHECKS[0], options, PreflightState())


def test_cuda_libs_check_with_a_fake_site_packages(tmp_path):
    lib_dirs = fake_site_packages(tmp_path / "good")
    good = run_cuda_libs(tmp_path / "good", ":".join(["/usr/lib", *lib_dirs]))
    assert good.status == PASS
    assert good.detail.startswith("cudnn (nvidia/cudnn/lib), cupti (nvidia/cuda_cupti/lib), "
                                  "cublas (nvidia/cublas/lib), nvrtc (nvidia/cuda_nvrtc/lib), "
                                  "nccl (nvidia/nccl/lib) on LD_LIBRARY_PATH")

    lib_dirs = fake_site_packages(tmp_path / "partial", skip=("nccl",), empty=("cupti",))
    partial = run_cuda_libs(tmp_path / "partial", ":".join(lib_dirs[2:]))
    assert partial.status == FAIL
    assert f"missing: nccl ({tmp_path / 'partial' / 'nvidia/nccl/lib'})" in partial.detail
    assert "empty: cupti (no libcupti.so* in" in partial.detail
    assert "not on LD_LIBRARY_PATH: cudnn" in partial.detail
    assert "source scripts/euler/env.sh" in partial.detail
    assert runtime.exit_code_for([partial]) == 10

    none = run_cuda_libs(tmp_path / "partial", "")
    assert "cublas" in none.detail.split("not on LD_LIBRARY_PATH: ")[1]


def test_cuda_libs_check_finds_the_cuda13_layout(tmp_path):
    """CUDA 13 wheels bundle cuBLAS, CUPTI and NVRTC in nvidia/cu13/lib."""
    site = tmp_path / "cu13"
    bundled = site / "nvidia/cu13/lib"
    bundled.mkdir(parents=True)
    for library in ("libcublas.so.13", "libcupti.so.13", "libnvrtc.so.13"):
        (bundled / library).write_text("")
    lib_dirs = [str(bundled)]
    for name in ("cudnn", "nccl"):
        (site / f"nvidia/{name}/lib").mkdir(parents=True)
        (site / f"nvidia/{name}/lib/lib{name}.so.9").write_text("")
        lib_dirs.append(str(site / f"nvidia/{name}/lib"))
    result = run_cuda_libs(site, ":".join(lib_dirs))
    assert result.status == PASS, result.detail
    assert "cublas (nvidia/cu13/lib)" in result.detail and "nccl (nvidia/nccl/lib)" in result.detail
    result = run_cuda_libs(site, ":".join(lib_dirs[1:]))
    assert result.status == FAIL
    assert "not on LD_LIBRARY_PATH: cupti" in result.detail


def test_injected_nan_conv_fails_with_exit_12(monkeypatch):
    real_probe = runtime_checks.make_conv_probe

    def nan_probe(dtype):
        probe = real_probe(dtype)
        return lambda x, kernels: probe(x * jnp.nan, kernels)

    monkeypatch.setattr(runtime_checks, "make_conv_probe", nan_probe)
    report = runtime.run_preflight(dataclasses.replace(CPU4, train_smoke=True))
    assert report.exit_code == 12 and report.failed_check == "conv"
    conv = report.results[2]
    assert conv.detail.startswith("conv fwd+bwd (float32) failed on 4/4 device(s):")
    assert "non-finite loss or gradient" in conv.detail
    assert statuses(report)["psum"] == PASS
    assert report.results[-1].detail == "needs conv to pass first"


def test_psum_that_does_not_sum_fails_with_exit_13(monkeypatch):
    monkeypatch.setattr(jax.lax, "psum", lambda x, axis_name: x)
    report = runtime.run_preflight(CPU4, checks=runtime.CHECKS[1:4])
    assert report.exit_code == 13
    assert report.results[-1].detail == (
        "psum over 4 device(s) gave [1.0, 2.0, 3.0, 4.0], expected 10 everywhere")


def test_crashing_check_fails_with_its_code_and_full_error_in_json(tmp_path):
    def crash(options, state):
        raise RuntimeError("CUDNN_STATUS_INTERNAL_ERROR\nin external/xla/... (long trace)")

    checks = (runtime.CHECKS[1], dataclasses.replace(runtime.CHECKS[2], run=crash))
    report = runtime.run_preflight(CPU4, checks=checks)
    assert report.exit_code == 12
    assert report.results[1].detail == "RuntimeError: CUDNN_STATUS_INTERNAL_ERROR"
    runtime.write_json_report(tmp_path / "sub" / "report.json", report)
    data = json.loads((tmp_path / "sub" / "report.json").read_text())
    assert data["checks"][1]["error"].startswith("CUDNN_STATUS_INTERNAL_ERROR\nin external")
    assert data["exit_code"] == 12 and data["failed_check"] == "conv" and not data["passed"]


def test_first_failing_check_in_registry_order_decides_the_exit_code():
    results = [preflight_types.CheckResult(name, FAIL, 0.0, "") for name in ("psum", "conv")]
    assert runtime.exit_code_for(results) == 12
    assert runtime.exit_code_for([preflight_types.CheckResult("psum", SKIP, 0.0, "")]) == 0
    codes = [check.exit_code for check in runtime.CHECKS]
    assert codes == sorted(set(codes)) == [10, 11, 12, 13, 14]


def test_smoke_config_is_one_small_update_on_procedural_maps(monkeypatch):
    monkeypatch.setenv("DATASET_PATH", "/no/such/dataset")
    config = runtime_checks.smoke_config(4, "bfloat16")
    assert config.num_updates == 1 and config.num_devices == 4
    assert config.env_steps_per_update == 8 * 8 * 4
    assert config.precision == "bfloat16" and config.dataset_path == ""
    assert os.environ["DATASET_PATH"] == "/no/such/dataset"  # restored


def test_train_smoke_runs_one_real_update():
    """The tiny trainer config of tests/test_trainer.py, so its update comes from the suite's
    compilation cache."""
    report = runtime.run_preflight(dataclasses.replace(CPU4, train_smoke=True))
    smoke = report.results[-1]
    assert smoke.name == "train_smoke" and smoke.status == PASS, smoke.detail
    assert smoke.detail.startswith("update 1 of 256 env steps on 4 device(s) (float32)")
    assert report.exit_code == 0 and report.failed_check is None


# ------------------------------------------------------------------ the script


def script_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["XLA_FLAGS"] = xla_flags(4)
    cache = os.environ.get("TERRA_RL_TEST_CACHE",
                           str(Path.home() / ".cache" / "terra_rl" / "jax-test-cache"))
    env["JAX_COMPILATION_CACHE_DIR"] = cache
    return env


def run_script(*args: str, code: str | None = None):
    """The CLI in a subprocess; `code` (Python) runs first in the same interpreter to inject."""
    if code is None:
        command = [sys.executable, str(SCRIPT), *args]
    else:
        command = [sys.executable, "-c",
                   f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}; "
                   f"from terra_rl.ops.runtime_cli import main; sys.exit(main({list(args)!r}))"]
    return subprocess.run(command, env=script_env(), capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_script_passes_on_cpu_and_writes_the_json_report(tmp_path):
    report_path = tmp_path / "preflight.json"
    result = run_script("--platform", "cpu", "--min-devices", "4", "--json", str(report_path))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "preflight PASSED: 3 passed, 2 skipped on 4 cpu device(s)"
    assert [line.split()[:2] for line in lines[1:6]] == [
        ["SKIP", "cuda_libs"], ["PASS", "backend"], ["PASS", "conv"], ["PASS", "psum"],
        ["SKIP", "train_smoke"]]
    data = json.loads(report_path.read_text())
    assert data["passed"] and data["exit_code"] == 0 and data["verdict"] == lines[-1]
    assert [c["name"] for c in data["checks"]] == ["cuda_libs", "backend", "conv", "psum",
                                                   "train_smoke"]
    assert len(data["devices"]) == 4 and data["options"]["min_devices"] == 4
    assert data["environment"]["JAX_PLATFORMS"] == "cpu"
    assert data["jax_version"] == jax.__version__


def test_script_too_few_devices_exits_11(tmp_path):
    report_path = tmp_path / "r.json"
    result = run_script("--platform", "cpu", "--min-devices", "8", "--json", str(report_path))
    assert result.returncode == 11
    assert result.stdout.splitlines()[-1] == (
        "preflight FAILED (exit 11) at backend: 4 cpu device(s): 4 x cpu; need at least 8 "
        "(--min-devices)")
    assert json.loads(report_path.read_text())["failed_check"] == "backend"


def test_script_missing_library_directory_exits_10(tmp_path):
    lib_dirs = fake_site_packages(tmp_path, skip=("nccl",))
    env_note = ":".join(lib_dirs)
    result = run_script("--platform", "cpu", "--site-packages", str(tmp_path),
                        code=f"import os; os.environ['LD_LIBRARY_PATH'] = {env_note!r}")
    assert result.returncode == 10, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("preflight FAILED (exit 10) at cuda_libs: missing: nccl (")
    assert "PASS psum" in result.stdout  # the other checks still ran


def test_script_injected_conv_failure_exits_12():
    inject = ("import jax.numpy as jnp, terra_rl.ops.runtime_checks as r; "
              "real = r.make_conv_probe; "
              "r.make_conv_probe = lambda d: (lambda x, k: real(d)(x * jnp.inf, k))")
    result = run_script("--platform", "cpu", code=inject)
    assert result.returncode == 12, result.stdout + result.stderr
    assert "FAIL conv" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("preflight FAILED (exit 12) at conv:")


def test_script_unwritable_report_exits_3(tmp_path):
    (tmp_path / "file").write_text("")
    result = run_script("--platform", "cpu", "--json", str(tmp_path / "file" / "r.json"))
    assert result.returncode == runtime_cli.EXIT_REPORT_UNWRITABLE == 3
    assert "check_jax_runtime.py: error: cannot write --json" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("preflight PASSED")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-devices", "0"], "--min-devices must be >= 1, got 0"),
        (["--precision", "fp8"], "--precision must be one of"),
        (["--platform", "tpu"], "argument --platform: invalid choice: 'tpu'"),
        (["--expect-gpu-regex", "RTX ("], "is not a regex"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        runtime_cli.parse_options(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
def test_the_preflight_takes_each_precision_the_trainer_takes(precision):
    """The three compute dtypes of the precision policy (docs/MODEL.md), named here rather
    than read from the list both sides import."""
    options, _ = runtime_cli.parse_options(["--precision", precision])
    assert options.precision == precision
    assert compute_dtype(precision) == jnp.dtype(precision)


@pytest.mark.parametrize("precision", ["float64", "fp16", "half", "int8"])
def test_the_preflight_refuses_each_precision_the_trainer_refuses(precision, capsys):
    with pytest.raises(ValueError, match="precision must be one of"):
        compute_dtype(precision)
    with pytest.raises(SystemExit) as exit_info:
        runtime_cli.parse_options(["--precision", precision])
    assert exit_info.value.code == 2
    assert f"--precision must be one of ['float32', 'bfloat16', 'float16'], got " \
        f"'{precision}'" in capsys.readouterr().err


def test_help_documents_every_exit_code_and_parsing_imports_no_jax():
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    for check in runtime.CHECKS:
        assert f"{check.exit_code}  {check.name}:" in result.stdout
    assert "2  bad command line" in result.stdout
    # JAX reads JAX_PLATFORMS at import: parsing flags must not import it.
    probe = ("import sys; from terra_rl.ops import runtime_cli; "
             "runtime_cli.parse_options(['--platform', 'cpu']); print('jax' in sys.modules)")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, cwd=REPO)
    assert imported.stdout.strip() == "False", imported.stderr
