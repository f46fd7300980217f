"""Reference footprint geometry in numpy, independent of envs.geometry."""

from __future__ import annotations

import numpy as np


def footprint_cells(length: int, width: int, pos, heading: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) int arrays of the tiles covered by a footprint centred at pos."""
    offsets = np.arange(-(length + width), length + width + 1)
    rel_r, rel_c = np.meshgrid(offsets, offsets, indexing="ij")
    theta = np.radians(30 * heading)
    along = rel_c * np.cos(theta) - rel_r * np.sin(theta)
    across = rel_c * np.sin(theta) + rel_r * np.cos(theta)
    inside = (np.abs(along) <= length / 2 + 1e-6) & (np.abs(across) <= width / 2 + 1e-6)
    return pos[0] + rel_r[inside], pos[1] + rel_c[inside]


def footprint_is_free(length, width, pos, heading, blocked: np.ndarray) -> bool:
    """True when every covered tile is on the map and not blocked (bool [N, N])."""
    rows, cols = footprint_cells(length, width, pos, heading)
    size = blocked.shape[0]
    if rows.min() < 0 or cols.min() < 0 or rows.max() >= size or cols.max() >= size:
        return False
    return not blocked[rows, cols].any()
