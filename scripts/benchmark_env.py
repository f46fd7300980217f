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
import jax.numpy as jnp  # noqa: E402

from envs import actions as A  # noqa: E402
from envs.batch import BatchEnv  # noqa: E402
from envs.config import VALID_MAP_SIZES, EnvConfig  # noqa: E402
from envs.env import ExcavationEnv  # noqa: E402
from envs.params import DEFAULT_NUM_MAPS, make_env_params  # noqa: E402
from envs.state import EnvParams  # noqa: E402
from terra_rl.benchmarking import runtime_info, time_once, time_repeated  # noqa: E402

SCHEMA_VERSION = 1
NEVER_DONE_MAX_STEPS = 10**9
"""`max_steps` of the zero-done-rate runs: no env times out within a benchmark."""

QUICK_DEFAULTS = {"num_envs": "16", "map_sizes": "16", "steps": 20, "repeats": 2, "num_maps": 16}


@dataclasses.dataclass(frozen=True)
class Shape:
    num_envs: int
    map_size: int

    def __str__(self) -> str:
        return f"{self.num_envs} envs x {self.map_size}x{self.map_size}"


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


# ---------------------------------------------------------------------------- setup


class ParamsCache:
    """One generated map pool per map size, shared by every configuration of that size."""

    def __init__(self, num_maps: int, seed: int):
        self.num_maps = num_maps
        self.seed = seed
        self._pools: dict[int, EnvParams] = {}

    def get(self, config: EnvConfig) -> EnvParams:
        if config.map_size not in self._pools:
            self._pools[config.map_size] = make_env_params(
                config, num_maps=self.num_maps, seed=self.seed
            )
        return self._pools[config.map_size]


def build_batch_env(
    shape: Shape, max_steps: int, pools: ParamsCache, compute_action_mask: bool = True
) -> tuple[BatchEnv, EnvParams]:
    """A fresh env (new objects, so no jit cache is shared with earlier ones) and its pool."""
    config = EnvConfig(
        map_size=shape.map_size, max_steps=max_steps, compute_action_mask=compute_action_mask
    )
    params = pools.get(config)
    return BatchEnv(ExcavationEnv(config), params, shape.num_envs), params


def make_rollout(batch_env: BatchEnv, num_steps: int, reference: bool):
    """Jitted (key, state, obs, params) -> (key, state, obs, done_count, any_done_count,
    reward_sum) running `num_steps` batch steps with uniformly random actions.

    obs and rewards are outputs so that XLA cannot drop their computation as dead code.
    """
    step = batch_env.step_reference if reference else batch_env.step
    num_envs = batch_env.num_envs

    def rollout(key, state, obs, params):
        def one_step(carry, _):
            key, state, obs = carry
            key, key_actions, key_step = jax.random.split(key, 3)
            actions = jax.random.randint(key_actions, (num_envs,), 0, A.NUM_ACTIONS)
            obs, state, reward, terminated, truncated, _ = step(key_step, state, actions, params)
            done = terminated | truncated
            return (key, state, obs), (
                jnp.sum(done, dtype=jnp.int32),
                jnp.any(done),
                jnp.sum(reward),
            )

        (key, state, obs), (done_counts, any_done, rewards) = jax.lax.scan(
            one_step, (key, state, obs), length=num_steps
        )
        return (
            key,
            state,
            obs,
            jnp.sum(done_counts),
            jnp.sum(any_done, dtype=jnp.int32),
            jnp.sum(rewards),
        )

    return jax.jit(rollout)


# ---------------------------------------------------------------------------- measurements


def measure_compile(
    shape: Shape, max_steps: int, pools: ParamsCache, seed: int, repeats: int
) -> dict[str, Any]:
    """Seconds to lower and compile one jitted `BatchEnv.step`, then (with a fresh env, so
    nothing is cached) of its first call, and of a steady call afterwards."""
    batch_env, params = build_batch_env(shape, max_steps, pools)
    key = jax.random.PRNGKey(seed)
    _, state = jax.block_until_ready(jax.jit(batch_env.reset)(key, params))
    actions = jnp.zeros((shape.num_envs,), jnp.int32)

    jax.clear_caches()
    lower_seconds, lowered = time_once(
        lambda: jax.jit(batch_env.step).lower(key, state, actions, params)
    )
    compile_seconds, _ = time_once(lowered.compile)

    jax.clear_caches()
    fresh_env, _ = build_batch_env(shape, max_steps, pools)
    fresh_step = jax.jit(fresh_env.step)
    first_call_seconds, _ = time_once(lambda: fresh_step(key, state, actions, params))
    steady = time_repeated(lambda: fresh_step(key, state, actions, params), repeats)
    return {
        "num_envs": shape.num_envs,
        "map_size": shape.map_size,
        "lower_seconds": lower_seconds,
        "compile_seconds": compile_seconds,
        "lower_and_compile_seconds": lower_seconds + compile_seconds,
        "first_call_seconds": first_call_seconds,
        "steady_call_seconds_median": steady.median,
        "steady_call_seconds_best": steady.best,
    }


