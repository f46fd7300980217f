"""What each `--precision` buys: env steps/s of the full pmapped update, memory, the
log-prob error against float32 and the first updates' learning curve, at one shape.

    .venv/bin/python scripts/benchmark_precision.py --config cpu_demo
    .venv/bin/python scripts/benchmark_precision.py --config solo_excavator \
        --set num_devices=1 --json docs/benchmarks/precision_gpu.json

Each precision runs in its own process (same seed), so peak memory is that precision's
alone. Memory: XLA's buffer assignment for the compiled update (arguments + outputs +
temporaries, minus donated aliases) and the measured peak (device `peak_bytes_in_use` on a
GPU, the process's max RSS on CPU). The log-prob error compares the trained parameters
evaluated by the half-precision network with the same parameters evaluated in float32, on
the rollout's last observations. The learning curve is the per-update training metrics of
the first `--curve-updates` updates.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from terra_rl.algo.update import policy_outputs
from terra_rl.choices import PRECISIONS
from terra_rl.cli.parser import OneLineErrorParser
from terra_rl.config import PRESETS, ConfigError, TrainConfig, get_preset, resolve
from terra_rl.nets.models import make_policy
from terra_rl.perf.benchmarking import runtime_info
from terra_rl.run.device_metrics import host_metrics
from terra_rl.run.trainer import build_trainer, policy_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_train import parse_overrides  # noqa: E402

CURVE_METRICS = (
    "train/reward",
    "train/entropy",
    "train/approx_kl",
    "train/value_loss",
    "train/grad_norm",
    "precision/loss_scale",
    "precision/overflow_steps",
)
LOG_PROB_BATCH = 256
MIB = 2**20


def compiled_memory_bytes(compiled) -> int | None:
    """Arguments + outputs + temporaries of a compiled function, minus donated aliases."""
    try:
        stats = compiled.memory_analysis()
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
               + stats.temp_size_in_bytes - stats.alias_size_in_bytes)


def peak_memory_bytes() -> tuple[str, int]:
    """("device", peak bytes in use) on a GPU, else ("host_rss", max RSS of this process)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return "device", int(stats["peak_bytes_in_use"])
    return "host_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def log_prob_error(config: TrainConfig, trainer, runner) -> dict[str, float]:
    """Largest and mean |log pi| and |V| differences of `config.precision` against float32,
    over every action, for device 0's parameters on its last observations."""
    params = jax.tree.map(lambda x: x[0], runner.policy.params)
    obs = jax.tree.map(lambda x: x[0][:LOG_PROB_BATCH], runner.last_obs)
    reference = make_policy(
        dataclasses.replace(policy_config(config), precision="float32"),
        trainer.train_env.num_actions, obs,
    )
    logits, values = policy_outputs(trainer.policy, params, obs, config.use_action_mask)
    ref_logits, ref_values = policy_outputs(reference, params, obs, config.use_action_mask)
    error = jnp.abs(jax.nn.log_softmax(logits) - jax.nn.log_softmax(ref_logits))
    # Masked actions have no probability in either network; their log-probs are not compared.
    allowed = ref_logits > jnp.finfo(jnp.float32).min / 8
    error = jnp.where(allowed, error, 0.0)
    return {
        "log_prob_max_abs_error": float(jnp.max(error)),
        "log_prob_mean_abs_error": float(jnp.sum(error) / jnp.sum(allowed)),
        "value_max_abs_error": float(jnp.max(jnp.abs(values - ref_values))),
    }


def benchmark_one(config: TrainConfig, updates: int, curve_updates: int) -> dict:
    # One update a call, whatever the env's default (gymnax envs resolve to 16).
    config = dataclasses.replace(config, updates_per_dispatch=1)
    trainer = build_trainer(config)
    runner = trainer.init_runner()
    update_fn = trainer.compile_update(runner)
    planned = compiled_memory_bytes(update_fn)
    curve = []
    start = time.perf_counter()
    for _ in range(curve_updates):
        runner, metrics = update_fn(runner, trainer.env_params)
        metrics = host_metrics(metrics)
        curve.append({name: metrics.get(name) for name in CURVE_METRICS})
    curve_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(updates):
        runner, metrics = update_fn(runner, trainer.env_params)
    jax.block_until_ready(metrics)
    seconds_per_update = (time.perf_counter() - start) / updates
    peak_kind, peak = peak_memory_bytes()
    return {
        "precision": config.precision,
        "compile_seconds": trainer.compile_seconds,
        "curve_seconds": curve_seconds,
        "seconds_per_update": seconds_per_update,
        "steps_per_second": config.env_steps_per_update / seconds_per_update,
        "planned_memory_bytes": planned,
        "peak_memory_kind": peak_kind,
        "peak_memory_bytes": peak,
        "curve": curve,
        **log_prob_error(config, trainer, runner),
    }


