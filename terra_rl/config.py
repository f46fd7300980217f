"""`TrainConfig`: every setting of a training run, the named presets, validation and the
step accounting.

A run's configuration is one frozen dataclass. Presets are instances of it; command-line
flags (`terra_rl.cli.flags`) override preset fields; `resolve` fills the run-time defaults and
`terra_rl.config_checks.validate` rejects bad values and combinations before anything is
compiled.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from envs.dataset import DatasetError
from envs.params import dataset_from_environment

DEFAULT_COMPILATION_CACHE_DIR = str(Path("~/.cache/terra_rl/xla-cache"))
# `updates_per_dispatch` 0 on a gymnax env: the standard tasks' setting. CartPole's command in
# docs/TRAINING.md trains 25-35% faster with it than with 1 (docs/PERFORMANCE.md).
AUTO_UPDATES_PER_DISPATCH = 16


class ConfigError(ValueError):
    """A bad setting or combination of settings; the message is one line."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run. Field docs are shown by `train_mixed.py --help`."""

    # Environment
    env: str = "excavation"
    """'excavation' or 'gymnax:<id>' (e.g. gymnax:CartPole-v1)."""
    map_size: int = 64
    map_types: tuple[str, ...] = ("foundations",)
    max_steps: int = 550
    stall_steps: int = 0
    """Training envs only: end an episode as a timeout after this many steps without new
    task progress (0 = never); evaluation always runs `max_steps`."""
    wheeled_fraction: float = 0.0
    """Share of wheeled excavators in each batch (0 = tracked only)."""
    drivable_soil_height: int = 1
    """Soil up to this height can be driven over (1: Terra's rule; 0: every soil tile blocks)."""
    dig_before_pickup: bool = True
    """DO digs the undug targets in reach before it picks up soil."""
    pickup_misplaced_only: bool = True
    """DO picks up only soil outside the dump zones of maps with zones (envs.config)."""
    mask_dead_end_digs: bool = True
    """The action mask forbids a dig after which the load could be dumped nowhere."""
    mask_dead_end_pickups: bool = True
    """The action mask forbids a pick-up after which the load could be dumped nowhere."""
    mask_cut_off_digs: bool = False
    """The action mask forbids a dig after which an undug target is in reach of no pose the
    base can still drive to (envs.reachability; a flood fill per step, costly on 32x32 and
    64x64 maps: docs/PERFORMANCE.md)."""
    mask_cut_off_dumps: bool = False
    """The action mask forbids a dump after which an undug target is in reach of no pose the
    base can still drive to (soil higher than `drivable_soil_height` blocks; envs.config)."""
    remember_refused_digs: bool = False
    """The observation marks the targets whose dig the action mask refused since the map last
    changed, and the policy's way to the next dig leaves them out (envs.config)."""
    dump_after_full_turn: bool = True
    """The dump rules yield once a loaded cabin has turned full circle without a dump
    (envs.config)."""
    mask_dump_outside_zones: bool = False
    """The action mask forbids dumping outside the dump zones while a cabin turn reaches a
    free zone tile (maps with zones only; envs.config)."""
    revisit_memory: int = 128
    """The action mask forbids returning to one of this many recent poses since the last dig
    or dump (envs.config.EnvConfig.revisit_memory); 0 = off."""
    reward: str = "dense"
    discounted_shaping: bool = True
    """Pay the progress shaping as gamma * Phi(s') - Phi(s) with the run's --gamma, the
    potential-based form that no loop can farm at that gamma (envs.rewards); disabled pays
    Phi(s') - Phi(s), which a pick-up and dump loop farms under any gamma < 1 (runs saved
    before the change resume with it)."""
    num_maps: int = 256
    """Procedural maps generated when no dataset is given."""
    map_seed: int = 0
    dataset_path: str = ""
    """Map dataset directory; empty = DATASET_PATH, else procedural maps."""
    dataset_size: int = 0
    """Use the first K maps of the dataset; 0 = DATASET_SIZE, else all."""
    use_action_mask: bool = False
    """Mask invalid actions in the policy (flags --enable_action_mask/--disable_action_mask)."""
    curriculum: tuple[str, ...] = ()
    """Curriculum levels, easiest first (map types, e.g. tiny_trenches,trenches); training
    maps are these types and each env is promoted on its own successes; empty = off
    (training maps are --map_types)."""
    curriculum_promote_after: int = 2
    """Consecutive successful episodes that promote an env to the next level."""
    curriculum_demote_after: int = 0
    """Consecutive timeouts that demote an env one level; 0 = never demote."""
    eval_map_seed: int = 1_000_003
    """Seed of the held-out evaluation maps that results are reported on (--map_types,
    --eval_episodes maps, never in the training pool; generated maps only: a dataset run
    holds out its last --eval_episodes maps instead)."""
    validation_map_seed: int = 2_000_003
    """Seed of the validation maps that choose the best checkpoint (--eval_episodes maps,
    never in the training or evaluation pool; generated maps only: a dataset run validates on
    the --eval_episodes maps before its evaluation maps). The reported evaluation pool never
    chooses a checkpoint."""

    # Scale and step accounting
    num_devices: int = 0
    """0 = all local devices (with --distributed: all devices of every process)."""
    num_envs_per_device: int = 1024
    num_steps: int = 32
    total_timesteps: int = 50_000_000_000
    seed: int = 0

    # PPO
    update_epochs: int = 2
    num_minibatches: int = 16
    lr: float = 3e-4
    lr_schedule: str = "constant"
    """constant, linear or cosine: annealed from --lr to --lr_end over --lr_decay_updates."""
    lr_end: float = 0.0
    """The learning rate a linear or cosine schedule ends at, then keeps."""
    lr_decay_updates: int = 0
    """Length of the linear or cosine schedule, in updates; 0 = the whole run (num_updates)."""
    gamma: float = 0.9984
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_coef: float = 2.0
    max_grad_norm: float = 0.5
    ent_coef_start: float = 0.15
    ent_coef_end: float = 0.005
    ent_coef_decay_updates: int = 9500
    """Cosine schedule length of the entropy coefficient, in updates."""
    clip_value_loss: bool = True
    normalize_advantages: bool = True

    # Model
    map_encoder: str = "atari"
    map_feature_dim: int = 256
    hidden_dim: int = 256
    separate_actor_critic_trunks: bool = False
    image_encoder: str = "cnn"
    """Gymnax image observations (MinAtar): cnn (a conv 16 3x3 + Dense 64) or mlp (the 2 x
    64 MLP over the flattened image; several times faster on CPU, and, with relu, the
    standard-task table's MinAtar network, docs/RESULTS.md)."""
    gymnax_activation: str = "tanh"
    """Hidden activation of the gymnax MLP (vector observations, and image observations with
    --image_encoder mlp): tanh or relu (the standard-task table's MinAtar network)."""
    gymnax_timeouts_terminal: bool = False
    """Gymnax envs: train on a timeout as on a natural end (no bootstrap from the final
    observation), as gymnax-blines and PureJaxRL do. Wrong in principle: without the time in
    the observation, states late in an episode look better than early ones. At gymnax-blines'
    MountainCar-v0 settings that error is what finds the flag; with its observations scaled
    the table's row finds it without (docs/RESULTS.md), and no row uses this."""
    gymnax_scale_observations: bool = False
    """Gymnax envs: map every observation dimension the env's observation space bounds to
    [-1, 1] (unbounded ones pass unchanged), in training and eval alike. MountainCar-v0's
    row of the standard-task table uses it (docs/RESULTS.md); an env whose space bounds
    nothing is refused."""
    gymnax_hidden_dim: int = 64
    """Width of the gymnax networks' hidden layers: both layers of each MLP, the CNN's Dense
    (64 as in PureJaxRL; gymnax-blines' MinAtar MLPs are 256 wide)."""
    conv_impl: str = "auto"
    """How convolutions run: lax (`lax.conv`), patches (image patches times the kernel
    matrix, the same parameters), or auto: patches on CPU, where a `lax.conv` gradient
    inside the PPO loops is slow enough that they had to be unrolled, lax elsewhere."""
    use_compass: bool = False
    """Feed the policy egocentric counts of the tiles to dig, free dump space, soil and
    obstacles per direction and distance (`terra_rl.features.compass`)."""
    use_dig_distance: bool = False
    """Feed the policy the dig-distance field around it: 8-connected steps over free tiles to
    the nearest tile from which the arm reaches an undug target
    (`terra_rl.features.dig_distance`)."""
    use_pose_distance: bool = False
    """Feed the policy the base actions (moves, turns, wheel turns) from its state, and after
    each base action, to the nearest pose whose arm reaches work
    (`terra_rl.features.pose_distance`)."""
    egocentric_radius: int = 0
    """With > 0, feed the policy the map around the agent, turned to its base heading, a square
    of 2 * radius + 1 tiles (`terra_rl.features.egocentric`); 0 turns it off."""
    map_pool: int = 1
    """Average the global map channels over map_pool x map_pool tiles before the map encoder
    (a divisor of map_size): 2 at 32x32 feeds the encoder 16x16, a quarter of the flat
    encoder's work, which is most of the network's at that size."""
    precision: str = "bfloat16"
    """Model compute dtype: float32, bfloat16 or float16 (parameters are float32)."""

    # Evaluation, logging, checkpoints
    log_train_interval: int = 1
    log_eval_interval: int = 100
    """Evaluate every N updates (and at the end); 0 = only at the end."""
    eval_episodes: int = 128
    """Held-out eval episodes, split over the devices (128 splits over 1, 2, 4 or 8)."""
    eval_sampling: bool = True
    """Also evaluate the sampled policy (logged as eval_sampled/...); the greedy policy is
    always evaluated (eval/...)."""
    checkpoint_interval: int = 100
    """Checkpoint every N updates (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 3
    best_metric: str = ""
    """Validation metric (higher is better) whose improvement saves the best checkpoint, at
    any eval: the greedy policy on the validation pool (--validation_map_seed), never on the
    reported evaluation pool; empty = validation/completion_rate, or
    validation/first_episode_return for gymnax envs."""
    cache_clear_interval: int = 0
    """Call jax.clear_caches() after every N completed updates; 0 = never."""
    updates_per_dispatch: int = 0
    """Run up to N updates in one device call (a loop inside the compiled function); evals,
    checkpoints and stop requests still fall on their updates and every update's metrics
    are logged. Pays where an update is short next to the host round trip (small MLP
    policies); with --conv_impl lax on CPU the convolutions would run slowly inside the loop.
    0 = auto: `AUTO_UPDATES_PER_DISPATCH` for gymnax envs (an update takes milliseconds)
    unless --conv_impl is lax, 1 for the excavation env (an update takes tenths of a
    second, so the round trip is lost in it)."""
    compilation_cache_dir: str = DEFAULT_COMPILATION_CACHE_DIR
    """Persistent XLA compilation cache; empty disables it."""
    init_params: str = ""
    """A run directory whose checkpointed policy parameters this run starts from (a warm
    start: fresh optimizer, counters and envs; the network's shapes must match,
    `terra_rl.run.warm_start`); empty = random initial parameters. Ignored on --resume."""
    init_params_checkpoint: str = "latest"
    """Which checkpoint of --init_params: latest, best or an update number."""
    runs_dir: str = "runs"
    run_name: str = ""
    """Empty = '<preset>-<timestamp>'."""
    wandb_mode: str = ""
    """online, offline or disabled; empty = WANDB_MODE, else disabled."""
    wandb_project: str = "terra_rl"
    wandb_entity: str = ""
    wandb_tags: tuple[str, ...] = ()
    preset: str = ""
    """Name of the preset this run started from (set by the CLI)."""

    # ------------------------------------------------------------ step accounting

    @property
    def num_envs(self) -> int:
        """Environments over all devices (needs a resolved `num_devices`)."""
        return self.num_envs_per_device * self.num_devices

    @property
    def env_steps_per_update(self) -> int:
        return self.num_steps * self.num_envs

    @property
    def num_updates(self) -> int:
        """Updates that cover `total_timesteps`: the last update may run past it, never
        short of it (`num_updates * env_steps_per_update >= total_timesteps`)."""
        return math.ceil(self.total_timesteps / self.env_steps_per_update)

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch on one device."""
        return self.num_envs_per_device * self.num_steps // self.num_minibatches

    @property
    def eval_envs_per_device(self) -> int:
        return self.eval_episodes // self.num_devices

    @property
    def is_gymnax(self) -> bool:
        return self.env.startswith("gymnax:")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


