"""The reported eval's episodes outside the trainer: its held-out maps, its agent types and the
key of each env's reset, as a one-device eval draws them (`terra_rl.algo.evaluation`), so
that the scripted solver (`scripts/solve_maps.py --eval-pool`) starts where the policy did."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from terra_rl.algo import run_keys
from terra_rl.config import TrainConfig, resolve


@dataclasses.dataclass(frozen=True)
class EvalEpisodes:
    """env: the eval's `ExcavationTrainEnv` (its `params` the eval pool); keys uint32 [E, 2]
    each env's reset key; agent_types int32 [E]; map_types int [E] (`envs.maps.MAP_TYPES`
    indices): env i plays map i."""

    env: object
    keys: np.ndarray
    agent_types: np.ndarray
    map_types: np.ndarray


def eval_reset_keys(seed: int, num_envs: int) -> jax.Array:
    """uint32 [num_envs, 2]: the reset keys of a one-device eval's envs (the eval's device
    key, split into reset and action keys; the reset key split once more by `BatchEnv.reset`
    into the envs' keys and the age key)."""
    stream = jax.random.fold_in(run_keys.seed_key(seed), run_keys.EVAL_STREAM)
    device = jax.random.split(stream, 1)[0]
    key_reset, _ = jax.random.split(device)
    env_keys, _ = jax.random.split(key_reset)
    return jax.random.split(env_keys, num_envs)


def eval_episodes(config: TrainConfig) -> EvalEpisodes:
    """The eval of `config` on one device (its `eval_episodes` envs)."""
    from terra_rl.adapters.train_env import make_train_envs

    config = resolve(dataclasses.replace(config, num_devices=1), 1)
    _, eval_env = make_train_envs(config)
    keys = np.asarray(eval_reset_keys(config.seed, eval_env.num_envs))
    return EvalEpisodes(eval_env, keys, np.asarray(eval_env.batch_env.agent_types),
                        np.asarray(eval_env.params.map_type).astype(int))
