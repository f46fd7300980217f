"""The truncated steps' final observations a rollout keeps (`terra_rl.algo.final_observations`):
every truncation of a rollout lands in a slot, and the bootstrap reads the same values from
the slots as from every step's final observation stored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.algo.final_observations import empty, from_stacked, kept, slots_needed
from terra_rl.algo.update import make_bootstrap_values_fn
from terra_rl.validation import small


def test_slots_needed_counts_a_first_truncation_at_step_0_then_one_per_period():
    assert slots_needed(32, 1500) == 1
    assert slots_needed(32, 32) == 1
    assert slots_needed(33, 32) == 2
    assert slots_needed(80, 40) == 2
    assert slots_needed(5, 1) == 5
    with pytest.raises(ValueError, match="truncation_period must be >= 1"):
        slots_needed(32, 0)


def truncation_pattern():
    """bool [T, N]: where the validation gates' random rollout truncated (16x16 maps,
    max_steps 40, 80 steps: envs truncate once or twice), and the env's period."""
    rollout = small.small_rollout()
    truncated = np.asarray(rollout.done) & ~np.asarray(rollout.terminated)
    return truncated, small.small_train_env().truncation_period


def test_an_envs_truncations_are_a_period_apart_and_fit_the_slots():
    truncated, period = truncation_pattern()
    steps = truncated.shape[0]
    assert period == small.SMALL_ENV_CONFIG.max_steps  # no stall limit in this config
    assert (truncated.sum(axis=0) == 2).any()  # the pattern needs a second slot
    for env_steps in map(np.flatnonzero, truncated.T):
        assert (np.diff(env_steps) >= period).all()
        assert len(env_steps) <= slots_needed(steps, period)


@pytest.fixture(scope="module")
def kept_and_stacked():
    """The random rollout's truncation pattern with a distinct final observation per step
    and env (a dict of int8 maps and float32 features), kept step by step in slots and
    stacked."""
    truncated, period = truncation_pattern()
    steps, num_envs = truncated.shape
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    stacked = {
        "maps": jax.random.randint(keys[0], (steps, num_envs, 4, 4), -3, 4, jnp.int8),
        "features": jax.random.normal(keys[1], (steps, num_envs, 5)),
    }
    truncated = jnp.asarray(truncated)

    @jax.jit
    def keep_all(stacked, truncated):
        first = jax.tree.map(lambda x: x[0], stacked)
        finals = empty(first, slots_needed(steps, period))

        def step(finals, xs):
            final_observation, truncated_now = xs
            return kept(finals, truncated_now, final_observation), None

        return jax.lax.scan(step, finals, (stacked, truncated))[0]

    return keep_all(stacked, truncated), stacked, truncated


def test_every_truncation_is_kept_once_with_its_step_and_observation(kept_and_stacked):
    finals, stacked, truncated = kept_and_stacked
    truncated = np.asarray(truncated)
    step = np.asarray(finals.step)
    steps, num_envs = truncated.shape
    assert step.shape == (slots_needed(steps, small.SMALL_ENV_CONFIG.max_steps), num_envs)
    assert int(finals.steps_taken) == steps
    np.testing.assert_array_equal(finals.count, truncated.sum(axis=0))
    for env in range(num_envs):
        held = step[:, env][step[:, env] >= 0]
        np.testing.assert_array_equal(held, np.flatnonzero(truncated[:, env]))
        for slot, at in enumerate(step[:, env]):
            for key, values in stacked.items():
                expected = np.asarray(values[at, env]) if at >= 0 else 0
                np.testing.assert_array_equal(np.asarray(finals.obs[key][slot, env]), expected)


def test_the_bootstrap_reads_the_slots_as_it_read_every_steps_final_observation(
        kept_and_stacked):
    finals, stacked, truncated = kept_and_stacked
    steps, num_envs = truncated.shape
    weights = jnp.linspace(-1.0, 1.0, 16 + 5)

    def outputs(params, obs):
        flat = jnp.concatenate([obs["maps"].reshape(num_envs, -1).astype(jnp.float32),
                                obs["features"]], axis=-1)
        return jnp.zeros((num_envs, 2)), jnp.tanh(flat @ (params * weights))

    values = jax.jit(make_bootstrap_values_fn(outputs, num_envs), static_argnums=3)
    last_obs = jax.tree.map(lambda x: x[-1], stacked)
    from_slots = values(jnp.float32(0.7), last_obs, finals, steps)
    from_steps = values(jnp.float32(0.7), last_obs, from_stacked(stacked, truncated), steps)
    for got, expected in zip(from_slots, from_steps, strict=True):
        np.testing.assert_array_equal(got, expected)
    _, direct = jax.vmap(outputs, in_axes=(None, 0))(jnp.float32(0.7), stacked)
    np.testing.assert_array_equal(from_slots[1], np.where(truncated, direct, 0))
    assert np.abs(np.asarray(from_slots[1]))[np.asarray(truncated)].min() > 0
    np.testing.assert_array_equal(from_slots[0], outputs(jnp.float32(0.7), last_obs)[1])


def test_a_step_without_truncation_leaves_the_slots_as_they_were():
    observation = {"maps": jnp.ones((3, 2, 2), jnp.int8)}
    finals = kept(empty(observation, 2), jnp.array([False, True, False]), observation)
    again = kept(finals, jnp.zeros(3, bool), {"maps": jnp.full((3, 2, 2), 5, jnp.int8)})
    np.testing.assert_array_equal(again.obs["maps"], finals.obs["maps"])
    np.testing.assert_array_equal(again.step, [[-1, 0, -1], [-1, -1, -1]])
    np.testing.assert_array_equal(again.count, [0, 1, 0])
    assert int(again.steps_taken) == 2


def test_the_adapters_declare_their_truncation_period():
    from envs import BatchEnv, EnvConfig, ExcavationEnv
    from terra_rl.adapters.gymnax_env import make_gymnax_env
    from terra_rl.adapters.train_env import ExcavationTrainEnv

    cartpole = make_gymnax_env("CartPole-v1", 2)
    assert cartpole.truncation_period == cartpole.max_steps == 500

    for max_steps, stall_steps, period in ((40, 0, 40), (40, 12, 12), (10, 30, 10)):
        env = ExcavationEnv(EnvConfig(map_size=16, max_steps=max_steps,
                                      stall_steps=stall_steps))
        batch = BatchEnv(env, small.small_params(), 2)
        assert ExcavationTrainEnv(batch).truncation_period == period
