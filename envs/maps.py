"""Procedural excavation maps (numpy only, fully determined by a seed).

Four map types:
  foundations: building footprints to dig (rectangle, L, U or ring), ringed by dump zones
               beyond a free lane as wide as the excavator (1, 3 or 5 tiles at 16, 32 or
               64) around the dig area; few or no obstacles.
  trenches:    1-3 straight trenches (any of 8 orientations, diagonals included), rectangular
               obstacles and no-dump patches; no dump zones, soil may go on any dumpable tile.
  tiny_trenches, tiny_foundations: the first levels of a curriculum. One short trench (2-4
               tiles, one wide) or one small rectangle (2-6 tiles) with its dump band; no
               obstacles and no no-dump patches.

Every map comes with a spawn pose whose surrounding square is free of obstacles and targets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from envs.grid_masks import (
    chebyshev_distance,
    clear_square_centres,
    dilate,
    free_window_origins,
    square_mask,
)

# index = map type id; new types go at the end so datasets on disk keep their meaning
MAP_TYPES = ("foundations", "trenches", "tiny_trenches", "tiny_foundations")
HAS_DUMP_ZONES = {"foundations": True, "trenches": False, "tiny_trenches": False,
                  "tiny_foundations": True}
VALID_MAP_SIZES = (16, 32, 64)
FOUNDATION_SHAPES = ("rectangle", "l_shape", "u_shape", "ring")

DIG_TILE, FREE_TILE, DUMP_TILE = -1, 0, 1

# Agent footprints are 9x5 (64), 5x3 (32) and 3x1 (16); these are the clearances the env uses.
_DEFAULT_SPAWN_CLEARANCE = {16: 3, 32: 4, 64: 6}
# Rows the minimal fallback layout needs beside the spawn square: dump, gap, 2 dig, gap, dump.
_FALLBACK_ROWS = 6
_MAX_ATTEMPTS = 12
_ATTEMPT_SHRINK = 0.85
_MAX_FOUNDATIONS = {16: 1, 32: 2, 64: 3}
# Dump area aimed for, as a multiple of the dig area; 1.0 is the hard minimum.
_GENEROUS_DUMP_RATIO = 1.5
_FREE_LANE = {16: 1, 32: 3, 64: 5}
"""Foundations: free tiles between the dig area and the dump zones, and between footprints
and the map's edge: the excavator's footprint width at the size (`EnvConfig.footprint_width`).
Soil goes on zones only, so no pile can ever close this lane. With one free tile at 32x32 and
64x64, the zone band was the only way round a footprint and the excavator walled itself in
with its own dumps: the scripted solver left 6 of 16 tracked 64x64 held-out foundations
unfinished, and trained policies cut targets off the same way (docs/RESULTS.md)."""


@dataclasses.dataclass(frozen=True, eq=False)  # eq on numpy fields is ambiguous; use equals()
class MapSet:
    """A pool of M square maps of side N (all numpy).

    target_map:  int8 [M, N, N]  -1 = tile to dig, 0 = free, +1 = dump zone that must get the soil
    obstacles:   int8 [M, N, N]  1 = obstacle (not traversable, diggable or dumpable), else 0
    dumpability: int8 [M, N, N]  1 = dumping allowed, 0 = no-dump zone (obstacles are always 0)
    map_type:    int8 [M]        index into MAP_TYPES
    spawn_pose:  int32 [M, 2]    (row, col) centre of a square of half-size spawn_clearance
                                 that lies inside the map and holds no obstacle and no target
    """

    target_map: np.ndarray
    obstacles: np.ndarray
    dumpability: np.ndarray
    map_type: np.ndarray
    spawn_pose: np.ndarray

    @property
    def size(self) -> int:
        return int(self.target_map.shape[-1])

    @property
    def count(self) -> int:
        return int(self.target_map.shape[0])

    def head(self, k: int) -> MapSet:
        """The first k maps as a new MapSet."""
        return MapSet(**{name: value[:k] for name, value in self.fields().items()})

    def fields(self) -> dict[str, np.ndarray]:
        """Field name -> array, in declaration order."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def type_counts(self) -> dict[str, int]:
        """Number of maps of each type in MAP_TYPES (zeros included)."""
        counts = np.bincount(self.map_type.astype(np.int64), minlength=len(MAP_TYPES))
        return {name: int(counts[i]) for i, name in enumerate(MAP_TYPES)}

    def equals(self, other: MapSet) -> bool:
        """True when every field has the same dtype, shape and values."""
        return all(
            a.dtype == b.dtype and np.array_equal(a, b)
            for a, b in zip(self.fields().values(), other.fields().values(), strict=True)
        )


