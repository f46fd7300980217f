"""Curriculum, held-out evaluation maps, learning-rate annealing and the observation's mask.
The held-out evaluation itself is tested with the tiny trainer in test_trainer.py."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import CurriculumConfig, EnvConfig, ExcavationEnv
from envs import actions as A
from envs.maps import MAP_TYPES, generate_maps
from envs.state import CurriculumState
from terra_rl.adapters.train_env import ExcavationTrainEnv, held_out_maps, make_train_envs
from terra_rl.algo import ppo
from terra_rl.algo.device_axis import AXIS
from terra_rl.algo.metrics import curriculum_metrics
from terra_rl.config import ConfigError, TrainConfig, resolve
from terra_rl.validation import small


def _resolved(**changes) -> TrainConfig:
    fields = dict(small.SMOKE_FIELDS, num_devices=1, total_timesteps=1024)
    return resolve(TrainConfig(**{**fields, **changes}), jax.local_device_count())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"curriculum": ("tiny_trenches", "castles")}, "--curriculum must be a comma list"),
        ({"curriculum": ("trenches", "trenches")}, "lists a level twice"),
        ({"curriculum": ("trenches",), "curriculum_promote_after": 0},
         "--curriculum_promote_after must be >= 1"),
        ({"curriculum_demote_after": -1}, "--curriculum_demote_after must be >= 0"),
        ({"eval_map_seed": 0, "map_seed": 0}, "must be held out"),
        ({"lr_schedule": "exponential"}, "--lr_schedule must be one of"),
        ({"lr_end": 1.0}, "--lr_end must be in"),
        ({"lr_end": -1e-4}, "--lr_end must be in"),
        ({"lr_decay_updates": -1}, "--lr_decay_updates must be >= 0"),
        ({"env": "gymnax:CartPole-v1", "use_action_mask": False, "curriculum": ("trenches",)},
         "--curriculum needs --env excavation"),
    ],
)
def test_bad_curriculum_and_schedule_settings_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        _resolved(**changes)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_learning_rate_schedules_anneal_to_zero(schedule):
    config = _resolved(lr=1e-3, lr_schedule=schedule, total_timesteps=64 * 100)
    assert config.num_updates == 100
    at = lambda update: float(ppo.learning_rate_at(config, jnp.int32(update)))  # noqa: E731
    assert at(0) == pytest.approx(1e-3)
    if schedule == "constant":
        assert at(50) == at(100) == pytest.approx(1e-3)
        return
    assert at(50) == pytest.approx(5e-4, rel=1e-4)  # linear and cosine cross at half way
    assert at(100) == pytest.approx(0.0, abs=1e-9)
    assert at(25) > at(50) > at(75) > 0.0
    if schedule == "cosine":
        assert at(25) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)), rel=1e-4)
    # The optimizer follows the same schedule: one Adam step moves a parameter by ~lr.
    optimizer = ppo.make_optimizer(dataclasses.replace(config, max_grad_norm=1e9))
    params = {"w": jnp.zeros(())}
    state = optimizer.init(params)
    steps_per_update = config.update_epochs * config.num_minibatches
    for _ in range(50 * steps_per_update):
        updates, state = optimizer.update({"w": jnp.ones(())}, state, params)
    assert float(-updates["w"]) == pytest.approx(at(50), rel=0.05)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_learning_rate_schedules_reach_lr_end_after_lr_decay_updates_and_keep_it(schedule):
    # gymnax-blines' MountainCar schedule: 5e-3 down to 5e-4 over the first tenth, then flat.
    config = _resolved(lr=5e-3, lr_end=5e-4, lr_decay_updates=10, lr_schedule=schedule,
                       total_timesteps=64 * 100)
    at = lambda update: float(ppo.learning_rate_at(config, jnp.int32(update)))  # noqa: E731
    assert at(0) == pytest.approx(5e-3)
    assert at(5) == pytest.approx(2.75e-3, rel=1e-4)  # half way, for both shapes
    assert at(10) == at(50) == at(100) == pytest.approx(5e-4, rel=1e-5)
    assert at(2) > at(5) > at(8) > 5e-4


def test_held_out_maps_never_repeat_a_training_map():
    # Tiny maps with small pools: duplicates between two seeds are likely, and dropped.
    config = _resolved(map_types=("tiny_trenches",), num_maps=256, eval_episodes=64)
    env_config = EnvConfig(map_size=16)
    train = generate_maps(("tiny_trenches",), 16, 256, config.map_seed, 3)
    maps = held_out_maps(config, env_config, train)
    assert maps.count == 64
    assert (maps.map_type == MAP_TYPES.index("tiny_trenches")).all()
    train_keys = {t.tobytes() + o.tobytes() for t, o in zip(train.target_map, train.obstacles,
                                                             strict=True)}
    for target, obstacles in zip(maps.target_map, maps.obstacles, strict=True):
        assert target.tobytes() + obstacles.tobytes() not in train_keys
    unfiltered = generate_maps(("tiny_trenches",), 16, 64, config.eval_map_seed, 3)
    repeats = sum(t.tobytes() + o.tobytes() in train_keys
                  for t, o in zip(unfiltered.target_map, unfiltered.obstacles, strict=True))
    assert repeats > 0, "the pools should overlap before filtering, or this test proves nothing"


def test_curriculum_trains_on_its_levels_and_evaluates_on_map_types():
    config = _resolved(curriculum=("tiny_trenches", "trenches"), map_types=("trenches",),
                       curriculum_promote_after=3, curriculum_demote_after=4)
    train_env, eval_env = make_train_envs(config)
    spec = train_env.batch_env.env.config.curriculum
    assert spec == CurriculumConfig(("tiny_trenches", "trenches"), 3, 4)
    assert train_env.curriculum_level_names == ("tiny_trenches", "trenches")
    train_types = {MAP_TYPES[t] for t in np.asarray(train_env.params.map_type)}
    assert train_types == {"tiny_trenches", "trenches"}
    assert eval_env.batch_env.env.config.curriculum is None
    assert eval_env.curriculum_level_names == ()
    assert {MAP_TYPES[t] for t in np.asarray(eval_env.params.map_type)} == {"trenches"}
    assert eval_env.params.num_maps == config.eval_episodes


def test_curriculum_promotes_on_success_and_demotes_only_when_asked():
    def run(demote_after, outcomes):
        env = ExcavationEnv(EnvConfig(map_size=16, curriculum=CurriculumConfig(
            ("tiny_trenches", "trenches", "foundations"), promote_after=2,
            demote_after=demote_after)))
        zero = jnp.zeros((), jnp.int32)
        state = CurriculumState(zero, zero, zero)
        levels = []
        for success, timeout in outcomes:
            state = env.update_curriculum(state, jnp.bool_(success), jnp.bool_(timeout))
            levels.append(int(state.level))
        return levels

    win, lose = (True, False), (False, True)
    assert run(0, [win, win, win, lose, win, win]) == [0, 1, 1, 1, 1, 2]
    assert run(0, [win, win] + [lose] * 10) == [0] + [1] * 11  # never demoted
    assert run(3, [win, win, lose, lose, lose]) == [0, 1, 1, 1, 0]
    assert run(0, [win, win, win, win, win, win]) == [0, 1, 1, 2, 2, 2]  # capped at the top


def test_curriculum_metrics_are_level_shares_over_devices():
    class FakeEnv:
        curriculum_level_names = ("a", "b", "c")

        @staticmethod
        def curriculum_level(state):
            return state

    levels = jnp.array([[0, 0, 1, 2], [2, 2, 2, 1]], jnp.int32)  # 2 devices x 4 envs
    metrics = jax.vmap(lambda lv: curriculum_metrics(FakeEnv, lv), axis_name=AXIS)(levels)
    assert float(metrics["curriculum/a"][0]) == pytest.approx(2 / 8)
    assert float(metrics["curriculum/b"][0]) == pytest.approx(2 / 8)
    assert float(metrics["curriculum/c"][1]) == pytest.approx(4 / 8)
    assert float(metrics["curriculum/mean_level"][0]) == pytest.approx(10 / 8)

    class NoCurriculum:
        curriculum_level_names = ()

    assert curriculum_metrics(NoCurriculum, levels[0]) == {}


def test_first_maps_pick_each_envs_map(batch16, params16):
    env = ExcavationTrainEnv(batch16)
    first = jnp.arange(batch16.num_envs, dtype=jnp.int32) * 3 + 40
    _, state = jax.jit(env.reset, static_argnums=2)(jax.random.PRNGKey(0), params16, False,
                                                     first)
    np.testing.assert_array_equal(np.asarray(state.map_index),
                                  np.asarray(first) % params16.num_maps)
    assert (np.asarray(state.age) == 0).all()


def test_observation_mask_is_the_next_states_action_mask_across_resets(batch16, params16):
    """The mask an action is chosen with is the env's own `action_mask` of the state the
    action is applied to, also right after an auto-reset."""
    step_pair = small.make_step_pair(batch16)
    reset = small.make_batch_reset(batch16)
    masks = jax.jit(jax.vmap(batch16.env.action_mask))
    key = jax.random.PRNGKey(4)
    obs, state = reset(key, params16)
    resets = 0
    for index in range(24):
        np.testing.assert_array_equal(np.asarray(obs["action_mask"]), np.asarray(masks(state)))
        key_action, key_step = jax.random.split(jax.random.fold_in(key, index))
        logits = jnp.where(obs["action_mask"], 0.0, -jnp.inf)
        actions = jax.random.categorical(key_action, logits).astype(jnp.int32)
        (obs, state, _, terminated, truncated, _), _ = step_pair(key_step, state, actions,
                                                                  params16)
        resets += int(np.sum(np.asarray(terminated | truncated)))
    assert resets > 0, "the horizon must cover resets"


def test_do_nothing_is_masked_unless_configured_otherwise(batch16, params16):
    """`mask_do_nothing` (default on) masks DO_NOTHING in every state; off, it allows it in
    every state; the other seven entries do not depend on it."""
    _, state = small.make_batch_reset(batch16)(jax.random.PRNGKey(5), params16)
    one = jax.tree.map(lambda x: x[0], state)
    waiting = ExcavationEnv(dataclasses.replace(batch16.env.config, mask_do_nothing=False))
    masked = np.asarray(jax.jit(jax.vmap(batch16.env.action_mask))(state))
    assert batch16.env.config.mask_do_nothing and not masked[:, A.DO_NOTHING].any()
    assert masked[:, A.CABIN_CLOCK].all()  # so no state has every action masked
    allowed = np.asarray(jax.jit(waiting.action_mask)(one))
    assert allowed[A.DO_NOTHING]
    np.testing.assert_array_equal(allowed[: A.DO_NOTHING], masked[0, : A.DO_NOTHING])
