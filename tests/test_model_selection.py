"""Honest model selection: the best checkpoint is chosen on a validation pool of its own, the
reported eval pool chooses nothing, and a dataset run holds out the end of its dataset."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envs.dataset import save_map_dataset
from envs.maps import generate_maps
from terra_rl.adapters.train_env import dataset_pools, make_train_envs
from terra_rl.algo import run_keys
from terra_rl.algo.evaluation import validation_names
from terra_rl.config import ConfigError, config_from_dict, get_preset, resolve

MAP_SIZE = 16


def small_config(**changes):
    base = dataclasses.replace(get_preset("cpu_small_maps"), num_envs_per_device=8,
                               eval_episodes=4, num_maps=16)
    return resolve(dataclasses.replace(base, **changes), 1)


def map_keys(params) -> list[bytes]:
    return [t.tobytes() + o.tobytes() for t, o in zip(np.asarray(params.target_map),
                                                      np.asarray(params.obstacles), strict=True)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 generated 16x16 maps saved as a dataset (path, maps)."""
    maps = generate_maps(("trenches", "foundations"), MAP_SIZE, 12, seed=7, spawn_clearance=3)
    path = tmp_path_factory.mktemp("dataset") / "maps"
    save_map_dataset(maps, path, seed=7, types=("trenches", "foundations"))
    return path, maps


def test_a_dataset_run_holds_out_its_last_maps_for_validation_and_evaluation(dataset):
    path, maps = dataset
    config = small_config(dataset_path=str(path), eval_episodes=2)
    train, validation, evaluation = dataset_pools(config)
    np.testing.assert_array_equal(train.target_map, maps.target_map[:8])
    np.testing.assert_array_equal(validation.target_map, maps.target_map[8:10])
    np.testing.assert_array_equal(evaluation.target_map, maps.target_map[10:12])
    # --dataset_size counts training maps, from the start; the held-out maps stay the same.
    sized = dataset_pools(dataclasses.replace(config, dataset_size=5))
    np.testing.assert_array_equal(sized[0].target_map, maps.target_map[:5])
    np.testing.assert_array_equal(sized[2].target_map, maps.target_map[10:12])

    # The envs: --eval_map_seed applies to generated maps only.
    for seed in (config.eval_map_seed, 12345):
        train_env, eval_env = make_train_envs(dataclasses.replace(config, eval_map_seed=seed))
        np.testing.assert_array_equal(np.asarray(train_env.params.target_map),
                                      maps.target_map[:8])
        np.testing.assert_array_equal(np.asarray(eval_env.params.target_map),
                                      maps.target_map[10:12])
        np.testing.assert_array_equal(np.asarray(eval_env.validation_params.target_map),
                                      maps.target_map[8:10])


def test_a_dataset_too_small_for_its_held_out_maps_is_refused(dataset):
    path, _ = dataset
    with pytest.raises(ConfigError, match="none is left to train on"):
        dataset_pools(small_config(dataset_path=str(path), eval_episodes=6))
    with pytest.raises(ConfigError, match="exceeds the 8 maps"):
        dataset_pools(small_config(dataset_path=str(path), eval_episodes=2, dataset_size=9))


def test_generated_validation_maps_are_neither_training_nor_evaluation_maps():
    config = small_config()
    train_env, eval_env = make_train_envs(config)
    train, evaluation = set(map_keys(train_env.params)), map_keys(eval_env.params)
    validation = map_keys(eval_env.validation_params)
    assert len(validation) == len(evaluation) == config.eval_episodes
    assert not set(validation) & (train | set(evaluation))
    assert not set(evaluation) & train
    # Its own seed: another seed gives other validation maps and the same eval maps.
    _, other = make_train_envs(dataclasses.replace(config, validation_map_seed=99))
    assert map_keys(other.validation_params) != validation
    assert map_keys(other.params) == evaluation


def test_the_best_checkpoint_is_chosen_on_the_validation_pool_by_default():
    assert small_config().best_metric == "validation/completion_rate"
    gymnax = resolve(dataclasses.replace(get_preset("cpu_demo"), env="gymnax:CartPole-v1",
                                         use_action_mask=False, use_dig_distance=False,
                                         use_pose_distance=False, use_compass=False,
                                         curriculum=(), mask_cut_off_digs=False), 1)
    assert gymnax.best_metric == "validation/first_episode_return"
    # A run saved when the eval pool chose the checkpoint chooses on validation on resume.
    saved = small_config(best_metric="").to_dict()
    for old in ("eval/completion_rate", "eval_sampled/rewards"):
        saved["best_metric"] = old
        assert config_from_dict(saved).best_metric == "validation/" + old.split("/", 1)[1]


def test_validation_metrics_are_named_apart_and_keyed_apart():
    metrics = {"eval/completion_rate": 0.5, "eval/completion_rate/trenches/tracked": 1.0}
    assert validation_names(metrics) == {"validation/completion_rate": 0.5,
                                         "validation/completion_rate/trenches/tracked": 1.0}
    for seed in (0, 3, 2**32 + 5):
        validation, reported = run_keys.validation_key(seed), run_keys.seed_key(seed)
        assert validation.dtype == np.uint32 and validation.shape == (2,)
        assert validation[1] == reported[1] and validation[0] != reported[0]
