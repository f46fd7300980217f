"""Environment gates on episode boundaries: the fast auto-reset against the unconditional
reference, episode progress, and the terminal bonus only on task completion."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from envs import BatchEnv
from envs import actions as A
from terra_rl.validation import small
from terra_rl.validation.env_gates import (
    FAR_TILE,
    REACHABLE_TILE,
    UP,
    hand_built_state,
    stack,
    trees_equal,
)
from terra_rl.validation.gate import GateOptions, require


@functools.cache
def single_env_batch() -> BatchEnv:
    return BatchEnv(small.small_env(), small.small_params(), 1)


def pre_reset_step(batch: BatchEnv, key, state, actions, params):
    """What every env of `batch.step(key, ...)` computes before any reset: `step_no_reset`
    with the batch's per-env step keys."""
    keys = jax.random.split(jax.random.split(key)[0], batch.num_envs)
    return small.make_batched_step(batch.env)(keys, state, actions, params)


def hand_built_episode_ends(env):
    """{name: (state, action)}: single-env states whose next step keeps running, completes
    the task on the last allowed step (the only target tile is dug; its soil is dumped), or
    times out with partial progress (one of two target tiles dug)."""
    last = env.config.max_steps - 1
    return {
        "running": (hand_built_state(env), A.CABIN_CLOCK),
        "task_done": (
            hand_built_state(env, dug=(REACHABLE_TILE,), loaded=1, cabin=UP, age=last),
            A.DO,
        ),
        "timeout": (hand_built_state(env, dig_tiles=(REACHABLE_TILE, FAR_TILE), age=last), A.DO),
    }


def check_fast_equals_reference(batch: BatchEnv, key, state, actions, params) -> np.ndarray:
    """`batch.step` == `batch.step_reference` bit for bit; `final_observation` is the pre-reset
    observation of every env (its mask all True where the episode finished); finished envs
    restart (age 0, no last actions, same agent type) and the others keep their stepped
    observation. Returns done bool [num_envs]."""
    fast, reference = small.make_step_pair(batch)(key, state, actions, params)
    require(trees_equal(fast, reference), "fast step differs from the reference step")
    obs, new_state, _, terminated, truncated, info = fast
    pre_obs, *_ = pre_reset_step(batch, key, state, actions, params)
    done = np.asarray(terminated | truncated)
    final = info["final_observation"]
    require(
        trees_equal({k: v for k, v in final.items() if k != "action_mask"},
                    {k: v for k, v in pre_obs.items() if k != "action_mask"}),
        "final_observation is not the pre-reset observation",
    )
    # No action follows a finished episode's last observation: its mask is all True.
    expected_mask = np.where(done[:, None], True, np.asarray(pre_obs["action_mask"]))
    require(
        np.array_equal(np.asarray(final["action_mask"]), expected_mask)
        and np.array_equal(np.asarray(info["action_mask"]), expected_mask),
        "final_observation's mask is not the stepped state's (all True where done)",
    )
    require(
        np.array_equal(np.asarray(info["final_observation"]["last_actions"])[:, 0], actions),
        "final_observation does not end with the action taken",
    )
    age = np.asarray(new_state.age)
    require(
        np.array_equal(age, np.where(done, 0, np.asarray(state.age) + 1)),
        f"ages after the step are {age.tolist()}",
    )
    require(
        np.array_equal(new_state.agent.agent_type, state.agent.agent_type),
        "an env changed its agent type",
    )
    for name, value in obs.items():
        require(
            np.array_equal(np.asarray(value)[~done], np.asarray(pre_obs[name])[~done]),
            f"running envs lost their stepped observation ({name})",
        )
    if done.any():
        require(
            (np.asarray(obs["last_actions"])[done] == A.NO_ACTION).all(),
            "a reset env kept its last actions",
        )
        require(
            (np.asarray(new_state.dig_tiles_done)[done] == 0).all(), "a reset env kept its progress"
        )
    return done


def synthetic_step_fast_reset(options: GateOptions) -> str:
    batch = single_env_batch()
    env, params = batch.env, batch.params
    outcomes = []
    for name, (state, action) in hand_built_episode_ends(env).items():
        states = stack([state])
        for seed in range(2):
            key = jax.random.PRNGKey(seed)
            done = check_fast_equals_reference(
                batch, key, states, jnp.asarray([action], jnp.int32), params
            )
            require(bool(done[0]) == (name != "running"), f"{name}: done is {bool(done[0])}")
        outcomes.append(f"{name} {'reset' if done[0] else 'kept'}")
    return "single env, fast == reference: " + ", ".join(outcomes)


def synthetic_batch_step_fast_reset(options: GateOptions) -> str:
    """No env done, one (one pass of the gather/reset/scatter loop), half and all (several)."""
    batch, params = small.small_batch(), small.small_params()
    num_envs, last = batch.num_envs, batch.env.config.max_steps - 1
    require(batch.max_partial_resets == 1, "the small batch resets at most 1 env by gathering")
    index = np.arange(num_envs)
    scenarios = {
        "no_done": np.zeros(num_envs, np.int32),
        "one_done": np.where(index == 5, last, 0),
        "partial_done": np.where(index % 2 == 0, last, 0),
        "all_done": np.full(num_envs, last),
    }
    _, state = small.make_batch_reset(batch)(jax.random.PRNGKey(3), params)
    actions = jnp.full((num_envs,), A.DO_NOTHING, jnp.int32)
    for name, ages in scenarios.items():
        aged = state.replace(age=jnp.asarray(ages, jnp.int32))
        done = check_fast_equals_reference(batch, jax.random.PRNGKey(11), aged, actions, params)
        require(np.array_equal(done, ages == last), f"{name}: done {done.astype(int).tolist()}")
    return f"{num_envs} envs, fast == reference for " + ", ".join(scenarios)