# Fields a config written by an older version may lack, with the value that version
# behaved as (never today's class default, which may differ).
# The env's rules against self-made traps arrived on 2026-11-24; a run from before played by
# the rules before.
LEGACY_DEFAULTS: dict[str, Any] = {
    "use_action_mask": False,
    "drivable_soil_height": 0,
    "dig_before_pickup": False,
    "pickup_misplaced_only": False,
    "mask_dead_end_digs": False,
    "revisit_memory": 0,
    # Arrived on 2026-11-25.
    "mask_cut_off_digs": False,
    # Arrived on 2026-11-26.
    "mask_dump_outside_zones": False,
    "mask_cut_off_dumps": False,
    "mask_dead_end_pickups": False,
    "dump_after_full_turn": False,
    # Arrived on 2026-11-26, late evening.
    "remember_refused_digs": False,
    # The progress shaping was paid undiscounted until 2026-11-28.
    "discounted_shaping": False,
}


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Rebuild a config from `config.json`. Unknown keys are an error; missing keys take
    `LEGACY_DEFAULTS` where listed, else the class default."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config fields {unknown}: written by a newer terra_rl?")
    values = {name: LEGACY_DEFAULTS[name] for name in LEGACY_DEFAULTS if name not in data}
    for name, value in data.items():
        values[name] = tuple(value) if isinstance(value, list) else value
    best = values.get("best_metric", "")
    if best.startswith(("eval/", "eval_sampled/")):
        # Until 2026-11-28 the best checkpoint was chosen on the reported eval pool; a resumed
        # run chooses on the validation pool from then on.
        values["best_metric"] = "validation/" + best.split("/", 1)[1]
    return TrainConfig(**values)


