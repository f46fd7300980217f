"""Evaluate a trained run's checkpoint on held-out maps without creating a run directory
(`scripts/evaluate.py`).

The run's own config, with the episodes, map size and map types of the command line, builds
the trainer's eval (`terra_rl.algo.evaluation`: the same rollout, each env's first episode on a
map of its own for the full horizon) on one device. Held-out maps are generated from the run's
`eval_map_seed` and never equal a map of its training pool; a dataset run evaluates on its
dataset's held-out split. On another map size the flat encoder keeps the pooled map shape it was
trained on (`map_pool` scaled with the size); where no pool fits, or the network's shapes differ,
the error says why.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from envs.params import make_env_params
from terra_rl.adapters.train_env import (
    AGENT_TYPE_NAMES,
    ExcavationTrainEnv,
    dataset_pools,
    excavation_env_config,
    held_out_pools,
)
from terra_rl.config import ConfigError, TrainConfig, config_from_dict, resolve

Z_95 = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% at the default z); (nan,
    nan) for no trials."""
    if trials <= 0:
        return math.nan, math.nan
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class EvalRequest:
    """What to evaluate: the run directory and `scripts/evaluate.py`'s options (0 / empty:
    the run's own)."""

    run_dir: Path
    checkpoint: str = "latest"
    episodes: int = 0
    map_size: int = 0
    map_types: tuple[str, ...] = ()
    sample: bool = False


def eval_config(saved: TrainConfig, request: EvalRequest) -> TrainConfig:
    """The run's config on one device with the request's episodes, maps and sampling; the
    flat encoder's `map_pool` scaled to keep its input shape on another map size."""
    if saved.is_gymnax:
        raise ConfigError(f"{request.run_dir} trained on {saved.env}; scripts/evaluate.py "
                          "evaluates excavation runs (held-out maps)")
    changes: dict[str, Any] = dict(num_devices=1, eval_sampling=False,
                                   num_envs_per_device=saved.num_envs_per_device)
    if request.episodes:
        changes["eval_episodes"] = request.episodes
    if request.map_types:
        changes["map_types"] = request.map_types
    size = request.map_size or saved.map_size
    from envs.config import VALID_MAP_SIZES

    if size not in VALID_MAP_SIZES:
        raise ConfigError(f"--map_size must be one of {VALID_MAP_SIZES}, got {size}")
    if size != saved.map_size:
        if saved.dataset_path:
            raise ConfigError(f"{request.run_dir} trained on the dataset {saved.dataset_path}: "
                              "it is evaluated on its held-out split at its own map size; "
                              "drop --map_size")
        pooled, remainder = divmod(saved.map_size, saved.map_pool)
        pool, rest = divmod(size, pooled)
        if rest or pool < 1 or remainder:
            raise ConfigError(
                f"the policy's map encoder takes a {pooled}x{pooled} pooled map "
                f"({saved.map_size}x{saved.map_size} pooled by {saved.map_pool}); a "
                f"{size}x{size} map pools to that shape by no whole factor: pick a map size "
                f"that is a multiple of {pooled}")
        changes.update(map_size=size, map_pool=pool)
    if saved.dataset_path and request.map_types:
        raise ConfigError(f"{request.run_dir} trained on the dataset {saved.dataset_path}: it "
                          "is evaluated on its held-out split; drop --map_types")
    config = dataclasses.replace(saved, **changes)
    return resolve(config, 1)


def build_eval_env(saved: TrainConfig, config: TrainConfig):
    """The eval env of `config` whose held-out maps avoid `saved`'s training pool."""
    if config.dataset_path:
        # The run's own split (its eval_episodes held out); --episodes takes the first ones.
        _, _, maps = dataset_pools(dataclasses.replace(config, eval_episodes=saved.eval_episodes))
        if config.eval_episodes > maps.count:
            raise ConfigError(f"--episodes {config.eval_episodes} exceeds the {maps.count} "
                              "held-out maps of the run's dataset; lower it")
        maps = maps.head(config.eval_episodes)
    else:
        # The run's training pool, which the held-out maps must avoid.
        train_params = make_env_params(excavation_env_config(saved),
                                       map_types=saved.curriculum or saved.map_types,
                                       num_maps=saved.num_maps, seed=saved.map_seed)
        env_config = excavation_env_config(config, training=False)
        _, maps = held_out_pools(config, env_config, train_params)
    from envs import BatchEnv, ExcavationEnv
    from envs.params import params_from_maps

    env = ExcavationEnv(excavation_env_config(config, training=False))
    return ExcavationTrainEnv(BatchEnv(env, params_from_maps(maps), config.eval_episodes)), maps


