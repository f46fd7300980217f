"""GymnaxBatchEnv: the train-env interface over gymnax (CartPole-v1, Breakout-MinAtar).

Compiled functions are module-scoped fixtures so each shape family compiles once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.adapters.contract import StepResult
from terra_rl.adapters.gymnax_env import (
    GymnaxBatchEnv,
    make_gymnax_env,
    observation_scaling,
    parse_env_id,
)

NUM_ENVS = 8
INFO_KEYS = {"task_done", "episode_progress", "action_mask"}


@pytest.fixture(scope="module")
def cartpole():
    return make_gymnax_env("CartPole-v1", NUM_ENVS)


@pytest.fixture(scope="module")
def reset_fn(cartpole):
    return jax.jit(cartpole.reset, static_argnames="staggered")


@pytest.fixture(scope="module")
def step_fn(cartpole):
    return jax.jit(cartpole.step)


@pytest.fixture(scope="module")
def fresh(cartpole, reset_fn):
    """Unstaggered reset: (obs, state) with every episode age 0."""
    return reset_fn(jax.random.key(0), cartpole.params, staggered=False)


def _avals(tree):
    return jax.tree.map(lambda x: jax.typeof(x), tree)


def test_reset_and_step_shapes_dtypes(cartpole, fresh, step_fn):
    assert (cartpole.num_envs, cartpole.num_actions, cartpole.max_steps) == (NUM_ENVS, 2, 500)
    assert cartpole.action_names == ("action_0", "action_1")
    assert cartpole.has_success is False and cartpole.obs_shape == (4,)
    obs, state = fresh
    assert obs.shape == (NUM_ENVS, 4) and obs.dtype == jnp.float32
    np.testing.assert_array_equal(cartpole.episode_age(state), np.zeros(NUM_ENVS))
    assert cartpole.episode_age(state).dtype == jnp.int32

    actions = jnp.arange(NUM_ENVS, dtype=jnp.int32) % 2
    next_state, result = step_fn(jax.random.key(1), state, actions, cartpole.params)
    assert isinstance(result, StepResult)
    next_obs, reward, terminated, truncated, final, info = result
    assert next_obs.shape == (NUM_ENVS, 4) and next_obs.dtype == jnp.float32
    assert reward.shape == (NUM_ENVS,) and reward.dtype == jnp.float32
    np.testing.assert_array_equal(reward, np.ones(NUM_ENVS))
    for flag in (terminated, truncated):
        assert flag.shape == (NUM_ENVS,) and flag.dtype == jnp.bool_
    assert set(info) == INFO_KEYS
    assert final.shape == (NUM_ENVS, 4) and final.dtype == jnp.float32
    assert info["task_done"].dtype == jnp.bool_ and not info["task_done"].any()
    assert info["episode_progress"].dtype == jnp.float32
    np.testing.assert_array_equal(info["episode_progress"], np.zeros(NUM_ENVS))
    assert info["action_mask"].shape == (NUM_ENVS, 2) and info["action_mask"].all()
    # One state type (dtypes and weak types) from reset and from step: no recompiles.
    assert _avals(next_state) == _avals(state)
    np.testing.assert_array_equal(cartpole.episode_age(next_state), np.ones(NUM_ENVS))


def _forced(state, time, falling):
    """CartPole state at episode age `time`; envs in `falling` about to drop the pole."""
    theta = jnp.where(falling, 0.2, 0.0).astype(jnp.float32)
    theta_dot = jnp.where(falling, 2.0, 0.0).astype(jnp.float32)
    time = jnp.full_like(state.time, time)
    zeros = jnp.zeros_like(state.x)
    return state.replace(x=zeros, x_dot=zeros, theta=theta, theta_dot=theta_dot, time=time)


def test_time_limit_is_truncated_not_terminated(cartpole, fresh, step_fn):
    falling = jnp.arange(NUM_ENVS) < 3
    state = _forced(fresh[1], cartpole.max_steps - 1, falling)
    actions = jnp.zeros(NUM_ENVS, jnp.int32)
    next_state, (obs, _, terminated, truncated, final, _) = step_fn(
        jax.random.key(2), state, actions, cartpole.params
    )
    # Upright envs hit the time limit: truncated only. Falling envs: terminated only.
    np.testing.assert_array_equal(terminated, falling)
    np.testing.assert_array_equal(truncated, ~falling)
    # Every env was reset: new episodes start at age 0 from a small random state ...
    np.testing.assert_array_equal(cartpole.episode_age(next_state), np.zeros(NUM_ENVS))
    assert np.all(np.abs(obs) <= 0.05)
    # ... and final_observation is the pre-reset state of the finished episode.
    final = np.asarray(final)
    np.testing.assert_allclose(final[:, 0], 0.0, atol=1e-6)  # x = x_dot = 0 before
    assert np.all(np.abs(final[np.asarray(falling), 2]) > 0.2094)
    assert not np.allclose(final, obs)


def test_timeouts_terminal_reports_the_time_limit_as_terminated(cartpole, fresh):
    # gymnax-blines' and PureJaxRL's treatment, opt-in: the same step as above, every env
    # ends, none of them truncated; the observations and final observations are unchanged.
    env = make_gymnax_env("CartPole-v1", NUM_ENVS, timeouts_terminal=True)
    falling = jnp.arange(NUM_ENVS) < 3
    state = _forced(fresh[1], cartpole.max_steps - 1, falling)
    actions = jnp.zeros(NUM_ENVS, jnp.int32)
    key = jax.random.key(2)
    _, (obs, reward, terminated, truncated, final, _) = jax.jit(env.step)(
        key, state, actions, env.params)
    _, plain = jax.jit(cartpole.step)(key, state, actions, cartpole.params)
    np.testing.assert_array_equal(terminated, np.ones(NUM_ENVS, bool))
    np.testing.assert_array_equal(truncated, np.zeros(NUM_ENVS, bool))
    np.testing.assert_array_equal(obs, plain.observation)
    np.testing.assert_array_equal(reward, plain.reward)
    np.testing.assert_array_equal(final, plain.final_observation)


def test_scaled_observations_are_the_plain_ones_mapped_to_the_bounds(cartpole, fresh):
    # CartPole's position and angle are bounded (+-4.8, +-0.419 rad), its velocities not: the
    # bounded two are divided by their half widths, the others pass unchanged, in the reset,
    # the step and the pre-reset final observation alike.
    scaled = make_gymnax_env("CartPole-v1", NUM_ENVS, scale_observations=True)
    half_width = np.array([4.8, 1.0, 12 * 2 * np.pi / 360 * 2, 1.0], np.float32)
    obs, state = scaled.reset(jax.random.key(0), scaled.params, staggered=False)
    np.testing.assert_allclose(obs, np.asarray(fresh[0]) / half_width, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(obs)[:, [1, 3]], np.asarray(fresh[0])[:, [1, 3]])
    falling = jnp.arange(NUM_ENVS) < 3
    state = _forced(state, 10, falling)
    actions, key = jnp.zeros(NUM_ENVS, jnp.int32), jax.random.key(2)
    _, result = jax.jit(scaled.step)(key, state, actions, scaled.params)
    _, plain = jax.jit(cartpole.step)(key, state, actions, cartpole.params)
    for got, raw in ((result.observation, plain.observation),
                     (result.final_observation, plain.final_observation)):
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, np.asarray(raw) / half_width, rtol=1e-6)
    np.testing.assert_array_equal(result.terminated, plain.terminated)
    np.testing.assert_array_equal(result.reward, plain.reward)


def test_observation_scaling_maps_low_to_minus_one_and_high_to_one():
    from gymnax.environments import spaces

    space = spaces.Box(np.array([-1.2, -0.07, 0.0, 1.0]), np.array([0.6, 0.07, np.inf, 1.0]),
                       (4,), jnp.float32)
    centre, half_width = observation_scaling(space, (4,))
    assert centre.dtype == half_width.dtype == np.float32
    low, high = np.array([-1.2, -0.07, 5.0, 1.0]), np.array([0.6, 0.07, 5.0, 1.0])
    # The unbounded third dimension and the degenerate fourth (low == high) pass unchanged.
    np.testing.assert_allclose((low - centre) / half_width, [-1, -1, 5, 1], rtol=1e-6)
    np.testing.assert_allclose((high - centre) / half_width, [1, 1, 5, 1], rtol=1e-6)
    with pytest.raises(ValueError, match="bounds no dimension"):
        observation_scaling(spaces.Discrete(16), (1,))


def test_scaling_an_env_without_bounds_is_refused_in_one_line():
    with pytest.raises(ValueError, match="cannot scale FrozenLake-misc") as error:
        make_gymnax_env("FrozenLake-misc", NUM_ENVS, scale_observations=True)
    assert "\n" not in str(error.value) and "drop the flag" in str(error.value)


def test_pole_falling_step_is_terminated(cartpole, fresh, step_fn):
    falling = jnp.arange(NUM_ENVS) % 2 == 0
    state = _forced(fresh[1], 10, falling)
    next_state, (obs, _, terminated, truncated, final, _) = step_fn(
        jax.random.key(3), state, jnp.ones(NUM_ENVS, jnp.int32), cartpole.params
    )
    np.testing.assert_array_equal(terminated, falling)
    assert not truncated.any()
    done, final = np.asarray(falling), np.asarray(final)
    np.testing.assert_array_equal(final[~done], np.asarray(obs)[~done])
    assert np.all(final[done, 2] > 0.2094) and np.all(np.abs(obs[done]) <= 0.05)
    np.testing.assert_array_equal(cartpole.episode_age(next_state), np.where(done, 0, 11))


@pytest.fixture(scope="module")
def rollout(cartpole, fresh):
    """600 jitted steps inside lax.scan with uniformly random actions."""

    def body(carry, key):
        obs, state = carry
        key_action, key_step = jax.random.split(key)
        actions = jax.random.randint(key_action, (NUM_ENVS,), 0, cartpole.num_actions)
        age = cartpole.episode_age(state)
        next_state, (next_obs, reward, terminated, truncated, final, _) = cartpole.step(
            key_step, state, actions, cartpole.params
        )
        record = dict(
            age=age,
            next_age=cartpole.episode_age(next_state),
            obs=next_obs,
            final=final,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
        )
        return (next_obs, next_state), record

    @jax.jit
    def run(obs, state, key):
        return jax.lax.scan(body, (obs, state), jax.random.split(key, 600))[1]

    return jax.tree.map(np.asarray, run(*fresh, jax.random.key(4)))


def test_scan_rollout_finishes_episodes_within_horizon(cartpole, rollout):
    done = rollout["terminated"] | rollout["truncated"]
    assert not (rollout["terminated"] & rollout["truncated"]).any()
    assert done.sum() >= 4 * NUM_ENVS  # random CartPole episodes last ~20 steps
    lengths = rollout["age"][done] + 1
    assert lengths.max() <= cartpole.max_steps and lengths.min() >= 1
    np.testing.assert_array_equal(rollout["next_age"], np.where(done, 0, rollout["age"] + 1))
    # final_observation == obs where not done; the distinct pre-reset obs where done.
    np.testing.assert_array_equal(rollout["final"][~done], rollout["obs"][~done])
    assert np.all(np.any(rollout["final"][done] != rollout["obs"][done], axis=-1))
    assert np.all(np.abs(rollout["obs"][done]) <= 0.05)
    assert np.isfinite(rollout["obs"]).all() and np.all(rollout["reward"] == 1.0)


def test_staggered_reset_spreads_ages(cartpole, reset_fn, step_fn):
    assert cartpole.can_stagger
    obs, state = reset_fn(jax.random.key(5), cartpole.params, staggered=True)
    ages = np.asarray(cartpole.episode_age(state))
    assert ages.min() >= 0 and ages.max() < cartpole.max_steps
    assert len(np.unique(ages)) >= NUM_ENVS - 2
    next_state, _ = step_fn(
        jax.random.key(6), state, jnp.zeros(NUM_ENVS, jnp.int32), cartpole.params
    )
    assert _avals(next_state) == _avals(state)


def test_unsafe_env_ignores_stagger():
    env = GymnaxBatchEnv("MemoryChain-bsuite", NUM_ENVS)
    assert not env.can_stagger
    _, state = env.reset(jax.random.key(7), env.params, staggered=True)
    np.testing.assert_array_equal(env.episode_age(state), np.zeros(NUM_ENVS))


def test_step_under_pmap(cartpole, fresh):
    obs, state = jax.tree.map(lambda x: x[None], fresh)
    step = jax.pmap(cartpole.step, in_axes=(0, 0, 0, None))
    out = step(
        jax.random.split(jax.random.key(8), 1),
        state,
        jnp.zeros((1, NUM_ENVS), jnp.int32),
        cartpole.params,
    )
    next_state, result = out
    assert result.observation.shape == (1, NUM_ENVS, 4)
    assert result.terminated.shape == (1, NUM_ENVS)
    assert next_state.time.shape == (1, NUM_ENVS)


def test_breakout_minatar_shapes():
    env = make_gymnax_env("Breakout-MinAtar", NUM_ENVS)
    assert env.num_actions == 3 and env.action_names == ("action_0", "action_1", "action_2")
    assert env.max_steps == 1000
    obs, state = jax.jit(env.reset)(jax.random.key(9), env.params)
    assert obs.shape[:3] == (NUM_ENVS, 10, 10) and obs.ndim == 4 and obs.dtype == jnp.float32
    out = jax.jit(env.step)(
        jax.random.key(10), state, jnp.full((NUM_ENVS,), 2, jnp.int32), env.params
    )
    _, (next_obs, reward, terminated, truncated, final, info) = out
    assert next_obs.shape == obs.shape and next_obs.dtype == jnp.float32
    assert final.shape == obs.shape
    assert info["action_mask"].shape == (NUM_ENVS, 3)
    assert reward.dtype == jnp.float32 and terminated.dtype == truncated.dtype == jnp.bool_


def test_parse_env_id():
    assert parse_env_id("gymnax:CartPole-v1") == "CartPole-v1"
    assert parse_env_id("gymnax:Breakout-MinAtar") == "Breakout-MinAtar"
    assert parse_env_id("excavation") is None
    for bad in ("CartPole-v1", "gymnax:", "gym:CartPole-v1", ""):
        with pytest.raises(ValueError, match="gymnax:<env_id>") as error:
            parse_env_id(bad)
        assert "\n" not in str(error.value)


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"gymnax\.registered_envs") as error:
        make_gymnax_env("NoSuchEnv-v0", NUM_ENVS)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="Discrete") as error:
        make_gymnax_env("Pendulum-v1", NUM_ENVS)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="num_envs"):
        make_gymnax_env("CartPole-v1", 0)
