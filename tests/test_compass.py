"""The compass (`terra_rl.features.compass`): tile counts per sector and distance in the base frame.

Hand-built observations with known tiles check the bins, the layers and the counts; a map
rotated by 90 degrees with the heading turned by 3 sectors must give the same compass (the
features are egocentric); leading batch dims and the policy wiring are checked too. Eager
and tiny: no shape family of its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hand_built_obs import SIZE, hand_built_obs

from terra_rl.features.compass import (
    LAYERS,
    NUM_DISTANCE_BINS,
    NUM_FEATURES,
    NUM_SECTORS,
    bins_from_offsets,
    compass,
    compass_bins,
    compass_layers,
)
from terra_rl.nets.models import ExcavationPolicy, PolicyConfig
from terra_rl.nets.parameters import count_parameters
from terra_rl.validation import small


def _counts(obs) -> np.ndarray:
    """[sector, distance bin, layer] tile counts (undoing the log1p)."""
    return np.expm1(np.asarray(compass(obs))).reshape(NUM_SECTORS, NUM_DISTANCE_BINS, -1)


@pytest.mark.parametrize(
    ("heading", "tile", "sector"),
    [
        (0, (8, 12), 0),  # heading 0 points at +column: straight ahead
        (0, (4, 8), 3),  # rows grow downwards: up is 90 degrees anticlockwise
        (0, (8, 4), 6),  # behind
        (0, (12, 8), 9),  # right
        (3, (4, 8), 0),  # heading 3 points up
        (3, (8, 12), 9),  # ... so +column is on its right
        (6, (8, 4), 0),
    ],
)
def test_sector_is_the_direction_in_the_base_frame(heading, tile, sector):
    bins = np.asarray(compass_bins(jnp.array([8, 8, heading, 0, 0, 0]), SIZE))
    assert divmod(int(bins[tile]), NUM_DISTANCE_BINS) == (sector, 2)  # 4 tiles: bin [3, 5)


@pytest.mark.parametrize("size", [16, 32])
def test_bins_cut_from_the_table_equal_the_formula_at_every_pose(size):
    """`compass_bins` cuts each agent's bins from one table of offsets: at every (row, col,
    heading) of the map, the same bins as the angles and distances computed for that agent."""
    rows, cols, headings = np.meshgrid(np.arange(size), np.arange(size),
                                       np.arange(NUM_SECTORS), indexing="ij")
    agents = np.stack([rows, cols, headings] + [np.zeros_like(rows)] * 3, axis=-1)
    agents = jnp.asarray(agents.reshape(-1, 6), jnp.int32)
    cells = jnp.arange(size, dtype=jnp.float32)

    def direct(agent):
        rel_r = cells[:, None] - agent[..., 0, None, None].astype(jnp.float32)
        rel_c = cells[None, :] - agent[..., 1, None, None].astype(jnp.float32)
        return bins_from_offsets(rel_r, rel_c, agent[..., 2, None, None], size)

    got = np.asarray(jax.jit(lambda a: compass_bins(a, size))(agents))
    expected = np.asarray(jax.jit(direct)(agents))
    assert got.shape == (size * size * NUM_SECTORS, size, size) and got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) == NUM_SECTORS * NUM_DISTANCE_BINS


def test_distance_bins_grow_with_distance_and_scale_with_the_map():
    agent = jnp.array([0, 0, 0, 0, 0, 0])
    for size in (16, 32):
        bins = np.asarray(compass_bins(agent, size)) % NUM_DISTANCE_BINS
        along_row = bins[0, :]
        assert along_row[0] == 0 and along_row[-1] == NUM_DISTANCE_BINS - 1
        assert np.all(np.diff(along_row) >= 0)
    small, large = (np.asarray(compass_bins(agent, s)) % NUM_DISTANCE_BINS for s in (16, 32))
    assert small[0, 4] == large[0, 8]


def test_counts_each_layer_in_its_bin():
    obs = hand_built_obs(
        target={(8, 12): -1, (8, 13): -1, (4, 8): -1, (12, 8): -1},
        action={(4, 8): -1, (12, 12): 2},  # (4, 8) is dug already; soil lies at (12, 12)
        obstacles={(8, 2): 1},
        dump={(0, 0): 0},
    )
    counts = _counts(obs)
    to_dig, free, soil, blocked = (LAYERS.index(n) for n in
                                   ("to_dig", "free_dump_space", "soil", "blocked"))
    assert counts[0, 2, to_dig] == 1 and counts[0, 3, to_dig] == 1  # 4 and 5 tiles ahead
    assert counts[9, 2, to_dig] == 1
    assert counts[:, :, to_dig].sum() == 3  # the dug target is not counted
    assert counts[3, 2, blocked] == 1  # ... it blocks instead
    assert counts[:, :, soil].sum() == 1 and counts[:, :, blocked].sum() == 3
    # Free dump space: every tile but the four targets, the two touched tiles and (0, 0).
    assert counts[:, :, free].sum() == SIZE * SIZE - 4 - 1 - 1
    assert counts.dtype == np.float32 and np.all(counts >= 0)
    assert counts.sum(axis=(0, 1))[free] + 6 == SIZE * SIZE


def test_rotating_the_map_and_the_heading_together_leaves_the_compass_unchanged():
    rng = np.random.default_rng(0)
    obs = hand_built_obs(pos=(5, 9), heading=2)
    obs["target_map"] = rng.choice(np.array([-1, 0, 1], np.int8), (SIZE, SIZE))
    obs["action_map"] = rng.choice(np.array([-1, 0, 0, 0, 2], np.int8), (SIZE, SIZE))
    obs["obstacles"] = (rng.random((SIZE, SIZE)) < 0.1).astype(np.int8)
    # np.rot90 turns the map 90 degrees anticlockwise: (r, c) -> (SIZE - 1 - c, r).
    rotated = {key: np.rot90(value) for key, value in obs.items() if value.ndim == 2}
    r, c = obs["agent_state"][:2]
    rotated["agent_state"] = np.array([SIZE - 1 - c, r, 2 + 3, 0, 0, 0], np.int32)
    np.testing.assert_allclose(compass(obs), compass(rotated), rtol=1e-6)


def test_leading_batch_dims_match_one_env_at_a_time():
    rng = np.random.default_rng(1)
    single = []
    for i in range(6):
        obs = hand_built_obs(pos=tuple(rng.integers(0, SIZE, 2)), heading=i * 2)
        obs["target_map"] = rng.choice(np.array([-1, 0], np.int8), (SIZE, SIZE))
        single.append(obs)
    batched = jax.tree.map(lambda *x: np.stack(x).reshape(2, 3, *x[0].shape), *single)
    out = np.asarray(compass(batched))
    assert out.shape == (2, 3, NUM_FEATURES) and out.dtype == np.float32
    for i, obs in enumerate(single):
        np.testing.assert_array_equal(out.reshape(6, -1)[i], compass(obs))


def _reference_compass(obs) -> np.ndarray:
    """float32 [B, NUM_FEATURES]: the compass of a batch counted tile by tile in numpy, each
    tile's bin from `bins_from_offsets` and its layers from `compass_layers`."""
    layers = np.asarray(compass_layers(obs))
    batch, size = layers.shape[0], layers.shape[1]
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    counts = np.zeros((batch, NUM_SECTORS * NUM_DISTANCE_BINS, len(LAYERS)), np.float32)
    for env in range(batch):
        row, col, heading = np.asarray(obs["agent_state"][env, :3])
        bins = np.asarray(bins_from_offsets(jnp.asarray(rows - row, jnp.float32),
                                            jnp.asarray(cols - col, jnp.float32),
                                            jnp.int32(heading), size))
        np.add.at(counts[env], bins.reshape(-1), layers[env].reshape(-1, len(LAYERS)))
    return np.log1p(counts).reshape(batch, NUM_FEATURES)


