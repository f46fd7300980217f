"""Independent references and checks that gates and tests share: a step-by-step NumPy GAE,
hand-built GAE sequences, the policy's parameter count worked out by hand, and checks on
gradient trees. Each lives here once; tests import it rather than keep a copy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from terra_rl.algo import ppo

GAE_GAMMA, GAE_LAMBDA = 0.9, 0.8
# The compass of docs/MODEL.md, written out here rather than imported from
# terra_rl.features.compass.
COMPASS_SECTORS, COMPASS_DISTANCE_BINS, COMPASS_LAYERS = 12, 5, 4
GAE_CASES = ("no_done", "terminal", "truncation", "reset_boundary")


# --------------------------------------------------------------------------- GAE


def numpy_gae(rewards, values, last_value, terminated, truncated, final_values, gamma, lam):
    """Step-by-step reference over [T, N] arrays: bootstrap V(s') unless terminated,
    V(final obs) if truncated, and never carry the advantage across a reset.
    Returns (advantages, returns) float64 [T, N]."""
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


def hand_built_gae_inputs(case: str):
    """[T=5, N=1] (rewards, values, last_value, terminated, truncated, final_values) with
    one boundary of the given kind (`GAE_CASES`): a termination at t=2, a truncation at
    t=2 whose final observation is worth 3.0 (the next observation, after the reset, is
    worth -0.4), or a termination at t=1 and a truncation at t=3 (final value -2.0)."""
    if case not in GAE_CASES:
        raise ValueError(f"case must be one of {GAE_CASES}, got {case!r}")
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


def random_gae_inputs(seed: int = 0, shape: tuple[int, int] = (16, 6)):
    """Random [T, N] inputs with about 10% terminations and 10% truncations."""
    rng = np.random.default_rng(seed)
    terminated = rng.random(shape) < 0.1
    truncated = (rng.random(shape) < 0.1) & ~terminated
    return (
        rng.normal(size=shape),
        rng.normal(size=shape),
        rng.normal(size=shape[1]),
        terminated,
        truncated,
        np.where(truncated, rng.normal(size=shape), 0.0),
    )


def jax_gae(
    rewards,
    values,
    last_value,
    terminated,
    truncated,
    final_values,
    gamma=GAE_GAMMA,
    lam=GAE_LAMBDA,
):
    """The trainer's path: `ppo.next_values` then `ppo.gae_advantages`, in float32."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    next_value = ppo.next_values(
        f32(values),
        f32(last_value),
        jnp.asarray(terminated),
        jnp.asarray(truncated),
        f32(final_values),
    )
    return ppo.gae_advantages(
        f32(rewards), f32(values), next_value, jnp.asarray(terminated | truncated), gamma, lam
    )


# --------------------------------------------------------------------------- models


def expected_parameter_count(
    policy_config, map_size: int, num_last_actions: int, num_actions: int
) -> int:
    """The excavation policy's parameter count worked out layer by layer from the
    architecture in docs/MODEL.md (only the layer widths come from `terra_rl.nets.models`)."""
    from terra_rl.nets import models as M

    def dense(inputs, outputs):
        return inputs * outputs + outputs

    def conv(kernel, inputs, outputs):
        return kernel * kernel * inputs * outputs + outputs

    channels = 8  # the 7 map channels, zero-padded to a multiple of 8
    features = policy_config.map_feature_dim
    if policy_config.map_encoder == "atari":
        side = math.ceil(math.ceil(map_size / 4) / 2)
        map_encoder = conv(8, channels, 32) + conv(4, 32, 64) + conv(3, 64, 64)
        map_encoder += dense(side * side * 64, features)
    elif policy_config.map_encoder == "flat":
        map_encoder = dense(map_size * map_size * channels, features)
    elif policy_config.map_encoder == "none":
        map_encoder, features = 0, 0
    else:
        map_encoder, inputs, side = 0, channels, map_size
        for width in (16, 32, 32):
            map_encoder += conv(3, inputs, width) + 4 * conv(3, width, width)
            inputs, side = width, math.ceil(side / 2)
        map_encoder += dense(side * side * inputs, features)
    embed = M.EMBED_DIM
    embeddings = embed * (2 * M.NUM_HEADINGS + 2 * M.MAX_WHEEL_ANGLE + 1 + 2)
    mlp = M.SMALL_MLP_DIM
    agent_mlp = dense(4 * embed + 4, mlp) + dense(mlp, mlp)
    local_mlp = dense(M.NUM_HEADINGS * 6, mlp) + dense(mlp, mlp)
    last_actions = M.NUM_LAST_ACTION_TOKENS * embed
    hidden = policy_config.hidden_dim
    trunk = dense(features + 2 * mlp + num_last_actions * embed, hidden) + dense(hidden, hidden)
    if policy_config.compass:
        # 12 sectors x 5 distance bins x 4 layers, two Dense, and their 64 trunk inputs.
        compass_inputs = COMPASS_SECTORS * COMPASS_DISTANCE_BINS * COMPASS_LAYERS
        trunk += dense(compass_inputs, mlp) + dense(mlp, mlp) + mlp * hidden
    if policy_config.dig_distance:
        # 2 + 3 x 12 direction features of docs/MODEL.md, two Dense, and their 64 trunk inputs.
        dig_distance_inputs = 2 + 3 * COMPASS_SECTORS
        trunk += dense(dig_distance_inputs, mlp) + dense(mlp, mlp) + mlp * hidden
    if policy_config.pose_distance:
        # 2 + 3 x 4 base-action features of docs/MODEL.md, two Dense, 64 trunk inputs.
        pose_distance_inputs = 2 + 3 * 4
        trunk += dense(pose_distance_inputs, mlp) + dense(mlp, mlp) + mlp * hidden
    if policy_config.egocentric_radius:
        # A square of 2r + 1 tiles x the compass's 4 layers, Dense 128 and 64, 64 trunk inputs.
        view_inputs = (2 * policy_config.egocentric_radius + 1) ** 2 * COMPASS_LAYERS
        trunk += dense(view_inputs, M.EGOCENTRIC_MLP_DIM) + dense(M.EGOCENTRIC_MLP_DIM, mlp)
        trunk += mlp * hidden
    encoder = map_encoder + embeddings + agent_mlp + local_mlp + last_actions + trunk
    encoders = 2 * encoder if policy_config.separate_actor_critic_trunks else encoder
    return encoders + dense(hidden, num_actions) + dense(hidden, 1)


