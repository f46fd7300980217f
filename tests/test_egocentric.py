"""The egocentric view (`terra_rl.features.egocentric`): the map around the agent, turned to
its base heading.

Hand-built observations with known tiles check where a tile lands for each heading, that
tiles off the map read as blocked, and that a map turned by 90 degrees with the heading
turned by 3 steps gives the same view; leading batch dims and the policy wiring are checked
too. Eager and tiny: no shape family of its own."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hand_built_obs import SIZE, hand_built_obs

from terra_rl.config import ConfigError, TrainConfig
from terra_rl.config_checks import validate
from terra_rl.features.compass import LAYERS
from terra_rl.features.egocentric import egocentric_view, view_offsets
from terra_rl.nets.models import ExcavationPolicy, PolicyConfig
from terra_rl.nets.parameters import count_parameters
from terra_rl.validation import small
from terra_rl.validation.references import expected_parameter_count

RADIUS = 3
TO_DIG, FREE_DUMP, SOIL, BLOCKED = (LAYERS.index(name) for name in LAYERS)


def test_offsets_centre_on_the_agent_and_step_one_tile_on_the_axes():
    table = view_offsets(RADIUS)
    side = 2 * RADIUS + 1
    assert table.shape == (12, side, side, 2) and table.dtype == np.int32
    np.testing.assert_array_equal(table[:, RADIUS, RADIUS], 0)
    # Heading 0 points at +column: the top row is RADIUS columns ahead, left is up.
    np.testing.assert_array_equal(table[0, 0, RADIUS], (0, RADIUS))
    np.testing.assert_array_equal(table[0, RADIUS, 0], (-RADIUS, 0))
    # A turned view keeps every cell within one tile of the exact rotation.
    for heading in range(12):
        distance = np.linalg.norm(table[heading], axis=-1)
        exact = np.linalg.norm(table[0], axis=-1)
        assert np.all(np.abs(distance - exact) <= 1.0)


@pytest.mark.parametrize(
    ("heading", "tile", "cell"),
    [
        (0, (8, 10), (RADIUS - 2, RADIUS)),  # heading 0 points at +column: 2 ahead
        (0, (6, 8), (RADIUS, RADIUS - 2)),  # up is on its left
        (3, (6, 8), (RADIUS - 2, RADIUS)),  # heading 3 points up
        (3, (8, 11), (RADIUS, RADIUS + 3)),  # ... so +column is on its right
        (6, (8, 7), (RADIUS - 1, RADIUS)),  # heading 6 points at -column
        (6, (8, 9), (RADIUS + 1, RADIUS)),  # ... so +column is behind
        (9, (9, 8), (RADIUS - 1, RADIUS)),  # heading 9 points down
    ],
)
def test_a_tile_lands_ahead_left_right_or_behind_by_heading(heading, tile, cell):
    view = np.asarray(egocentric_view(hand_built_obs(heading=heading, target={tile: -1}), RADIUS))
    expected = np.zeros(view.shape[:2], np.float32)
    expected[cell] = 1.0
    np.testing.assert_array_equal(view[..., TO_DIG], expected)


def test_layers_and_tiles_off_the_map_read_as_blocked():
    obs = hand_built_obs(pos=(1, 8), heading=3, action={(1, 9): 2, (1, 7): -1},
                         obstacles={(2, 8): 1})
    view = np.asarray(egocentric_view(obs, RADIUS))
    assert view.shape == (2 * RADIUS + 1, 2 * RADIUS + 1, len(LAYERS))
    assert view.dtype == np.float32
    # Heading 3 points up: rows 0 and -1 ... lie ahead; row 1 - 2 = -1 is off the map.
    np.testing.assert_array_equal(view[: RADIUS - 1, :, BLOCKED], 1.0)
    np.testing.assert_array_equal(view[: RADIUS - 1, :, FREE_DUMP], 0.0)
    assert view[RADIUS, RADIUS + 1, SOIL] == 1.0 and view[RADIUS, RADIUS + 1, BLOCKED] == 1.0
    assert view[RADIUS, RADIUS - 1, BLOCKED] == 1.0 and view[RADIUS, RADIUS - 1, SOIL] == 0.0
    assert view[RADIUS + 1, RADIUS, BLOCKED] == 1.0  # the obstacle behind
    assert view[RADIUS + 2, RADIUS, FREE_DUMP] == 1.0 and view[RADIUS + 2, RADIUS, BLOCKED] == 0


def test_turning_the_map_and_the_heading_together_leaves_the_view_unchanged():
    rng = np.random.default_rng(0)
    for heading in range(12):
        obs = hand_built_obs(pos=(5, 9), heading=heading)
        obs["target_map"] = rng.choice(np.array([-1, 0, 1], np.int8), (SIZE, SIZE))
        obs["action_map"] = rng.choice(np.array([-1, 0, 0, 0, 2], np.int8), (SIZE, SIZE))
        obs["obstacles"] = (rng.random((SIZE, SIZE)) < 0.1).astype(np.int8)
        # np.rot90 turns the map 90 degrees anticlockwise: (r, c) -> (SIZE - 1 - c, r).
        rotated = {key: np.rot90(value) for key, value in obs.items() if value.ndim == 2}
        r, c = obs["agent_state"][:2]
        rotated["agent_state"] = np.array([SIZE - 1 - c, r, heading + 3, 0, 0, 0], np.int32)
        np.testing.assert_array_equal(
            egocentric_view(obs, 7), egocentric_view(rotated, 7), err_msg=f"heading {heading}"
        )


def test_leading_batch_dims_match_one_env_at_a_time():
    rng = np.random.default_rng(1)
    single = []
    for i in range(6):
        obs = hand_built_obs(pos=tuple(rng.integers(0, SIZE, 2)), heading=i * 2 + 1)
        obs["target_map"] = rng.choice(np.array([-1, 0], np.int8), (SIZE, SIZE))
        single.append(obs)
    batched = jax.tree.map(lambda *x: np.stack(x).reshape(2, 3, *x[0].shape), *single)
    out = np.asarray(egocentric_view(batched, RADIUS))
    assert out.shape == (2, 3, 2 * RADIUS + 1, 2 * RADIUS + 1, len(LAYERS))
    for i, obs in enumerate(single):
        np.testing.assert_array_equal(out.reshape(6, *out.shape[2:])[i],
                                      egocentric_view(obs, RADIUS))


def test_policy_with_the_view_adds_only_the_egocentric_mlp():
    obs = small.varied_observations()
    shapes = {}
    for radius in (0, RADIUS):
        policy_config = PolicyConfig("flat", 32, 32, compass=True, egocentric_radius=radius)
        model = ExcavationPolicy(policy_config, 8)
        shapes[radius] = jax.eval_shape(model.init, jax.random.PRNGKey(0), obs)["params"]
        map_size = obs["target_map"].shape[-1]
        assert count_parameters(shapes[radius]) == expected_parameter_count(
            policy_config, map_size, obs["last_actions"].shape[-1], 8
        )
    mlp = shapes[RADIUS]["encoder"]["egocentric_mlp"]
    assert "egocentric_mlp" not in shapes[0]["encoder"]
    assert mlp["Dense_0"]["kernel"].shape[0] == (2 * RADIUS + 1) ** 2 * len(LAYERS)
    extra = count_parameters(shapes[RADIUS]) - count_parameters(shapes[0])
    assert extra == count_parameters(mlp) + 64 * 32


def test_negative_radius_and_a_policy_blind_to_the_map_are_rejected():
    with pytest.raises(ValueError, match="egocentric_radius"):
        PolicyConfig("flat", 32, 32, egocentric_radius=-1)
    with pytest.raises(ValueError, match="blind to the map"):
        PolicyConfig("none", 32, 32)
    PolicyConfig("none", 32, 32, compass=True)
    PolicyConfig("none", 32, 32, egocentric_radius=2)
    blind = TrainConfig(map_size=16, map_encoder="none", num_devices=1)
    with pytest.raises(ConfigError, match="--map_encoder none leaves the policy blind"):
        validate(blind, 1)
    validate(dataclasses.replace(blind, egocentric_radius=3), 1)
