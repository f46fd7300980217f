"""Every validation gate, in the order `--case all` runs them."""

from __future__ import annotations

from terra_rl.validation import env_gates, loop_gates, model_gates, reset_gates, train_gates
from terra_rl.validation.gate import Gate

GATES: tuple[Gate, ...] = (
    Gate(
        "training-accounting",
        "updates x env steps per update cover total timesteps on 1, 2, 4 devices; steps/s",
        loop_gates.training_accounting,
        supports_disable_jit=False,
    ),
    Gate(
        "ppo-mask",
        "mask on: masked actions have probability 0, finite log-probs and gradients; "
        "off: logits untouched",
        train_gates.ppo_mask,
    ),
    Gate(
        "model-policy",
        "every preset's policy: output shapes, float32 logits and value, parameter count",
        model_gates.model_policy,
    ),
    Gate(
        "model-separate-trunks",
        "separate actor/critic trunks share no parameter; the shared trunk gets both losses",
        model_gates.model_separate_trunks,
    ),
    Gate(
        "checkpoint-config-restore",
        "a checkpoint restores the exact config; old configs get the legacy defaults",
        train_gates.checkpoint_config_restore,
    ),
    Gate(
        "timeout-bootstrap-value",
        "a truncated transition bootstraps V(final observation), not V(reset observation)",
        train_gates.timeout_bootstrap_value,
    ),
    Gate(
        "gae-timeout-bootstrap",
        "GAE with terminal, truncated and reset boundaries equals a NumPy reference",
        train_gates.gae_timeout_bootstrap,
    ),
    Gate(
        "terminal-reward-only-on-task-done",
        "a timeout with partial progress never gets the terminal bonus",
        reset_gates.terminal_reward_only_on_task_done,
    ),
    Gate(
        "state-action-mask",
        "the analytic action mask equals each action's real effect on random built states",
        env_gates.state_action_mask,
    ),
    Gate(
        "state-step-dispatch",
        "every action of both agent types reaches its own effect and no other",
        env_gates.state_step_dispatch,
    ),
    Gate(
        "env-action-mask",
        "the action mask equals the real effects on states visited on dataset or generated maps",
        env_gates.env_action_mask,
    ),
    Gate(
        "synthetic-step-fast-reset",
        "single-env step with auto-reset equals the unconditional-reset reference",
        reset_gates.synthetic_step_fast_reset,
    ),
    Gate(
        "synthetic-batch-step-fast-reset",
        "BatchEnv fast reset equals the reference for no, one, partial and all done",
        reset_gates.synthetic_batch_step_fast_reset,
    ),
    Gate(
        "env-episode-progress",
        "progress is monotone, 1.0 at task completion, 0 after a reset; staggered ages spread",
        reset_gates.env_episode_progress,
    ),
    Gate(
        "precision-head-gradients",
        "every head gets finite non-zero gradients in float32, bfloat16 and float16",
        model_gates.precision_head_gradients,
        supports_disable_jit=False,
    ),
    Gate(
        "first-update-smoke",
        "one full update of the tiny config through the host loop, finite metrics",
        loop_gates.first_update_smoke,
        supports_disable_jit=False,
    ),
)
GATES_BY_NAME = {gate.name: gate for gate in GATES}


def select_gates(names: list[str]) -> list[Gate]:
    """The gates for `names` in registry order, `all` meaning every gate. Raises ValueError
    (one line listing the valid names) on an unknown name."""
    unknown = [name for name in names if name != "all" and name not in GATES_BY_NAME]
    if unknown:
        raise ValueError(
            f"unknown case(s) {', '.join(unknown)}; valid: all, {', '.join(GATES_BY_NAME)}"
        )
    if "all" in names:
        return list(GATES)
    return [gate for gate in GATES if gate.name in names]
