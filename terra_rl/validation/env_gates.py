"""Environment gates on the action mask and the dispatch of actions, on the env family's
16x16 shapes (`terra_rl.validation.small`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import ExcavationEnv
from envs import actions as A
from envs.state import AgentState, EnvState
from terra_rl.validation import small
from terra_rl.validation.gate import GateOptions, require

CENTRE = (8, 8)
REACHABLE_TILE = (8, 10)  # in the workspace of an agent at CENTRE facing +col, cabin 0
FAR_TILE = (2, 2)  # out of reach from CENTRE
UP = 3  # cabin heading that turns the arm to 90 degrees (up the rows)


def hand_built_state(
    env: ExcavationEnv,
    *,
    dig_tiles=(REACHABLE_TILE,),
    dug=(),
    loaded=0,
    cabin=0,
    wheel=0,
    agent_type=A.TRACKED,
    age=0,
) -> EnvState:
    """An open 16x16 map (no obstacles, everything dumpable) whose dig target is `dig_tiles`,
    `dug` of them already dug, with the agent at CENTRE facing +col."""
    size = env.config.map_size
    target = np.zeros((size, size), np.int8)
    action_map = np.zeros((size, size), np.int8)
    for tile in dig_tiles:
        target[tile] = -1
    for tile in dug:
        action_map[tile] = -1
    agent = AgentState(
        pos=jnp.asarray(CENTRE, jnp.int32),
        base_heading=0,
        cabin_heading=cabin,
        wheel_angle=wheel,
        loaded=loaded,
        agent_type=agent_type,
    )
    obstacles = np.zeros((size, size), np.int8)
    return env.make_state(
        target, obstacles, np.ones((size, size), np.int8), agent, action_map=action_map, age=age
    )


def stack(states):
    return jax.tree.map(lambda *x: jnp.stack(x), *states)


def trees_equal(a, b) -> bool:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True)
    )


# --------------------------------------------------------------------------- action mask


def check_mask_against_effects(env: ExcavationEnv, states: EnvState) -> str:
    """The analytic valid actions equal the real effect of all 7 acting actions on every
    state (DO_NOTHING: never an effect, masked everywhere or nowhere as `mask_do_nothing`
    says); the action mask keeps only valid actions and at least one of them; and the states
    exercise both outcomes of every non-trivial action for both agent types."""
    valid, masks, effects = map(np.asarray, small.make_mask_and_effect(env)(states))
    acting = slice(0, A.DO_NOTHING)
    mismatch = np.argwhere(valid[:, acting] != effects[:, acting])
    require(
        mismatch.size == 0,
        f"valid actions disagree with the effect at (state, action) {mismatch[:5].tolist()} "
        f"({len(mismatch)} in all)",
    )
    require(
        not (masks & ~valid).any() and masks.any(axis=1).all(),
        "the action mask allows an action without effect, or no action at all",
    )
    wait_allowed = not env.config.mask_do_nothing
    require(
        (masks[:, A.DO_NOTHING] == wait_allowed).all() and not effects[:, A.DO_NOTHING].any(),
        f"DO_NOTHING must be {'allowed' if wait_allowed else 'masked'} everywhere and change "
        "nothing",
    )
    loaded = np.asarray(states.agent.loaded) > 0
    wheeled = np.asarray(states.agent.agent_type) == A.WHEELED
    require(
        25 <= loaded.sum() < len(loaded) and 0.2 < wheeled.mean() < 0.8,
        f"states lack variety: {loaded.sum()} loaded, {wheeled.mean():.2f} wheeled",
    )
    for subset, kind in ((~wheeled, "tracked"), (wheeled, "wheeled")):
        for action in (A.FORWARD, A.BACKWARD, A.CLOCK, A.ANTICLOCK, A.DO):
            allowed = valid[subset, action].sum()
            require(
                0 < allowed < subset.sum(),
                f"{kind} action {action} is allowed in {allowed} of {subset.sum()} states; "
                "both outcomes must occur",
            )
    revisits = (valid & ~masks)[:, acting].any(axis=1).mean()
    return (
        f"{len(masks)} states x {A.DO_NOTHING} actions: valid == effect "
        f"({masks[:, acting].mean():.0%} allowed, {revisits:.0%} with a revisit masked, "
        f"{loaded.mean():.0%} loaded)"
    )


def synthetic_states(env: ExcavationEnv, seed: int, count: int) -> EnvState:
    """`count` random states built directly (numpy draws, one vmapped `make_state`): random
    obstacles, targets, dug and dumped tiles, dumpability, agent pose anywhere (edges
    included), cabin, wheel angle, load and type. The square of half-size 2 around the agent
    is cleared so its footprint is free."""
    rng = np.random.default_rng(seed)
    size, limit = env.config.map_size, env.config.wheel_angle_limit
    grid = (count, size, size)
    pos = rng.integers(1, size - 1, (count, 2))
    rows, cols = np.mgrid[0:size, 0:size]
    near = (np.abs(rows - pos[:, :1, None]) <= 2) & (np.abs(cols - pos[:, 1:, None]) <= 2)
    obstacles = (rng.random(grid) < 0.08) & ~near
    u_target, u_soil = rng.random(grid), rng.random(grid)
    target = np.where(obstacles, 0, np.where(u_target < 0.2, -1, np.where(u_target > 0.9, 1, 0)))
    soil = np.where((target != -1) & ~obstacles & (u_soil > 0.9), rng.integers(1, 4, grid), 0)
    action_map = np.where(near, 0, np.where((target == -1) & (u_soil < 0.3), -1, soil))
    dumpability = ~obstacles & (rng.random(grid) < 0.8)
    loaded = np.where(rng.random(count) < 0.4, rng.integers(1, 6, count), 0)
    agent = AgentState(
        pos=pos,
        base_heading=rng.integers(0, 12, count),
        cabin_heading=rng.integers(0, 12, count),
        wheel_angle=rng.integers(-limit, limit + 1, count),
        loaded=loaded,
        agent_type=rng.integers(0, 2, count),
    )
    agent = jax.tree.map(lambda x: np.asarray(x, np.int32), agent)
    maps = [np.asarray(x, np.int8) for x in (target, obstacles, dumpability, action_map)]
    build = jax.vmap(lambda t, o, d, m, a: env.make_state(t, o, d, a, action_map=m))
    return jax.jit(build)(*maps, agent)


def state_action_mask(options: GateOptions) -> str:
    env = small.small_env()
    count = small.ROLLOUT_STEPS * small.SMALL_NUM_ENVS  # the rollout's shape: one compile
    states = synthetic_states(env, seed=11, count=count)
    return check_mask_against_effects(env, states)


def env_action_mask(options: GateOptions) -> str:
    if options.dataset_path:
        batch = small.dataset_batch(options.dataset_path, options.dataset_size)
        rollout = small.random_rollout(
            batch, batch.params, jax.random.PRNGKey(small.ROLLOUT_SEED), small.ROLLOUT_STEPS
        )
        source = f"{batch.params.num_maps} maps of {options.dataset_path}"
    else:
        batch, rollout = small.small_batch(), small.small_rollout()
        source = f"{small.SMALL_NUM_MAPS} generated maps"
    detail = check_mask_against_effects(batch.env, rollout.flat_states())
    size = batch.env.config.map_size
    return f"{detail}; visited by random rollouts on {source} ({size}x{size})"


# --------------------------------------------------------------------------- dispatch

STATE_FIELDS = ("pos", "base_heading", "cabin_heading", "wheel_angle", "loaded")
# Per agent: (agent_type, wheel, loaded) and, per action, the fields it changes with their new
# values ("maps": the action map changes by a dig or a dump) and the reward terms it pays besides
# the step cost every action pays (a dig pays progress; the map has no dump zones, so a dump is
# neutral).
DISPATCH_AGENTS = {
    "tracked": (A.TRACKED, 0, 0),
    "wheeled": (A.WHEELED, 0, 0),
    "wheeled-wheel-1": (A.WHEELED, 1, 0),
    "tracked-loaded": (A.TRACKED, 0, 2),
}
DISPATCH_EXPECTED = {
    "tracked": [
        ({"pos": (8, 9)}, set()),
        ({"pos": (8, 7)}, set()),
        ({"base_heading": 11}, set()),
        ({"base_heading": 1}, set()),
        ({"cabin_heading": 11}, set()),
        ({"cabin_heading": 1}, set()),
        ({"maps": "dig", "loaded": 1}, {"progress"}),
        ({}, set()),
    ],
    "wheeled": [
        ({"pos": (8, 9)}, set()),
        ({"pos": (8, 7)}, set()),
        ({"wheel_angle": 1}, set()),
        ({"wheel_angle": -1}, set()),
        ({"cabin_heading": 11}, set()),
        ({"cabin_heading": 1}, set()),
        ({"maps": "dig", "loaded": 1}, {"progress"}),
        ({}, set()),
    ],
    "wheeled-wheel-1": [  # arcs: the heading follows the wheels; the wheel limit is 1
        ({"pos": (8, 9), "base_heading": 1}, set()),
        ({"pos": (8, 7), "base_heading": 11}, set()),
        ({}, set()),
        ({"wheel_angle": 0}, set()),
        ({"cabin_heading": 11}, set()),
        ({"cabin_heading": 1}, set()),
        ({"maps": "dig", "loaded": 1}, {"progress"}),
        ({}, set()),
    ],
    "tracked-loaded": [  # a loaded base cannot move or turn; DO dumps
        ({}, {"move_while_loaded"}),
        ({}, {"move_while_loaded"}),
        ({}, {"move_while_loaded"}),
        ({}, {"move_while_loaded"}),
        ({"cabin_heading": 11}, set()),
        ({"cabin_heading": 1}, set()),
        ({"maps": "dump", "loaded": 0}, set()),
        ({}, set()),
    ],
}


def state_step_dispatch(options: GateOptions) -> str:
    env = small.small_env()
    step = small.make_batched_step(env)
    cases, states = [], []
    for name, (agent_type, wheel, loaded) in DISPATCH_AGENTS.items():
        start = hand_built_state(env, agent_type=agent_type, wheel=wheel, loaded=loaded)
        for action in range(A.NUM_ACTIONS):
            cases.append((name, action))
            states.append(start)
    before = stack(states)
    actions = jnp.asarray([action for _, action in cases], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), len(cases))
    width = small.SMALL_NUM_ENVS  # calls of the batch's width share one compile
    outputs = [
        step(
            keys[i : i + width],
            jax.tree.map(lambda x, i=i: x[i : i + width], before),
            actions[i : i + width],
            small.small_params(),
        )
        for i in range(0, len(cases), width)
    ]
    after = jax.tree.map(lambda *x: np.concatenate(x), *[out[1] for out in outputs])
    terms = jax.tree.map(lambda *x: np.concatenate(x), *[out[5]["reward_terms"] for out in outputs])
    before = jax.tree.map(np.asarray, before)

    for index, (name, action) in enumerate(cases):
        changes, paid = DISPATCH_EXPECTED[name][action]
        agent_type = DISPATCH_AGENTS[name][0]
        names = A.WHEELED_ACTION_NAMES if agent_type == A.WHEELED else A.TRACKED_ACTION_NAMES
        where = f"{name} {names[action]}"
        for field in STATE_FIELDS:
            old = getattr(before.agent, field)[index]
            new = getattr(after.agent, field)[index]
            expected = np.asarray(changes.get(field, old))
            require(
                np.array_equal(new, expected), f"{where}: {field} is {new}, expected {expected}"
            )
        maps_changed = not np.array_equal(after.action_map[index], before.action_map[index])
        kind = changes.get("maps")
        require(maps_changed == (kind is not None), f"{where}: action map changed={maps_changed}")
        if kind == "dig":
            dug = np.argwhere(after.action_map[index] != before.action_map[index]).tolist()
            require(dug == [list(REACHABLE_TILE)], f"{where}: DO dug {dug}")
        if kind == "dump":
            dumped = after.action_map[index].sum()
            require(dumped == 2, f"{where}: DO dumped {dumped} of the 2 units")
        require(after.last_actions[index][0] == action, f"{where}: last_actions[0] is wrong")
        nonzero = {
            term for term, value in terms.items() if term != "step" and value[index] != 0
        }
        require(nonzero == paid, f"{where}: paid {sorted(nonzero)}, expected {sorted(paid)}")
        require(
            np.isclose(terms["step"][index], env.config.reward.step),
            f"{where}: step cost {terms['step'][index]}, expected {env.config.reward.step}",
        )
    return f"{len(DISPATCH_AGENTS)} agents x {A.NUM_ACTIONS} actions reach exactly their own effect"
