"""The pose distance (`terra_rl.features.pose_distance`): parity with the env's own base actions on
random walks over generated maps, tracked and wheeled (the distance after an action is the
distance at the state it leads to, blocked actions read far, the breadth-first search's
recurrence holds), hand-built maps with a known answer, and the policy input."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from envs import actions as A
from envs.config import EnvConfig
from terra_rl.config import get_preset
from terra_rl.features.dig_distance import dig_distance_features, work_in_reach
from terra_rl.features.policy_inputs import derived_features
from terra_rl.features.pose_distance import (
    NUM_FEATURES,
    max_distance,
    pose_distance_features,
    pose_distances,
)
from terra_rl.nets.models import ExcavationPolicy, PolicyConfig
from terra_rl.nets.parameters import count_parameters
from terra_rl.run.trainer import policy_config
from terra_rl.validation import small
from tests.hand_built_obs import SIZE, hand_built_obs

FAR = max_distance(SIZE)
WALK_STEPS = 48
WALK_MAPS = 8


@pytest.fixture(scope="module")
def walk(env16, params16):
    """Random walks with the env's valid base actions on 8 maps, tracked and wheeled: per
    step the distances [16, 5] before it, the valid base actions [16, 4], the action [16],
    the distances [16, 5] after it, whether work is in reach at the position [16], and the
    tracked walks' distances [8, 5] before it from the search over tracked states only."""
    agent_types = jnp.repeat(jnp.array([A.TRACKED, A.WHEELED]), WALK_MAPS)
    map_indices = jnp.tile(jnp.arange(WALK_MAPS), 2)
    keys = jax.random.split(jax.random.PRNGKey(3), 2 * WALK_MAPS)
    _, states = jax.jit(jax.vmap(env16.reset, in_axes=(0, None, 0, 0)))(
        keys, params16, agent_types, map_indices)
    observe = jax.vmap(env16.observation)

    def one_step(states, key):
        obs = observe(states)
        before = pose_distances(obs)
        valid = jax.vmap(env16.valid_actions)(states)[:, :A.CABIN_CLOCK]
        # A random valid base action; an env with none (boxed in) stays put.
        scores = jax.random.uniform(key, valid.shape) + valid
        action = jnp.argmax(scores, axis=-1).astype(jnp.int32)
        moved = jax.vmap(env16.step_no_reset, in_axes=(None, 0, 0, None))(
            key, states, action, params16)[1]
        moved = jax.tree.map(lambda new, old: jnp.where(
            jnp.any(valid, axis=-1).reshape(-1, *[1] * (new.ndim - 1)), new, old), moved, states)
        after = pose_distances(observe(moved))
        rows, cols = obs["agent_state"][:, 0], obs["agent_state"][:, 1]
        in_reach = work_in_reach(obs)[jnp.arange(rows.shape[0]), rows, cols]
        tracked = jax.tree.map(lambda x: x[:WALK_MAPS], obs)
        tracked_only = pose_distances(tracked, wheeled_agents=False)
        return moved, (before, valid, action, after, in_reach, tracked_only)

    run = jax.jit(lambda s, k: jax.lax.scan(one_step, s, jax.random.split(k, WALK_STEPS)))
    _, out = run(states, jax.random.PRNGKey(4))
    return [np.asarray(x).reshape(-1, *x.shape[2:]) for x in out]


def test_the_distance_after_an_action_is_the_distance_where_it_leads(walk):
    before, valid, action, after, *_ = walk
    took = valid[np.arange(len(action)), action]
    assert took.sum() > 500  # the walks do move
    predicted = before[np.arange(len(action)), 1 + action]
    np.testing.assert_array_equal(after[took, 0], predicted[took])


def test_blocked_actions_read_far_and_open_ones_stay_in_reach(walk):
    before, valid, *_ = walk
    assert np.all(before[:, 1:][~valid] == FAR)
    in_reach = (before[:, :1] < FAR) & valid
    assert np.all(before[:, 1:][in_reach] < FAR)  # every action has its inverse
    assert (~valid).sum() > 100 and in_reach.sum() > 1000


def test_distance_is_one_more_than_the_nearest_next_state(walk):
    before, _, _, _, in_reach, _ = walk
    own, nearest = before[:, 0], before[:, 1:].min(axis=-1)
    positive = (own > 0) & (own < FAR)
    assert positive.sum() > 200 and (own == 0).sum() > 50
    np.testing.assert_array_equal(own[positive], nearest[positive] + 1)
    np.testing.assert_array_equal(own == 0, in_reach)  # zero exactly where the arm reaches work


def test_without_wheeled_agents_the_search_covers_a_third_of_the_states(walk, env16, params16):
    """`wheeled_agents=False` (a run without wheeled excavators) searches the wheel-0 states
    only, one layer of the three, and gives the tracked walks the full search's distances."""
    before, *_, tracked_only = walk
    full = before.reshape(WALK_STEPS, 2 * WALK_MAPS, -1)[:, :WALK_MAPS].reshape(-1, 5)
    np.testing.assert_array_equal(tracked_only, full)
    assert len(np.unique(full)) > 5 and (full == FAR).any()  # near, far and blocked

    keys, types = jax.random.split(jax.random.PRNGKey(0), 2), jnp.array([A.TRACKED] * 2)
    obs = jax.eval_shape(jax.vmap(env16.reset, in_axes=(0, None, 0, 0)), keys, params16, types,
                         jnp.arange(2))[0]
    layers = {wheeled: _search_layers(
        functools.partial(pose_distances, wheeled_agents=wheeled), obs)
        for wheeled in (True, False)}
    assert layers == {True: 2 * EnvConfig().wheel_angle_limit + 1, False: 1}  # its geometry


