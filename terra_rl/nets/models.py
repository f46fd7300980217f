"""Actor-critic networks: the excavation policy and small nets for generic gymnax envs.

Every network maps a batched observation to `(logits float32 [B, num_actions], value
float32 [B])`. Parameters are float32; the encoders compute in `PolicyConfig.precision`
(Flax `dtype=`), and the two heads compute in float32 from float32 features (see
`terra_rl.nets.precision`).

Top-level parameter names are the same for every network, so
`terra_rl.nets.parameters.parameter_groups` splits any of them by role: `policy_head` and
`value_head` (one Dense each) and the encoders, either `encoder` (shared by both heads) or
`actor_encoder` / `critic_encoder` (separate, sharing no parameter).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from terra_rl.choices import GYMNAX_ACTIVATIONS, IMAGE_ENCODERS, MAP_ENCODERS, PRECISIONS
from terra_rl.features.global_maps import map_input
from terra_rl.features.policy_inputs import derived_features, stores_map_input
from terra_rl.features.reach_cache import CACHE_KEYS, ReachCache, make_reach_cache
from terra_rl.nets.dense_dot import dense_dot_general_for_backend
from terra_rl.nets.patch_conv import CONV_KERNEL_INIT, PatchConv
from terra_rl.nets.precision import HEAD_DTYPE, compute_dtype, to_float32

EXCAVATION_OBS_KEYS = frozenset(
    {
        "agent_state",
        "agent_type",
        "local_maps",
        "target_map",
        "action_map",
        "obstacles",
        "dumpability",
        "last_actions",
    }
)
NUM_HEADINGS = 12
# Wheel angles are clipped to +-MAX_WHEEL_ANGLE before the embedding, so one policy serves
# any env `wheel_angle_limit` up to 6 (30 degrees per unit: 6 units turn 180 degrees).
MAX_WHEEL_ANGLE = 6
NUM_LAST_ACTION_TOKENS = 9  # 8 actions + NO_ACTION padding
EMBED_DIM = 16
SMALL_MLP_DIM = 64  # agent-state and local-map MLPs
EGOCENTRIC_MLP_DIM = 128  # first layer over the egocentric view (4 layers x S x S inputs)
GYMNAX_HIDDEN_DIM = 64


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Static network configuration (hashable, so it can be a Flax module field)."""

    map_encoder: str = "atari"
    map_feature_dim: int = 256
    hidden_dim: int = 256
    separate_actor_critic_trunks: bool = False
    precision: str = "float32"
    compass: bool = False
    """Add the egocentric tile counts of `terra_rl.features.compass` (excavation only)."""
    dig_distance: bool = False
    """Add the dig-distance field around the agent (`terra_rl.features.dig_distance`;
    excavation)."""
    pose_distance: bool = False
    """Add the base actions to work in reach, from the agent and after each base action
    (`terra_rl.features.pose_distance`; excavation)."""
    wheeled_agents: bool = True
    """Whether the observations may hold wheeled excavators. False (a run without them)
    lets the pose distance search the tracked excavators' states only: the same features
    for a third of its work."""
    egocentric_radius: int = 0
    """With > 0, add the map around the agent turned to its base heading
    (`terra_rl.features.egocentric`, a square of 2 * radius + 1 tiles; excavation only)."""
    map_pool: int = 1
    """Average the global map channels over `map_pool` x `map_pool` tiles before the map
    encoder (excavation only; the map size must be a multiple). At 32x32 with 2 the flat
    encoder's first layer, most of the network's work, gets a quarter of the inputs."""
    conv_as_matmul: bool = False
    """Compute convolutions as patches times a matrix (`PatchConv`, the same parameters):
    fast inside XLA:CPU loops, so the PPO loops need not be unrolled (`uses_convolutions`)."""
    image_encoder: str = "cnn"
    """Gymnax image observations [H, W, C]: "cnn" (`GymnaxCNNPolicy`) or "mlp" (the
    vector MLP over the flattened image)."""
    gymnax_activation: str = "tanh"
    """The activation of `GymnaxMLPPolicy`'s hidden layers: "tanh" or "relu"."""
    gymnax_hidden_dim: int = GYMNAX_HIDDEN_DIM
    """Width of the gymnax networks' hidden layers (each MLP layer, the CNN's Dense)."""

    def __post_init__(self) -> None:
        choices = (("map_encoder", MAP_ENCODERS), ("precision", PRECISIONS),
                   ("image_encoder", IMAGE_ENCODERS), ("gymnax_activation", GYMNAX_ACTIVATIONS))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if min(self.map_feature_dim, self.hidden_dim, self.gymnax_hidden_dim) < 1:
            raise ValueError(
                f"map_feature_dim, hidden_dim and gymnax_hidden_dim must be >= 1, got "
                f"{self.map_feature_dim}, {self.hidden_dim}, {self.gymnax_hidden_dim}"
            )
        if self.map_pool < 1:
            raise ValueError(f"map_pool must be >= 1, got {self.map_pool}")
        if self.egocentric_radius < 0:
            raise ValueError(f"egocentric_radius must be >= 0, got {self.egocentric_radius}")
        if self.map_encoder == "none" and not (self.compass or self.egocentric_radius):
            raise ValueError(
                "map_encoder 'none' leaves the policy blind to the map; add the compass or an "
                "egocentric_radius > 0"
            )

    @property
    def dtype(self) -> jnp.dtype:
        return compute_dtype(self.precision)