def default_spawn_clearance(size: int) -> int:
    """Spawn clearance the env uses on maps of this size (64 -> 6, 32 -> 4, 16 -> 3)."""
    if size not in _DEFAULT_SPAWN_CLEARANCE:
        raise ValueError(f"invalid map size {size}; valid sizes: {_join(VALID_MAP_SIZES)}")
    return _DEFAULT_SPAWN_CLEARANCE[size]


def max_spawn_clearance(size: int) -> int:
    """Largest clearance that still leaves room for a dig area beside the spawn square."""
    return (size - _FALLBACK_ROWS - 1) // 2


def check_generation_args(
    types: Sequence[str], size: int, count: int, seed: int, spawn_clearance: int
) -> tuple[str, ...]:
    """Validate generate_maps arguments; returns types as a tuple. Raises ValueError (one line)."""
    type_list = (types,) if isinstance(types, str) else tuple(types)
    if not type_list:
        raise ValueError(f"no map types given; valid types: {_join(MAP_TYPES)}")
    for name in type_list:
        if name not in MAP_TYPES:
            raise ValueError(f"unknown map type {name!r}; valid types: {_join(MAP_TYPES)}")
    if size not in VALID_MAP_SIZES:
        raise ValueError(f"invalid map size {size}; valid sizes: {_join(VALID_MAP_SIZES)}")
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    limit = max_spawn_clearance(size)
    if not isinstance(spawn_clearance, int) or not 0 <= spawn_clearance <= limit:
        raise ValueError(
            f"spawn_clearance must be an integer in 0..{limit} for size {size}, "
            f"got {spawn_clearance!r}"
        )
    return type_list


def generate_maps(
    types: Sequence[str], size: int, count: int, seed: int, spawn_clearance: int
) -> MapSet:
    """Generate `count` maps of side `size`, types assigned round robin over `types`.

    Map i uses its own generator spawned from `seed`, so a shorter run is a prefix of a longer one.
    """
    type_list = check_generation_args(types, size, count, seed, spawn_clearance)
    target_map = np.zeros((count, size, size), np.int8)
    obstacles = np.zeros((count, size, size), np.int8)
    dumpability = np.zeros((count, size, size), np.int8)
    map_type = np.zeros(count, np.int8)
    spawn_pose = np.zeros((count, 2), np.int32)
    for i, child_seed in enumerate(np.random.SeedSequence(seed).spawn(count)):
        type_name = type_list[i % len(type_list)]
        rng = np.random.default_rng(child_seed)
        layout = _generate_layout(type_name, size, spawn_clearance, rng)
        target_map[i] = layout.target
        obstacles[i] = layout.obstacles
        dumpability[i] = layout.dumpable
        map_type[i] = MAP_TYPES.index(type_name)
        spawn_pose[i] = layout.spawn
    return MapSet(target_map, obstacles, dumpability, map_type, spawn_pose)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """One map. target: int8 [N, N]; obstacles, dumpable: bool [N, N]; spawn: (row, col)."""

    target: np.ndarray
    obstacles: np.ndarray
    dumpable: np.ndarray
    spawn: tuple[int, int]


_Builder = Callable[[np.random.Generator, int, int, float], "_Layout | None"]


def _generate_layout(
    type_name: str, size: int, clearance: int, rng: np.random.Generator
) -> _Layout:
    """Try the random builder with ever smaller features; fall back to a fixed minimal layout."""
    builder = _BUILDERS[type_name]
    for attempt in range(_MAX_ATTEMPTS):
        layout = builder(rng, size, clearance, _ATTEMPT_SHRINK**attempt)
        if layout is not None:
            return layout
    return _fallback_layout(type_name, size, clearance)


# ----------------------------------------------------------------------------- foundations


