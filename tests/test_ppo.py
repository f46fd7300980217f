"""GAE by hand, the PPO loss against a plain NumPy reference, the entropy schedule, the
minibatch split. (GAE
against its NumPy reference and the action mask are validation gates: tests/test_validation.py.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from terra_rl.algo import ppo
from terra_rl.algo.update import minibatch_rows, shuffled_minibatches, take_rows
from terra_rl.config import TrainConfig, get_preset
from terra_rl.nets.precision import apply_action_mask
from terra_rl.validation.references import GAE_GAMMA, GAE_LAMBDA, jax_gae
from terra_rl.validation.references import hand_built_gae_inputs as hand_built

GAMMA, LAMBDA = GAE_GAMMA, GAE_LAMBDA


def run_gae(*inputs):
    return jax_gae(*inputs, GAMMA, LAMBDA)


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


def test_entropy_schedule_values():
    config = TrainConfig()  # the class defaults: 0.15 to 0.005 over 9500 updates
    coef = lambda update: float(ppo.entropy_coefficient(config, jnp.int32(update)))  # noqa: E731
    assert coef(0) == pytest.approx(0.15)
    assert coef(4750) == pytest.approx((0.15 + 0.005) / 2, rel=1e-5)
    assert coef(9500) == pytest.approx(0.005, rel=1e-5)
    assert coef(20000) == pytest.approx(0.005, rel=1e-5)
    assert coef(1000) > coef(2000) > coef(3000)
    constant = dataclasses.replace(config, ent_coef_decay_updates=0)
    assert float(ppo.entropy_coefficient(constant, jnp.int32(5))) == pytest.approx(0.005)


def test_minibatches_are_shuffled_single_transitions():
    steps, envs, minibatches = 8, 16, 4
    ids = np.arange(steps * envs, dtype=np.int32).reshape(steps, envs)  # id = t * envs + n
    batch = {"id": jnp.asarray(ids), "obs": {"pair": jnp.stack([ids, -ids], axis=-1)}}
    split = shuffled_minibatches(batch, jax.random.PRNGKey(0), minibatches)
    got = np.asarray(split["id"])
    assert got.shape == (minibatches, steps * envs // minibatches)
    assert split["obs"]["pair"].shape == (minibatches, steps * envs // minibatches, 2)
    # Every transition exactly once, and the leaves of one transition stay together.
    np.testing.assert_array_equal(np.sort(got.ravel()), ids.ravel())
    np.testing.assert_array_equal(np.asarray(split["obs"]["pair"])[..., 0], got)
    np.testing.assert_array_equal(np.asarray(split["obs"]["pair"])[..., 1], -got)
    # Not whole env trajectories: each minibatch mixes transitions of more envs than
    # envs / minibatches, and no minibatch holds all the steps of one env.
    for row in got:
        env_of, step_of = row % envs, row // envs
        assert len(set(env_of.tolist())) > envs // minibatches
        assert max(np.bincount(env_of, minlength=envs)) < steps
        assert len(set(step_of.tolist())) > 1
    # Another key, another order.
    other = np.asarray(shuffled_minibatches(batch, jax.random.PRNGKey(1), minibatches)["id"])
    assert not np.array_equal(other, got)
    # The epochs gather each minibatch's rows alone: the same transitions, in the same order,
    # as one permutation of the flat batch cut into minibatches.
    rows = minibatch_rows(batch, jax.random.PRNGKey(0), minibatches)
    order = np.asarray(jax.random.permutation(jax.random.PRNGKey(0), steps * envs))
    np.testing.assert_array_equal(order.reshape(minibatches, -1), got)
    for index in range(minibatches):
        one = take_rows(batch, rows[index])
        np.testing.assert_array_equal(one["id"], got[index])
        np.testing.assert_array_equal(one["obs"]["pair"], np.asarray(split["obs"]["pair"])[index])


def test_categorical_log_prob_and_its_gradient_equal_a_gather():
    logits = jax.random.normal(jax.random.PRNGKey(7), (64, 5), jnp.float32) * 4.0
    logits = logits.at[:, 4].set(-1e9)  # a masked action: large, finite, never chosen
    actions = jax.random.randint(jax.random.PRNGKey(8), (64,), 0, 4)

    def gathered(logits):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(log_probs, actions[:, None], axis=-1)[:, 0]

    got = ppo.categorical_log_prob(logits, actions)
    assert got.shape == (64,) and got.dtype == jnp.float32
    np.testing.assert_array_equal(got, gathered(logits))
    weights = jnp.linspace(-1.0, 2.0, 64)
    grad = jax.grad(lambda x: jnp.sum(weights * ppo.categorical_log_prob(x, actions)))(logits)
    expected = jax.grad(lambda x: jnp.sum(weights * gathered(x)))(logits)
    np.testing.assert_array_equal(grad, expected)


def test_log_prob_and_entropy_equal_distrax_on_masked_float32_logits():
    """distrax (a dev dependency, docs/MODEL.md says why the trainer does not import it) is
    the reference: on float32 logits masked by `apply_action_mask`, with a fully masked row,
    our log-probs and entropies and the log-probs' gradients equal `distrax.Categorical`'s
    bit for bit, the entropy's gradient to float32 rounding, and the masked actions'
    probabilities are exactly 0."""
    # Imported here, never skipped: a missing or broken distrax (or its tfp) fails this test.
    import distrax
    raw = jax.random.normal(jax.random.PRNGKey(3), (32, 6), jnp.bfloat16) * 6.0
    mask = jax.random.bernoulli(jax.random.PRNGKey(4), 0.6, (32, 6)).at[:, 0].set(True)
    mask = mask.at[5].set(False)  # no allowed action: the fallback keeps it finite
    logits = apply_action_mask(raw, mask, fallback_action=0)
    assert logits.dtype == jnp.float32
    actions = jnp.argmax(jnp.where(mask, jnp.arange(6), -1), axis=-1)
    weights = jnp.linspace(-1.0, 2.0, 32)

    def ours(x):
        return ppo.categorical_log_prob(x, actions), ppo.categorical_entropy(x)

    def reference(x):
        distribution = distrax.Categorical(logits=x)
        return distribution.log_prob(actions), distribution.entropy()

    for got, expected in zip(ours(logits), reference(logits), strict=True):
        assert got.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(got)))
        np.testing.assert_array_equal(got, expected)
    probs = distrax.Categorical(logits=logits).probs
    np.testing.assert_array_equal(probs[~mask & mask.any(axis=1, keepdims=True)], 0.0)
    gradients = [[jax.grad(lambda x, f=f, o=o: jnp.sum(weights * f(x)[o]))(logits)
                  for f in (ours, reference)] for o in (0, 1)]
    np.testing.assert_array_equal(*gradients[0])
    # distrax zeroes p * log p where p == 0 with a select before the product, and XLA then
    # rounds the entropy's gradient differently: within 1e-7 of ours here, not bit for bit.
    np.testing.assert_allclose(*gradients[1], rtol=1e-5, atol=1e-6)


def test_rollout_noise_samples_as_jax_categorical_and_never_a_masked_action():
    steps, envs, actions = 6, 5, 4
    gumbel, env_keys = ppo.rollout_noise(jax.random.PRNGKey(3), steps, envs, actions)
    assert gumbel.shape == (steps, envs, actions) and gumbel.dtype == jnp.float32
    assert env_keys.shape == (steps, 2) and env_keys.dtype == jnp.uint32
    assert bool(jnp.all(jnp.isfinite(gumbel)))
    assert len({tuple(k) for k in np.asarray(env_keys).tolist()}) == steps
    # The Gumbel-max trick with jax.random.gumbel's noise is jax.random.categorical's draw.
    logits = jax.random.normal(jax.random.PRNGKey(4), (envs, actions)) * 3.0
    for key in jax.random.split(jax.random.PRNGKey(5), 8):
        noise = jax.random.gumbel(key, (envs, actions), jnp.float32)
        sampled = ppo.sample_actions(logits, noise)
        assert sampled.dtype == jnp.int32
        np.testing.assert_array_equal(sampled, jax.random.categorical(key, logits))
    # Frequencies follow softmax(logits); a masked action (a large negative logit) never comes.
    masked = jnp.array([1.0, 0.0, -1.0, -1e9], jnp.float32)
    many = jax.random.gumbel(jax.random.PRNGKey(6), (20000, actions), jnp.float32)
    counts = np.bincount(np.asarray(ppo.sample_actions(masked[None], many)), minlength=actions)
    np.testing.assert_allclose(counts / counts.sum(), jax.nn.softmax(masked), atol=0.015)
    assert counts[3] == 0


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_optimizer_step_equals_optax_update_and_skips_bit_for_bit(schedule):
    """`make_optimizer_step` against optax's update, `apply_updates` and a select of the
    new or the old parameters and state: the same bits over six steps, one of them
    skipped (its parameters and state unchanged), at a constant and an annealed rate."""
    config = dataclasses.replace(get_preset("cpu_demo"), lr_schedule=schedule, lr=3e-3,
                                 lr_end=1e-4, lr_decay_updates=1, update_epochs=2,
                                 num_minibatches=3, max_grad_norm=0.5)
    optimizer = ppo.make_optimizer(config)
    step = jax.jit(ppo.make_optimizer_step(config))

    @jax.jit
    def reference(params, opt_state, grads, finite):
        updates, new_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        return (jax.tree.map(keep_old, new_params, params),
                jax.tree.map(keep_old, new_state, opt_state))

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"dense": {"kernel": jax.random.normal(keys[0], (5, 3)),
                        "bias": jnp.zeros((3,))},
              "head": jax.random.normal(keys[1], (3,))}
    ours = theirs = (params, optimizer.init(params))
    for i in range(6):
        scale = 0.1 if i % 2 else 10.0  # below and above the clipping norm
        leaf_keys = jax.random.split(jax.random.fold_in(keys[2], i), len(jax.tree.leaves(params)))
        grads = jax.tree.unflatten(jax.tree.structure(params), [
            scale * jax.random.normal(k, x.shape)
            for k, x in zip(leaf_keys, jax.tree.leaves(params), strict=True)])
        finite = jnp.bool_(i != 3)
        before = ours
        ours = step(*ours, grads, finite)
        theirs = reference(*theirs, grads, finite)
        for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        moved = [not np.array_equal(a, b) for a, b in
                 zip(jax.tree.leaves(before), jax.tree.leaves(ours), strict=True)]
        assert any(moved) == (i != 3)
