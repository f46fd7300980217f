"""The progress shaping is potential-based under the run's discount: no loop can farm it.

The env pays `progress_weight * (gamma * Phi(s') - Phi(s))` with `RewardConfig.discount`
(the trainer's gamma). Rollouts of open-loop action sequences (`test_rewards.POLICIES`: pick-up
and dump loops, cabin spins, shuffles, random actions) run from a reset, a work pose, the
same pose after a dig, and after a dig and a dump, on every map type at 16x16 and 32x32,
tracked and wheeled. Every stretch of a rollout that ends at the task potential it started
from (a cycle) is compared, in discounted return, with idling for as many steps from the
same state; the potential is recounted from the maps (`test_rewards.potential_numerator`).
The undiscounted form of the shaping is farmed by the same search under gamma 0.99.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_rewards import POLICIES, POLICY_NAMES, make_rollout, map_starts

from envs import EnvConfig, ExcavationEnv, RewardConfig
from envs import actions as A
from envs.maps import MAP_TYPES, generate_maps
from terra_rl.adapters.train_env import reward_config
from terra_rl.config import PRESETS, TrainConfig, get_preset

HORIZON = 128
MAX_STEPS = 10_000  # no timeout inside the horizon
MAP_SEED = 11
# 0.99, every preset's gamma and the class default's.
GAMMAS = tuple(sorted({0.99, TrainConfig().gamma, *(p.gamma for p in PRESETS.values())}))
AGENT_TYPES = (A.TRACKED, A.WHEELED)
TOLERANCE = 1e-5


@dataclasses.dataclass
class Rollouts:
    """reward float64 [S, P, T]; costs float64 [S, P, T] (every term but progress and the
    terminal bonus); live bool [S, P, T]; phi float64 [S, P, T + 1] (index 0: the start)."""

    env: ExcavationEnv
    starts: list
    reward: np.ndarray
    progress: np.ndarray
    costs: np.ndarray
    terminal: np.ndarray
    live: np.ndarray
    phi: np.ndarray


@functools.cache
def run_rollouts(map_size: int, discount: float) -> Rollouts:
    env = ExcavationEnv(EnvConfig(map_size=map_size, max_steps=MAX_STEPS,
                                  reward=RewardConfig(discount=discount)))
    maps = generate_maps(MAP_TYPES, map_size, len(MAP_TYPES), MAP_SEED,
                         env.config.spawn_clearance)
    step = jax.jit(env.step_no_reset)
    starts, states = [], []
    for map_type, agent_type, spawned, work in map_starts(env, maps):
        _, dug, *_ = step(None, work, jnp.int32(A.DO), None)
        _, turned, *_ = step(None, dug, jnp.int32(A.CABIN_ANTICLOCK), None)
        _, dumped, *_ = step(None, turned, jnp.int32(A.DO), None)
        for kind, state in (("reset", spawned), ("work", work), ("dug", dug),
                            ("dumped", dumped)):
            starts.append((kind, map_type, agent_type))
            states.append(state)

    num_starts, num_policies = len(states), len(POLICY_NAMES)
    actions = np.stack([policy[:HORIZON] for policy in POLICIES.values()])
    batch = jax.tree.map(lambda *x: jnp.repeat(jnp.stack(x), num_policies, axis=0), *states)
    tiled = jnp.asarray(np.tile(actions, (num_starts, 1)))
    numerator0, out = jax.device_get(make_rollout(env)(batch, tiled))
    shape = (num_starts, num_policies, HORIZON)
    out = jax.tree.map(lambda x: np.asarray(x).reshape(shape), out)
    terms = {name: value.astype(np.float64) for name, value in out["terms"].items()}
    totals = np.asarray([max(int((np.asarray(s.target_map) == -1).sum()), 1) for s in states])
    numerator = np.concatenate(
        [np.asarray(numerator0).reshape(num_starts, num_policies, 1), out["numerator"]], -1)
    return Rollouts(
        env=env, starts=starts, reward=out["reward"].astype(np.float64),
        progress=terms["progress"], terminal=terms["terminal_success"],
        costs=sum(v for k, v in terms.items() if k not in ("progress", "terminal_success")),
        live=out["live"], phi=numerator / totals[:, None, None].astype(np.float64),
    )


def cycle_excess(rollouts: Rollouts, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(excess float64 [K], where int64 [K, 4]): for every stretch [t1, t2) of a live
    rollout with Phi(s_t1) == Phi(s_t2), its discounted return from t1 minus idling's from
    s_t1 over as many steps under the env's own reward: idling pays `step + progress_weight *
    (discount - 1) * Phi(s_t1)` a step, with the reward's `discount` (`gamma` itself for the
    shaping the trainer pays, where its sum is `step * sum(gamma**j) + w * (gamma**k - 1) *
    Phi`). `where` holds each stretch's (start, policy, t1, t2) indices (`describe`). The
    step that completes the task ends the episode, so no cycle runs through it: stretches
    end before it."""
    reward_config = rollouts.env.config.reward
    excess, where = [], []
    num_starts, num_policies, horizon = rollouts.reward.shape
    powers = gamma ** np.arange(horizon + 1)
    for s in range(num_starts):
        for p in range(num_policies):
            live = int((rollouts.live[s, p] & (rollouts.terminal[s, p] == 0)).sum())
            phi = rollouts.phi[s, p, : live + 1]
            discounted = np.concatenate([[0.0], np.cumsum(powers[:live] * rollouts.reward[s, p,
                                                                                      :live])])
            # [t1, t2]: Phi(s_t2) close to Phi(s_t1), the tolerance scaled by the latter.
            same = np.isclose(phi[None, :], phi[:, None], atol=1e-9)
            t1, t2 = np.nonzero(np.triu(same, k=1))  # by t1, then t2
            k = t2 - t1
            gain = (discounted[t2] - discounted[t1]) / powers[t1]
            idle_step = (reward_config.step + reward_config.progress_weight
                         * (reward_config.discount - 1) * phi[t1])
            excess.append(gain - idle_step * (1 - powers[k]) / (1 - gamma))
            where.append(np.stack([np.full_like(t1, s), np.full_like(t1, p), t1, t2], axis=1))
    return np.concatenate(excess), np.concatenate(where)


