"""Solve generated maps with the scripted solver (`envs.solver`): which maps are solvable
inside `--max-steps`, and how many steps a task needs (to set the episode horizon from).

    python scripts/solve_maps.py --map-size 16 --map-types trenches,foundations --count 32 \\
        --seed 0 --agent both --max-steps 1000 --json out.json

`--count` maps of each type are generated (types round robin, as in training pools); map i is
solved from the env's reset with key fold_in(PRNGKey(seed), i).

    python scripts/solve_maps.py --eval-pool mixed_excavators --count 64 --max-steps 1500

With `--eval-pool PRESET` the maps are that preset's held-out eval pool instead (its
`eval_map_seed`, held out from its training pool), each solved from the spawn the preset's
one-device eval draws for it, by that env's agent type: `--count` maps per (map type, agent
type) group; `--map-size` and `--seed` are the preset's, and `--map-types` and `--agent`, when
given, pick some of its groups (to split a long sample over processes).

`--time-limit S` stops the planner's search on a map after S seconds; the map is then reported
unsolved with the blocked targets of the plan's last state.

Prints, per map type and agent type, the solved share, steps to completion (median, p90,
max), the solver's mean episode return and the run time, then every unsolved map with the
reason (one progress line per map goes to stderr). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AGENTS = {"tracked": (0,), "wheeled": (1,), "both": (0, 1)}
AGENT_NAMES = ("tracked", "wheeled")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv):
    parser = _Parser(prog="solve_maps.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--map-size", type=int, default=16)
    parser.add_argument("--map-types", default=None,
                        help="comma-separated (default trenches,foundations; with --eval-pool "
                             "the preset's)")
    parser.add_argument("--count", type=int, default=32, help="maps per map type")
    parser.add_argument("--start", type=int, default=0,
                        help="with --eval-pool: skip each group's first START maps (to split "
                             "or resume a long sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agent", choices=sorted(AGENTS), default="both")
    parser.add_argument("--time-limit", type=float, default=0.0, metavar="S",
                        help="seconds of planner search per map (default 0: no limit)")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None, help="write per-map results here")
    parser.add_argument("--eval-pool", default="", metavar="PRESET",
                        help="solve PRESET's held-out eval maps from the eval's own spawns")
    args = parser.parse_args(argv)
    if args.eval_pool:
        from terra_rl.config import PRESETS

        if args.eval_pool not in PRESETS:
            parser.error(f"--eval-pool {args.eval_pool}: choose a preset of {sorted(PRESETS)}")
    from envs.maps import MAP_TYPES, VALID_MAP_SIZES

    args.map_types_given = args.map_types is not None
    args.map_types = tuple(
        name.strip() for name in (args.map_types or "trenches,foundations").split(",")
        if name.strip()
    )
    unknown = [name for name in args.map_types if name not in MAP_TYPES]
    if unknown or not args.map_types:
        parser.error(f"--map-types {unknown or '(empty)'}: choose from {', '.join(MAP_TYPES)}")
    if args.map_size not in VALID_MAP_SIZES:
        parser.error(f"--map-size {args.map_size}: choose from {VALID_MAP_SIZES}")
    if (args.count < 1 or args.max_steps < 1 or args.seed < 0 or args.time_limit < 0
            or not 0 <= args.start < args.count):
        parser.error("--count and --max-steps must be >= 1, --seed and --time-limit >= 0, "
                     "and --start in 0..count-1")
    if args.json is not None and not args.json.parent.exists():
        parser.error(f"--json {args.json}: directory {args.json.parent} does not exist")
    return args


class EvalPool:
    """The preset's eval env (max_steps `--max-steps`), its pool, and the (agent type, map
    index, reset key) of the first `--count` envs of each (map type, agent type) group."""

    def __init__(self, args):
        import dataclasses

        from envs import ExcavationEnv
        from envs.maps import MAP_TYPES
        from terra_rl.analysis.eval_spawns import eval_episodes
        from terra_rl.config import get_preset

        preset = get_preset(args.eval_pool)
        pool = eval_episodes(preset)
        self.env = ExcavationEnv(dataclasses.replace(pool.env.batch_env.env.config,
                                                     max_steps=args.max_steps))
        self.params = pool.env.params
        args.seed = preset.seed
        self.episodes = []
        agent_types = sorted(set(pool.agent_types.tolist()) & set(AGENTS[args.agent]))
        map_types = sorted(set(pool.map_types.tolist()))
        if args.map_types_given:
            map_types = [t for t in map_types if MAP_TYPES[t] in args.map_types]
        if not agent_types or not map_types:
            raise SystemExit(f"solve_maps.py: error: --eval-pool {args.eval_pool} has no "
                             f"{'/'.join(args.map_types)} maps for --agent {args.agent}")
        for agent_type in agent_types:
            for map_type in map_types:
                group = (pool.agent_types == agent_type) & (pool.map_types == map_type)
                for index in np.flatnonzero(group)[args.start : args.count]:
                    self.episodes.append((int(agent_type), int(index), pool.keys[index]))


def start_reasons(env, params, index, agent_type, key) -> dict[str, int]:
    """The targets out of reach from the spawn, by reason (`Planner.blocked_reasons`): all
    zero where the map was open from the start and the planner's order lost it."""
    import jax

    from envs import solver
    from envs.solver_planner import Planner

    host = jax.device_get(solver.initial_state(env, params, index, agent_type, key))
    planner = Planner(env.config, agent_type, host.target_map, host.obstacles)
    start = planner.state_of(host)
    return planner.blocked_reasons(start.action_map, start.dumpability, start.node)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from envs import EnvConfig, ExcavationEnv, params_from_maps, solver
    from envs.maps import MAP_TYPES, generate_maps

    if args.eval_pool:
        pool = EvalPool(args)
        env, params, episodes = pool.env, pool.params, pool.episodes
        args.map_size = env.config.map_size
    else:
        config = EnvConfig(map_size=args.map_size, max_steps=args.max_steps)
        env = ExcavationEnv(config)
        num_maps = args.count * len(args.map_types)
        maps = generate_maps(args.map_types, args.map_size, num_maps, args.seed,
                             config.spawn_clearance)
        params = params_from_maps(maps)
        episodes = [(agent_type, index, jax.random.fold_in(jax.random.PRNGKey(args.seed), index))
                    for agent_type in AGENTS[args.agent] for index in range(num_maps)]
    map_types = [MAP_TYPES[int(t)] for t in jax.device_get(params.map_type)]
    records = []
    for agent_type, index, key in episodes:
        started = time.perf_counter()
        result = solver.solve(env, params, index, agent_type, key, args.max_steps,
                              time_limit=args.time_limit or None)
        records.append(
            {
                "map_index": index,
                "map_type": map_types[index],
                "agent": AGENT_NAMES[agent_type],
                "map_size": args.map_size,
                "seed": args.seed,
                "completed": result.completed,
                "steps": result.steps,
                "episode_return": result.episode_return,
                "progress": result.progress,
                "reason": result.reason,
                "seconds": time.perf_counter() - started,
                "at_start": {} if result.completed else start_reasons(env, params, index,
                                                                      agent_type, key),
            }
        )
        r = records[-1]
        print(  # progress on stderr, the table on stdout
            f"{r['map_type']} {r['agent']} map {index}: "
            f"{'solved' if r['completed'] else 'UNSOLVED'} in {r['steps']} steps, "
            f"{r['seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    summary = solver.summarize(records)
    print(
        f"{args.map_size}x{args.map_size} maps, seed {args.seed}, max_steps {args.max_steps}\n"
        f"{'map type':<18}{'agent':<9}{'solved':>9}{'median':>8}{'p90':>6}{'max':>6}"
        f"{'return':>9}{'seconds':>9}"
    )
    for row in summary:
        print(
            f"{row['map_type']:<18}{row['agent']:<9}{row['solved']:>4}/{row['maps']:<4}"
            f"{row['steps_median']:>8.0f}{row['steps_p90']:>6.0f}{row['steps_max']:>6.0f}"
            f"{row['return_mean']:>9.3f}{row['seconds_total']:>9.1f}"
        )
    unsolved = [r for r in records if not r["completed"]]
    for r in unsolved:
        at_start = ", ".join(f"{name} {count}" for name, count in r["at_start"].items())
        print(
            f"unsolved: seed {r['seed']} index {r['map_index']} {r['map_type']} {r['agent']} "
            f"{r['map_size']}x{r['map_size']}: {r['reason']} (progress {r['progress']:.2f}; "
            f"out of reach at the start: {at_start})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "maps": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
