"""Action indices. Both agent types share 8 indices, so one policy head serves a mixed batch."""

FORWARD = 0
BACKWARD = 1
CLOCK = 2  # tracked: base turns clockwise; wheeled: WHEELS_LEFT
ANTICLOCK = 3  # tracked: base turns anticlockwise; wheeled: WHEELS_RIGHT
WHEELS_LEFT = 2
WHEELS_RIGHT = 3
CABIN_CLOCK = 4
CABIN_ANTICLOCK = 5
DO = 6
DO_NOTHING = 7

NUM_ACTIONS = 8
NO_ACTION = NUM_ACTIONS
"""Padding value of `last_actions` at the start of an episode (an embedding index of its own)."""

TRACKED = 0
WHEELED = 1

TRACKED_ACTION_NAMES = (
    "FORWARD",
    "BACKWARD",
    "CLOCK",
    "ANTICLOCK",
    "CABIN_CLOCK",
    "CABIN_ANTICLOCK",
    "DO",
    "DO_NOTHING",
)
WHEELED_ACTION_NAMES = (
    "FORWARD",
    "BACKWARD",
    "WHEELS_LEFT",
    "WHEELS_RIGHT",
    "CABIN_CLOCK",
    "CABIN_ANTICLOCK",
    "DO",
    "DO_NOTHING",
)
