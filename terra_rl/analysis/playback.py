"""A trained policy from a run directory, played on its held-out maps
(`scripts/play_episode.py --checkpoint RUN_DIR`).

The policy is the checkpoint's parameters (device 0's; every device holds the same) in the
network of the run's own `config.json`; the env is the run's evaluation env (no stall limit)
over the held-out pool the run evaluated on, so map `i` here is eval episode `i` there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.env import ExcavationEnv
from envs.state import EnvParams
from terra_rl.adapters.train_env import make_train_envs
from terra_rl.algo.update import policy_outputs
from terra_rl.config import ConfigError, TrainConfig, config_from_dict, resolve
from terra_rl.nets.models import make_policy
from terra_rl.run.checkpointing import CheckpointError, checkpoint_state_path
from terra_rl.run.run_dir import CHECKPOINTS_DIR, RunDirError, open_run_dir
from terra_rl.run.trainer import policy_config


class PlaybackError(ValueError):
    """A run directory whose policy cannot be played; the message says why."""


@dataclasses.dataclass(frozen=True)
class TrainedPolicy:
    config: TrainConfig
    step: int
    """The checkpoint's update."""
    env: ExcavationEnv
    env_params: EnvParams
    """The run's held-out evaluation pool (`eval_episodes` maps)."""
    policy: Any
    """The network (`terra_rl.nets.models`); its pose distance serves either agent type."""
    act: Callable
    """`act(key, obs, sample bool) -> int32 []`: greedy (argmax of the masked logits) or
    sampled action for one unbatched observation."""

    @property
    def num_maps(self) -> int:
        return int(self.env_params.target_map.shape[0])


def load_trained_policy(run_dir: str | Path, checkpoint: str = "latest") -> TrainedPolicy:
    """`checkpoint`: "latest", "best" or an update number."""
    try:
        run_dir, saved = open_run_dir(run_dir)
        config = config_from_dict(saved)
    except (RunDirError, ConfigError) as error:
        raise PlaybackError(str(error)) from None
    if config.env != "excavation":
        raise PlaybackError(f"{run_dir} trained on {config.env}; --checkpoint plays "
                            "excavation runs only")
    # One device plays; every device of the run holds the same parameters.
    config = resolve(dataclasses.replace(config, num_devices=1), 1)
    state_path, step = _state_path(run_dir / CHECKPOINTS_DIR, checkpoint)
    import orbax.checkpoint as ocp

    raw = ocp.StandardCheckpointer().restore(state_path)
    variables = jax.tree.map(lambda leaf: np.asarray(leaf)[0], raw["policy"]["params"])
    _, eval_env = make_train_envs(config)
    env = eval_env.batch_env.env
    example_obs, _ = jax.eval_shape(lambda key: eval_env.reset(key, eval_env.params),
                                    jax.random.PRNGKey(0))
    # A caller may play either agent type, whatever the run trained.
    network = dataclasses.replace(policy_config(config), wheeled_agents=True)
    policy = make_policy(network, eval_env.num_actions, example_obs)

    @jax.jit
    def act(key, obs, sample):
        batched = jax.tree.map(lambda x: x[None], obs)
        logits, _ = policy_outputs(policy, variables, batched, config.use_action_mask)
        greedy = jnp.argmax(logits[0])
        return jnp.where(sample, jax.random.categorical(key, logits[0]), greedy).astype(jnp.int32)

    trained = TrainedPolicy(config, step, env, eval_env.params, policy, act)
    obs, _ = jax.jit(env.reset)(jax.random.PRNGKey(0), trained.env_params)
    try:
        act(jax.random.PRNGKey(0), obs, False)
    except (ValueError, TypeError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PlaybackError(f"checkpoint {step} of {run_dir} does not fit the network of its "
                            f"config.json ({first})") from None
    return trained


def _state_path(checkpoints: Path, checkpoint: str) -> tuple[Path, int]:
    try:
        return checkpoint_state_path(checkpoints, checkpoint, "--checkpoint-step")
    except CheckpointError as error:
        raise PlaybackError(str(error)) from None
