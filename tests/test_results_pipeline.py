"""`make results RESULTS_ARGS=--quick` (scripts/run_results.py) and
scripts/benchmark_precision.py, run for real and cheaply, their outputs checked.

The whole `--quick` takes minutes on the 2-core CPU (seven standard tasks, each its own
`train_mixed.py` process, then `cpu_demo` with its curves and three GIFs: the excavation stage
alone about 150 s), so its two stages are tested apart: the standard-task stage as
`run_results.py --quick` on one task (a real process, about 15 s), and the excavation stage in
this process (`run_results.excavation`, its `train_mixed.py`, plot and GIF processes real) on
the suite's tiny training shapes instead of cpu_demo's. The precision benchmark runs float32
and bfloat16 at the same tiny shapes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
from PIL import Image

from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.logger import read_metrics
from terra_rl.validation.small import PLAIN_ENV_FLAGS, SMOKE_FIELDS

REPO = Path(__file__).resolve().parents[1]
CPU_DEMO_FIELDS = ("preset", "wandb_mode", "compilation_cache_dir", "map_types", "curriculum",
                   "use_action_mask", "use_compass", "use_dig_distance", "use_pose_distance",
                   "mask_cut_off_digs", "stall_steps")
TINY_FLAGS = [arg for name, value in SMOKE_FIELDS.items() if name not in CPU_DEMO_FIELDS
              for arg in (f"--{name}", str(value))]
"""train_mixed.py flags that turn cpu_demo into the suite's tiny shapes (its maps kept)."""


def load_script(name: str):
    path = REPO / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    script = importlib.util.module_from_spec(spec)
    sys.modules[name] = script  # a script's dataclasses look their module up there
    spec.loader.exec_module(script)
    return script


