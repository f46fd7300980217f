"""The tiny shapes every gate (and the pytest suite, through `tests/conftest.py`) shares, built
once per process, and the compiled functions the gates reuse.

Two families:
- the environment family: 16x16 foundations and trenches maps, tracked and wheeled
  excavators (half each), episodes of 40 steps, 16 envs (`small_env`, `small_batch`);
- the training family: `tests/test_trainer.py`'s tiny config (16x16 trench maps, action mask
  on, 8 envs x 8 steps, episodes of 12 steps, a 32-wide network, float32) on one device
  (`smoke_config`, the first-update smoke) and its policy (`smoke_policy`), fed with
  observations of the env family (`small_train_env`: same shapes, no extra compile).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import BatchEnv, EnvConfig, ExcavationEnv, params_from_maps
from envs import actions as A
from envs.dataset import load_map_dataset
from envs.maps import generate_maps
from envs.state import EnvParams, EnvState

SMALL_ENV_CONFIG = EnvConfig(map_size=16, max_steps=40, wheeled_fraction=0.5)
SMALL_MAP_TYPES = ("foundations", "trenches")
SMALL_NUM_MAPS = 32
SMALL_MAP_SEED = 1
SMALL_NUM_ENVS = 16
ROLLOUT_STEPS = 80  # x 16 envs = 1280 visited states
ROLLOUT_SEED = 7

SMOKE_FIELDS = dict(
    map_size=16,
    map_types=("trenches",),
    curriculum=("tiny_trenches", "trenches"),
    map_encoder="flat",
    use_compass=True,
    use_dig_distance=True,
    use_pose_distance=True,
    mask_cut_off_digs=True,
    stall_steps=64,
    use_action_mask=True,
    max_steps=12,
    num_maps=16,
    num_envs_per_device=8,
    num_steps=8,
    update_epochs=1,
    num_minibatches=2,
    map_feature_dim=32,
    hidden_dim=32,
    precision="float32",
    eval_episodes=8,
    compilation_cache_dir="",
    wandb_mode="disabled",
    preset="tiny",
)
"""The tiny training config of tests/test_trainer.py, the first-update gates and the
runtime preflight's train smoke: timeouts (12 steps) inside every 8-step rollout. Its maps,
curriculum, encoder, compass, dig and pose distances, cut-off mask and stall limit are
cpu_demo's, so
CLI tests on that preset share its compiles."""

PLAIN_ENV_FLAGS = ("--disable_compass", "--disable_dig_distance", "--disable_pose_distance",
                   "--disable_mask_cut_off_digs")
"""train_mixed.py flags that turn off the costly inputs and the cut-off mask of cpu_demo's
env, for the tests of the trainer's mechanics (processes, signals, the profiler's report),
which these parts do not touch: at the tiny shapes and the suite's -O0 they take the
update's compile from 21 s to 12 s (docs/PERFORMANCE.md)."""


# --------------------------------------------------------------------------- env family


@functools.cache
def small_env() -> ExcavationEnv:
    return ExcavationEnv(SMALL_ENV_CONFIG)


@functools.cache
def small_params() -> EnvParams:
    """32 generated maps (never a dataset from the environment: the shapes are fixed)."""
    config = SMALL_ENV_CONFIG
    maps = generate_maps(
        SMALL_MAP_TYPES, config.map_size, SMALL_NUM_MAPS, SMALL_MAP_SEED, config.spawn_clearance
    )
    return params_from_maps(maps)


@functools.cache
def small_batch() -> BatchEnv:
    return BatchEnv(small_env(), small_params(), SMALL_NUM_ENVS)


@functools.cache
def dataset_batch(dataset_path: str, dataset_size: int | None) -> BatchEnv:
    """The env family's batch on the first `dataset_size` maps of a dataset (any map size)."""
    maps = load_map_dataset(dataset_path, max_maps=dataset_size)
    env = ExcavationEnv(dataclasses.replace(SMALL_ENV_CONFIG, map_size=maps.size))
    return BatchEnv(env, params_from_maps(maps), SMALL_NUM_ENVS)


