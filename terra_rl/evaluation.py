"""Evaluation: `eval_episodes` fresh environments (split over devices) for a full
`max_steps` horizon, greedy actions by default, statistics summed over devices."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from terra_rl.config import TrainConfig
from terra_rl.update import AXIS, policy_outputs


def make_eval_fn(config: TrainConfig, env, policy) -> Callable:
    """pmapped `evaluate(params, keys uint32 [D, 2], env_params) -> metrics` (float32
    scalars, identical on every device; NaN where there is nothing to report).

    Metrics: `eval/positive_terminations` (successful episodes per eval env),
    `eval/rewards` (mean reward per step), `eval/max_reward` (largest single-step
    reward), `eval/episode_completion_rate` (share of envs whose first episode succeeded),
    `eval/avg_positive_episode_length`, `eval/episode_return` and `eval/episodes_finished`
    (episodes that ended within the horizon), and `eval/<ACTION>` (share of steps taking
    each action).
    """
    num_actions = env.num_actions

    def evaluate(params, key, env_params):
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params, staggered=False)
        zeros = jnp.zeros((env.num_envs,), jnp.float32)
        stats = {
            "success": zeros,
            "success_length": zeros,
            "finished": zeros,
            "finished_return": zeros,
            "episode_return": zeros,
            "first_success": jnp.zeros((env.num_envs,), bool),
            "first_done": jnp.zeros((env.num_envs,), bool),
            "reward": zeros,
            "max_reward": jnp.full((env.num_envs,), -jnp.inf, jnp.float32),
            "action_counts": jnp.zeros((num_actions,), jnp.float32),
        }

        def step(carry, key):
            obs, env_state, stats = carry
            key_action, key_env = jax.random.split(key)
            logits, _ = policy_outputs(policy, params, obs, config.use_action_mask)
            if config.eval_sampling:
                action = jax.random.categorical(key_action, logits)
            else:
                action = jnp.argmax(logits, axis=-1)
            action = action.astype(jnp.int32)
            age = env.episode_age(env_state)
            obs, env_state, reward, terminated, truncated, info = env.step(
                key_env, env_state, action, env_params
            )
            done = terminated | truncated
            success = info["task_done"] & terminated
            episode_return = stats["episode_return"] + reward
            new = dict(
                success=stats["success"] + success,
                success_length=stats["success_length"] + jnp.where(success, age + 1, 0),
                finished=stats["finished"] + done,
                finished_return=stats["finished_return"] + jnp.where(done, episode_return, 0),
                episode_return=jnp.where(done, 0.0, episode_return),
                first_success=stats["first_success"] | (success & ~stats["first_done"]),
                first_done=stats["first_done"] | done,
                reward=stats["reward"] + reward,
                max_reward=jnp.maximum(stats["max_reward"], reward),
                action_counts=stats["action_counts"]
                + jnp.sum(jax.nn.one_hot(action, num_actions), axis=0),
            )
            return (obs, env_state, new), None

        keys = jax.random.split(key_run, env.max_steps)
        (_, _, stats), _ = jax.lax.scan(step, (obs, env_state, stats), keys)
        return summarize(stats, env, env.max_steps)

    return jax.pmap(evaluate, axis_name=AXIS)


def summarize(stats, env, horizon: int) -> dict[str, jax.Array]:
    psum = lambda x: jax.lax.psum(jnp.sum(x), AXIS)  # noqa: E731
    num_envs = psum(jnp.ones((env.num_envs,)))
    steps = num_envs * horizon
    successes = psum(stats["success"])
    finished = psum(stats["finished"])
    metrics = {
        "eval/rewards": psum(stats["reward"]) / steps,
        "eval/max_reward": jax.lax.pmax(jnp.max(stats["max_reward"]), AXIS),
        "eval/episodes_finished": finished,
        "eval/episode_return": jnp.where(
            finished > 0, psum(stats["finished_return"]) / finished, jnp.nan
        ),
    }
    if env.has_success:
        metrics.update(
            {
                "eval/positive_terminations": successes / num_envs,
                "eval/episode_completion_rate": psum(stats["first_success"]) / num_envs,
                "eval/avg_positive_episode_length": jnp.where(
                    successes > 0, psum(stats["success_length"]) / successes, jnp.nan
                ),
            }
        )
    counts = jax.lax.psum(stats["action_counts"], AXIS)
    for index, name in enumerate(env.action_names):
        metrics[f"eval/{name}"] = counts[index] / steps
    return metrics