PRESETS: dict[str, TrainConfig] = {
    # The README's main job, sized for 2 CPU cores and 10 minutes: a curriculum from tiny
    # trenches (2-4 tiles) to the generator's 16x16 trenches, evaluated on held-out 16x16
    # trenches; the action mask; a flat (convolution-free) map encoder, whose PPO loops XLA:CPU
    # runs without unrolling, so the update compiles in well under a minute.
    "cpu_demo": TrainConfig(
        map_size=16,
        map_types=("trenches",),
        curriculum=("tiny_trenches", "trenches"),
        max_steps=500,  # the scripted solver: 118-124 steps (median), 239 at most
        num_maps=64,
        use_action_mask=True,
        num_devices=1,
        num_envs_per_device=64,
        num_steps=32,
        total_timesteps=819_200,  # 400 updates: within 10 minutes on a fresh clone of this CPU
        update_epochs=4,
        num_minibatches=4,
        lr=5e-4,
        gamma=0.99,
        ent_coef_start=0.01,
        ent_coef_end=0.01,
        ent_coef_decay_updates=0,
        map_encoder="flat",
        map_feature_dim=128,
        hidden_dim=128,
        use_compass=True,
        use_dig_distance=True,  # the way to the last targets (docs/RESULTS.md)
        use_pose_distance=True,  # base actions to the next dig pose (docs/RESULTS.md)
        mask_cut_off_digs=True,  # a third slower at 16x16, and the main failure before it
        stall_steps=64,  # a policy caught in a loop restarts on a fresh map after 64 steps
        precision="float32",
        log_train_interval=10,
        log_eval_interval=100,
        eval_episodes=64,
        checkpoint_interval=200,
    ),
}

