"""Evaluation: `eval_episodes` fresh environments (split over devices) for one `max_steps`
horizon on the eval env's held-out map pool, each env starting on a map of its own, greedy
or sampled actions, statistics summed over devices.

Each env's first episode is the one that counts for the completion rate: it starts at age 0
on its own map and has the whole horizon to finish. Later episodes (after an early success)
only add to `positive_terminations`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax
import jax.numpy as jnp

from terra_rl.algo import run_keys
from terra_rl.algo.device_axis import AXIS
from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout
from terra_rl.algo.update import policy_outputs, traced_at_most
from terra_rl.config import TrainConfig
from terra_rl.nets.models import make_observation_cache

SAMPLED_PREFIX = "eval_sampled/"
VALIDATION_PREFIX = "validation/"


def make_eval_fn(config: TrainConfig, env, policy,
                 trace_counts: collections.Counter | None = None,
                 max_traces: int | None = None) -> Callable:
    """pmapped `evaluate(params, run_key uint32 [D, 2], env_params, sample bool [D])` ->
    metrics (float32 scalars, identical on every device; NaN where there is nothing to
    report). `run_key` is the seed's key (`run_keys.seed_key`) on every device.
    `sample` picks sampled actions instead of the greedy ones; it is traced, so both share
    one compiled program.

    Metrics (all `eval/...`):
      completion_rate             share of eval envs whose first episode finished the task
      completion_rate/<group>     the same per episode group (map type / agent type)
      steps_to_completion         mean length of those successful first episodes
      positive_terminations       successful episodes per eval env within the horizon
      episode_completion_rate     = completion_rate (the name earlier runs logged)
      avg_positive_episode_length mean length of every successful episode
      rewards, max_reward         mean and largest reward per step
      episode_return, episodes_finished   over episodes that ended within the horizon
      first_episode_return        mean return of the first episodes (finished or not)
      <ACTION>                    share of steps taking each action

    Each trace adds 1 to `trace_counts["eval"]`; with `max_traces`, a trace past that many
    fails at once (`update.traced_at_most`).
    """
    num_actions = env.num_actions
    num_groups = max(len(env.group_names), 1)

    def evaluate(params, run_key, env_params, sample):
        # Keys from the seed alone, never from the runner's key or the update: evaluating
        # does not change training, resumed runs match straight ones, and every eval of a
        # run starts the same episodes (same maps and spawns), so its evals compare.
        key = run_keys.device_key(run_key, run_keys.EVAL_STREAM, AXIS)
        key_reset, key_run = jax.random.split(key)
        first_maps = jax.lax.axis_index(AXIS) * env.num_envs + jnp.arange(env.num_envs)
        obs, env_state = env.reset(key_reset, env_params, staggered=False, first_maps=first_maps)
        group = env.episode_group(env_state, env_params)
        zeros = jnp.zeros((env.num_envs,), jnp.float32)
        no = jnp.zeros((env.num_envs,), bool)
        stats = {
            "success": zeros,
            "success_length": zeros,
            "finished": zeros,
            "finished_return": zeros,
            "episode_return": zeros,
            "first_success": no,
            "first_done": no,
            "first_length": zeros,
            "first_return": zeros,
            "reward": zeros,
            "max_reward": jnp.full((env.num_envs,), -jnp.inf, jnp.float32),
            "action_counts": jnp.zeros((num_actions,), jnp.float32),
        }

        def choose(stats, obs, key) -> Choice:
            """The greedy action, or with `sample` one drawn from the policy."""
            key_action, key_env = jax.random.split(key)
            logits, _ = policy_outputs(policy, params, obs, config.use_action_mask)
            sampled = jax.random.categorical(key_action, logits)
            action = jnp.where(sample, sampled, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
            return Choice(action, key_env)

        def record(stats, step: Step):
            """The episodes' statistics, summed per env."""
            action, age, result = step.choice.action, step.age, step.result
            reward, terminated = result.reward, result.terminated
            done = terminated | result.truncated
            success = result.info["task_done"] & terminated
            episode_return = stats["episode_return"] + reward
            first = ~stats["first_done"]
            new = dict(
                success=stats["success"] + success,
                success_length=stats["success_length"] + jnp.where(success, age + 1, 0),
                finished=stats["finished"] + done,
                finished_return=stats["finished_return"] + jnp.where(done, episode_return, 0),
                episode_return=jnp.where(done, 0.0, episode_return),
                first_success=stats["first_success"] | (success & first),
                first_done=stats["first_done"] | done,
                first_length=jnp.where(first & success, age + 1.0, stats["first_length"]),
                first_return=stats["first_return"] + jnp.where(first, reward, 0.0),
                reward=stats["reward"] + reward,
                max_reward=jnp.maximum(stats["max_reward"], reward),
                action_counts=stats["action_counts"]
                + jnp.sum(jax.nn.one_hot(action, num_actions), axis=0),
            )
            return new, None

        keys = jax.random.split(key_run, env.max_steps)
        carry = RolloutCarry(env_state, obs, stats)
        (_, _, stats, _), _ = rollout(env, env_params, choose, record, carry, keys,
                                      cache=make_observation_cache(policy, env.num_envs))
        if trace_counts is not None:
            trace_counts["eval"] += 1  # runs while tracing, never on the device
        return summarize(stats, group, env, num_groups)

    return jax.pmap(traced_at_most(evaluate, max_traces), axis_name=AXIS)


