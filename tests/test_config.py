"""TrainConfig presets, flags and validation. (Step accounting and the config round trip
with legacy defaults are the training-accounting and checkpoint-config-restore validation
gates: tests/test_validation.py.)"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from terra_rl.cli.flags import parse_train_args
from terra_rl.config import (
    AUTO_UPDATES_PER_DISPATCH,
    PRESETS,
    ConfigError,
    get_preset,
    resolve,
)
from terra_rl.config_checks import validate
from terra_rl.validation import small

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_presets_carry_the_settings_that_finish_64x64_maps():
    """solo, trench and mixed: `cpu_small_maps`' inputs, rules and PPO settings at 64x64
    (docs/TRAINING.md), 1024 envs on every local GPU in bfloat16, their map types and
    excavators their own, >= 256 held-out episodes per (map type, excavator) group."""
    small = get_preset("cpu_small_maps")
    groups = {"solo_excavator": (("foundations",), 0.0, 1),
              "trench_excavator": (("trenches",), 0.0, 1),
              "mixed_excavators": (("foundations", "trenches"), 0.5, 4)}
    for name, (map_types, wheeled, num_groups) in groups.items():
        c = get_preset(name)
        assert c.preset == name
        assert (c.env, c.map_types, c.map_size, c.map_pool, c.max_steps) == (
            "excavation", map_types, 64, 4, 1500)
        assert c.wheeled_fraction == wheeled and c.reward == "dense" and c.discounted_shaping
        assert (c.num_devices, c.num_envs_per_device, c.precision) == (0, 1024, "bfloat16")
        assert c.eval_episodes >= 256 * num_groups and not c.curriculum
        for field in ("use_action_mask", "use_compass", "use_dig_distance",
                      "use_pose_distance", "mask_cut_off_digs", "mask_cut_off_dumps",
                      "mask_dump_outside_zones", "remember_refused_digs", "map_encoder",
                      "hidden_dim", "map_feature_dim", "num_steps", "update_epochs",
                      "num_minibatches", "lr", "ent_coef_start", "stall_steps"):
            assert getattr(c, field) == getattr(small, field), (name, field)
        # A longer horizon than the 16x16 preset's 0.99 for 64x64 episodes (docs/RESULTS.md).
        assert c.use_action_mask and c.use_pose_distance and c.gamma == 0.9975 > small.gamma
        assert (c.num_steps, c.update_epochs, c.num_minibatches) == (32, 4, 4)
        assert dataclasses.replace(c, num_devices=1).num_updates == 1000  # on one GPU


def test_other_presets():
    demo = get_preset("cpu_demo")
    assert demo.map_size <= 32 and demo.precision == "float32"
    # The tests' tiny config keeps cpu_demo's maps, curriculum, encoder, compass, dig
    # distance, cut-off mask and stall limit, so CLI tests on the preset share its compiles.
    for name in ("map_size", "map_types", "curriculum", "map_encoder", "use_action_mask",
                 "use_compass", "use_dig_distance", "use_pose_distance", "mask_cut_off_digs",
                 "stall_steps"):
        assert small.SMOKE_FIELDS[name] == getattr(demo, name), name
    assert demo.curriculum and demo.curriculum[-1] in demo.map_types
    for name in PRESETS:
        validate(resolve(get_preset(name), 4), 4)


def test_cpu_small_maps_is_cpu_demo_with_the_documented_flags():
    """docs/RESULTS.md's 16x16 runs used `cpu_demo` and these flags; the preset is them."""
    args = parse_train_args(
        ["--config", "cpu_demo", "--map_types", "trenches,foundations", "--curriculum", "",
         "--wheeled_fraction", "0.5", "--enable_mask_dump_outside_zones",
         "--enable_mask_cut_off_dumps", "--enable_remember_refused_digs",
         "--total_timesteps", "5734400", "--log_eval_interval", "200"])
    small_maps = get_preset("cpu_small_maps")
    assert dataclasses.replace(args.config, preset="cpu_small_maps") == small_maps
    assert small_maps.num_updates == 2800 and small_maps.curriculum == ()


