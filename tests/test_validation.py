"""The validation gates: every case of the registry runs here (one parametrised test, so a
gate and its test cannot drift apart), plus the case runner and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envs.dataset import save_map_dataset
from envs.maps import generate_maps
from terra_rl.validation import cli, registry, small
from terra_rl.validation.gate import Gate, GateFailure, GateOptions, require, run_gate
from terra_rl.validation.registry import GATES, select_gates

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "validation" / "validate_gates.py"
ISSUE_CASES = (
    "training-accounting",
    "ppo-mask",
    "model-policy",
    "model-separate-trunks",
    "checkpoint-config-restore",
    "timeout-bootstrap-value",
    "gae-timeout-bootstrap",
    "terminal-reward-only-on-task-done",
    "state-action-mask",
    "state-step-dispatch",
    "env-action-mask",
    "synthetic-step-fast-reset",
    "synthetic-batch-step-fast-reset",
    "env-episode-progress",
    "precision-head-gradients",
    "first-update-smoke",
)


@pytest.mark.parametrize("gate", GATES, ids=[gate.name for gate in GATES])
def test_gate(gate):
    """Each case, called directly so a failure shows its traceback."""
    detail = gate.run(GateOptions())
    assert isinstance(detail, str) and detail


def test_registry_holds_the_issue_cases_in_order():
    assert tuple(gate.name for gate in GATES) == ISSUE_CASES
    assert all(gate.description and "\n" not in gate.description for gate in GATES)
    assert [gate.name for gate in GATES if not gate.supports_disable_jit] == [
        "training-accounting",
        "precision-head-gradients",
        "first-update-smoke",
    ]
    assert [g.name for g in select_gates(["ppo-mask", "training-accounting"])] == [
        "training-accounting",
        "ppo-mask",
    ]
    assert select_gates(["all", "ppo-mask"]) == list(GATES)
    with pytest.raises(ValueError, match="unknown case.*nope.*valid: all, training-accounting"):
        select_gates(["nope"])


def test_env_action_mask_on_a_dataset(tmp_path):
    """The dataset path: 40 saved trench maps, the first 32 used (the generated pool's shape,
    so the compiled step is shared)."""
    maps = generate_maps(("trenches",), 16, 40, seed=4, spawn_clearance=3)
    save_map_dataset(maps, tmp_path / "maps", seed=4, types=("trenches",), spawn_clearance=3)
    gate = registry.GATES_BY_NAME["env-action-mask"]
    options = GateOptions(dataset_path=str(tmp_path / "maps"), dataset_size=small.SMALL_NUM_MAPS)
    detail = gate.run(options)
    assert f"{small.SMALL_NUM_MAPS} maps of {tmp_path / 'maps'}" in detail
    assert small.dataset_batch(options.dataset_path, options.dataset_size).params.num_maps == 32


def test_run_gate_reports_pass_fail_errors_and_disable_jit():
    import jax

    def jit_state(options):
        return f"jit disabled: {jax.config.jax_disable_jit}"

    def fails(options):
        require(1 + 1 == 3, "arithmetic is broken")
        return "unreachable"

    def crashes(options):
        raise KeyError("boom")

    passed = run_gate(Gate("a", "passes", jit_state), GateOptions(disable_jit=True))
    assert passed.passed and passed.jit_disabled and passed.detail == "jit disabled: True"
    kept = run_gate(Gate("b", "jitted", jit_state, False), GateOptions(disable_jit=True))
    assert kept.passed and not kept.jit_disabled
    assert kept.detail.startswith("jit disabled: False (jit kept")
    failed = run_gate(Gate("c", "fails", fails))
    assert not failed.passed and failed.detail == "arithmetic is broken"
    crashed = run_gate(Gate("d", "crashes", crashes))
    assert not crashed.passed and crashed.detail == "KeyError: 'boom'"
    assert crashed.line(6) == f"d       FAIL  {crashed.seconds:6.1f}s  KeyError: 'boom'"
    assert issubclass(GateFailure, AssertionError)


@pytest.mark.parametrize("name", ["gae-timeout-bootstrap", "checkpoint-config-restore"])
def test_cases_run_under_disable_jit(name):
    result = run_gate(registry.GATES_BY_NAME[name], GateOptions(disable_jit=True))
    assert result.passed and result.jit_disabled, result.detail


def fake_gates(monkeypatch):
    gates = (
        Gate("good-case", "passes", lambda options: "fine"),
        Gate("bad-case", "fails", lambda options: require(False, "expected 1, found 2")),
    )
    monkeypatch.setattr(registry, "GATES", gates)
    monkeypatch.setattr(registry, "GATES_BY_NAME", {gate.name: gate for gate in gates})
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # restored after the test
    return gates


def test_cli_lines_summary_json_and_exit_code(monkeypatch, tmp_path, capsys):
    fake_gates(monkeypatch)
    report = tmp_path / "out" / "gates.json"
    argv = ["--case", "all", "--jax-platforms", "cpu", "--compilation-cache-dir", ""]
    assert cli.main([*argv, "--json", str(report)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:2] == ["good-case", "PASS"] and lines[0].endswith("s  fine")
    assert lines[1].split()[:2] == ["bad-case", "FAIL"] and "expected 1, found 2" in lines[1]
    assert lines[2].startswith("1 passed, 1 failed in ") and "failed: bad-case" in lines[2]
    data = json.loads(report.read_text())
    assert (data["passed"], data["failed"], data["backend"]) == (1, 1, "cpu")
    assert [(c["name"], c["status"]) for c in data["cases"]] == [
        ("good-case", "PASS"),
        ("bad-case", "FAIL"),
    ]
    assert cli.main(["--case", "good-case", "--compilation-cache-dir", ""]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 passed, 0 failed")
    assert cli.main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == ["good-case", "bad-case"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --case NAME"),
        (["--case", "nope"], "unknown case(s) nope; valid: all, good-case, bad-case"),
        (["--case", "all", "--dataset-size", "3"], "--dataset-size needs --dataset-path"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(monkeypatch, capsys, argv, message):
    fake_gates(monkeypatch)
    monkeypatch.delenv("DATASET_PATH", raising=False)
    monkeypatch.delenv("DATASET_SIZE", raising=False)
    with pytest.raises(SystemExit) as error:
        cli.main(argv)
    assert error.value.code == 2
    stderr = capsys.readouterr().err.strip().splitlines()
    assert len(stderr) == 1 and message in stderr[0]


def test_script_lists_the_cases_and_rejects_unknown_names():
    """The script as a user runs it: a fresh process, JAX_PLATFORMS set from the flag."""
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, str(SCRIPT), "--jax-platforms", "cpu", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    listed = run("--list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(ISSUE_CASES)
    unknown = run("--case", "no-such-case")
    assert unknown.returncode == 2
    (line,) = unknown.stderr.strip().splitlines()
    assert line.startswith("validate_gates.py: error: unknown case(s) no-such-case; valid: all,")
    assert all(name in line for name in ISSUE_CASES)
