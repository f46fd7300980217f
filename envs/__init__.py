"""Excavation gridworld in pure JAX: single env, batched env with fast resets, maps."""

from envs.batch import BatchEnv
from envs.config import CurriculumConfig, EnvConfig, RewardConfig
from envs.env import ExcavationEnv
from envs.params import make_env_params, params_from_maps
from envs.state import AgentState, EnvParams, EnvState

__all__ = [
    "AgentState",
    "BatchEnv",
    "CurriculumConfig",
    "EnvConfig",
    "EnvParams",
    "EnvState",
    "ExcavationEnv",
    "RewardConfig",
    "make_env_params",
    "params_from_maps",
]
