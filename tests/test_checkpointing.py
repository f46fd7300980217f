"""CheckpointStore: exact round trips, last-K retention, best tracking, clear errors."""

from __future__ import annotations

import logging

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax.training.train_state import TrainState

from terra_rl.run.checkpointing import DEFAULT_BEST_METRIC, CheckpointError, CheckpointStore

NUM_DEVICES = 4
BEST = DEFAULT_BEST_METRIC
CONFIG = {
    "preset": "solo_excavator",
    "lr": 3e-4,
    "num_envs_per_device": 8,
    "map_types": ["foundations", "trenches"],
    "anneal_lr": True,
    "wandb_project": None,
    "nested": {"gamma": 0.99},
}


@flax.struct.dataclass
class Counters:
    update: jax.Array
    env_steps: jax.Array


@flax.struct.dataclass
class Runner:
    train_state: TrainState
    env_state: dict
    last_obs: dict
    rng: jax.Array
    counters: Counters


# One model and optimizer, as in the trainer: TrainState's static fields are part of the treedef.
MODEL = nn.Dense(3)
TX = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(3e-4, eps=1e-5))


def make_runner(seed: int = 0) -> Runner:
    """A device-stacked runner state after one optimizer update; values depend on `seed`."""
    params = MODEL.init(jax.random.PRNGKey(seed), jnp.ones((1, 5)))
    train_state = TrainState.create(apply_fn=MODEL.apply, params=params, tx=TX)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1 * (seed + 1)), params)
    train_state = train_state.apply_gradients(grads=grads)
    runner = Runner(
        train_state=train_state,
        env_state={
            "height": jnp.arange(12, dtype=jnp.int8).reshape(3, 4) - seed,
            "age": jnp.arange(3, dtype=jnp.int16) * 300,
            "done": jnp.array([True, False, seed % 2 == 1]),
        },
        last_obs={
            "map": jnp.full((3, 4, 4), seed - 100, dtype=jnp.int8),
            "pose": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32).reshape(3, 2) * seed,
        },
        rng=jax.random.PRNGKey(seed + 7),
        counters=Counters(update=jnp.int32(seed), env_steps=jnp.int32(1000 * seed)),
    )
    stacked = jax.tree.map(lambda x: jnp.stack([x] * NUM_DEVICES), runner)
    return jax.device_get(stacked)


def assert_identical(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == np.asarray(want).tobytes()


@pytest.fixture(scope="module")
def runners():
    return [make_runner(seed) for seed in range(3)]


def test_round_trip_is_bit_identical_with_same_classes(tmp_path, runners):
    state, target = runners[1], runners[0]
    with CheckpointStore(tmp_path / "checkpoints") as store:
        assert store.save(10, state, CONFIG) is False  # no metrics: not a best candidate
        restored, config = store.restore(10, target)
    assert_identical(restored, state)
    assert config == CONFIG
    assert type(restored) is Runner and type(restored.counters) is Counters
    assert type(restored.train_state) is TrainState
    assert restored.train_state.tx is TX
    clip_state, (adam_state, _) = restored.train_state.opt_state
    assert type(clip_state) is optax.EmptyState
    assert type(adam_state) is optax.ScaleByAdamState
    assert restored.rng.dtype == np.uint32 and restored.rng.shape == (NUM_DEVICES, 2)


def test_device_arrays_save_and_restore_as_host_numpy(tmp_path, runners):
    on_device = jax.tree.map(jnp.asarray, runners[2])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), runners[0])
    with CheckpointStore(tmp_path) as store:
        store.save(1, on_device, CONFIG)
        restored, _ = store.restore(None, abstract)
    assert_identical(restored, runners[2])


def test_keep_last_keeps_only_the_newest(tmp_path, runners):
    with CheckpointStore(tmp_path, keep_last=2) as store:
        for step in range(1, 6):
            store.save(step * 10, runners[step % 3], CONFIG)
        assert store.all_steps() == [40, 50]
        assert store.latest_step() == 50
        assert store.best_step() is None
    step_dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert step_dirs == ["40", "50"]


def test_best_survives_the_window_and_only_a_better_metric_replaces_it(tmp_path, runners):
    values = {1: 0.5, 2: 0.2, 3: 0.5, 4: float("nan")}
    with CheckpointStore(tmp_path, keep_last=2) as store:
        became_best = [
            store.save(step, runners[step % 3], CONFIG, metrics={BEST: value, "loss": 1.0})
            for step, value in values.items()
        ]
        assert became_best == [True, False, False, False]  # a tie or NaN does not replace it
        assert store.all_steps() == [3, 4] and store.best_step() == 1
        assert store.metrics(1) == {BEST: 0.5, "loss": 1.0}
        restored, config = store.restore(1, runners[0])
        assert_identical(restored, runners[1])
        assert config == CONFIG
        assert store.save(5, runners[2], CONFIG, metrics={"loss": 0.1}) is False
    with CheckpointStore(tmp_path, keep_last=2) as store:  # a resumed run knows the best so far
        assert store.best_step() == 1 and store.best_value == 0.5
        assert store.save(6, runners[0], CONFIG, metrics={BEST: np.float32(0.75)}) is True
        assert store.best_step() == 6 and store.best_value == 0.75
        assert store.save(7, runners[1], CONFIG, metrics={BEST: 0.9}, best=False) is False
        assert store.save(8, runners[2], CONFIG, metrics={BEST: 0.1}, best=True) is True
        assert store.best_step() == 8 and store.all_steps() == [7, 8]
        with pytest.raises(CheckpointError, match="no checkpoint for step 1"):
            store.restore(1, runners[0])
    assert [p.name for p in (tmp_path / "best").iterdir() if p.is_dir()] == ["8"]


