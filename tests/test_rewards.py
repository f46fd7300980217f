"""The reward cannot be farmed: potential-based progress and one step cost for every action.

Open-loop action sequences (pick-up/dump loops, dig and refill loops, turning in place, cabin
spins, forward/backward shuffles, random actions) run for `HORIZON` steps from the same start
states (a reset, a pose next to undug tiles, the same pose right after digging them) on
generated 16x16 and 32x32 foundations and trenches maps, for tracked and wheeled agents, with
episodes long enough that nothing times out. Their returns are compared with idling from the
same state, and with the task potential Phi = (dig tiles dug - soil outside dump zones) /
dig tiles, recounted from the maps here (independently of the env's counters).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from footprints import footprint_cells

from envs import AgentState, EnvConfig, ExcavationEnv, RewardConfig, params_from_maps
from envs import actions as A
from envs.maps import MAP_TYPES, MapSet, generate_maps
from envs.rewards import REWARD_TERM_NAMES
from terra_rl.validation.env_gates import synthetic_states

HORIZON = 200
MAX_STEPS = 10_000  # no timeout inside the horizon
MAPS_PER_TYPE = 2
MAP_SEED = 5
MAP_TYPES_TESTED = ("foundations", "trenches")
AGENT_TYPES = (A.TRACKED, A.WHEELED)
NO_DO_LOOPS = ("turn_in_place", "spin_base", "cabin_spin", "cabin_wiggle", "shuffle")
"""Loops without DO: they never change a map, so they make no progress from any state."""


def cycle(pattern) -> np.ndarray:
    return np.resize(np.asarray(pattern, np.int32), HORIZON)


def random_actions(seed: int, do_probability: float | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, A.NUM_ACTIONS, HORIZON)
    if do_probability is not None:
        actions = np.where(rng.random(HORIZON) < do_probability, A.DO, actions)
    return actions.astype(np.int32)


POLICIES = {
    "idle": cycle([A.DO_NOTHING]),
    "only_do": cycle([A.DO]),
    "dig_dump_back": cycle([A.DO, A.CABIN_ANTICLOCK, A.DO, A.CABIN_CLOCK]),
    "dig_dump_far": cycle(
        [A.DO, A.CABIN_ANTICLOCK, A.CABIN_ANTICLOCK, A.DO, A.CABIN_CLOCK, A.CABIN_CLOCK]
    ),
    "dig_all_around": cycle([A.DO, A.CABIN_CLOCK]),
    "turn_in_place": cycle([A.CLOCK, A.ANTICLOCK]),  # wheeled: WHEELS_LEFT / WHEELS_RIGHT
    "spin_base": cycle([A.CLOCK]),
    "cabin_spin": cycle([A.CABIN_CLOCK]),
    "cabin_wiggle": cycle([A.CABIN_CLOCK, A.CABIN_ANTICLOCK]),
    "shuffle": cycle([A.FORWARD, A.BACKWARD]),
    "finish": np.concatenate(
        [[A.DO, A.CABIN_ANTICLOCK, A.DO], cycle([A.DO_NOTHING])[3:]]
    ).astype(np.int32),
    **{f"random_{seed}": random_actions(seed) for seed in range(3)},
    **{f"random_do_{seed}": random_actions(10 + seed, do_probability=0.5) for seed in range(2)},
}
POLICY_NAMES = tuple(POLICIES)


def potential_numerator(state) -> jax.Array:
    """int32 []: dig tiles dug minus soil units outside dump zones (0 on maps without zones),
    recounted from the maps."""
    target, action = state.target_map, state.action_map.astype(jnp.int32)
    dug = jnp.sum((target == -1) & (action < 0), dtype=jnp.int32)
    outside = jnp.sum(jnp.where(target == 1, 0, jnp.maximum(action, 0)), dtype=jnp.int32)
    return dug - jnp.where(jnp.any(target == 1), outside, 0)


def make_rollout(env: ExcavationEnv):
    """Jitted `(states [B], actions int32 [B, T]) -> (initial numerator [B], outputs [B, T])`:
    `step_no_reset` under `lax.scan`; after the first done step the state is frozen and
    nothing more is counted (`live` False)."""

    def one(state, actions):
        def body(carry, action):
            state, finished = carry
            _, stepped, reward, terminated, truncated, info = env.step_no_reset(
                None, state, action, None
            )
            live = ~finished
            next_state = jax.tree.map(lambda new, old: jnp.where(live, new, old), stepped, state)
            changed = jnp.any(stepped.action_map != state.action_map) | (
                stepped.agent.loaded != state.agent.loaded
            )
            out = {
                "reward": jnp.where(live, reward, 0.0),
                "terms": {k: jnp.where(live, v, 0.0) for k, v in info["reward_terms"].items()},
                "live": live,
                "terminated": live & terminated,
                "truncated": live & truncated,
                "changed": live & changed,
                "numerator": potential_numerator(next_state),
            }
            return (next_state, finished | terminated | truncated), out

        _, out = jax.lax.scan(body, (state, jnp.zeros((), bool)), actions)
        return potential_numerator(state), out

    return jax.jit(jax.vmap(one))


# --------------------------------------------------------------------------- start states


def relative_workspace(config: EnvConfig, heading: int) -> tuple[np.ndarray, np.ndarray]:
    """(footprint offsets int [K, 2], workspace offsets int [L, 2]) of a base at the origin
    facing `heading` with the cabin straight (numpy reference geometry)."""
    reach = int(np.ceil(config.workspace_radii[1])) + 1
    rel_r, rel_c = np.mgrid[-reach : reach + 1, -reach : reach + 1]
    foot_r, foot_c = footprint_cells(config.footprint_length, config.footprint_width, (0, 0),
                                     heading)
    footprint = np.stack([foot_r, foot_c], axis=1)
    dist = np.hypot(rel_r, rel_c)
    diff = (np.degrees(np.arctan2(-rel_r, rel_c)) - 30 * heading + 180) % 360 - 180
    r_min, r_max = config.workspace_radii
    sector = (dist >= r_min) & (dist <= r_max) & (
        np.abs(diff) <= config.workspace_half_angle_deg + 1e-6
    )
    in_footprint = (np.abs(rel_r[..., None] - foot_r) + np.abs(rel_c[..., None] - foot_c) == 0)
    workspace = sector & ~in_footprint.any(-1)
    return footprint, np.stack([rel_r[workspace], rel_c[workspace]], axis=1)


def work_pose(config: EnvConfig, target, obstacles, dumpability) -> tuple[tuple[int, int], int]:
    """The base pose (pos, heading), off obstacles and dig tiles, whose straight arm reaches
    the most undug dig tiles, preferring poses that, once those are dug, still reach at least
    as many dumpable tiles (so the soil lands at most one unit a tile, and one DO picks it
    all up again)."""
    size = config.map_size
    best, best_score = None, (False, 0)
    for heading in range(12):
        footprint, workspace = relative_workspace(config, heading)
        for row in range(size):
            for col in range(size):
                cells = footprint + (row, col)
                if cells.min() < 0 or cells.max() >= size:
                    continue
                under = (cells[:, 0], cells[:, 1])
                if (obstacles[under] == 1).any() or (target[under] == -1).any():
                    continue
                tiles = workspace + (row, col)
                tiles = tiles[((tiles >= 0) & (tiles < size)).all(1)]
                tiles = tiles[obstacles[tiles[:, 0], tiles[:, 1]] == 0]
                is_dig = target[tiles[:, 0], tiles[:, 1]] == -1
                if not is_dig.any():
                    continue
                dig = tiles[is_dig]
                near_dig = (np.abs(tiles[:, None] - dig[None]).max(-1) <= 1).any(1)
                dumpable = (dumpability[tiles[:, 0], tiles[:, 1]] == 1) & ~is_dig & ~near_dig
                score = (bool(dumpable.sum() >= is_dig.sum()), int(is_dig.sum()))
                if score > best_score:
                    best, best_score = ((row, col), heading), score
    assert best is not None, "no pose reaches a dig tile"
    return best


def agent_at(pos, heading, agent_type, cabin=0, loaded=0) -> AgentState:
    return AgentState(pos=jnp.asarray(pos, jnp.int32), base_heading=heading,
                      cabin_heading=cabin, wheel_angle=0, loaded=loaded, agent_type=agent_type)


def tiny_task_state(env: ExcavationEnv, agent_type: int, with_zone: bool, age=0, loaded=0,
                    extra_dig_tile=False):
    """32x32, no obstacles: one dig tile (16, 19) in reach of an agent at (16, 16) facing
    +col; the tile (14, 19) is reached after one CABIN_ANTICLOCK and is the only dump zone
    (`with_zone`) or any dumpable tile (no zones). DO, CABIN_ANTICLOCK, DO finishes it.
    `loaded` with the cabin turned: the tile is dug and its soil is in the bucket."""
    size = env.config.map_size
    target = np.zeros((size, size), np.int8)
    target[16, 19] = -1
    if with_zone:
        target[14, 19] = 1
    if extra_dig_tile:
        target[2, 2] = -1  # out of reach: the task cannot finish in one step
    action_map = np.zeros((size, size), np.int8)
    if loaded:
        action_map[16, 19] = -1
    agent = agent_at((16, 16), 0, agent_type, cabin=1 if loaded else 0, loaded=loaded)
    return env.make_state(target, np.zeros_like(target), np.ones_like(target), agent,
                          action_map=action_map, age=age)


@dataclasses.dataclass
class Rollouts:
    """Every policy from every start state of one map size (numpy).

    starts: [S] (kind, map type name, agent type); reward, terms, live, terminated, changed:
    [S, P, T]; phi: float64 [S, P, T + 1] recounted potential (index 0 = start state).
    """

    env: ExcavationEnv
    starts: list
    reward: np.ndarray
    terms: dict
    live: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    changed: np.ndarray
    phi: np.ndarray

    def index(self, kind=None, map_type=None, agent_type=None) -> list[int]:
        return [i for i, (k, m, a) in enumerate(self.starts)
                if kind in (None, k) and map_type in (None, m) and agent_type in (None, a)]

    def returns(self) -> np.ndarray:
        """float64 [S, P]."""
        return self.reward.astype(np.float64).sum(-1)

    def idle_returns_over_live_steps(self) -> np.ndarray:
        """float64 [S, P]: idling's return from the same start over each rollout's live steps."""
        idle = self.reward[:, POLICY_NAMES.index("idle")].astype(np.float64)
        cumulative = np.concatenate([np.zeros((len(idle), 1)), np.cumsum(idle, -1)], -1)
        steps = self.live.sum(-1)
        return np.take_along_axis(cumulative, steps, axis=1)


def map_starts(env: ExcavationEnv, maps: MapSet):
    """Yields (map type name, agent type, reset state, work-pose state) for every map of
    `maps` and agent type: the env's reset (key PRNGKey(map index)), and the base at
    `work_pose` with the cabin straight."""
    reset = jax.jit(env.reset)
    for index in range(len(maps.map_type)):
        one_map = MapSet(*(np.asarray(x)[index : index + 1] for x in dataclasses.astuple(maps)))
        target, obstacles, dumpability = (x[0] for x in dataclasses.astuple(one_map)[:3])
        map_type = MAP_TYPES[int(maps.map_type[index])]
        pos, heading = work_pose(env.config, target, obstacles, dumpability)
        for agent_type in AGENT_TYPES:
            _, spawned = reset(jax.random.PRNGKey(index), params_from_maps(one_map), agent_type)
            work = env.make_state(target, obstacles, dumpability,
                                  agent_at(pos, heading, agent_type))
            yield map_type, agent_type, spawned, work


@functools.cache
def run_rollouts(map_size: int) -> Rollouts:
    env = ExcavationEnv(EnvConfig(map_size=map_size, max_steps=MAX_STEPS))
    config = env.config
    maps = generate_maps(MAP_TYPES_TESTED, map_size, MAPS_PER_TYPE * len(MAP_TYPES_TESTED),
                         MAP_SEED, config.spawn_clearance)
    step = jax.jit(env.step_no_reset)
    starts, states = [], []
    for map_type, agent_type, spawned, work in map_starts(env, maps):
        assert bool(env.action_mask(work)[A.DO]), "the work pose reaches no dig tile"
        _, dug, *_ = step(None, work, jnp.int32(A.DO), None)
        for kind, state in (("reset", spawned), ("work", work), ("dug", dug)):
            starts.append((kind, map_type, agent_type))
            states.append(state)
    if map_size == 32:
        for with_zone in (True, False):
            for agent_type in AGENT_TYPES:
                starts.append(("tiny_zone" if with_zone else "tiny_open", None, agent_type))
                states.append(tiny_task_state(env, agent_type, with_zone))

    num_starts, num_policies = len(states), len(POLICY_NAMES)
    batch = jax.tree.map(lambda *x: jnp.repeat(jnp.stack(x), num_policies, axis=0), *states)
    actions = jnp.asarray(np.tile(np.stack(list(POLICIES.values())), (num_starts, 1)))
    numerator0, out = jax.device_get(make_rollout(env)(batch, actions))
    shape = (num_starts, num_policies, HORIZON)
    out = jax.tree.map(lambda x: np.asarray(x).reshape(shape), out)
    totals = np.asarray([max(int((np.asarray(s.target_map) == -1).sum()), 1) for s in states])
    numerator = np.concatenate(
        [np.asarray(numerator0).reshape(num_starts, num_policies, 1), out["numerator"]], -1
    )
    return Rollouts(
        env=env, starts=starts, reward=out["reward"], terms=out["terms"], live=out["live"],
        terminated=out["terminated"], truncated=out["truncated"], changed=out["changed"],
        phi=numerator / totals[:, None, None].astype(np.float64),
    )


@pytest.fixture(scope="module", params=[16, 32], ids=["16x16", "32x32"])
def rollouts(request) -> Rollouts:
    return run_rollouts(request.param)


@pytest.fixture(scope="module")
def rollouts32() -> Rollouts:
    return run_rollouts(32)


def violations(mask, *arrays, starts, limit=5):
    """The first `limit` (start, policy, values...) where `mask` [S, P] is True."""
    return [(starts[s], POLICY_NAMES[p], *(float(x[s, p]) for x in arrays))
            for s, p in np.argwhere(mask)[:limit]]


# --------------------------------------------------------------------------- 1. loops


def test_idle_pays_exactly_the_step_cost_every_step(rollouts):
    rewards = rollouts.env.config.reward
    idle = POLICY_NAMES.index("idle")
    assert rollouts.live[:, idle].all() and not rollouts.terminated[:, idle].any()
    np.testing.assert_array_equal(rollouts.reward[:, idle], np.float32(rewards.step))
    np.testing.assert_allclose(rollouts.returns()[:, idle], HORIZON * rewards.step, rtol=1e-6)


def test_no_policy_beats_idle_by_more_than_its_progress(rollouts):
    """loop return <= idle return over the same steps + progress_weight * (Phi_T - Phi_0)
    (+ the terminal bonus if it finished), for every start state and policy."""
    rewards = rollouts.env.config.reward
    gain = rollouts.returns() - rollouts.idle_returns_over_live_steps()
    progress = rollouts.phi[..., -1] - rollouts.phi[..., 0]
    bonus = rewards.terminal_success * rollouts.terminated.any(-1)
    excess = gain - rewards.progress_weight * progress - bonus
    assert excess.max() <= 1e-5, violations(excess > 1e-5, gain, progress,
                                            starts=rollouts.starts)
    # The loops ran into walls, loads and empty DOs: wasted actions cost strictly more.
    assert (excess < -1e-4).sum() > excess.size // 4


@pytest.mark.parametrize("kind", ["work", "dug"])
def test_loops_without_net_progress_never_beat_idle(rollouts, kind):
    """From a pose next to work (before or after digging all it reaches): loops without DO,
    and from the dug state pressing only DO (a dump, then on maps with zones pick-ups and dumps
    of the misplaced soil), make no net progress
    and earn at most what idling earns."""
    loops = NO_DO_LOOPS + (("only_do",) if kind == "dug" else ())
    starts = rollouts.index(kind=kind)
    policies = [POLICY_NAMES.index(name) for name in loops]
    phi = rollouts.phi[np.ix_(starts, policies)]
    assert (phi[..., -1] <= phi[..., 0] + 1e-12).all()
    assert not rollouts.terminated[np.ix_(starts, policies)].any()
    gain = (rollouts.returns() - rollouts.idle_returns_over_live_steps())[np.ix_(starts, policies)]
    assert gain.max() <= 1e-6, gain.max()


@pytest.mark.parametrize("agent_type", AGENT_TYPES, ids=["tracked", "wheeled"])
def test_pressing_only_do_on_trenches_cannot_farm_pick_up_and_dump(rollouts, agent_type):
    """The old defect: on maps without dump zones every dumped unit paid and picking it up
    again was free, so pressing only DO earned about the terminal bonus per 100 steps. Now
    the load is dumped once and never picked up again (soil on a map without zones is never
    misplaced, `EnvConfig.pickup_misplaced_only`): every later DO is wasted and costs, so it
    earns less than idling, and nothing beyond the first dig's progress from a fresh pose."""
    rewards = rollouts.env.config.reward
    assert rollouts.env.config.pickup_misplaced_only
    only_do, idle = POLICY_NAMES.index("only_do"), POLICY_NAMES.index("idle")
    for start in rollouts.index(kind="dug", map_type="trenches", agent_type=agent_type):
        moves = rollouts.changed[start, only_do].sum()
        assert moves == 1, f"{rollouts.starts[start]}: soil moved {moves} times"
        gain = rollouts.returns()[start, only_do] - rollouts.returns()[start, idle]
        assert gain < 0, gain
    for start in rollouts.index(kind="work", map_type="trenches", agent_type=agent_type):
        first_dig = rollouts.phi[start, only_do, 1] - rollouts.phi[start, only_do, 0]
        assert first_dig > 0 and rollouts.phi[start, only_do, -1] == rollouts.phi[start, only_do, 1]
        gain = rollouts.returns()[start, only_do] - rollouts.returns()[start, idle]
        assert gain <= rewards.progress_weight * first_dig + 1e-6, (gain, first_dig)


