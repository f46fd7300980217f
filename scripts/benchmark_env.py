"""Benchmark the batched excavation env (`envs.batch.BatchEnv`) on the default JAX device.

Measures, with uniformly random actions:
  1. compile time of one jitted `BatchEnv.step` (lower, compile, first call);
  2. steady env steps/s of the fast path for every (num_envs, map_size) pair;
  3. `step` (reset under `lax.cond`) vs `step_reference` (unconditional reset), with no env
     ever finishing and with the realistic done rate of `--max-steps`;
  4. the action mask's share of the step time (`compute_action_mask` on vs off).

Every timed call is one jitted `lax.scan` of `--steps` batch steps; the map pool is a jit
argument, so it is not baked into the program. Shapes are written ENVSxMAP, e.g. 256x64.

Example:
    python scripts/benchmark_env.py --num-envs 64,256,1024 --map-sizes 32,64 --json bench.json
    python scripts/benchmark_env.py --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402

from envs.config import VALID_MAP_SIZES  # noqa: E402
from envs.params import DEFAULT_NUM_MAPS  # noqa: E402
from terra_rl.perf.benchmarking import runtime_info  # noqa: E402
from terra_rl.perf.env_benchmark import (  # noqa: E402
    ParamsCache,
    Shape,
    measure_compile,
    measure_throughput,
)
from terra_rl.perf.env_benchmark_report import render_report  # noqa: E402
from terra_rl.run.huge_pages import reexec_with_huge_pages  # noqa: E402

SCHEMA_VERSION = 1
NEVER_DONE_MAX_STEPS = 10**9
"""`max_steps` of the zero-done-rate runs: no env times out within a benchmark."""

QUICK_DEFAULTS = {"num_envs": "16", "map_sizes": "16", "steps": 20, "repeats": 2, "num_maps": 16}


# ---------------------------------------------------------------------------- arguments


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    values = [positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers")
    return list(dict.fromkeys(values))  # drop duplicates, keep order


def map_size_list(text: str) -> list[int]:
    sizes = positive_int_list(text)
    invalid = [size for size in sizes if size not in VALID_MAP_SIZES]
    if invalid:
        raise argparse.ArgumentTypeError(f"map sizes must be in {VALID_MAP_SIZES}, got {invalid}")
    return sizes


def shape_arg(text: str) -> Shape:
    """'256x64' -> 256 envs on 64x64 maps."""
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected ENVSxMAP such as 256x64, got {text!r}")
    num_envs = positive_int(parts[0])
    (map_size,) = map_size_list(parts[1])
    return Shape(num_envs, map_size)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmark_env.py",
        description="Benchmark BatchEnv step throughput, compile time, reset paths and the "
        "action mask's cost.",
    )
    parser.add_argument(
        "--num-envs",
        type=positive_int_list,
        default="64,256,1024",
        help="comma-separated batch sizes (default: 64,256,1024)",
    )
    parser.add_argument(
        "--map-sizes",
        type=map_size_list,
        default="32,64",
        help=f"comma-separated map sizes from {VALID_MAP_SIZES} (default: 32,64)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=100,
        help="batch steps per timed call (scan length; default: 100)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed calls per configuration; the median and best are reported (default: 3)",
    )
    parser.add_argument(
        "--max-steps",
        type=positive_int,
        default=550,
        help="episode length of the realistic-done-rate runs (default: 550)",
    )
    parser.add_argument(
        "--num-maps",
        type=positive_int,
        default=DEFAULT_NUM_MAPS,
        help=f"generated maps in the pool (default: {DEFAULT_NUM_MAPS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="map and rollout seed (default: 0)")
    parser.add_argument(
        "--compile-shape",
        type=shape_arg,
        default=None,
        help="ENVSxMAP of the compile measurement (default: the first "
        "--num-envs on the largest map size)",
    )
    parser.add_argument(
        "--detail-shape",
        type=shape_arg,
        default=None,
        help="ENVSxMAP of the reset-path and action-mask comparisons (default: "
        "the middle --num-envs on the largest map size)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the results as JSON to PATH",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke configuration: 16 envs, 16x16 maps, 20 steps, 2 repeats, "
        "16 maps (explicit flags still win)",
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK_DEFAULTS)
        args = parser.parse_args(argv)
    largest_map = max(args.map_sizes)
    if args.compile_shape is None:
        args.compile_shape = Shape(args.num_envs[0], largest_map)
    if args.detail_shape is None:
        sorted_envs = sorted(args.num_envs)
        args.detail_shape = Shape(sorted_envs[len(sorted_envs) // 2], largest_map)
    return args


# ---------------------------------------------------------------------------- output


def progress(message: str) -> None:
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- main


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    pools = ParamsCache(args.num_maps, args.seed)
    common = {"pools": pools, "num_steps": args.steps, "repeats": args.repeats, "seed": args.seed}

    progress(f"compile: one jitted step at {args.compile_shape}")
    compile_result = measure_compile(
        args.compile_shape, args.max_steps, pools, args.seed, args.repeats
    )

    throughput = []
    for map_size in args.map_sizes:
        for num_envs in args.num_envs:
            shape = Shape(num_envs, map_size)
            progress(f"throughput: {shape}")
            result = measure_throughput(shape, max_steps=args.max_steps, **common)
            throughput.append(result)
            progress(f"  {result['env_steps_per_s_median']:,.0f} env steps/s")

    detail = args.detail_shape
    cases = []
    regimes = {"none": NEVER_DONE_MAX_STEPS, "realistic": args.max_steps}
    for regime, max_steps in regimes.items():
        for reference in (False, True):
            progress(
                f"reset paths: {regime} done rate, "
                f"{'step_reference' if reference else 'step'}, {detail}"
            )
            result = measure_throughput(detail, max_steps=max_steps, reference=reference, **common)
            cases.append({"done_regime": regime, **result})
    seconds = {(case["done_regime"], case["path"]): case["call_seconds_median"] for case in cases}
    speedups = {
        regime: seconds[regime, "step_reference"] / seconds[regime, "step"] for regime in regimes
    }

    mask_results = {}
    for compute_action_mask in (True, False):
        label = "with_mask" if compute_action_mask else "without_mask"
        progress(f"action mask: {label}, {detail}")
        mask_results[label] = measure_throughput(
            detail, max_steps=args.max_steps, compute_action_mask=compute_action_mask, **common
        )
    share = 1.0 - (
        mask_results["without_mask"]["call_seconds_median"]
        / mask_results["with_mask"]["call_seconds_median"]
    )

    return {
        "schema_version": SCHEMA_VERSION,
        "runtime": {
            **runtime_info(),
            "persistent_compilation_cache": bool(jax.config.jax_compilation_cache_dir),
        },
        "settings": {
            "num_envs": args.num_envs,
            "map_sizes": args.map_sizes,
            "steps": args.steps,
            "repeats": args.repeats,
            "max_steps": args.max_steps,
            "num_maps": args.num_maps,
            "seed": args.seed,
            "compile_shape": dataclasses.asdict(args.compile_shape),
            "detail_shape": dataclasses.asdict(detail),
            "quick": args.quick,
        },
        "compile": compile_result,
        "throughput": throughput,
        "reset_paths": {
            "num_envs": detail.num_envs,
            "map_size": detail.map_size,
            "never_done_max_steps": NEVER_DONE_MAX_STEPS,
            "cases": cases,
            "speedup_step_vs_reference": speedups,
        },
        "action_mask": {
            "num_envs": detail.num_envs,
            "map_size": detail.map_size,
            **mask_results,
            "share_percent": 100.0 * share,
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_benchmark(args)
    print(render_report(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    reexec_with_huge_pages()
    sys.exit(main())