def test_flags_override_preset_fields():
    args = parse_train_args(
        ["--config", "cpu_demo", "--enable_action_mask", "--map_types", "foundations,trenches",
         "--lr", "0.01", "--num_envs_per_device", "32", "--disable_clip_value_loss",
         "--separate_actor_critic_trunks", "--eval_sampling"]
    )
    c = args.config
    assert c.preset == "cpu_demo" and c.map_size == get_preset("cpu_demo").map_size
    assert c.use_action_mask and c.map_types == ("foundations", "trenches")
    assert c.lr == 0.01 and c.num_envs_per_device == 32 and not c.clip_value_loss
    assert c.separate_actor_critic_trunks and c.eval_sampling
    assert set(args.overrides) == {
        "use_action_mask", "map_types", "lr", "num_envs_per_device", "clip_value_loss",
        "separate_actor_critic_trunks", "eval_sampling",
    }


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(num_envs_per_device=100, num_minibatches=7), "3200 transitions is not divisible"),
        (dict(num_devices=8), "local device"),
        (dict(eval_episodes=10, num_devices=4), "eval_episodes"),
        (dict(precision="float8"), "--precision"),
        (dict(map_size=48), "--map_size"),
        (dict(map_types=("castles",)), "--map_types"),
        (dict(env="atari:Pong"), "--env"),
        (dict(env="gymnax:CartPole-v1", use_action_mask=True), "action_mask"),
        (dict(num_steps=0), "--num_steps"),
        (dict(gamma=1.5), "--gamma"),
        (dict(best_metric="eval/completion_rate"), "use validation/completion_rate"),
        (dict(best_metric="eval_sampled/rewards"), "reported eval pool"),
        (dict(validation_map_seed=1_000_003), "--validation_map_seed"),
        (dict(validation_map_seed=0), "held out from both"),
    ],
)
def test_invalid_configs_give_one_line_errors(change, fragment):
    config = dataclasses.replace(get_preset("solo_excavator"), **{"num_devices": 4, **change})
    with pytest.raises(ConfigError) as error:
        validate(config, 4)
    message = str(error.value)
    assert fragment in message and "\n" not in message


def test_minibatches_need_only_the_rollout_to_divide():
    """Minibatches are single transitions: 6 envs x 32 steps split into 4 minibatches of 48,
    though 6 envs do not divide by 4."""
    config = dataclasses.replace(get_preset("cpu_demo"), num_envs_per_device=6,
                                 num_minibatches=4, eval_episodes=6)
    validate(config, 1)
    assert config.minibatch_size == 48


def test_resolve_fills_devices_and_dataset_from_environment(monkeypatch):
    monkeypatch.setenv("DATASET_PATH", "/data/maps")
    monkeypatch.setenv("DATASET_SIZE", "12")
    c = resolve(get_preset("solo_excavator"), 4)
    assert c.num_devices == 4 and c.dataset_path == "/data/maps" and c.dataset_size == 12
    assert not c.compilation_cache_dir.startswith("~")
    monkeypatch.setenv("DATASET_SIZE", "many")
    with pytest.raises(ConfigError, match="DATASET_SIZE"):
        resolve(get_preset("solo_excavator"), 4)


@pytest.mark.parametrize("env, conv_impl, given, expected", [
    ("gymnax:CartPole-v1", "auto", 0, AUTO_UPDATES_PER_DISPATCH),
    ("gymnax:Breakout-MinAtar", "lax", 0, 1),  # lax convolutions crawl inside a CPU loop
    ("excavation", "auto", 0, 1),
    ("gymnax:CartPole-v1", "auto", 3, 3),
    ("excavation", "auto", 5, 5),
])
def test_updates_per_dispatch_auto_resolves_by_env(env, conv_impl, given, expected):
    config = dataclasses.replace(get_preset("cpu_demo"), env=env, conv_impl=conv_impl,
                                 updates_per_dispatch=given)
    if env.startswith("gymnax:"):  # without the excavation-only inputs
        config = dataclasses.replace(config, use_action_mask=False, use_dig_distance=False,
                                     use_pose_distance=False, curriculum=())
    assert get_preset("cpu_demo").updates_per_dispatch == 0
    assert resolve(config, 1).updates_per_dispatch == expected


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train_mixed.py"), *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )


def test_cli_help_lists_every_field_with_preset_values():
    result = run_cli("--config", "cpu_demo", "--help")
    assert result.returncode == 0
    for field in ("--num_envs_per_device", "--enable_action_mask", "--total_timesteps",
                  "--map_encoder", "--wandb_mode", "--resume", "--compilation_cache_dir"):
        assert field in result.stdout
    assert "(preset: 16)" in result.stdout  # cpu_demo's map_size


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--bogus_flag", "1"], "unrecognized arguments"),
        (["--num_minibatches", "3"], "transitions is not divisible"),
        (["--num_devices", "64"], "local device"),
        (["--config", "no_such_preset"], "invalid choice"),
        (["--resume", "/nonexistent/run"], "/nonexistent/run"),
    ],
)
def test_cli_errors_exit_2_with_one_line(args, fragment, tmp_path):
    extra = [] if "--resume" in args else ["--runs_dir", str(tmp_path)]
    result = run_cli(*args, *extra)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert not any(tmp_path.iterdir())  # nothing created
