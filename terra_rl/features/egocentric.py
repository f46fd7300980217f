"""The egocentric view: the map around the excavator, turned to its base heading.

The compass (`terra_rl.features.compass`) says in which direction and how far the work lies, in
coarse bins. Placing the base so that a target falls inside the arm's reach, with free dump
space beside it, needs the exact tiles next to the excavator, seen from where it faces.
The view samples a square of `2 * radius + 1` tiles on a side, centred on the agent, along
its base heading: row 0 lies `radius` tiles ahead, the centre column straight on. Tiles
outside the map count as blocked. The same layers as the compass; no parameters.

Headings are 30 degrees apart, so a turned grid does not fall on tiles: each view cell takes
the nearest tile (a fixed table of offsets per heading).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from envs.geometry import NUM_HEADINGS
from terra_rl.features.compass import LAYERS, compass_layers

BLOCKED_LAYER = LAYERS.index("blocked")


def view_offsets(radius: int) -> np.ndarray:
    """int32 [NUM_HEADINGS, S, S, 2] with S = 2 * radius + 1: the (row, col) offset from the
    agent of each view cell, per base heading. Cell (i, j) lies `radius - i` tiles ahead and
    `j - radius` tiles to the right.

    Heading h points at h * 30 degrees anticlockwise from +column, rows grow downwards, so
    ahead is (-sin, cos) and right is (cos, sin) in (row, col).
    """
    ahead = radius - np.arange(2 * radius + 1, dtype=np.float64)[:, None]
    right = np.arange(2 * radius + 1, dtype=np.float64)[None, :] - radius
    offsets = []
    for heading in range(NUM_HEADINGS):
        theta = heading * 2 * math.pi / NUM_HEADINGS
        rows = -ahead * math.sin(theta) + right * math.cos(theta)
        cols = ahead * math.cos(theta) + right * math.sin(theta)
        offsets.append(np.stack([rows, cols], axis=-1))
    # Round half away from zero, so that the table is symmetric under a quarter turn.
    table = np.stack(offsets)
    return (np.sign(table) * np.floor(np.abs(table) + 0.5 + 1e-9)).astype(np.int32)


def egocentric_view(obs: dict, radius: int) -> jax.Array:
    """float32 [..., S, S, 4], S = 2 * radius + 1: the compass layers (`LAYERS`) of the
    tiles around the agent of `obs["agent_state"]` int32 [..., 6], turned to its base
    heading (see `view_offsets`). Any leading batch dims."""
    layers = compass_layers(obs)  # [..., N, N, 4]
    map_size = layers.shape[-2]
    batch_shape = layers.shape[:-3]
    side = 2 * radius + 1
    agent = obs["agent_state"].reshape(-1, obs["agent_state"].shape[-1])
    table = jnp.asarray(view_offsets(radius))
    offsets = table[agent[:, 2] % NUM_HEADINGS]  # [B, S, S, 2]
    rows = agent[:, 0, None, None] + offsets[..., 0]
    cols = agent[:, 1, None, None] + offsets[..., 1]
    inside = (rows >= 0) & (rows < map_size) & (cols >= 0) & (cols < map_size)
    flat_index = (jnp.clip(rows, 0, map_size - 1) * map_size + jnp.clip(cols, 0, map_size - 1))
    flat_layers = layers.reshape(-1, map_size * map_size, len(LAYERS))
    view = jnp.take_along_axis(
        flat_layers, flat_index.reshape(agent.shape[0], -1, 1), axis=1
    ).reshape(-1, side, side, len(LAYERS))
    outside_value = jnp.zeros(len(LAYERS), jnp.float32).at[BLOCKED_LAYER].set(1.0)
    view = jnp.where(inside[..., None], view, outside_value)
    return view.reshape(*batch_shape, side, side, len(LAYERS))
