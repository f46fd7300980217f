"""Where one training update spends its time: each component timed alone at the config's
shapes (`scripts/profile_rollout_components.py`).

Components, each jitted on one device with the trainer's own functions (the full update is
the trainer's pmapped update on `num_devices`):

    env_step            `num_steps` batched env steps with random actions (no policy),
                        observations and action mask included
    env_step_without_rules  the same with the action mask and the refused-dig memory off
                        (only where the config has either), in the same rounds
    env_step_policy     `num_steps` batched env steps taking the actions the policy took in
                        the `rollout` section's rollout, replayed from the same states: what
                        the rollout's env step costs (a trained policy digs and dumps more often
                        than random actions, and each DO it may take runs the cut-off fill)
    env_step_policy_without_rules  those actions replayed without the rules, as above
    policy_forward      `num_steps` policy forward passes on a batch of observations,
                        with the parameter-free features the rollout computes (compass,
                        dig and pose distances), the rollout's observation cache (the
                        distances' goals, kept where the maps did not change) refreshed
                        along the rollout's observations as the rollout does
    derived_inputs      those parameter-free features alone (`with_derived_features`),
                        `num_steps` batches, with the same cache
    network             the forward passes alone, on observations that carry them
    rollout             `num_steps` of policy forward, sampling and env step
    gae                 GAE over the rollout's [num_steps, num_envs] arrays
    minibatch_gradient  one minibatch's PPO loss and gradient (the observations carry their
                        parameter-free features, as the trainer stores them)
    optimizer_apply     one optimizer step (`ppo.make_optimizer_step`: optax's update, the skip)
    full_update         the trainer's compiled update: rollout, GAE, epochs x minibatches,
                        timed over one dispatch of `updates_per_dispatch` updates
    host_overhead       what the host loop adds per update when it logs a dispatch's
                        metrics (metrics to host)

The sections are timed in rounds, each once a round, `repeats` rounds. Each section reports
`seconds` (one call, median of the rounds), `calls_per_update`,
`seconds_per_update` and `steps_per_second` = env steps per update / seconds per update, so
sections compare on one scale: the update cannot be faster than its slowest part.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terra_rl.adapters.train_env import make_train_envs
from terra_rl.algo import ppo
from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout
from terra_rl.algo.update import Batch, make_loss_and_grads, policy_outputs
from terra_rl.config import TrainConfig
from terra_rl.features.reach_cache import CACHE_KEYS
from terra_rl.nets.models import make_observation_cache, with_derived_features
from terra_rl.perf.benchmarking import time_in_rounds
from terra_rl.run.device_metrics import fetch_metrics, metrics_row
from terra_rl.run.trainer import Trainer, build_trainer


@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    seconds: float
    calls_per_update: int
    env_steps_per_update: int

    @property
    def seconds_per_update(self) -> float:
        return self.seconds * self.calls_per_update

    @property
    def steps_per_second(self) -> float:
        return self.env_steps_per_update / self.seconds_per_update

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds,
                "calls_per_update": self.calls_per_update,
                "seconds_per_update": self.seconds_per_update,
                "steps_per_second": self.steps_per_second}


def profile_update(config: TrainConfig, repeats: int = 5, init_params: Any = None
                   ) -> list[Section]:
    """Times every component of one update of `config` (resolved); compiles each first.
    `init_params` (host parameters without a device axis, `terra_rl.run.warm_start`): the
    policy whose actions the policy's sections and the full update take (a trained one's
    rollouts change the maps more often than an untrained one's); default the initial one."""
    trainer = build_trainer(config)
    env = trainer.train_env
    policy = trainer.policy
    steps, envs = config.num_steps, config.num_envs_per_device
    per_update = config.env_steps_per_update
    runner = trainer.init_runner()
    if init_params is not None:
        runner = trainer.with_policy_params(runner, init_params)
    params = jax.tree.map(lambda x: x[0], runner.policy.params)
    env_params = env.params
    obs, env_state = jax.jit(lambda key: env.reset(key, env_params))(jax.random.PRNGKey(1))

    def outputs(params, obs):
        return policy_outputs(policy, params, obs, config.use_action_mask)

    # What the rollout keeps from step to step for the policy's inputs (the distances'
    # goals), refreshed along the stored observations as the rollout does.
    cache = make_observation_cache(policy, envs)

    def over_rollout(per_step, observations):
        """The sum of `per_step(obs)` over the rollout's observations [steps, envs, ...],
        each with what the rollout's cache adds."""
        def step(carry, obs):
            total, cache_state = carry
            if cache is not None:
                cache_state, obs = cache.refresh(cache_state, obs)
            return (total + per_step(obs), cache_state), None

        first = jax.tree.map(lambda x: x[0], observations)
        start = (jnp.zeros(()), None if cache is None else cache.init(first))
        return jax.lax.scan(step, start, observations)[0][0]

    @jax.jit
    def forward_only(params, observations):
        # A different batch each step (the rollout's), so XLA cannot hoist the forward pass.
        def forward(obs):
            logits, value = outputs(params, obs)
            return jnp.sum(value) + jnp.sum(logits[:, 0])
        return over_rollout(forward, observations)

    @jax.jit
    def policy_rollout(params, key, state, obs):
        def choose(_, obs, noise) -> Choice:
            gumbel, key_env = noise
            logits, value = outputs(params, obs)
            stored = {k: v for k, v in obs.items() if k not in CACHE_KEYS}  # the env's own
            return Choice(ppo.sample_actions(logits, gumbel), key_env, (stored, value))

        def record(_, step: Step):
            obs, value = step.choice.kept
            return None, (obs, step.result.reward, value, step.choice.action)

        noise = ppo.rollout_noise(key, steps, envs, env.num_actions)
        return rollout(env, env_params, choose, record, RolloutCarry(state, obs, None), noise,
                       cache=cache)

    _, (observations, rewards, values, actions) = policy_rollout(
        params, jax.random.PRNGKey(2), env_state, obs)
    derive = functools.partial(with_derived_features, policy)

    @jax.jit
    def derived_only(observations):
        # A checksum of every feature, so XLA cannot drop the work that builds them.
        def checksum(obs):
            features = {k: v for k, v in derive(obs).items() if k not in obs}
            return sum(jnp.sum(v.astype(jnp.float32)) for v in jax.tree.leaves(features))
        return over_rollout(checksum, observations)

    observations_with_features = jax.jit(jax.vmap(derive))(observations)
    dones = jnp.zeros((steps, envs), bool).at[steps // 2].set(True)

    @jax.jit
    def gae(rewards, values):
        return ppo.gae_advantages(rewards, values, values, dones, config.gamma, config.gae_lambda)

    loss_and_grads = jax.jit(make_loss_and_grads(config, policy))
    minibatch = envs * steps // config.num_minibatches
    batch_obs = jax.tree.map(lambda x: jnp.concatenate([x] * -(-minibatch // envs))[:minibatch],
                             obs)
    # As in the trainer, the stored minibatch carries the parameter-free features.
    batch_obs = jax.jit(functools.partial(with_derived_features, policy))(batch_obs)
    batch = Batch(action=jnp.zeros((minibatch,), jnp.int32),
                  advantage=jnp.linspace(-1.0, 1.0, minibatch),
                  log_prob=jnp.full((minibatch,), -2.0), obs=batch_obs,
                  returns=jnp.ones((minibatch,)), value=jnp.zeros((minibatch,)))
    _, grads = loss_and_grads(params, batch, jnp.float32(0.01), jnp.float32(1.0))
    opt_state = ppo.make_optimizer(config).init(params)
    optimizer_step = ppo.make_optimizer_step(config)

    @jax.jit
    def apply(grads, opt_state, params):
        return optimizer_step(params, opt_state, grads, jnp.bool_(True))

    key = jax.random.PRNGKey(3)
    minibatch_steps = config.update_epochs * config.num_minibatches
    # Each env step section replays an action array: random actions, then the policy's.
    random_actions = jax.random.randint(jax.random.PRNGKey(4), actions.shape, 0,
                                        env.num_actions)
    env_replay = _make_env_replay(env, steps)
    plain = None
    if config.use_action_mask or config.remember_refused_digs:
        plain = _env_without_rules(config, steps)
    timed = {}
    for name, replayed in (("env_step", random_actions), ("env_step_policy", actions)):
        timed[name] = (functools.partial(env_replay, key, env_state, obs, env_params, replayed),
                       1)
        if plain is not None:  # in the same rounds, so that each ratio sees one drift
            timed[f"{name}_without_rules"] = (functools.partial(plain, key, replayed), 1)
    timed |= {
        "policy_forward": (lambda: forward_only(params, observations), 1),
        "derived_inputs": (lambda: derived_only(observations), 1),
        "network": (lambda: forward_only(params, observations_with_features), 1),
        "rollout": (lambda: policy_rollout(params, key, env_state, obs), 1),
        "gae": (lambda: gae(rewards, values), 1),
        "minibatch_gradient": (
            lambda: loss_and_grads(params, batch, jnp.float32(0.01), jnp.float32(1.0)),
            minibatch_steps),
        "optimizer_apply": (lambda: apply(grads, opt_state, params), minibatch_steps),
    }
    timed |= _update_calls(trainer, runner)
    for call, _ in timed.values():
        jax.block_until_ready(call())  # compile and warm up
    samples = time_in_rounds({name: call for name, (call, _) in timed.items()}, repeats)
    count = trainer.config.updates_per_dispatch
    seconds = {name: statistics.median(times) for name, times in samples.items()}
    host = statistics.median(logged - full for logged, full in
                             zip(samples["logged_dispatch"], samples["full_update"], strict=True))
    sections = [Section(name, seconds[name], calls, per_update)
                for name, (_, calls) in timed.items() if name not in _DISPATCHES]
    return sections + [Section("full_update", seconds["full_update"] / count, 1, per_update),
                       Section("host_overhead", max(host / count, 1e-9), 1, per_update)]


_DISPATCHES = ("full_update", "logged_dispatch")


def _make_env_replay(env, steps: int):
    """Jitted `(key, state, obs, env_params, actions) -> sum`: `steps` batched steps of `env`
    taking `actions` int32 [steps, num_envs], every observation summed (`_checksum`). One
    compiled rollout per env serves both action arrays (random and the policy's)."""

    @jax.jit
    def env_replay(key, state, obs, env_params, actions):
        def choose(_, obs, noise) -> Choice:
            action, key_env = noise
            return Choice(action, key_env)

        carry = RolloutCarry(state, obs, None)
        noise = (actions, jax.random.split(key, steps))
        return rollout(env, env_params, choose, _checksum, carry, noise)

    return env_replay


def _checksum(_, step: Step):
    """A `rollout` record: the sum of the step's rewards and of every observation leaf, so
    XLA cannot drop the work that builds them (the action mask's rules among it), as nothing
    else reads them here."""
    obs = step.result.observation
    checksum = sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(obs))
    return None, step.result.reward.sum() + checksum


def _env_without_rules(config: TrainConfig, steps: int) -> Callable[..., jax.Array]:
    """`replay(key, actions)`: `_make_env_replay`'s sum for the env of `config` with the
    action mask and the refused-dig memory off (`--disable_action_mask
    --disable_remember_refused_digs`), from the same reset states: the same maps and
    excavators, and, as the rules change what a step observes, not what it does, the same
    steps for the same actions (the sections `env_step_without_rules` and
    `env_step_policy_without_rules`)."""
    plain = dataclasses.replace(config, use_action_mask=False, remember_refused_digs=False)
    env, _ = make_train_envs(plain)
    obs, state = jax.jit(lambda key: env.reset(key, env.params))(jax.random.PRNGKey(1))
    env_replay = _make_env_replay(env, steps)
    return lambda key, actions: env_replay(key, state, obs, env.params, actions)


def _update_calls(trainer: Trainer, runner) -> dict[str, tuple[Callable[[], Any], int]]:
    """The trainer's compiled update as the trainer dispatches it, `updates_per_dispatch` at a
    time: alone ("full_update"), and with the host transfer of the dispatch's metrics, what
    the host loop does at every log ("logged_dispatch"). Each call runs one dispatch."""
    count = trainer.config.updates_per_dispatch
    state = {"runner": runner}

    def one_dispatch():
        state["runner"], metrics = trainer.run_updates(state["runner"], count)
        return metrics

    def logged_dispatch():
        return metrics_row(fetch_metrics(one_dispatch()), count - 1)

    return {"full_update": (one_dispatch, 1), "logged_dispatch": (logged_dispatch, 1)}


def format_table(sections: list[Section]) -> str:
    env_rate = next(s.steps_per_second for s in sections if s.name == "env_step")
    width = max(24, *(len(s.name) for s in sections))
    lines = [f"{'section':<{width}} {'s/call':>10} {'calls':>6} {'s/update':>10} "
             f"{'env steps/s':>12} {'vs env':>7}"]
    for s in sections:
        row = (f"{s.name:<{width}} {s.seconds:10.5f} {s.calls_per_update:6d} "
               f"{s.seconds_per_update:10.5f}")
        if s.name != "host_overhead":  # an extra cost of logged updates, not a path's rate
            row += f" {s.steps_per_second:12,.0f} {s.steps_per_second / env_rate:7.1%}"
        lines.append(row)
    rates = {s.name: s.steps_per_second for s in sections}
    if "env_step_without_rules" in rates:
        ratio = rates["env_step_without_rules"] / env_rate
        lines.append(f"env step with the rules / without: {ratio:.2f}x")
    if {"env_step_policy", "env_step_policy_without_rules"} <= rates.keys():
        ratio = rates["env_step_policy_without_rules"] / rates["env_step_policy"]
        lines.append(f"env step with the rules / without, the policy's actions: {ratio:.2f}x")
    return "\n".join(lines)


def finite_sections(sections: list[Section]) -> bool:
    return all(np.isfinite(s.seconds) and s.seconds > 0 for s in sections)
