"""Evaluate a trained policy on held-out maps, without creating a run directory.

    python scripts/evaluate.py runs/solo_excavator-... [--checkpoint latest|best|N]
        [--episodes N] [--map_size S] [--map_types A,B] [--sample] [--json F]

Prints completion per map type and excavator with a Wilson 95% interval, and the steps to
completion (`terra_rl.analysis.checkpoint_eval`). Exit 2 with one line on bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a training run's directory (runs/<run_name>)")
    parser.add_argument("--checkpoint", default="latest",
                        help="latest, best or an update number (default: latest)")
    parser.add_argument("--episodes", type=int, default=0,
                        help="held-out episodes, one map each (default: the run's "
                             "--eval_episodes)")
    parser.add_argument("--map_size", type=int, default=0,
                        help="evaluate on maps of this side (default: the run's)")
    parser.add_argument("--map_types", default="",
                        help="comma list of map types (default: the run's)")
    parser.add_argument("--sample", action="store_true",
                        help="sample actions from the policy instead of the greedy action")
    parser.add_argument("--json", default="", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.episodes < 0 or args.map_size < 0:
        parser.error("--episodes and --map_size must be >= 1 (0: the run's own)")

    from terra_rl.analysis.checkpoint_eval import EvalRequest, evaluate_checkpoint, format_report
    from terra_rl.config import ConfigError
    from terra_rl.run.checkpointing import CheckpointError
    from terra_rl.run.warm_start import WarmStartError

    config_path = Path(args.run_dir) / "config.json"
    if config_path.is_file():  # the run's compilation cache: its eval program may be there
        from terra_rl.cli.main import setup_compilation_cache

        cache = json.loads(config_path.read_text()).get("compilation_cache_dir", "")
        if cache:
            setup_compilation_cache(cache)
    types = tuple(t for t in args.map_types.split(",") if t)
    request = EvalRequest(Path(args.run_dir), args.checkpoint, args.episodes, args.map_size,
                          types, args.sample)
    try:
        report = evaluate_checkpoint(request)
    except (ConfigError, CheckpointError, WarmStartError, ValueError) as error:
        message = str(error).replace("--init_params: ", "").replace(
            "--init_params_checkpoint", "--checkpoint")
        parser.exit(2, f"evaluate.py: error: {' '.join(message.split())}\n")
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
