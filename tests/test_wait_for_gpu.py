"""`scripts/euler/wait_for_gpu.py` and `terra_rl.ops.gpu_wait`: polling logic with a fake clock,
and the script end to end with a fake `nvidia-smi` on PATH (no JAX, no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from terra_rl.ops import gpu_wait

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "euler" / "wait_for_gpu.py"

# Prints the free MiB of GPUs 0 and 1. GPU 1's value comes from FAKE_FREE_GPU1, or, while
# FAKE_BUSY_POLLS > 0, stays at 100 MiB for that many polls (counted in a file).
FAKE_NVIDIA_SMI = textwrap.dedent("""\
    #!/usr/bin/env bash
    if [[ $* != *"--query-gpu=index,memory.free"* ]]; then exit 9; fi
    if [[ -n ${FAKE_FAIL:-} ]]; then echo "NVIDIA-SMI has failed: $FAKE_FAIL" >&2; exit 9; fi
    polls=$(( $(cat "$FAKE_POLL_FILE" 2>/dev/null || echo 0) + 1 ))
    echo "$polls" > "$FAKE_POLL_FILE"
    free=${FAKE_FREE_GPU1:-24000}
    if (( polls <= ${FAKE_BUSY_POLLS:-0} )); then free=100; fi
    printf '0, 512\\n1, %s\\n' "$free"
