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
        reward=RewardConfig() if config.reward == "dense" else RewardConfig.sparse(),
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


def make_train_envs(config: TrainConfig):
    """(train env with `num_envs_per_device` envs, eval env with `eval_envs_per_device`)
    for one device. Excavation: the training pool holds the curriculum's levels (or
    `map_types`); the eval env runs `map_types` on a held-out pool (`held_out_maps`) without
    a curriculum, and each eval env starts on a map of its own."""
    if config.is_gymnax:
        from terra_rl.adapters.gymnax_env import make_gymnax_env, parse_env_id

        env_id = parse_env_id(config.env)
        scale = config.gymnax_scale_observations
        return (
            make_gymnax_env(env_id, config.num_envs_per_device, config.gymnax_timeouts_terminal,
                            scale),
            make_gymnax_env(env_id, config.eval_envs_per_device, scale_observations=scale),
        )
    env = ExcavationEnv(excavation_env_config(config))
    params = make_env_params(
        env.config,
        map_types=config.curriculum or config.map_types,
        num_maps=config.num_maps,
        seed=config.map_seed,
        dataset_path=config.dataset_path or None,
        dataset_size=config.dataset_size or None,
    )
    eval_env = ExcavationEnv(excavation_env_config(config, training=False))
    eval_maps = held_out_maps(config, eval_env.config, params)
    return (
        ExcavationTrainEnv(BatchEnv(env, params, config.num_envs_per_device)),
        ExcavationTrainEnv(
            BatchEnv(eval_env, params_from_maps(eval_maps), config.eval_envs_per_device)
        ),
    )


def held_out_maps(config: TrainConfig, env_config: EnvConfig, train_params) -> MapSet:
    """`eval_episodes` maps of `map_types` from `eval_map_seed`, none equal to a map of the
    training pool (duplicates, likely only among tiny maps, are dropped and replaced)."""
    count = config.eval_episodes
    seen = {
        _map_key(t, o)
        for t, o in zip(np.asarray(train_params.target_map),
                        np.asarray(train_params.obstacles), strict=True)
    }
    generated = count
    for _ in range(4):
        maps = generate_maps(config.map_types, env_config.map_size, generated,
                             config.eval_map_seed, env_config.spawn_clearance)
        keep = np.array([_map_key(t, o) not in seen
                         for t, o in zip(maps.target_map, maps.obstacles, strict=True)])
        if keep.sum() >= count:
            chosen = np.flatnonzero(keep)[:count]
            return MapSet(**{name: value[chosen] for name, value in maps.fields().items()})
        generated *= 2
    raise ConfigError(
        f"could not find {count} evaluation maps of {config.map_types} that differ from the "
        "training pool; lower --eval_episodes or --num_maps"
    )


def _map_key(target_map: np.ndarray, obstacles: np.ndarray) -> bytes:
    return target_map.tobytes() + obstacles.tobytes()