# --------------------------------------------------------------------------- 2. telescoping


def test_progress_terms_telescope_to_the_potential(rollouts):
    """Per step the progress term is progress_weight * (Phi(s') - Phi(s)); over a rollout it
    sums to progress_weight * (Phi_T - Phi_0); every reward is the sum of its terms."""
    weight = rollouts.env.config.reward.progress_weight
    assert set(rollouts.terms) == set(REWARD_TERM_NAMES)
    progress = rollouts.terms["progress"].astype(np.float64)
    np.testing.assert_allclose(progress, weight * np.diff(rollouts.phi, axis=-1), atol=1e-6)
    np.testing.assert_allclose(
        progress.sum(-1), weight * (rollouts.phi[..., -1] - rollouts.phi[..., 0]), atol=1e-5
    )
    total = sum(value.astype(np.float64) for value in rollouts.terms.values())
    np.testing.assert_allclose(rollouts.reward, total, atol=1e-6)
    # Progress happened both ways: digging pays, and on foundations maps dumping off the
    # zones takes it back.
    for map_type in MAP_TYPES_TESTED:
        starts = rollouts.index(map_type=map_type)
        assert (progress[starts] > 0).any()
        random = [POLICY_NAMES.index(f"random_do_{seed}") for seed in range(2)]
        assert (progress[np.ix_(starts, random)] != 0).any()
    assert (progress[rollouts.index(map_type="foundations")] < 0).any()


