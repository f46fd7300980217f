"""Every bad input a user can give `train_mixed.py` (and the benchmark script's `--set`, and
`scripts/run_results.py`) is answered with exit code 2 and one line on stderr saying what is
wrong and how to fix it: no traceback, no run directory, no W&B files.

Most cases call the script's `main` in this process (argv, working directory and environment
as the command line would set them): well under a second each, where a process costs a
Python and JAX start-up. The cases in `SUBPROCESS_CASES`, one per script and one per stage
of `train_mixed.py`'s set-up (flags, dataset, checkpoint), run as real processes, two at a
time while the others run here: they prove that nothing else reaches stderr (a warning, a
log line) and that the exit code is the process's own."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import jax
import numpy as np
import pytest

import terra_rl.cli.main
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


# Cases that run as real processes; every other case calls `main` in this process.
SUBPROCESS_CASES = frozenset({
    "unknown flag",  # train_mixed.py's argument parser
    "missing dataset",  # the dataset check
    "resume without checkpoint",  # the run directory and orbax
    "results: out dir under a file",  # scripts/run_results.py
    "--set of an unknown field",  # scripts/benchmark_train.py
})


def prepare_case(name: str, root: Path) -> tuple[Path, list[str]]:
    """The case's directory, with its data, and the script's arguments."""
    script, flags, _ = CASES[name]
    data = root / name.replace(" ", "_").replace("-", "").replace("&", "")
    data.mkdir(parents=True)
    make_case_data(data)
    args = [flag.replace("{data}", str(data)) for flag in flags]
    if script == TRAIN and "--resume" not in args:
        args += ["--runs_dir", str(data / "runs")] if "--runs_dir" not in args else []
    return data, args


def run_in_subprocess(name: str, root: Path) -> tuple[subprocess.CompletedProcess, Path]:
    data, args = prepare_case(name, root)
    env = {k: v for k, v in os.environ.items() if k not in ("DATASET_PATH", "DATASET_SIZE")}
    env.update(WANDB_MODE="offline", JAX_PLATFORMS="cpu")  # a W&B run, were one started
    result = subprocess.run([sys.executable, CASES[name][0], *args], cwd=data, env=env,
                            capture_output=True, text=True, timeout=300)
    return result, data


class AcceptedBadInput(Exception):
    """A case got past the script's checks to its real work (training, a benchmark, the
    results runs), which would take minutes in this process."""


@functools.cache
def load_script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # a script's dataclasses look their module up there
    spec.loader.exec_module(script)
    return script


def script_main(script: str, patch: pytest.MonkeyPatch):
    """The script's `main(argv)`, with the work after its checks replaced by a failure."""
    def accepted(*args, **kwargs):
        raise AcceptedBadInput(f"{Path(script).name} accepted the input")

    if script == TRAIN:
        patch.setattr(terra_rl.cli.main, "train", accepted)
        return terra_rl.cli.main.main
    module = load_script(script)
    for work in {BENCHMARK: ("benchmark",), RESULTS: ("standard_tasks", "excavation")}[script]:
        patch.setattr(module, work, accepted)
    return module.main


def run_in_process(name: str, root: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """The case as its process would run it: argv, working directory, environment; stdout
    and stderr captured, SystemExit's code as the exit code, an uncaught exception as 1 with
    its traceback on stderr. The JAX settings `main` may change are restored after it."""
    script = CASES[name][0]
    data, args = prepare_case(name, root)
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_cache = {option: getattr(jax.config, option) for option in (
        "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")}
    with (pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout),
          contextlib.redirect_stderr(stderr)):
        for variable in ("DATASET_PATH", "DATASET_SIZE"):
            patch.delenv(variable, raising=False)
        patch.setenv("WANDB_MODE", "offline")
        patch.chdir(data)
        patch.setattr(sys, "argv", [script, *args])
        try:
            code = script_main(script, patch)(args)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:  # as the interpreter would report it
            traceback.print_exc()
            code = 1
        finally:
            for option, value in saved_cache.items():
                jax.config.update(option, value)
    return subprocess.CompletedProcess([script, *args], code, stdout.getvalue(),
                                       stderr.getvalue()), data


@functools.cache
def all_results(root: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """The subprocess cases two at a time in threads while the others run here in turn."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_in_subprocess, name, root)
                   for name in sorted(SUBPROCESS_CASES)}
        results = {name: run_in_process(name, root)
                   for name in CASES if name not in SUBPROCESS_CASES}
        results.update((name, future.result()) for name, future in futures.items())
    return {name: results[name] for name in CASES}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return all_results(tmp_path_factory.mktemp("bad_inputs"))


def test_the_subprocess_cases_are_cases():
    assert SUBPROCESS_CASES <= set(CASES)
    assert {CASES[name][0] for name in SUBPROCESS_CASES} == {TRAIN, BENCHMARK, RESULTS}


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
