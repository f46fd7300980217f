"""The suite's own guarantees: every test runs under pytest-timeout, so a hang fails that
test instead of stalling the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_every_test_runs_under_a_timeout(pytestconfig):
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pip install -e '.[dev]'"
    assert 600 <= float(pytestconfig.getini("timeout")) <= 1800


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
