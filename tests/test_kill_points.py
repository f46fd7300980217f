"""No record lost or doubled, wherever a run is killed: real `train_mixed.py` processes,
held at named points by `tests/kill_train.py`, killed with SIGKILL or stopped with SIGTERM
there (among them while the eval still compiles beside the first updates, held unfinished),
then resumed. At every point, every checkpoint on disk must be covered by metrics.jsonl
(all its records written, so a resume, which cuts the file back to the checkpoint and logs
what follows again, loses none), the file must hold each record once and in order, and
after the last resume it must hold exactly the records of an uninterrupted run.

The processes use tests/test_preemption.py's tiny cpu_demo shapes and the suite's compile
cache: only a run's first process compiles, if the cache is cold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import cache_flags, train_flags

from terra_rl.cli.main import EXIT_STOPPED
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.logger import read_metrics

REPO = Path(__file__).resolve().parents[1]
UPDATES = 8
EVAL_INTERVAL = 3
CHECKPOINT_INTERVAL = 2
EVAL_UPDATES = (0, 3, 6, 8)  # the baseline, every EVAL_INTERVAL updates and the last
# An uninterrupted run's records in metrics.jsonl: (update, kind), in their order.
EXPECTED = [(0, "eval")] + [
    (update, kind) for update in range(1, UPDATES + 1)
    for kind in ("train", "eval") if kind == "train" or update in EVAL_UPDATES]
class Run:
    """A run directory and the `train_mixed.py` processes that train it, all through
    `tests/kill_train.py`, with their output appended to one log."""

    def __init__(self, tmp_path: Path, name: str):
        self.tmp_path, self.name = tmp_path, name
        self.dir = tmp_path / name
        self.log = tmp_path / f"{name}.log"
        self.processes = 0

    def start(self, *gates: str, resume: bool = False) -> subprocess.Popen:
        flags = (["--resume", str(self.dir), *cache_flags()] if resume else
                 train_flags(self.tmp_path, self.name, UPDATES, EVAL_INTERVAL,
                             CHECKPOINT_INTERVAL))
        self.processes += 1
        self.gates = self.tmp_path / f"gates_{self.name}_{self.processes}"
        self.gates.mkdir()
        env = dict(os.environ, PYTHONUNBUFFERED="1", TERRA_TEST_GATES=",".join(gates),
                   TERRA_TEST_GATE_DIR=str(self.gates))  # XLA_FLAGS: conftest's 4 devices
        with open(self.log, "ab") as out:
            return subprocess.Popen([sys.executable, str(REPO / "tests" / "kill_train.py"),
                                     *flags], cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)

    def wait_for_gate(self, process: subprocess.Popen, *gates: str,
                      timeout_s: float = 300) -> str:
        """The first of `gates` the process reaches (it waits there until released)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for gate in gates:
                if (self.gates / f"{gate}.reached").exists():
                    return gate
            assert process.poll() is None, \
                f"exited {process.returncode} before {' or '.join(gates)}: {self.tail()}"
            assert time.monotonic() < deadline, f"timed out waiting for {' or '.join(gates)}"
            time.sleep(0.02)

    def wait_for_log(self, process: subprocess.Popen, text: str, times: int = 1,
                     timeout_s: float = 120) -> None:
        """Until the log holds `text` `times` times (the process still running)."""
        deadline = time.monotonic() + timeout_s
        while self.log.read_text().count(text) < times:
            assert process.poll() is None, f"exited {process.returncode}: {self.tail()}"
            assert time.monotonic() < deadline, f"timed out waiting for {text!r}"
            time.sleep(0.02)

    def release(self, *gates: str) -> None:
        for gate in gates:
            (self.gates / f"{gate}.release").touch()

    def dispatched(self) -> int:
        """The last update the held process dispatched."""
        return int((self.gates / "dispatched").read_text())

    def kill(self, process: subprocess.Popen) -> None:
        process.kill()
        assert process.wait(timeout=60) == -signal.SIGKILL

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def records(self) -> list[tuple[int, str]]:
        """metrics.jsonl's records as (update, kind), in the file's order."""
        path = self.dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [(r["update"], "eval" if "eval/rewards" in r else "train")
                for r in read_metrics(path) if "eval/rewards" in r or "train/actor_loss" in r]

    def checkpoints(self) -> list[int]:
        path = self.dir / "checkpoints"
        return CheckpointStore(path, read_only=True).all_steps() if path.exists() else []

    def check_records(self) -> list[tuple[int, str]]:
        """metrics.jsonl holds the first records of an uninterrupted run, each once and in
        order, and among them every record of every update a checkpoint on disk covers.
        Returns the records."""
        records = self.records()
        assert records == EXPECTED[:len(records)], f"lost, doubled or out of order: {records}"
        for step in self.checkpoints():
            covered = [record for record in EXPECTED if record[0] <= step]
            assert records[:len(covered)] == covered, (
                f"checkpoint {step} is on disk, but metrics.jsonl lacks records it covers "
                f"(a resume from it never logs them again): {records}")
        return records


