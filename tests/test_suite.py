"""The suite's own guarantees: every test runs under pytest-timeout, so a hang fails that
test instead of stalling the run; the slow marks of `make test-fast` name real tests and
leave most of the suite in it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.xla_flags import COMPILE_FLAGS, as_training_compiles, with_compile_flags, xla_flags

TESTS = Path(__file__).resolve().parent


def test_every_test_runs_under_a_timeout(pytestconfig):
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pip install -e '.[dev]'"
    assert 600 <= float(pytestconfig.getini("timeout")) <= 1800


def test_the_compile_flags_reach_this_process_and_the_ones_tests_start():
    """tests/xla_flags.py: this process compiles with every compile flag (conftest adds them
    before jax starts), a process a test starts gets them beside its own device count, and a
    flag set already keeps its value."""
    assert "--xla_backend_optimization_level=0" in COMPILE_FLAGS
    names = [flag.split("=")[0] for flag in COMPILE_FLAGS]
    assert all(name in os.environ["XLA_FLAGS"] for name in names)
    started = xla_flags(2).split()
    assert sorted(started) == sorted([*COMPILE_FLAGS, "--xla_force_host_platform_device_count=2"])
    assert sorted(xla_flags().split()) == sorted(COMPILE_FLAGS)
    kept = with_compile_flags("--xla_backend_optimization_level=2").split()
    assert kept.count("--xla_backend_optimization_level=2") == 1
    assert "--xla_backend_optimization_level=0" not in kept and len(kept) == len(COMPILE_FLAGS)


def test_as_training_compiles_undoes_each_compile_flag_that_changes_the_program():
    """The options tests/test_learning.py compiles training's programs with: every compile
    flag but the codegen split set back, and the program's own level kept."""
    options = as_training_compiles({})
    for flag in COMPILE_FLAGS:
        name, value = flag.removeprefix("--").split("=")
        if name != "xla_cpu_parallel_codegen_split_count":
            assert str(options[name]).lower() != value, name
    assert options["xla_backend_optimization_level"] == 2
    own_level = as_training_compiles({"xla_backend_optimization_level": 1})
    assert own_level == {**options, "xla_backend_optimization_level": 1}


def test_a_hanging_test_fails_at_its_timeout(tmp_path):
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.mark.timeout(2)
        def test_hangs():
            time.sleep(600)
    """))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "no:xdist", str(tmp_path / "test_hang.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "Timeout" in result.stdout and "1 failed" in result.stdout, result.stdout[-2000:]


def test_the_slow_list_names_only_tests_that_exist():
    """tests/conftest.py's SLOW_TESTS names files and test functions: a renamed or removed
    one would silently leave its replacement in `make test-fast` (or out of the run order)."""
    import conftest

    stale = []
    for name, functions in conftest.SLOW_TESTS.items():
        path = TESTS / name
        if not path.is_file():
            stale.append(name)
            continue
        defined = {node.name for node in ast.parse(path.read_text()).body
                   if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
        if functions == conftest.EVERY_TEST:
            functions = () if defined else ("(any test)",)
        stale += [f"{name}::{function}" for function in functions if function not in defined]
    assert not stale, stale


def test_make_test_fast_keeps_most_tests_and_marks_are_strict(pytestconfig):
    """`make test-fast` (-m "not slow") runs at least 70% of the tests (a whole-suite run
    is needed to count them), and an unregistered mark is an error."""
    import conftest

    assert pytestconfig.getoption("strict_markers")
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    collected = {name for name, _ in conftest.COLLECTED}
    if collected != {path.name for path in TESTS.glob("test_*.py")}:
        pytest.skip("only part of the suite was collected")
    slow = sum(is_slow for _, is_slow in conftest.COLLECTED)
    assert slow <= 0.3 * len(conftest.COLLECTED), (slow, len(conftest.COLLECTED))
