"""Model gates: the policy of every preset, trunk sharing, and gradients reaching every head
in each compute precision."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from envs import ExcavationEnv
from envs.actions import NUM_ACTIONS
from envs.maps import MAP_TYPES
from envs.state import EnvParams
from terra_rl.algo import ppo
from terra_rl.choices import PRECISIONS
from terra_rl.validation import references, small
from terra_rl.validation.gate import GateOptions, require


def abstract_observations(env: ExcavationEnv, batch_size: int) -> dict:
    """Shapes and dtypes of a batch of `env`'s observations (traced, nothing computed)."""
    return dict(_abstract_observations(env.config, batch_size))


@functools.cache
def _abstract_observations(config, batch_size: int) -> dict:
    """`abstract_observations` once per env config: tracing a 64x64 env's reset takes
    seconds, and presets share env configs (`solo_excavator` and `trench_excavator`)."""
    env = ExcavationEnv(config)
    size = config.map_size
    spec = jax.ShapeDtypeStruct
    grid = spec((1, size, size), jnp.int8)
    params = EnvParams(
        target_map=grid,
        obstacles=grid,
        dumpability=grid,
        map_type=spec((1,), jnp.int8),
        spawn_pose=spec((1, 2), jnp.int32),
        maps_of_type=spec((len(MAP_TYPES), 1), jnp.int32),
        num_maps_of_type=spec((len(MAP_TYPES),), jnp.int32),
    )
    keys = spec((batch_size, 2), jnp.uint32)
    obs, _ = jax.eval_shape(jax.vmap(env.reset, in_axes=(0, None)), keys, params)
    return obs


def model_policy(options: GateOptions) -> str:
    from terra_rl.adapters.train_env import excavation_env_config
    from terra_rl.config import PRESETS
    from terra_rl.nets.models import make_policy
    from terra_rl.nets.parameters import count_parameters, parameter_groups
    from terra_rl.run.trainer import policy_config

    batch_size = 4
    counts = []
    solo = PRESETS["solo_excavator"]
    variants = {
        **PRESETS,  # and the model flags a launch may flip on the baseline:
        "solo_excavator+resnet": dataclasses.replace(solo, map_encoder="resnet"),
        "solo_excavator+separate_trunks": dataclasses.replace(
            solo, separate_actor_critic_trunks=True
        ),
    }
    for name, preset in variants.items():
        env = ExcavationEnv(excavation_env_config(preset))
        obs = abstract_observations(env, batch_size)
        config = policy_config(preset)
        policy = make_policy(config, NUM_ACTIONS, obs)
        require(config.dtype == jnp.dtype(preset.precision), f"{name}: compute dtype")
        variables = jax.eval_shape(policy.init, jax.random.PRNGKey(0), obs)
        dtypes = {leaf.dtype for leaf in jax.tree.leaves(variables)}
        require(dtypes == {jnp.dtype(jnp.float32)}, f"{name}: parameter dtypes {dtypes}")
        count = count_parameters(variables)
        expected = references.expected_parameter_count(  # the encoder sees the pooled map
            config, preset.map_size // preset.map_pool, env.config.num_last_actions,
            NUM_ACTIONS
        )
        require(
            count == expected,
            f"{name}: {count:,} parameters, the architecture has {expected:,} (docs/MODEL.md)",
        )
        groups = parameter_groups(variables)
        require(
            sum(count_parameters(g) for g in groups.values()) == count,
            f"{name}: parameter groups do not partition the parameters",
        )
        logits, value = jax.eval_shape(policy.apply, variables, obs)
        require(
            (logits.shape, logits.dtype) == ((batch_size, NUM_ACTIONS), jnp.float32),
            f"{name}: logits {logits.dtype}{list(logits.shape)}",
        )
        require(
            (value.shape, value.dtype) == ((batch_size,), jnp.float32),
            f"{name}: value {value.dtype}{list(value.shape)}",
        )
        counts.append(f"{name} {count:,}")
    return f"logits float32 [B, {NUM_ACTIONS}], value float32 [B]; parameters: " + ", ".join(counts)


