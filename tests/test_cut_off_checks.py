"""`BatchEnv.observe` runs the cut-off rules' flood fill only for the envs whose observation
its answer changes, a few at a time: its observations equal the per-env observation's
(`jax.vmap(env.observation)`) bit for bit, on the states of random rollouts with both
cut-off rules, remembered refusals and both excavator types, whether the envs to test fit in
one pass or take many."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import EnvConfig, ExcavationEnv, reachability
from envs import actions as A
from envs.batch import MASK_DEPENDENT_KEYS, BatchEnv, cut_off_test, default_cut_off_checks
from terra_rl.validation import small

NUM_ENVS = 16
STEPS = 48


def rules_env(wheeled_fraction: float) -> ExcavationEnv:
    return ExcavationEnv(EnvConfig(map_size=16, max_steps=40, wheeled_fraction=wheeled_fraction,
                                   mask_cut_off_digs=True, mask_cut_off_dumps=True,
                                   remember_refused_digs=True))


@pytest.fixture(scope="module")
def env():
    return rules_env(0.5)


def compare_along_a_rollout(env, chunk: int):
    """Per step of a random masked rollout of `BatchEnv.step` (whose observation is
    `observe`'s with its default chunk): whether `observe` with `chunk` envs a pass equals
    the per-env observation (and the cut-off arguments it builds for a chunk equal the
    observation's), how many envs the flood fill ran for, for how many of them it
    found targets cut off, whether the two ways' observations differed only where `observe`
    chooses between them (`MASK_DEPENDENT_KEYS`, the refusals only with the mask), and in
    how many envs their refusals differed."""
    batch = BatchEnv(env, small.small_params(), NUM_ENVS, max_cut_off_checks=chunk)

    def run(key):
        obs, state = batch.reset(key)

        def body(carry, key):
            obs, state = carry
            compacted = batch.observe(state)
            per_env = jax.vmap(env.observation)(state)
            same = jnp.all(jnp.stack([jnp.array_equal(a, b) for a, b in zip(
                jax.tree.leaves(compacted), jax.tree.leaves(per_env), strict=True)]))
            if_kept, if_cut, arguments = jax.vmap(env.observation_either_way)(state)
            needed = jnp.any(if_kept["action_mask"] != if_cut["action_mask"], axis=1)
            cut = jax.vmap(env.targets_cut_off)(*arguments)
            # What `observe` builds for a chunk: the same arguments from the state alone.
            same &= jnp.all(jnp.stack([jnp.array_equal(a, b) for a, b in zip(
                jax.vmap(env.cut_off_arguments)(state), arguments, strict=True)]))
            alike = jnp.all(jnp.stack([jnp.array_equal(if_kept[k], if_cut[k])
                                       for k in if_kept if k not in MASK_DEPENDENT_KEYS]))
            refusals_differ = jnp.any(
                (if_kept["refused_digs"] != if_cut["refused_digs"]).reshape(NUM_ENVS, -1), axis=1)
            alike &= jnp.all(needed | ~refusals_differ)
            key_action, key_step = jax.random.split(key)
            actions = jax.random.categorical(
                key_action, jnp.where(obs["action_mask"], 0.0, -1e9)).astype(jnp.int32)
            obs, state, *_ = batch.step(key_step, state, actions)
            return (obs, state), (same, jnp.sum(needed), jnp.sum(needed & cut), alike,
                                    jnp.sum(refusals_differ))

        _, per_step = jax.lax.scan(body, (obs, state), jax.random.split(key, STEPS))
        return per_step

    return [np.asarray(x) for x in jax.jit(run)(jax.random.PRNGKey(3))]


@pytest.mark.parametrize("chunk", [1, NUM_ENVS // 8])
def test_the_compacted_observation_equals_the_per_env_one(env, chunk):
    same, needed, cut, alike, refusals_differ = compare_along_a_rollout(env, chunk)
    assert same.all(), np.nonzero(~same)
    assert alike.all() and refusals_differ.sum() > 0, np.nonzero(~alike)
    # The flood fill ran for some envs, never all; several envs a step take several passes.
    assert needed.sum() > 0 and (needed < NUM_ENVS).all()
    assert needed.max() > chunk
    assert (cut <= needed).all()  # random 16x16 rollouts rarely cut targets off: see below


@pytest.mark.parametrize("wheeled_fraction", [0.0, 1.0])
def test_a_batch_of_one_kind_tests_with_that_kinds_fill_alone(wheeled_fraction):
    """A batch of tracked (or wheeled) excavators only runs the fill that drives that kind's
    moves alone (`cut_off_test`), to the per-env observation's answer bit for bit."""
    env = rules_env(wheeled_fraction)
    batch = BatchEnv(env, small.small_params(), NUM_ENVS)
    kind = wheeled_fraction == 1.0
    assert batch._cut_off_test is reachability.make_batch_cut_off(env.config, wheeled=kind)
    same, needed, *_ = compare_along_a_rollout(env, NUM_ENVS // 8)
    assert same.all(), np.nonzero(~same)
    assert needed.sum() > 0


def test_the_cut_off_test_drives_one_kind_only_in_a_batch_of_that_kind(env):
    both = reachability.make_batch_cut_off(env.config)
    assert cut_off_test(env, np.array([A.TRACKED, A.WHEELED])) is both
    tracked = cut_off_test(env, np.array([A.TRACKED] * 3))
    assert tracked is reachability.make_batch_cut_off(env.config, wheeled=False)
    assert tracked is not both
    no_rule = ExcavationEnv(EnvConfig(map_size=16))
    assert cut_off_test(no_rule, np.array([A.TRACKED])) is None


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_a_dig_the_fill_forbids_is_masked_in_the_compacted_observation(agent_type):
    """The corridor of tests/test_env_rules.py (32x32): the cabin turns onto the wall dig,
    which would cut the far targets off. `BatchEnv.step`'s observation (compacted, by the
    fill of the batch's one kind) refuses that DO as the per-env observation does, and marks
    the same refused digs."""
    from tests.test_env_rules import corridor_batch

    env = ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_digs=True,
                                  remember_refused_digs=True,
                                  wheeled_fraction=float(agent_type == A.WHEELED)))
    batch, _, state = corridor_batch(env, agent_type)
    obs, state, *_ = jax.jit(batch.step)(jax.random.PRNGKey(1), state,
                                         jnp.full((2,), A.CABIN_ANTICLOCK, jnp.int32))
    per_env = jax.jit(jax.vmap(env.observation))(state)
    for name in obs:
        np.testing.assert_array_equal(np.asarray(obs[name]), np.asarray(per_env[name]), name)
    assert not np.asarray(obs["action_mask"][:, A.DO]).any()
    if_kept, _, _ = jax.jit(jax.vmap(env.observation_either_way))(state)
    assert np.asarray(if_kept["action_mask"][:, A.DO]).all()  # DO was possible: the fill said no


def test_the_default_chunk_is_a_sixteenth_of_the_batch_on_a_cpu_and_half_elsewhere(env):
    assert [default_cut_off_checks(n, "cpu") for n in (1, 16, 64, 65)] == [1, 1, 4, 5]
    assert [default_cut_off_checks(n, "gpu") for n in (1, 16, 1024)] == [1, 8, 512]
    assert BatchEnv(env, small.small_params(), 64).max_cut_off_checks == 4  # the suite: CPU


def test_a_chunk_below_one_is_refused(env):
    with pytest.raises(ValueError, match="max_cut_off_checks must be >= 1"):
        BatchEnv(env, small.small_params(), NUM_ENVS, max_cut_off_checks=0)


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_a_timed_out_env_carries_the_refusals_of_its_last_state(agent_type):
    """The corridor: both excavators turn onto the wall dig, which the fill refuses; the
    first times out on that step. Its final observation holds the refusals of its last
    state's own mask (`ExcavationEnv.final_refusals`, taken through the batch's test of the
    one kind), as the reference path's and the env going on's do."""
    from tests.test_env_rules import corridor_batch

    env = ExcavationEnv(EnvConfig(map_size=32, max_steps=60, mask_cut_off_digs=True,
                                  remember_refused_digs=True,
                                  wheeled_fraction=float(agent_type == A.WHEELED)))
    batch, _, state = corridor_batch(env, agent_type)
    state = state.replace(age=jnp.asarray([env.config.max_steps - 1, 0], jnp.int32))
    actions = jnp.full((2,), A.CABIN_ANTICLOCK, jnp.int32)
    key = jax.random.PRNGKey(1)
    fast = jax.jit(batch.step)(key, state, actions)
    reference = jax.jit(batch.step_reference)(key, state, actions)
    assert np.asarray(fast[4]).tolist() == [True, False]  # truncated
    last = jax.vmap(env.step_without_observation, in_axes=(0, 0, 0, None))(
        jax.random.split(jax.random.split(key)[0], 2), state, actions, batch.params)[0]
    expected = np.asarray(jax.jit(jax.vmap(env.final_refusals))(last))
    assert expected[0].any() and (expected[0] == expected[1]).all()  # the wall dig refused
    for _, _, _, _, _, info in (fast, reference):
        final = info["final_observation"]
        np.testing.assert_array_equal(np.asarray(final["refused_digs"]), expected)
        assert np.asarray(final["action_mask"][0]).all()  # no action follows a last state


def test_the_rules_change_what_a_step_observes_not_what_it_does(env):
    """The profiler replays a policy's actions in the env without the rules (no mask, no
    refusals) to time what the rules add (`terra_rl.perf.profiling`, `env_step_policy`): the
    same actions from the same reset give the same rewards, ends and states, refusals aside,
    along a random rollout of both excavator types with resets."""
    plain = ExcavationEnv(dataclasses.replace(env.config, compute_action_mask=False,
                                              remember_refused_digs=False))

    def run(env):
        batch = BatchEnv(env, small.small_params(), NUM_ENVS)

        def body(state, key):
            key_action, key_step = jax.random.split(key)
            actions = jax.random.randint(key_action, (NUM_ENVS,), 0, A.NUM_ACTIONS)
            _, state, reward, terminated, truncated, _ = batch.step(key_step, state, actions)
            return state, (reward, terminated, truncated,
                           state.replace(refused_digs=jnp.zeros((), bool)))

        _, state = batch.reset(jax.random.PRNGKey(5))
        return jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(6), STEPS))[1]

    with_rules, without = (jax.jit(lambda e=e: run(e))() for e in (env, plain))
    reward, terminated, truncated, _ = with_rules
    assert (terminated | truncated).any() and np.asarray(reward != 0).any()
    for a, b in zip(jax.tree.leaves(with_rules), jax.tree.leaves(without), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
