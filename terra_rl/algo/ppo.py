"""PPO pieces as pure functions: GAE with truncation bootstrapping, the clipped loss, the
entropy schedule and the optimizer."""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from terra_rl.config import TrainConfig


@struct.dataclass
class Transition:
    """One rollout step for every env on a device; stacked to [num_steps, num_envs, ...].

    obs:          observation the action was taken from (pytree of [num_envs, ...])
    action:       int32 [num_envs]
    log_prob:     float32 [num_envs] under the behaviour policy (masked when masking is on)
    value:        float32 [num_envs] V(obs)
    reward:       float32 [num_envs]
    terminated:   bool [num_envs] task done: no bootstrap
    truncated:    bool [num_envs] timeout: bootstrap from the final observation, which the
                  rollout keeps apart (`final_observations`)
    age:          int32 [num_envs] episode age of `obs` (steps already taken)
    progress:     float32 [num_envs] episode progress after the step
    """

    obs: dict
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    age: jax.Array
    progress: jax.Array


def next_values(
    values: jax.Array,
    last_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    final_values: jax.Array,
) -> jax.Array:
    """float32 [T, N] value of the state after each step: `V(obs[t+1])` when the episode
    goes on, `V(final_observation[t])` when truncated, 0 when terminated.

    values [T, N] = V(obs[t]); last_value [N] = V(obs[T]) (the observation after the
    rollout); final_values [T, N] = V(final_observation[t]) where truncated.
    """
    chex.assert_rank(values, 2)
    chex.assert_equal_shape([values, terminated, truncated, final_values])
    chex.assert_shape(last_value, values.shape[1:])
    following = jnp.concatenate([values[1:], last_value[None]], axis=0)
    return jnp.where(terminated, 0.0, jnp.where(truncated, final_values, following))


