"""The final observations a rollout keeps for the bootstrap of its truncated steps.

A truncated step bootstraps from the observation before its reset
(`StepResult.final_observation`). A rollout used to store that observation for every step
and env, [T, N, ...], to read back the few rows that timed out: at 64 envs x 64x64 five map
layers, 42 MB per update written, zeroed first and copied, a twentieth of a CPU update under
a trained policy's actions (docs/PERFORMANCE.md). An env truncates at most once every
`TrainEnv.truncation_period` steps, so `slots_needed(T, period)` slots per env hold every
truncation of a rollout: usually one. The slots are written only at a step where some env
truncates (one `lax.cond`), and the bootstrap reads the same observations as before, so
the values are the same bit for bit.

    finals = empty(observation, slots_needed(num_steps, env.truncation_period))
    each step:  finals = kept(finals, result.truncated, result.final_observation)
    after:      update.make_bootstrap_values_fn(...)(params, last_obs, finals, num_steps)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class FinalObservations(NamedTuple):
    obs: Any
    """The observation pytree with a leading [K, N]: slot k of env n holds its (k + 1)-th
    truncation's final observation of this rollout (zeros where it has none)."""
    step: jax.Array
    """int32 [K, N]: the rollout step of that truncation, -1 where the slot is empty."""
    count: jax.Array
    """int32 [N]: the truncations kept so far."""
    steps_taken: jax.Array
    """int32 []: the rollout steps seen so far (the index of the next one)."""


def slots_needed(num_steps: int, truncation_period: int) -> int:
    """Slots per env that hold every truncation of a rollout of `num_steps` steps when two
    truncations of one env are at least `truncation_period` steps apart: the first may come
    at step 0 (a staggered episode), each later one a period on."""
    if num_steps < 1 or truncation_period < 1:
        raise ValueError(f"num_steps and truncation_period must be >= 1, got {num_steps} and "
                         f"{truncation_period}")
    return 1 + (num_steps - 1) // truncation_period


def empty(observation: Any, slots: int) -> FinalObservations:
    """No truncation kept yet, `slots` per env, for observations like `observation` (pytree
    of [N, ...])."""
    num_envs = jax.tree.leaves(observation)[0].shape[0]
    obs = jax.tree.map(lambda x: jnp.zeros((slots, *x.shape), x.dtype), observation)
    return FinalObservations(obs=obs, step=jnp.full((slots, num_envs), -1, jnp.int32),
                             count=jnp.zeros((num_envs,), jnp.int32),
                             steps_taken=jnp.zeros((), jnp.int32))


def kept(finals: FinalObservations, truncated: jax.Array, final_observation: Any
         ) -> FinalObservations:
    """`finals` after one rollout step: each env truncated at it (`truncated` bool [N]) keeps
    its `final_observation` (pytree of [N, ...]) in its next slot. The slots are rewritten
    only at a step where some env truncated. An env's truncations past its K-th would not be
    kept: `slots_needed` with the env's `truncation_period` leaves no such one."""

    def write(finals: FinalObservations) -> FinalObservations:
        masks = [truncated & (finals.count == slot) for slot in range(finals.step.shape[0])]

        def per_slot(stored, new):
            rows = [jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, row)
                    for mask, row in zip(masks, stored, strict=True)]
            return jnp.stack(rows)

        obs = jax.tree.map(per_slot, finals.obs, final_observation)
        step = jnp.stack([jnp.where(mask, finals.steps_taken, row)
                          for mask, row in zip(masks, finals.step, strict=True)])
        return finals._replace(obs=obs, step=step,
                               count=finals.count + truncated.astype(jnp.int32))

    finals = jax.lax.cond(jnp.any(truncated), write, lambda finals: finals, finals)
    return finals._replace(steps_taken=finals.steps_taken + 1)


def from_stacked(final_obs: Any, truncated: jax.Array) -> FinalObservations:
    """Every step's final observation (pytree of [T, N, ...]) with `truncated` bool [T, N]
    as `FinalObservations` of T slots, slot t holding step t: for callers that have them
    all (the validation gates, tests)."""
    steps = truncated.shape[0]
    step = jnp.where(truncated, jnp.arange(steps, dtype=jnp.int32)[:, None], -1)
    return FinalObservations(obs=final_obs, step=step,
                             count=jnp.sum(truncated, axis=0, dtype=jnp.int32),
                             steps_taken=jnp.asarray(steps, jnp.int32))