# The CPU preset for small maps: `cpu_demo` on 16x16 trenches and foundations, half the
# excavators wheeled, loads dumped on a zone in reach before anywhere else and never where
# they cut targets off, no curriculum (its envs all end on the last level, so one chain
# cannot train two map types side by side), 2,800 updates, within 30 minutes on the 2-core
# CPU. Its time and what it reaches: docs/RESULTS.md.
PRESETS["cpu_small_maps"] = dataclasses.replace(
    PRESETS["cpu_demo"],
    map_types=("trenches", "foundations"),
    curriculum=(),
    wheeled_fraction=0.5,
    mask_dump_outside_zones=True,  # foundations' soil-stage loop (docs/RESULTS.md)
    mask_cut_off_dumps=True,  # piles that wall targets off, the commonest failure left
    remember_refused_digs=True,  # stalls where the mask refused every dig in reach
    total_timesteps=5_734_400,  # 2,800 updates: 10-37 minutes on this CPU, by the day
    log_eval_interval=200,
)


# The GPU presets: `cpu_small_maps`' inputs, rules and PPO settings at 64x64, which finished
# 90% of held-out 64x64 maps on one H200 after 6.5M env steps where the earlier seed settings
# (the `TrainConfig` defaults: a CNN without mask, compass or distances) finished 0-2% after
# 123M (docs/TRAINING.md says what was kept and dropped). The map encoder pools the 64x64
# layers by 4 to 16x16; the horizon covers the scripted solver's longest 64x64 episodes
# (docs/RESULTS.md); 1024 envs on every local GPU, computing in bfloat16. Gamma 0.9975: a
# 64x64 foundation takes hundreds of steps, and under 0.99 (a reward 400 steps ahead counts 2%)
# training at 64x64 lost the foundations a 32x32 policy finished (docs/RESULTS.md).
_GPU_64 = dataclasses.replace(
    PRESETS["cpu_small_maps"],
    map_size=64,
    map_pool=4,
    max_steps=1500,
    gamma=0.9975,
    wheeled_fraction=0.0,
    num_devices=0,
    num_envs_per_device=1024,
    total_timesteps=32_768_000,  # 1,000 updates of 32,768 env steps on one GPU
    precision="bfloat16",
    log_train_interval=10,
    log_eval_interval=100,
    eval_episodes=256,  # >= 256 held-out episodes per (map type, excavator) group
    eval_sampling=False,
    checkpoint_interval=100,
)
PRESETS["solo_excavator"] = dataclasses.replace(_GPU_64, map_types=("foundations",))
PRESETS["trench_excavator"] = dataclasses.replace(_GPU_64, map_types=("trenches",))
PRESETS["mixed_excavators"] = dataclasses.replace(
    _GPU_64, map_types=("foundations", "trenches"), wheeled_fraction=0.5, eval_episodes=1024)