def gae_advantages(
    rewards: jax.Array,
    values: jax.Array,
    next_value: jax.Array,
    done: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over [T, N] arrays.

    `A[t] = delta[t] + gamma * lambda * (1 - done[t]) * A[t+1]` with
    `delta[t] = r[t] + gamma * next_value[t] - values[t]`: the recursion stops at every
    reset boundary (`done = terminated | truncated`); `next_value` carries the bootstrap.
    Returns (advantages, returns = advantages + values), both float32 [T, N].
    """
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_value, done])
    chex.assert_type([rewards, values, next_value], jnp.float32)
    deltas = rewards + gamma * next_value - values
    carry_on = gamma * gae_lambda * (1.0 - done.astype(jnp.float32))

    def backward(advantage, inputs):
        delta, keep = inputs
        advantage = delta + keep * advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, carry_on), reverse=True
    )
    return advantages, advantages + values


def entropy_coefficient(config: TrainConfig, update: jax.Array) -> jax.Array:
    """Cosine schedule from `ent_coef_start` to `ent_coef_end` over
    `ent_coef_decay_updates` updates, then constant."""
    if config.ent_coef_decay_updates == 0:
        return jnp.float32(config.ent_coef_end)
    fraction = jnp.clip(update / config.ent_coef_decay_updates, 0.0, 1.0)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * fraction))
    coef = config.ent_coef_end + (config.ent_coef_start - config.ent_coef_end) * cosine
    return coef.astype(jnp.float32)


def learning_rate(config: TrainConfig) -> optax.ScalarOrSchedule:
    """`lr`, or a schedule over optimizer steps (`update_epochs x num_minibatches` per
    update) that anneals it to `lr_end`, linearly or by a cosine, over `lr_decay_updates`
    updates (0: all `num_updates`), then keeps `lr_end`."""
    if config.lr_schedule == "constant":
        return config.lr
    updates = config.lr_decay_updates or config.num_updates
    steps = max(updates * config.update_epochs * config.num_minibatches, 1)
    if config.lr_schedule == "linear":
        return optax.linear_schedule(config.lr, config.lr_end, steps)
    return optax.cosine_decay_schedule(config.lr, steps, alpha=config.lr_end / config.lr)


ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-5


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then Adam (eps 1e-5) at `learning_rate(config)`."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate(config), b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS),
    )


def make_optimizer_step(config: TrainConfig) -> Callable:
    """`step(params, opt_state, grads, finite bool []) -> (params, opt_state)`: one step of
    `make_optimizer(config)` when `finite` is True, the inputs unchanged when it is False (a
    skipped step).

    The same values as `optimizer.update`, `optax.apply_updates` and a select between new
    and old, computed in another order: the state is selected first and Adam's step is
    taken from the selected moments (the new ones when the step is kept). Selecting the
    parameters after optax's update made XLA recompute the new moments inside the
    parameters' kernel, from the old moments, so it copied every moment buffer once per
    minibatch (3.2 MB a minibatch for `cpu_demo`'s policy); here each buffer is updated
    in place (docs/PERFORMANCE.md, "The skip without copies")."""
    optimizer = make_optimizer(config)
    schedule = learning_rate(config)

    def step(params, opt_state, grads, finite):
        _, stepped = optimizer.update(grads, opt_state, params)
        keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        opt_state_out = jax.tree.map(keep_old, stepped, opt_state)
        _, (adam, _) = opt_state_out
        _, (_, lr_state) = opt_state
        # optax.adam's update from its new moments and count, then its learning-rate
        # scaling (a schedule is read at the count before the step), in optax's order.
        mu_hat = optax.tree.bias_correction(adam.mu, ADAM_B1, adam.count)
        nu_hat = optax.tree.bias_correction(adam.nu, ADAM_B2, adam.count)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + 0.0) + ADAM_EPS), mu_hat, nu_hat)
        if callable(schedule):
            step_size = -1 * schedule(lr_state.count)
            updates = jax.tree.map(lambda u: jnp.array(step_size, dtype=u.dtype) * u, updates)
        else:
            updates = jax.tree.map(lambda u: -schedule * u, updates)
        stepped_params = optax.apply_updates(params, updates)
        return jax.tree.map(keep_old, stepped_params, params), opt_state_out

    return step


def learning_rate_at(config: TrainConfig, update: jax.Array) -> jax.Array:
    """float32 []: the learning rate of the first optimizer step of `update`."""
    schedule = learning_rate(config)
    if not callable(schedule):
        return jnp.float32(schedule)
    step = update * config.update_epochs * config.num_minibatches
    return jnp.asarray(schedule(step), jnp.float32)


def rollout_noise(key: jax.Array, num_steps: int, num_envs: int,
                  num_actions: int) -> tuple[jax.Array, jax.Array]:
    """A rollout's randomness, drawn at once: (Gumbel noise float32 [T, N, A] for
    `sample_actions`, one env key per step uint32 [T, 2]).

    Three Threefry calls an update (a split, the noise, the keys) instead of two a step:
    XLA:CPU runs each call as a loop of its own, and drawing them per step cost CartPole's
    update about 5% (docs/PERFORMANCE.md, "The rollout's randomness drawn once an update")."""
    key_actions, key_envs = jax.random.split(key)
    gumbel = jax.random.gumbel(key_actions, (num_steps, num_envs, num_actions), jnp.float32)
    return gumbel, jax.random.split(key_envs, num_steps)


def sample_actions(logits: jax.Array, gumbel: jax.Array) -> jax.Array:
    """int32 [B]: actions drawn from the categorical distributions of float32 logits [B, A]
    by the Gumbel-max trick, with Gumbel noise float32 [B, A]; what
    `jax.random.categorical(key, logits)` returns when the noise is `jax.random.gumbel(key,
    logits.shape)`. Masked logits (a large finite negative) are never drawn."""
    chex.assert_equal_shape_suffix([logits, gumbel], 1)
    chex.assert_type([logits, gumbel], jnp.float32)
    return jnp.argmax(logits + gumbel, axis=-1).astype(jnp.int32)


def categorical_log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """float32 [B] log pi(a) from float32 logits [B, A] and actions int [B].

    The chosen entry is picked with a one-hot mask rather than `take_along_axis`: the same
    values and gradients, but no gather forward and no scatter backward, which on CPU cost
    each minibatch step about 1% (docs/PERFORMANCE.md, "The rollout's randomness drawn once
    an update")."""
    chex.assert_shape(actions, logits.shape[:-1])
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jax.nn.one_hot(actions, logits.shape[-1], dtype=jnp.bool_)
    return jnp.sum(jnp.where(chosen, log_probs, 0.0), axis=-1)


def categorical_entropy(logits: jax.Array) -> jax.Array:
    """float32 [B]; masked logits (a large finite negative) contribute 0."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def ppo_loss(
    logits: jax.Array,
    values: jax.Array,
    actions: jax.Array,
    old_log_probs: jax.Array,
    old_values: jax.Array,
    advantages: jax.Array,
    returns: jax.Array,
    *,
    clip_eps: float,
    vf_coef: float,
    ent_coef: jax.Array,
    clip_value_loss: bool,
    normalize_advantages: bool,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped PPO objective on one minibatch.

    logits float32 [B, A] (already masked when masking is on); values, old_log_probs,
    old_values, advantages, returns float32 [B]; actions int32 [B].
    Returns (total loss, metrics): actor_loss, value_loss, entropy, approx_kl,
    clip_fraction.
    """
    chex.assert_rank(logits, 2)
    chex.assert_type([logits, values, old_log_probs, old_values, advantages, returns],
                     jnp.float32)
    chex.assert_shape([values, actions, old_log_probs, old_values, advantages, returns],
                      logits.shape[:1])
    log_probs = categorical_log_prob(logits, actions)
    log_ratio = log_probs - old_log_probs
    ratio = jnp.exp(log_ratio)
    if normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    actor_loss = -jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    ).mean()
    value_error = jnp.square(values - returns)
    if clip_value_loss:
        clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        value_error = jnp.maximum(value_error, jnp.square(clipped - returns))
    value_loss = 0.5 * value_error.mean()
    entropy = categorical_entropy(logits).mean()
    total = actor_loss + vf_coef * value_loss - ent_coef * entropy
    metrics = {
        "actor_loss": actor_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "clip_fraction": (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32).mean(),
    }
    return total, metrics
