"""The rollout: a `lax.scan` of (choose an action, step the envs) that training, evaluation
and the profiler share. What differs between them is passed in: how an action is chosen
(`choose`: the policy sampled with the update's Gumbel noise, greedy or sampled on the
held-out maps, or random) and what each step leaves behind (`record`: PPO transitions,
evaluation statistics, a checksum).

    carry = RolloutCarry(env_state, observation, extra)   extra: the caller's (parameters,
                                                          counters, statistics, ...)
    for x in xs:                                          xs: per-step inputs, [num_steps, ...]
        choice = choose(extra, observation, x)            -> Choice(action int32 [N],
                                                             env_key, kept)
        next_state, result = env.step(choice.env_key, env_state, choice.action, env_params)
        extra, output = record(extra, Step(age, choice, result, env_state))
        env_state, observation = next_state, result.observation

Every array has a leading [num_envs] (`N`); `rollout` returns the last carry and the
outputs stacked to [num_steps, ...]. An optional `cache` (`ObservationCache`) adds what
`choose` reads from the observation and may keep from step to step (the dig and pose
distances' goals and the pose distance's search: `terra_rl.features.reach_cache`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax

from terra_rl.adapters.contract import Observation, StepResult, TrainEnv


class RolloutCarry(NamedTuple):
    env_state: Any
    observation: Observation
    """The observation the next action is chosen from."""
    extra: Any
    """What the caller carries from step to step."""
    cache: Any = None
    """The state of the rollout's `ObservationCache`, where it has one (None before its
    first step)."""


class Choice(NamedTuple):
    action: jax.Array
    """int32 [N]."""
    env_key: jax.Array
    """The key of this env step."""
    kept: Any = None
    """What `record` needs from choosing (the observation with derived features, logits,
    values, ...)."""


class Step(NamedTuple):
    age: jax.Array
    """int32 [N], the episode age of the observation the action was chosen from."""
    choice: Choice
    result: StepResult
    env_state: Any
    """The env state the action was taken in (what the validation gates inspect)."""


class ObservationCache(Protocol):
    """What a rollout keeps from step to step to build the observation a choice sees
    (`terra_rl.features.reach_cache.ReachCache`)."""

    def init(self, observation: Observation) -> Any: ...

    def refresh(self, state: Any, observation: Observation) -> tuple[Any, Observation]: ...


Choose = Callable[[Any, Observation, Any], Choice]
Record = Callable[[Any, Step], tuple[Any, Any]]


def rollout(env: TrainEnv, env_params, choose: Choose, record: Record, carry: RolloutCarry,
            xs, length: int | None = None, cache: ObservationCache | None = None
            ) -> tuple[RolloutCarry, Any]:
    """`lax.scan` of `choose`, `env.step` and `record` over `xs` (see the module docstring):
    (last carry, `record`'s outputs stacked to [num_steps, ...]).

    With a `cache`, `choose` sees `cache.refresh(state, observation)`'s observation, the
    state carried from step to step (`RolloutCarry.cache`, started by `cache.init` when
    None); the observation carried and returned stays the env's own."""
    if cache is not None and carry.cache is None:
        carry = carry._replace(cache=cache.init(carry.observation))

    def one_step(carry: RolloutCarry, x):
        observation, cache_state = carry.observation, carry.cache
        if cache is not None:
            cache_state, observation = cache.refresh(cache_state, observation)
        choice = choose(carry.extra, observation, x)
        age = env.episode_age(carry.env_state)
        env_state, result = env.step(choice.env_key, carry.env_state, choice.action, env_params)
        extra, output = record(carry.extra, Step(age, choice, result, carry.env_state))
        return RolloutCarry(env_state, result.observation, extra, cache_state), output

    return jax.lax.scan(one_step, carry, xs, length=length)