def measure_throughput(
    shape: Shape,
    *,
    max_steps: int,
    pools: ParamsCache,
    num_steps: int,
    repeats: int,
    seed: int,
    reference: bool = False,
    compute_action_mask: bool = True,
) -> dict[str, Any]:
    """Env steps/s of `repeats` timed rollouts after one warm-up (compiling) rollout.

    Each call continues from the previous one's state, so episode ages keep the
    staggered distribution of `BatchEnv.reset`.
    """
    batch_env, params = build_batch_env(shape, max_steps, pools, compute_action_mask)
    rollout = make_rollout(batch_env, num_steps, reference)
    key_reset, key_rollout = jax.random.split(jax.random.PRNGKey(seed))
    obs, state = batch_env.reset(key_reset, params)
    carry = (key_rollout, state, obs)
    counts = []

    def call():
        nonlocal carry
        key, state, obs, done_count, any_done_count, reward_sum = rollout(*carry, params)
        carry = (key, state, obs)
        counts.append((done_count, any_done_count))
        return carry, reward_sum

    warmup_seconds, _ = time_once(call)
    counts.clear()
    timing = time_repeated(call, repeats)
    env_steps_per_call = shape.num_envs * num_steps
    done_total = sum(int(done) for done, _ in counts)
    any_done_total = sum(int(any_done) for _, any_done in counts)
    return {
        "num_envs": shape.num_envs,
        "map_size": shape.map_size,
        "path": "step_reference" if reference else "step",
        "max_steps": max_steps,
        "compute_action_mask": compute_action_mask,
        "warmup_seconds": warmup_seconds,
        "call_seconds": list(timing.samples),
        "call_seconds_median": timing.median,
        "call_seconds_best": timing.best,
        "env_steps_per_s_median": env_steps_per_call / timing.median,
        "env_steps_per_s_best": env_steps_per_call / timing.best,
        "env_done_fraction": done_total / (env_steps_per_call * repeats),
        "any_done_fraction": any_done_total / (num_steps * repeats),
    }


# ---------------------------------------------------------------------------- output


def progress(message: str) -> None:
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns, first column left-aligned."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells):
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join(
        [line(headers), line(["-" * width for width in widths]), *(line(row) for row in rows)]
    )


def throughput_cells(result: dict[str, Any]) -> list[str]:
    return [
        f"{result['env_steps_per_s_median']:,.0f}",
        f"{result['env_steps_per_s_best']:,.0f}",
        f"{result['env_done_fraction']:.4f}",
        f"{result['any_done_fraction']:.3f}",
    ]


THROUGHPUT_HEADERS = ["steps/s median", "steps/s best", "done/env-step", "steps w/ done"]


def render_report(results: dict[str, Any]) -> str:
    settings = results["settings"]
    compile_result = results["compile"]
    runtime = results["runtime"]
    sections = [
        f"BatchEnv benchmark on {runtime['backend']} ({runtime['device_kind']}, "
        f"{runtime['cpu_count']} CPUs), jax {runtime['jax_version']}; "
        f"{settings['steps']} steps per call, {settings['repeats']} timed calls, "
        f"random actions",
        f"Compile, one jitted BatchEnv.step at {compile_result['num_envs']} envs x "
        f"{compile_result['map_size']}x{compile_result['map_size']}: "
        f"lower {compile_result['lower_seconds']:.2f} s, "
        f"compile {compile_result['compile_seconds']:.2f} s, "
        f"first call {compile_result['first_call_seconds']:.2f} s, "
        f"steady call {compile_result['steady_call_seconds_median'] * 1e3:.2f} ms",
    ]

    rows = [
        [str(r["num_envs"]), str(r["map_size"]), *throughput_cells(r), f"{r['warmup_seconds']:.1f}"]
        for r in results["throughput"]
    ]
    sections.append(
        f"Throughput, fast path (max_steps {settings['max_steps']}):\n"
        + format_table(["envs", "map", *THROUGHPUT_HEADERS, "warm-up s"], rows)
    )

    reset_paths = results["reset_paths"]
    rows = [
        [case["done_regime"], case["path"], *throughput_cells(case)]
        for case in reset_paths["cases"]
    ]
    speedups = ", ".join(
        f"{regime} {value:.2f}x"
        for regime, value in reset_paths["speedup_step_vs_reference"].items()
    )
    sections.append(
        f"Reset paths at {reset_paths['num_envs']} envs x {reset_paths['map_size']}x"
        f"{reset_paths['map_size']} ('steps w/ done' = batch steps where the fast path's "
        f"reset branch ran):\n"
        + format_table(["done regime", "path", *THROUGHPUT_HEADERS], rows)
        + f"\nstep speed-up over step_reference: {speedups}"
    )

    mask = results["action_mask"]
    rows = [[label, *throughput_cells(mask[label])] for label in ("with_mask", "without_mask")]
    sections.append(
        f"Action mask at {mask['num_envs']} envs x {mask['map_size']}x{mask['map_size']}:\n"
        + format_table(["compute_action_mask", *THROUGHPUT_HEADERS], rows)
        + f"\naction mask share of step time: {mask['share_percent']:.1f}%"
    )
    return "\n\n".join(sections)


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
    sys.exit(main())
