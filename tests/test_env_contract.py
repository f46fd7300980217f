"""Both env adapters through the same checks of the trainer's env contract
(`terra_rl.adapters.contract`): the `TrainEnv` protocol, the observation spec, and what a
rollout of `StepResult`s with auto-reset must satisfy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.adapters.contract import STEP_INFO_KEYS, StepResult, TrainEnv
from terra_rl.adapters.gymnax_env import make_gymnax_env
from terra_rl.validation import small

NUM_STEPS = 48


def excavation():
    return small.small_train_env()  # 16 envs, 16x16 maps, episodes of at most 40 steps


def cartpole():
    return make_gymnax_env("CartPole-v1", 8)


@pytest.fixture(scope="module", params=[excavation, cartpole], ids=["excavation", "cartpole"])
def env(request):
    return request.param()


@pytest.fixture(scope="module")
def rollout(env):
    """A staggered reset, then NUM_STEPS steps of uniformly random actions among the allowed
    ones: (first observation, state, per-step records stacked to [NUM_STEPS, ...])."""

    @jax.jit
    def run(key):
        key_reset, key_steps = jax.random.split(key)
        obs, state = env.reset(key_reset, env.params)

        def step(carry, key):
            state, obs, allowed = carry
            key_action, key_env = jax.random.split(key)
            action = jax.random.categorical(key_action, jnp.where(allowed, 0.0, -1e9))
            age = env.episode_age(state)
            state, result = env.step(key_env, state, action.astype(jnp.int32), env.params)
            record = dict(age=age, next_age=env.episode_age(state),
                          group=env.episode_group(state, env.params),
                          level=env.curriculum_level(state), result=result)
            return (state, result.observation, result.info["action_mask"]), record

        allowed = jnp.ones((env.num_envs, env.num_actions), bool)
        if isinstance(obs, dict):
            allowed = obs["action_mask"]
        _, records = jax.lax.scan(step, (state, obs, allowed),
                                  jax.random.split(key_steps, NUM_STEPS))
        return obs, records

    return jax.device_get(run(jax.random.PRNGKey(11)))


def test_the_adapter_implements_the_protocol(env):
    assert isinstance(env, TrainEnv)
    assert env.num_envs >= 1 and env.num_actions == len(env.action_names) >= 2
    assert env.max_steps >= 1 and isinstance(env.has_success, bool)


def documented_observation(env) -> dict[str, tuple[tuple[int, ...], np.dtype]] | tuple:
    """The observation each adapter documents, written out here: the excavation env's dict
    (envs/env.py, envs/state.py: int8 maps, the 12 sectors x 6 layers of local maps, the
    last `num_last_actions` actions) or CartPole's 4 float32 features."""
    n = env.num_envs
    if not hasattr(env, "batch_env"):
        return ((n, 4), np.dtype(np.float32))
    config = env.batch_env.env.config
    size = config.map_size
    maps = {name: ((n, size, size), np.dtype(np.int8))
            for name in ("target_map", "action_map", "obstacles", "dumpability")}
    return {
        **maps,
        "agent_state": ((n, 6), np.dtype(np.int32)),
        "agent_type": ((n,), np.dtype(np.int32)),
        "local_maps": ((n, 12, 6), np.dtype(np.int16)),
        "last_actions": ((n, config.num_last_actions), np.dtype(np.int32)),
        "action_mask": ((n, env.num_actions), np.dtype(np.bool_)),
    }


def as_documented(tree):
    if isinstance(tree, dict):
        return {name: (tuple(leaf.shape), np.dtype(leaf.dtype)) for name, leaf in tree.items()}
    return (tuple(tree.shape), np.dtype(tree.dtype))


def test_the_observation_spec_is_the_documented_observation(env, rollout):
    """The spec (traced, never run) says what the documentation says, and so does every
    observation the env emits: after the reset, after every step and before every reset."""
    spec = env.observation_spec()
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(spec))
    assert as_documented(spec) == documented_observation(env)
    first_obs, records = rollout
    assert as_documented(first_obs) == as_documented(spec)
    result = records["result"]
    for emitted in (result.observation, result.final_observation):
        per_step = jax.tree.map(lambda x: x[0], emitted)  # [NUM_STEPS, ...] -> one step
        assert as_documented(per_step) == as_documented(spec)


def test_step_results_keep_the_contract(env, rollout):
    _, records = rollout
    result = records["result"]
    assert isinstance(result, StepResult)
    shape = (NUM_STEPS, env.num_envs)
    assert result.reward.shape == shape and result.reward.dtype == np.float32
    assert np.isfinite(result.reward).all()
    for flag in (result.terminated, result.truncated):
        assert flag.shape == shape and flag.dtype == np.bool_
    assert not (result.terminated & result.truncated).any()
    assert set(STEP_INFO_KEYS) <= set(result.info)
    assert result.info["action_mask"].shape == (*shape, env.num_actions)
    assert result.info["action_mask"].any(axis=-1).all()
    progress = result.info["episode_progress"]
    assert progress.dtype == np.float32 and ((progress >= 0) & (progress <= 1)).all()
    if not env.has_success:
        assert not result.info["task_done"].any()
    assert not (result.info["task_done"] & result.truncated).any()


def test_auto_reset_keeps_the_final_observation(env, rollout):
    _, records = rollout
    result = records["result"]
    done = result.terminated | result.truncated
    assert done.any(), "the rollout should see episodes end"
    for final, obs in zip(jax.tree.leaves(result.final_observation),
                          jax.tree.leaves(result.observation), strict=True):
        assert final.shape == obs.shape and final.dtype == obs.dtype
        np.testing.assert_array_equal(final[~done], obs[~done])
    np.testing.assert_array_equal(records["next_age"], np.where(done, 0, records["age"] + 1))
    assert (records["age"] < env.max_steps).all()


def test_groups_and_levels_are_in_range(env, rollout):
    _, records = rollout
    for name in ("group", "level"):
        assert records[name].shape == (NUM_STEPS, env.num_envs)
        assert records[name].dtype == np.int32 and (records[name] >= 0).all()
    assert (records["group"] < max(1, len(env.group_names))).all()
    assert (records["level"] < max(1, len(env.curriculum_level_names))).all()
