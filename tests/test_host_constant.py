"""`envs.geometry.host_constant`: the env's and the compass's geometry tables built as one
compiled program each, to the values of the op-by-op build they replace, also under a trace."""

from __future__ import annotations

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import geometry as geo
from envs import reachability
from envs.config import EnvConfig
from terra_rl.features import compass


class CompileCounter(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith("Finished XLA compilation")


def compiles_of(build) -> int:
    """How many programs XLA compiles while `build()` runs."""
    counter = CompileCounter()
    logger = logging.getLogger("jax._src.dispatch")
    logger.addHandler(counter)
    try:
        with jax.log_compiles():
            build()
    finally:
        logger.removeHandler(counter)
    return counter.count


def op_by_op_sectors(config: EnvConfig) -> np.ndarray:
    radius = math.ceil(config.workspace_radii[1])
    cells = np.arange(-radius, radius + 1, dtype=np.float32)
    with jax.ensure_compile_time_eval():
        window = geo.Window(jnp.zeros(2, jnp.int32), jnp.asarray(cells[:, None]),
                            jnp.asarray(cells[None, :]))
        return np.asarray(geo.sector_masks(config, window, jnp.arange(12)))


def op_by_op_bins(map_size: int) -> np.ndarray:
    with jax.ensure_compile_time_eval():
        offsets = jnp.arange(1 - map_size, map_size, dtype=jnp.float32)
        headings = jnp.arange(compass.NUM_SECTORS, dtype=jnp.int32)[:, None, None]
        return np.asarray(compass.bins_from_offsets(offsets[:, None], offsets[None, :],
                                                    headings, map_size))


@pytest.mark.parametrize("map_size", [16, 32, 64])
def test_the_tables_equal_their_op_by_op_build(map_size):
    """The arm ring's offsets and the compass's bins, each one program, hold the values
    the op-by-op build gave (that build compiled each op alone: tens of programs)."""
    config = EnvConfig(map_size=map_size)
    radius = math.ceil(config.workspace_radii[1])
    expected = {(r - radius, c - radius)
                for r, c in zip(*np.nonzero(op_by_op_sectors(config).any(axis=0)), strict=True)}
    reachability.ring_offsets.cache_clear()
    compass._bins_table.cache_clear()
    assert compiles_of(lambda: reachability.ring_offsets(config)) == 1
    assert set(reachability.ring_offsets(config)) == expected
    assert compiles_of(lambda: compass._bins_table(map_size)) == 1
    np.testing.assert_array_equal(compass._bins_table(map_size), op_by_op_bins(map_size))


def test_a_host_constant_is_concrete_under_a_trace():
    """Called while a function is traced, the table is numpy, not a tracer of that trace."""
    seen = []

    @jax.jit
    def traced(x):
        table = geo.host_constant(lambda: jnp.arange(4.0) ** 2)
        seen.append(type(table))
        return x + table

    np.testing.assert_array_equal(traced(jnp.ones(4)), [1.0, 2.0, 5.0, 10.0])
    assert seen == [np.ndarray]
