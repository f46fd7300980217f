"""Why a trained policy fails on its held-out maps: each map played to the eval horizon, each
failure judged from its final state with the scripted solver's planner.

    python scripts/diagnose_failures.py --checkpoint runs/cpu_demo-A
    python scripts/diagnose_failures.py --checkpoint runs/cpu_demo-A --checkpoint-step best \\
        --sample --maps 16 --json failures.json

Prints one line per map (outcome, progress, the step of the last progress, the planner's
steps to finish from the final state, the loop's most frequent actions) and the count of each
category (`terra_rl/analysis/failure_diagnosis.py` defines them): `done`, `loaded dead end`,
`targets out of reach`, `no dump space`, `planner gave up`, `stalled while solvable`. Bad input
exits 2 with one line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402

from envs.actions import TRACKED, WHEELED  # noqa: E402
from terra_rl.analysis.failure_diagnosis import diagnose_episode, summarize  # noqa: E402
from terra_rl.analysis.playback import PlaybackError, load_trained_policy  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402

AGENT_TYPES = {"tracked": (TRACKED,), "wheeled": (WHEELED,), "both": (TRACKED, WHEELED)}


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="diagnose_failures.py",
                                description="Classify a trained policy's held-out failures.")
    parser.add_argument("--checkpoint", required=True, metavar="RUN_DIR",
                        help="run directory of an excavation run")
    parser.add_argument("--checkpoint-step", default="latest",
                        help="latest, best or an update number (default latest)")
    parser.add_argument("--sample", action="store_true",
                        help="sample actions instead of the greedy argmax")
    parser.add_argument("--maps", type=int, default=0,
                        help="play the first N held-out maps (default 0: all of them)")
    parser.add_argument("--agent-type", choices=("auto", *AGENT_TYPES), default="auto",
                        help="auto: the run's mix (tracked, wheeled, or both when mixed)")
    parser.add_argument("--seed", type=int, default=0, help="key of resets and sampling")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.maps < 0:
        parser.error(f"--maps must be >= 0, got {args.maps}")
    try:
        trained = load_trained_policy(args.checkpoint, args.checkpoint_step)
    except PlaybackError as error:
        parser.error(str(error))
    num_maps = trained.num_maps if args.maps == 0 else args.maps
    if num_maps > trained.num_maps:
        parser.error(f"--maps {num_maps} is more than the run's {trained.num_maps} held-out maps")
    if args.agent_type == "auto":
        mix = trained.config.wheeled_fraction
        agent_types = AGENT_TYPES["tracked" if mix == 0 else "wheeled" if mix == 1 else "both"]
    else:
        agent_types = AGENT_TYPES[args.agent_type]

    mode = "sampled" if args.sample else "greedy"
    print(f"checkpoint of update {trained.step}, {num_maps} held-out maps, {mode}", flush=True)
    key = jax.random.PRNGKey(args.seed)
    rows = []
    for agent_type in agent_types:
        for map_index in range(num_maps):
            key, episode_key = jax.random.split(key)
            row = diagnose_episode(trained, map_index, agent_type, args.sample, episode_key)
            rows.append(row)
            loop = ", ".join(f"{name} {count}" for name, count in row.loop_actions.items())
            print(f"map {map_index:3d} {'wheeled' if agent_type == WHEELED else 'tracked'} "
                  f"{row.category:24s} progress {row.progress:.2f} steps {row.steps:3d} "
                  f"last progress {row.last_progress_step:3d} solver {row.solver_steps:4d} "
                  f"| {loop}", flush=True)
            if row.blocked_reasons:
                print("         out of reach: " + ", ".join(
                    f"{name} {count}" for name, count in row.blocked_reasons.items()), flush=True)
    counts = summarize(rows)
    for category, count in counts.items():
        print(f"{count:4d}  {category}")
    if args.json is not None:
        args.json.write_text(json.dumps({"checkpoint": str(args.checkpoint),
                                         "update": trained.step, "mode": mode,
                                         "counts": counts,
                                         "episodes": [dataclasses.asdict(r) for r in rows]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