def env_episode_progress(options: GateOptions) -> str:
    rollout = jax.device_get(small.small_rollout())
    states, done, progress = rollout.states, rollout.done, rollout.progress
    before = states.dig_tiles_done / np.maximum(states.dig_tiles_total, 1)
    require(((progress >= 0) & (progress <= 1)).all(), "progress outside [0, 1]")
    require((progress >= before - 1e-7).all(), "a step lowered the episode progress")
    following = before[1:]
    require(
        np.allclose(following[~done[:-1]], progress[:-1][~done[:-1]], atol=1e-7),
        "the next state's progress differs from the step's",
    )
    require((following[done[:-1]] == 0).all(), "a new episode starts with progress > 0")
    require(
        done.sum() > 0 and progress.max() > 0,
        f"the rollout must finish episodes ({done.sum()}) and make progress",
    )
    require((progress[rollout.terminated] == 1.0).all(), "a completed task has progress < 1")

    _, _, terminated, _, info = step_episode_ends(("task_done", "timeout"))
    require(
        terminated[0] and info["episode_progress"][0] == 1.0,
        f"task completion: progress {info['episode_progress'][0]!r}, expected exactly 1.0",
    )

    small_batch = small.small_batch()
    reset = small.make_batch_reset(small_batch)
    starts = [reset(jax.random.PRNGKey(seed), small.small_params())[1] for seed in range(16)]
    ages = np.concatenate([np.asarray(state.age) for state in starts])
    max_steps = small_batch.env.config.max_steps
    counts = np.bincount(ages, minlength=max_steps)
    quarters = counts.reshape(4, -1).sum(axis=1)
    require(ages.min() >= 0 and ages.max() < max_steps, "staggered ages outside [0, max_steps)")
    require(
        (counts > 0).sum() >= 0.9 * max_steps and quarters.min() > len(ages) / 4 * 0.6,
        f"staggered ages do not spread: per quarter {quarters.tolist()}",
    )
    wheeled = int((np.asarray(starts[0].agent.agent_type) == A.WHEELED).sum())
    require(wheeled == small_batch.num_envs // 2, f"{wheeled} wheeled envs, expected half")
    return (
        f"monotone over {done.size} steps ({done.sum()} resets to 0), 1.0 at completion, "
        f"{len(ages)} staggered ages cover {(counts > 0).sum()}/{max_steps}"
    )


def step_episode_ends(names: tuple[str, ...]):
    """Host outputs `(state, reward, terminated, truncated, info)` of `step_no_reset` on the
    `hand_built_episode_ends` states `names`, index i for names[i] (the small batch's width of
    copies, so the compiled step is the shared one)."""
    env = small.small_env()
    ends = hand_built_episode_ends(env)
    copies = small.SMALL_NUM_ENVS // len(names)
    states = stack([ends[name][0] for name in names] * copies)
    actions = jnp.asarray([ends[name][1] for name in names] * copies, jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), len(names) * copies)
    step = small.make_batched_step(env)
    _, *outputs = jax.device_get(step(keys, states, actions, small.small_params()))
    return outputs


def terminal_reward_only_on_task_done(options: GateOptions) -> str:
    env = small.small_env()
    rewards = env.config.reward
    bonus = rewards.terminal_success
    names = ("timeout", "task_done")
    after, reward, terminated, truncated, info = step_episode_ends(names)
    terms = info["reward_terms"]
    for index, name in enumerate(names):
        other = sum(value[index] for term, value in terms.items() if term != "terminal_success")
        require(
            np.isclose(reward[index], other + terms["terminal_success"][index]),
            f"{name}: reward is not the sum of its terms",
        )
    require(truncated[0] and not terminated[0], "a timeout with work left must be truncated")
    require(
        after.dig_tiles_done[0] == 1 and 0 < info["episode_progress"][0] < 1,
        "the timeout step must make partial progress",
    )
    require(terms["terminal_success"][0] == 0, "a timeout with partial progress got the bonus")
    require(terminated[1] and not truncated[1], "finishing the task must terminate")
    require(np.isclose(terms["terminal_success"][1], bonus), "task completion lacks the bonus")
    progress = float(info["episode_progress"][0])

    # The batched path: every env of the small batch times out on this step.
    batch, params = small.small_batch(), small.small_params()
    _, state = small.make_batch_reset(batch)(jax.random.PRNGKey(3), params)
    state = state.replace(age=jnp.full((batch.num_envs,), env.config.max_steps - 1, jnp.int32))
    (_, _, _, terminated, truncated, info), _ = small.make_step_pair(batch)(
        jax.random.PRNGKey(0), state, jnp.full((batch.num_envs,), A.DO_NOTHING, jnp.int32), params
    )
    require(
        np.asarray(truncated).all() and not np.asarray(terminated).any(),
        "timeouts of a batch must be truncations",
    )
    require(
        (np.asarray(info["reward_terms"]["terminal_success"]) == 0).all(),
        "a batch timeout got the terminal bonus",
    )
    return (
        f"timeout with progress {progress:.2f}: no bonus; "
        f"task done on the last step: bonus {bonus:g}; {batch.num_envs} batch timeouts: none"
    )
