"""The environments the trainer runs, behind one interface.

A train env implements `terra_rl.adapters.contract.TrainEnv`: `step(key, state, actions,
params) -> (state, StepResult)` with auto-reset and the pre-reset `final_observation`, and
`reset`, `observation_spec`, `episode_age`, `episode_group`, `curriculum_level`.
`ExcavationTrainEnv` wraps `envs.BatchEnv`; `terra_rl.adapters.gymnax_env.GymnaxBatchEnv` wraps
gymnax environments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import BatchEnv, CurriculumConfig, EnvConfig, ExcavationEnv, RewardConfig
from envs.actions import NUM_ACTIONS, TRACKED_ACTION_NAMES, WHEELED_ACTION_NAMES
from envs.dataset import load_map_dataset, validate_map_set
from envs.maps import MAP_TYPES, MapSet, generate_maps
from envs.params import make_env_params, params_from_maps
from terra_rl.adapters.contract import StepResult, checked_step_result, observation_spec_of
from terra_rl.config import ConfigError, TrainConfig

AGENT_TYPE_NAMES = ("tracked", "wheeled")


class ExcavationTrainEnv:
    """`BatchEnv` with the trainer's interface. Episode groups are (map type, agent type)
    pairs, named `<map type>/<agent type>`."""

    has_success = True
    group_names = tuple(f"{m}/{a}" for m in MAP_TYPES for a in AGENT_TYPE_NAMES)

    def __init__(self, batch_env: BatchEnv, reference_resets: bool = False):
        """`reference_resets` steps with `BatchEnv.step_reference` (every env reset
        unconditionally, the parity reference) instead of `BatchEnv.step`."""
        self.batch_env = batch_env
        self._batch_step = batch_env.step_reference if reference_resets else batch_env.step
        self.num_envs = batch_env.num_envs
        self.num_actions = NUM_ACTIONS
        self.action_names = action_names(batch_env.env.config.wheeled_fraction)
        self.max_steps = batch_env.env.config.max_steps
        # An episode truncates at max_steps or after stall_steps without progress, each
        # counted from its reset (only the first, staggered episode starts older).
        stall_steps = batch_env.env.config.stall_steps
        self.truncation_period = min(self.max_steps, stall_steps or self.max_steps)
        self.params = batch_env.params
        curriculum = batch_env.env.config.curriculum
        self.curriculum_level_names = curriculum.levels if curriculum else ()

    def reset(self, key: jax.Array, params, staggered: bool = True, first_maps=None):
        """`first_maps` (int32 [num_envs], taken modulo the pool size) picks each env's
        first map instead of sampling."""
        if first_maps is not None:
            first_maps = first_maps % params.num_maps
        obs, state = self.batch_env.reset(key, params, first_maps)
        if not staggered:
            state = state.replace(age=jnp.zeros_like(state.age))
        return obs, state

    def observation_spec(self):
        return observation_spec_of(self)

    def step(self, key, state, actions, params) -> tuple[object, StepResult]:
        """`BatchEnv.step` as (state, `StepResult`); `info` keeps the env's other entries
        (`reward_terms`, `curriculum_level`, ...)."""
        obs, state, reward, terminated, truncated, info = self._batch_step(
            key, state, actions, params)
        final_observation = info.pop("final_observation")
        result = StepResult(obs, reward, terminated, truncated, final_observation, info)
        return state, checked_step_result(result, self.num_envs, self.num_actions)

    def episode_age(self, state) -> jax.Array:
        return state.age

    def episode_group(self, state, params) -> jax.Array:
        """int32 [num_envs]: `map_type * 2 + agent_type` of each env's current episode."""
        map_type = params.map_type[state.map_index].astype(jnp.int32)
        return map_type * len(AGENT_TYPE_NAMES) + state.agent.agent_type

    def curriculum_level(self, state) -> jax.Array:
        return state.curriculum.level