@pytest.mark.parametrize("size", [16, 32])
def test_random_batches_equal_a_count_tile_by_tile(size):
    """Random maps with every layer, agents anywhere at any heading: the scatter's counts
    equal numpy's, bit for bit, and each env's equal its own compass alone."""
    rng = np.random.default_rng(size)
    batch = 5
    obs = {
        "target_map": rng.choice(np.array([-1, 0, 1], np.int8), (batch, size, size)),
        "action_map": rng.choice(np.array([-2, -1, 0, 0, 0, 0, 1, 3], np.int8),
                                 (batch, size, size)),
        "dumpability": (rng.random((batch, size, size)) < 0.7).astype(np.int8),
        "obstacles": (rng.random((batch, size, size)) < 0.1).astype(np.int8),
        "agent_state": np.concatenate(
            [rng.integers(0, size, (batch, 2)), rng.integers(-3, 15, (batch, 1)),
             np.zeros((batch, 3), np.int64)], axis=1).astype(np.int32),
    }
    out = np.asarray(jax.jit(compass)(obs))
    assert out.shape == (batch, NUM_FEATURES) and out.dtype == np.float32
    np.testing.assert_array_equal(out, _reference_compass(obs))
    one = jax.tree.map(lambda x: x[2], obs)
    np.testing.assert_array_equal(np.asarray(compass(one)), out[2])


