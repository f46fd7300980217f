"""The suite's guard against a worker running out of memory maps (tests/memory_maps.py):
compiled programs add maps, and clearing jax's caches gives them back."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import pytest

from tests.memory_maps import map_count, map_limit, release_if_crowded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_compiled_programs_hold_maps_until_the_caches_are_cleared():
    """(Compiling need not add maps: the kernel merges adjacent regions, and in a worker
    that has compiled much, new code can land in freed ones. Clearing gives some back.)"""
    assert map_limit() > 0
    assert not release_if_crowded(1.0)  # this process is far from the limit
    for power in range(1, 13):  # 12 programs, each with its own code
        jax.jit(lambda x, power=power: jnp.sin(x) ** power)(jnp.ones(3)).block_until_ready()
    compiled = map_count()
    assert compiled > 0
    assert release_if_crowded(0.0)
    assert map_count() < compiled
