"""`GymnaxBatchEnv`: `num_envs` copies of a discrete-action gymnax environment behind the
trainer's env contract (`terra_rl.adapters.contract.TrainEnv`, as the excavation adapter).

Transitions use the environment's own `env.step` (vmapped), so env-specific `step`
overrides are honoured; gymnax's `step` resets unconditionally and selects, which is cheap
for these small environments. Outputs are normalised for the trainer:

- `terminated`: the environment's natural end (pole fell, ball lost, ...).
- `truncated`: the time limit (`state.time >= params.max_steps_in_episode`) WITHOUT a
  natural end. gymnax 1.0 reports its `truncated` independently of `terminated`, so both
  can be true on the last step; here `truncated = gymnax_truncated & ~terminated`, and
  `terminated | truncated` is exactly gymnax's reset condition. With `timeouts_terminal`
  (`--enable_gymnax_timeouts_terminal`, training env only) a timeout is reported as
  `terminated` and `truncated` is always false: the treatment of gymnax-blines and PureJaxRL.
- the observation and `final_observation` are float32; reward float32; flags bool.
  With `scale_observations` (`--enable_gymnax_scale_observations`, train and eval envs
  alike) every dimension the environment's observation space bounds, `low < high` both
  finite, is mapped linearly from `[low, high]` to `[-1, 1]`; unbounded dimensions (CartPole's
  velocities) pass unchanged. MountainCar's velocity spans +-0.07 and its position 1.8, so
  unscaled the policy barely sees the velocity (docs/RESULTS.md).
- Weak types are stripped from the state, so reset and step give one pytree type (a scan
  carry or a jitted runner state never changes type and never recompiles).

Staggered ages: gymnax states count the steps of the current episode in `state.time`. For
the environments in `STAGGER_SAFE_ENV_IDS`, `time` is read only by the time-limit check, so
`reset(..., staggered=True)` draws it uniformly from `[0, max_steps)` and the first
timeouts spread over the rollout. Other environments (bandits, bsuite chains, ...) read
`time` in observations or dynamics; for them the flag is accepted and ignored.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from terra_rl.adapters.contract import StepResult, checked_step_result, observation_spec_of
from terra_rl.adapters.deferred_imports import deferring

# Plotting modules gymnax imports for its renderers only (terra_rl.adapters.deferred_imports).
with deferring("matplotlib", "matplotlib.pyplot", "matplotlib.colors", "seaborn"):
    import gymnax
from gymnax.environments import spaces  # noqa: E402

GYMNAX_PREFIX = "gymnax:"
EXCAVATION_SPEC = "excavation"

# Environments whose `state.time` is a pure step counter, checked against gymnax 1.0.1's
# sources: only `is_truncated` reads it, so randomising it only shortens the first episode.
STAGGER_SAFE_ENV_IDS = frozenset(
    {
        "CartPole-v1",
        "Acrobot-v1",
        "MountainCar-v0",
        "Asterix-MinAtar",
        "Breakout-MinAtar",
        "Freeway-MinAtar",
        "Seaquest-MinAtar",
        "SpaceInvaders-MinAtar",
    }
)


def parse_env_id(spec: str) -> str | None:
    """`"gymnax:CartPole-v1"` -> `"CartPole-v1"`; `"excavation"` -> None; else ValueError."""
    if spec == EXCAVATION_SPEC:
        return None
    if spec.startswith(GYMNAX_PREFIX) and len(spec) > len(GYMNAX_PREFIX):
        return spec[len(GYMNAX_PREFIX) :]
    raise ValueError(
        f"unknown env spec {spec!r}: expected '{EXCAVATION_SPEC}' or "
        f"'{GYMNAX_PREFIX}<env_id>' (e.g. '{GYMNAX_PREFIX}CartPole-v1')"
    )


def make_gymnax_env(env_id: str, num_envs: int, timeouts_terminal: bool = False,
                    scale_observations: bool = False) -> GymnaxBatchEnv:
    """Batched gymnax env; ValueError for an unknown id, a continuous action space, or
    `scale_observations` on an env whose observation space bounds no dimension."""
    return GymnaxBatchEnv(env_id, num_envs, timeouts_terminal, scale_observations)


def _strong(tree):
    """Same values and dtypes with weak types removed (stable jit / scan carry types)."""
    return jax.tree.map(lambda x: jnp.asarray(x).astype(jnp.asarray(x).dtype), tree)


def observation_scaling(space, obs_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(centre, half width), float32 `obs_shape` each, that map every dimension `space`
    bounds (`low < high`, both finite and under 1e30 apart) to `[-1, 1]` by
    `(obs - centre) / half_width`; other dimensions get (0, 1) and pass unchanged. Raises
    ValueError when no dimension is bounded."""
    low = np.asarray(getattr(space, "low", np.nan), np.float64)
    high = np.asarray(getattr(space, "high", np.nan), np.float64)
    low, high = np.broadcast_to(low, obs_shape), np.broadcast_to(high, obs_shape)
    with np.errstate(invalid="ignore", over="ignore"):
        bounded = np.isfinite(low) & np.isfinite(high) & (high > low) & (high - low < 1e30)
    if not bounded.any():
        raise ValueError(f"its {type(space).__name__} observation space bounds no dimension")
    centre = np.where(bounded, (high + low) / 2, 0.0)
    half_width = np.where(bounded, (high - low) / 2, 1.0)
    return centre.astype(np.float32), half_width.astype(np.float32)