def _dense(features: int, dtype, scale: float = np.sqrt(2), name: str | None = None,
           dot_general=None) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.initializers.orthogonal(scale),
        bias_init=nn.initializers.zeros,
        dtype=dtype,
        param_dtype=jnp.float32,
        name=name,
        dot_general=dot_general,
    )


def _conv(features: int, kernel: int, stride: int, dtype, *, as_matmul: bool = False,
          name: str | None = None) -> nn.Module:
    """A SAME-padded square convolution: `nn.Conv`, or with `as_matmul` `PatchConv` (same
    parameters, same result to float rounding)."""
    if as_matmul:
        return PatchConv(features, kernel, stride, dtype, name=name)
    return nn.Conv(
        features,
        (kernel, kernel),
        strides=(stride, stride),
        padding="SAME",
        kernel_init=CONV_KERNEL_INIT,
        bias_init=nn.initializers.zeros,
        dtype=dtype,
        param_dtype=jnp.float32,
        name=name,
    )


def _embed(num_embeddings: int, name: str) -> nn.Embed:
    """A float32 lookup table; callers cast its output to the compute dtype. Its backward
    pass is a scatter-add into the table, which XLA:GPU runs about 38x slower in bfloat16
    than in float32 (75.9 vs 2.0 ms per solo_excavator minibatch on an H100) and which
    would accumulate the sums, loss scale included, in half precision."""
    return nn.Embed(num_embeddings, EMBED_DIM, dtype=jnp.float32, param_dtype=jnp.float32,
                    name=name)


class _Mlp(nn.Module):
    """Dense + activation per entry of `features`."""

    features: Sequence[int]
    dtype: jnp.dtype = jnp.float32
    activation: str = "relu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        activation = getattr(nn, self.activation)
        for width in self.features:
            x = activation(_dense(width, self.dtype)(x))
        return x


def _flatten_spatial(x: jax.Array) -> jax.Array:
    """[..., H, W, C] -> [..., H * W * C]."""
    return x.reshape(*x.shape[:-3], -1)


def _heads(actor_features, critic_features, num_actions: int):
    """float32 logits [..., A] and value [...] from features [..., F] (inside a compact
    call). The heads run in float32 so logits and values never round through half
    precision; they are a negligible share of the network's FLOPs."""
    logits = _dense(num_actions, HEAD_DTYPE, scale=0.01, name="policy_head")(
        to_float32(actor_features)
    )
    value = _dense(1, HEAD_DTYPE, scale=1.0, name="value_head")(to_float32(critic_features))
    return logits, value[..., 0]


# --------------------------------------------------------------------------- map encoders


class AtariMapEncoder(nn.Module):
    """Nature-DQN convs: [B, N, N, C] -> [B, features]."""

    features: int
    dtype: jnp.dtype = jnp.float32
    conv_as_matmul: bool = False

    @nn.compact
    def __call__(self, maps: jax.Array) -> jax.Array:
        x = maps
        for index, (channels, kernel, stride) in enumerate(((32, 8, 4), (64, 4, 2), (64, 3, 1))):
            conv = _conv(channels, kernel, stride, self.dtype, as_matmul=self.conv_as_matmul,
                         name=f"Conv_{index}")
            x = nn.relu(conv(x))
        return nn.relu(_dense(self.features, self.dtype)(_flatten_spatial(x)))


