"""The dig-distance field (`terra_rl.features.dig_distance`): parity with a plain breadth-first
search, blocked tiles, detours, the last stage (soil outside the dump zones, carried to a free
zone tile), the features seen from the base heading, and the policy input."""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.features.dig_distance import (
    NUM_FEATURES,
    dig_distance_features,
    dig_distance_field,
    direction_offsets,
    feature_tiles,
    field_at,
    unreachable_distance,
    work_in_reach,
)
from terra_rl.nets.models import ExcavationPolicy, PolicyConfig
from terra_rl.nets.parameters import count_parameters
from terra_rl.validation import small

N = 16
FAR = unreachable_distance(N)
field_jit = jax.jit(dig_distance_field)
features_jit = jax.jit(dig_distance_features)


def reference_field(target, action, obstacles, inner=1.5, outer=3.0):
    """Multi-source BFS in plain Python: 8-connected steps over free tiles from every free
    tile with an undug target at a distance in [inner, outer]."""
    free = (obstacles == 0) & (action == 0)
    undug = (target == -1) & (action == 0)
    dist = np.full((N, N), FAR, np.int64)
    queue = collections.deque()
    for r in range(N):
        for c in range(N):
            near = any(
                undug[r2, c2] and inner <= math.hypot(r2 - r, c2 - c) <= outer
                for r2 in range(N) for c2 in range(N)
            )
            if free[r, c] and near:
                dist[r, c] = 0
                queue.append((r, c))
    while queue:
        r, c = queue.popleft()
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                r2, c2 = r + dr, c + dc
                if 0 <= r2 < N and 0 <= c2 < N and free[r2, c2] and dist[r2, c2] > dist[r, c] + 1:
                    dist[r2, c2] = dist[r, c] + 1
                    queue.append((r2, c2))
    return np.minimum(dist, FAR)