def run_child(args, precision: str) -> dict:
    """One precision in a fresh process; its result dict."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--config", args.config, "--updates",
                   str(args.updates), "--curve-updates", str(args.curve_updates),
                   "--only", precision, "--child-json", str(out)]
        for pair in args.set:
            command += ["--set", pair]
        if args.compilation_cache_dir:
            command += ["--compilation-cache-dir", args.compilation_cache_dir]
        subprocess.run(command, check=True)
        return json.loads(out.read_text())


def format_row(result: dict, baseline: dict | None) -> str:
    speedup = (f"x{result['steps_per_second'] / baseline['steps_per_second']:.2f}"
               if baseline else "x -")
    planned = result["planned_memory_bytes"]
    planned_text = f"{planned / MIB:.1f} MiB" if planned else "n/a"
    return (
        f"{result['precision']:>8} | compile {result['compile_seconds']:6.1f} s | "
        f"{result['seconds_per_update']:7.3f} s/update | "
        f"{result['steps_per_second']:>10,.0f} steps/s ({speedup} float32) | "
        f"planned {planned_text} | peak {result['peak_memory_bytes'] / MIB:.1f} MiB "
        f"({result['peak_memory_kind']}) | max |dlog pi| {result['log_prob_max_abs_error']:.2e}"
        f", mean {result['log_prob_mean_abs_error']:.2e}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(PRESETS), default="cpu_demo")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainConfig field (repeatable); not precision")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="comma-separated, from float32,bfloat16,float16 (default: all)")
    parser.add_argument("--updates", type=int, default=5, help="timed updates (default 5)")
    parser.add_argument("--curve-updates", type=int, default=10,
                        help="updates whose metrics form the learning curve (default 10)")
    parser.add_argument("--compilation-cache-dir", default="",
                        help="persistent XLA cache (default: off, so compiles are cold)")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--only", choices=PRECISIONS, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.updates < 1 or args.curve_updates < 1:
        parser.error("--updates and --curve-updates must be >= 1")
    precisions = [p for p in args.precisions.split(",") if p]
    if not precisions or set(precisions) - set(PRECISIONS):
        parser.error(f"--precisions takes a comma-separated subset of {','.join(PRECISIONS)}")
    try:
        overrides = parse_overrides(args.set)
        if "precision" in overrides:
            raise ConfigError("--set precision=... is not allowed here; use --precisions")
        base = dataclasses.replace(get_preset(args.config), **overrides)
        configs = {p: resolve(dataclasses.replace(base, precision=p), jax.local_device_count())
                   for p in precisions}
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if args.compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache_dir)

    if args.only:  # child process: one precision
        result = benchmark_one(configs[args.only], args.updates, args.curve_updates)
        Path(args.child_json).write_text(json.dumps(result))
        return 0

    config = configs[precisions[0]]
    print(f"{args.config} {' '.join(args.set)}: {config.num_devices} "
          f"{jax.devices()[0].device_kind} device(s) x {config.num_envs_per_device} envs x "
          f"{config.num_steps} steps, {config.update_epochs} epochs x "
          f"{config.num_minibatches} minibatches, {config.map_size}x{config.map_size}",
          flush=True)
    results = {}
    for precision in precisions:
        results[precision] = run_child(args, precision)
        print(format_row(results[precision], results.get("float32")), flush=True)
    print("learning curve (train/reward per update):")
    for precision, result in results.items():
        rewards = " ".join(f"{point['train/reward']:+.4f}" for point in result["curve"])
        print(f"{precision:>8}: {rewards}")
    if args.json:
        record = {"schema_version": 1, "preset": args.config, "overrides": args.set,
                  "config": config.to_dict(), "runtime": runtime_info(), "results": results}
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