class ImpalaMapEncoder(nn.Module):
    """IMPALA-style residual CNN: [B, N, N, C] -> [B, features].

    Each stage: conv 3x3, max-pool 3x3 stride 2, two residual blocks (relu-conv-relu-conv).
    """

    features: int
    stage_channels: Sequence[int] = (16, 32, 32)
    dtype: jnp.dtype = jnp.float32
    conv_as_matmul: bool = False

    @nn.compact
    def __call__(self, maps: jax.Array) -> jax.Array:
        names = (f"Conv_{index}" for index in range(5 * len(self.stage_channels)))

        def conv(channels):
            return _conv(channels, 3, 1, self.dtype, as_matmul=self.conv_as_matmul,
                         name=next(names))

        x = maps
        for channels in self.stage_channels:
            x = conv(channels)(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for _ in range(2):
                residual = conv(channels)(nn.relu(x))
                x = x + conv(channels)(nn.relu(residual))
        return nn.relu(_dense(self.features, self.dtype)(_flatten_spatial(nn.relu(x))))


class FlatMapEncoder(nn.Module):
    """No convolution: the map channels flattened into one Dense layer, [B, N, N, C] ->
    [B, features]. For small maps (16x16: 2048 inputs) it is cheaper than a CNN, and
    without convolutions the PPO loops need not be unrolled on XLA:CPU, so the update
    compiles in a fraction of the time (`uses_convolutions`)."""

    features: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, maps: jax.Array) -> jax.Array:
        # Thousands of inputs: the one layer whose kernel gradient XLA:CPU runs faster in
        # the other operand order (terra_rl.nets.dense_dot).
        dense = _dense(self.features, self.dtype, dot_general=dense_dot_general_for_backend())
        return nn.relu(dense(_flatten_spatial(maps)))


_MAP_ENCODER_CLASSES = {
    "atari": AtariMapEncoder,
    "resnet": ImpalaMapEncoder,
    "flat": FlatMapEncoder,
}


# --------------------------------------------------------------------------- excavation


class ExcavationEncoder(nn.Module):
    """All observation parts -> trunk features [B, hidden_dim].

    Submodules: `map_encoder` (over `map_channels` pooled by `PolicyConfig.map_pool`,
    zero-padded to 8 channels; absent with `map_encoder="none"`), `base_heading_embed`,
    `cabin_heading_embed`, `wheel_angle_embed` and `agent_type_embed` (inputs of
    `agent_state_mlp`), `local_maps_mlp`, `last_actions_embed`, `compass_mlp` and
    `dig_distance_mlp` (with those `PolicyConfig` flags), `egocentric_mlp` (with
    `PolicyConfig.egocentric_radius`), and `trunk` (2 x Dense hidden_dim + relu over the
    concatenated features)."""

    config: PolicyConfig

    @nn.compact
    def __call__(self, obs: dict) -> jax.Array:
        cfg, dtype = self.config, self.config.dtype
        parts = []
        derived = derived_features(obs, cfg)
        if cfg.map_encoder != "none":  # "none": the policy sees the map only egocentrically
            encoder_cls = _MAP_ENCODER_CLASSES[cfg.map_encoder]
            options = {} if cfg.map_encoder == "flat" else {"conv_as_matmul": cfg.conv_as_matmul}
            maps = derived["map_input"] if "map_input" in derived else map_input(obs, cfg.map_pool)
            parts.append(encoder_cls(cfg.map_feature_dim, dtype=dtype, name="map_encoder",
                                     **options)(maps.astype(dtype)))

        agent = obs["agent_state"]
        size = obs["target_map"].shape[-1]
        wheel = jnp.clip(agent[..., 4], -MAX_WHEEL_ANGLE, MAX_WHEEL_ANGLE) + MAX_WHEEL_ANGLE
        loaded = jnp.maximum(agent[..., 5], 0).astype(jnp.float32)
        scalars = jnp.stack(
            [
                agent[..., 0].astype(jnp.float32) / (size - 1),
                agent[..., 1].astype(jnp.float32) / (size - 1),
                (loaded > 0).astype(jnp.float32),
                jnp.log1p(loaded),
            ],
            axis=-1,
        ).astype(dtype)
        embedded = [
            _embed(NUM_HEADINGS, "base_heading_embed")(agent[..., 2] % NUM_HEADINGS),
            _embed(NUM_HEADINGS, "cabin_heading_embed")(agent[..., 3] % NUM_HEADINGS),
            _embed(2 * MAX_WHEEL_ANGLE + 1, "wheel_angle_embed")(wheel),
            _embed(2, "agent_type_embed")(obs["agent_type"]),
        ]
        agent_parts = [part.astype(dtype) for part in embedded] + [scalars]
        agent_features = _Mlp((SMALL_MLP_DIM, SMALL_MLP_DIM), dtype, name="agent_state_mlp")(
            jnp.concatenate(agent_parts, axis=-1)
        )

        local = obs["local_maps"]
        local = jnp.log1p(jnp.maximum(local, 0).astype(jnp.float32)).astype(dtype)
        local_features = _Mlp((SMALL_MLP_DIM, SMALL_MLP_DIM), dtype, name="local_maps_mlp")(
            local.reshape(*local.shape[:-2], -1)
        )

        actions = _embed(NUM_LAST_ACTION_TOKENS, "last_actions_embed")(obs["last_actions"])
        action_features = actions.reshape(*actions.shape[:-2], -1).astype(dtype)

        parts += [agent_features, local_features, action_features]
        for key in ("compass", "dig_distance", "pose_distance"):
            if key in derived:  # observation features without parameters, then two Dense 64
                mlp = _Mlp((SMALL_MLP_DIM, SMALL_MLP_DIM), dtype, name=f"{key}_mlp")
                parts.append(mlp(derived[key].astype(dtype)))
        if cfg.egocentric_radius:
            view = derived["egocentric_view"]
            parts.append(
                _Mlp((EGOCENTRIC_MLP_DIM, SMALL_MLP_DIM), dtype, name="egocentric_mlp")(
                    view.reshape(*view.shape[:-3], -1).astype(dtype)
                )
            )
        features = jnp.concatenate(parts, axis=-1)
        return _Mlp((cfg.hidden_dim, cfg.hidden_dim), dtype, name="trunk")(features)