def make_obs(target, action=None, obstacles=None, agent=(8, 8, 0), dumpability=None):
    zeros = np.zeros((N, N), np.int8)
    return {
        "target_map": jnp.asarray(target, jnp.int8),
        "action_map": jnp.asarray(zeros if action is None else action, jnp.int8),
        "obstacles": jnp.asarray(zeros if obstacles is None else obstacles, jnp.int8),
        "dumpability": jnp.asarray(zeros + 1 if dumpability is None else dumpability, jnp.int8),
        "agent_state": jnp.asarray([agent[0], agent[1], agent[2], 0, 0, 0], jnp.int32),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_field_equals_a_breadth_first_search_on_random_maps(seed):
    rng = np.random.default_rng(seed)
    target = np.where(rng.random((N, N)) < 0.04, -1, 0).astype(np.int8)
    obstacles = (rng.random((N, N)) < 0.2).astype(np.int8)
    action = np.zeros((N, N), np.int8)
    action[rng.random((N, N)) < 0.05] = -1  # dug tiles: blocked, and no longer targets
    action[rng.random((N, N)) < 0.05] = 2  # dumped soil: blocked
    expected = reference_field(target, action, obstacles)
    got = np.asarray(field_jit(make_obs(target, action, obstacles)))
    assert got.dtype == np.int32 and got.shape == (N, N)
    np.testing.assert_array_equal(got, expected)
    assert (expected == 0).any() and ((expected > 0) & (expected < FAR)).any()


@pytest.mark.parametrize("size", [16, 32, 64])
def test_the_packed_search_gives_the_field_at_its_query_tiles(size):
    """`field_at` (the features' path: a packed search that stops early) equals the field
    gathered at the same tiles: random maps [2, 3] of several densities, at sizes of one
    word a row (16, 32) and of two (64); queries on blocked tiles, off the map (far) and
    around the agent."""
    rng = np.random.default_rng(size)
    shape = (2, 3, size, size)
    density = rng.uniform(0.05, 0.45, (2, 3, 1, 1))
    target = np.where(rng.random(shape) < 8 / size**2, -1, 0).astype(np.int8)
    target[..., : size // 4, : size // 4] = np.where(rng.random((2, 3, size // 4, size // 4))
                                                     < 0.3, 1, target[..., : size // 4,
                                                                      : size // 4])
    obstacles = (rng.random(shape) < density).astype(np.int8)
    action = np.zeros(shape, np.int8)
    action[rng.random(shape) < 0.05] = -1
    action[rng.random(shape) < 0.05] = 2
    agent = np.zeros((2, 3, 6), np.int32)
    agent[..., :2] = rng.integers(0, size, (2, 3, 2))
    agent[..., 2] = rng.integers(0, 12, (2, 3))
    obs = {"target_map": jnp.asarray(target), "action_map": jnp.asarray(action),
           "obstacles": jnp.asarray(obstacles),
           "dumpability": jnp.ones(shape, jnp.int8), "agent_state": jnp.asarray(agent)}
    rows = rng.integers(-2, size + 2, (2, 3, 40)).astype(np.int32)
    cols = rng.integers(-2, size + 2, (2, 3, 40)).astype(np.int32)
    near_rows, near_cols = feature_tiles(obs["agent_state"])
    rows = jnp.concatenate([jnp.asarray(rows), near_rows], axis=-1)
    cols = jnp.concatenate([jnp.asarray(cols), near_cols], axis=-1)

    got = np.asarray(jax.jit(field_at)(obs, rows, cols))
    field = np.asarray(jax.jit(dig_distance_field)(obs))
    far = unreachable_distance(size)
    r, c = np.asarray(rows), np.asarray(cols)
    on_map = (r >= 0) & (r < size) & (c >= 0) & (c < size)
    gathered = np.take_along_axis(field.reshape(2, 3, -1),
                                  np.clip(r, 0, size - 1) * size + np.clip(c, 0, size - 1),
                                  axis=-1)
    expected = np.where(on_map, gathered, far)
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.int32
    # The maps are varied enough for the test to mean something.
    assert {0, far} <= set(expected.ravel().tolist())
    assert np.any((expected > 1) & (expected < far))


@pytest.mark.parametrize("size", [16, 32, 64])
def test_the_packed_ring_cover_equals_a_plain_one(size):
    """`work_in_reach` dilates the work tiles by the arm's ring on packed maps: the same
    positions as ORing the plain shifted maps, one per ring offset, near the edges too."""
    from terra_rl.features.dig_distance import _ring_cover, ring_offsets

    tiles = np.random.default_rng(size).random((3, size, size)) < 0.02
    tiles[0, 0, 0] = tiles[0, -1, -1] = tiles[1, 0, -1] = True
    expected = np.zeros_like(tiles)
    for dr, dc in ring_offsets(size):  # position (r, c) covers the tile (r + dr, c + dc)
        rows = slice(max(-dr, 0), size - max(dr, 0))
        cols = slice(max(-dc, 0), size - max(dc, 0))
        expected[:, rows, cols] |= tiles[:, max(dr, 0):size + min(dr, 0),
                                         max(dc, 0):size + min(dc, 0)]
    got = np.asarray(jax.jit(_ring_cover)(jnp.asarray(tiles)))
    assert got.dtype == bool and got.shape == tiles.shape
    assert (got == expected).all() and expected.any() and not expected.all()


def test_a_wall_forces_a_detour_and_blocked_tiles_are_far():
    target = np.zeros((N, N), np.int8)
    target[8, 14] = -1
    obstacles = np.zeros((N, N), np.int8)
    obstacles[1:, 6] = 1  # a wall with its only gap at row 0
    field = np.asarray(field_jit(make_obs(target, obstacles=obstacles)))
    open_field = np.asarray(field_jit(make_obs(target)))
    assert open_field[8, 2] == 9  # straight along row 8 to column 11 (3 tiles from 14)
    assert field[8, 2] > open_field[8, 2]
    assert field[8, 2] == reference_field(target, np.zeros_like(target), obstacles)[8, 2]
    assert (field[obstacles == 1] == FAR).all()


def test_without_undug_targets_nothing_is_reachable():
    target = np.zeros((N, N), np.int8)
    target[3, 3] = -1
    action = np.zeros((N, N), np.int8)
    action[3, 3] = -1  # the only target is dug already
    field = np.asarray(field_jit(make_obs(target, action)))
    assert (field == FAR).all()
    features = np.asarray(features_jit(make_obs(target, action)))
    assert features.shape == (NUM_FEATURES,)
    assert features[0] == 1.0 and features[1] == 0.0  # far, not reachable


def _dug_trench_with_soil(zone: bool, soil_in_zone: bool = False):
    """A map whose only target (3, 3) is dug, with soil at (12, 12) and, if `zone`, a dump
    zone at rows 0-1 (the soil in it if `soil_in_zone`)."""
    target = np.zeros((N, N), np.int8)
    target[3, 3] = -1
    action = np.zeros((N, N), np.int8)
    action[3, 3] = -1
    if zone:
        target[:2, :] = 1
    soil = (0, 12) if soil_in_zone else (12, 12)
    action[soil] = 1
    return target, action, soil


def test_after_the_last_dig_the_field_leads_to_soil_outside_the_zones():
    target, action, soil = _dug_trench_with_soil(zone=True)
    field = np.asarray(field_jit(make_obs(target, action)))
    # The plain search with the soil's tile as the only target (soil of height 1 is free).
    soil_as_target = np.zeros((N, N), np.int8)
    soil_as_target[soil] = -1
    expected = reference_field(soil_as_target, np.minimum(action, 0), np.zeros((N, N), np.int8))
    np.testing.assert_array_equal(field, expected)
    assert field[12, 9] == 0 and 0 < field[8, 8] < FAR


def _covers(position, tiles, inner=1.5, outer=3.0):
    """Whether the arm's ring around `position` covers one of `tiles` [(row, col)]."""
    return any(inner <= math.hypot(r - position[0], c - position[1]) <= outer for r, c in tiles)


def test_in_the_last_stage_the_field_leads_to_poses_that_reach_soil_and_a_free_zone_tile():
    # Soil at (4, 8), two rows below the zone (rows 0-1): some tiles reach both. A loaded base
    # cannot move, so only from those can the soil be carried into the zone.
    target, action, _ = _dug_trench_with_soil(zone=True)
    action[12, 12] = 0
    action[4, 8] = 1
    zone = [(r, c) for r in range(2) for c in range(N)]
    field = np.asarray(field_jit(make_obs(target, action)))
    goals = {(r, c) for r in range(N) for c in range(N) if field[r, c] == 0}
    expected = {(r, c) for r in range(N) for c in range(N)
                if action[r, c] == 0 and _covers((r, c), [(4, 8)]) and _covers((r, c), zone)}
    assert goals == expected and (2, 8) in goals
    assert field[6, 8] > 0  # reaches the soil (2 tiles) but no zone tile (5 rows away)
    # Zone tiles that cannot take soil (soil on them already, or not dumpable) do not count:
    # with none left in reach, every tile reaching the soil is a goal again.
    closed = np.ones((N, N), np.int8)
    closed[:2, :] = 0
    field = np.asarray(field_jit(make_obs(target, action, dumpability=closed)))
    assert field[6, 8] == 0 and field[2, 8] == 0


@pytest.mark.parametrize("zone, soil_in_zone", [(False, False), (True, True)])
def test_soil_that_needs_no_moving_leads_nowhere(zone, soil_in_zone):
    # Without dump zones soil is never misplaced; soil in a zone is where it belongs.
    target, action, _ = _dug_trench_with_soil(zone, soil_in_zone)
    assert (np.asarray(field_jit(make_obs(target, action))) == FAR).all()


def test_while_targets_are_left_soil_outside_the_zones_does_not_count():
    target, action, _ = _dug_trench_with_soil(zone=True)
    target[8, 14] = -1  # one undug target left
    field = np.asarray(field_jit(make_obs(target, action)))
    without_soil = np.asarray(field_jit(make_obs(target, np.minimum(action, 0))))
    np.testing.assert_array_equal(field, without_soil)
    assert field[8, 11] == 0 and field[12, 9] > 0


@pytest.mark.parametrize("heading", [0, 3, 6, 9])
def test_direction_zero_is_the_tile_ahead_of_the_base(heading):
    target = np.zeros((N, N), np.int8)
    target[8, 14] = -1  # east of the agent at (8, 4)
    features = np.asarray(features_jit(make_obs(target, agent=(8, 4, heading))))
    scaled_ahead, change = features[2:14], features[26:38]
    step = direction_offsets()[heading]
    field = np.asarray(field_jit(make_obs(target)))
    assert scaled_ahead[0] == pytest.approx(field[8 + step[0], 4 + step[1]] / FAR)
    # Towards the target (east) the distance falls: direction -heading points east.
    east = (-heading) % 12
    assert change[east] == -1.0 and change[(east + 6) % 12] == 1.0


def test_leading_batch_dims_match_one_agent_at_a_time():
    rng = np.random.default_rng(3)
    targets = np.where(rng.random((2, 3, N, N)) < 0.05, -1, 0).astype(np.int8)
    agents = np.stack([rng.integers(0, N, (2, 3)), rng.integers(0, N, (2, 3)),
                       rng.integers(0, 12, (2, 3))], axis=-1)
    batched = {
        "target_map": jnp.asarray(targets),
        "action_map": jnp.zeros((2, 3, N, N), jnp.int8),
        "obstacles": jnp.zeros((2, 3, N, N), jnp.int8),
        "dumpability": jnp.ones((2, 3, N, N), jnp.int8),
        "agent_state": jnp.concatenate(
            [jnp.asarray(agents, jnp.int32), jnp.zeros((2, 3, 3), jnp.int32)], axis=-1),
    }
    got = np.asarray(features_jit(batched))
    assert got.shape == (2, 3, NUM_FEATURES) and np.isfinite(got).all()
    for i in range(2):
        for j in range(3):
            single = features_jit(make_obs(targets[i, j], agent=tuple(agents[i, j])))
            np.testing.assert_array_equal(got[i, j], np.asarray(single))


def test_policy_with_dig_distance_adds_only_its_mlp():
    obs = small.varied_observations()  # real reset observations of 4 envs
    params = {}
    for enabled in (False, True):
        model = ExcavationPolicy(PolicyConfig("flat", 32, 32, compass=True,
                                              dig_distance=enabled), 8)
        params[enabled] = model.init(jax.random.PRNGKey(0), obs)
        logits, value = model.apply(params[enabled], obs)
        assert logits.shape == (4, 8) and value.shape == (4,)
        assert np.isfinite(np.asarray(logits)).all() and np.isfinite(np.asarray(value)).all()
    encoders = {flag: params[flag]["params"]["encoder"] for flag in params}
    assert set(encoders[True]) - set(encoders[False]) == {"dig_distance_mlp"}
    assert encoders[True]["dig_distance_mlp"]["Dense_0"]["kernel"].shape[0] == NUM_FEATURES
    extra = count_parameters(params[True]) - count_parameters(params[False])
    assert extra == count_parameters(encoders[True]["dig_distance_mlp"]) + 64 * 32


def test_the_field_leads_past_targets_whose_dig_was_refused():
    """With `refused_digs` in the observation (`EnvConfig.remember_refused_digs`), the field
    leads to the targets the mask did not refuse, as if the refused ones were dug; where
    every undug target was refused, to all of them again (the refusals went stale)."""
    target = np.zeros((N, N), np.int8)
    target[3, 3] = -1
    target[12, 12] = -1
    refused = np.zeros((N, N), bool)
    refused[3, 3] = True
    obs = dict(make_obs(target), refused_digs=jnp.asarray(refused))
    only_far = target.copy()
    only_far[3, 3] = 0
    np.testing.assert_array_equal(np.asarray(field_jit(obs)),
                                  np.asarray(field_jit(make_obs(only_far))))
    assert np.asarray(field_jit(obs))[3, 5] > 0  # beside the refused target, no longer a goal
    refused[12, 12] = True
    stale = dict(make_obs(target), refused_digs=jnp.asarray(refused))
    np.testing.assert_array_equal(np.asarray(field_jit(stale)),
                                  np.asarray(field_jit(make_obs(target))))


def test_a_batch_in_and_out_of_the_last_stage_gives_each_observation_its_own_goals():
    """`work_in_reach` covers the free zone tiles only when some env of the batch is in the
    last stage: batched with an env that still has targets, or alone, each observation
    gets the goals it gets on its own."""
    target, action, _ = _dug_trench_with_soil(zone=True)
    action[12, 12] = 0
    action[4, 8] = 1
    last_stage = make_obs(target, action)
    digging = make_obs(*_dug_trench_with_soil(zone=True)[:1], np.zeros((N, N), np.int8))
    alone = [np.asarray(jax.jit(work_in_reach)(jax.tree.map(lambda x: x[None], obs)))[0]
             for obs in (last_stage, digging)]
    assert not np.array_equal(*alone)
    for order in ([last_stage, digging], [digging, digging]):
        batch = jax.tree.map(lambda *x: jnp.stack(x), *order)
        expected = np.stack([alone[0] if obs is last_stage else alone[1] for obs in order])
        np.testing.assert_array_equal(np.asarray(jax.jit(work_in_reach)(batch)), expected)