@pytest.mark.timeout(1800)  # five train_mixed.py processes, the first maybe compiling cold
def test_sigkill_at_any_point_then_resume_loses_and_doubles_no_record(tmp_path):
    run = Run(tmp_path, "killed")

    # The eval's compile held unfinished: checkpoint 2 comes due while the baseline eval
    # and the train records 1-2 wait for it. It waits for them, so the loop waits for the
    # compile; released, the records are written, then the checkpoint. Killed right after
    # the checkpoint is complete.
    process = run.start("eval_compile", "eval_wait", "saved_2")
    run.wait_for_gate(process, "eval_wait", "saved_2")
    run.check_records()
    assert run.checkpoints() == [] and run.records() == [] and run.dispatched() == 2
    run.release("eval_compile", "eval_wait")
    run.wait_for_gate(process, "saved_2")
    assert run.check_records() == EXPECTED[:3] and run.checkpoints() == [2]
    run.kill(process)

    # Killed during the eval's compile: resumed from 2, the eval due at update 3 waits for
    # the compile (a copy of its state on the host) while update 4 runs; checkpoint 4 then
    # waits for that eval's record, which waits for the compile.
    process = run.start("eval_compile", "eval_wait", resume=True)
    run.wait_for_gate(process, "eval_wait")
    assert run.check_records() == EXPECTED[:3] and run.checkpoints() == [2]
    assert run.dispatched() == 4
    run.kill(process)

    # Killed between checkpoints: resumed from 2 again, held after the dispatch of update
    # 6, when update 5's record is written past checkpoint 4.
    process = run.start("dispatch_6", resume=True)
    run.wait_for_gate(process, "dispatch_6")
    assert run.check_records() == EXPECTED[:7] and run.checkpoints() == [2, 4]
    run.kill(process)

    # Killed right after the last eval, before the last checkpoint: resumed from 4 (update
    # 5's record dropped and logged again), every record written, checkpoint 8 not.
    process = run.start("save_8", resume=True)
    run.wait_for_gate(process, "save_8")
    assert run.check_records() == EXPECTED and run.checkpoints() == [2, 4, 6]
    run.kill(process)

    assert run.start(resume=True).wait(timeout=600) == 0, run.tail()
    assert run.check_records() == EXPECTED and run.checkpoints()[-1] == UPDATES
    assert run.log.read_text().count("dropped 1 metrics.jsonl record(s) after update 4") == 1
    assert "dropped 3 metrics.jsonl record(s) after update 6" in run.log.read_text()


@pytest.mark.timeout(1800)  # three train_mixed.py processes, the first maybe compiling cold
def test_sigterm_during_the_compiles_stops_cleanly_and_the_resume_loses_no_record(tmp_path):
    run = Run(tmp_path, "stopped")

    # SIGTERM while the eval compiles beside update 1 (held unfinished): the stop waits for
    # the compile, so the baseline eval's record comes before update 1's and the stop's
    # checkpoint; exit 75.
    process = run.start("eval_compile", "eval_wait", "dispatch_1")
    run.wait_for_gate(process, "dispatch_1")
    process.send_signal(signal.SIGTERM)
    run.wait_for_log(process, "SIGTERM received")
    run.release("dispatch_1")
    # The compile stays held until the stop waits for it (or, were the stop not to wait,
    # until the process has exited without it).
    deadline = time.monotonic() + 300
    while not (run.gates / "eval_wait.reached").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "timed out waiting for the stop"
        time.sleep(0.02)
    run.release("eval_compile", "eval_wait")
    assert process.wait(timeout=300) == EXIT_STOPPED, run.tail()
    assert run.check_records() == EXPECTED[:2] and run.checkpoints() == [1]
    log = run.log.read_text()
    assert "stop requested at update 1: waiting for the eval's compile" in log
    assert "stop requested: checkpointed update 1 of 8" in log

    # SIGTERM while the resumed run's update compiles (held before it starts): nothing new
    # to save, exit 75, the records and checkpoints as they were.
    process = run.start("compile", resume=True)
    run.wait_for_gate(process, "compile")
    process.send_signal(signal.SIGTERM)
    run.wait_for_log(process, "SIGTERM received", times=2)
    run.release("compile")
    assert process.wait(timeout=300) == EXIT_STOPPED, run.tail()
    assert "stop requested before update 2; nothing to checkpoint" in run.log.read_text()
    assert run.check_records() == EXPECTED[:2] and run.checkpoints() == [1]

    assert run.start(resume=True).wait(timeout=600) == 0, run.tail()
    assert run.check_records() == EXPECTED and run.checkpoints()[-1] == UPDATES