def test_restore_none_takes_latest_and_config_reads_alone(tmp_path, runners):
    with CheckpointStore(tmp_path) as store:
        store.save(1, runners[0], {**CONFIG, "seed": 1})
        store.save(2, runners[1], {**CONFIG, "seed": 2})
    with CheckpointStore(tmp_path) as store:  # as on resume: a fresh process reads the config first
        assert store.restore_config() == {**CONFIG, "seed": 2}
        assert store.restore_config(1)["seed"] == 1
        restored, config = store.restore(None, runners[2])
    assert_identical(restored, runners[1])
    assert config["seed"] == 2


def test_empty_directory_and_missing_step_raise(tmp_path, runners):
    with CheckpointStore(tmp_path / "checkpoints") as store:
        assert store.latest_step() is None and store.all_steps() == []
        with pytest.raises(CheckpointError, match="no checkpoint in .*checkpoints"):
            store.restore(None, runners[0])
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            store.restore_config()
        store.save(3, runners[0], CONFIG)
        with pytest.raises(CheckpointError, match=r"step 4 .*retained steps \[3\]"):
            store.restore(4, runners[0])
        with pytest.raises(CheckpointError, match="cannot save step 3"):
            store.save(3, runners[0], CONFIG)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda r: r.replace(last_obs={**r.last_obs, "map": r.last_obs["map"][:, :2]}),
            r"last_obs\.map is int8\[4, 3, 4, 4\] in the checkpoint, int8\[4, 2, 4, 4\]",
        ),
        (
            lambda r: r.replace(env_state={**r.env_state, "age": np.int32(r.env_state["age"])}),
            r"env_state\.age is int16\[4, 3\] in the checkpoint, int32\[4, 3\] in the target",
        ),
        (
            lambda r: r.replace(env_state={**r.env_state, "extra": np.zeros(2)}),
            r"env_state\.extra missing from the checkpoint",
        ),
        (
            lambda r: r.replace(last_obs={"map": r.last_obs["map"]}),
            r"last_obs\.pose in the checkpoint but not the target",
        ),
    ],
)
def test_mismatched_target_raises_one_line(tmp_path, runners, change, expected):
    with CheckpointStore(tmp_path) as store:
        store.save(1, runners[0], CONFIG)
        with pytest.raises(CheckpointError, match=expected) as error:
            store.restore(1, change(runners[0]))
    message = str(error.value)
    assert "\n" not in message and "restore_config" in message


def test_crash_before_commit_leaves_previous_latest_intact(tmp_path, runners, monkeypatch):
    def crash(self, directory):
        raise KeyboardInterrupt("killed after writing, before the rename that commits the step")

    with CheckpointStore(tmp_path) as store:
        store.save(1, runners[0], CONFIG)
        with monkeypatch.context() as patch:
            patch.setattr(ocp.handlers.StandardCheckpointHandler, "finalize", crash)
            with pytest.raises(KeyboardInterrupt):
                store.save(2, runners[1], CONFIG)
    assert not (tmp_path / "2").exists()
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == ["2.orbax-checkpoint-tmp"]
    with CheckpointStore(tmp_path) as store:  # the restarted run
        assert store.latest_step() == 1 and store.all_steps() == [1]
        restored, _ = store.restore(None, runners[2])
        assert_identical(restored, runners[0])
        store.save(2, runners[1], CONFIG)  # the stale tmp directory is removed first
        assert store.all_steps() == [1, 2]
    assert not [p for p in tmp_path.iterdir() if "tmp" in p.name]


def test_orbax_info_logs_are_silenced(tmp_path, runners, caplog):
    caplog.set_level(logging.INFO)
    with CheckpointStore(tmp_path) as store:
        store.save(1, runners[0], CONFIG)
        store.restore(1, runners[0])
    assert not [r for r in caplog.records if "orbax" in r.pathname and r.levelno < logging.WARNING]
    warning = logging.LogRecord("absl", logging.WARNING, "/x/orbax/y.py", 1, "w", None, None)
    assert all(f.filter(warning) for f in logging.getLogger("absl").filters)
