"""The reward of one environment step, as named terms that sum to the reward.

Progress is potential-based. The task potential of a state is

    Phi(s) = (dig_tiles_done - misplaced_soil) / max(dig_tiles_total, 1)

in [0, 1] on every reachable state (soil comes only from digging, so misplaced <= dug), and a
step pays `progress_weight * (gamma * Phi(s') - Phi(s))` with `gamma` the reward's `discount`,
which the trainer sets to the run's discount (Ng, Harada and Russell's potential-based
shaping, the form that keeps the optimal policy). The discounted sum over an episode of T
steps telescopes to `progress_weight * (gamma**T * Phi(s_T) - Phi(s_0))`, so a sequence of
actions that brings the task back to an earlier potential earns, in discounted return, what
idling over the same steps earns, less its extra costs: picking up and dumping the same soil
gains nothing at any gamma.

Shaping that pays `Phi(s') - Phi(s)` under a trainer's gamma < 1 could be farmed: a pick-up of
misplaced soil paid +a, the dump outside a zone one step or more later cost a discounted by
gamma, so an endless cycle of them was worth about a / (1 + gamma) more than idling.
`discount` 1.0 (the env's default, and runs saved before the change) pays that older form.

Every action, DO_NOTHING included, pays the same `step` cost; wasted actions (a rejected move,
a base action while loaded, a DO that changes nothing) pay an extra cost on top, never a gain.
So no loop of actions earns more discounted return than idling, and any progress earns more
than idling. The terminal bonus is paid on the step that completes the task, never on a
timeout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.config import RewardConfig

REWARD_TERM_NAMES = (
    "step",
    "collision",
    "move_while_loaded",
    "do_no_effect",
    "progress",
    "terminal_success",
)
"""Keys of `info["reward_terms"]`; their values sum to the step's reward."""


def step_reward_terms(
    config: RewardConfig,
    *,
    dig_tiles_total: jax.Array,
    dig_tiles_done: jax.Array,
    misplaced_soil: jax.Array,
    next_dig_tiles_done: jax.Array,
    next_misplaced_soil: jax.Array,
    collided: jax.Array,
    moved_while_loaded: jax.Array,
    do_no_effect: jax.Array,
    task_done: jax.Array,
) -> dict[str, jax.Array]:
    """{name in REWARD_TERM_NAMES: float32 []} for one step.

    Counters int32 [] before (`dig_tiles_done`, `misplaced_soil`) and after (`next_*`) the
    step; flags bool []: `collided` a move or base turn was rejected by the map edge or a
    blocked tile, `moved_while_loaded` a move or base turn was tried with a loaded bucket,
    `do_no_effect` a DO changed nothing, `task_done` the step completed the task.

    With `config.discount` 1 the progress term is computed from the integer change of the
    potential's numerator, so a step and the step that undoes it pay exactly opposite amounts;
    below 1 it is `progress_weight * (discount * Phi(s') - Phi(s))`.
    """
    numerator = dig_tiles_done - misplaced_soil
    next_numerator = next_dig_tiles_done - next_misplaced_soil
    total = jnp.maximum(dig_tiles_total, 1)
    if config.discount == 1.0:  # the integer form, bit for bit that of runs before discounting
        progress_units = next_numerator - numerator
    else:
        progress_units = config.discount * next_numerator - numerator
    terms = {
        "step": jnp.asarray(config.step),
        "collision": jnp.where(collided, config.collision, 0.0),
        "move_while_loaded": jnp.where(moved_while_loaded, config.move_while_loaded, 0.0),
        "do_no_effect": jnp.where(do_no_effect, config.do_no_effect, 0.0),
        "progress": config.progress_weight * progress_units / total,
        "terminal_success": jnp.where(task_done, config.terminal_success, 0.0),
    }
    return {name: jnp.asarray(value, jnp.float32) for name, value in terms.items()}
