"""The per-env curriculum's update: promotion on consecutive successes, demotion on
consecutive timeouts (`envs.config.CurriculumConfig`)."""

from __future__ import annotations

import jax.numpy as jnp

from envs.config import CurriculumConfig
from envs.state import CurriculumState


def advance(spec: CurriculumConfig | None, curriculum: CurriculumState, success,
            timeout) -> CurriculumState:
    """The curriculum state after an env step; `success` / `timeout` bool []: the episode
    ended with the task done / by truncation. A change of level resets both counts."""
    if spec is None:
        return curriculum
    successes = jnp.where(
        success,
        curriculum.consecutive_successes + 1,
        jnp.where(timeout, 0, curriculum.consecutive_successes),
    )
    failures = jnp.where(
        timeout,
        curriculum.consecutive_failures + 1,
        jnp.where(success, 0, curriculum.consecutive_failures),
    )
    promote = successes >= spec.promote_after
    demote = failures >= spec.demote_after if spec.demote_after > 0 else jnp.bool_(False)
    top = len(spec.levels) - 1
    level = jnp.clip(
        curriculum.level + promote.astype(jnp.int32) - demote.astype(jnp.int32), 0, top
    )
    changed = promote | demote
    return CurriculumState(
        level=level,
        consecutive_successes=jnp.where(changed, 0, successes),
        consecutive_failures=jnp.where(changed, 0, failures),
    )
