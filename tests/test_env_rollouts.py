"""Properties over random rollouts of the mixed tracked/wheeled 16x16 batch: soil
conservation, the incremental progress counters against a recount from the maps, agents
never overlapping obstacles. (The analytic action mask against the real effect of every
action on these states is the env-action-mask validation gate.)"""

from __future__ import annotations

import numpy as np
import pytest
from footprints import footprint_is_free

from terra_rl.validation import small


@pytest.fixture(scope="session")
def random_states(batch16):
    """EnvState with a flat leading axis of the 1280 states (80 steps x 16 envs) the
    validation gates' random rollout visits (`terra_rl.validation.small.small_rollout`: DO
    favoured when empty, the load held for a while, so loaded agents, dug ground and dumped
    soil show up often, alongside blocked moves near obstacles and map edges)."""
    assert batch16 is small.small_batch()
    return small.small_rollout().flat_states()


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