def action_names(wheeled_fraction: float) -> tuple[str, ...]:
    """Names of the 8 actions; in a mixed batch an index means different things per type."""
    if wheeled_fraction == 0.0:
        return TRACKED_ACTION_NAMES
    if wheeled_fraction == 1.0:
        return WHEELED_ACTION_NAMES
    return tuple(
        t if t == w else f"{t}_OR_{w}"
        for t, w in zip(TRACKED_ACTION_NAMES, WHEELED_ACTION_NAMES, strict=True)
    )


def excavation_env_config(config: TrainConfig, *, training: bool = True) -> EnvConfig:
    """The env of training (with the curriculum, if any) or of evaluation (without)."""
    curriculum = None
    if training and config.curriculum:
        curriculum = CurriculumConfig(
            levels=config.curriculum,
            promote_after=config.curriculum_promote_after,
            demote_after=config.curriculum_demote_after,
        )
    return EnvConfig(
        map_size=config.map_size,
        max_steps=config.max_steps,
        wheeled_fraction=config.wheeled_fraction,
        reward=reward_config(config),
        curriculum=curriculum,
        compute_action_mask=config.use_action_mask,
        stall_steps=config.stall_steps if training else 0,
        drivable_soil_height=config.drivable_soil_height,
        dig_before_pickup=config.dig_before_pickup,
        pickup_misplaced_only=config.pickup_misplaced_only,
        mask_dead_end_digs=config.mask_dead_end_digs,
        mask_dead_end_pickups=config.mask_dead_end_pickups,
        dump_after_full_turn=config.dump_after_full_turn,
        mask_cut_off_digs=config.mask_cut_off_digs,
        mask_dump_outside_zones=config.mask_dump_outside_zones,
        mask_cut_off_dumps=config.mask_cut_off_dumps,
        remember_refused_digs=config.remember_refused_digs,
        revisit_memory=config.revisit_memory,
    )


def reward_config(config: TrainConfig) -> RewardConfig:
    """The env's reward: dense or sparse, its progress shaping paid under the run's gamma
    (`TrainConfig.discounted_shaping`) or undiscounted."""
    discount = config.gamma if config.discounted_shaping else 1.0
    if config.reward == "dense":
        return RewardConfig(discount=discount)
    return RewardConfig.sparse(discount)


def make_train_envs(config: TrainConfig):
    """(train env with `num_envs_per_device` envs, eval env with `eval_envs_per_device`)
    for one device. Excavation: the training pool holds the curriculum's levels (or
    `map_types`); the eval env runs `map_types` on a held-out pool (`held_out_pools`)
    without a curriculum, and each eval env starts on a map of its own. The eval env's
    `validation_params` hold the validation pool, laid out like its `params` (gymnax: the
    same params; its validation episodes differ by their key)."""
    if config.is_gymnax:
        from terra_rl.adapters.gymnax_env import make_gymnax_env, parse_env_id

        env_id = parse_env_id(config.env)
        scale = config.gymnax_scale_observations
        eval_env = make_gymnax_env(env_id, config.eval_envs_per_device,
                                   scale_observations=scale)
        eval_env.validation_params = eval_env.params
        return (
            make_gymnax_env(env_id, config.num_envs_per_device, config.gymnax_timeouts_terminal,
                            scale),
            eval_env,
        )
    env = ExcavationEnv(excavation_env_config(config))
    eval_env = ExcavationEnv(excavation_env_config(config, training=False))
    if config.dataset_path:
        train_maps, validation_maps, eval_maps = dataset_pools(config)
        validate_map_set(train_maps, env.config.spawn_clearance, source=config.dataset_path)
        params = params_from_maps(train_maps)
    else:
        params = make_env_params(env.config, map_types=config.curriculum or config.map_types,
                                 num_maps=config.num_maps, seed=config.map_seed)
        validation_maps, eval_maps = held_out_pools(config, eval_env.config, params)
    eval_train_env = ExcavationTrainEnv(
        BatchEnv(eval_env, params_from_maps(eval_maps), config.eval_envs_per_device))
    eval_train_env.validation_params = params_from_maps(validation_maps)
    return ExcavationTrainEnv(BatchEnv(env, params, config.num_envs_per_device)), eval_train_env


