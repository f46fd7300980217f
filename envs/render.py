"""Top-down RGB rendering of one excavation env state (one tile = one square of pixels).

`render_tiles` is pure jnp and jittable: one RGB colour per map tile. `render_frame` upscales
it to pixels on the host, and `render_frame_with_status` adds two progress bars below.

Colour legend (`render_legend()` returns the same list), later rows drawn on top:

  free ground               sand           (216, 200, 160)
  no-dump ground            sand tinted magenta (dumpability 0, untouched, not a dig target)
  dig target, not dug       orange         (235, 125,  45)
  dug target                dark brown     (105,  65,  35)
  dug outside the target    mauve          (140,  90, 120)  (the rules never produce it today)
  dump zone, empty          light blue     (150, 200, 235)
  dumped soil               olive          (150, 140,  60)  darker with height
  soil on a dump zone       blue           ( 40, 100, 170)  darker with height
  obstacle                  dark grey      ( 70,  70,  75)
  workspace                 light cyan overlay on whatever tile lies under it
  tracked agent             yellow         (250, 200,   0)  darker when loaded
  wheeled agent             green          ( 40, 170,  70)  darker when loaded
  agent front               white          the footprint tile furthest along the base heading
  arm marker                red            the workspace tile nearest the arm axis at the
                                           middle of the workspace ring (cabin direction)

The status bars of `render_frame_with_status` show episode time (age / max_steps, grey) and
dig progress (dug / target tiles, dug-target brown) on a dark background.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import geometry as geo
from envs.env import ExcavationEnv
from envs.state import EnvState

Colour = tuple[int, int, int]

FREE_GROUND: Colour = (216, 200, 160)
DIG_TARGET: Colour = (235, 125, 45)
DUG_TARGET: Colour = (105, 65, 35)
DUG_OTHER: Colour = (140, 90, 120)
DUMP_ZONE: Colour = (150, 200, 235)
DUMPED_SOIL: Colour = (150, 140, 60)
SOIL_ON_DUMP_ZONE: Colour = (40, 100, 170)
OBSTACLE: Colour = (70, 70, 75)
NO_DUMP_TINT: Colour = (200, 40, 140)
NO_DUMP_ALPHA = 0.3
WORKSPACE_TINT: Colour = (200, 245, 255)
WORKSPACE_ALPHA = 0.55
AGENT_TRACKED: Colour = (250, 200, 0)
AGENT_WHEELED: Colour = (40, 170, 70)
LOADED_SHADE = 0.6
AGENT_FRONT: Colour = (255, 255, 255)
ARM_MARKER: Colour = (220, 20, 20)
STATUS_BACKGROUND: Colour = (40, 40, 40)
STATUS_TIME: Colour = (190, 190, 190)
STATUS_PROGRESS: Colour = DUG_TARGET

SOIL_SHADE_LEVELS = 5
"""Soil heights 1..5 get shades of their colour; anything higher looks like height 5."""
SOIL_SHADE_STEP = 0.13


def _blend(colour, tint, alpha: float) -> np.ndarray:
    """float64 [..., 3]: `colour` moved towards `tint` by `alpha`."""
    return (1.0 - alpha) * np.asarray(colour, np.float64) + alpha * np.asarray(tint, np.float64)


def _shade(colour, factor: float) -> np.ndarray:
    return np.asarray(colour, np.float64) * factor


def _to_uint8(colours: np.ndarray) -> np.ndarray:
    return np.clip(np.round(colours), 0, 255).astype(np.uint8)


def _soil_shades(colour: Colour) -> list[np.ndarray]:
    return [_shade(colour, 1.0 - SOIL_SHADE_STEP * level) for level in range(SOIL_SHADE_LEVELS)]


# Tile categories: indices into the palette. Soil categories take one entry per shade level.
FREE, NO_DUMP, DIG, DUG, DUG_ELSEWHERE, ZONE, OBSTACLE_TILE = range(7)
SOIL = 7
SOIL_ON_ZONE = SOIL + SOIL_SHADE_LEVELS

_PALETTE = np.stack(
    [
        np.asarray(FREE_GROUND, np.float64),
        _blend(FREE_GROUND, NO_DUMP_TINT, NO_DUMP_ALPHA),
        np.asarray(DIG_TARGET, np.float64),
        np.asarray(DUG_TARGET, np.float64),
        np.asarray(DUG_OTHER, np.float64),
        np.asarray(DUMP_ZONE, np.float64),
        np.asarray(OBSTACLE, np.float64),
        *_soil_shades(DUMPED_SOIL),
        *_soil_shades(SOIL_ON_DUMP_ZONE),
    ]
)
# uint8 [2, K, 3]: [0] plain tiles, [1] the same tiles under the workspace overlay. Blending
# here in float64 keeps render_tiles a pure gather, so every colour matches the legend exactly.
TILE_COLOURS = _to_uint8(np.stack([_PALETTE, _blend(_PALETTE, WORKSPACE_TINT, WORKSPACE_ALPHA)]))
# uint8 [2, 2, 3]: [agent_type, loaded].
AGENT_COLOURS = _to_uint8(
    np.array(
        [
            [AGENT_TRACKED, _shade(AGENT_TRACKED, LOADED_SHADE)],
            [AGENT_WHEELED, _shade(AGENT_WHEELED, LOADED_SHADE)],
        ]
    )
)


def render_legend() -> list[tuple[str, Colour]]:
    """(name, RGB) for every colour a frame can show; tints as they look over free ground."""

    def rgb(colour) -> Colour:
        return tuple(int(v) for v in _to_uint8(np.asarray(colour)))

    return [
        ("free ground", FREE_GROUND),
        ("no-dump ground", rgb(_PALETTE[NO_DUMP])),
        ("dig target", DIG_TARGET),
        ("dug target", DUG_TARGET),
        ("dug outside target", DUG_OTHER),
        ("dump zone", DUMP_ZONE),
        ("dumped soil", DUMPED_SOIL),
        ("soil on dump zone", SOIL_ON_DUMP_ZONE),
        ("obstacle", OBSTACLE),
        ("workspace", rgb(TILE_COLOURS[1, FREE])),
        ("tracked agent", rgb(AGENT_COLOURS[0, 0])),
        ("tracked agent, loaded", rgb(AGENT_COLOURS[0, 1])),
        ("wheeled agent", rgb(AGENT_COLOURS[1, 0])),
        ("wheeled agent, loaded", rgb(AGENT_COLOURS[1, 1])),
        ("agent front", AGENT_FRONT),
        ("arm marker", ARM_MARKER),
    ]


def full_map_window(pos: jax.Array, map_size: int) -> geo.Window:
    """A `geo.Window` covering the whole `[N, N]` map, with offsets relative to `pos` [2]."""
    cells = jnp.arange(map_size, dtype=jnp.int32)
    rel_r = (cells - pos[0]).astype(jnp.float32)[:, None]
    rel_c = (cells - pos[1]).astype(jnp.float32)[None, :]
    return geo.Window(jnp.zeros((2,), jnp.int32), rel_r, rel_c)


def _one_hot_best(score: jax.Array, candidates: jax.Array) -> jax.Array:
    """bool [N, N]: the candidate tile with the highest score (none if no candidate)."""
    best = jnp.argmax(jnp.where(candidates, score, -jnp.inf))
    flat = jnp.arange(score.size) == best
    return flat.reshape(score.shape) & jnp.any(candidates)


def tile_categories(state: EnvState) -> jax.Array:
    """int32 [N, N]: palette index of every tile, ignoring the agent."""
    target, action = state.target_map, state.action_map
    shade = jnp.clip(action.astype(jnp.int32), 1, SOIL_SHADE_LEVELS) - 1
    return jnp.select(
        [
            state.obstacles == 1,
            (action > 0) & (target == 1),
            action > 0,
            (action < 0) & (target == -1),
            action < 0,
            target == -1,
            target == 1,
            state.dumpability == 0,
        ],
        [OBSTACLE_TILE, SOIL_ON_ZONE + shade, SOIL + shade, DUG, DUG_ELSEWHERE, DIG, ZONE, NO_DUMP],
        FREE,
    )


def render_tiles(env: ExcavationEnv, state: EnvState) -> jax.Array:
    """uint8 [N, N, 3]: one colour per tile of a single env's state (no batch axis).

    Pure jnp, so it jits (with `env` static) and vmaps over a batch of states.
    """
    cfg = env.config
    agent = state.agent
    window = full_map_window(agent.pos, cfg.map_size)
    footprint = geo.footprint_mask(cfg, window, agent.base_heading)
    arm = (agent.base_heading + agent.cabin_heading) % geo.NUM_HEADINGS
    sector = geo.sector_masks(cfg, window, arm)
    # The tiles a DO acts on, as in ExcavationEnv._workspace.
    workspace = sector & ~footprint & (state.obstacles == 0)

    colours = jnp.asarray(TILE_COLOURS)[workspace.astype(jnp.int32), tile_categories(state)]

    loaded = (agent.loaded > 0).astype(jnp.int32)
    body = jnp.asarray(AGENT_COLOURS)[agent.agent_type, loaded]
    colours = jnp.where(footprint[..., None], body, colours)

    base_cos = jnp.asarray(geo.COS)[agent.base_heading]
    base_sin = jnp.asarray(geo.SIN)[agent.base_heading]
    along = window.rel_c * base_cos - window.rel_r * base_sin
    across = window.rel_c * base_sin + window.rel_r * base_cos
    # The small |across| term picks the middle tile of a wide footprint's front row.
    front = _one_hot_best(along - 0.01 * jnp.abs(across), footprint)
    colours = jnp.where(front[..., None], jnp.asarray(AGENT_FRONT, jnp.uint8), colours)

    # Nearest sector tile to the arm axis point at mid-ring, rather than rounding that point:
    # rounding an exact .5 offset can land just outside the 60 degree sector.
    mid_radius = sum(cfg.workspace_radii) / 2
    axis_r = -mid_radius * jnp.asarray(geo.SIN)[arm]
    axis_c = mid_radius * jnp.asarray(geo.COS)[arm]
    dist_sq = (window.rel_r - axis_r) ** 2 + (window.rel_c - axis_c) ** 2
    marker = _one_hot_best(-dist_sq, sector & ~footprint)
    return jnp.where(marker[..., None], jnp.asarray(ARM_MARKER, jnp.uint8), colours)


# `env` is hashed by identity, so each env instance compiles once.
_render_tiles_jit = jax.jit(render_tiles, static_argnums=0)


def upscale(tiles: np.ndarray, tile_pixels: int) -> np.ndarray:
    """[N, N, 3] -> [N * tile_pixels, N * tile_pixels, 3]: each tile a square of pixels."""
    if tile_pixels < 1:
        raise ValueError(f"tile_pixels must be >= 1, got {tile_pixels}")
    return np.repeat(np.repeat(tiles, tile_pixels, axis=0), tile_pixels, axis=1)


def render_frame(env: ExcavationEnv, state: EnvState, tile_pixels: int = 8) -> np.ndarray:
    """uint8 [N * tile_pixels, N * tile_pixels, 3]: the state as an RGB image (host numpy)."""
    return upscale(np.asarray(_render_tiles_jit(env, state)), tile_pixels)


def render_status_bars(env: ExcavationEnv, state: EnvState, width: int, bar_height: int):
    """uint8 [2 * bar_height, width, 3]: episode time bar over dig progress bar.

    The time bar grows every step while `width >= max_steps`, so consecutive frames of an
    episode always differ (GIF writers merge identical frames).
    """
    time_fraction = min(int(state.age) / env.config.max_steps, 1.0)
    progress = float(env.episode_progress(state))
    bars = np.empty((2, bar_height, width, 3), np.uint8)
    bars[:] = STATUS_BACKGROUND
    for bar, fraction, colour in ((0, time_fraction, STATUS_TIME), (1, progress, STATUS_PROGRESS)):
        bars[bar, :, : int(fraction * width)] = colour
    return bars.reshape(2 * bar_height, width, 3)


def render_frame_with_status(
    env: ExcavationEnv, state: EnvState, tile_pixels: int = 8
) -> np.ndarray:
    """uint8 [N * tile_pixels + 2 * B, N * tile_pixels, 3]: `render_frame` above two status
    bars of height B = max(2, tile_pixels // 2)."""
    frame = render_frame(env, state, tile_pixels)
    bars = render_status_bars(env, state, frame.shape[1], max(2, tile_pixels // 2))
    return np.concatenate([frame, bars], axis=0)
