"""Boolean grid masks for the map generator (numpy): squares, Chebyshev dilation and
distance, window sums, and the windows or squares with no blocked tile."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def square_mask(size: int, centre: tuple[int, int], half_size: int) -> np.ndarray:
    """bool [N, N], True on the square of half-size `half_size` around centre (clipped)."""
    mask = np.zeros((size, size), bool)
    row, col = centre
    rows = slice(max(row - half_size, 0), row + half_size + 1)
    cols = slice(max(col - half_size, 0), col + half_size + 1)
    mask[rows, cols] = True
    return mask


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Chebyshev dilation: True within `radius` tiles (8-neighbourhood) of mask. bool [N, N]."""
    if radius <= 0:
        return mask.copy()
    window = 2 * radius + 1
    padded = np.pad(mask, radius)
    rows = sliding_window_view(padded, window, axis=0).any(axis=-1)
    return sliding_window_view(rows, window, axis=1).any(axis=-1)


def chebyshev_distance(mask: np.ndarray, max_distance: int) -> np.ndarray:
    """int32 [N, N]: Chebyshev distance to the nearest True tile, capped at max_distance + 1."""
    distance = np.full(mask.shape, max_distance + 1, np.int32)
    distance[mask] = 0
    reached = mask
    for step in range(1, max_distance + 1):
        reached = dilate(reached, 1)
        distance[reached & (distance > step)] = step
    return distance


def window_sums(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """int [N - height + 1, N - width + 1]: True count in each height x width window."""
    integral = np.zeros((mask.shape[0] + 1, mask.shape[1] + 1), np.int32)
    integral[1:, 1:] = mask.cumsum(axis=0).cumsum(axis=1)
    return (
        integral[height:, width:]
        - integral[:-height, width:]
        - integral[height:, :-width]
        + integral[:-height, :-width]
    )


def free_window_origins(blocked: np.ndarray, height: int, width: int) -> np.ndarray:
    """int [K, 2]: top-left (row, col) of every height x width window with no blocked tile."""
    if height > blocked.shape[0] or width > blocked.shape[1]:
        return np.zeros((0, 2), np.int64)
    return np.argwhere(window_sums(blocked, height, width) == 0)


def clear_square_centres(blocked: np.ndarray, half_size: int) -> np.ndarray:
    """int [K, 2]: centres of every in-map square of half-size `half_size` with no blocked tile."""
    side = 2 * half_size + 1
    return free_window_origins(blocked, side, side) + half_size
