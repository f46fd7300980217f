"""Properties over random rollouts of the mixed tracked/wheeled 16x16 batch: the analytic
action mask against the real effect of every action, soil conservation, and the
incremental progress counters against a recount from the maps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from footprints import footprint_is_free

from envs import actions as A

ROLLOUT_STEPS = 80  # x 16 envs = 1280 states


@pytest.fixture(scope="session")
def random_states(batch16, params16):
    """EnvState with a flat leading axis of ROLLOUT_STEPS * num_envs visited states.

    The policy favours DO when empty (50%) and holds the load for a while (DO 10% when
    loaded), so that loaded agents, dug ground and dumped soil show up often, alongside
    blocked moves near obstacles and map edges.
    """

    def rollout(key):
        _, state = batch16.reset(key, params16)

        def body(state, key):
            key_action, key_do, key_step = jax.random.split(key, 3)
            uniform = jax.random.randint(key_action, (batch16.num_envs,), 0, A.NUM_ACTIONS)
            do_probability = jnp.where(state.agent.loaded > 0, 0.1, 0.5)
            do = jax.random.uniform(key_do, (batch16.num_envs,)) < do_probability
            actions = jnp.where(do, A.DO, uniform)
            _, next_state, *_ = batch16.step(key_step, state, actions, params16)
            return next_state, state

        _, states = jax.lax.scan(body, state, jax.random.split(key, ROLLOUT_STEPS))
        return states

    states = jax.jit(rollout)(jax.random.PRNGKey(7))
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), states)


def _changed(before, after) -> jax.Array:
    """bool: the step changed the agent or a map (age and last_actions aside)."""
    fields = lambda s: (s.agent.pos, s.agent.base_heading, s.agent.cabin_heading,  # noqa: E731
                        s.agent.wheel_angle, s.agent.loaded, s.action_map, s.dumpability)
    return jnp.any(jnp.stack([jnp.any(a != b) for a, b in zip(fields(before), fields(after),
                                                              strict=True)]))


def test_action_mask_matches_real_effect_on_1000_random_states(env16, random_states):
    def check(state):
        mask = env16.action_mask(state)

        def effect(action):
            _, after, *_ = env16.step_no_reset(None, state, action, None)
            return _changed(state, after)

        return mask, jax.vmap(effect)(jnp.arange(A.NUM_ACTIONS))

    masks, effects = jax.jit(jax.vmap(check))(random_states)
    masks, effects = np.asarray(masks), np.asarray(effects)
    assert masks.shape == (ROLLOUT_STEPS * 16, A.NUM_ACTIONS)
    acting = slice(0, A.DO_NOTHING)
    mismatch = np.argwhere(masks[:, acting] != effects[:, acting])
    assert mismatch.size == 0, f"mask disagrees with effect at (state, action) {mismatch[:5]}"
    assert masks[:, A.DO_NOTHING].all() and not effects[:, A.DO_NOTHING].any()
    # The states must exercise both outcomes of every non-trivial action.
    loaded = np.asarray(random_states.agent.loaded) > 0
    wheeled = np.asarray(random_states.agent.agent_type) == A.WHEELED
    assert 25 <= loaded.sum() < len(loaded) and 0.2 < wheeled.mean() < 0.8
    for action in (A.FORWARD, A.BACKWARD, A.CLOCK, A.ANTICLOCK, A.DO):
        assert 0 < masks[:, action].sum() < len(masks), A.TRACKED_ACTION_NAMES[action]
    for subset in (wheeled, ~wheeled):
        assert 0 < masks[subset, A.FORWARD].sum() < subset.sum()


def test_soil_is_conserved_and_counters_match_the_maps(random_states):
    action_map = np.asarray(random_states.action_map).astype(np.int64)
    target = np.asarray(random_states.target_map)
    loaded = np.asarray(random_states.agent.loaded)
    # Every unit dug or picked up is in the bucket or on the ground.
    np.testing.assert_array_equal(action_map.sum(axis=(1, 2)) + loaded, 0)
    dug_targets = ((target == -1) & (action_map < 0)).sum(axis=(1, 2))
    np.testing.assert_array_equal(np.asarray(random_states.dig_tiles_done), dug_targets)
    has_zones = (target == 1).any(axis=(1, 2))
    outside = np.where(target == 1, 0, np.maximum(action_map, 0)).sum(axis=(1, 2))
    np.testing.assert_array_equal(np.asarray(random_states.misplaced_soil),
                                  np.where(has_zones, outside, 0))
    assert action_map.min() >= -1 and action_map.max() <= 127
    assert dug_targets.max() > 0 and action_map.max() > 0  # digging and dumping happened


def test_agents_never_overlap_obstacles_or_leave_the_map(env16, random_states):
    cfg = env16.config
    for pos, heading, obstacles in zip(np.asarray(random_states.agent.pos),
                                       np.asarray(random_states.agent.base_heading),
                                       np.asarray(random_states.obstacles), strict=True):
        assert footprint_is_free(cfg.footprint_length, cfg.footprint_width, pos, heading,
                                 obstacles == 1)
