"""`validate`: the checks `terra_rl.config.resolve` runs on a `TrainConfig`, each failing
with one `ConfigError` line that says what is wrong and how to fix it, before anything is
compiled or written. The allowed values of the choice fields live here too.
"""

from __future__ import annotations

from terra_rl.choices import GYMNAX_ACTIVATIONS, IMAGE_ENCODERS, MAP_ENCODERS, PRECISIONS
from terra_rl.config import ConfigError, TrainConfig

CONV_IMPLS = ("auto", "lax", "patches")

REWARD_KINDS = ("dense", "sparse")
LR_SCHEDULES = ("constant", "linear", "cosine")
WANDB_MODES = ("", "online", "offline", "disabled")
# Eval metrics the best checkpoint can follow (each also as eval_sampled/...).
BEST_METRICS = ("completion_rate", "first_episode_return", "positive_terminations", "rewards")
GYMNAX_BEST_METRICS = ("first_episode_return", "rewards")


def validate(config: TrainConfig, num_local_devices: int) -> None:
    """Raise `ConfigError` (one line: what is wrong and how to fix it) on a bad config."""
    c = config
    positive = (
        "num_envs_per_device num_steps total_timesteps update_epochs num_minibatches "
        "num_maps max_steps eval_episodes map_feature_dim hidden_dim keep_checkpoints "
        "map_pool gymnax_hidden_dim"
    ).split()
    for name in positive:
        if getattr(c, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(c, name)}")
    for name in ("updates_per_dispatch", "log_train_interval", "log_eval_interval",
                 "checkpoint_interval",
                 "cache_clear_interval", "ent_coef_decay_updates", "lr_decay_updates",
                 "dataset_size",
                 "curriculum_demote_after", "egocentric_radius", "stall_steps",
                 "drivable_soil_height", "revisit_memory"):
        if getattr(c, name) < 0:
            raise ConfigError(f"--{name} must be >= 0, got {getattr(c, name)}")
    if c.num_devices < 1 or c.num_devices > num_local_devices:
        raise ConfigError(
            f"--num_devices {c.num_devices} asked but {num_local_devices} local device(s) are "
            "present; lower --num_devices or leave it at 0 for all devices"
        )
    transitions = c.num_steps * c.num_envs_per_device
    if transitions % c.num_minibatches:
        raise ConfigError(
            f"a rollout of --num_steps {c.num_steps} x --num_envs_per_device "
            f"{c.num_envs_per_device} = {transitions} transitions is not divisible into "
            f"--num_minibatches {c.num_minibatches}; pick a divisor"
        )
    if c.eval_episodes % c.num_devices:
        raise ConfigError(
            f"--eval_episodes {c.eval_episodes} does not split over {c.num_devices} devices; "
            "use a multiple of --num_devices"
        )
    if c.total_timesteps < c.env_steps_per_update:
        raise ConfigError(
            f"--total_timesteps {c.total_timesteps} is less than one update "
            f"({c.num_steps} steps x {c.num_envs} envs = {c.env_steps_per_update}); raise it, or "
            "use --max_updates N for a short run"
        )
    if not (0.0 < c.gamma <= 1.0 and 0.0 <= c.gae_lambda <= 1.0):
        raise ConfigError("--gamma must be in (0, 1] and --gae_lambda in [0, 1]")
    if c.lr <= 0 or c.clip_eps <= 0 or c.max_grad_norm <= 0 or c.vf_coef < 0:
        raise ConfigError("--lr, --clip_eps and --max_grad_norm must be > 0, --vf_coef >= 0")
    if not 0.0 <= c.lr_end <= c.lr:
        raise ConfigError(f"--lr_end must be in [0, --lr {c.lr}], got {c.lr_end}")
    if c.ent_coef_start < 0 or c.ent_coef_end < 0:
        raise ConfigError("--ent_coef_start and --ent_coef_end must be >= 0")
    choices = (
        ("precision", PRECISIONS),
        ("map_encoder", MAP_ENCODERS),
        ("reward", REWARD_KINDS),
        ("lr_schedule", LR_SCHEDULES),
        ("conv_impl", CONV_IMPLS),
        ("image_encoder", IMAGE_ENCODERS),
        ("gymnax_activation", GYMNAX_ACTIVATIONS),
        ("wandb_mode", WANDB_MODES),
    )
    for name, allowed in choices:
        if getattr(c, name) not in allowed:
            shown = [a for a in allowed if a]
            raise ConfigError(f"--{name} must be one of {shown}, got {getattr(c, name)!r}")
    allowed = GYMNAX_BEST_METRICS if c.is_gymnax else BEST_METRICS
    names = [f"validation/{name}" for name in allowed]
    if c.best_metric.startswith(("eval/", "eval_sampled/")):
        raise ConfigError(f"--best_metric {c.best_metric} would choose the checkpoint on the "
                          "reported eval pool; use validation/"
                          f"{c.best_metric.split('/', 1)[1]} (the validation pool)")
    if c.best_metric and c.best_metric not in names:  # empty: the default, set by resolve
        raise ConfigError(f"--best_metric must be one of {names}, got {c.best_metric!r}")
    which = c.init_params_checkpoint
    if which not in ("latest", "best") and not which.isdigit():
        raise ConfigError(f"--init_params_checkpoint must be latest, best or an update number, "
                          f"got {which!r}")
    if c.env != "excavation" and not c.is_gymnax:
        raise ConfigError(f"--env must be 'excavation' or 'gymnax:<id>', got {c.env!r}")
    if c.env == "excavation" and c.gymnax_timeouts_terminal:
        raise ConfigError("--enable_gymnax_timeouts_terminal needs --env gymnax:<id>; the "
                          "excavation env always bootstraps a timeout")
    if c.env == "excavation" and c.gymnax_scale_observations:
        raise ConfigError("--enable_gymnax_scale_observations needs --env gymnax:<id>; the "
                          "flag scales a gymnax observation space to its bounds")
    if c.env == "excavation":
        _validate_excavation(c)
    elif c.use_action_mask:
        raise ConfigError("--enable_action_mask needs --env excavation (gymnax envs have no mask)")
    elif c.curriculum:
        raise ConfigError("--curriculum needs --env excavation (gymnax envs have no map levels)")
    elif c.use_dig_distance or c.use_pose_distance:
        name = "dig_distance" if c.use_dig_distance else "pose_distance"
        raise ConfigError(f"--enable_{name} needs --env excavation (gymnax envs have no "
                          f"map); add --disable_{name}")


