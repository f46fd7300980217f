"""Where one training update spends its time, component by component.

    .venv/bin/python scripts/profile_rollout_components.py --config cpu_demo
    .venv/bin/python scripts/profile_rollout_components.py --config solo_excavator \
        --num_devices 1 --num_envs_per_device 64 --map_size 32 --precision float32 --json p.json

Takes `train_mixed.py`'s preset and flags, plus `--repeats N` (rounds, each timing every
section once, so a drifting machine moves all sections alike; the median is reported),
`--json PATH` (one object per section: name, seconds, calls_per_update, seconds_per_update,
steps_per_second) and `--trace DIR` (a `jax.profiler` trace of three
full updates, for TensorBoard or Perfetto, with the compiled update's HLO as
`update.hlo.txt`: `scripts/trace_top_ops.py DIR` names the ops that take the time).
With `--init_params RUN_DIR` the policy's sections and the full update take that run's
policy's actions (a trained policy digs and dumps more often than an untrained one), and so do
`env_step_policy` and `env_step_policy_without_rules`: the rollout's actions replayed with and
without the rules.
Sections: see `terra_rl/perf/profiling.py`. Bad input exits 2 with one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402

from terra_rl.cli.flags import parse_train_args  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402
from terra_rl.config import ConfigError, resolve  # noqa: E402
from terra_rl.perf.benchmarking import runtime_info  # noqa: E402
from terra_rl.perf.profiling import format_table, profile_update  # noqa: E402
from terra_rl.run.huge_pages import reexec_with_huge_pages  # noqa: E402
from terra_rl.run.trainer import build_trainer  # noqa: E402
from terra_rl.run.warm_start import WarmStartError, load_init_params  # noqa: E402

PROG = "profile_rollout_components.py"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog=PROG, add_help=False)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--trace", type=Path, default=None)
    own, train_argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {own.repeats}")
    args = parse_train_args(train_argv, PROG)
    if args.resume is not None:
        parser.error("--resume does not apply: profile a preset and its flags")
    try:
        config = resolve(args.config, jax.local_device_count())
    except ConfigError as error:
        parser.error(str(error))
    print(f"{config.preset}: {config.num_envs_per_device} envs x {config.num_steps} steps per "
          f"device on {config.num_devices} device(s), {config.map_size}x{config.map_size}, "
          f"{config.update_epochs} epochs x {config.num_minibatches} minibatches, "
          f"{config.precision}", flush=True)
    init_params = None
    if config.init_params:  # the policy whose actions the sections take
        try:
            init_params, step = load_init_params(
                config.init_params, config.init_params_checkpoint,
                jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                             build_trainer(config).abstract_runner().policy.params))
        except WarmStartError as error:
            parser.error(str(error))
        print(f"policy parameters from {config.init_params} (update {step})", flush=True)
    sections = profile_update(config, own.repeats, init_params)
    print(format_table(sections))
    if own.json is not None:
        record = {"config": config.to_dict(), "runtime": runtime_info(),
                  "sections": [s.to_dict() for s in sections]}
        own.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {own.json}")
    if own.trace is not None:
        trainer = build_trainer(config)
        runner = trainer.init_runner()
        update = trainer.compile_update(runner)
        own.trace.mkdir(parents=True, exist_ok=True)
        (own.trace / "update.hlo.txt").write_text(update.as_text())
        # Dispatches as the trainer makes them: with updates_per_dispatch K, K updates each.
        count = config.updates_per_dispatch
        dispatches = -(-3 // count)
        with jax.profiler.trace(str(own.trace)):
            for _ in range(dispatches):
                runner, metrics = trainer.run_updates(runner, count)
            jax.block_until_ready(metrics)
        print(f"wrote a jax.profiler trace of {dispatches * count} updates ({dispatches} "
              f"dispatch(es)) and the update's HLO under {own.trace}; read it with "
              f"scripts/trace_top_ops.py {own.trace} --updates {dispatches * count}")
    return 0


if __name__ == "__main__":
    reexec_with_huge_pages()
    raise SystemExit(main())