def dataset_pools(config: TrainConfig) -> tuple[MapSet, MapSet, MapSet]:
    """(training, validation, eval) maps of a dataset run: the dataset's last
    `eval_episodes` maps are the eval pool, the `eval_episodes` before them the validation
    pool, and training takes the first `dataset_size` (0: all) of the rest."""
    maps = load_map_dataset(config.dataset_path)
    if maps.size != config.map_size:
        raise ConfigError(
            f"{config.dataset_path}: maps are {maps.size}x{maps.size} but --map_size is "
            f"{config.map_size}; set --map_size {maps.size} or pick another dataset")
    held_out = 2 * config.eval_episodes
    trainable = maps.count - held_out
    if trainable < 1:
        raise ConfigError(
            f"{config.dataset_path} holds {maps.count} maps: its last 2 x --eval_episodes "
            f"({held_out}) are held out for validation and evaluation and none is left to "
            "train on; lower --eval_episodes or use a larger dataset")
    if config.dataset_size > trainable:
        raise ConfigError(
            f"--dataset_size {config.dataset_size} exceeds the {trainable} maps of "
            f"{config.dataset_path} left to train on (its last {held_out} are held out for "
            "validation and evaluation); lower it")
    count = config.dataset_size or trainable
    fields = maps.fields()

    def part(start: int, stop: int) -> MapSet:
        return MapSet(**{name: value[start:stop] for name, value in fields.items()})

    return (part(0, count), part(trainable, trainable + config.eval_episodes),
            part(trainable + config.eval_episodes, maps.count))


def held_out_pools(config: TrainConfig, env_config: EnvConfig,
                   train_params) -> tuple[MapSet, MapSet]:
    """(validation, eval) maps: `eval_episodes` maps of `map_types` each, generated from
    `validation_map_seed` and `eval_map_seed`. The eval pool holds no map of the training
    pool; the validation pool none of either (duplicates, likely only among tiny maps, are
    dropped and replaced)."""
    seen = {
        _map_key(t, o)
        for t, o in zip(np.asarray(train_params.target_map),
                        np.asarray(train_params.obstacles), strict=True)
    }
    eval_maps = _distinct_maps(config, env_config, config.eval_map_seed, seen, "evaluation")
    seen |= {_map_key(t, o) for t, o in zip(eval_maps.target_map, eval_maps.obstacles,
                                            strict=True)}
    validation = _distinct_maps(config, env_config, config.validation_map_seed, seen,
                                "validation")
    return validation, eval_maps


def held_out_maps(config: TrainConfig, env_config: EnvConfig, train_params) -> MapSet:
    """The eval pool of `held_out_pools`."""
    return held_out_pools(config, env_config, train_params)[1]


def _distinct_maps(config: TrainConfig, env_config: EnvConfig, seed: int, seen: set,
                   role: str) -> MapSet:
    """`eval_episodes` maps of `map_types` from `seed`, none in `seen`."""
    count = config.eval_episodes
    generated = count
    for _ in range(4):
        maps = generate_maps(config.map_types, env_config.map_size, generated, seed,
                             env_config.spawn_clearance)
        keep = np.array([_map_key(t, o) not in seen
                         for t, o in zip(maps.target_map, maps.obstacles, strict=True)])
        if keep.sum() >= count:
            chosen = np.flatnonzero(keep)[:count]
            return MapSet(**{name: value[chosen] for name, value in maps.fields().items()})
        generated *= 2
    raise ConfigError(
        f"could not find {count} {role} maps of {config.map_types} that differ from the "
        "training pool; lower --eval_episodes or --num_maps"
    )


def _map_key(target_map: np.ndarray, obstacles: np.ndarray) -> bytes:
    return target_map.tobytes() + obstacles.tobytes()
