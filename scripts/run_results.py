"""Regenerate the results of docs/RESULTS.md from scratch: the standard-task table (gymnax
tasks at the published PPO budgets, several seeds each) with a curve plot per task, and the
`cpu_demo` excavation runs with their curves and GIFs of the trained policy on held-out maps.

    .venv/bin/python scripts/run_results.py                 # everything (hours on 2 cores)
    .venv/bin/python scripts/run_results.py --quick         # the whole pipeline in minutes
    .venv/bin/python scripts/run_results.py --tasks CartPole-v1,Acrobot-v1 --skip-excavation

Every run is its own `train_mixed.py` process (so its wall time includes start-up and the
compile), one after the other. Writes under `--out-dir` (default `results/`): the runs,
`standard_tasks.json` (every run and the summary), `standard_tasks.md` (the table),
`<task>.png` curves, and for the excavation stage `cpu_demo_curves.png` and GIFs.
`--quick` cuts every budget to a few updates and runs one seed: its figures mean nothing,
it checks that every step works. Bad input exits 2 with one line; a failed run exits 1
naming its log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

from terra_rl.analysis.standard_tasks import (  # noqa: E402
    TASKS,
    markdown_table,
    run_flags,
    run_record,
    summarize,
)
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402
from terra_rl.run.logger import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICK_BUDGET = 20_000
QUICK_EXCAVATION_STEPS = 4 * 2048
HELD_OUT_GIF_MAPS = (0, 1, 2)


class RunFailed(RuntimeError):
    pass


def train(args: list[str], log: Path) -> float:
    """Runs train_mixed.py with `args`, its output in `log`; returns the wall seconds."""
    start = time.perf_counter()
    with open(log, "w") as handle:
        code = subprocess.call([sys.executable, str(ROOT / "train_mixed.py"), *args],
                               stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    if code != 0:
        raise RunFailed(f"train_mixed.py exited {code}; see {log}")
    return time.perf_counter() - start


def script(name: str, args: list[str]) -> None:
    code = subprocess.call([sys.executable, str(ROOT / "scripts" / name), *args], cwd=ROOT)
    if code != 0:
        raise RunFailed(f"{name} {' '.join(args)} exited {code}")


def standard_tasks(names: list[str], seeds: list[int], out: Path, quick: bool) -> list[dict]:
    runs_dir = out / "runs"
    records, rows = [], []
    for name in names:
        task = TASKS[name]
        budget = min(task.budget, QUICK_BUDGET) if quick else task.budget
        task_runs = []
        for seed in seeds:
            run_name = f"{name}-s{seed}"
            print(f"{name} seed {seed}: {budget:,} env steps ...", flush=True)
            wall = train(run_flags(task, seed, budget, str(runs_dir), run_name),
                         out / f"{run_name}.log")
            record = run_record(read_metrics(runs_dir / run_name / "metrics.jsonl"), wall)
            record.update(task=name, seed=seed, budget=budget)
            print(f"  return {record['return']:.1f} (sampled {record['sampled_return']:.1f}), "
                  f"{record['steps_per_second']:,.0f} env steps/s, {wall:.0f} s", flush=True)
            task_runs.append(record)
        records += task_runs
        rows.append(dict(summarize(name, task_runs), budget=budget))
        script("plot_metrics.py", [*(str(runs_dir / f"{name}-s{s}") for s in seeds),
                                   "--out", str(out / f"{name}.png"), "--title", name])
    (out / "standard_tasks.json").write_text(json.dumps({"runs": records, "summary": rows},
                                                        indent=2))
    table = markdown_table(rows)
    (out / "standard_tasks.md").write_text(table + "\n")
    print(table)
    return rows


def excavation(seeds: list[int], out: Path, quick: bool) -> None:
    runs_dir = out / "runs"
    names = []
    for seed in seeds:
        name = f"cpu_demo-s{seed}"
        flags = ["--config", "cpu_demo", "--seed", str(seed), "--runs_dir", str(runs_dir),
                 "--run_name", name, "--wandb_mode", "disabled"]
        if quick:
            flags += ["--total_timesteps", str(QUICK_EXCAVATION_STEPS), "--log_eval_interval",
                      "2", "--eval_episodes", "8", "--checkpoint_interval", "2"]
        print(f"cpu_demo seed {seed} ...", flush=True)
        wall = train(flags, out / f"{name}.log")
        print(f"  {wall:.0f} s; {(out / f'{name}.log').read_text().splitlines()[-2]}",
              flush=True)
        names.append(name)
    script("plot_metrics.py", [*(str(runs_dir / name) for name in names),
                               "--out", str(out / "cpu_demo_curves.png"),
                               "--title", "cpu_demo, held-out 16x16 trenches"])
    for map_index in HELD_OUT_GIF_MAPS:
        script("play_episode.py", ["--checkpoint", str(runs_dir / names[0]), "--map-index",
                                   str(map_index), "--tile-pixels", "6", "--fps", "12",
                                   "--out", str(out / f"{names[0]}_heldout{map_index}.gif")])


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="run_results.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma list of standard tasks (default all: {', '.join(TASKS)})")
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results",
                        help="where runs, tables and figures go (default results/)")
    parser.add_argument("--quick", action="store_true",
                        help="a few updates per run and one seed: checks the pipeline")
    parser.add_argument("--skip-standard", action="store_true", help="no standard tasks")
    parser.add_argument("--skip-excavation", action="store_true", help="no cpu_demo runs")
    args = parser.parse_args(argv)
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    except ValueError:
        parser.error(f"--seeds must be a comma list of integers, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds is empty")
    if args.quick:
        seeds = seeds[:1]
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out-dir {args.out_dir}: {error.strerror}")
    try:
        if not args.skip_standard:
            standard_tasks(names, seeds, args.out_dir, args.quick)
        if not args.skip_excavation:
            excavation(seeds, args.out_dir, args.quick)
    except RunFailed as error:
        print(f"run_results.py: {error}", file=sys.stderr)
        return 1
    print(f"results in {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
