"""The reward of one environment step, as named terms that sum to the reward.

Progress is potential-based. The task potential of a state is

    Phi(s) = (dig_tiles_done - misplaced_soil) / max(dig_tiles_total, 1)

in [0, 1] on every reachable state (soil comes only from digging, so misplaced <= dug), and a
step pays `progress_weight * (Phi(s') - Phi(s))`. The sum over an episode telescopes to
`progress_weight * (Phi(final) - Phi(initial))`, so a sequence of actions that brings the task
back to an earlier state earns nothing from it: picking up and dumping the same soil nets 0,
dumping soil outside the dump zones costs what digging it paid, picking it back up pays it back.
The term is undiscounted: the environment does not know the trainer's discount.

Every action, DO_NOTHING included, pays the same `step` cost; wasted actions (a rejected move,
a base action while loaded, a DO that changes nothing) pay an extra cost on top, never a gain.
So no loop of actions earns more than idling, and any progress earns more than idling. The
terminal bonus is paid on the step that completes the task, never on a timeout.
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

    The progress term is computed from the integer change of the potential's numerator, so a
    step and the step that undoes it pay exactly opposite amounts.
    """
    progress_units = (next_dig_tiles_done - next_misplaced_soil) - (
        dig_tiles_done - misplaced_soil
    )
    total = jnp.maximum(dig_tiles_total, 1)
    terms = {
        "step": jnp.asarray(config.step),
        "collision": jnp.where(collided, config.collision, 0.0),
        "move_while_loaded": jnp.where(moved_while_loaded, config.move_while_loaded, 0.0),
        "do_no_effect": jnp.where(do_no_effect, config.do_no_effect, 0.0),
        "progress": config.progress_weight * progress_units / total,
        "terminal_success": jnp.where(task_done, config.terminal_success, 0.0),
    }
    return {name: jnp.asarray(value, jnp.float32) for name, value in terms.items()}
