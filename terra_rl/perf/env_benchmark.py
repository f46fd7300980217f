"""Measuring the batched excavation env (`envs.batch.BatchEnv`) alone, with uniformly random
actions: the compile of one jitted step and the steady env steps/s of a jitted `lax.scan` of
batch steps (`scripts/benchmark_env.py` runs them over shapes and writes the report)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from envs import actions as A
from envs.batch import BatchEnv
from envs.config import EnvConfig
from envs.env import ExcavationEnv
from envs.params import make_env_params
from envs.state import EnvParams
from terra_rl.adapters.train_env import ExcavationTrainEnv
from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout
from terra_rl.perf.benchmarking import time_once, time_repeated


@dataclasses.dataclass(frozen=True)
class Shape:
    num_envs: int
    map_size: int

    def __str__(self) -> str:
        return f"{self.num_envs} envs x {self.map_size}x{self.map_size}"



class ParamsCache:
    """One generated map pool per map size, shared by every configuration of that size."""

    def __init__(self, num_maps: int, seed: int):
        self.num_maps = num_maps
        self.seed = seed
        self._pools: dict[int, EnvParams] = {}

    def get(self, config: EnvConfig) -> EnvParams:
        if config.map_size not in self._pools:
            self._pools[config.map_size] = make_env_params(
                config, num_maps=self.num_maps, seed=self.seed
            )
        return self._pools[config.map_size]


def build_batch_env(
    shape: Shape, max_steps: int, pools: ParamsCache, compute_action_mask: bool = True
) -> tuple[BatchEnv, EnvParams]:
    """A fresh env (new objects, so no jit cache is shared with earlier ones) and its pool."""
    config = EnvConfig(
        map_size=shape.map_size, max_steps=max_steps, compute_action_mask=compute_action_mask
    )
    params = pools.get(config)
    return BatchEnv(ExcavationEnv(config), params, shape.num_envs), params


def make_rollout(batch_env: BatchEnv, num_steps: int, reference: bool):
    """Jitted (key, state, obs, params) -> (key, state, obs, done_count, any_done_count,
    reward_sum) running `num_steps` batch steps with uniformly random actions: the trainer's
    rollout (`terra_rl.algo.rollout`) over the env's adapter, stepping with
    `BatchEnv.step_reference` when `reference`.

    obs and rewards are outputs so that XLA cannot drop their computation as dead code.
    """
    env = ExcavationTrainEnv(batch_env, reference_resets=reference)
    num_envs = batch_env.num_envs

    def choose(key, obs, _) -> Choice:
        key, key_actions, key_step = jax.random.split(key, 3)
        actions = jax.random.randint(key_actions, (num_envs,), 0, A.NUM_ACTIONS)
        return Choice(actions.astype(jnp.int32), key_step, key)

    def record(_, step: Step):
        done = step.result.terminated | step.result.truncated
        counts = (jnp.sum(done, dtype=jnp.int32), jnp.any(done), jnp.sum(step.result.reward))
        return step.choice.kept, counts

    def run(key, state, obs, params):
        carry = RolloutCarry(state, obs, key)
        (state, obs, key, _), (done_counts, any_done, rewards) = rollout(
            env, params, choose, record, carry, None, length=num_steps)
        return (
            key,
            state,
            obs,
            jnp.sum(done_counts),
            jnp.sum(any_done, dtype=jnp.int32),
            jnp.sum(rewards),
        )

    return jax.jit(run)


# ---------------------------------------------------------------------------- measurements


def measure_compile(
    shape: Shape, max_steps: int, pools: ParamsCache, seed: int, repeats: int
) -> dict[str, Any]:
    """Seconds to lower and compile one jitted `BatchEnv.step`, then (with a fresh env, so
    nothing is cached) of its first call, and of a steady call afterwards."""
    batch_env, params = build_batch_env(shape, max_steps, pools)
    key = jax.random.PRNGKey(seed)
    _, state = jax.block_until_ready(jax.jit(batch_env.reset)(key, params))
    actions = jnp.zeros((shape.num_envs,), jnp.int32)

    jax.clear_caches()
    lower_seconds, lowered = time_once(
        lambda: jax.jit(batch_env.step).lower(key, state, actions, params)
    )
    compile_seconds, _ = time_once(lowered.compile)

    jax.clear_caches()
    fresh_env, _ = build_batch_env(shape, max_steps, pools)
    fresh_step = jax.jit(fresh_env.step)
    first_call_seconds, _ = time_once(lambda: fresh_step(key, state, actions, params))
    steady = time_repeated(lambda: fresh_step(key, state, actions, params), repeats)
    return {
        "num_envs": shape.num_envs,
        "map_size": shape.map_size,
        "lower_seconds": lower_seconds,
        "compile_seconds": compile_seconds,
        "lower_and_compile_seconds": lower_seconds + compile_seconds,
        "first_call_seconds": first_call_seconds,
        "steady_call_seconds_median": steady.median,
        "steady_call_seconds_best": steady.best,
    }


def measure_throughput(
    shape: Shape,
    *,
    max_steps: int,
    pools: ParamsCache,
    num_steps: int,
    repeats: int,
    seed: int,
    reference: bool = False,
    compute_action_mask: bool = True,
) -> dict[str, Any]:
    """Env steps/s of `repeats` timed rollouts after one warm-up (compiling) rollout.

    Each call continues from the previous one's state, so episode ages keep the
    staggered distribution of `BatchEnv.reset`.
    """
    batch_env, params = build_batch_env(shape, max_steps, pools, compute_action_mask)
    rollout = make_rollout(batch_env, num_steps, reference)
    key_reset, key_rollout = jax.random.split(jax.random.PRNGKey(seed))
    obs, state = batch_env.reset(key_reset, params)
    carry = (key_rollout, state, obs)
    counts = []

    def call():
        nonlocal carry
        key, state, obs, done_count, any_done_count, reward_sum = rollout(*carry, params)
        carry = (key, state, obs)
        counts.append((done_count, any_done_count))
        return carry, reward_sum

    warmup_seconds, _ = time_once(call)
    counts.clear()
    timing = time_repeated(call, repeats)
    env_steps_per_call = shape.num_envs * num_steps
    done_total = sum(int(done) for done, _ in counts)
    any_done_total = sum(int(any_done) for _, any_done in counts)
    return {
        "num_envs": shape.num_envs,
        "map_size": shape.map_size,
        "path": "step_reference" if reference else "step",
        "max_steps": max_steps,
        "compute_action_mask": compute_action_mask,
        "warmup_seconds": warmup_seconds,
        "call_seconds": list(timing.samples),
        "call_seconds_median": timing.median,
        "call_seconds_best": timing.best,
        "env_steps_per_s_median": env_steps_per_call / timing.median,
        "env_steps_per_s_best": env_steps_per_call / timing.best,
        "env_done_fraction": done_total / (env_steps_per_call * repeats),
        "any_done_fraction": any_done_total / (num_steps * repeats),
    }
