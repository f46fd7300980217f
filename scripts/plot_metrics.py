"""Learning curves of training runs from their `metrics.jsonl`, as one PNG.

    python scripts/plot_metrics.py runs/cpu_demo-A runs/cpu_demo-B --out curves.png

Panels against env steps: held-out completion rate (greedy solid, sampled dashed), positive
terminations, eval return, episode progress, entropy, value loss, explained variance,
curriculum level, and the first run's greedy eval action shares; panels no run logged are
left out. Runs of one config that differ only in the seed are drawn as their mean with a
shaded min-max band. A run still being written (a torn last line) and a resumed run plot as
they are. Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

from terra_rl.analysis.plotting import PlotError, group_runs, load_run, plot_groups  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="plot_metrics.py", description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE.png",
                        help="the PNG to write (its directory must exist)")
    parser.add_argument("--title", default="", help="figure title")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out.suffix.lower() != ".png":
        parser.error(f"--out must name a .png file, got {args.out}")
    if not args.out.parent.is_dir():
        parser.error(f"--out: directory {args.out.parent} does not exist")
    try:
        groups = group_runs([load_run(path) for path in args.run_dirs])
        panels = plot_groups(groups, args.out, args.title)
    except PlotError as error:
        parser.error(str(error))
    runs = sum(len(group.runs) for group in groups)
    print(f"wrote {args.out}: {len(panels)} panels, {runs} run(s) in {len(groups)} group(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