def trunk_gradients(separate: bool) -> tuple[dict, dict]:
    """(params, `references.policy_value_gradients`) of the tiny float32 atari policy on real
    observations. The separate-trunk parameters are the shared ones with the encoder copied
    into both trunks, after checking that this is exactly the separate model's own layout
    (which saves a second initialisation)."""
    from terra_rl.nets.models import make_policy
    from terra_rl.run.trainer import policy_config

    policy, variables = small.smoke_policy()
    obs, _ = small.small_observations()
    params = variables["params"]
    if separate:
        config = policy_config(small.smoke_config(separate_actor_critic_trunks=True))
        policy = make_policy(config, NUM_ACTIONS, obs)
        params = {
            "actor_encoder": params["encoder"],
            "critic_encoder": params["encoder"],
            "policy_head": params["policy_head"],
            "value_head": params["value_head"],
        }
        layout = jax.eval_shape(policy.init, jax.random.PRNGKey(0), obs)["params"]
        shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)  # noqa: E731
        require(shapes(layout) == shapes(params), "separate trunks: unexpected parameter layout")
    gradients = jax.jit(functools.partial(references.policy_value_gradients, policy))
    return params, jax.device_get(gradients(params, obs))


def model_separate_trunks(options: GateOptions) -> str:
    from terra_rl.nets.parameters import count_parameters

    sizes = {}
    for separate in (False, True):
        params, grads = trunk_gradients(separate)
        problems = references.trunk_sharing_problems(params, grads["policy"], grads["value"])
        layout = "separate" if separate else "shared"
        require(not problems, f"{layout} trunks: " + "; ".join(problems))
        sizes[layout] = params
    encoder = count_parameters(sizes["shared"]["encoder"])
    return (
        f"separate: policy and value losses each reach only their own encoder and head "
        f"({encoder:,} parameters each); shared: both losses reach the whole trunk"
    )


def scaled_gradients(loss_and_grads, params, batch, precision: str):
    """(metrics, grads, loss scale, overflows) at the first loss scale the trainer's dynamic
    scaling accepts: start at `initial_loss_scale(precision)` and back off as
    `terra_rl.nets.loss_scaling.next_loss_scale` does while the gradients are not finite."""
    from terra_rl.nets import loss_scaling

    scale = loss_scaling.init_loss_scale(precision)
    dynamic = loss_scaling.is_dynamic(precision)
    while True:
        metrics, grads = loss_and_grads(params, batch, jnp.float32(0.01), scale.scale)
        finite = loss_scaling.all_finite(grads)
        if bool(finite) or not dynamic or float(scale.scale) <= loss_scaling.MIN_SCALE:
            return jax.device_get((metrics, grads)) + (scale.scale, int(scale.overflow_steps))
        scale = loss_scaling.next_loss_scale(scale, finite, dynamic)


def precision_head_gradients(options: GateOptions) -> str:
    from terra_rl.algo.update import Batch, make_loss_and_grads
    from terra_rl.nets.precision import gradient_norms

    obs, _ = small.small_observations()
    size = obs["action_mask"].shape[0]
    rng = np.random.default_rng(0)
    shown = []
    for precision in PRECISIONS:
        config = small.smoke_config(precision=precision)
        policy, params = small.smoke_policy(precision)
        logits, value = small.make_policy_outputs(config.use_action_mask, precision)(params, obs)
        action = jax.random.categorical(jax.random.PRNGKey(3), logits).astype(jnp.int32)
        batch = Batch(
            action=action,
            advantage=jnp.asarray(rng.normal(size=size), jnp.float32),
            log_prob=ppo.categorical_log_prob(logits, action),
            obs=obs,
            returns=value + jnp.asarray(rng.normal(size=size), jnp.float32),
            value=value,
        )
        loss_and_grads = jax.jit(make_loss_and_grads(config, policy))
        metrics, grads, scale, overflows = scaled_gradients(
            loss_and_grads, params, batch, precision
        )
        bad = [k for k, v in metrics.items() if not np.isfinite(v).all()]
        require(not bad, f"{precision}: non-finite loss metrics {bad}")
        require(
            jax.tree.structure(grads) == jax.tree.structure(params),
            f"{precision}: gradients do not have the parameters' structure",
        )
        problems = references.gradient_problems(grads)
        require(
            not problems, f"{precision} (loss scale {float(scale):g}): " + "; ".join(problems[:4])
        )
        norms = {group: float(norm) for group, norm in gradient_norms(grads).items()}
        require(
            norms and all(np.isfinite(n) and n > 0 for n in norms.values()),
            f"{precision}: group gradient norms {norms}",
        )
        for head in ("policy_head", "value_head"):
            require(head in norms, f"{precision}: no gradient norm for {head}")
        backoff = f", {overflows} overflow back-off(s)" if overflows else ""
        shown.append(
            f"{precision} (scale {float(scale):g}{backoff}) "
            + " ".join(f"{group} {norm:.2g}" for group, norm in sorted(norms.items()))
        )
    return f"{len(jax.tree.leaves(params))} leaves finite and non-zero; " + "; ".join(shown)
