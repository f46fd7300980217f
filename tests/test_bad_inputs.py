"""Every bad input a user can give `train_mixed.py` (and the benchmark script's `--set`) is
answered by a subprocess that exits 2 with one line on stderr saying what is wrong and how to
fix it: no traceback, no run directory, no W&B files. The cases run two at a time (each is
its own process: a Python start-up, no compile)."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.dataset import save_map_dataset
from envs.maps import default_spawn_clearance, generate_maps

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "train_mixed.py")
BENCHMARK = str(REPO / "scripts" / "benchmark_train.py")
RESULTS = str(REPO / "scripts" / "run_results.py")
SOLO = ["--config", "solo_excavator"]
# solo_excavator without its excavation-only inputs, as a gymnax run would need it.
GYMNAX_BASE = [*SOLO, "--disable_action_mask", "--disable_dig_distance", "--disable_pose_distance"]

# name -> (script, flags, a phrase the error must contain). {data}: the case's directory,
# holding a valid 16x16 dataset (data/maps), a run dir without checkpoint (data/no_ckpt) and
# a plain file (data/a_file); the runs dir is {data}/runs.
CASES: dict[str, tuple[str, list[str], str]] = {
    "unknown preset": (TRAIN, ["--config", "tiny_moon"], "invalid choice: 'tiny_moon'"),
    "unknown flag": (TRAIN, ["--num_env", "8"], "unrecognized arguments: --num_env"),
    "zero envs": (TRAIN, ["--num_envs_per_device", "0"],
                  "--num_envs_per_device must be >= 1, got 0"),
    "negative envs": (TRAIN, ["--num_envs_per_device", "-8"], "must be >= 1, got -8"),
    "not an integer": (TRAIN, ["--num_steps", "lots"], "invalid int value: 'lots'"),
    "results: unknown task": (RESULTS, ["--tasks", "Pong-v0", "--out-dir", "{data}/results"],
                              "--tasks: unknown ['Pong-v0']"),
    "results: bad seeds": (RESULTS, ["--seeds", "0,x", "--out-dir", "{data}/results"],
                           "--seeds must be a comma list of integers"),
    "results: out dir under a file": (RESULTS, ["--out-dir", "{data}/a_file/results"],
                                      "a_file/results: Not a directory"),
    "conv impl": (TRAIN, ["--conv_impl", "cudnn"], "--conv_impl must be one of"),
    "image encoder": (TRAIN, ["--image_encoder", "vit"], "--image_encoder must be one of"),
    "gymnax activation": (TRAIN, ["--gymnax_activation", "gelu"],
                          "--gymnax_activation must be one of"),
    "gymnax hidden width": (TRAIN, ["--gymnax_hidden_dim", "0"],
                            "--gymnax_hidden_dim must be >= 1, got 0"),
    "timeouts terminal on excavation": (TRAIN, ["--enable_gymnax_timeouts_terminal"],
                                        "--enable_gymnax_timeouts_terminal needs --env gymnax"),
    "scaled observations on excavation": (
        TRAIN, ["--enable_gymnax_scale_observations"],
        "--enable_gymnax_scale_observations needs --env gymnax"),
    "lr end above lr": (TRAIN, ["--lr", "1e-3", "--lr_end", "2e-3"], "--lr_end must be in"),
    "updates per dispatch": (TRAIN, ["--updates_per_dispatch", "-1"],
                             "--updates_per_dispatch must be >= 0, got -1"),
    "below one update": (TRAIN, ["--total_timesteps", "1000"], "less than one update"),
    "minibatches": (TRAIN, ["--num_minibatches", "3"], "not divisible into --num_minibatches"),
    "eval episodes over devices": (
        TRAIN, ["--num_devices", "4", "--eval_episodes", "10"], "use a multiple of --num_devices"),
    "more devices than exist": (TRAIN, ["--num_devices", "64"], "lower --num_devices"),
    "map size": (TRAIN, ["--map_size", "20"], "--map_size must be one of"),
    "map pool": (TRAIN, ["--map_size", "16", "--map_pool", "3"], "--map_pool 3 must divide"),
    "wheeled fraction": (TRAIN, ["--wheeled_fraction", "1.5"], "--wheeled_fraction must be in"),
    "gamma": (TRAIN, ["--gamma", "1.5"], "--gamma must be in (0, 1]"),
    "unknown map type": (TRAIN, ["--map_types", "volcanos"], "--map_types must be a comma list"),
    "unknown curriculum level": (TRAIN, ["--curriculum", "tiny_trenches,moon"],
                                 "--curriculum must be a comma list"),
    "eval maps not held out": (TRAIN, ["--eval_map_seed", "0"], "evaluation maps must be held"),
    "blind policy": (TRAIN, ["--map_encoder", "none", "--disable_compass"],
                     "--map_encoder none leaves the policy blind"),
    "refusals without a mask": (TRAIN, ["--enable_remember_refused_digs",
                                        "--disable_action_mask"],
                                "--enable_remember_refused_digs records the action mask's"),
    "unknown gymnax id": (TRAIN, [*GYMNAX_BASE, "--env", "gymnax:Moonlander-v9"],
                          "Moonlander-v9"),
    "action mask with gymnax": (TRAIN, [*SOLO, "--env", "gymnax:CartPole-v1",
                                        "--enable_action_mask"], "--enable_action_mask needs"),
    "dig distance with gymnax": (TRAIN, [*SOLO, "--disable_action_mask", "--env",
                                         "gymnax:CartPole-v1"], "--enable_dig_distance needs"),
    "pose distance with gymnax": (TRAIN, [*SOLO, "--disable_action_mask",
                                          "--disable_dig_distance", "--env",
                                          "gymnax:CartPole-v1"],
                                  "--enable_pose_distance needs"),
    "unknown env": (TRAIN, ["--env", "minecraft"], "--env must be 'excavation' or 'gymnax:<id>'"),
    "missing dataset": (TRAIN, [*SOLO, "--dataset_path", "{data}/nowhere"], "manifest not found"),
    "truncated dataset file": (TRAIN, [*SOLO, "--map_size", "16", "--dataset_path",
                                       "{data}/truncated"], "checksum mismatch"),
    "dataset of the wrong dtype": (TRAIN, [*SOLO, "--map_size", "16", "--dataset_path",
                                           "{data}/wrong_dtype"], "expected int8"),
    "dataset of the wrong map size": (TRAIN, [*SOLO, "--map_size", "32", "--dataset_path",
                                              "{data}/maps"],
                                      "maps are 16x16 but --map_size is 32; set --map_size 16"),
    "dataset with a curriculum": (TRAIN, ["--config", "cpu_demo", "--dataset_path", "{data}/maps"],
                                  "--curriculum needs procedural maps"),
    "resume of a missing dir": (TRAIN, ["--resume", "{data}/no_such_run"], "does not exist"),
    "resume without checkpoint": (TRAIN, ["--resume", "{data}/no_ckpt"],
                                  "has no checkpoint to resume from"),
    "resume of a non-run dir": (TRAIN, ["--resume", "{data}"], "is not a terra_rl run"),
    "resume with another env": (TRAIN, ["--resume", "{data}/no_ckpt", "--env", "gymnax:Acrobot-v1"],
                                "cannot change: --env"),
    "resume with --config": (TRAIN, ["--resume", "{data}/no_ckpt", "--config", "cpu_demo"],
                             "--config cannot be combined with --resume"),
    "W&B mode": (TRAIN, ["--wandb_mode", "sometimes"], "--wandb_mode must be one of"),
    "precision": (TRAIN, ["--precision", "float8"], "--precision must be one of"),
    "best metric": (TRAIN, ["--best_metric", "eval/loss"], "reported eval pool"),
    "best metric unknown": (TRAIN, ["--best_metric", "validation/loss"],
                            "--best_metric must be one of"),
    "dataset all held out": (TRAIN, [*SOLO, "--map_size", "16", "--dataset_path", "{data}/maps"],
                             "none is left to train on"),
    "dataset size past the split": (TRAIN, ["--config", "cpu_small_maps", "--eval_episodes", "1",
                                            "--dataset_size", "3", "--dataset_path",
                                            "{data}/maps"], "exceeds the 2 maps"),
    "max updates": (TRAIN, ["--max_updates", "0"], "--max_updates must be >= 1"),
    "runs dir under a file": (TRAIN, ["--runs_dir", "{data}/a_file/runs"],
                              "pick another --runs_dir"),
    "--set of an unknown field": (BENCHMARK, ["--config", "cpu_demo", "--set", "num_envs=8"],
                                  "with a TrainConfig field, got 'num_envs=8'"),
}


def make_case_data(root: Path) -> None:
    maps = generate_maps(("trenches",), 16, 4, seed=0, spawn_clearance=default_spawn_clearance(16))
    save_map_dataset(maps, root / "maps", seed=0, types=("trenches",))
    truncated = root / "truncated"
    save_map_dataset(maps, truncated, seed=0, types=("trenches",))
    data = (truncated / "target_map.npy").read_bytes()
    (truncated / "target_map.npy").write_bytes(data[: len(data) // 2])
    wrong = root / "wrong_dtype"
    save_map_dataset(maps, wrong, seed=0, types=("trenches",))
    np.save(wrong / "obstacles.npy", maps.obstacles.astype(np.float32))
    manifest = json.loads((wrong / "manifest.json").read_text())
    entry = manifest["files"]["obstacles"]
    entry["sha256"] = hashlib.sha256((wrong / "obstacles.npy").read_bytes()).hexdigest()
    entry["dtype"] = "float32"
    (wrong / "manifest.json").write_text(json.dumps(manifest))
    (root / "no_ckpt" / "checkpoints").mkdir(parents=True)
    (root / "no_ckpt" / "config.json").write_text(json.dumps({"preset": "cpu_demo"}))
    (root / "a_file").write_text("not a directory\n")


def run_case(name: str, root: Path) -> tuple[subprocess.CompletedProcess, Path]:
    script, flags, _ = CASES[name]
    data = root / name.replace(" ", "_").replace("-", "").replace("&", "")
    data.mkdir(parents=True)
    make_case_data(data)
    args = [flag.replace("{data}", str(data)) for flag in flags]
    if script == TRAIN and "--resume" not in args:
        args += ["--runs_dir", str(data / "runs")] if "--runs_dir" not in args else []
    env = {k: v for k, v in os.environ.items() if k not in ("DATASET_PATH", "DATASET_SIZE")}
    env.update(WANDB_MODE="offline", JAX_PLATFORMS="cpu")  # a W&B run, were one started
    result = subprocess.run([sys.executable, script, *args], cwd=data, env=env,
                            capture_output=True, text=True, timeout=300)
    return result, data


@functools.cache
def all_results(root: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_case, name, root) for name in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return all_results(tmp_path_factory.mktemp("bad_inputs"))


def test_each_phrase_tells_its_error_from_every_other(results):
    """A phrase that another case's error also contains cannot show that a case failed for
    its own reason (a phrase like "16" or a bare flag name matches many errors)."""
    shared = {name: also_in for name, (_, _, phrase) in CASES.items()
              if (also_in := sorted(other for other, (result, _) in results.items()
                                    if other != name and phrase in result.stderr))}
    assert not shared, shared


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(results, name):
    result, data = results[name]
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    prog = Path(CASES[name][0]).name
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert CASES[name][2] in lines[0], lines[0]
    assert not (data / "runs").exists()
    assert not list(data.rglob("wandb"))
    assert not (data / "no_ckpt" / "manifest.json").exists()
    assert json.loads((data / "no_ckpt" / "config.json").read_text()) == {"preset": "cpu_demo"}
