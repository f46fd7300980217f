"""The run's keys from its seed (`terra_rl.algo.run_keys`): the host key equals
`jax.random.PRNGKey`, and the keys derived inside a pmapped program equal the eager
`fold_in` and `split` they replace. `tests/test_trainer.py` checks the trainer's first
state against the eager keys."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from terra_rl.algo.run_keys import EVAL_STREAM, INIT_STREAM, device_key, seed_key

SEEDS = [0, 7, 123_456, -1, -(2**31), -(2**31) - 1, 2**31, 2**32 - 1, 2**32 + 5, 2**40 + 7,
         2**63 - 1, -(2**63)]


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_key_equals_prng_key_without_a_program(seed):
    key = seed_key(seed)
    assert key.dtype == np.uint32 and key.shape == (2,)
    np.testing.assert_array_equal(key, np.asarray(jax.random.PRNGKey(seed)))


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1])
def test_seed_key_refuses_what_prng_key_refuses(seed):
    with pytest.raises(OverflowError, match="64-bit"):
        seed_key(seed)
    with pytest.raises(OverflowError):
        jax.random.PRNGKey(seed)


def test_device_keys_in_a_pmap_equal_the_eager_split_rows():
    devices = 4
    assert jax.local_device_count() >= devices, "conftest forces 4 CPU devices"

    def keys(run_key):
        return [device_key(run_key, stream, "d") for stream in (INIT_STREAM, EVAL_STREAM)]

    seeds = [3, 2**32 + 9]
    run_keys = np.stack([np.stack([seed_key(seed)] * devices) for seed in seeds])
    derive = jax.pmap(keys, axis_name="d", devices=jax.devices()[:devices])
    derived = [derive(run_key) for run_key in run_keys]
    for seed, (init_keys, eval_keys) in zip(seeds, derived, strict=True):
        root = jax.random.PRNGKey(seed)
        for stream, got in ((INIT_STREAM, init_keys), (EVAL_STREAM, eval_keys)):
            want = jax.random.split(jax.random.fold_in(root, stream), devices)
            assert got.dtype == np.uint32 and got.shape == (devices, 2)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
