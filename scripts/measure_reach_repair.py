"""A census of the cut-off tests a policy's rollout runs: how many a kept set of reachable
poses, repaired after each DO, would answer without a fill from scratch, and with how many
sweeps (`terra_rl.perf.reach_repair`; docs/PERFORMANCE.md, "The cut-off mask's cost").

    .venv/bin/python scripts/measure_reach_repair.py --config cpu_small_maps --map_size 64 \
        --map_pool 4 --map_types foundations,trenches --wheeled_fraction 0 --max_steps 1500 \
        --init_params RUN_DIR --rounds 4

Takes `train_mixed.py`'s preset and flags (tracked excavators only, with a cut-off rule),
plus `--rounds N` (rollouts of `num_steps` steps, each from where the last ended),
`--margins 4,8,12` (the repair's window margins in tiles) and `--json PATH`. With
`--init_params RUN_DIR` the rollouts take that run's policy's actions, else the initial
policy's. Prints one line per round, a table of counts, and what one fill sweep of a pass's
envs costs on each margin's mean window and on the whole map (median of 9 rounds);
bad input exits 2 with one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run without installation

import jax  # noqa: E402
import numpy as np  # noqa: E402

from terra_rl.algo import ppo  # noqa: E402
from terra_rl.algo.rollout import Choice, RolloutCarry, rollout  # noqa: E402
from terra_rl.cli.flags import parse_train_args  # noqa: E402
from terra_rl.cli.parser import OneLineErrorParser  # noqa: E402
from terra_rl.config import ConfigError, resolve  # noqa: E402
from terra_rl.perf.profiling import make_observation_cache, policy_outputs  # noqa: E402
from terra_rl.perf.reach_repair import make_repair_census, sweep_seconds  # noqa: E402
from terra_rl.run.trainer import build_trainer  # noqa: E402
from terra_rl.run.warm_start import WarmStartError, load_init_params  # noqa: E402

PROG = "measure_reach_repair.py"
CENSUS_BATCH = 256  # states per census call


def summary(counts: dict[str, np.ndarray], margins: tuple[int, ...]) -> dict:
    """The census of every state ([S] arrays) summed over the tested states."""
    tested = counts["tested"]
    total = int(tested.sum())
    share = (lambda x: float(x[tested].mean())) if total else (lambda x: 0.0)
    out = {"states": int(tested.size), "tests": total,
           "cut": share(counts["cut"]), "unchanged": share(counts["unchanged"]),
           "connected": share(counts["connected"]), "grew": share(counts["grew"]),
           "global_sweeps": share(counts["global_sweeps"].astype(float))}
    for m in margins:
        repaired = tested & counts[f"accepted_{m}"] & (counts[f"window_{m}"] > 0)
        out[f"margin_{m}"] = {
            "accepted": share(counts[f"accepted_{m}"]),
            "wrong": int((tested & counts[f"wrong_{m}"]).sum()),
            "sweeps": float(counts[f"sweeps_{m}"][repaired].mean()) if repaired.any() else 0.0,
            "window_tiles": (float(counts[f"window_{m}"][repaired].mean())
                             if repaired.any() else 0.0)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog=PROG, add_help=False)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--margins", default="4,8,12")
    parser.add_argument("--json", type=Path, default=None)
    own, train_argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {own.rounds}")
    try:
        margins = tuple(int(m) for m in own.margins.split(","))
    except ValueError:
        parser.error(f"--margins takes integers separated by commas, got {own.margins!r}")
    args = parse_train_args(train_argv, PROG)
    if args.resume is not None:
        parser.error("--resume does not apply: measure a preset and its flags")
    try:
        config = resolve(args.config, jax.local_device_count())
    except ConfigError as error:
        parser.error(str(error))
    trainer = build_trainer(config)
    env = trainer.train_env
    if not hasattr(env, "batch_env"):
        parser.error(f"--config {config.preset}: the census needs the excavation env")
    try:
        census = make_repair_census(env.batch_env.env, margins)
    except ValueError as error:
        parser.error(str(error))
    runner = trainer.init_runner()
    if config.init_params:
        try:
            init_params, step = load_init_params(
                config.init_params, config.init_params_checkpoint,
                jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                             runner.policy.params))
        except WarmStartError as error:
            parser.error(str(error))
        runner = trainer.with_policy_params(runner, init_params)
        print(f"policy parameters from {config.init_params} (update {step})", flush=True)
    params = jax.tree.map(lambda x: x[0], runner.policy.params)
    policy, steps, envs = trainer.policy, config.num_steps, config.num_envs_per_device
    cache = make_observation_cache(policy, envs)

    @jax.jit
    def policy_rollout(key, state, obs):
        def choose(_, obs, noise) -> Choice:
            gumbel, key_env = noise
            logits, _ = policy_outputs(policy, params, obs, config.use_action_mask)
            return Choice(ppo.sample_actions(logits, gumbel), key_env, None)

        noise = ppo.rollout_noise(key, steps, envs, env.num_actions)
        carry, states = rollout(env, env.params, choose, lambda _, step: (None, step.env_state),
                                RolloutCarry(state, obs, None), noise, cache=cache)
        return carry.env_state, carry.observation, states

    obs, state = jax.jit(lambda key: env.reset(key, env.params))(jax.random.PRNGKey(1))
    key = jax.random.PRNGKey(2)
    parts = []
    for round_ in range(own.rounds):
        key, round_key = jax.random.split(key)
        state, obs, states = policy_rollout(round_key, state, obs)
        flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), states)
        for start in range(0, steps * envs, CENSUS_BATCH):
            part = jax.tree.map(lambda x, s=start: x[s:s + CENSUS_BATCH], flat)
            parts.append({k: np.asarray(v) for k, v in census(part).items()})
        print(f"round {round_ + 1}/{own.rounds}: {sum(p['tested'].sum() for p in parts):,} "
              f"tests so far", flush=True)
    counts = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    result = summary(counts, margins)
    print(f"{result['tests']:,} tests in {result['states']:,} states: cut off "
          f"{result['cut']:.1%}, no reachable pose removed {result['unchanged']:.1%}, the rest "
          f"connected {result['connected']:.1%}, grown {result['grew']:.1%}; a fill from "
          f"scratch sweeps {result['global_sweeps']:.1f} (mean, to convergence)")
    print("margin  repair answers  wrong  its sweeps (mean)  window tiles (mean)")
    for m in margins:
        row = result[f"margin_{m}"]
        print(f"{m:>6}  {row['accepted']:>14.1%}  {row['wrong']:>5}  {row['sweeps']:>17.1f}  "
              f"{row['window_tiles']:>19.0f}")
    # What a sweep costs on each margin's mean window (as a square) against the whole map,
    # for the envs a pass of the env's cut-off test holds.
    sides = [max(3, round(result[f"margin_{m}"]["window_tiles"] ** 0.5)) for m in margins]
    chunk = env.batch_env.max_cut_off_checks
    seconds = sweep_seconds(env.batch_env.env.config,
                            tuple(dict.fromkeys((*sides, config.map_size))), chunk)
    result["sweep_us"] = {f"{size}x{size}": s * 1e6 for size, s in seconds.items()}
    print(f"a sweep of {chunk} envs: " + ", ".join(
        f"{us:.1f} us on {size}" for size, us in result["sweep_us"].items()))
    if own.json is not None:
        own.json.write_text(json.dumps({"config": config.to_dict(), "census": result},
                                       indent=2) + "\n")
        print(f"wrote {own.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