def get_preset(name: str) -> TrainConfig:
    """The preset `name`, recording its name in the config."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], preset=name)


def resolve(config: TrainConfig, num_local_devices: int) -> TrainConfig:
    """Fill the run-time defaults (devices, dataset from the environment, cache path) and
    validate. The result is what `config.json` records."""
    updates: dict[str, Any] = {}
    if config.num_devices == 0:
        updates["num_devices"] = num_local_devices
    try:
        env_path, env_size = dataset_from_environment()
    except DatasetError as error:
        raise ConfigError(str(error)) from error
    if not config.dataset_path and env_path:
        updates["dataset_path"] = env_path
    if not config.dataset_size and env_size:
        updates["dataset_size"] = env_size
    if config.compilation_cache_dir:
        updates["compilation_cache_dir"] = os.path.expanduser(config.compilation_cache_dir)
    if not config.best_metric:
        updates["best_metric"] = ("validation/first_episode_return" if config.is_gymnax
                                  else "validation/completion_rate")
    if config.updates_per_dispatch == 0:
        many = config.is_gymnax and config.conv_impl != "lax"
        updates["updates_per_dispatch"] = AUTO_UPDATES_PER_DISPATCH if many else 1
    resolved = dataclasses.replace(config, **updates)
    from terra_rl.config_checks import validate  # it imports this module

    validate(resolved, num_local_devices)
    return resolved
