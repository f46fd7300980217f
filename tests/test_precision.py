"""The precision policy: float32 log-probs of half-precision networks close to the float32
network's, the loss-scale arithmetic, and short runs of the pmapped update in bfloat16 and
float16 on 4 CPU devices (one injected float16 overflow included).

Elsewhere: the dtypes inside the network (tests/test_models.py), masking with extreme logits
and every head's gradient in each precision (the `ppo-mask` and `precision-head-gradients`
gates, tests/test_validation.py). Same shapes as tests/test_trainer.py's TINY config.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_trainer import NUM_DEVICES, leaves_equal, tiny_config

from terra_rl.algo.ppo import categorical_entropy, categorical_log_prob
from terra_rl.algo.update import policy_outputs
from terra_rl.nets import loss_scaling
from terra_rl.nets.loss_scaling import LossScale, next_loss_scale
from terra_rl.nets.models import PolicyConfig, make_policy
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.device_metrics import host_metrics
from terra_rl.run.trainer import build_trainer

HALF_PRECISIONS = ("bfloat16", "float16")
# Largest |log pi(a)| error of the half-precision encoders against the float32 network on
# the batch below (logits with a spread of several units, as in a trained policy).
LOG_PROB_TOLERANCE = {"bfloat16": 0.05, "float16": 0.01}


# --------------------------------------------------------------------------- network


@pytest.fixture(scope="module")
def policy_batch():
    """(float32 params with a sharpened policy head, obs batch [32, ...], actions [32])
    from the real environment after a few random steps."""
    config = tiny_config()
    trainer_env = build_trainer(config).train_env
    key = jax.random.PRNGKey(3)
    # Jitted here and below: op by op, the env step and the CNN's init dispatch hundreds of
    # small compiles (20 s more on 2 cores).
    obs, state = jax.jit(trainer_env.reset)(key, trainer_env.params)
    step = jax.jit(trainer_env.step)
    observations = [obs]
    for _ in range(3):
        key, key_action, key_step = jax.random.split(key, 3)
        actions = jax.random.randint(key_action, (trainer_env.num_envs,), 0, 8)
        state, result = step(key_step, state, actions, trainer_env.params)
        obs = result.observation
        observations.append(obs)
    obs = jax.tree.map(lambda *xs: jnp.concatenate(xs), *observations)
    policy = make_policy(PolicyConfig(map_feature_dim=32, hidden_dim=32), 8, obs)
    params = jax.jit(policy.init)(jax.random.PRNGKey(0), obs)
    # A freshly initialised head gives logits of about 0.01; scale them to a trained
    # policy's spread so rounding errors are measured where they matter.
    head = params["params"]["policy_head"]
    params["params"]["policy_head"] = dict(head, kernel=head["kernel"] * 300.0)
    actions = jax.random.randint(jax.random.PRNGKey(4), (obs["agent_type"].shape[0],), 0, 8)
    return params, obs, actions


def policy_for(precision: str, obs):
    return make_policy(PolicyConfig(map_feature_dim=32, hidden_dim=32, precision=precision),
                       8, obs)


@pytest.mark.parametrize("precision", HALF_PRECISIONS)
def test_log_probs_entropy_ratio_match_float32(policy_batch, precision):
    params, obs, actions = policy_batch

    def outputs(name):  # compiled, as training runs it (op by op took longer to compile)
        policy = policy_for(name, obs)
        return jax.jit(lambda p, o: policy_outputs(policy, p, o, True))(params, obs)

    reference, half = outputs("float32"), outputs(precision)
    assert reference[0].std() > 1.0  # a trained policy's spread, not ~0.01
    log_prob_ref = categorical_log_prob(reference[0], actions)
    log_prob = categorical_log_prob(half[0], actions)
    entropy_ref, entropy = categorical_entropy(reference[0]), categorical_entropy(half[0])
    ratio = jnp.exp(log_prob - log_prob_ref)
    for value in (log_prob, entropy, ratio, half[1]):
        assert value.dtype == jnp.float32
        assert bool(jnp.all(jnp.isfinite(value)))
    tolerance = LOG_PROB_TOLERANCE[precision]
    assert float(jnp.max(jnp.abs(log_prob - log_prob_ref))) < tolerance
    assert float(jnp.max(jnp.abs(entropy - entropy_ref))) < tolerance
    assert float(jnp.max(jnp.abs(ratio - 1.0))) < 1.2 * tolerance
    np.testing.assert_allclose(half[1], reference[1], rtol=0.05, atol=0.05)


# Masking with extreme logits in every compute dtype, fully masked rows and sampling: the
# `ppo-mask` gate (terra_rl/validation/train_gates.py), run by tests/test_validation.py.


# --------------------------------------------------------------------------- loss scale


def scale_state(scale, finite_steps=0, overflow_steps=0) -> LossScale:
    return LossScale(jnp.float32(scale), jnp.int32(finite_steps), jnp.int32(overflow_steps))


def test_initial_loss_scale():
    assert float(loss_scaling.init_loss_scale("float16").scale) == 2.0**16
    assert float(loss_scaling.init_loss_scale("bfloat16").scale) == 1.0
    assert float(loss_scaling.init_loss_scale("float32").scale) == 1.0


def test_all_finite_over_mixed_dtypes_and_one_bad_element():
    """One inf or NaN anywhere, in a leaf of any float dtype, makes the tree non-finite;
    float16's largest finite value, integers beyond float16's range and an empty tree do
    not."""
    tree = {
        "w": jnp.ones((3, 4), jnp.float32),
        "b": jnp.full((5,), 65504.0, jnp.float16),
        "h": {"k": jnp.zeros((2, 2), jnp.bfloat16),
              "count": jnp.arange(69_998, 70_001, dtype=jnp.int32)},  # past float16's range
    }
    check = jax.jit(loss_scaling.all_finite)
    assert check(tree).dtype == jnp.bool_ and bool(check(tree))
    assert bool(loss_scaling.all_finite({}))
    for path, bad in (("w", jnp.inf), ("b", -jnp.inf), ("k", jnp.nan)):
        broken = jax.tree.map(lambda x: x, tree)
        if path == "k":
            broken["h"]["k"] = broken["h"]["k"].at[1, 0].set(bad)
        else:
            broken[path] = broken[path].at[-1].set(bad)
        assert not bool(check(broken)), path


def test_the_finite_test_is_compiled_once_not_once_per_parameter():
    """The update keeps or drops each of many parameters on one finite flag. Written as a
    reduction per leaf, XLA copied the leaves' chain of ANDs into every parameter's select
    (about a tenth of the update's instructions); as one reduction it is not copied."""
    leaves = 40
    grads = [jnp.full((8, 3 + i), 0.5, jnp.float32) for i in range(leaves)]
    params = [jnp.ones_like(g) for g in grads]

    def keep_or_step(params, grads):
        finite = loss_scaling.all_finite(grads)
        return [jnp.where(finite, p - g, p) for p, g in zip(params, grads, strict=True)]

    hlo = jax.jit(keep_or_step).lower(params, grads).compile().as_text()
    ands = hlo.count(" and(")
    assert ands < leaves, f"{ands} ANDs for {leaves} leaves: the test was copied per leaf"
    stepped = jax.jit(keep_or_step)(params, grads)
    np.testing.assert_array_equal(np.asarray(stepped[0]), np.full((8, 3), 0.5, np.float32))


def test_overflow_halves_and_never_below_one():
    state = next_loss_scale(scale_state(2.0**16, finite_steps=1500), jnp.bool_(False), True)
    assert float(state.scale) == 2.0**15
    assert int(state.finite_steps) == 0 and int(state.overflow_steps) == 1
    state = scale_state(1.5)
    for _ in range(3):
        state = next_loss_scale(state, jnp.bool_(False), True)
    assert float(state.scale) == 1.0 and int(state.overflow_steps) == 3


def test_growth_after_2000_finite_steps():
    step = jax.jit(lambda s: next_loss_scale(s, jnp.bool_(True), True))

    def run(state, n):
        return jax.lax.fori_loop(0, n, lambda _, s: step(s), state)

    state = run(scale_state(2.0**16), loss_scaling.GROWTH_INTERVAL - 1)
    assert float(state.scale) == 2.0**16
    assert int(state.finite_steps) == loss_scaling.GROWTH_INTERVAL - 1
    state = step(state)
    assert float(state.scale) == 2.0**17 and int(state.finite_steps) == 0
    capped = run(scale_state(loss_scaling.MAX_SCALE), loss_scaling.GROWTH_INTERVAL)
    assert float(capped.scale) == loss_scaling.MAX_SCALE


def test_static_scale_counts_but_never_changes():
    state = scale_state(1.0)
    state = next_loss_scale(state, jnp.bool_(False), False)
    state = next_loss_scale(state, jnp.bool_(True), False)
    assert float(state.scale) == 1.0 and int(state.overflow_steps) == 1


# --------------------------------------------------------------------------- pmapped runs


CORE_METRICS = ("train/loss", "train/actor_loss", "train/value_loss", "train/entropy",
                "train/approx_kl", "train/grad_norm", "train/reward",
                "grad_norm/policy_head", "grad_norm/value_head", "grad_norm/encoder")


def per_device(tree, device: int):
    return jax.tree.map(lambda x: x[device], tree)


@pytest.fixture(scope="module", params=HALF_PRECISIONS)
def half_trainer(request):
    return build_trainer(tiny_config(precision=request.param, log_eval_interval=0),
                         max_traces=1)


def test_short_run_in_half_precision(half_trainer):
    precision = half_trainer.config.precision
    runner = half_trainer.init_runner()
    initial_scale = loss_scaling.initial_loss_scale(precision)
    assert np.all(np.asarray(runner.loss_scale.scale) == initial_scale)
    update_fn = half_trainer.compile_update(runner)
    for _ in range(6):
        runner, metrics = update_fn(runner, half_trainer.env_params)
        metrics = host_metrics(metrics)
        if precision == "bfloat16":  # no scaling, and nothing may overflow
            assert all(math.isfinite(metrics[name]) for name in CORE_METRICS), metrics
            assert metrics["precision/overflow_steps"] == 0.0
            assert metrics["precision/loss_scale"] == 1.0
    # float16 starts at 2^16, which overflows this network's float16 backward pass on
    # XLA:CPU; each overflow halves the scale until the steps are finite (7 steps here).
    overflows = metrics["precision/overflow_steps"]
    assert overflows <= 10
    assert metrics["precision/loss_scale"] == initial_scale / 2**overflows
    assert metrics["precision/skipped_update_fraction"] == 0.0
    for name in CORE_METRICS:
        assert math.isfinite(metrics[name]), name
    assert metrics["grad_norm/policy_head"] > 0 and metrics["grad_norm/value_head"] > 0
    params = jax.device_get(runner.policy.params)
    assert leaves_equal(per_device(params, 0), per_device(params, NUM_DEVICES - 1))


@pytest.mark.parametrize("half_trainer", ["float16"], indirect=True)
def test_float16_overflow_skips_on_every_device_and_is_checkpointed(half_trainer, tmp_path):
    runner = half_trainer.init_runner()
    update_fn = half_trainer.compile_update(runner)
    # Device 0 alone scales its loss by 2^40: its float16 backward pass overflows, the
    # device-averaged gradients are not finite, and every device must skip the step.
    scales = np.full(NUM_DEVICES, 2.0**16, np.float32)
    scales[0] = 2.0**40
    runner = runner.replace(
        loss_scale=runner.loss_scale.replace(scale=half_trainer.shard(scales))
    )
    params_before = jax.device_get(runner.policy.params)
    opt_before = jax.device_get(runner.policy.opt_state)
    runner, metrics = update_fn(runner, half_trainer.env_params)
    steps = half_trainer.config.update_epochs * half_trainer.config.num_minibatches
    assert leaves_equal(params_before, jax.device_get(runner.policy.params))
    assert leaves_equal(opt_before, jax.device_get(runner.policy.opt_state))
    loss_scale = jax.device_get(runner.loss_scale)
    np.testing.assert_array_equal(loss_scale.overflow_steps, steps)
    np.testing.assert_array_equal(loss_scale.finite_steps, 0)
    assert loss_scale.scale[0] == 2.0**40 / 2**steps
    np.testing.assert_array_equal(loss_scale.scale[1:], 2.0**16 / 2**steps)
    assert np.isnan(jax.device_get(metrics["grad_norm/policy_head"])[0])
    metrics = host_metrics(metrics)
    assert metrics["precision/skipped_update_fraction"] == 1.0
    assert metrics["precision/overflow_steps"] == steps
    # Nothing finite to report: the norms are dropped, never logged as NaN or 0.
    assert not any(name.endswith("grad_norm") or "grad_norm/" in name for name in metrics)

    checkpoints = CheckpointStore(tmp_path / "checkpoints")
    checkpoints.save(1, jax.device_get(runner), half_trainer.config.to_dict(), None)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), runner)
    restored, _ = checkpoints.restore(None, target)
    checkpoints.close()
    assert leaves_equal(restored.loss_scale, loss_scale)