def summarize(stats, group, env, num_groups: int) -> dict[str, jax.Array]:
    """Device-summed metrics from per-env statistics ([num_envs] arrays) and each env's
    first-episode group (int32 [num_envs])."""
    psum = lambda x: jax.lax.psum(jnp.sum(x), AXIS)  # noqa: E731
    ratio = lambda total, count: jnp.where(count > 0, total / count, jnp.nan)  # noqa: E731
    num_envs = psum(jnp.ones((env.num_envs,)))
    steps = num_envs * env.max_steps
    finished = psum(stats["finished"])
    metrics = {
        "eval/rewards": psum(stats["reward"]) / steps,
        "eval/max_reward": jax.lax.pmax(jnp.max(stats["max_reward"]), AXIS),
        "eval/episodes_finished": finished,
        "eval/episode_return": ratio(psum(stats["finished_return"]), finished),
        "eval/first_episode_return": psum(stats["first_return"]) / num_envs,
    }
    if env.has_success:
        successes = psum(stats["success"])
        first_successes = psum(stats["first_success"])
        completion = first_successes / num_envs
        metrics.update(
            {
                "eval/completion_rate": completion,
                "eval/episode_completion_rate": completion,
                "eval/steps_to_completion": ratio(psum(stats["first_length"]), first_successes),
                "eval/positive_terminations": successes / num_envs,
                "eval/avg_positive_episode_length": ratio(
                    psum(stats["success_length"]), successes
                ),
            }
        )
        in_group = jax.nn.one_hot(group, num_groups, dtype=jnp.float32)  # [num_envs, G]
        group_envs = jax.lax.psum(jnp.sum(in_group, axis=0), AXIS)
        group_successes = jax.lax.psum(
            jnp.sum(in_group * stats["first_success"][:, None], axis=0), AXIS
        )
        for index, name in enumerate(env.group_names):
            metrics[f"eval/completion_rate/{name}"] = ratio(
                group_successes[index], group_envs[index]
            )
    counts = jax.lax.psum(stats["action_counts"], AXIS)
    for index, name in enumerate(env.action_names):
        metrics[f"eval/{name}"] = counts[index] / steps
    return metrics


def sampled_names(metrics: dict[str, float]) -> dict[str, float]:
    """The sampled policy's metrics under `eval_sampled/` instead of `eval/`."""
    return {SAMPLED_PREFIX + name.removeprefix("eval/"): value for name, value in metrics.items()}


def validation_names(metrics: dict[str, float]) -> dict[str, float]:
    """The validation pool's metrics under `validation/` instead of `eval/`."""
    return {VALIDATION_PREFIX + name.removeprefix("eval/"): value
            for name, value in metrics.items()}
