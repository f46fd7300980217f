"""Are two runs' curves bit-identical? Compares their `metrics.jsonl` value by value.

    python scripts/compare_runs.py runs/before runs/after

Every logged value, record by record, must be equal (NaN equal to NaN), timings aside
(`performance/...`, `wall_time`). Exits 0 when they are, 1 when a value differs (the first
ones are printed), 2 with one line on bad input (a missing run, other records or keys).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

from terra_rl.analysis.run_comparison import ComparisonError, compare_runs  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="compare_runs.py", description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path, metavar="RUN_DIR", help="a run directory")
    parser.add_argument("second", type=Path, metavar="RUN_DIR", help="the run to compare it to")
    parser.add_argument("--show", type=int, default=10, metavar="N",
                        help="differences to print (default 10)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        comparison = compare_runs(args.first, args.second)
    except ComparisonError as error:
        parser.error(str(error))
    left_out = ", ".join(comparison.timings) or "none"
    if comparison.identical:
        print(f"identical: {comparison.records} records, {comparison.values} values "
              f"(timings left out: {left_out})")
        return 0
    print(f"{len(comparison.differences)} of {comparison.values} values differ "
          f"({comparison.records} records):")
    for index, key, first, second in comparison.differences[:args.show]:
        print(f"  record {index} {key}: {first!r} != {second!r}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