def with_derived_features(policy: nn.Module, obs):
    """`obs` plus the excavation policy's `derived_features`, computed once: a rollout
    stores them with its observations, so the update's epochs x minibatches of gradient
    passes read them instead of recomputing them (at 32x32 the dig distance and the compass
    cost as much as the rest of the forward pass; the flat encoder's map input, pooled,
    more than its Dense layer). What a rollout's cache adds (`CACHE_KEYS`) is used and left
    out: a rollout does not store it. Any other policy's `obs` is returned as it is."""
    if not isinstance(policy, ExcavationPolicy):
        return obs
    kept = {key: value for key, value in obs.items() if key not in CACHE_KEYS}
    return {**kept, **derived_features(obs, policy.config)}


def make_observation_cache(policy: nn.Module, num_envs: int) -> ReachCache | None:
    """What a rollout of `num_envs` envs keeps from step to step for `policy`'s inputs
    (`terra_rl.algo.rollout.rollout`'s `cache`, `terra_rl.features.reach_cache`): the dig
    and pose distances' goals and searches where the policy has either distance, and the
    pooled map layers where a rollout stores the map input (`stores_map_input`); None where
    it has neither."""
    if not isinstance(policy, ExcavationPolicy):
        return None
    config = policy.config
    map_pool = config.map_pool if stores_map_input(config) else 0
    if not (config.dig_distance or config.pose_distance or map_pool):
        return None
    return make_reach_cache(num_envs, pose_distances=config.pose_distance,
                            wheeled_agents=config.wheeled_agents,
                            dig_distances=config.dig_distance, map_pool=map_pool)


class ExcavationPolicy(nn.Module):
    """Actor-critic for the excavation env's observation dict.

    obs: agent_state int32 [B, 6], agent_type int32 [B], local_maps int16 [B, 12, 6],
    target_map / action_map / obstacles / dumpability int8 [B, N, N], last_actions int32
    [B, K]; `action_mask` is ignored; keys of `derived_features` present in `obs` are used
    instead of computed (`with_derived_features`), and so is what a rollout's cache adds
    (`make_observation_cache`). Any number of leading batch dims works.
    Returns logits float32 [B, num_actions], value float32 [B].
    """

    config: PolicyConfig
    num_actions: int

    @nn.compact
    def __call__(self, obs: dict) -> tuple[jax.Array, jax.Array]:
        if self.config.separate_actor_critic_trunks:
            actor = ExcavationEncoder(self.config, name="actor_encoder")(obs)
            critic = ExcavationEncoder(self.config, name="critic_encoder")(obs)
        else:
            actor = critic = ExcavationEncoder(self.config, name="encoder")(obs)
        return _heads(actor, critic, self.num_actions)


