"""Two runs' `metrics.jsonl` compared value by value: are their curves bit-identical?

Every logged value must be equal (NaN equal to NaN), record by record, except the timings
(`performance/...` and `wall_time`), which no two runs share. A refactor that must not change
behaviour is checked this way (`scripts/compare_runs.py`, docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from terra_rl.run.logger import read_metrics

TIMING_PREFIXES = ("performance/", "wall_time")


class ComparisonError(ValueError):
    """The runs cannot be compared (a missing file, a different number of records or keys)."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    records: int
    values: int
    """Values compared (timings left out)."""
    differences: tuple[tuple[int, str, Any, Any], ...]
    """(record index, key, value in the first run, value in the second)."""
    timings: tuple[str, ...]
    """The keys left out as timings."""

    @property
    def identical(self) -> bool:
        return not self.differences


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def compare_records(first: list[dict], second: list[dict]) -> Comparison:
    if len(first) != len(second):
        raise ComparisonError(f"the runs logged {len(first)} and {len(second)} records")
    values, differences, timings = 0, [], set()
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        if a.keys() != b.keys():
            only = sorted(set(a) ^ set(b))
            raise ComparisonError(f"record {index} has keys in one run only: {only[:5]}")
        for key in a:
            if key.startswith(TIMING_PREFIXES):
                timings.add(key)
                continue
            values += 1
            if not _equal(a[key], b[key]):
                differences.append((index, key, a[key], b[key]))
    return Comparison(len(first), values, tuple(differences), tuple(sorted(timings)))


def compare_runs(first_dir: Path, second_dir: Path) -> Comparison:
    """Compare `first_dir/metrics.jsonl` with `second_dir/metrics.jsonl`."""
    runs = []
    for run_dir in (first_dir, second_dir):
        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file():
            raise ComparisonError(f"{run_dir} has no metrics.jsonl (is it a run directory?)")
        runs.append(read_metrics(path))
    return compare_records(*runs)
