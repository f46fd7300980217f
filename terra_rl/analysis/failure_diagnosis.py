"""Why a trained policy's held-out episodes fail (`scripts/diagnose_failures.py`).

Each held-out map is played to the end of the eval horizon (greedy or sampled). A failed
episode's final state is then judged with the scripted solver's planner, which models the
env's own pose graph and dig/dump rules (`envs.solver_planner`):

- `loaded dead end`: soil in the bucket and no tile to dump it on from any cabin heading;
  the base cannot move while loaded, so nothing can change any more.
- `loaded, dumps masked`: soil in the bucket, a tile to dump it on, but the env's action mask
  forbids DO at every cabin heading, even after a full cabin turn (its dump rules without
  `dump_after_full_turn`: `envs.action_rules`), so the policy can never dump. The planner
  does not model the mask, so this is judged from the env.
- `targets out of reach`: undug targets that no reachable pose can dig with a free dump tile
  in reach. `blocked_reasons` splits them: `cut off` (in no sector of a reachable pose: digs
  and piles have walled them in), `soil in the way` (only in sectors holding soil that DO
  picks up first) and `no dump space` (only in reach of poses with no free dump tile).
- `no dump space`: more soil still to dump than free dump tiles within reach of reachable
  poses.
- `planner gave up`: none of the above, but the planner found no way to finish either.
- `stalled while solvable`: the planner finishes the map from the final state; the policy
  stopped making progress all the same (a loop: see `loop_actions`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp

from envs.action_rules import pose_code
from envs.actions import DO, TRACKED_ACTION_NAMES, WHEELED, WHEELED_ACTION_NAMES
from envs.solver import jitted_env_functions
from envs.solver_planner import H, Planner
from terra_rl.analysis.playback import TrainedPolicy

CATEGORIES = (
    "done",
    "loaded dead end",
    "loaded, dumps masked",
    "targets out of reach",
    "no dump space",
    "planner gave up",
    "stalled while solvable",
)
LOOP_WINDOW = 40
"""Actions at the end of an episode whose counts name its loop."""


@dataclasses.dataclass(frozen=True)
class EpisodeDiagnosis:
    map_index: int
    agent_type: int
    category: str
    steps: int
    progress: float
    """Share of the dig tiles done at the end."""
    last_progress_step: int
    """Step of the last new best of the task potential (-1: none)."""
    targets_left: int
    solver_steps: int
    """Steps the planner needs to finish from the final state; -1 where it cannot."""
    loop_actions: dict[str, int]
    """The most frequent actions of the last LOOP_WINDOW steps, with their counts."""
    blocked_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    """For `targets out of reach`: the targets per reason (`Planner.blocked_reasons`)."""


def judge_final_state(planner: Planner, state, plan_steps: int) -> tuple[str, int]:
    """(category, planner steps or -1) of a failed episode's final env state (on host)."""
    start = planner.state_of(state)
    action_map, dumpability, node = start.action_map, start.dumpability, start.node
    load = int(state.agent.loaded)
    if load > 0:
        pose = planner.pose_of(node)
        if all(planner.dump(action_map, dumpability, pose, arm, load) is None
               for arm in range(H)):
            return "loaded dead end", -1
    out_of_reach, deficit = planner.blocked(action_map, dumpability, node)
    if out_of_reach:
        return "targets out of reach", -1
    if deficit:
        return "no dump space", -1
    plan = planner.plan(start, plan_steps, 0)
    if plan.reason:
        return "planner gave up", -1
    return "stalled while solvable", sum(len(actions) for actions in plan.actions)


def diagnose_episode(trained: TrainedPolicy, map_index: int, agent_type: int, sample: bool,
                     key: jax.Array, plan_steps: int = 1000) -> EpisodeDiagnosis:
    """Plays held-out map `map_index` with an agent of `agent_type` to task_done or the eval
    horizon, then judges a failure (`judge_final_state`)."""
    env, params = trained.env, trained.env_params
    reset, step = jitted_env_functions(env)
    key, reset_key = jax.random.split(key)
    obs, state = reset(reset_key, params, jnp.int32(agent_type), jnp.int32(map_index))
    actions, done = [], False
    for _ in range(env.config.max_steps):
        key, act_key, step_key = jax.random.split(key, 3)
        action = trained.act(act_key, obs, sample)
        obs, state, _, terminated, _, _ = step(step_key, state, action, params)
        actions.append(int(action))
        if bool(terminated):
            done = True
            break
    host = jax.device_get(state)
    # The env counts steps since the task potential's last new best (its stall clock).
    last_progress_step = len(actions) - 1 - int(host.steps_since_progress)
    names = WHEELED_ACTION_NAMES if agent_type == WHEELED else TRACKED_ACTION_NAMES
    loop = collections.Counter(names[a] for a in actions[-LOOP_WINDOW:]).most_common(3)
    blocked_reasons = {}
    if done:
        category, solver_steps = "done", 0
    elif dumps_masked(env, state):
        category, solver_steps = "loaded, dumps masked", -1
    else:
        planner = Planner(env.config, agent_type, host.target_map, host.obstacles)
        category, solver_steps = judge_final_state(planner, host, plan_steps)
        if category == "targets out of reach":
            final = planner.state_of(host)
            blocked_reasons = planner.blocked_reasons(final.action_map, final.dumpability,
                                                      final.node)
    total = max(int(host.dig_tiles_total), 1)
    return EpisodeDiagnosis(
        map_index=map_index, agent_type=agent_type, category=category, steps=len(actions),
        progress=int(host.dig_tiles_done) / total, last_progress_step=last_progress_step,
        targets_left=int(host.dig_tiles_total) - int(host.dig_tiles_done),
        solver_steps=solver_steps, loop_actions=dict(loop), blocked_reasons=blocked_reasons,
    )


@functools.cache
def _do_at_every_cabin_heading(env):
    """Jitted `state -> (valid bool [12], allowed bool [12])`: DO's validity and its action
    mask with the cabin at each heading, the revisit memory holding the pose at all 12 (as
    after a full cabin turn, so `EnvConfig.dump_after_full_turn` applies), the rest of
    `state` as it is."""

    def check(state):
        cabins = jnp.arange(H, dtype=jnp.int32)
        memory = jnp.full_like(state.recent_poses, -1)
        circle = jax.vmap(lambda c: pose_code(env.config, state.agent, cabin=c))(cabins)
        memory = memory.at[:H].set(circle[: memory.shape[0]])
        at_headings = jax.vmap(lambda cabin: state.replace(
            agent=state.agent.replace(cabin_heading=cabin), recent_poses=memory))(cabins)
        return (jax.vmap(env.valid_actions)(at_headings)[:, DO],
                jax.vmap(env.action_mask)(at_headings)[:, DO])

    return jax.jit(check)


def dumps_masked(env, state) -> bool:
    """Loaded, some cabin heading of the pose has a valid dump, and the action mask allows DO
    at none of the 12, even after a full cabin turn (`state`: one env's state on device)."""
    if int(state.agent.loaded) == 0:
        return False
    valid, allowed = _do_at_every_cabin_heading(env)(state)
    return bool(jnp.any(valid)) and not bool(jnp.any(allowed))


def summarize(diagnoses: list[EpisodeDiagnosis]) -> dict[str, int]:
    """Episodes per category, in `CATEGORIES` order (zeros included)."""
    counts = collections.Counter(d.category for d in diagnoses)
    return {category: counts[category] for category in CATEGORIES}

