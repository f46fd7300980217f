"""The environment benchmark script runs end to end and reports consistent figures.

Not a timing test: it checks the report's structure and values (positive rates, done
fractions matching the regimes), never how fast anything was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_writes_a_consistent_report(tmp_path):
    report_path = tmp_path / "bench.json"
    command = [sys.executable, str(REPO_ROOT / "scripts" / "benchmark_env.py"), "--quick",
               "--steps", "5", "--repeats", "1", "--json", str(report_path)]
    # The suite's persistent cache (tests/conftest.py): the benchmark builds fresh envs for
    # each measurement, and identical programs among them then compile once.
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "env steps/s" in result.stdout or "steps/s" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["runtime"]["persistent_compilation_cache"]
    assert report["compile"]["compile_seconds"] > 0
    (throughput,) = report["throughput"]
    assert (throughput["num_envs"], throughput["map_size"]) == (16, 16)
    assert throughput["env_steps_per_s_median"] > 0
    cases = {(case["done_regime"], case["path"]): case for case in report["reset_paths"]["cases"]}
    assert set(cases) == {(regime, path) for regime in ("none", "realistic")
                          for path in ("step", "step_reference")}
    for path in ("step", "step_reference"):
        assert cases[("none", path)]["env_done_fraction"] == 0.0
        assert cases[("none", path)]["any_done_fraction"] == 0.0
    # Both paths see the same episodes, so the same done rates.
    assert (cases[("realistic", "step")]["env_done_fraction"]
            == cases[("realistic", "step_reference")]["env_done_fraction"])
    mask = report["action_mask"]
    assert mask["with_mask"]["compute_action_mask"] and not mask["without_mask"][
        "compute_action_mask"]