def varied_observations() -> dict:
    """Real reset observations of 4 envs (2 tracked, 2 wheeled) of `small_batch`, edited to
    show a loaded bucket, both wheel angles, a turned cabin and a few last actions (numpy)."""
    obs, _ = make_batch_reset(small_batch())(jax.random.PRNGKey(0), small_params())
    obs = jax.tree.map(lambda x: np.asarray(x[np.array([0, 1, 14, 15])]), obs)
    agent_state = obs["agent_state"].copy()
    agent_state[1, 5] = 3  # loaded
    agent_state[2, 4] = -1  # wheel angle
    agent_state[3, 4] = 1
    agent_state[0, 3] = 5  # cabin heading
    last_actions = obs["last_actions"].copy()
    last_actions[:, 0] = [A.FORWARD, A.DO, A.WHEELS_LEFT, A.CABIN_CLOCK]
    return {**obs, "agent_state": agent_state, "last_actions": last_actions}


@functools.cache
def make_step_pair(batch: BatchEnv):
    """Jitted `(key, state, actions, params) -> (fast step, reference step)` of a batch: one
    compile serves the rollouts (which use the fast step) and the reset parity gates."""
    return jax.jit(lambda *args: (batch.step(*args), batch.step_reference(*args)))


@functools.cache
def make_batch_reset(batch: BatchEnv):
    return jax.jit(batch.reset)


@struct.dataclass
class Rollout:
    """A random rollout of a `BatchEnv`.

    states:     EnvState with leading [num_steps, num_envs]: the state each action was taken in
    done:       bool [num_steps, num_envs] terminated | truncated
    terminated: bool [num_steps, num_envs]
    progress:   float32 [num_steps, num_envs] `info["episode_progress"]` after the step
    """

    states: EnvState
    done: jax.Array
    terminated: jax.Array
    progress: jax.Array

    def flat_states(self) -> EnvState:
        """The visited states with one flat leading axis [num_steps * num_envs]."""
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), self.states)


def _rollout_actions(num_envs: int, key: jax.Array, loaded: jax.Array) -> jax.Array:
    """DO with probability 50% when empty and 10% when loaded, else a uniform action."""
    key_action, key_do = jax.random.split(key)
    uniform = jax.random.randint(key_action, (num_envs,), 0, A.NUM_ACTIONS)
    do = jax.random.uniform(key_do, (num_envs,)) < jnp.where(loaded > 0, 0.1, 0.5)
    return jnp.where(do, A.DO, uniform).astype(jnp.int32)


def random_rollout(batch: BatchEnv, params: EnvParams, key: jax.Array, num_steps: int) -> Rollout:
    """`num_steps` steps of `batch` from a reset: the trainer's rollout
    (`terra_rl.algo.rollout`) over the env's adapter, with a random policy that favours DO
    when empty and holds the load for a while, so that loaded agents, dug ground and dumped
    soil show up often, alongside blocked moves near obstacles and map edges."""
    return _make_random_rollout(batch, num_steps)(key, params)


@functools.cache
def _make_random_rollout(batch: BatchEnv, num_steps: int):
    from terra_rl.adapters.train_env import ExcavationTrainEnv
    from terra_rl.algo.rollout import Choice, RolloutCarry, Step, rollout

    env = ExcavationTrainEnv(batch)

    def choose(_, obs, step_key) -> Choice:
        key_action, key_step = jax.random.split(step_key)
        loaded = obs["agent_state"][:, 5]  # AgentState.loaded, as the observation shows it
        return Choice(_rollout_actions(batch.num_envs, key_action, loaded), key_step)

    def record(_, step: Step):
        result = step.result
        return None, (step.env_state, result.terminated | result.truncated, result.terminated,
                      result.info["episode_progress"])

    @jax.jit
    def run(key, params) -> Rollout:
        key_reset, key_run = jax.random.split(key)
        obs, state = batch.reset(key_reset, params)
        carry = RolloutCarry(state, obs, None)
        _, (states, done, terminated, progress) = rollout(
            env, params, choose, record, carry, jax.random.split(key_run, num_steps))
        return Rollout(states, done, terminated, progress)

    return run


@functools.cache
def small_rollout() -> Rollout:
    """`ROLLOUT_STEPS` random steps of `small_batch` (computed once per process)."""
    return random_rollout(
        small_batch(), small_params(), jax.random.PRNGKey(ROLLOUT_SEED), ROLLOUT_STEPS
    )