def _build_foundations(
    rng: np.random.Generator, size: int, clearance: int, scale: float
) -> _Layout | None:
    # The spawn square is reserved first: footprints and dump bands are laid out around it.
    row, col = rng.integers(clearance, size - clearance, size=2)
    spawn = (int(row), int(col))
    reserved = square_mask(size, spawn, clearance)
    lane = _FREE_LANE[size]
    border = np.ones((size, size), bool)
    border[1:-1, 1:-1] = False
    border = dilate(border, lane - 1)
    dig = np.zeros((size, size), bool)
    n_footprints = int(rng.integers(1, _MAX_FOUNDATIONS[size] + 1))
    shrink = scale / np.sqrt(n_footprints)
    for index in range(n_footprints):
        low = max(3, round(0.2 * size * shrink))
        high = max(low, round(0.45 * size * shrink))
        height, width = (int(v) for v in rng.integers(low, high + 1, size=2))
        # Keep a free tile to the spawn square, the free lane to the map's edge, and 3 tiles
        # to other footprints.
        keep_out = dilate(reserved, 1) | dilate(dig, 3) | border
        origins = free_window_origins(keep_out, height, width)
        if len(origins) == 0:
            if index == 0:
                return None
            continue
        row, col = origins[rng.integers(len(origins))]
        dig[row : row + height, col : col + width] |= _footprint_mask(rng, height, width)

    dump = _dump_band(dig, reserved, max_width=size // 4, lane=lane)
    if dump is None:
        return None
    keep_clear = dilate(dig, lane + 1) | dilate(dump, 2) | reserved
    obstacles = _scatter_small_obstacles(rng, size, keep_clear)
    if not _every_target_has_a_zone_in_reach(dig, dump, obstacles, size):
        return None
    target = np.where(dig, DIG_TILE, np.where(dump, DUMP_TILE, FREE_TILE)).astype(np.int8)
    return _Layout(target, obstacles, ~obstacles, spawn)


def _every_target_has_a_zone_in_reach(
    dig: np.ndarray, dump: np.ndarray, obstacles: np.ndarray, size: int
) -> bool:
    """Every dig tile lies in the arm's ring (`EnvConfig.workspace_radii`) of a position that
    has a dump-zone tile in its ring too, and where the excavator fits at any heading (the
    disk of its footprint's half-diagonal on the map, free of obstacles). A target no such
    position reaches can be dug only with its soil dumped outside the zones and moved on
    again: with the free lane, the inside of a U or a ring held no zone, and 64x64 targets
    there had no zone in reach from the start (docs/RESULTS.md). bool [N, N] masks."""
    from envs.config import EnvConfig  # the excavator's geometry at this size

    config = EnvConfig(map_size=size)
    inner, outer = config.workspace_radii
    reach = int(np.ceil(outer))
    span = np.arange(-reach, reach + 1)
    distance = np.hypot(span[:, None], span[None, :])
    ring = list(zip(*np.nonzero((distance >= inner) & (distance <= outer)), strict=True))
    body = list(zip(*np.nonzero(distance <= config.footprint_radius), strict=True))

    def spread(mask, offsets, fill):  # out[p] = any(mask[p + o]), off the map = fill
        padded = np.pad(mask, reach, constant_values=fill)
        out = np.zeros_like(mask)
        for dr, dc in offsets:
            out |= padded[dr : dr + size, dc : dc + size]
        return out

    fits = ~spread(obstacles, body, True)
    serving = fits & spread(dump, ring, False)
    return not bool((dig & ~spread(serving, ring, False)).any())


def _footprint_mask(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A building footprint filling a height x width box. Returns bool [height, width]."""
    shape = FOUNDATION_SHAPES[rng.integers(len(FOUNDATION_SHAPES))]
    thickness = max(1, round(min(height, width) * rng.uniform(0.3, 0.45)))
    if min(height, width) < 2 * thickness + 1:
        shape = "rectangle"  # too small to carve an opening into
    mask = np.ones((height, width), bool)
    inner_rows, inner_cols = height - thickness, width - thickness
    if shape == "l_shape":
        rows = slice(0, inner_rows) if rng.random() < 0.5 else slice(thickness, height)
        cols = slice(0, inner_cols) if rng.random() < 0.5 else slice(thickness, width)
        mask[rows, cols] = False
    elif shape == "u_shape":
        opening = rng.integers(4)
        middle_rows, middle_cols = slice(thickness, inner_rows), slice(thickness, inner_cols)
        if opening == 0:
            mask[:inner_rows, middle_cols] = False
        elif opening == 1:
            mask[thickness:, middle_cols] = False
        elif opening == 2:
            mask[middle_rows, :inner_cols] = False
        else:
            mask[middle_rows, thickness:] = False
    elif shape == "ring":
        mask[thickness:inner_rows, thickness:inner_cols] = False
    return mask


def _dump_band(
    dig: np.ndarray, reserved: np.ndarray, max_width: int, lane: int = 1
) -> np.ndarray | None:
    """Dump zone `lane` free tiles away from `dig`, widened until it can take all the soil.

    dig, reserved: bool [N, N]. Returns bool [N, N], or None if even max_width is too small.
    """
    distance = chebyshev_distance(dig, lane + max_width)
    candidates = (distance > lane) & (distance <= lane + max_width) & ~reserved
    # area_by_width[w - 1] = dump area of a band of width w (distances lane + 1 .. lane + w)
    counts = np.bincount(distance[candidates], minlength=lane + max_width + 1)
    area_by_width = np.cumsum(counts[lane + 1 :])
    dig_area = int(dig.sum())
    for ratio in (_GENEROUS_DUMP_RATIO, 1.0):
        wide_enough = np.flatnonzero(area_by_width >= ratio * dig_area)
        if len(wide_enough):
            return candidates & (distance <= lane + 1 + int(wide_enough[0]))
    return None


def _scatter_small_obstacles(
    rng: np.random.Generator, size: int, keep_out: np.ndarray
) -> np.ndarray:
    """Half the maps get 1-2 small square obstacles outside keep_out. Returns bool [N, N]."""
    obstacles = np.zeros((size, size), bool)
    if rng.random() < 0.5:
        return obstacles
    for _ in range(int(rng.integers(1, 3))):
        side = int(rng.integers(1, max(1, size // 16) + 2))
        origins = free_window_origins(keep_out | obstacles, side, side)
        if len(origins):
            row, col = origins[rng.integers(len(origins))]
            obstacles[row : row + side, col : col + side] = True
    return obstacles


# ----------------------------------------------------------------------------- trenches


def _build_trenches(
    rng: np.random.Generator, size: int, clearance: int, scale: float
) -> _Layout | None:
    dig = np.zeros((size, size), bool)
    for _ in range(int(rng.integers(1, 4))):
        dig |= _trench_mask(rng, size, scale)
    dig[[0, -1], :] = dig[:, [0, -1]] = False  # border tiles are awkward to reach
    centres = clear_square_centres(dig, clearance)
    if not dig.any() or len(centres) == 0:
        return None
    spawn = tuple(int(v) for v in centres[rng.integers(len(centres))])
    reserved = square_mask(size, spawn, clearance)

    obstacles = np.zeros((size, size), bool)
    keep_out = dilate(dig, 1) | reserved  # obstacles stay off the trench and its edge
    for _ in range(int(rng.integers(1, size // 16 + 2))):
        height, width = (int(v) for v in rng.integers(1, max(2, size // 8) + 1, size=2))
        origins = free_window_origins(keep_out | obstacles, height, width)
        if len(origins):
            row, col = origins[rng.integers(len(origins))]
            obstacles[row : row + height, col : col + width] = True

    no_dump = np.zeros((size, size), bool)
    for _ in range(int(rng.integers(1, 4))):
        height, width = (int(v) for v in rng.integers(size // 8, size // 4 + 1, size=2))
        row, col = (int(v) for v in rng.integers(0, [size - height + 1, size - width + 1]))
        no_dump[row : row + height, col : col + width] = True

    dumpable = ~no_dump & ~obstacles
    if (dumpable & ~dig).sum() < dig.sum():
        return None  # the soil would not fit anywhere
    target = np.where(dig, DIG_TILE, FREE_TILE).astype(np.int8)
    return _Layout(target, obstacles, dumpable, spawn)


def _trench_mask(rng: np.random.Generator, size: int, scale: float) -> np.ndarray:
    """One straight trench, 1-2 tiles wide, at a multiple of 22.5 degrees. Returns bool [N, N]."""
    angle = np.pi / 8 * rng.integers(8)
    direction = np.array([np.sin(angle), np.cos(angle)])  # (row, col) unit vector
    half_length = 0.5 * size * scale * rng.uniform(0.5, 0.9)
    half_width = 0.5 * int(rng.integers(1, 3))
    centre = rng.uniform(0.25 * size, 0.75 * size, size=2)
    rows, cols = np.indices((size, size))
    offset_rows, offset_cols = rows - centre[0], cols - centre[1]
    along = offset_rows * direction[0] + offset_cols * direction[1]
    across = offset_rows * direction[1] - offset_cols * direction[0]
    return (np.abs(along) <= half_length) & (np.abs(across) <= half_width)


# ----------------------------------------------------------------------------- fallback


def _fallback_layout(type_name: str, size: int, clearance: int) -> _Layout:
    """Fixed minimal layout: spawn in the top-left corner, targets along the bottom rows.

    Needs size - (2 * clearance + 1) >= _FALLBACK_ROWS, which check_generation_args enforces.
    """
    spawn = (clearance, clearance)
    reserved = square_mask(size, spawn, clearance)
    dig = np.zeros((size, size), bool)
    dumpable = np.ones((size, size), bool)
    if HAS_DUMP_ZONES[type_name]:
        lane = _FREE_LANE[size] if type_name == "foundations" else 1
        far = size - 1 - lane  # the free lane between the dig square and the map's edge
        dig[far - 2 : far, far - 2 : far] = True
        dump = _dump_band(dig, reserved, max_width=1, lane=lane)
        assert dump is not None
    elif type_name == "tiny_trenches":
        dig[size - 2, 1:4] = True
        dump = np.zeros_like(dig)
    else:
        dig[size - 2, 1:-1] = True
        dump = np.zeros_like(dig)
        dumpable[size - 5 : size - 3, 1:3] = False  # every trench map has a no-dump patch
    target = np.where(dig, DIG_TILE, np.where(dump, DUMP_TILE, FREE_TILE)).astype(np.int8)
    return _Layout(target, np.zeros((size, size), bool), dumpable, spawn)


# ----------------------------------------------------------------------------- tiny maps


def _build_tiny_trenches(
    rng: np.random.Generator, size: int, clearance: int, scale: float
) -> _Layout | None:
    """One straight trench of 2-4 tiles, one wide, in one of 8 directions, beside the spawn."""
    del scale
    length = int(rng.integers(2, 5))
    direction = _EIGHT_DIRECTIONS[rng.integers(len(_EIGHT_DIRECTIONS))]
    reach = length + 2
    low, high = 1 + reach, size - 2 - reach
    if low > high:
        return None
    start = rng.integers(low, high + 1, size=2)
    dig = np.zeros((size, size), bool)
    for k in range(length):
        dig[start[0] + k * direction[0], start[1] + k * direction[1]] = True
    centres = clear_square_centres(dilate(dig, 1), clearance)
    if len(centres) == 0:
        return None
    # The nearest clear spawn square, so the first levels need little driving.
    distance = np.abs(centres - start).max(axis=1)
    nearest = centres[distance == distance.min()]
    spawn = tuple(int(v) for v in nearest[rng.integers(len(nearest))])
    target = np.where(dig, DIG_TILE, FREE_TILE).astype(np.int8)
    no_obstacles = np.zeros((size, size), bool)
    return _Layout(target, no_obstacles, ~no_obstacles, spawn)


def _build_tiny_foundations(
    rng: np.random.Generator, size: int, clearance: int, scale: float
) -> _Layout | None:
    """One rectangle of 2-6 tiles (1-2 x 2-3) ringed by a dump band, near the spawn."""
    del scale
    row, col = rng.integers(clearance, size - clearance, size=2)
    spawn = (int(row), int(col))
    reserved = square_mask(size, spawn, clearance)
    height, width = int(rng.integers(1, 3)), int(rng.integers(2, 4))
    if rng.random() < 0.5:
        height, width = width, height
    border = np.ones((size, size), bool)
    border[1:-1, 1:-1] = False
    keep_out = dilate(reserved, 1) | dilate(border, 2)
    origins = free_window_origins(keep_out, height, width)
    if len(origins) == 0:
        return None
    distance = np.abs(origins - np.array(spawn)).max(axis=1)
    nearest = origins[distance == distance.min()]
    top, left = nearest[rng.integers(len(nearest))]
    dig = np.zeros((size, size), bool)
    dig[top : top + height, left : left + width] = True
    dump = _dump_band(dig, reserved, max_width=2)
    if dump is None:
        return None
    target = np.where(dig, DIG_TILE, np.where(dump, DUMP_TILE, FREE_TILE)).astype(np.int8)
    no_obstacles = np.zeros((size, size), bool)
    return _Layout(target, no_obstacles, ~no_obstacles, spawn)


_EIGHT_DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))

_BUILDERS: dict[str, _Builder] = {
    "foundations": _build_foundations,
    "trenches": _build_trenches,
    "tiny_trenches": _build_tiny_trenches,
    "tiny_foundations": _build_tiny_foundations,
}


def _join(values: Sequence[object]) -> str:
    return ", ".join(str(v) for v in values)
