"""Real signals to real `train_mixed.py` processes (issue: runs that survive preemption).

One run is stopped by SIGTERM, then killed with SIGKILL while it compiles and again while it
writes a checkpoint, and resumed after each. It must end bit-identical to an uninterrupted
run of the same seed, with every update logged exactly once in metrics.jsonl. The processes
use the tiny config of tests/test_trainer.py (cpu_demo's maps on 4 CPU devices, without the
env's costly inputs: `PLAIN_ENV_FLAGS`) and the suite's compilation cache, so only the first
compiles. The interrupted processes run through `tests/gated_train.py`, which holds each at
a named point until the test has sent its signal: no signal depends on how long a compile
or an update takes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tiny_runs import cache_flags, train_flags

from terra_rl.cli.main import EXIT_STOPPED, STOP_SIGNALS, StopRequest
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.logger import read_metrics

REPO = Path(__file__).resolve().parents[1]
UPDATES = 8


def start(args: list[str], log: Path, gates: tuple[str, ...] = (),
          gate_dir: Path | None = None) -> subprocess.Popen:
    """train_mixed.py, or with `gates` tests/gated_train.py holding it at each gate."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # XLA_FLAGS: conftest's 4 CPU devices
    script = REPO / "train_mixed.py"
    if gates:
        script = REPO / "tests" / "gated_train.py"
        env.update(TERRA_TEST_GATES=",".join(gates), TERRA_TEST_GATE_DIR=str(gate_dir))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(script), *args],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def reached(gate_dir: Path, gate: str) -> bool:
    return (gate_dir / f"{gate}.reached").exists()


def release(gate_dir: Path, gate: str) -> None:
    (gate_dir / f"{gate}.release").touch()


def logged_updates(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [r["update"] for r in read_metrics(path) if "train/actor_loss" in r]


def wait_for(condition, process: subprocess.Popen, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"process exited {process.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def final_state(run_dir: Path) -> list[np.ndarray]:
    step = CheckpointStore(run_dir / "checkpoints", read_only=True).latest_step()
    assert step == UPDATES
    tree = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(step) / "state")
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items()
            if not k.startswith("performance/") and k != "wall_time"}


