"""The standard-task table of docs/RESULTS.md: gymnax tasks at the env-step budgets of the
published gymnax PPO baselines (gymnax-blines `agents/<env>/ppo.yaml`), their published
returns as floors, the flags that run each, and the summary over seeds.

`scripts/run_results.py` runs the table; this module is the data and the pure parts.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class StandardTask:
    """One row: `env` a gymnax id, `budget` env steps, `reference` the published PPO return
    (gymnax README, from gymnax-blines at the same budget), `flags` our train_mixed.py flags
    for it (shape and PPO settings; everything else comes from `BASE_FLAGS`)."""

    env: str
    budget: int
    reference: float
    flags: tuple[str, ...]


BASE_FLAGS = (
    "--config", "cpu_demo", "--disable_action_mask", "--disable_dig_distance",
    "--disable_pose_distance", "--curriculum", "",
    "--gae_lambda", "0.95", "--clip_eps", "0.2", "--vf_coef", "0.5",
    "--checkpoint_interval", "0", "--wandb_mode", "disabled", "--eval_episodes", "64",
    "--updates_per_dispatch", "16",
)
"""Flags shared by every task: cpu_demo's float32, no excavation features. The network is
the 2 x 64 MLP: tanh, relu over the flattened image for MinAtar (`--image_encoder mlp
--gymnax_activation relu`, as PureJaxRL runs MinAtar)."""


def _ppo(envs: int, steps: int, epochs: int, minibatches: int, lr: float, gamma: float,
         ent: float, grad_norm: float, schedule: str = "constant") -> tuple[str, ...]:
    return ("--num_envs_per_device", str(envs), "--num_steps", str(steps),
            "--update_epochs", str(epochs), "--num_minibatches", str(minibatches),
            "--lr", str(lr), "--lr_schedule", schedule, "--gamma", str(gamma),
            "--ent_coef_start", str(ent), "--ent_coef_end", str(ent),
            "--max_grad_norm", str(grad_norm))


# MinAtar: gymnax-blines' shape (64 envs x 128 steps, 4 epochs x 8 minibatches) at
# PureJaxRL's MinAtar learning rate, 5e-3 annealed linearly, gamma 0.99 and relu; at
# gymnax-blines' 5e-4 and 0.999 PPO sat at 6-11 on Breakout (docs/RESULTS.md).
_MINATAR = (*_ppo(64, 128, 4, 8, 5e-3, 0.99, 0.01, 0.5, "linear"),
            "--image_encoder", "mlp", "--gymnax_activation", "relu")
# Asterix at gymnax-blines' discount (0.999) on PureJaxRL's 2 x 64 relu MLP, lr 2e-3 annealed
# linearly: 27.6-31.7 greedy over seeds 0-2 at 65k env steps/s, where gymnax-blines' lr 5e-4
# constant needed a 2 x 128 MLP for 23.4-25.8 at 44k, and the MinAtar settings above give
# 8.4-9.5 (docs/RESULTS.md).
_ASTERIX = (*_ppo(64, 128, 4, 8, 2e-3, 0.999, 0.01, 0.5, "linear"),
            "--image_encoder", "mlp", "--gymnax_activation", "relu")
# CartPole at 16 envs (gymnax-blines: 8) and lr 1e-3 (5e-4): half the gradient steps per
# env step, 500 on seeds 0-5 (docs/RESULTS.md).
# Acrobot at twice gymnax-blines' learning rate, annealed: greedy median -80.55 over seeds
# 0-5 against -85.0 at its 5e-4 constant (docs/RESULTS.md).
# MountainCar sees its observations scaled to [-1, 1]: then, with its timeouts bootstrapped
# as on every other task, 4 epochs (gymnax-blines: 64) over 32 envs x 16 steps (16 x 32) at
# entropy 0.05 reach the flag on seeds 0-5, at ten times the rate of gymnax-blines' settings
# (which reach it only with the timeouts treated as terminal; docs/RESULTS.md).
TASKS: dict[str, StandardTask] = {
    "CartPole-v1": StandardTask("gymnax:CartPole-v1", 150_000, 500.0,
                                _ppo(16, 32, 4, 4, 1e-3, 0.99, 0.01, 0.5)),
    "Acrobot-v1": StandardTask("gymnax:Acrobot-v1", 500_000, -80.0,
                               _ppo(16, 32, 4, 4, 1e-3, 0.99, 0.01, 1.0, "linear")),
    "MountainCar-v0": StandardTask("gymnax:MountainCar-v0", 500_000, -118.0,
                                   (*_ppo(32, 16, 4, 4, 1e-2, 0.99, 0.05, 1.0, "linear"),
                                    "--enable_gymnax_scale_observations")),
    "Breakout-MinAtar": StandardTask("gymnax:Breakout-MinAtar", 10_000_000, 28.0, _MINATAR),
    "Asterix-MinAtar": StandardTask("gymnax:Asterix-MinAtar", 10_000_000, 15.0, _ASTERIX),
    "Freeway-MinAtar": StandardTask("gymnax:Freeway-MinAtar", 10_000_000, 58.0, _MINATAR),
    "SpaceInvaders-MinAtar": StandardTask("gymnax:SpaceInvaders-MinAtar", 10_000_000, 131.0,
                                          _MINATAR),
}

NUM_EVALS = 10
"""Evaluations per run (the last one is the result)."""


def updates_of(task: StandardTask, budget: int) -> int:
    """Updates a run of `budget` env steps makes with the task's shape (as
    `TrainConfig.num_updates`: the last one may run past the budget)."""
    envs = int(task.flags[task.flags.index("--num_envs_per_device") + 1])
    steps = int(task.flags[task.flags.index("--num_steps") + 1])
    return max(1, math.ceil(budget / (envs * steps)))


def run_flags(task: StandardTask, seed: int, budget: int, runs_dir: str,
              run_name: str) -> list[str]:
    """train_mixed.py arguments for one seed of `task` at `budget` env steps."""
    updates = updates_of(task, budget)
    return [*BASE_FLAGS, "--env", task.env, *task.flags, "--seed", str(seed),
            "--total_timesteps", str(budget),
            "--log_eval_interval", str(max(1, updates // NUM_EVALS)),
            "--log_train_interval", str(max(1, min(100, updates // 50))),
            "--runs_dir", runs_dir, "--run_name", run_name]


def run_record(records: Sequence[dict], wall_seconds: float) -> dict[str, float]:
    """One run's row from its metrics.jsonl records: the last eval's greedy and sampled
    first-episode returns, env steps, the median steps/s over the train logs (one log's
    rate spreads widely on a run of seconds) and the compile time."""
    evals = [r for r in records if "eval/first_episode_return" in r]
    trains = [r for r in records if "performance/steps_per_second" in r]
    if not evals or not trains:
        raise ValueError("a run with no eval or no train log: nothing to report")
    compiled = [r["performance/compile_seconds"] for r in trains
                if "performance/compile_seconds" in r]
    return {
        "return": evals[-1]["eval/first_episode_return"],
        "sampled_return": evals[-1].get("eval_sampled/first_episode_return", math.nan),
        "env_steps": evals[-1]["env_step"],
        "steps_per_second": statistics.median(
            r["performance/steps_per_second"] for r in trains),
        "compile_seconds": compiled[0] if compiled else math.nan,
        "wall_seconds": wall_seconds,
    }


def summarize(task_name: str, runs: Sequence[dict]) -> dict:
    """Median, min and max of the return over seeds; median steps/s and wall time."""
    returns = [run["return"] for run in runs]
    task = TASKS[task_name]
    return {
        "task": task_name,
        "budget": task.budget,
        "seeds": len(runs),
        "return_median": statistics.median(returns),
        "return_min": min(returns),
        "return_max": max(returns),
        "reference": task.reference,
        "steps_per_second": statistics.median(run["steps_per_second"] for run in runs),
        "wall_seconds": statistics.median(run["wall_seconds"] for run in runs),
    }


def markdown_table(rows: Sequence[dict]) -> str:
    """The RESULTS.md table of `summarize` rows."""
    lines = [
        "| task | env steps | return, median (min-max) over seeds | published PPO | env steps/s "
        "| wall time per run |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        seeds = f"{row['seeds']} seed{'s' if row['seeds'] != 1 else ''}"
        lines.append(
            f"| {row['task']} | {row['budget']:,} | {row['return_median']:.1f} "
            f"({row['return_min']:.1f} to {row['return_max']:.1f}, {seeds}) "
            f"| {row['reference']:g} | {row['steps_per_second']:,.0f} "
            f"| {row['wall_seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines)
