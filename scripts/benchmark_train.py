"""Training throughput: first-update compile seconds and steady env steps/s of the pmapped
update for a preset, optionally scaled down with flag overrides.

    .venv/bin/python scripts/benchmark_train.py --config cpu_demo
    .venv/bin/python scripts/benchmark_train.py --config solo_excavator \
        --set num_envs_per_device=64 --set num_devices=1 --set precision=float32

Prints one table row per run and writes JSON with `--json`. The compilation cache is off
by default so the compile figure is a cold compile.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import typing

import jax

from terra_rl.cli.parser import OneLineErrorParser
from terra_rl.config import PRESETS, ConfigError, TrainConfig, get_preset, resolve
from terra_rl.perf.benchmarking import runtime_info
from terra_rl.run.huge_pages import reexec_with_huge_pages
from terra_rl.run.trainer import build_trainer


def parse_overrides(pairs: list[str]) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(TrainConfig)
    overrides = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        is_tuple = name in hints and typing.get_origin(hints[name]) is tuple
        if name not in hints or not (text or is_tuple):
            raise ConfigError(f"--set expects FIELD=VALUE with a TrainConfig field, got {pair!r}")
        hint = hints[name]
        if hint is bool:
            overrides[name] = text.lower() in ("1", "true", "yes", "on")
        elif is_tuple:  # comma-separated; empty = ()
            overrides[name] = tuple(text.split(",")) if text else ()
        else:
            overrides[name] = hint(text)
    return overrides


def benchmark(config: TrainConfig, dispatches: int) -> dict[str, float]:
    """Compile, one warm-up dispatch, then `dispatches` timed ones of
    `updates_per_dispatch` updates each."""
    trainer = build_trainer(config)
    runner = trainer.init_runner()
    trainer.compile_update(runner)
    per_dispatch = config.updates_per_dispatch
    start = time.perf_counter()
    runner, metrics = trainer.run_updates(runner, per_dispatch)
    jax.block_until_ready(metrics)
    first_dispatch = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(dispatches):
        runner, metrics = trainer.run_updates(runner, per_dispatch)
    jax.block_until_ready(metrics)
    seconds_per_update = (time.perf_counter() - start) / (dispatches * per_dispatch)
    return {
        "compile_seconds": trainer.compile_seconds,
        "first_update_seconds": first_dispatch / per_dispatch,
        "seconds_per_update": seconds_per_update,
        "updates_per_dispatch": per_dispatch,
        "env_steps_per_update": config.env_steps_per_update,
        "steps_per_second": config.env_steps_per_update / seconds_per_update,
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(PRESETS), default="cpu_demo")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainConfig field (repeatable)")
    parser.add_argument("--updates", type=int, default=5,
                        help="timed dispatches after a warm-up one (each runs "
                             "updates_per_dispatch updates)")
    parser.add_argument("--compilation-cache-dir", default="",
                        help="persistent XLA cache (default: off, for a cold compile figure)")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error("--updates must be >= 1")
    try:
        config = dataclasses.replace(get_preset(args.config), **parse_overrides(args.set))
        config = resolve(config, jax.local_device_count())
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if args.compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache_dir)
    print(f"{args.config} {' '.join(args.set)}: {config.num_devices} device(s) x "
          f"{config.num_envs_per_device} envs x {config.num_steps} steps, "
          f"{config.update_epochs} epochs x {config.num_minibatches} minibatches, "
          f"{config.updates_per_dispatch} update(s) per dispatch, "
          f"{config.map_size}x{config.map_size}, {config.precision}", flush=True)
    result = benchmark(config, args.updates)
    print(f"compile {result['compile_seconds']:.1f} s | first update "
          f"{result['first_update_seconds']:.2f} s | {result['seconds_per_update']:.3f} s/update"
          f" | {result['steps_per_second']:,.0f} env steps/s")
    if args.json:
        record = {"schema_version": 1, "preset": args.config, "overrides": args.set,
                  "config": config.to_dict(), "runtime": runtime_info(), **result}
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=2)
    return 0


if __name__ == "__main__":
    reexec_with_huge_pages()
    sys.exit(main())
