"""The GPU presets at their own shape on the CPU: each 64x64 preset compiles, runs 2 updates
and one evaluation (few envs and eval episodes, the preset's own maps, rules, inputs and
network), through the command line a Slurm job runs.

The horizon is cut to `HORIZON` steps: it is the length of the evaluation's scan, not a
shape, so the programs compiled are those of the preset's own 1500. At 1500 the two
evaluation pools' scans took most of this file's time on the 2-core CPU: the mixed preset's
run took 131 s in a full suite run, 88 s there with 100 steps (50 s alone). The presets' own
horizon is asserted in tests/test_config.py.

`trench_excavator` is `solo_excavator` on trench maps alone: the same env config, network and
shapes, so its run compiled the same programs (loaded from the cache after solo's: update 5.2
s against 11.0 s), and `mixed_excavators` trains and evaluates on 64x64 trench maps too. The
last test holds the presets to that; its own run was dropped to keep `make test` within 8
minutes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terra_rl.adapters.train_env import excavation_env_config
from terra_rl.config import get_preset
from terra_rl.run.trainer import policy_config
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[1]
RUN_PRESETS = ("solo_excavator", "mixed_excavators")
HORIZON = 100


@pytest.mark.parametrize("preset", RUN_PRESETS)
def test_each_gpu_preset_trains_and_evaluates_at_64x64_on_the_cpu(preset, tmp_path):
    config = get_preset(preset)
    groups = len(config.map_types) * (2 if 0 < config.wheeled_fraction < 1 else 1)
    eval_episodes = 2 * groups
    env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_MODE="disabled")
    env["XLA_FLAGS"] = xla_flags()  # one CPU device, as on a 1-GPU machine
    result = subprocess.run(
        [sys.executable, str(REPO / "train_mixed.py"), "--config", preset,
         "--num_envs_per_device", "8", "--eval_episodes", str(eval_episodes),
         "--max_steps", str(HORIZON),
         "--max_updates", "2", "--log_train_interval", "1", "--log_eval_interval", "2",
         "--checkpoint_interval", "2", "--runs_dir", str(tmp_path), "--run_name", "run",
         "--compilation_cache_dir", os.environ["TERRA_RL_TEST_CACHE"]],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    saved = json.loads((run / "config.json").read_text())
    for field in ("map_size", "map_pool", "precision", "use_action_mask",
                  "use_pose_distance", "mask_cut_off_digs", "wheeled_fraction", "gamma"):
        assert saved[field] == getattr(config, field), field
    assert (saved["map_size"], saved["max_steps"], config.max_steps) == (64, HORIZON, 1500)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["update"] for r in train] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in train)
    evals = [r for r in records if r["update"] == 2 and "eval/completion_rate" in r]
    assert len(evals) == 1
    final = evals[0]
    for prefix in ("eval", "validation"):
        assert 0.0 <= final[f"{prefix}/completion_rate"] <= 1.0
        for map_type in config.map_types:
            kinds = ("tracked", "wheeled") if config.wheeled_fraction else ("tracked",)
            for kind in kinds:
                assert f"{prefix}/completion_rate/{map_type}/{kind}" in final
    # A whole horizon: every env's first episode ran up to its last step.
    assert final["eval/episodes_finished"] >= eval_episodes
    assert (run / "checkpoints" / "2").is_dir()


def test_the_trench_preset_is_the_solo_run_on_trench_maps_which_the_mixed_run_covers():
    solo, trench = get_preset("solo_excavator"), get_preset("trench_excavator")
    assert trench == dataclasses.replace(solo, map_types=("trenches",),
                                         preset="trench_excavator")
    assert excavation_env_config(trench) == excavation_env_config(solo)
    assert policy_config(trench) == policy_config(solo)
    assert "trenches" in get_preset("mixed_excavators").map_types