@pytest.mark.timeout(1800)  # five train_mixed.py processes, one compiling cold
def test_sigterm_and_kill_9_then_resume_match_an_uninterrupted_run(tmp_path):
    # Every run is its own process, so that all compile once, into the persistent cache.
    straight_log = tmp_path / "straight.log"
    assert start(train_flags(tmp_path, "straight", UPDATES), straight_log).wait(timeout=600) == 0, \
        straight_log.read_text()[-3000:]
    run_dir, log = tmp_path / "interrupted", tmp_path / "interrupted.log"
    resume = ["--resume", str(run_dir), *cache_flags()]

    # SIGTERM while training, held after update 3's dispatch (and the eval's background
    # compile, so the baseline eval is logged): update 3 is logged and checkpointed (off the
    # checkpoint interval), exit 75.
    gates = tmp_path / "gates_sigterm"
    gates.mkdir()
    process = start(train_flags(tmp_path, "interrupted", UPDATES), log, ("update_3",), gates)
    wait_for(lambda: reached(gates, "update_3"), process, "update 3")
    process.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM received" in log.read_text(), process, "the SIGTERM handler")
    release(gates, "update_3")
    assert process.wait(timeout=120) == EXIT_STOPPED, log.read_text()
    stopped_at = logged_updates(run_dir)[-1]
    assert stopped_at == 3 and logged_updates(run_dir) == [1, 2, 3]
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).latest_step() == stopped_at
    assert "stop requested: checkpointed update 3 of 8" in log.read_text()

    # kill -9 while the resumed process compiles: it has restored the checkpoint, rewritten
    # the run directory (config, metrics cut to the checkpoint, the manifest's resume
    # record) and logged so, and is held where its update starts to compile.
    gates = tmp_path / "gates_compile"
    gates.mkdir()
    resumes_logged = log.read_text().count("resumed at update")
    process = start(resume, log, ("compile",), gates)
    wait_for(lambda: reached(gates, "compile"), process, "the update's compile")
    assert log.read_text().count("resumed at update") == resumes_logged + 1
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert "update compiled" not in log.read_text().split("resumed at update")[-1]
    assert logged_updates(run_dir) == [1, 2, 3]

    # kill -9 while it writes its first checkpoint (update 4): orbax's temporary directory
    # exists, the checkpoint is not complete.
    gates = tmp_path / "gates_checkpoint"
    gates.mkdir()
    process = start(resume, log, ("checkpoint",), gates)
    wait_for(lambda: reached(gates, "checkpoint"), process, "a checkpoint's write")
    assert list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).latest_step() == stopped_at

    process = start(resume, log)
    assert process.wait(timeout=300) == 0, log.read_text()[-3000:]

    for got, want in zip(final_state(run_dir), final_state(tmp_path / "straight"), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    records = read_metrics(run_dir / "metrics.jsonl")
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert logged_updates(run_dir) == list(range(1, UPDATES + 1))
    train = [without_timings(r) for r in records if "train/actor_loss" in r]
    assert train == [without_timings(r) for r in straight if "train/actor_loss" in r]
    evals = [without_timings(r) for r in records if "eval/rewards" in r]
    assert evals == [without_timings(r) for r in straight if "eval/rewards" in r]
    resumes = json.loads((run_dir / "manifest.json").read_text())["resumes"]
    assert len(resumes) == 3


def test_stop_request_catches_sigterm_and_sigusr1_and_ignores_repeats(capsys):
    """Installed, it takes both signals (the first names the stop); restored, each signal
    has again the handler it had before."""
    earlier_calls = []
    before = {signum: (lambda s, frame: earlier_calls.append(s)) for signum in STOP_SIGNALS}
    originals = {signum: signal.signal(signum, before[signum]) for signum in STOP_SIGNALS}
    try:
        for signum in STOP_SIGNALS:
            stop = StopRequest()
            stop.install()
            try:
                assert not stop()
                os.kill(os.getpid(), signum)
                os.kill(os.getpid(), signal.SIGTERM)  # a repeat neither kills nor renames
                assert stop() and stop.signal_name == signal.Signals(signum).name
            finally:
                stop.restore()
            assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
            err = capsys.readouterr().err
            assert err.count("received: stopping after the current update") == 1
        assert earlier_calls == []
    finally:
        for signum, handler in originals.items():
            signal.signal(signum, handler)


# `cli()` with `main` replaced: it starts a background "compile" that would hold the process
# for 600 s (a lowering that sleeps), prints a line, then ends as CASE says.
CLI_SCRIPT = """
import sys, time
import terra_rl.cli.main as entry
from terra_rl.run.trainer import _compile, background_compiles_running

def fake_main():
    _compile(lambda: time.sleep(600), time.perf_counter(), True, "slow-compile")
    assert background_compiles_running() == 1
    print("the run's last line", flush=False)
    case = sys.argv[1]
    if case == "error":
        raise RuntimeError("boom")
    if case == "interrupt":
        raise KeyboardInterrupt
    if case == "fail":
        entry.fail("bad input")
    return entry.EXIT_STOPPED

entry.main = fake_main
entry.cli()
"""


def test_cli_exits_at_once_with_its_code_while_a_compile_runs_in_the_background():
    for case, code, in_stderr in (("stop", EXIT_STOPPED, ""), ("error", 1, "RuntimeError: boom"),
                                  ("interrupt", 130, "KeyboardInterrupt"),
                                  ("fail", 2, "error: bad input")):
        # The timeout is the failure: waiting for the thread would take 600 s.
        done = subprocess.run([sys.executable, "-c", CLI_SCRIPT, case], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == code, (case, done.stderr[-2000:])
        assert "the run's last line" in done.stdout, case
        assert in_stderr in done.stderr, (case, done.stderr[-2000:])
