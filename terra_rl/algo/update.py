"""One training update as one function: rollout (`lax.scan` of policy + env step), GAE,
then `update_epochs x num_minibatches` PPO minibatch updates with gradients averaged over
the device axis. `make_update_fn` returns it `jax.pmap`'d with the runner state donated.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from terra_rl.algo import final_observations, ppo, run_keys
from terra_rl.algo.device_axis import AXIS
from terra_rl.algo.metrics import (
    curriculum_metrics,
    optimization_metrics,
    rollout_metrics,
)
from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout
from terra_rl.config import TrainConfig
from terra_rl.nets import loss_scaling
from terra_rl.nets.loss_scaling import LossScale
from terra_rl.nets.models import (
    make_observation_cache,
    uses_convolutions,
    with_derived_features,
)
from terra_rl.nets.precision import apply_action_mask, gradient_norms, to_float32


@struct.dataclass
class PolicyState:
    params: dict
    opt_state: optax.OptState


@struct.dataclass
class Counters:
    """update: int32 [] updates done. episode_return: float32 [num_envs] return so far of
    each env's current episode. episode_full: bool [num_envs] the current episode started
    at age 0 (the first, staggered episode of each env is partial and never reported)."""

    update: jax.Array
    episode_return: jax.Array
    episode_full: jax.Array


@struct.dataclass
class RunnerState:
    """Everything one device carries from update to update; a leading device axis when
    pmapped. `rng` is a raw uint32 [2] key so checkpoints store it as plain data."""

    policy: PolicyState
    env_state: object
    last_obs: object
    rng: jax.Array
    counters: Counters
    loss_scale: LossScale


class Batch(NamedTuple):
    """What the PPO epochs train on: a rollout's transitions with their advantages, [T, N,
    ...] after the rollout and [B, ...] in a minibatch. (The fields are in alphabetical
    order, as the dict it replaced flattened: the same leaves in the same order.)"""

    action: jax.Array
    """int32, the action taken."""
    advantage: jax.Array
    """float32, GAE advantage."""
    log_prob: jax.Array
    """float32, log-probability under the behaviour policy."""
    obs: Any
    """The observation pytree the action was taken from, derived features included."""
    returns: jax.Array
    """float32, advantage + value: the value target."""
    value: jax.Array
    """float32, V(obs) under the behaviour policy."""


def policy_outputs(policy, params, obs, use_action_mask: bool):
    """(float32 logits [B, A] masked when masking is on, float32 value [B])."""
    logits, value = policy.apply(params, obs)
    mask = obs["action_mask"] if use_action_mask else None
    logits, value = apply_action_mask(logits, mask), to_float32(value)
    chex.assert_rank(logits, 2)
    chex.assert_type([logits, value], jnp.float32)
    chex.assert_shape(value, logits.shape[:1])
    return logits, value


def make_init_fn(config: TrainConfig, env, policy, optimizer) -> Callable:
    """pmapped `init(run_key uint32 [D, 2], env_params)`; `run_key` is the seed's key
    (`run_keys.seed_key`) on every device. Each device's envs start from its own key, and
    the parameters from one key shared by all devices, so they start identical."""

    def init(run_key, env_params):
        device_key = run_keys.device_key(run_key, run_keys.INIT_STREAM, AXIS)
        params_key = jax.random.fold_in(run_key, run_keys.PARAMS_STREAM)
        # Split once: the reset derives its own keys from `reset_key` (episode starts and
        # ages), so a key derived from `device_key` itself (`fold_in(device_key, 1)` equals
        # `split(device_key)[1]`) would repeat one of them.
        reset_key, runner_key = jax.random.split(device_key)
        obs, env_state = env.reset(reset_key, env_params, staggered=True)
        params = policy.init(params_key, jax.tree.map(lambda x: x[:1], obs))
        counters = Counters(
            update=jnp.zeros((), jnp.int32),
            episode_return=jnp.zeros((env.num_envs,), jnp.float32),
            episode_full=env.episode_age(env_state) == 0,
        )
        return RunnerState(
            policy=PolicyState(params=params, opt_state=optimizer.init(params)),
            env_state=env_state,
            last_obs=obs,
            rng=runner_key,
            counters=counters,
            loss_scale=loss_scaling.init_loss_scale(config.precision),
        )

    return jax.pmap(init, axis_name=AXIS)


def make_bootstrap_values_fn(outputs: Callable, num_envs: int, cache=None) -> Callable:
    """`values(params, last_obs, finals, num_steps, cache_state=None) -> (last_value float32
    [N], final_values float32 [T, N])`: V(last_obs) (obs pytree [N, ...], the observation
    after the rollout) and, for each truncated step t of env n, V of its final observation,
    0 elsewhere. `finals`: the truncated steps' final observations as the rollout kept them
    (`final_observations.FinalObservations`, slots [K, N] each naming its step or -1);
    `num_steps` (static) is T.

    One `lax.while_loop` whose body is one critic pass over N observations: the last ones
    first, then the kept final observations, N at a time (gathered), so usually two passes
    per update. The critic, the policy's derived inputs included, is compiled once here
    instead of three times (a pass per rollout step where envs time out, and one for the
    last observation): docs/PERFORMANCE.md, "The compile regression, fixed". Each row's
    value depends on its own observation alone, so which rows share a pass changes no bit.

    With the rollout's observation cache (`cache`, `make_observation_cache`) and its state
    after the rollout (`cache_state`), the first pass reads the last observations' cached
    keys, refreshed as the rollout's next step would refresh them, and a later pass
    computes its final observations' keys for the truncated rows only, not for the N it
    gathers: the same values, the first pass at half its cost from scratch at 64 envs x
    64x64 (docs/PERFORMANCE.md). Each pass refreshes once (one
    compiled copy of the cache's work): the first from `cache_state`, a later one from an
    empty state."""

    def values(params, last_obs, finals: final_observations.FinalObservations,
               num_steps: int, cache_state=None):
        rows = finals.step.size
        flat_final = jax.tree.map(lambda x: x.reshape((rows,) + x.shape[2:]), finals.obs)
        flat_step = finals.step.reshape(-1)
        kept = flat_step >= 0
        # Where each kept row's value goes in final_values [T * N]; T * N (dropped) elsewhere.
        env_of_row = jnp.tile(jnp.arange(num_envs, dtype=jnp.int32), rows // num_envs)
        target = jnp.where(kept, flat_step * num_envs + env_of_row, num_steps * num_envs)
        target = jnp.concatenate([target, jnp.full((1,), num_steps * num_envs, jnp.int32)])
        # Indices of the kept rows, padded with `rows` (written nowhere).
        (index,) = jnp.nonzero(kept, size=rows, fill_value=rows)
        passes = 1 + -(-jnp.sum(kept) // num_envs)

        def body(carry):
            done, last_value, final_values = carry
            chunk = jax.lax.dynamic_slice(index, (jnp.maximum(done - 1, 0) * num_envs,),
                                          (num_envs,))
            gathered = jax.tree.map(lambda x: x[jnp.minimum(chunk, rows - 1)], flat_final)
            first = done == 0
            obs = jax.tree.map(lambda a, b: jnp.where(first, a, b), last_obs, gathered)
            if cache is not None:
                start = jax.tree.map(lambda a, b: jnp.where(first, a, b), cache_state,
                                     cache.init(gathered))
                obs = cache.refresh(start, obs, first | (chunk < rows))[1]
            _, value = outputs(params, obs)
            last_value = jnp.where(first, value, last_value)
            written = jnp.where(first, num_steps * num_envs, target[chunk])
            final_values = final_values.at[written].set(value, mode="drop")
            return done + 1, last_value, final_values

        carry = (jnp.int32(0), jnp.zeros((num_envs,), jnp.float32),
                 jnp.zeros((num_steps * num_envs,), jnp.float32))
        _, last_value, final_values = jax.lax.while_loop(lambda c: c[0] < passes, body, carry)
        return last_value, final_values.reshape(num_steps, num_envs)

    return values


def make_loss_and_grads(config: TrainConfig, policy) -> Callable:
    """`loss_and_grads(params, batch, ent_coef, loss_scale) -> (metrics, grads)` for one
    minibatch on one device.

    With float16's dynamic scale the PPO loss is multiplied by `loss_scale` (float32 [])
    before the backward pass and the gradients divided by it after; the other precisions
    keep a scale of 1 and skip both (x * 1 and x / 1 are x). `grads` are float32 gradients
    of the unscaled loss, shaped like `params` and not yet averaged over devices. `batch`:
    a minibatch `Batch` of [B, ...]. Metrics: loss (the unscaled total), actor_loss,
    value_loss, entropy, approx_kl, clip_fraction.
    """

    dynamic_scale = loss_scaling.is_dynamic(config.precision)

    def scaled_loss(params, batch, ent_coef, loss_scale):
        logits, values = policy_outputs(policy, params, batch.obs, config.use_action_mask)
        loss, metrics = ppo.ppo_loss(
            logits,
            values,
            batch.action,
            batch.log_prob,
            batch.value,
            batch.advantage,
            batch.returns,
            clip_eps=config.clip_eps,
            vf_coef=config.vf_coef,
            ent_coef=ent_coef,
            clip_value_loss=config.clip_value_loss,
            normalize_advantages=config.normalize_advantages,
        )
        return loss_scaling.scale_loss(loss, loss_scale, dynamic_scale), dict(metrics, loss=loss)

    def loss_and_grads(params, batch, ent_coef, loss_scale):
        grad_fn = jax.grad(scaled_loss, has_aux=True)
        grads, metrics = grad_fn(params, batch, ent_coef, loss_scale)
        return metrics, loss_scaling.unscale(grads, loss_scale, dynamic_scale)

    return loss_and_grads


def minibatch_rows(batch, key: jax.Array, num_minibatches: int) -> jax.Array:
    """int32 [M, T * N / M]: the transitions of a rollout batch (pytree of [T, N, ...]) in a
    random order, split into `num_minibatches` minibatches of rows of the flat [T * N] batch,
    each transition in exactly one minibatch.

    Transitions, not whole env trajectories: a minibatch of N / M trajectories holds a few
    correlated episodes, and PPO trained on those learned far less (Breakout-MinAtar with the
    relu MLP: 29 against 67.5 on the same seed; docs/RESULTS.md, "What mattered").
    """
    steps, envs = jax.tree.leaves(batch)[0].shape[:2]
    order = jax.random.permutation(key, steps * envs)
    return order.reshape(num_minibatches, -1)


def take_rows(batch, rows: jax.Array):
    """The transitions `rows` (int32 [...], rows of the flat [T * N] batch) of a rollout
    batch (pytree of [T, N, ...]): pytree of [..., ...]. The PPO epochs gather each
    minibatch's rows as it starts: shuffling the whole batch, then slicing each minibatch out
    of it, copied the stored observations twice (docs/PERFORMANCE.md)."""
    steps, envs = jax.tree.leaves(batch)[0].shape[:2]
    return jax.tree.map(lambda x: x.reshape((steps * envs,) + x.shape[2:])[rows], batch)


def shuffled_minibatches(batch, key: jax.Array, num_minibatches: int):
    """A rollout batch (pytree of [T, N, ...]) as `num_minibatches` minibatches of single
    transitions in a random order (`minibatch_rows`): pytree of [M, T * N / M, ...]."""
    return take_rows(batch, minibatch_rows(batch, key, num_minibatches))


_TRACE_GUARDS = itertools.count()


def traced_at_most(fn: Callable, max_traces: int | None) -> Callable:
    """`fn`, failing with chex's AssertionError at its trace number `max_traces` + 1 (a
    retrace is a recompile: tens of seconds on CPU); `fn` itself when `max_traces` is None.

    `chex.assert_max_traces` counts per definition site (the call stack's function names,
    the source and the name), so the functions of two trainers built by the same code would
    share one count. A serial number in the name while chex takes its footprint gives each
    its own; the name JAX sees (and the compiled program) is unchanged."""
    if max_traces is None:
        return fn
    name = fn.__name__
    fn.__name__ = f"{name}#{next(_TRACE_GUARDS)}"
    guarded = chex.assert_max_traces(fn, n=max_traces)
    fn.__name__ = guarded.__name__ = name
    return guarded


def make_update_fn(config: TrainConfig, env, policy,
                   trace_counts: collections.Counter | None = None,
                   max_traces: int | None = None) -> Callable:
    """pmapped `update(runner_state, env_params) -> (runner_state, metrics)`, donating the
    runner state. Metrics are float32 scalars, identical on every device. With
    `config.updates_per_dispatch` K > 1 it is `update(runner_state, env_params, count int32)`
    running `count` <= K updates, each metric with a leading [K] (`repeat_update`). Each
    trace adds 1 to `trace_counts["update"]` (the trainer compiles it once per run); with
    `max_traces`, a trace past that many fails at once (`traced_at_most`)."""
    num_envs = env.num_envs
    # XLA:CPU runs `lax.conv` gradients inside a while loop an order of magnitude slower
    # than at top level (jax-ml/jax#12868), so on CPU the PPO loops of a network with such
    # convolutions (`--conv_impl lax`) are unrolled, at a compile time that grows with
    # epochs x minibatches. `PatchConv` (the CPU default) needs no unrolling.
    unroll_updates = jax.default_backend() == "cpu" and uses_convolutions(policy)

    def outputs(params, obs):
        return policy_outputs(policy, params, obs, config.use_action_mask)

    observation_cache = make_observation_cache(policy, num_envs)
    bootstrap_values = make_bootstrap_values_fn(outputs, num_envs, observation_cache)
    final_slots = final_observations.slots_needed(config.num_steps, env.truncation_period)

    def choose(extra, obs, noise) -> Choice:
        """The policy's action, sampled with this step's row of `ppo.rollout_noise`."""
        params = extra[0]
        gumbel, key_env = noise
        obs = with_derived_features(policy, obs)  # stored, so the epochs need not redo them
        logits, value = outputs(params, obs)
        return Choice(ppo.sample_actions(logits, gumbel), key_env, (obs, logits, value))

    def record(extra, step: Step):
        """A PPO transition and the finished episodes' statistics; counters carried on."""
        params, counters, finals = extra
        (obs, logits, value), action, age = step.choice.kept, step.choice.action, step.age
        result = step.result
        reward, terminated, truncated = result.reward, result.terminated, result.truncated
        done = terminated | truncated
        episode_return = counters.episode_return + reward
        reported = done & counters.episode_full
        transition = ppo.Transition(
            obs=obs,
            action=action,
            log_prob=ppo.categorical_log_prob(logits, action),
            value=value,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            age=age,
            progress=result.info["episode_progress"],
        )
        episodes = {
            "count": reported.astype(jnp.float32),
            "return": jnp.where(reported, episode_return, 0.0),
            "length": jnp.where(reported, age + 1, 0).astype(jnp.float32),
            "task_done": result.info["task_done"].astype(jnp.float32),
        }
        counters = counters.replace(
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_full=counters.episode_full | done,
        )
        finals = final_observations.kept(finals, truncated, result.final_observation)
        return (params, counters, finals), (transition, episodes)

    loss_and_grads = make_loss_and_grads(config, policy)
    optimizer_step = ppo.make_optimizer_step(config)
    dynamic_scale = loss_scaling.is_dynamic(config.precision)

    def minibatch_update(carry, batch):
        policy_state, loss_scale, ent_coef = carry
        metrics, grads = loss_and_grads(policy_state.params, batch, ent_coef, loss_scale.scale)
        grads = jax.lax.pmean(grads, AXIS)
        norms = gradient_norms(grads)
        # The groups partition the parameters, so the global norm follows from theirs.
        global_norm = jnp.sqrt(sum(jnp.square(norm) for norm in norms.values()))
        # A NaN or inf in the averaged gradients makes their norm non-finite (so does a norm
        # past float32's range, which no clip can scale). Every device decides alike.
        finite = jnp.isfinite(global_norm)
        params, opt_state = optimizer_step(policy_state.params, policy_state.opt_state,
                                           grads, finite)
        new_state = PolicyState(params=params, opt_state=opt_state)
        norms = {f"grad_norm/{name}": norm for name, norm in norms.items()}
        metrics = dict(metrics, grad_norm=global_norm, finite=finite, **norms)
        loss_scale = loss_scaling.next_loss_scale(loss_scale, finite, dynamic_scale)
        return (new_state, loss_scale, ent_coef), metrics

    def epoch(carry, key):
        policy_state, loss_scale, batch, ent_coef = carry

        def gathered_update(carry, rows):
            return minibatch_update(carry, take_rows(batch, rows))

        (policy_state, loss_scale, _), metrics = jax.lax.scan(
            gathered_update,
            (policy_state, loss_scale, ent_coef),
            minibatch_rows(batch, key, config.num_minibatches),
            unroll=unroll_updates,
        )
        return (policy_state, loss_scale, batch, ent_coef), metrics

    def update(runner: RunnerState, env_params):
        params = runner.policy.params
        rng, key_rollout, key_epochs = jax.random.split(runner.rng, 3)
        noise = ppo.rollout_noise(key_rollout, config.num_steps, num_envs, env.num_actions)
        finals = final_observations.empty(runner.last_obs, final_slots)
        carry = RolloutCarry(runner.env_state, runner.last_obs,
                             (params, runner.counters, finals))
        carry, (traj, episodes) = rollout(env, env_params, choose, record, carry, noise,
                                          cache=observation_cache)
        env_state, last_obs, (_, counters, finals), cache_state = carry
        last_value, final_values = bootstrap_values(params, last_obs, finals,
                                                    config.num_steps, cache_state)
        next_value = ppo.next_values(
            traj.value, last_value, traj.terminated, traj.truncated, final_values
        )
        done = traj.terminated | traj.truncated
        advantages, returns = ppo.gae_advantages(
            traj.reward, traj.value, next_value, done, config.gamma, config.gae_lambda
        )
        batch = Batch(action=traj.action, advantage=advantages, log_prob=traj.log_prob,
                      obs=traj.obs, returns=returns, value=traj.value)
        ent_coef = ppo.entropy_coefficient(config, counters.update)
        (policy_state, loss_scale, _, _), update_metrics = jax.lax.scan(
            epoch,
            (runner.policy, runner.loss_scale, batch, ent_coef),
            jax.random.split(key_epochs, config.update_epochs),
            unroll=unroll_updates,
        )
        metrics = optimization_metrics(update_metrics, loss_scale)
        metrics["sched/entropy_coef"] = ent_coef
        metrics["sched/lr"] = ppo.learning_rate_at(config, counters.update)
        metrics.update(rollout_metrics(traj, episodes, done, returns, env.max_steps,
                                       env.has_success))
        metrics.update(curriculum_metrics(env, env_state))
        new_runner = RunnerState(
            policy=policy_state,
            env_state=env_state,
            last_obs=last_obs,
            rng=rng,
            counters=counters.replace(update=counters.update + 1),
            loss_scale=loss_scale,
        )
        return new_runner, metrics

    def counted_update(runner: RunnerState, env_params):
        if trace_counts is not None:
            trace_counts["update"] += 1  # runs while tracing, never on the device
        return update(runner, env_params)

    def repeated_update(runner: RunnerState, env_params, count):
        if trace_counts is not None:
            trace_counts["update"] += 1
        return repeat_update(update, config.updates_per_dispatch)(runner, env_params, count)

    if config.updates_per_dispatch == 1:
        return jax.pmap(traced_at_most(counted_update, max_traces), axis_name=AXIS,
                        donate_argnums=(0,))
    return jax.pmap(traced_at_most(repeated_update, max_traces), axis_name=AXIS,
                    donate_argnums=(0,))


def repeat_update(update: Callable, max_updates: int) -> Callable:
    """`update(runner, env_params) -> (runner, metrics)` as
    `(runner, env_params, count int32 []) -> (runner, metrics with a leading [max_updates])`:
    `count` <= max_updates updates in one `fori_loop`, so one compiled function serves every
    count. Row i of each metric is update i's; rows from `count` on are zeros."""

    def run(runner, env_params, count):
        shapes = jax.eval_shape(update, runner, env_params)[1]
        buffer = jax.tree.map(lambda s: jnp.zeros((max_updates,) + s.shape, s.dtype), shapes)

        def body(i, carry):
            runner, buffer = carry
            runner, metrics = update(runner, env_params)
            buffer = jax.tree.map(lambda rows, row: rows.at[i].set(row), buffer, metrics)
            return runner, buffer

        return jax.lax.fori_loop(0, count, body, (runner, buffer))

    return run
