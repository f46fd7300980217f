"""`scripts/compare_runs.py` and `terra_rl.analysis.run_comparison` on synthetic runs:
identical curves, one changed value, NaNs, timings left out, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from terra_rl.analysis.run_comparison import ComparisonError, compare_records

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"
RECORDS = [
    {"update": 1, "env_step": 512, "train/entropy": 2.07, "train/value_loss": float("nan"),
     "performance/steps_per_second": 7100.0, "wall_time": 12.5},
    {"update": 2, "env_step": 1024, "train/entropy": 2.05, "eval/completion_rate": 0.25,
     "performance/steps_per_second": 7300.0, "wall_time": 12.6},
]


def write_run(root: Path, name: str, records: list[dict]) -> Path:
    run_dir = root / name
    run_dir.mkdir()
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (run_dir / "metrics.jsonl").write_text(lines)
    return run_dir


def run_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def test_identical_curves_differ_only_in_timings(tmp_path):
    other = [dict(r, **{"performance/steps_per_second": 1.0, "wall_time": 99.0})
             for r in RECORDS]
    comparison = compare_records(RECORDS, other)
    assert comparison.identical and comparison.records == 2
    assert comparison.values == 8  # NaN equals NaN; the four timings are left out
    assert comparison.timings == ("performance/steps_per_second", "wall_time")
    result = run_script(write_run(tmp_path, "a", RECORDS), write_run(tmp_path, "b", other))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("identical: 2 records, 8 values")


def test_a_changed_value_is_named_and_exits_1(tmp_path):
    changed = [RECORDS[0], dict(RECORDS[1], **{"train/entropy": 2.0500000000000003})]
    comparison = compare_records(RECORDS, changed)
    assert comparison.differences == ((1, "train/entropy", 2.05, 2.0500000000000003),)
    assert not compare_records(RECORDS, [RECORDS[0], dict(RECORDS[1], update=2.0)]).identical
    result = run_script(write_run(tmp_path, "a", RECORDS), write_run(tmp_path, "b", changed))
    assert result.returncode == 1
    assert "1 of 8 values differ" in result.stdout and "record 1 train/entropy" in result.stdout


@pytest.mark.parametrize("second, phrase", [
    (RECORDS[:1], "logged 2 and 1 records"),
    ([RECORDS[0], {k: v for k, v in RECORDS[1].items() if k != "eval/completion_rate"}],
     "keys in one run only"),
])
def test_runs_that_cannot_be_compared_are_refused(tmp_path, second, phrase):
    with pytest.raises(ComparisonError, match=phrase):
        compare_records(RECORDS, second)
    result = run_script(write_run(tmp_path, "a", RECORDS), write_run(tmp_path, "b", second))
    assert result.returncode == 2 and phrase in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_directory_without_metrics_is_one_line_exit_2(tmp_path):
    result = run_script(write_run(tmp_path, "a", RECORDS), tmp_path)
    assert result.returncode == 2 and "has no metrics.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
