"""Trainer gates: the masked policy distribution, config restore, timeout bootstrapping and
GAE, on the tiny shapes of `terra_rl.validation.small`."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from envs import actions as A
from terra_rl.algo import ppo
from terra_rl.validation import references, small
from terra_rl.validation.gate import GateOptions, require

# --------------------------------------------------------------------------- masked policy


# [6, 8] masks: ordinary rows, a fully masked row and a row with one allowed action.
MASK = np.array(
    [
        [1, 0, 1, 0, 1, 0, 1, 1],
        [0, 1, 0, 1, 1, 1, 0, 1],
        [1, 1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0, 0, 1, 0],
    ],
    bool,
)


def mask_test_logits(dtype, seed: int = 0) -> jax.Array:
    """[6, 8] logits in `dtype`: ordinary values, +-1e4, the dtype's largest finite values
    and +-inf (what a float16 overflow produces)."""
    big = float(jnp.finfo(dtype).max)
    rows = np.random.default_rng(seed).normal(size=MASK.shape) * 3
    rows[1, :4] = [1e4, -1e4, 1e4, -1e4]
    rows[2, :4] = [big, -big, np.inf, -np.inf]
    rows[4] = -big
    rows[5] = np.inf
    return jnp.asarray(rows, jnp.float32).astype(dtype)


def ppo_mask(options: GateOptions) -> str:
    from terra_rl.nets.precision import MASKED_LOGIT, apply_action_mask

    require(
        np.isfinite(MASKED_LOGIT) and MASKED_LOGIT > float(jnp.finfo(jnp.float32).min),
        f"the mask constant {MASKED_LOGIT} must be finite, above float32's minimum",
    )
    mask = jnp.asarray(MASK)
    some_allowed = MASK.any(axis=1)
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        name = jnp.dtype(dtype).name
        logits = mask_test_logits(dtype)
        masked = apply_action_mask(logits, mask)
        require(masked.dtype == jnp.float32, f"{name}: masked logits are {masked.dtype}")
        log_probs = np.asarray(jax.nn.log_softmax(masked))
        probs = np.exp(log_probs)
        require(np.isfinite(log_probs).all(), f"{name}: a log-prob is not finite")
        require(np.allclose(probs.sum(axis=1), 1.0), f"{name}: probabilities do not sum to 1")
        require(
            (probs[some_allowed][~MASK[some_allowed]] == 0).all(),
            f"{name}: a masked action has probability > 0",
        )
        require(np.isfinite(ppo.categorical_entropy(masked)).all(), f"{name}: entropy")
        samples = np.asarray(jax.random.categorical(jax.random.PRNGKey(0), masked, shape=(500, 6)))
        sampled_masked = ~MASK[np.arange(6), samples][:, some_allowed]
        require(not sampled_masked.any(), f"{name}: a masked action was sampled")
        # A row with nothing allowed falls back to DO_NOTHING: a defined action, never NaN.
        require(
            (probs[~some_allowed, A.DO_NOTHING] == 1.0).all()
            and (samples[:, ~some_allowed] == A.DO_NOTHING).all(),
            f"{name}: a fully masked row must choose DO_NOTHING",
        )
        ordinary = jnp.asarray(np.random.default_rng(1).normal(size=(5, 8)), dtype)
        require(
            np.array_equal(apply_action_mask(ordinary, None), ordinary.astype(jnp.float32)),
            f"{name}: with the mask off, logits must be untouched (cast to float32)",
        )

    # Gradients of the PPO loss through the mask: finite, zero on masked logits.
    rng = np.random.default_rng(2)
    allowed = MASK[some_allowed]
    actions = jnp.asarray(np.argmax(np.where(allowed, rng.random(allowed.shape), -1), axis=1))
    size = len(allowed)

    def loss(raw_logits):
        total, _ = ppo.ppo_loss(
            apply_action_mask(raw_logits, jnp.asarray(allowed)),
            jnp.zeros(size),
            actions,
            jnp.full((size,), -2.0),
            jnp.zeros(size),
            jnp.asarray(rng.normal(size=size), jnp.float32),
            jnp.ones(size),
            clip_eps=0.2,
            vf_coef=1.0,
            ent_coef=jnp.float32(0.01),
            clip_value_loss=True,
            normalize_advantages=True,
        )
        return total

    grads = np.asarray(jax.grad(loss)(jnp.asarray(rng.normal(size=allowed.shape), jnp.float32)))
    require(np.isfinite(grads).all(), "loss gradients through the mask are not finite")
    require(
        (grads[~allowed] == 0).all() and np.abs(grads[allowed]).max() > 0,
        "masked logits must get zero gradient, allowed ones some",
    )

    # The trainer's policy path on real observations (some actions masked by the env).
    _, params = small.smoke_policy()
    obs, _ = small.small_observations()
    env_mask = np.asarray(obs["action_mask"])
    require(not env_mask.all(), "the observations must have masked actions")
    logits, _ = small.make_policy_outputs(True)(params, obs)
    raw_logits, _ = small.make_policy_outputs(False)(params, obs)
    require(
        np.array_equal(np.asarray(logits)[env_mask], np.asarray(raw_logits)[env_mask]),
        "the mask changed allowed logits",
    )
    policy_log_probs = np.asarray(jax.nn.log_softmax(logits))
    require(np.isfinite(policy_log_probs).all(), "policy log-probs are not finite")
    require(
        (np.exp(policy_log_probs)[~env_mask] == 0).all(), "the policy puts mass on a masked action"
    )
    return (
        f"masked actions: probability 0, never sampled, finite log-probs (extreme logits in 3 "
        f"dtypes) and zero gradients; fully masked row: DO_NOTHING; mask off: logits untouched; "
        f"{len(env_mask)} real states: allowed logits kept"
    )


# --------------------------------------------------------------------------- config restore


def checkpoint_config_restore(options: GateOptions) -> str:
    from terra_rl.config import (
        LEGACY_DEFAULTS,
        ConfigError,
        TrainConfig,
        config_from_dict,
        get_preset,
        resolve,
    )
    from terra_rl.run.checkpointing import CheckpointStore
    from terra_rl.run.run_dir import create_run_dir, open_run_dir

    # Saved with every legacy field away from its legacy value (bools flipped), so a restore
    # that ignored LEGACY_DEFAULTS would show.
    flipped = {n: not v for n, v in LEGACY_DEFAULTS.items() if isinstance(v, bool)}
    preset = get_preset("mixed_excavators")
    config = resolve(dataclasses.replace(preset, wandb_tags=("a", "b"), lr=1.25e-4, **flipped), 4)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    require(set(config.to_dict()) == fields, "to_dict does not hold every field")
    state = {
        "step": np.arange(3, dtype=np.int32),
        "weights": np.linspace(0, 1, 4, dtype=np.float32),
    }
    old = config.to_dict()
    for name in LEGACY_DEFAULTS:
        del old[name]

    with tempfile.TemporaryDirectory() as root:
        with CheckpointStore(Path(root) / "new") as store:
            store.save(7, state, config.to_dict())
        with CheckpointStore(Path(root) / "old") as store:
            store.save(7, state, old)
        with CheckpointStore(Path(root) / "new") as store:  # a fresh process resuming
            restored = config_from_dict(store.restore_config())
            restored_state, _ = store.restore(None, state)
        with CheckpointStore(Path(root) / "old") as store:
            legacy = config_from_dict(store.restore_config())
        run_dir = create_run_dir(root, "run", config.to_dict(), ["validate_gates.py"])
        from_run_dir = config_from_dict(open_run_dir(run_dir)[1])

    require(restored == config, "the checkpoint's config differs from the saved config")
    require(from_run_dir == config, "the run directory's config.json differs from the config")
    require(
        all(np.array_equal(restored_state[k], state[k]) for k in state),
        "the checkpoint state differs",
    )
    for name, value in LEGACY_DEFAULTS.items():
        require(getattr(config, name) != value, f"the saved config must differ on {name}")
        require(
            getattr(legacy, name) == value,
            f"an old config without {name} restored {getattr(legacy, name)!r}, "
            f"the legacy default is {value!r}",
        )
    require(
        LEGACY_DEFAULTS.get("use_action_mask") is False,
        "LEGACY_DEFAULTS must say that a config without use_action_mask had the mask off",
    )
    unchanged = {n for n in fields if n not in LEGACY_DEFAULTS}
    require(
        all(getattr(legacy, n) == getattr(config, n) for n in unchanged),
        "fields present in an old config changed on restore",
    )
    try:
        config_from_dict({**old, "future_field": 1})
    except ConfigError as error:
        require("unknown config fields" in str(error), f"unknown field: {error}")
    else:
        require(False, "an unknown field must be an error")
    return (
        f"{len(fields)} fields restore exactly from a checkpoint and config.json; "
        f"legacy defaults {LEGACY_DEFAULTS} applied to an old config"
    )


# --------------------------------------------------------------------------- bootstrapping


def timeout_bootstrap_value(options: GateOptions) -> str:
    from terra_rl.algo.final_observations import from_stacked
    from terra_rl.algo.update import make_bootstrap_values_fn

    env = small.small_train_env()
    reset, step = small.make_batch_reset(env.batch_env), small.make_step_pair(env.batch_env)
    _, params = small.smoke_policy()
    outputs = small.make_policy_outputs(True)
    values_fn = jax.jit(make_bootstrap_values_fn(outputs, env.num_envs), static_argnums=3)
    obs, state = reset(jax.random.PRNGKey(4), env.params)
    last = env.max_steps - 1
    # none; one; a few; the whole batch, on each of two rollout steps (more than one pass)
    counts = (0, 1, 5, env.num_envs)
    for count in counts:
        timed_out = np.random.default_rng(count).permutation(env.num_envs)[:count]
        ages = np.zeros(env.num_envs, np.int32)
        ages[timed_out] = last
        actions = jnp.full((env.num_envs,), A.DO_NOTHING, jnp.int32)
        (next_obs, _, _, terminated, truncated, info), _ = step(
            jax.random.PRNGKey(5), state.replace(age=jnp.asarray(ages)), actions, env.params
        )
        truncated = np.asarray(truncated)
        require(
            truncated.sum() == count and not np.asarray(terminated).any(),
            f"{count} timeouts expected, got {truncated.sum()}",
        )
        final_obs = info["final_observation"]
        two_steps = jax.tree.map(lambda x: jnp.stack([x, x]), final_obs)
        finals = from_stacked(two_steps, jnp.asarray(np.stack([truncated, truncated])))
        last_value, final_values = values_fn(params, next_obs, finals, 2)
        final_values = np.asarray(final_values)
        _, value_final = outputs(params, final_obs)
        _, value_next = outputs(params, next_obs)
        value_final, value_next = np.asarray(value_final), np.asarray(value_next)
        require(
            np.allclose(np.asarray(last_value), value_next, atol=1e-6),
            f"{count} timeouts: the last value is not V(observation after the rollout)",
        )
        require(
            np.allclose(final_values, np.where(truncated, value_final, 0)[None], atol=1e-6),
            f"{count} timeouts: bootstrap values are not V(final observation)",
        )
        final_values = final_values[0]
        _, value_now = outputs(params, obs)
        bootstrap = np.asarray(
            ppo.next_values(
                jnp.asarray(value_now)[None],
                jnp.asarray(value_next),
                jnp.zeros((1, env.num_envs), bool),
                jnp.asarray(truncated)[None],
                jnp.asarray(final_values)[None],
            )
        )[0]
        expected = np.where(truncated, value_final, value_next)
        require(
            np.allclose(bootstrap, expected, atol=1e-6),
            f"{count} timeouts: next values do not bootstrap from the final observation",
        )
        if count:
            gap = np.abs(value_final - value_next)[truncated].min()
            require(
                gap > 1e-6,
                "V(final observation) equals V(reset observation): the check "
                "cannot tell them apart",
            )
    return (
        f"timeouts of {counts} of {env.num_envs} envs bootstrap V(final observation), "
        "not V(reset observation)"
    )


def gae_timeout_bootstrap(options: GateOptions) -> str:
    cases = {case: references.hand_built_gae_inputs(case) for case in references.GAE_CASES}
    cases["random_16x6"] = references.random_gae_inputs()
    for name, inputs in cases.items():
        advantages, returns = references.jax_gae(*inputs)
        expected_adv, expected_ret = references.numpy_gae(
            *inputs, references.GAE_GAMMA, references.GAE_LAMBDA
        )
        require(advantages.dtype == jnp.float32, f"{name}: advantages are {advantages.dtype}")
        tolerance = 1e-5 if name.startswith("random") else 1e-6
        for got, want in ((advantages, expected_adv), (returns, expected_ret)):
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance, err_msg=name)
    return f"GAE == NumPy reference on {', '.join(cases)}"