class GymnaxBatchEnv:
    """`num_envs` gymnax environments with auto-reset; discrete actions only.

    `params` is the gymnax EnvParams pytree; inside `jit`/`pmap` pass it as an argument.
    Shapes: obs float32 [num_envs, *obs_shape]; actions int32 [num_envs].
    """

    has_success: bool = False
    group_names: tuple[str, ...] = ()
    curriculum_level_names: tuple[str, ...] = ()

    def __init__(self, env_id: str, num_envs: int, timeouts_terminal: bool = False,
                 scale_observations: bool = False):
        if env_id not in gymnax.registered_envs:
            raise ValueError(
                f"unknown gymnax env id {env_id!r}; valid ids are listed in "
                "gymnax.registered_envs (e.g. 'CartPole-v1', 'Breakout-MinAtar')"
            )
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        env, params = gymnax.make(env_id)
        action_space = env.action_space(params)
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(
                f"gymnax env {env_id!r} has a {type(action_space).__name__} action space; "
                "only Discrete action spaces are supported"
            )
        self.env_id = env_id
        self.env = env
        self.params = params
        self.num_envs = num_envs
        self.timeouts_terminal = timeouts_terminal
        self.num_actions = int(action_space.n)
        self.action_names = tuple(f"action_{i}" for i in range(self.num_actions))
        self.max_steps = int(params.max_steps_in_episode)
        self.truncation_period = self.max_steps  # the time limit, counted from each reset
        self.can_stagger = env_id in STAGGER_SAFE_ENV_IDS
        obs_struct, _ = jax.eval_shape(lambda: env.reset(jax.random.key(0), params))
        self.obs_shape = tuple(obs_struct.shape)
        self.scale_observations = scale_observations
        if scale_observations:
            try:
                self._obs_centre, self._obs_half_width = observation_scaling(
                    env.observation_space(params), self.obs_shape)
            except ValueError as error:
                raise ValueError(f"--enable_gymnax_scale_observations cannot scale {env_id}: "
                                 f"{error}; drop the flag") from None

    def _observation(self, obs) -> jax.Array:
        """float32 [num_envs, *obs_shape], scaled to the space's bounds when asked."""
        obs = jnp.asarray(obs, jnp.float32)
        if self.scale_observations:
            obs = (obs - self._obs_centre) / self._obs_half_width
        return obs

    def reset(self, key: jax.Array, params, staggered: bool = True, first_maps=None):
        """Fresh episodes for every env -> (obs float32 [num_envs, *obs_shape], state).
        `first_maps` is accepted for the trainer's interface and ignored (no map pool).

        With `staggered` (a static Python bool) and a stagger-safe env, each env's
        `state.time` (its episode age) starts uniform in `[0, max_steps)`. `key` is consumed
        (split into the episodes' keys and the ages' key): a caller derives no other key
        from it.
        """
        key_reset, key_age = jax.random.split(key)
        keys = jax.random.split(key_reset, self.num_envs)
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(keys, params)
        if staggered and self.can_stagger:
            ages = jax.random.randint(key_age, (self.num_envs,), 0, params.max_steps_in_episode)
            state = state.replace(time=ages.astype(jnp.asarray(state.time).dtype))
        return self._observation(obs), _strong(state)

    def observation_spec(self):
        return observation_spec_of(self)

    def step(self, key: jax.Array, state, actions: jax.Array, params):
        """actions int [num_envs] -> (state, `StepResult`).

        observation and final_observation float32 [num_envs, *obs_shape]; terminated and
        truncated never both true. info: task_done all False (gymnax has no success notion),
        episode_progress zeros, action_mask all True.
        """
        keys = jax.random.split(key, self.num_envs)
        obs, state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None)
        )(keys, state, actions, params)
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.asarray(truncated, jnp.bool_) & ~terminated
        if self.timeouts_terminal:
            terminated, truncated = terminated | truncated, jnp.zeros_like(truncated)
        final_observation = self._observation(info["final_observation"])
        info = {
            "task_done": jnp.zeros((self.num_envs,), jnp.bool_),
            "episode_progress": jnp.zeros((self.num_envs,), jnp.float32),
            "action_mask": jnp.ones((self.num_envs, self.num_actions), jnp.bool_),
        }
        reward = jnp.asarray(reward, jnp.float32)
        result = StepResult(self._observation(obs), reward, terminated, truncated,
                            final_observation, info)
        return _strong(state), checked_step_result(result, self.num_envs, self.num_actions)

    def episode_age(self, state) -> jax.Array:
        """Steps taken in each env's current episode: int32 [num_envs]."""
        return jnp.asarray(state.time).astype(jnp.int32)

    def episode_group(self, state, params) -> jax.Array:
        """int32 [num_envs]: zeros (no episode groups)."""
        return jnp.zeros((self.num_envs,), jnp.int32)

    def curriculum_level(self, state) -> jax.Array:
        """int32 [num_envs]: zeros (no curriculum)."""
        return jnp.zeros((self.num_envs,), jnp.int32)