def test_dense_return_is_bounded_on_reachable_states(rollouts):
    """From reset (and the states reached from it), 0 <= Phi <= 1 all along, so an episode's
    progress terms sum to at most progress_weight."""
    weight = rollouts.env.config.reward.progress_weight
    starts = rollouts.index(kind="reset") + rollouts.index(kind="work") + rollouts.index(kind="dug")
    phi = rollouts.phi[starts]
    assert phi.min() >= 0.0 and phi.max() <= 1.0
    assert rollouts.terms["progress"][starts].astype(np.float64).sum(-1).max() <= weight + 1e-6


# --------------------------------------------------------------------------- 3. finishing


def test_finishing_the_task_has_the_highest_return(rollouts32):
    """DO (dig), CABIN_ANTICLOCK, DO (dump) finishes the tiny task on step 3 and earns
    terminal + progress - 3 step costs. The best return from the same state is the fastest
    finish's (on the map without zones pressing DO twice finishes in 2 steps), and every
    policy that does not finish earns at least the terminal bonus less."""
    rollouts, rewards = rollouts32, rollouts32.env.config.reward
    finish = POLICY_NAMES.index("finish")
    completion = rewards.progress_weight + rewards.terminal_success
    returns = rollouts.returns()
    for start in rollouts.index(kind="tiny_zone") + rollouts.index(kind="tiny_open"):
        assert rollouts.live[start, finish].sum() == 3
        assert rollouts.terminated[start, finish, 2] and not rollouts.truncated[start].any()
        np.testing.assert_allclose(
            rollouts.terms["terminal_success"][start, finish],
            [0.0, 0.0, rewards.terminal_success] + [0.0] * (HORIZON - 3),
        )
        assert returns[start, finish] == pytest.approx(3 * rewards.step + completion, abs=1e-6)
        finished = rollouts.terminated[start].any(-1)
        fastest = rollouts.live[start, finished].sum(-1).min()
        assert returns[start].max() == pytest.approx(fastest * rewards.step + completion,
                                                     abs=1e-6)
        assert 2 <= fastest <= 3 and (fastest == 3) == (rollouts.starts[start][0] == "tiny_zone")
        assert (~finished).sum() >= 1 + len(NO_DO_LOOPS)  # idle and the loops without DO
        best_unfinished = returns[start, ~finished].max()
        assert returns[start, finish] >= best_unfinished + rewards.terminal_success - 1e-6


