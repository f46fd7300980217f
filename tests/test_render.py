"""Rendering colours, jittability and the play_episode.py GIF script (16x16 maps)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from envs import actions as A
from envs.config import EnvConfig
from envs.env import ExcavationEnv
from envs.params import make_env_params
from envs.render import render_frame, render_legend, render_tiles

REPO_ROOT = Path(__file__).resolve().parents[1]
SIZE = 16
LEGEND = dict(render_legend())
# The agent sits at AGENT_POS facing +column (heading 0) with the arm along the base, so on a
# 16x16 map its 3x1 footprint covers (8, 7..9) and the workspace lies in columns 10..11.
AGENT_POS = (8, 8)
FOOTPRINT = [(8, 7), (8, 8), (8, 9)]
FRONT = (8, 9)
ARM_MARKER_TILE = (8, 10)
WORKSPACE_TILE = (8, 11)


@pytest.fixture(scope="module")
def env_and_params():
    config = EnvConfig(map_size=SIZE, max_steps=50)
    return ExcavationEnv(config), make_env_params(config, num_maps=2, seed=0)


def _reset(env, params, key, agent_type=A.TRACKED):
    """One compile instead of many op-by-op ones; returns the state only."""
    return jax.jit(env.reset)(jax.random.key(key), params, agent_type)[1]


def _clean_state(env, params, agent_type=A.TRACKED, loaded=0):
    """A reset state on an empty, dumpable map with the agent at a known pose."""
    state = _reset(env, params, 0, agent_type)
    zeros = jnp.zeros((SIZE, SIZE), jnp.int8)
    agent = state.agent.replace(
        pos=jnp.asarray(AGENT_POS, jnp.int32),
        base_heading=jnp.int32(0),
        cabin_heading=jnp.int32(0),
        loaded=jnp.int32(loaded),
    )
    return state.replace(
        agent=agent,
        target_map=zeros,
        action_map=zeros,
        obstacles=zeros,
        dumpability=jnp.ones((SIZE, SIZE), jnp.int8),
    )


def _tile(tiles: np.ndarray, row: int, col: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in tiles[row, col])


def test_frame_shape_dtype_and_square_tiles(env_and_params):
    env, params = env_and_params
    state = _reset(env, params, 1)
    frame = render_frame(env, state, tile_pixels=3)
    assert frame.shape == (SIZE * 3, SIZE * 3, 3)
    assert frame.dtype == np.uint8
    tiles = np.asarray(render_tiles(env, state))
    assert tiles.shape == (SIZE, SIZE, 3) and tiles.dtype == np.uint8
    np.testing.assert_array_equal(frame[::3, ::3], tiles)
    np.testing.assert_array_equal(frame[2::3, 2::3], tiles)


def test_legend_names_and_colours_are_distinct():
    legend = render_legend()
    assert len({name for name, _ in legend}) == len(legend)
    assert len({colour for _, colour in legend}) == len(legend)
    assert all(len(c) == 3 and all(0 <= v <= 255 for v in c) for _, c in legend)


def test_map_tiles_get_legend_colours(env_and_params):
    env, params = env_and_params
    state = _clean_state(env, params)
    target = np.zeros((SIZE, SIZE), np.int8)
    action = np.zeros((SIZE, SIZE), np.int8)
    obstacles = np.zeros((SIZE, SIZE), np.int8)
    dumpability = np.ones((SIZE, SIZE), np.int8)
    target[1, 1] = -1  # dig target, not dug
    target[1, 2], action[1, 2] = -1, -1  # dug target
    action[1, 3] = -1  # dug outside the target
    target[2, 1] = 1  # empty dump zone
    target[2, 2], action[2, 2] = 1, 1  # soil on a dump zone
    target[2, 3], action[2, 3] = 1, 3
    action[3, 1] = 1  # dumped soil
    action[3, 2] = 4
    obstacles[4, 1] = 1
    dumpability[4, 2] = 0  # no-dump ground
    state = state.replace(
        target_map=jnp.asarray(target),
        action_map=jnp.asarray(action),
        obstacles=jnp.asarray(obstacles),
        dumpability=jnp.asarray(dumpability),
    )
    tiles = np.asarray(render_tiles(env, state))
    expected = {
        (0, 0): "free ground",
        (1, 1): "dig target",
        (1, 2): "dug target",
        (1, 3): "dug outside target",
        (2, 1): "dump zone",
        (2, 2): "soil on dump zone",
        (3, 1): "dumped soil",
        (4, 1): "obstacle",
        (4, 2): "no-dump ground",
    }
    for (row, col), name in expected.items():
        assert _tile(tiles, row, col) == LEGEND[name], name
    # Higher soil is darker, and keeps its hue family.
    assert sum(_tile(tiles, 2, 3)) < sum(LEGEND["soil on dump zone"])
    assert sum(_tile(tiles, 3, 2)) < sum(LEGEND["dumped soil"])


@pytest.mark.parametrize(
    ("agent_type", "loaded", "name"),
    [
        (A.TRACKED, 0, "tracked agent"),
        (A.TRACKED, 2, "tracked agent, loaded"),
        (A.WHEELED, 0, "wheeled agent"),
        (A.WHEELED, 2, "wheeled agent, loaded"),
    ],
)
def test_agent_footprint_workspace_and_markers(env_and_params, agent_type, loaded, name):
    env, params = env_and_params
    tiles = np.asarray(render_tiles(env, _clean_state(env, params, agent_type, loaded)))
    for row, col in FOOTPRINT:
        expected = "agent front" if (row, col) == FRONT else name
        assert _tile(tiles, row, col) == LEGEND[expected], (row, col)
    assert _tile(tiles, *ARM_MARKER_TILE) == LEGEND["arm marker"]
    assert _tile(tiles, *WORKSPACE_TILE) == LEGEND["workspace"]
    assert _tile(tiles, 8, 6) == LEGEND["free ground"]  # behind the agent


def test_arm_marker_follows_the_cabin(env_and_params):
    env, params = env_and_params
    state = _clean_state(env, params)
    # Cabin turned 90 degrees anticlockwise: the arm points up (towards row 0).
    state = state.replace(agent=state.agent.replace(cabin_heading=jnp.int32(3)))
    tiles = np.asarray(render_tiles(env, state))
    assert _tile(tiles, 6, 8) == LEGEND["arm marker"]
    assert _tile(tiles, *ARM_MARKER_TILE) == LEGEND["free ground"]
    assert _tile(tiles, 5, 8) == LEGEND["workspace"]


def test_render_tiles_is_jittable(env_and_params):
    env, params = env_and_params
    state = _reset(env, params, 2, A.WHEELED)
    jitted = jax.jit(render_tiles, static_argnums=0)(env, state)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(render_tiles(env, state)))


def _run_script(*args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("DATASET_PATH", "DATASET_SIZE")}
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "play_episode.py"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


def test_play_episode_writes_one_gif_frame_per_step(tmp_path):
    out = tmp_path / "gifs" / "episode.gif"
    options = "--policy random --map-size 16 --max-steps 15 --tile-pixels 2 --seed 3".split()
    result = _run_script(*options, "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    steps = int(re.search(r"steps=(\d+)", summary).group(1))
    assert 1 <= steps <= 15
    assert str(out) in summary
    with Image.open(out) as gif:
        assert gif.n_frames == steps  # one frame per step, the state after its action
        # map plus two status bars, under a two-line title, on a canvas the title fits
        assert gif.size == (max(SIZE * 2, 132), SIZE * 2 + 2 * 2 + 26)


def test_play_episode_rejects_unknown_policy(tmp_path):
    result = _run_script("--policy", "ppo", "--out", str(tmp_path / "x.gif"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "policy" in lines[0] and "checkpoint" in lines[0]
    assert not (tmp_path / "x.gif").exists()
