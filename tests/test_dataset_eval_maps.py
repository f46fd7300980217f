"""The held-out maps of a run, as the trainer builds them (`build_trainer`, nothing compiled)
and as `train_mixed.py` refuses them.

A dataset run (`--dataset_path` or `DATASET_PATH`) holds out the last `--eval_episodes` maps
of its dataset for evaluation and the `--eval_episodes` before them for validation, and trains
on the first `--dataset_size` (0: all) of the rest (terra_rl/config.py, `eval_map_seed` and
`validation_map_seed`; `terra_rl.adapters.train_env.dataset_pools`). A dataset too small to
leave a training map stops the run with one line and exit 2, as do generated maps that cannot
give `--eval_episodes` held-out maps unlike every training map ("could not find N evaluation
maps").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import terra_rl.cli.main
from envs.dataset import save_map_dataset
from envs.maps import MapSet, default_spawn_clearance, generate_maps
from terra_rl.adapters.train_env import excavation_env_config, held_out_pools
from terra_rl.cli.main import main
from terra_rl.config import ConfigError, get_preset, resolve
from terra_rl.run.trainer import build_trainer

MAP_SIZE = 16
TYPES = ("trenches", "foundations")
EVAL_EPISODES = 2
# Tiny shapes, no compile: the trainer is only built. cpu_small_maps has no curriculum, so a
# dataset may replace its maps.
SHAPES = dict(num_devices=1, num_envs_per_device=8, eval_episodes=EVAL_EPISODES,
              compilation_cache_dir="", wandb_mode="disabled")


@pytest.fixture
def no_training(monkeypatch):
    """A run that should stop at set-up fails the test at once if it gets to train."""
    def train(*args, **kwargs):
        raise AssertionError("the run got past set-up and trained")

    monkeypatch.setattr(terra_rl.cli.main, "train", train)


def save_dataset(path, count: int, seed: int = 5) -> MapSet:
    maps = generate_maps(TYPES, MAP_SIZE, count, seed, default_spawn_clearance(MAP_SIZE))
    save_map_dataset(maps, path, seed=seed, types=TYPES)
    return maps


def map_keys(pool) -> list[bytes]:
    """One key per map: its target and obstacles."""
    return [t.tobytes() + o.tobytes() for t, o in zip(np.asarray(pool.target_map),
                                                      np.asarray(pool.obstacles), strict=True)]


def device_row(params, row: int = 0) -> MapSet:
    """Device `row`'s map pool of a trainer's replicated env params, as a MapSet."""
    return MapSet(**{name: np.asarray(getattr(params, name))[row]
                     for name in ("target_map", "obstacles", "dumpability", "map_type",
                                  "spawn_pose")})


def part(maps: MapSet, start: int, stop: int | None = None) -> MapSet:
    return MapSet(**{name: value[start:stop] for name, value in maps.fields().items()})


def assert_same_maps(pool: MapSet, maps: MapSet) -> None:
    for name, value in maps.fields().items():
        np.testing.assert_array_equal(getattr(pool, name), value, err_msg=name)


def test_a_dataset_run_evaluates_on_its_last_maps_and_never_trains_on_them(tmp_path,
                                                                            monkeypatch):
    maps = save_dataset(tmp_path / "maps", 11)
    assert len(set(map_keys(maps))) == 11, "the dataset's maps must differ for this test"
    # The dataset as a Slurm job gives it: DATASET_PATH, no flag.
    monkeypatch.setenv("DATASET_PATH", str(tmp_path / "maps"))
    monkeypatch.delenv("DATASET_SIZE", raising=False)
    config = resolve(dataclasses.replace(get_preset("cpu_small_maps"), **SHAPES), 1)
    assert config.dataset_path == str(tmp_path / "maps")
    trainer = build_trainer(config)

    train = device_row(trainer.env_params)
    validation = device_row(trainer.validation_env_params)
    evaluation = device_row(trainer.eval_env_params)
    assert_same_maps(evaluation, part(maps, -EVAL_EPISODES))
    assert_same_maps(validation, part(maps, -2 * EVAL_EPISODES, -EVAL_EPISODES))
    assert_same_maps(train, maps.head(11 - 2 * EVAL_EPISODES))
    # Never in the training pool, nor the validation maps among the eval maps.
    assert not set(map_keys(evaluation)) & set(map_keys(train))
    assert not set(map_keys(validation)) & (set(map_keys(train)) | set(map_keys(evaluation)))
    # One eval env per held-out map: each is played once an eval.
    assert trainer.eval_env.num_envs * trainer.num_devices == evaluation.count == EVAL_EPISODES

    # --dataset_size counts training maps from the start; the held-out maps stay the last.
    sized = build_trainer(dataclasses.replace(config, dataset_size=3))
    assert_same_maps(device_row(sized.env_params), maps.head(3))
    assert_same_maps(device_row(sized.eval_env_params), evaluation)
    assert_same_maps(device_row(sized.validation_env_params), validation)


def test_the_smallest_dataset_trains_on_one_map_and_one_less_is_refused(tmp_path, capsys,
                                                                         no_training):
    """2 x --eval_episodes + 1 maps leave one training map; 2 x --eval_episodes maps leave
    none: train_mixed.py exits 2 with one line, before any run directory exists."""
    smallest = save_dataset(tmp_path / "smallest", 2 * EVAL_EPISODES + 1)
    config = resolve(dataclasses.replace(get_preset("cpu_small_maps"), **SHAPES,
                                         dataset_path=str(tmp_path / "smallest")), 1)
    trainer = build_trainer(config)
    assert_same_maps(device_row(trainer.env_params), smallest.head(1))
    assert_same_maps(device_row(trainer.eval_env_params), part(smallest, -EVAL_EPISODES))

    save_dataset(tmp_path / "too_small", 2 * EVAL_EPISODES)
    runs_dir = tmp_path / "runs"
    flags = ["--config", "cpu_small_maps", "--num_devices", "1", "--num_envs_per_device", "8",
             "--eval_episodes", str(EVAL_EPISODES), "--compilation_cache_dir", "",
             "--wandb_mode", "disabled", "--runs_dir", str(runs_dir)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([*flags, "--dataset_path", str(tmp_path / "too_small")])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert not out and err.splitlines() == [
        f"train_mixed.py: error: {tmp_path / 'too_small'} holds 4 maps: its last 2 x "
        "--eval_episodes (4) are held out for validation and evaluation and none is left to "
        "train on; lower --eval_episodes or use a larger dataset"]
    assert not runs_dir.exists()
    # A training part smaller than --dataset_size: the same, naming the maps left.
    with pytest.raises(SystemExit) as stopped:
        main([*flags, "--dataset_path", str(tmp_path / "smallest"), "--dataset_size", "2"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--dataset_size 2 exceeds the 1 maps" in err[0], err
    assert not runs_dir.exists()


def tiny_config(**changes):
    """Generated one-trench 16x16 maps: a few hundred distinct maps in all."""
    fields = dict(SHAPES, curriculum=(), map_types=("tiny_trenches",), eval_episodes=8)
    return resolve(dataclasses.replace(get_preset("cpu_demo"), **{**fields, **changes}), 1)


def test_generated_maps_without_enough_unseen_maps_stop_the_run_with_one_line(tmp_path,
                                                                               capsys,
                                                                               no_training):
    """1024 generated tiny-trench maps hold every map the eval seed gives (8, 16, 32 and 64
    tried): the run stops with exit 2 and one line, before any run directory exists."""
    runs_dir = tmp_path / "runs"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["--config", "cpu_demo", "--curriculum", "", "--map_types", "tiny_trenches",
              "--num_maps", "1024", "--eval_episodes", "8", "--num_devices", "1",
              "--num_envs_per_device", "8", "--compilation_cache_dir", "",
              "--wandb_mode", "disabled", "--runs_dir", str(runs_dir)])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert not out and err.splitlines() == [
        "train_mixed.py: error: could not find 8 evaluation maps of ('tiny_trenches',) that "
        "differ from the training pool; lower --eval_episodes or --num_maps"]
    assert not runs_dir.exists()


def key_pool(pool: dict[bytes, tuple[np.ndarray, np.ndarray]], drop=()) -> MapSet:
    """The maps of `pool` (key -> (target, obstacles)) but those keyed in `drop`, as the
    training pool `held_out_pools` reads (target and obstacles only)."""
    kept = [maps for key, maps in pool.items() if key not in drop]
    return MapSet(target_map=np.stack([t for t, _ in kept]),
                  obstacles=np.stack([o for _, o in kept]),
                  dumpability=None, map_type=None, spawn_pose=None)


def test_validation_maps_must_differ_from_the_eval_maps_too():
    """A training pool of every tiny-trench map the three seeds give but the eval seed's
    first 8 leaves exactly those for evaluation and none for validation: "could not find 8
    validation maps". Without the validation seed's maps too, both pools are found."""
    config = tiny_config()
    clearance = default_spawn_clearance(MAP_SIZE)
    # Each seed's first 64 maps: all that `held_out_pools` tries (8, 16, 32, then 64).
    train_maps, eval_maps, validation_maps = (
        generate_maps(("tiny_trenches",), MAP_SIZE, count, seed, clearance)
        for count, seed in ((512, config.map_seed), (64, config.eval_map_seed),
                            (64, config.validation_map_seed)))
    every = {}
    for maps in (train_maps, eval_maps, validation_maps):
        for index, key in enumerate(map_keys(maps)):
            every.setdefault(key, (maps.target_map[index], maps.obstacles[index]))
    first_eval = map_keys(eval_maps)[:8]
    env_config = excavation_env_config(config, training=False)
    with pytest.raises(ConfigError, match="^could not find 8 validation maps of "
                                          r"\('tiny_trenches',\) that differ"):
        held_out_pools(config, env_config, key_pool(every, drop=first_eval))

    validation_keys = set(map_keys(validation_maps))
    train = key_pool(every, drop=set(first_eval) | validation_keys)
    validation, evaluation = held_out_pools(config, env_config, train)
    assert map_keys(evaluation) == first_eval
    assert set(map_keys(validation)) <= validation_keys - set(first_eval)
    assert len(map_keys(validation)) == 8

    # Even from the eval seed itself (the config refuses it; the pools do not rely on that),
    # the validation maps are the next ones, not the eval maps again.
    same_seed = dataclasses.replace(config, map_types=("trenches",),
                                    validation_map_seed=config.eval_map_seed)
    validation, evaluation = held_out_pools(same_seed, env_config, train)
    generated = generate_maps(("trenches",), MAP_SIZE, 16, config.eval_map_seed, clearance)
    assert map_keys(evaluation) == map_keys(generated)[:8]
    assert map_keys(validation) == map_keys(generated)[8:]