def test_terminal_bonus_only_on_termination_never_on_timeout(env32, step32):
    """On the last allowed step: completing the task terminates and pays the bonus; digging
    a tile of an unfinished task or idling is a truncation that pays no bonus."""
    rewards = env32.config.reward
    last = env32.config.max_steps - 1
    done_state = tiny_task_state(env32, A.TRACKED, with_zone=True, age=last, loaded=1)
    _, _, reward, terminated, truncated, info = step32(None, done_state, jnp.int32(A.DO), None)
    assert bool(terminated) and not bool(truncated)
    assert float(info["reward_terms"]["terminal_success"]) == rewards.terminal_success
    assert float(reward) == pytest.approx(rewards.step + rewards.terminal_success, abs=1e-6)

    unfinished = tiny_task_state(env32, A.TRACKED, with_zone=False, age=last, extra_dig_tile=True)
    _, _, reward, terminated, truncated, info = step32(None, unfinished, jnp.int32(A.DO), None)
    assert bool(truncated) and not bool(terminated)
    assert float(info["reward_terms"]["terminal_success"]) == 0.0
    assert float(info["reward_terms"]["progress"]) == pytest.approx(rewards.progress_weight / 2)
    assert float(reward) == pytest.approx(rewards.step + rewards.progress_weight / 2, abs=1e-6)

    _, _, reward, terminated, truncated, info = step32(
        None, unfinished, jnp.int32(A.DO_NOTHING), None
    )
    assert bool(truncated) and not bool(terminated)
    assert float(reward) == np.float32(rewards.step)

    # The finishing sequence started two steps before the timeout ends truncated, unpaid.
    state = tiny_task_state(env32, A.TRACKED, with_zone=True, age=last - 1)
    total = 0.0
    for action in (A.DO, A.CABIN_ANTICLOCK):
        _, state, reward, terminated, truncated, info = step32(None, state, jnp.int32(action),
                                                               None)
        total += float(reward)
        assert not bool(terminated)
        assert float(info["reward_terms"]["terminal_success"]) == 0.0
    assert bool(truncated)
    assert total == pytest.approx(2 * rewards.step + rewards.progress_weight, abs=1e-6)


