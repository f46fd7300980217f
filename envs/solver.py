"""A scripted solver: finishes maps by driving the real env, to prove that generated maps are
solvable inside `max_steps` and to measure how many steps a task needs.

Geometry comes from the env's own functions, jitted and vmapped over every base pose once per
config (`envs.solver_geometry`): which pose each base action reaches, which tiles a pose's
footprint covers, and which tiles the arm reaches from every (pose, arm heading). Planning is
numpy on the current maps. Every chosen action is applied by a jitted `env.step_no_reset`, so
the solver never disagrees with the dynamics; a prediction the env does not confirm ends the
solve with a reason.

The plan is greedy, one cycle at a time. A cycle drives to a base pose (shortest path in the
pose graph), turns the cabin, takes (DO: digs, or picks up soil in reach), turns the cabin and
dumps (DO) from the same pose. Each candidate cycle is simulated in numpy; the one with the
most task progress per step (hard-to-reach targets weigh more) wins among the safe ones:
those that leave no more targets out of reach (no reachable pose with a soil-free sector
holding the target and dump space) than before. When none is safe, a relocation cycle that
moves soil out of the way is tried, then the plan backjumps a few cycles and continues with
noisy rates; after `MAX_BACKJUMPS` it accepts the least harmful cycle.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from envs.env import ExcavationEnv
from envs.solver_planner import Planner
from envs.state import EnvParams, EnvState


@dataclasses.dataclass(frozen=True)
class SolverResult:
    """One solve. `actions` int32 [steps]; `completed` is the env's `task_done` at the last
    action; `progress` the env's `episode_progress` at the end; `reason` why it stopped
    short (empty when completed)."""

    actions: np.ndarray
    completed: bool
    steps: int
    episode_return: float
    progress: float
    reason: str = ""


# ----------------------------------------------------------------------------- driving the env


@functools.cache
def jitted_env_functions(env: ExcavationEnv):
    """(reset, step) of `env`, jitted once per env object."""
    return jax.jit(env.reset), jax.jit(env.step_no_reset)


def initial_state(env, params: EnvParams, map_index: int, agent_type: int, key) -> EnvState:
    reset, _ = jitted_env_functions(env)
    _, state = reset(key, params, jnp.int32(agent_type), jnp.int32(map_index))
    return state


def replay(env, params, map_index, agent_type, key, actions) -> tuple[bool, float, int]:
    """Runs an action list from the solver's start state: (task_done at the last action,
    episode return, first step with terminated, -1 if none)."""
    _, step = jitted_env_functions(env)
    state = initial_state(env, params, map_index, agent_type, key)
    total, first_done, done = 0.0, -1, False
    for index, action in enumerate(actions):
        _, state, reward, terminated, _, _ = step(key, state, jnp.int32(action), params)
        total += float(reward)
        done = bool(terminated)
        if done and first_done < 0:
            first_done = index
    return done, total, first_done


def solve(
    env: ExcavationEnv,
    params: EnvParams,
    map_index: int,
    agent_type: int,
    key: jax.Array,
    max_steps: int,
    plan_seed: int = 0,
    time_limit: float | None = None,
) -> SolverResult:
    """Finishes map `map_index` of `params` with an agent of `agent_type` from the env's
    reset (spawn drawn from `key`), within `max_steps` actions if the planner can: plans
    in numpy, then applies every action with the jitted env step and checks each cycle's
    outcome against the plan. `time_limit`: seconds of planner search, None for no limit."""
    _, step = jitted_env_functions(env)
    state = initial_state(env, params, map_index, agent_type, key)
    host = jax.device_get(state)
    planner = Planner(env.config, agent_type, host.target_map, host.obstacles)
    plan = planner.plan(planner.state_of(host), max_steps, plan_seed, time_limit)
    actions, rewards, reason, completed = [], [], plan.reason, False
    for cycle, cycle_actions in zip(plan.cycles, plan.actions, strict=True):
        cycle_actions = cycle_actions[: max_steps - len(actions)]
        flags = []
        for action in cycle_actions:
            _, state, reward, terminated, _, _ = step(key, state, jnp.int32(action), params)
            actions.append(action)
            rewards.append(reward)
            flags.append(terminated)
        flags = np.asarray(jax.device_get(flags), bool)
        if flags[:-1].any():
            reason = "task_done before the end of a cycle"
            break
        completed = bool(flags[-1])
        if len(actions) >= max_steps:
            break
        if not np.array_equal(np.asarray(state.action_map).ravel(), cycle.action_map):
            reason = f"the env disagrees with the plan after {len(actions)} steps"
            break
    if not completed and not reason:
        reason = "the plan ended before task_done"
    return SolverResult(
        actions=np.asarray(actions, np.int32),
        completed=completed,
        steps=len(actions),
        episode_return=float(np.sum(jax.device_get(rewards))) if rewards else 0.0,
        progress=float(env.episode_progress(state)),
        reason="" if completed else reason,
    )


def summarize(records: list[dict]) -> list[dict]:
    """Per (map_type, agent) of solve records (dicts with map_type, agent, completed, steps,
    episode_return, seconds): maps, solved, steps median / p90 / max over the solved maps
    (NaN if none), mean episode return over all maps, total seconds."""
    rows = []
    groups = sorted({(r["map_type"], r["agent"]) for r in records})
    for map_type, agent in groups:
        group = [r for r in records if (r["map_type"], r["agent"]) == (map_type, agent)]
        steps = np.array([r["steps"] for r in group if r["completed"]], np.float64)
        rows.append(
            {
                "map_type": map_type,
                "agent": agent,
                "maps": len(group),
                "solved": int(steps.size),
                "steps_median": _statistic(steps, np.median),
                "steps_p90": _statistic(steps, lambda x: np.percentile(x, 90)),
                "steps_max": _statistic(steps, np.max),
                "return_mean": float(np.mean([r["episode_return"] for r in group])),
                "seconds_total": float(sum(r.get("seconds", 0.0) for r in group)),
            }
        )
    return rows


def _statistic(values: np.ndarray, function) -> float:
    return float(function(values)) if values.size else float("nan")
