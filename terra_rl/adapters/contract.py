"""The contract between an environment and the trainer: `TrainEnv`, what its `step` returns
(`StepResult`), and `observation_spec`, the shapes and dtypes of its observations.

Every array is batched: a leading `[num_envs]` axis. The excavation adapter
(`terra_rl.adapters.train_env.ExcavationTrainEnv`) and the gymnax adapter
(`terra_rl.adapters.gymnax_env.GymnaxBatchEnv`) implement it; `tests/test_env_contract.py`
runs both through the same checks.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp

Observation = Any
"""A pytree of arrays with a leading [num_envs]: the excavation env's dict of map layers and
agent features, or a gymnax task's float32 [num_envs, *obs_shape]."""

STEP_INFO_KEYS = ("task_done", "episode_progress", "action_mask")
"""The keys of `StepResult.info` every env provides."""


class StepResult(NamedTuple):
    """One batched step, after auto-reset.

    observation: the next observation; where an env finished, its new episode's first.
    reward: float32 [num_envs].
    terminated: bool [num_envs], the episode ended on its own (task done, pole fell).
    truncated: bool [num_envs], the episode hit its time limit without terminating; never
        true together with `terminated`.
    final_observation: the observation the step reached before any reset (equal to
        `observation` where the env did not finish): what a timeout bootstraps from.
    info: task_done bool [num_envs] (the task was completed), episode_progress float32
        [num_envs] (the share of the task done so far, 0 where it has no such notion),
        action_mask bool [num_envs, num_actions] (`final_observation`'s mask, all True
        where the episode finished), and whatever else the env reports.
    """

    observation: Observation
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_observation: Observation
    info: dict[str, jax.Array]


@runtime_checkable
class TrainEnv(Protocol):
    """`num_envs` environments with auto-reset, as the trainer runs them. `params` is a pytree
    passed to jitted code as an argument (the map pool, or gymnax's EnvParams);
    `group_names` names the episode groups evaluation reports on, `curriculum_level_names`
    the curriculum's levels (both empty where there are none)."""

    num_envs: int
    num_actions: int
    action_names: tuple[str, ...]
    max_steps: int
    truncation_period: int
    """The fewest steps from a reset to a truncation: two truncations of one env are at
    least this far apart (the rollout keeps one final observation per env per period,
    `terra_rl.algo.final_observations`)."""
    has_success: bool
    params: Any
    group_names: tuple[str, ...]
    curriculum_level_names: tuple[str, ...]

    def observation_spec(self) -> Observation:
        """`jax.ShapeDtypeStruct`s of one batched observation, [num_envs, ...] each."""

    def reset(self, key: jax.Array, params, staggered: bool = True,
              first_maps: jax.Array | None = None) -> tuple[Observation, Any]:
        """(observation, state) of fresh episodes. `staggered` (static) spreads the episode
        ages over [0, max_steps) where the env allows it; `first_maps` int32 [num_envs]
        picks each env's first map where there is a map pool."""

    def step(self, key: jax.Array, state, actions: jax.Array, params) -> tuple[Any, StepResult]:
        """actions int32 [num_envs] -> (next state, `StepResult`)."""

    def episode_age(self, state) -> jax.Array:
        """int32 [num_envs]: steps taken in each env's current episode."""

    def episode_group(self, state, params) -> jax.Array:
        """int32 [num_envs]: each env's episode group, an index into `group_names`."""

    def curriculum_level(self, state) -> jax.Array:
        """int32 [num_envs]: each env's curriculum level (zeros without a curriculum)."""


def checked_step_result(result: StepResult, num_envs: int, num_actions: int) -> StepResult:
    """`result` after chex's checks of the contract's shapes and dtypes (at trace time: the
    compiled step is unchanged). Both adapters return through it."""
    chex.assert_shape([result.reward, result.terminated, result.truncated], (num_envs,))
    chex.assert_type(result.reward, jnp.float32)
    chex.assert_type([result.terminated, result.truncated], jnp.bool_)
    chex.assert_trees_all_equal_shapes_and_dtypes(result.observation, result.final_observation)
    missing = set(STEP_INFO_KEYS) - set(result.info)
    if missing:
        raise KeyError(f"StepResult.info lacks {sorted(missing)}")
    chex.assert_shape([result.info["task_done"], result.info["episode_progress"]], (num_envs,))
    chex.assert_shape(result.info["action_mask"], (num_envs, num_actions))
    chex.assert_type([result.info["task_done"], result.info["action_mask"]], jnp.bool_)
    chex.assert_type(result.info["episode_progress"], jnp.float32)
    return result


def observation_spec_of(env: TrainEnv) -> Observation:
    """The batched observation's `jax.ShapeDtypeStruct`s, from a traced (never run) reset."""
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return jax.eval_shape(lambda k: env.reset(k, env.params)[0], key)
