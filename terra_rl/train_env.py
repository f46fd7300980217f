"""The environments the trainer runs, behind one interface.

A train env has `num_envs`, `num_actions`, `action_names`, `max_steps`, `has_success`,
`params` (a pytree the trainer passes to jitted code as an argument), and

    reset(key, params, staggered=True) -> (obs, state)
    step(key, state, actions, params) -> (obs, state, reward, terminated, truncated, info)
    episode_age(state) -> int32 [num_envs]

with auto-reset, `info["final_observation"]` (pre-reset observation), `info["task_done"]`,
`info["episode_progress"]` and `info["action_mask"]` (bool [num_envs, num_actions]).
`ExcavationTrainEnv` wraps `envs.BatchEnv`; `terra_rl.gymnax_env.GymnaxBatchEnv` wraps
gymnax environments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs import BatchEnv, EnvConfig, ExcavationEnv, RewardConfig, make_env_params
from envs.actions import NUM_ACTIONS, TRACKED_ACTION_NAMES, WHEELED_ACTION_NAMES
from terra_rl.config import TrainConfig


class ExcavationTrainEnv:
    """`BatchEnv` with the trainer's interface."""

    has_success = True

    def __init__(self, batch_env: BatchEnv):
        self.batch_env = batch_env
        self.num_envs = batch_env.num_envs
        self.num_actions = NUM_ACTIONS
        self.action_names = action_names(batch_env.env.config.wheeled_fraction)
        self.max_steps = batch_env.env.config.max_steps
        self.params = batch_env.params

    def reset(self, key: jax.Array, params, staggered: bool = True):
        obs, state = self.batch_env.reset(key, params)
        if not staggered:
            state = state.replace(age=jnp.zeros_like(state.age))
        return obs, state

    def step(self, key, state, actions, params):
        return self.batch_env.step(key, state, actions, params)

    def episode_age(self, state) -> jax.Array:
        return state.age


def action_names(wheeled_fraction: float) -> tuple[str, ...]:
    """Names of the 8 actions; in a mixed batch an index means different things per type."""
    if wheeled_fraction == 0.0:
        return TRACKED_ACTION_NAMES
    if wheeled_fraction == 1.0:
        return WHEELED_ACTION_NAMES
    return tuple(
        t if t == w else f"{t}_OR_{w}"
        for t, w in zip(TRACKED_ACTION_NAMES, WHEELED_ACTION_NAMES, strict=True)
    )


def excavation_env_config(config: TrainConfig) -> EnvConfig:
    return EnvConfig(
        map_size=config.map_size,
        max_steps=config.max_steps,
        wheeled_fraction=config.wheeled_fraction,
        reward=RewardConfig() if config.reward == "dense" else RewardConfig.sparse(),
        compute_action_mask=config.use_action_mask,
    )


def make_train_envs(config: TrainConfig):
    """(train env with `num_envs_per_device` envs, eval env with `eval_envs_per_device`)
    for one device; the map pool (`params`) is shared."""
    if config.is_gymnax:
        from terra_rl.gymnax_env import make_gymnax_env, parse_env_id

        env_id = parse_env_id(config.env)
        return (
            make_gymnax_env(env_id, config.num_envs_per_device),
            make_gymnax_env(env_id, config.eval_envs_per_device),
        )
    env = ExcavationEnv(excavation_env_config(config))
    params = make_env_params(
        env.config,
        map_types=config.map_types,
        num_maps=config.num_maps,
        seed=config.map_seed,
        dataset_path=config.dataset_path or None,
        dataset_size=config.dataset_size or None,
    )
    return (
        ExcavationTrainEnv(BatchEnv(env, params, config.num_envs_per_device)),
        ExcavationTrainEnv(BatchEnv(env, params, config.eval_envs_per_device)),
    )