@functools.cache
def make_mask_and_effect(env: ExcavationEnv):
    """Jitted `check(states [S]) -> (valid bool [S, 8], mask bool [S, 8], effect bool
    [S, 8])`: the analytic valid actions, the action mask (valid actions less revisits), and
    whether each action really changes the agent or a map when stepped."""

    def changed(before: EnvState, after: EnvState) -> jax.Array:
        fields = lambda s: (  # noqa: E731
            s.agent.pos,
            s.agent.base_heading,
            s.agent.cabin_heading,
            s.agent.wheel_angle,
            s.agent.loaded,
            s.action_map,
            s.dumpability,
        )
        pairs = zip(fields(before), fields(after), strict=True)
        return jnp.any(jnp.stack([jnp.any(a != b) for a, b in pairs]))

    def check(state):
        def effect(action):
            _, after, *_ = env.step_no_reset(None, state, action, None)
            return changed(state, after)

        effects = jax.vmap(effect)(jnp.arange(A.NUM_ACTIONS))
        return env.valid_actions(state), env.action_mask(state), effects

    return jax.jit(jax.vmap(check))


@functools.cache
def make_batched_step(env: ExcavationEnv):
    """Jitted `step(keys [B], states [B], actions [B], params)`: `step_no_reset` vmapped."""
    return jax.jit(jax.vmap(env.step_no_reset, in_axes=(0, 0, 0, None)))


# --------------------------------------------------------------------------- training family


def smoke_config(**changes):
    """The resolved tiny training config on one device, covering two updates."""
    from terra_rl.config import TrainConfig, resolve

    steps_per_update = SMOKE_FIELDS["num_envs_per_device"] * SMOKE_FIELDS["num_steps"]
    fields = dict(SMOKE_FIELDS, num_devices=1, total_timesteps=2 * steps_per_update)
    return resolve(TrainConfig(**{**fields, **changes}), jax.local_device_count())


@functools.cache
def small_train_env():
    """`small_batch` behind the trainer's env interface (`ExcavationTrainEnv`), so policy
    gates see real observations without compiling another env."""
    from terra_rl.adapters.train_env import ExcavationTrainEnv

    return ExcavationTrainEnv(small_batch())


@functools.cache
def small_observations(num_steps: int = 3) -> tuple[dict, EnvState]:
    """Observations of `small_train_env` from a reset and `num_steps` random allowed actions:
    (obs pytree [(num_steps + 1) * num_envs, ...], the env state after the last step)."""
    env = small_train_env()
    step = make_step_pair(env.batch_env)
    key = jax.random.PRNGKey(2)
    obs, state = make_batch_reset(env.batch_env)(key, env.params)
    observations = [obs]
    for index in range(num_steps):
        key_action, key_step = jax.random.split(jax.random.fold_in(key, index))
        logits = jnp.where(obs["action_mask"], 0.0, -jnp.inf)
        actions = jax.random.categorical(key_action, logits).astype(jnp.int32)
        (obs, state, *_), _ = step(key_step, state, actions, env.params)
        observations.append(obs)
    return jax.tree.map(lambda *x: jnp.concatenate(x), *observations), state


@functools.cache
def smoke_policy(precision: str = "float32"):
    """(policy module, variables) of the tiny config in `precision`, built as the trainer
    builds it. Parameters are float32 whatever the precision, so one initialisation serves
    every precision (its layout is checked against the precision's own `init`)."""
    from terra_rl.nets.models import make_policy
    from terra_rl.run.trainer import policy_config

    obs, _ = small_observations()
    num_actions = small_train_env().num_actions
    policy = make_policy(policy_config(smoke_config(precision=precision)), num_actions, obs)
    if precision == "float32":
        return policy, jax.jit(policy.init)(jax.random.PRNGKey(1), obs)
    _, variables = smoke_policy("float32")
    layout = jax.eval_shape(policy.init, jax.random.PRNGKey(1), obs)
    same = jax.tree.map(lambda v, s: (v.shape, v.dtype) == (s.shape, s.dtype), variables, layout)
    if not all(jax.tree.leaves(same)):
        raise ValueError(f"the {precision} policy's parameters differ from float32's")
    return policy, variables


@functools.cache
def make_policy_outputs(use_action_mask: bool, precision: str = "float32"):
    """Jitted `outputs(params, obs) -> (logits, value)` of `smoke_policy` as the update
    computes them (`terra_rl.algo.update.policy_outputs`)."""
    from terra_rl.algo.update import policy_outputs

    policy, _ = smoke_policy(precision)
    return jax.jit(lambda params, obs: policy_outputs(policy, params, obs, use_action_mask))
