"""Hand-built excavation observations with known tiles, for the egocentric feature tests
(`tests/test_compass.py`, `tests/test_egocentric.py`)."""

from __future__ import annotations

import numpy as np

SIZE = 16


def hand_built_obs(pos=(8, 8), heading=0, target=None, action=None, obstacles=None, dump=None):
    """The map layers and `agent_state` of one 16x16 observation: every layer is 0 (the
    dumpability layer 1) except the tiles given as {(row, col): value}."""

    def layer(values, fill=0):
        out = np.full((SIZE, SIZE), fill, np.int8)
        for (r, c), v in (values or {}).items():
            out[r, c] = v
        return out

    return {
        "agent_state": np.array([pos[0], pos[1], heading, 0, 0, 0], np.int32),
        "target_map": layer(target),
        "action_map": layer(action),
        "obstacles": layer(obstacles),
        "dumpability": layer(dump, fill=1),
    }