def policy_value_gradients(model, params, obs) -> dict:
    """{"total", "policy", "value"}: gradient trees of `params` (the "params" collection) for
    the losses sum(logits * w) + sum(value), sum(logits * w) and sum(value), with fixed
    random weights w, pulled back in one vmapped backward pass. Jit it."""
    (logits, value), pullback = jax.vjp(lambda p: model.apply({"params": p}, obs), params)
    weights = jax.random.normal(jax.random.PRNGKey(1), logits.shape)
    logit_cotangents = jnp.stack([weights, weights, jnp.zeros_like(weights)])
    value_cotangents = jnp.stack(
        [jnp.ones_like(value), jnp.zeros_like(value), jnp.ones_like(value)]
    )
    (grads,) = jax.vmap(pullback)((logit_cotangents, value_cotangents))
    names = ("total", "policy", "value")
    return {name: jax.tree.map(lambda g, i=i: g[i], grads) for i, name in enumerate(names)}


def init_and_gradients(model, key, obs):
    """(params, `policy_value_gradients`) of a freshly initialised `model`. Jit it."""
    params = model.init(key, obs)["params"]
    return params, policy_value_gradients(model, params, obs)


def leaf_paths(tree) -> dict[str, jax.Array]:
    """{'["encoder"]["trunk"]...': leaf} for every leaf of a pytree."""
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(tree)}


def gradient_problems(grads) -> list[str]:
    """Leaves of a gradient tree that are not float32, not finite, or all zero."""
    problems = []
    for path, grad in leaf_paths(grads).items():
        grad = np.asarray(grad)
        if grad.dtype != np.float32:
            problems.append(f"{path} is {grad.dtype}")
        elif not np.isfinite(grad).all():
            problems.append(f"{path} is not finite")
        elif not np.abs(grad).max() > 0:
            problems.append(f"{path} is all zero")
    return problems


def trunk_sharing_problems(params, policy_grads, value_grads) -> list[str]:
    """What breaks the trunk contract, given the gradients of a policy-only and a value-only
    loss: separate trunks (`actor_encoder` / `critic_encoder`) share no parameter, so each
    loss leaves the other role's encoder and head untouched and reaches its own encoder;
    a shared `encoder` receives both losses in its trunk and map encoder."""
    nonzero = lambda tree: [bool(np.asarray(g).any()) for g in jax.tree.leaves(tree)]  # noqa: E731
    problems = []
    if "encoder" in params:
        if set(params) != {"encoder", "policy_head", "value_head"}:
            return [f"shared-trunk params have top-level keys {sorted(params)}"]
        for loss, grads in (("policy", policy_grads), ("value", value_grads)):
            if not all(nonzero(grads["encoder"]["trunk"])):
                problems.append(f"the {loss} loss misses part of the shared trunk")
            if not any(nonzero(grads["encoder"]["map_encoder"])):
                problems.append(f"the {loss} loss misses the shared map encoder")
    else:
        if set(params) != {"actor_encoder", "critic_encoder", "policy_head", "value_head"}:
            return [f"separate-trunk params have top-level keys {sorted(params)}"]
        shapes = [
            jax.tree.map(np.shape, params[name]) for name in ("actor_encoder", "critic_encoder")
        ]
        if shapes[0] != shapes[1]:
            problems.append("actor and critic encoders differ in layout")
        for loss, grads, own in (
            ("policy", policy_grads, "actor_encoder"),
            ("value", value_grads, "critic_encoder"),
        ):
            if not any(nonzero(grads[own])):
                problems.append(f"the {loss} loss does not reach {own}")
        for name in ("critic_encoder", "value_head"):
            if any(nonzero(policy_grads[name])):
                problems.append(f"the policy loss reaches {name}")
        for name in ("actor_encoder", "policy_head"):
            if any(nonzero(value_grads[name])):
                problems.append(f"the value loss reaches {name}")
    if any(nonzero(value_grads["policy_head"])):
        problems.append("the value loss reaches policy_head")
    if any(nonzero(policy_grads["value_head"])):
        problems.append("the policy loss reaches value_head")
    return problems
