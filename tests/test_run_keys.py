"""The run's keys from its seed (`terra_rl.algo.run_keys`): the host key equals
`jax.random.PRNGKey`, and the keys derived inside a pmapped program equal the eager
`fold_in` and `split` they replace; no two consumers of a run's init, updates or eval share
a key. `tests/test_trainer.py` checks the trainer's first state against the eager keys."""

from __future__ import annotations

import collections
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.adapters.gymnax_env import make_gymnax_env
from terra_rl.algo.run_keys import EVAL_STREAM, INIT_STREAM, device_key, seed_key
from terra_rl.validation import small

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


# ------------------------------------------------------------------ no key used twice

# Functions of `jax.random` that only convert or describe a key; every other public function
# whose first parameter is `key` consumes it (draws from it or derives keys from it).
NOT_CONSUMERS = {"key_data", "key_impl", "wrap_key_data", "clone"}


def consumer_names() -> list[str]:
    names = []
    for name in dir(jax.random):
        function = getattr(jax.random, name)
        if name.startswith("_") or name in NOT_CONSUMERS or not callable(function):
            continue
        try:
            parameters = list(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            continue
        if parameters[:1] == ["key"]:
            names.append(name)
    return names


@pytest.fixture
def key_uses(monkeypatch):
    """Every call of a consuming `jax.random` function traced while the fixture is active
    records (function name, key words, `fold_in` data) when it runs: one record per call
    per device and per vmapped element."""
    uses: list[tuple[str, tuple[int, ...], int]] = []

    def record(name, key, data):
        uses.append((name, tuple(int(word) for word in np.asarray(key).reshape(-1)),
                     int(data)))

    def recording(name, original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            key = args[0] if args else kwargs["key"]
            words = key
            if jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
                words = jax.random.key_data(key)
            if name == "fold_in":
                data = args[1] if len(args) > 1 else kwargs["data"]
            else:
                data = 0
            jax.debug.callback(functools.partial(record, name), words,
                               jnp.asarray(data, jnp.uint32))
            return original(*args, **kwargs)

        return wrapper

    names = consumer_names()
    assert {"split", "fold_in", "randint", "uniform", "categorical"} <= set(names)
    for name in names:
        monkeypatch.setattr(jax.random, name, recording(name, getattr(jax.random, name)))
    return uses


def shared_keys(uses) -> list[tuple[tuple[int, ...], list[tuple[str, int]]]]:
    """Keys used more than once: by two calls that are not both `fold_in`, or by two
    `fold_in`s of the same data. (`fold_in(k, i)` equals `split(k)[i]` in this JAX, so a key
    that is both split and folded hands one derived key to two consumers.)"""
    by_key = collections.defaultdict(list)
    for name, key, data in uses:
        by_key[key].append((name, data))
    shared = []
    for key, calls in by_key.items():
        folds = [data for name, data in calls if name == "fold_in"]
        others = [name for name, _ in calls if name != "fold_in"]
        if len(others) > 1 or (others and folds) or len(set(folds)) < len(folds):
            shared.append((key, calls))
    return shared


def test_shared_keys_finds_a_key_split_and_folded():
    key = (0, 5)
    assert shared_keys([("split", key, 0), ("fold_in", key, 1)])
    assert shared_keys([("randint", key, 0), ("uniform", key, 0)])
    assert shared_keys([("fold_in", key, 1), ("fold_in", key, 1)])
    assert not shared_keys([("fold_in", key, 0), ("fold_in", key, 1), ("split", (0, 6), 0)])


def test_the_key_check_catches_a_runner_key_folded_from_the_reset_key(key_uses):
    """The trainer's init before the fix: the runner's key `fold_in(device_key, 1)` after a
    reset that splits `device_key` (into its reset and age keys)."""
    env = make_gymnax_env("CartPole-v1", 4)

    @jax.jit
    def old_init(device_key):
        obs, _ = env.reset(device_key, env.params, staggered=True)
        return obs, jax.random.fold_in(device_key, 1)

    jax.block_until_ready(old_init(jax.random.PRNGKey(3)))
    assert any(key == tuple(np.asarray(jax.random.PRNGKey(3)))
               for key, _ in shared_keys(key_uses))


@pytest.mark.parametrize("env_name", ["excavation", "gymnax:CartPole-v1"])
def test_no_two_consumers_of_the_init_updates_and_eval_share_a_key(key_uses, env_name):
    """The trainer's init (env reset, staggered ages, parameters, the runner's key), two
    updates (rollout actions, env steps and resets, minibatch permutations) and one eval
    (sampled actions; the eval repeats its own keys at every call by design, so one call):
    every key is consumed once."""
    from terra_rl.run.trainer import build_trainer

    if env_name == "excavation":
        config = small.smoke_config()
    else:
        config = small.smoke_config(
            env=env_name, curriculum=(), use_action_mask=False, use_compass=False,
            use_dig_distance=False, use_pose_distance=False, mask_cut_off_digs=False)
    trainer = build_trainer(config)
    runner = jax.block_until_ready(trainer.init_runner())
    init_uses = len(key_uses)
    # The reset's per-env keys, its age key, the parameters' keys.
    assert init_uses > 2 * config.num_envs_per_device
    # The runner's key is fresh: nothing in the init consumed it.
    assert tuple(np.asarray(runner.rng[0]).tolist()) not in {key for _, key, _ in key_uses}
    for _ in range(2):
        runner, _ = trainer.run_updates(runner, 1)
    jax.block_until_ready(runner)
    update_uses = len(key_uses) - init_uses
    assert update_uses > 2 * config.num_steps  # every rollout step draws actions and steps
    evaluate = trainer.compile_eval(runner)
    sampled = trainer.replicate(np.bool_(True))
    jax.block_until_ready(evaluate(runner.policy.params, trainer.run_key(),
                                   trainer.eval_env_params, sampled))
    assert len(key_uses) > init_uses + update_uses
    assert shared_keys(key_uses) == []