def _validate_excavation(c: TrainConfig) -> None:
    from envs.config import VALID_MAP_SIZES
    from envs.maps import MAP_TYPES

    if c.map_size not in VALID_MAP_SIZES:
        raise ConfigError(f"--map_size must be one of {VALID_MAP_SIZES}, got {c.map_size}")
    unknown = [t for t in c.map_types if t not in MAP_TYPES]
    if not c.map_types or unknown:
        raise ConfigError(f"--map_types must be a comma list of {MAP_TYPES}, got {c.map_types}")
    if not 0.0 <= c.wheeled_fraction <= 1.0:
        raise ConfigError(f"--wheeled_fraction must be in [0, 1], got {c.wheeled_fraction}")
    if c.map_size % c.map_pool:
        raise ConfigError(f"--map_pool {c.map_pool} must divide --map_size {c.map_size}; "
                          "pick a divisor (1 turns pooling off)")
    for name in ("dig_distance", "pose_distance"):
        if getattr(c, f"use_{name}") and c.drivable_soil_height != 1:
            raise ConfigError(f"--enable_{name} assumes --drivable_soil_height 1 (its free "
                              f"tiles), got {c.drivable_soil_height}; drop one of the two")
    if c.remember_refused_digs and not c.use_action_mask:
        raise ConfigError("--enable_remember_refused_digs records the action mask's refusals; "
                          "add --enable_action_mask")
    if c.map_encoder == "none" and not (c.use_compass or c.egocentric_radius):
        raise ConfigError(
            "--map_encoder none leaves the policy blind to the map; add --enable_compass or "
            "--egocentric_radius R"
        )
    unknown = [t for t in c.curriculum if t not in MAP_TYPES]
    if unknown:
        raise ConfigError(f"--curriculum must be a comma list of {MAP_TYPES}, got {c.curriculum}")
    if len(set(c.curriculum)) != len(c.curriculum):
        raise ConfigError(f"--curriculum lists a level twice: {c.curriculum}")
    if c.curriculum and c.curriculum_promote_after < 1:
        raise ConfigError(
            f"--curriculum_promote_after must be >= 1, got {c.curriculum_promote_after}"
        )
    if c.curriculum and c.dataset_path:
        raise ConfigError("--curriculum needs procedural maps; drop --dataset_path/DATASET_PATH")
    if c.eval_map_seed == c.map_seed:
        raise ConfigError(
            f"--eval_map_seed {c.eval_map_seed} equals --map_seed: evaluation maps must be "
            "held out; pick another seed"
        )
    if c.validation_map_seed in (c.map_seed, c.eval_map_seed):
        raise ConfigError(
            f"--validation_map_seed {c.validation_map_seed} equals --map_seed or "
            "--eval_map_seed: validation maps must be held out from both; pick another seed"
        )