def test_runs_without_wheeled_excavators_search_tracked_states_only():
    assert not policy_config(get_preset("cpu_demo")).wheeled_agents  # wheeled_fraction 0
    assert policy_config(get_preset("cpu_small_maps")).wheeled_agents  # half wheeled
    assert policy_config(dataclasses.replace(get_preset("cpu_demo"),
                                             wheeled_fraction=0.01)).wheeled_agents


def _search_layers(fn, obs) -> int:
    """The wheel layers of the breadth-first search's packed reach [B, layers, 12, N, words]
    carried by the while loop in `fn`'s jaxpr."""
    shapes = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "while":
                shapes.extend(v.aval.shape for v in eqn.outvars
                              if v.aval.dtype == jnp.uint32 and v.aval.ndim == 5)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jax.make_jaxpr(fn)(obs).jaxpr)
    assert len(shapes) == 1, shapes
    return shapes[0][1]


features_jit = jax.jit(pose_distance_features)


def _one_target(col, pos=(8, 4), heading=0, agent_type=A.TRACKED, obstacles=None):
    obs = hand_built_obs(pos=pos, heading=heading, target={(8, col): -1}, obstacles=obstacles)
    return {**{k: jnp.asarray(v) for k, v in obs.items()},
            "agent_type": jnp.asarray(agent_type, jnp.int32)}


@pytest.mark.parametrize("agent_type", [A.TRACKED, A.WHEELED])
def test_driving_towards_the_target_brings_it_closer(agent_type):
    """Open map, the agent at (8, 4) facing +column (heading 0), one target at (8, 15):
    FORWARD is one action closer, BACKWARD one farther; with the target behind, the reverse."""
    ahead = np.asarray(pose_distances(_one_target(15, agent_type=agent_type)))
    assert 0 < ahead[0] < FAR
    assert ahead[1 + A.FORWARD] == ahead[0] - 1 and ahead[1 + A.BACKWARD] == ahead[0] + 1
    behind = np.asarray(pose_distances(_one_target(15, heading=6, agent_type=agent_type)))
    assert behind[1 + A.BACKWARD] == behind[0] - 1 and behind[1 + A.FORWARD] == behind[0] + 1
    features = np.asarray(features_jit(_one_target(15, agent_type=agent_type)))
    assert features.shape == (NUM_FEATURES,) and features.dtype == np.float32
    assert features[0] == ahead[0] / FAR and features[1] == 1.0
    assert features[2 + 2 * 4 + A.FORWARD] == -1.0 and features[2 + 2 * 4 + A.BACKWARD] == 1.0


def test_a_wall_or_no_work_leaves_nothing_in_reach():
    wall = {(r, 10): 1 for r in range(SIZE)}
    walled = np.asarray(pose_distances(_one_target(15, obstacles=wall)))
    np.testing.assert_array_equal(walled, FAR)
    obs = _one_target(15)
    done = {**obs, "action_map": obs["action_map"].at[8, 15].set(-1)}  # the target is dug
    np.testing.assert_array_equal(np.asarray(pose_distances(done)), FAR)
    features = np.asarray(features_jit(done))
    assert features[0] == 1.0 and features[1] == 0.0 and np.all(features[2 + 2 * 4:] == 1.0)


def test_leading_batch_dims_give_the_per_observation_values():
    singles = [_one_target(col, agent_type=t) for col in (12, 14, 15) for t in (0, 1)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs).reshape(3, 2, *xs[0].shape), *singles)
    got = np.asarray(features_jit(stacked))
    assert got.shape == (3, 2, NUM_FEATURES)
    expected = np.stack([np.asarray(features_jit(o)) for o in singles]).reshape(3, 2, -1)
    np.testing.assert_array_equal(got, expected)


def test_policy_with_pose_distance_adds_only_its_mlp():
    obs = small.varied_observations()  # real reset observations of 4 envs
    params = {}
    for enabled in (False, True):
        model = ExcavationPolicy(PolicyConfig("flat", 32, 32, compass=True,
                                              pose_distance=enabled), A.NUM_ACTIONS)
        params[enabled] = jax.jit(model.init)(jax.random.PRNGKey(0), obs)
        logits, value = jax.jit(model.apply)(params[enabled], obs)
        assert logits.shape == (4, A.NUM_ACTIONS) and value.shape == (4,)
        assert np.isfinite(np.asarray(logits)).all() and np.isfinite(np.asarray(value)).all()
    encoders = {flag: params[flag]["params"]["encoder"] for flag in params}
    assert set(encoders[True]) - set(encoders[False]) == {"pose_distance_mlp"}
    assert encoders[True]["pose_distance_mlp"]["Dense_0"]["kernel"].shape[0] == NUM_FEATURES
    extra = count_parameters(params[True]) - count_parameters(params[False])
    assert extra == count_parameters(encoders[True]["pose_distance_mlp"]) + 64 * 32


def test_derived_features_share_one_goal_map_and_match_each_feature_alone():
    """`derived_features` computes `work_in_reach` once for both distances; each feature
    equals what it computes on its own, and a given goal map is the one used."""
    obs = {k: jnp.asarray(v) for k, v in small.varied_observations().items()}
    config = PolicyConfig("flat", 32, 32, dig_distance=True, pose_distance=True)
    shared = jax.jit(lambda o: derived_features(o, config))(obs)
    np.testing.assert_array_equal(shared["pose_distance"], features_jit(obs))
    np.testing.assert_array_equal(shared["dig_distance"], jax.jit(dig_distance_features)(obs))
    assert np.asarray(pose_distances(obs)).min() < FAR
    no_goals = jnp.zeros(obs["target_map"].shape, bool)
    np.testing.assert_array_equal(np.asarray(pose_distances(obs, no_goals)), FAR)