def script_env(home: Path) -> dict[str, str]:
    """The environment of a script run by a test: conftest's XLA flags, no dataset, and a
    HOME of its own, so that train_mixed.py's default compilation cache (under ~/.cache) is
    the test's, never the user's."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATASET_PATH", "DATASET_SIZE")}
    return dict(env, HOME=str(home), WANDB_MODE="disabled", PYTHONUNBUFFERED="1")


def finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 100 and image.height > 100


def test_quick_standard_tasks_write_the_table_the_json_and_the_curves(tmp_path):
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_results.py"), "--quick", "--tasks",
         "CartPole-v1", "--skip-excavation", "--seeds", "3,4", "--out-dir", str(out)],
        cwd=REPO, env=script_env(tmp_path / "home"), capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == f"results in {out}"
    # --quick: one seed (the first), the quick budget, one train_mixed.py run.
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["CartPole-v1-s3"]
    assert (out / "CartPole-v1-s3.log").is_file()
    record = json.loads((out / "standard_tasks.json").read_text())
    [run] = record["runs"]
    assert (run["task"], run["seed"], run["budget"]) == ("CartPole-v1", 3, 20_000)
    for name in ("return", "sampled_return", "steps_per_second", "compile_seconds",
                 "wall_seconds"):
        assert finite(run[name]), (name, run)
    assert 1 <= run["return"] <= 500 and 1 <= run["sampled_return"] <= 500
    assert run["steps_per_second"] > 0 and run["env_steps"] >= 20_000
    [row] = record["summary"]
    assert row["task"] == "CartPole-v1" and row["seeds"] == 1 and row["reference"] == 500
    assert row["return_median"] == row["return_min"] == row["return_max"] == run["return"]
    # The figures printed, in the table and in the progress line, are the JSON's.
    table = (out / "standard_tasks.md").read_text().splitlines()
    assert table[0].startswith("| task | env steps | return, median (min-max) over seeds |")
    assert table[2] == (
        f"| CartPole-v1 | 20,000 | {run['return']:.1f} ({run['return']:.1f} to "
        f"{run['return']:.1f}, 1 seed) | 500 | {run['steps_per_second']:,.0f} | "
        f"{run['wall_seconds'] / 60:.1f} min |")
    assert table[2] in result.stdout
    assert (f"  return {run['return']:.1f} (sampled {run['sampled_return']:.1f}), "
            f"{run['steps_per_second']:,.0f} env steps/s") in result.stdout
    assert_png(out / "CartPole-v1.png")
    # The run behind it: the quick budget of its own flags, its evals finite.
    run_dir = out / "runs" / "CartPole-v1-s3"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "gymnax:CartPole-v1" and config["total_timesteps"] == 20_000
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/first_episode_return" in r]
    assert evals[-1]["eval/first_episode_return"] == run["return"]
    assert all(finite(r["eval/first_episode_return"]) for r in evals)


def test_quick_excavation_stage_trains_plots_and_draws_a_held_out_gif(tmp_path, monkeypatch,
                                                                      capfd):
    """`run_results.excavation(..., quick=True)` with its train_mixed.py run at the tiny
    shapes (4 CPU devices, the suite's compilation cache): the run, the curves PNG and the
    GIF of a held-out map, one frame per step of the run's horizon at most. One GIF (of
    held-out map 1) instead of three: each is a process that compiles the policy again."""
    results = load_script("run_results")
    real_train = results.train
    cache = ["--compilation_cache_dir", jax.config.jax_compilation_cache_dir or ""]

    def tiny_train(args: list[str], log: Path) -> float:
        return real_train([*args, *TINY_FLAGS, *PLAIN_ENV_FLAGS, "--num_devices", "4",
                           *cache], log)

    monkeypatch.setattr(results, "train", tiny_train)
    monkeypatch.setattr(results, "HELD_OUT_GIF_MAPS", (1,))
    for name in ("DATASET_PATH", "DATASET_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # as `script_env`: the processes' own
    out = tmp_path / "results"
    out.mkdir()
    results.excavation([5], out, quick=True)
    stdout = capfd.readouterr().out  # the stage's and its processes'

    run_dir = out / "runs" / "cpu_demo-s5"
    config = json.loads((run_dir / "config.json").read_text())
    # The quick flags reached the run (and the tiny shapes, given after them).
    assert config["seed"] == 5 and config["total_timesteps"] == results.QUICK_EXCAVATION_STEPS
    assert config["log_eval_interval"] == 2 and config["eval_episodes"] == 8
    assert config["num_envs_per_device"] == SMOKE_FIELDS["num_envs_per_device"]
    steps_per_update = (config["num_devices"] * config["num_envs_per_device"]
                        * config["num_steps"])
    updates = results.QUICK_EXCAVATION_STEPS // steps_per_update
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).latest_step() == updates
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/completion_rate" in r]
    assert [r["update"] for r in evals] == list(range(0, updates + 1, 2))
    assert all(0 <= r["eval/completion_rate"] <= 1 for r in evals)
    assert all(finite(r["eval/first_episode_return"]) for r in evals)
    # The line the stage prints after the run is the run's headline.
    log_lines = (out / "cpu_demo-s5.log").read_text().splitlines()
    assert log_lines[-2] == f"run directory: {run_dir.resolve()}"
    assert f"; {log_lines[-2]}" in stdout

    assert_png(out / "cpu_demo_curves.png")
    assert sorted(path.name for path in out.glob("*.gif")) == ["cpu_demo-s5_heldout1.gif"]
    gif = out / "cpu_demo-s5_heldout1.gif"
    with Image.open(gif) as image:
        assert image.format == "GIF"
        frames = image.n_frames
    assert 1 <= frames <= config["max_steps"]
    assert f"{run_dir}: checkpoint of update {updates}, held-out map 1 of 8, greedy" in stdout
    assert f"frames={frames} out={gif}" in stdout


def test_precision_benchmark_reports_float16_against_float32(tmp_path):
    """The benchmark's cheapest mode that still compares: one precision (float16, the one
    with loss scaling), one timed update, a curve of two, at the tiny shapes; the log-prob
    error is against the same parameters in float32."""
    sets = [f"{name}={value}" for name, value in SMOKE_FIELDS.items()
            if name not in CPU_DEMO_FIELDS and name != "precision"]
    sets += ["use_compass=false", "use_dig_distance=false", "use_pose_distance=false",
             "mask_cut_off_digs=false"]
    args = ["--config", "cpu_demo", "--precisions", "float16", "--updates", "1",
            "--curve-updates", "2", "--json", str(tmp_path / "precision.json"),
            "--compilation-cache-dir", jax.config.jax_compilation_cache_dir or ""]
    for pair in sets:
        args += ["--set", pair]
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark_precision.py"),
                             *args], cwd=REPO, env=script_env(tmp_path / "home"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / "precision.json").read_text())
    assert record["schema_version"] == 1 and record["preset"] == "cpu_demo"
    assert record["config"]["precision"] == "float16"
    assert record["config"]["num_envs_per_device"] == SMOKE_FIELDS["num_envs_per_device"]
    [(precision, run)] = record["results"].items()
    assert precision == run["precision"] == "float16"
    for name in ("compile_seconds", "seconds_per_update", "steps_per_second",
                 "log_prob_max_abs_error", "log_prob_mean_abs_error", "value_max_abs_error"):
        assert finite(run[name]), (name, run[name])
    assert run["steps_per_second"] > 0 and run["peak_memory_bytes"] > 0
    assert run["peak_memory_kind"] == "host_rss"  # on CPU
    # float16 differs from float32, by less than its rounding allows.
    assert 0 < run["log_prob_mean_abs_error"] <= run["log_prob_max_abs_error"] < 0.1
    assert run["value_max_abs_error"] < 0.1
    assert len(run["curve"]) == 2
    steps_per_update = SMOKE_FIELDS["update_epochs"] * SMOKE_FIELDS["num_minibatches"]
    overflows_before = 0
    for point in run["curve"]:
        for name in ("train/reward", "train/entropy", "train/approx_kl", "train/value_loss",
                     "precision/overflow_steps"):
            assert finite(point[name]), (name, point)
        # Dynamic loss scaling: from 2^16, halved on each overflow (never doubled this soon);
        # the gradient norm is left out only of an update whose every step overflowed.
        overflows = point["precision/overflow_steps"]
        assert point["precision/loss_scale"] == 2.0**16 / 2.0**overflows, point
        if point["train/grad_norm"] is None:
            assert overflows - overflows_before == steps_per_update, point
        else:
            assert finite(point["train/grad_norm"]) and point["train/grad_norm"] > 0, point
        overflows_before = overflows

    # What it prints: the shape, the precision's row (no float32 run to compare speed
    # with), the learning curve, each figure the JSON's.
    lines = result.stdout.splitlines()
    assert lines[0] == (f"cpu_demo {' '.join(sets)}: 1 cpu device(s) x 8 envs x 8 steps, "
                        "1 epochs x 2 minibatches, 16x16")
    assert lines[1].lstrip().startswith("float16 | compile")
    assert f"{run['steps_per_second']:>10,.0f} steps/s (x - float32)" in lines[1]
    assert f"max |dlog pi| {run['log_prob_max_abs_error']:.2e}" in lines[1]
    rewards = " ".join(f"{point['train/reward']:+.4f}" for point in run["curve"])
    assert lines[2:] == ["learning curve (train/reward per update):", f" float16: {rewards}"]