# --------------------------------------------------------------------------- gymnax


class GymnaxMLPPolicy(nn.Module):
    """Separate actor and critic MLPs (tanh, or relu with `activation="relu"`): obs [B, D] ->
    logits [B, A], value [B]. With `flatten_image`, obs [B, H, W, C] is flattened to
    [B, H * W * C] first (MinAtar without convolutions)."""

    num_actions: int
    hidden_dims: Sequence[int] = (GYMNAX_HIDDEN_DIM, GYMNAX_HIDDEN_DIM)
    precision: str = "float32"
    flatten_image: bool = False
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        dtype = compute_dtype(self.precision)
        if self.flatten_image:
            obs = obs.reshape(*obs.shape[:-3], -1)
        x = obs.astype(dtype)
        actor = _Mlp(self.hidden_dims, dtype, self.activation, name="actor_encoder")(x)
        critic = _Mlp(self.hidden_dims, dtype, self.activation, name="critic_encoder")(x)
        return _heads(actor, critic, self.num_actions)


class GymnaxCNNPolicy(nn.Module):
    """Shared conv 16 3x3 + Dense for image obs [B, H, W, C] (e.g. MinAtar 10x10xC)."""

    num_actions: int
    channels: int = 16
    hidden_dim: int = GYMNAX_HIDDEN_DIM
    precision: str = "float32"
    conv_as_matmul: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        dtype = compute_dtype(self.precision)
        features = _SmallCnn(self.channels, self.hidden_dim, dtype, self.conv_as_matmul,
                             name="encoder")(
            obs.astype(dtype)
        )
        return _heads(features, features, self.num_actions)


class _SmallCnn(nn.Module):
    channels: int
    hidden_dim: int
    dtype: jnp.dtype = jnp.float32
    conv_as_matmul: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        conv = _conv(self.channels, 3, 1, self.dtype, as_matmul=self.conv_as_matmul,
                     name="Conv_0")
        x = nn.relu(conv(x))
        return nn.relu(_dense(self.hidden_dim, self.dtype)(_flatten_spatial(x)))


# --------------------------------------------------------------------------- helpers


def make_policy(config: PolicyConfig, num_actions: int, example_obs) -> nn.Module:
    """The network for a batched example observation.

    A dict with the excavation keys -> `ExcavationPolicy`; an array [B, D] ->
    `GymnaxMLPPolicy`; an array [B, H, W, C] -> `GymnaxCNNPolicy`, or with
    `image_encoder="mlp"` the MLP over the flattened image. The gymnax nets take only
    `precision`, `conv_as_matmul`, `image_encoder`, `gymnax_activation` and
    `gymnax_hidden_dim` from `config`.
    """
    if num_actions < 1:
        raise ValueError(f"num_actions must be >= 1, got {num_actions}")
    if isinstance(example_obs, dict):
        missing = EXCAVATION_OBS_KEYS - set(example_obs)
        if missing:
            raise ValueError(f"dict observation lacks excavation keys {sorted(missing)}")
        return ExcavationPolicy(config, num_actions)
    per_env_ndim = np.ndim(example_obs) - 1
    if per_env_ndim == 1 or (per_env_ndim == 3 and config.image_encoder == "mlp"):
        width = config.gymnax_hidden_dim
        return GymnaxMLPPolicy(num_actions, hidden_dims=(width, width),
                               precision=config.precision, flatten_image=per_env_ndim == 3,
                               activation=config.gymnax_activation)
    if per_env_ndim == 3:
        return GymnaxCNNPolicy(num_actions, hidden_dim=config.gymnax_hidden_dim,
                               precision=config.precision,
                               conv_as_matmul=config.conv_as_matmul)
    raise ValueError(
        f"batched observation must be [B, D] or [B, H, W, C], got shape {np.shape(example_obs)}"
    )


def uses_convolutions(policy: nn.Module) -> bool:
    """Whether the network has `lax.conv` layers (their gradients run an order of magnitude
    slower inside XLA:CPU loops, jax-ml/jax#12868); `PatchConv` layers do not count."""
    if isinstance(policy, ExcavationPolicy):
        convs = policy.config.map_encoder not in ("flat", "none")
        return convs and not policy.config.conv_as_matmul
    return isinstance(policy, GymnaxCNNPolicy) and not policy.conv_as_matmul