def evaluate_checkpoint(request: EvalRequest) -> dict[str, Any]:
    """The report of `scripts/evaluate.py`: completion overall and per (map type, excavator)
    group with Wilson 95% intervals, steps to completion, and what was evaluated."""
    from terra_rl.algo import run_keys
    from terra_rl.algo.evaluation import make_eval_fn
    from terra_rl.nets.models import make_policy
    from terra_rl.run.trainer import policy_config
    from terra_rl.run.warm_start import load_init_params

    run_dir = Path(request.run_dir)
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir} is not a terra_rl run directory (no config.json); pass "
                          "the directory a training run created (runs/<run_name>)")
    saved = config_from_dict(json.loads((run_dir / "config.json").read_text()))
    config = eval_config(saved, dataclasses.replace(request, run_dir=run_dir))
    env, maps = build_eval_env(saved, config)
    policy = make_policy(policy_config(config), env.num_actions, env.observation_spec())
    example = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype),
                           env.observation_spec())
    like = jax.eval_shape(policy.init, jax.random.PRNGKey(0), example)
    params, update = load_init_params(run_dir, request.checkpoint, like)
    eval_fn = make_eval_fn(config, env, policy)
    one = lambda tree: jax.tree.map(lambda x: np.asarray(x)[None], tree)  # noqa: E731
    metrics = eval_fn(one(params), one(run_keys.seed_key(config.seed)), one(env.params),
                      np.asarray([request.sample]))
    metrics = {name: float(np.asarray(value)[0]) for name, value in metrics.items()}

    agent_types = env.batch_env.agent_types
    groups = []
    for name in env.group_names:
        map_type, agent = name.split("/")
        in_group = (np.asarray(maps.map_type) == _map_type_index(map_type)) & (
            agent_types == AGENT_TYPE_NAMES.index(agent))
        count = int(in_group.sum())
        if not count:
            continue
        rate = metrics[f"eval/completion_rate/{name}"]
        groups.append(_row(name, round(rate * count), count))
    total = config.eval_episodes
    overall = _row("all", round(metrics["eval/completion_rate"] * total), total)
    return {
        "run_dir": str(run_dir),
        "checkpoint": request.checkpoint,
        "update": update,
        "policy": "sampled" if request.sample else "greedy",
        "map_size": config.map_size,
        "map_types": list(config.map_types),
        "map_pool": config.map_pool,
        "max_steps": config.max_steps,
        "held_out": ("the dataset's held-out split" if config.dataset_path
                     else f"generated, eval_map_seed {config.eval_map_seed}"),
        "groups": groups,
        "all": overall,
        "steps_to_completion": _finite_or_none(metrics["eval/steps_to_completion"]),
        "first_episode_return": metrics["eval/first_episode_return"],
    }


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN: None where nothing completed."""
    return value if math.isfinite(value) else None


def _map_type_index(name: str) -> int:
    from envs.maps import MAP_TYPES

    return MAP_TYPES.index(name)


def _row(name: str, completed: int, episodes: int) -> dict[str, Any]:
    low, high = wilson_interval(completed, episodes)
    return {"group": name, "episodes": episodes, "completed": completed,
            "completion_rate": completed / episodes if episodes else math.nan,
            "interval_95": [low, high]}


def format_report(report: dict[str, Any]) -> str:
    """The report as the lines `scripts/evaluate.py` prints."""
    lines = [
        f"{report['run_dir']} (checkpoint {report['checkpoint']}, update {report['update']}): "
        f"{report['policy']} policy on {report['all']['episodes']} held-out "
        f"{report['map_size']}x{report['map_size']} maps of {','.join(report['map_types'])} "
        f"({report['held_out']}), horizon {report['max_steps']} steps",
        f"{'group':<24}{'episodes':>9}{'completed':>11}{'rate':>8}   95% interval (Wilson)",
    ]
    for row in [*report["groups"], report["all"]]:
        low, high = row["interval_95"]
        lines.append(f"{row['group']:<24}{row['episodes']:>9}{row['completed']:>11}"
                     f"{row['completion_rate']:>8.1%}   [{low:.1%}, {high:.1%}]")
    steps = report["steps_to_completion"]
    lines.append("steps to completion (mean over completed episodes): "
                 + ("none completed" if steps is None else f"{steps:.1f}"))
    return "\n".join(lines)
