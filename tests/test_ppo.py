"""GAE, bootstrapping values and the PPO loss against plain NumPy references."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl import ppo
from terra_rl.config import get_preset
from terra_rl.precision import MASKED_LOGIT, apply_action_mask

GAMMA, LAMBDA = 0.9, 0.8


def numpy_gae(rewards, values, last_value, terminated, truncated, final_values, gamma, lam):
    """Step-by-step reference: bootstrap V(s') unless terminated, V(final obs) if truncated,
    and never carry the advantage across a reset."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for env in range(envs):
        following = 0.0
        for t in reversed(range(steps)):
            if terminated[t, env]:
                next_value = 0.0
            elif truncated[t, env]:
                next_value = final_values[t, env]
            else:
                next_value = values[t + 1, env] if t + 1 < steps else last_value[env]
            done = terminated[t, env] or truncated[t, env]
            delta = rewards[t, env] + gamma * next_value - values[t, env]
            following = delta + (0.0 if done else gamma * lam * following)
            advantages[t, env] = following
    return advantages, advantages + values


def run_gae(rewards, values, last_value, terminated, truncated, final_values):
    next_value = ppo.next_values(
        jnp.asarray(values, jnp.float32),
        jnp.asarray(last_value, jnp.float32),
        jnp.asarray(terminated),
        jnp.asarray(truncated),
        jnp.asarray(final_values, jnp.float32),
    )
    return ppo.gae_advantages(
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(values, jnp.float32),
        next_value,
        jnp.asarray(terminated | truncated),
        GAMMA,
        LAMBDA,
    )


def hand_built(case: str):
    """[T=5, N=1] sequences with one boundary at t=2 of the given kind."""
    rewards = np.array([[1.0], [0.5], [2.0], [-1.0], [0.25]])
    values = np.array([[0.3], [0.7], [1.1], [-0.4], [0.9]])
    last_value = np.array([1.5])
    final_values = np.zeros((5, 1))
    terminated = np.zeros((5, 1), bool)
    truncated = np.zeros((5, 1), bool)
    if case == "terminal":
        terminated[2] = True
    elif case == "truncation":
        truncated[2] = True
        final_values[2] = 3.0
    elif case == "reset_boundary":
        terminated[1] = True
        truncated[3] = True
        final_values[3] = -2.0
    return rewards, values, last_value, terminated, truncated, final_values


@pytest.mark.parametrize("case", ["no_done", "terminal", "truncation", "reset_boundary"])
def test_gae_matches_numpy_reference(case):
    inputs = hand_built(case)
    advantages, returns = run_gae(*inputs)
    expected_adv, expected_ret = numpy_gae(*inputs, GAMMA, LAMBDA)
    np.testing.assert_allclose(advantages, expected_adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(returns, expected_ret, rtol=1e-6, atol=1e-6)
    assert advantages.dtype == jnp.float32


def test_gae_boundaries_by_hand():
    rewards, values, last_value, terminated, truncated, final_values = hand_built("terminal")
    advantages, _ = run_gae(rewards, values, last_value, terminated, truncated, final_values)
    # Terminal at t=2: no bootstrap and nothing from t=3 flows back.
    assert advantages[2, 0] == pytest.approx(rewards[2, 0] - values[2, 0])
    inputs = hand_built("truncation")
    advantages, _ = run_gae(*inputs)
    # Truncated at t=2: bootstraps V(final observation) = 3.0, not V(obs[3]) = -0.4.
    assert advantages[2, 0] == pytest.approx(2.0 + GAMMA * 3.0 - 1.1, rel=1e-6)
    # No done: the last step bootstraps the value after the rollout.
    inputs = hand_built("no_done")
    advantages, _ = run_gae(*inputs)
    assert advantages[4, 0] == pytest.approx(0.25 + GAMMA * 1.5 - 0.9, rel=1e-6)


def test_gae_random_batch_matches_reference():
    rng = np.random.default_rng(0)
    shape = (16, 6)
    terminated = rng.random(shape) < 0.1
    truncated = (rng.random(shape) < 0.1) & ~terminated
    inputs = (
        rng.normal(size=shape),
        rng.normal(size=shape),
        rng.normal(size=shape[1]),
        terminated,
        truncated,
        np.where(truncated, rng.normal(size=shape), 0.0),
    )
    advantages, returns = run_gae(*inputs)
    expected_adv, expected_ret = numpy_gae(*inputs, GAMMA, LAMBDA)
    np.testing.assert_allclose(advantages, expected_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, expected_ret, rtol=1e-5, atol=1e-5)


def numpy_ppo_loss(logits, values, actions, old_log_probs, old_values, adv, returns, *,
                   clip_eps, vf_coef, ent_coef):
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs_all = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    log_probs = log_probs_all[np.arange(len(actions)), actions]
    ratio = np.exp(log_probs - old_log_probs)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    actor = -np.minimum(ratio * adv, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv).mean()
    clipped = old_values + np.clip(values - old_values, -clip_eps, clip_eps)
    value = 0.5 * np.maximum((values - returns) ** 2, (clipped - returns) ** 2).mean()
    entropy = -(np.exp(log_probs_all) * log_probs_all).sum(-1).mean()
    return actor + vf_coef * value - ent_coef * entropy, actor, value, entropy


def test_ppo_loss_matches_numpy_reference():
    rng = np.random.default_rng(1)
    batch, num_actions = 32, 8
    logits = rng.normal(size=(batch, num_actions))
    actions = rng.integers(0, num_actions, batch)
    old_log_probs = np.log(rng.uniform(0.05, 0.5, batch))
    values, old_values, returns = (rng.normal(size=batch) for _ in range(3))
    adv = rng.normal(size=batch)
    kwargs = dict(clip_eps=0.2, vf_coef=2.0, ent_coef=0.01)
    total, metrics = ppo.ppo_loss(
        *(jnp.asarray(x, jnp.float32) for x in (logits, values)),
        jnp.asarray(actions, jnp.int32),
        *(jnp.asarray(x, jnp.float32) for x in (old_log_probs, old_values, adv, returns)),
        clip_value_loss=True,
        normalize_advantages=True,
        **kwargs,
    )
    expected = numpy_ppo_loss(logits, values, actions, old_log_probs, old_values, adv, returns,
                              **kwargs)
    np.testing.assert_allclose(
        [total, metrics["actor_loss"], metrics["value_loss"], metrics["entropy"]],
        expected,
        rtol=1e-5,
    )
    assert 0.0 <= float(metrics["clip_fraction"]) <= 1.0
    assert np.isfinite(float(metrics["approx_kl"]))


def test_masked_logits_give_zero_probability_and_finite_log_probs():
    logits = jnp.array([[1e4, -1e4, 3.0, 0.0], [0.5, 0.5, 0.5, 0.5]], jnp.bfloat16)
    mask = jnp.array([[False, True, True, False], [False, False, False, False]])
    masked = apply_action_mask(logits, mask)
    assert masked.dtype == jnp.float32
    probs = jax.nn.softmax(masked)
    assert float(probs[0, 0]) == 0.0 and float(probs[0, 3]) == 0.0
    log_probs = ppo.categorical_log_prob(masked, jnp.array([2, 1]))
    entropy = ppo.categorical_entropy(masked)
    assert np.all(np.isfinite(log_probs)) and np.all(np.isfinite(entropy))
    # A fully masked row is uniform over all actions, never NaN.
    np.testing.assert_allclose(probs[1], 0.25)
    assert MASKED_LOGIT > float(jnp.finfo(jnp.float32).min)


def test_entropy_schedule_values():
    config = get_preset("solo_excavator")
    coef = lambda update: float(ppo.entropy_coefficient(config, jnp.int32(update)))  # noqa: E731
    assert coef(0) == pytest.approx(0.15)
    assert coef(4750) == pytest.approx((0.15 + 0.005) / 2, rel=1e-5)
    assert coef(9500) == pytest.approx(0.005, rel=1e-5)
    assert coef(20000) == pytest.approx(0.005, rel=1e-5)
    assert coef(1000) > coef(2000) > coef(3000)
    constant = dataclasses.replace(config, ent_coef_decay_updates=0)
    assert float(ppo.entropy_coefficient(constant, jnp.int32(5))) == pytest.approx(0.005)