# --------------------------------------------------------------------------- 4. step cost


@pytest.fixture(scope="module")
def every_action_outcome():
    """(config, states [S], valid bool [S, 8], reward [S, 8], terms {name: [S, 8]},
    numerator before [S], numerator after [S, 8], totals [S]) for every action from 256
    random states (loaded, wheeled, near obstacles and map edges). `valid`: the actions
    that change the state (`ExcavationEnv.valid_actions`; the action mask may forbid more)."""
    env = run_rollouts(16).env
    states = synthetic_states(env, seed=3, count=256)

    def outcomes(state):
        def one(action):
            _, after, reward, terminated, _, info = env.step_no_reset(None, state, action, None)
            return reward, terminated, info["reward_terms"], potential_numerator(after)

        return (env.valid_actions(state), potential_numerator(state),
                jax.vmap(one)(jnp.arange(A.NUM_ACTIONS)))

    mask, before, (reward, terminated, terms, after) = jax.device_get(
        jax.jit(jax.vmap(outcomes))(states)
    )
    totals = np.maximum((np.asarray(states.target_map) == -1).sum((1, 2)), 1)
    return env.config.reward, states, mask, reward, terminated, terms, before, after, totals


def test_do_nothing_is_priced_like_a_move_and_never_cheaper(every_action_outcome):
    rewards, states, mask, reward, terminated, terms, before, after, totals = every_action_outcome
    assert not terminated.any()
    step = np.float32(rewards.step)
    np.testing.assert_array_equal(reward[:, A.DO_NOTHING], step)
    # Progress is the recounted potential's change; without it (and no bonus is paid here)
    # what is left is the action's cost, never less than DO_NOTHING's.
    progress = rewards.progress_weight * (after - before[:, None]) / totals[:, None]
    np.testing.assert_allclose(terms["progress"], progress, atol=1e-6)
    cost = reward - terms["progress"]
    assert (cost <= reward[:, [A.DO_NOTHING]] + 1e-7).all()
    # Every move, base or wheel turn and cabin turn that does something costs the step cost,
    # exactly what DO_NOTHING costs; a rejected move or base turn costs the step cost plus
    # the collision or move_while_loaded penalty.
    loaded = np.asarray(states.agent.loaded) > 0
    wheeled = np.asarray(states.agent.agent_type) == A.WHEELED
    rejections = []
    for action in range(A.DO):
        allowed = mask[:, action]
        assert allowed.any()
        np.testing.assert_array_equal(reward[allowed, action], step)
        if action in (A.CABIN_CLOCK, A.CABIN_ANTICLOCK):
            assert allowed.all()
            continue
        is_base_action = ~wheeled if action in (A.CLOCK, A.ANTICLOCK) else np.ones_like(wheeled)
        rejected = ~allowed & is_base_action
        rejections.append(rejected)
        expected = step + np.where(loaded, rewards.move_while_loaded, rewards.collision)
        np.testing.assert_allclose(reward[rejected, action], expected[rejected], atol=1e-7)
    rejected = np.any(rejections, axis=0)
    assert (rejected & loaded).any() and (rejected & ~loaded).any()
    # Wheels already at their limit change nothing and cost only the step cost.
    at_limit = wheeled[:, None] & ~mask[:, [A.WHEELS_LEFT, A.WHEELS_RIGHT]]
    assert at_limit.any()
    np.testing.assert_array_equal(reward[:, [A.WHEELS_LEFT, A.WHEELS_RIGHT]][at_limit], step)
    # A DO that does something pays its progress (and the step cost); one that does nothing
    # pays the step cost and do_no_effect.
    do = mask[:, A.DO]
    assert do.any() and (~do).any()
    np.testing.assert_allclose(cost[do, A.DO], step, atol=1e-7)
    np.testing.assert_allclose(reward[~do, A.DO], step + rewards.do_no_effect, atol=1e-7)


def test_reward_config_refuses_to_pay_for_wasted_actions():
    for name in ("step", "collision", "move_while_loaded", "do_no_effect"):
        with pytest.raises(ValueError, match=name):
            RewardConfig(**{name: 0.001})
    with pytest.raises(ValueError):
        RewardConfig(progress_weight=-1.0)
    sparse = RewardConfig.sparse()
    assert sparse.step < 0 and sparse.terminal_success > 0
    assert sparse.progress_weight == sparse.collision == sparse.move_while_loaded == 0.0
    assert sparse.do_no_effect == 0.0