""")


@pytest.fixture
def fake_gpu_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FAKE_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["FAKE_POLL_FILE"] = str(tmp_path / "polls")
    return env


def run_script(args, env, timeout=60):
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


# Prints its arguments and the pinning variables, and exits with code 7.
SHOW_COMMAND = ["sh", "-c",
                'echo "args=$* cvd=${CUDA_VISIBLE_DEVICES-unset} order=${CUDA_DEVICE_ORDER-unset}";'
                " exit 7", "cmd"]


# ------------------------------------------------------------------ the script


def test_enough_memory_runs_at_once_pinned_and_propagates_exit_code(fake_gpu_env):
    result = run_script(["--min-free", "20000", "--gpu", "1", "--sleep", "5", "--", *SHOW_COMMAND],
                        fake_gpu_env)
    assert result.returncode == 7
    assert result.stdout.strip() == "args= cvd=1 order=PCI_BUS_ID"
    assert "waiting" not in result.stderr
    assert "GPU 1: 24000 MB free" in result.stderr


def test_waits_with_progress_until_memory_frees(fake_gpu_env):
    env = dict(fake_gpu_env, FAKE_BUSY_POLLS="2")
    result = run_script(["--min-free", "20000", "--gpu", "1", "--sleep", "0.05", "--",
                         *SHOW_COMMAND], env)
    assert result.returncode == 7
    waiting = [line for line in result.stderr.splitlines() if "waiting" in line]
    assert len(waiting) == 2
    assert "GPU 1: 100 MB free, need 20000 MB" in waiting[0]
    assert Path(env["FAKE_POLL_FILE"]).read_text().strip() == "3"
    assert "cvd=1" in result.stdout


def test_timeout_runs_the_command_with_the_fallback_args(fake_gpu_env):
    env = dict(fake_gpu_env, FAKE_FREE_GPU1="1000")
    result = run_script(["--min-free", "20000", "--gpu", "1", "--sleep", "0.05", "--timeout",
                         "0.2", "--fallback-arg", "--num_envs_per_device", "--fallback-arg",
                         "256", "--", *SHOW_COMMAND], env)
    assert result.returncode == 7
    assert result.stdout.strip() == "args=--num_envs_per_device 256 cvd=1 order=PCI_BUS_ID"
    assert "timed out" in result.stderr
    assert "fallback arguments --num_envs_per_device 256" in result.stderr


def test_timeout_without_fallback_exits_nonzero_without_running(fake_gpu_env, tmp_path):
    marker = tmp_path / "ran"
    result = run_script(["--min-free", "20000", "--sleep", "0.05", "--timeout", "0.1", "--",
                         "touch", str(marker)], fake_gpu_env)
    assert result.returncode == gpu_wait.EXIT_TIMEOUT == 124
    assert not marker.exists()
    # Without --gpu every GPU must have room: GPU 0 (512 MiB) never does.
    assert "GPU 0: 512 MB free, GPU 1: 24000 MB free" in result.stderr
    assert "no --fallback-arg" in result.stderr.splitlines()[-1]


def test_nvidia_smi_failure_exits_3_with_one_line(fake_gpu_env):
    env = dict(fake_gpu_env, FAKE_FAIL="driver mismatch")
    result = run_script(["--min-free", "1", "--", "true"], env)
    assert result.returncode == gpu_wait.EXIT_QUERY_FAILED
    assert result.stderr.strip().splitlines() == [
        "wait_for_gpu.py: error: nvidia-smi failed (exit 9): NVIDIA-SMI has failed: driver "
        "mismatch"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-free", "1", "true"], "give the command after --"),
        (["--min-free", "1", "--"], "no command after --"),
        (["--min-free", "1", "--sleep", "0", "--", "true"], "--sleep must be > 0"),
        (["--min-free", "-5", "--", "true"], "--min-free must be >= 0"),
        (["--gpu", "1", "--", "true"], "the following arguments are required: --min-free"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_wait.parse_args(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_missing_gpu_index_and_missing_command(fake_gpu_env):
    missing_gpu = run_script(["--min-free", "1", "--gpu", "5", "--", "true"], fake_gpu_env)
    assert missing_gpu.returncode == 3
    assert "--gpu 5 is not present; nvidia-smi lists GPUs [0, 1]" in missing_gpu.stderr
    missing_command = run_script(["--min-free", "1", "--gpu", "1", "--", "no-such-cmd-xyz"],
                                 fake_gpu_env)
    assert missing_command.returncode == 127
    assert "command not found: no-such-cmd-xyz" in missing_command.stderr


# ------------------------------------------------------------------ the logic


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_polls_until_free_with_progress_reports():
    readings = iter([{0: 100}, {0: 15_000}, {0: 20_000}])
    clock, reports = FakeClock(), []
    ready = gpu_wait.wait_for_free_memory(20_000, None, sleep_s=30, query=lambda: next(readings),
                                          clock=clock, sleep=clock.sleep, report=reports.append)
    assert ready and clock.sleeps == [30, 30]
    assert [("waiting" in r) for r in reports] == [True, True, False]
    assert "GPU 0: 15000 MB free, need 20000 MB (30 s elapsed)" in reports[1]
    assert "after 60 s" in reports[2]


def test_wait_times_out_and_never_sleeps_past_the_deadline():
    clock, reports = FakeClock(), []
    ready = gpu_wait.wait_for_free_memory(20_000, 1, sleep_s=30, timeout_s=70,
                                          query=lambda: {0: 99_999, 1: 10},
                                          clock=clock, sleep=clock.sleep, report=reports.append)
    assert not ready
    assert clock.sleeps == [30, 30, 10] and clock.now == 70
    assert reports[-1].startswith("wait_for_gpu.py: timed out after 70 s: GPU 1: 10 MB free")


def test_parse_free_memory_and_fallback_parsing():
    assert gpu_wait.parse_free_memory("0, 1024\n1, 80000\n\n") == {0: 1024, 1: 80000}
    with pytest.raises(gpu_wait.GpuQueryError, match="cannot parse nvidia-smi line"):
        gpu_wait.parse_free_memory("0, [N/A]\n")
    with pytest.raises(gpu_wait.GpuQueryError, match="listed no GPUs"):
        gpu_wait.parse_free_memory("")
    with pytest.raises(gpu_wait.GpuQueryError, match="not found on PATH"):
        gpu_wait.query_free_memory("no-such-nvidia-smi-xyz")
    args = gpu_wait.parse_args(["--min-free", "10", "--fallback-arg", "--num_envs_per_device",
                                "--fallback-arg=256", "--", "python", "train.py", "--x", "1"])
    assert args.fallback_args == ("--num_envs_per_device", "256")
    assert args.command == ("python", "train.py", "--x", "1")
    assert args.timeout is None and args.gpu is None


def test_main_execs_with_pinned_environment(monkeypatch):
    monkeypatch.setattr(gpu_wait, "query_free_memory", lambda: {0: 1, 1: 2})
    calls = []
    code = gpu_wait.main(["--min-free", "0", "--gpu", "0", "--", "prog", "a"],
                         exec_fn=lambda *call: calls.append(call))
    assert code == 0
    (file, argv, env), = calls
    assert (file, argv) == ("prog", ["prog", "a"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
