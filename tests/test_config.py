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


def test_solo_excavator_preset_matches_the_baseline():
    c = get_preset("solo_excavator")
    assert c.preset == "solo_excavator"
    assert (c.env, c.map_types, c.map_size, c.max_steps) == (
        "excavation", ("foundations",), 64, 550
    )
    assert c.wheeled_fraction == 0.0 and c.reward == "dense" and not c.use_action_mask
    assert (c.num_envs_per_device, c.num_steps, c.update_epochs, c.num_minibatches) == (
        1024, 32, 2, 16
    )
    assert c.total_timesteps == 50_000_000_000
    assert (c.lr, c.gamma, c.gae_lambda, c.clip_eps, c.vf_coef, c.max_grad_norm) == (
        3e-4, 0.9984, 0.95, 0.2, 2.0, 0.5
    )
    assert (c.ent_coef_start, c.ent_coef_end, c.ent_coef_decay_updates) == (0.15, 0.005, 9500)
    assert (c.log_train_interval, c.log_eval_interval, c.checkpoint_interval) == (1, 100, 100)
    assert c.eval_episodes == 128 and c.num_devices == 0


def test_other_presets():
    assert get_preset("trench_excavator").map_types == ("trenches",)
    mixed = get_preset("mixed_excavators")
    assert 0.0 < mixed.wheeled_fraction < 1.0 and set(mixed.map_types) == {
        "foundations", "trenches"
    }
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
    """docs/RESULTS.md's runs of item 7 used `cpu_demo` and these flags; the preset is them."""
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