def test_policy_with_compass_adds_only_the_compass_mlp():
    obs = small.varied_observations()
    shapes = {}
    for flag in (False, True):
        model = ExcavationPolicy(PolicyConfig("flat", 32, 32, compass=flag), 8)
        shapes[flag] = jax.eval_shape(model.init, jax.random.PRNGKey(0), obs)["params"]
    assert "compass_mlp" in shapes[True]["encoder"]
    assert "compass_mlp" not in shapes[False]["encoder"]
    assert shapes[True]["encoder"]["compass_mlp"]["Dense_0"]["kernel"].shape[0] == NUM_FEATURES
    extra = count_parameters(shapes[True]) - count_parameters(shapes[False])
    assert extra == count_parameters(shapes[True]["encoder"]["compass_mlp"]) + 64 * 32


def _per_layer_scatter(obs) -> jax.Array:
    """The compass counted the direct way: each tile's four layers scatter-added into its
    (env, bin), the reference `compass`'s code histogram must equal bit for bit."""
    layers = compass_layers(obs)
    batch, size = layers.shape[0], layers.shape[-2]
    num_bins = NUM_SECTORS * NUM_DISTANCE_BINS
    bins = compass_bins(obs["agent_state"], size).reshape(batch, -1)
    segments = (bins + (jnp.arange(batch) * num_bins)[:, None]).reshape(-1)
    counts = jax.ops.segment_sum(layers.reshape(-1, len(LAYERS)), segments,
                                 num_segments=batch * num_bins)
    return jnp.log1p(counts).reshape(batch, NUM_FEATURES)


@pytest.mark.parametrize("size", [16, 32, 64])
def test_code_histogram_equals_a_scatter_of_every_layer(size):
    """Random maps with every layer and their overlaps (dug and dumped tiles on targets,
    obstacles, dump zones), agents anywhere at every heading: the same float32 bits."""
    rng = np.random.default_rng(size)
    batch = 24
    obs = {
        "target_map": rng.choice(np.array([-1, 0, 1], np.int8), (batch, size, size)),
        "action_map": rng.choice(np.array([-3, -1, 0, 0, 0, 1, 4], np.int8),
                                 (batch, size, size)),
        "dumpability": rng.choice(np.array([0, 1], np.int8), (batch, size, size)),
        "obstacles": (rng.random((batch, size, size)) < 0.15).astype(np.int8),
        "agent_state": np.stack(
            [rng.integers(0, size, batch), rng.integers(0, size, batch),
             np.arange(batch) % NUM_SECTORS] + [np.zeros(batch, np.int64)] * 3,
            axis=-1).astype(np.int32),
    }
    got = np.asarray(jax.jit(compass)(obs))
    want = np.asarray(jax.jit(_per_layer_scatter)(obs))
    assert got.dtype == np.float32 and got.shape == (batch, NUM_FEATURES)
    np.testing.assert_array_equal(got, want)
    # Every tile lands in one bin: the blocked and free counts add up to the map's tiles.
    counts = np.rint(np.expm1(got.astype(np.float64))).reshape(batch, -1, len(LAYERS))
    blocked = obs["obstacles"].astype(bool) | (obs["action_map"] != 0)
    np.testing.assert_array_equal(counts[..., LAYERS.index("blocked")].sum(axis=1),
                                  blocked.reshape(batch, -1).sum(axis=1))