def describe(rollouts: Rollouts, row: np.ndarray) -> tuple:
    """((kind, map type, agent type), policy name, t1, t2) of a `cycle_excess` `where` row."""
    s, p, t1, t2 = (int(i) for i in row)
    return rollouts.starts[s], POLICY_NAMES[p], t1, t2


def start_map_types(rollouts: Rollouts, where: np.ndarray) -> np.ndarray:
    """str [K]: the map type of each `where` row's start."""
    return np.asarray([map_type for _, map_type, _ in rollouts.starts])[where[:, 0]]


def test_every_gamma_tested_is_a_presets_or_099():
    assert 0.99 in GAMMAS and get_preset("solo_excavator").gamma in GAMMAS


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("map_size", [16, 32])
def test_no_cycle_earns_more_discounted_return_than_idling(map_size, gamma):
    rollouts = run_rollouts(map_size, gamma)
    excess, where = cycle_excess(rollouts, gamma)
    # The search finds cycles that move soil: pick-ups and dumps, not only base moves.
    moved = np.isin(start_map_types(rollouts, where), ("foundations", "tiny_foundations"))
    assert len(excess) > 1000 and moved.any()
    worst = np.argsort(excess)[-3:]
    assert excess.max() <= TOLERANCE, [(describe(rollouts, where[i]), float(excess[i]))
                                       for i in worst]


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("map_size", [16, 32])
def test_shaped_return_telescopes_to_the_discounted_potential(map_size, gamma):
    """Per step progress = w * (gamma * Phi(s') - Phi(s)); the discounted return over a
    rollout of T live steps is w * (gamma**T * Phi_T - Phi_0) + the discounted costs and
    terminal bonus; the reward is the sum of its terms."""
    rollouts = run_rollouts(map_size, gamma)
    weight = rollouts.env.config.reward.progress_weight
    live = rollouts.live
    phi = rollouts.phi
    expected_progress = np.where(live, weight * (gamma * phi[..., 1:] - phi[..., :-1]), 0.0)
    np.testing.assert_allclose(rollouts.progress, expected_progress, atol=1e-6)
    np.testing.assert_allclose(
        rollouts.reward, rollouts.progress + rollouts.costs + rollouts.terminal, atol=1e-6)
    powers = gamma ** np.arange(rollouts.reward.shape[-1])
    steps = live.sum(-1)
    final_phi = np.take_along_axis(phi, steps[..., None], axis=-1)[..., 0]
    discounted = (powers * rollouts.reward).sum(-1)
    telescoped = (weight * (gamma ** steps * final_phi - phi[..., 0])
                  + (powers * (rollouts.costs + rollouts.terminal)).sum(-1))
    np.testing.assert_allclose(discounted, telescoped, atol=1e-4)
    assert (rollouts.progress != 0).any() and (rollouts.terminal > 0).any()


def test_the_undiscounted_shaping_is_farmed_under_gamma_099():
    """The search can fail: the shaping of runs before the change (discount 1) pays a cycle
    of a pick-up of misplaced soil and its dump elsewhere more than idling under 0.99."""
    rollouts = run_rollouts(16, 1.0)
    excess, where = cycle_excess(rollouts, 0.99)
    assert excess.max() > 1e-3
    farmed = set(start_map_types(rollouts, where)[excess > 1e-3])
    assert farmed <= {"foundations", "tiny_foundations"}, farmed  # only maps with zones


def test_the_trainer_pays_the_shaping_under_the_runs_gamma():
    config = get_preset("cpu_demo")
    assert config.discounted_shaping
    assert reward_config(config).discount == config.gamma == 0.99
    legacy = dataclasses.replace(config, discounted_shaping=False)
    assert reward_config(legacy).discount == 1.0
    sparse = dataclasses.replace(config, reward="sparse")
    assert reward_config(sparse).discount == 0.99 and reward_config(sparse).progress_weight == 0


def test_runs_saved_before_discounting_resume_with_the_undiscounted_shaping():
    from terra_rl.config import config_from_dict

    saved = get_preset("cpu_demo").to_dict()
    del saved["discounted_shaping"]
    assert not config_from_dict(saved).discounted_shaping
    with pytest.raises(ValueError, match="discount"):
        RewardConfig(discount=0.0)
