"""The figures of one training run, as `scripts/gpu_checks.sh train` reports them: greedy
completion of the final policy per (map type, excavator) group, the completion curve, env
steps/s and the seconds before the first update.

    python -m terra_rl.analysis.run_summary RUN_DIR --log TRAIN_LOG [--eval EVAL_JSON]
        --out OUT_DIR

writes OUT_DIR/summary.json and OUT_DIR/curves.png. `EVAL_JSON` is `scripts/evaluate.py
--json` of the final checkpoint; without it the run's last eval is the final figure.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from terra_rl.run.logger import read_metrics

LOG_PATTERNS = {
    "update_compile_seconds": r"update compiled in ([\d.]+) s",
    "first_update_seconds": r"first update after ([\d.]+) s",
    "eval_compile_seconds": r"eval compiled in ([\d.]+) s",
}


def parse_log(text: str) -> dict[str, float]:
    """The start-up seconds the trainer's log lines report (first match of each)."""
    found = {}
    for name, pattern in LOG_PATTERNS.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(match.group(1))
    return found


def summarize(run_dir: Path, log_text: str, final_eval: dict[str, Any] | None) -> dict:
    """summary.json's content (see the module docstring)."""
    records = read_metrics(run_dir / "metrics.jsonl")
    config = json.loads((run_dir / "config.json").read_text())
    evals = [r for r in records if "eval/completion_rate" in r]
    curve = [{"update": r["update"], "env_step": r["env_step"],
              **{k.removeprefix("eval/"): v for k, v in r.items()
                 if k.startswith("eval/completion_rate")},
              **({"validation": r["validation/completion_rate"]}
                 if "validation/completion_rate" in r else {})}
             for r in evals]
    rates = [r["performance/steps_per_second"] for r in records
             if "performance/steps_per_second" in r][1:]  # the first holds the warm-up
    trained = max((r["update"] for r in records if "train/loss" in r), default=0)
    summary: dict[str, Any] = {
        "preset": config.get("preset"),
        "seed": config.get("seed"),
        "precision": config.get("precision"),
        "updates": trained,
        "env_steps": trained * config["num_steps"] * config["num_envs_per_device"]
        * config["num_devices"],
        "env_steps_per_second_median": statistics.median(rates) if rates else None,
        **parse_log(log_text),
        "curve": curve,
    }
    if final_eval is not None:
        summary["final"] = {"source": "scripts/evaluate.py on the final checkpoint",
                            "update": final_eval["update"],
                            "groups": final_eval["groups"], "all": final_eval["all"],
                            "steps_to_completion": final_eval["steps_to_completion"]}
    elif evals:
        last = evals[-1]
        summary["final"] = {"source": "the run's last eval", "update": last["update"],
                            "completion_rate": {k.removeprefix("eval/completion_rate/") or "all":
                                                v for k, v in last.items()
                                                if k.startswith("eval/completion_rate")}}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--eval", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    final = json.loads(args.eval.read_text()) if args.eval and args.eval.is_file() else None
    log = args.log.read_text() if args.log.is_file() else ""
    summary = summarize(args.run_dir, log, final)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from terra_rl.analysis.plotting import Group, load_run, plot_groups

    run = load_run(args.run_dir)
    plot_groups([Group(run.name, (run,))], args.out / "curves.png", title=run.name)
    print(json.dumps({k: v for k, v in summary.items() if k != "curve"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
