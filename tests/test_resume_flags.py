"""Which flags a resume may change (`train_mixed.py --resume RUN_DIR ...`), on a real run with
a checkpoint.

The rule (terra_rl/cli/flags.py): only the fields of `RESUMABLE_FIELDS` (the total, logging,
checkpoint, cache and W&B settings) and the launch options (`--max_updates`, the multi-process
flags) may be given with `--resume`; they take effect in the resumed run and persist in its
config.json. Any other config flag, even one repeating the saved value, stops the resume with
exit 2 and one stderr line naming the flag as typed, before the run directory is read or
written.

The run: tests/test_preemption.py's tiny config (cpu_demo's maps on 4 CPU devices without the
env's costly inputs), two updates, trained by a real `train_mixed.py` with the suite's
compilation cache; the resumes are real processes too, so only the first compiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from tiny_runs import STEPS_PER_UPDATE, cache_flags, train_flags

from terra_rl.cli.flags import RESUMABLE_FIELDS, bool_flag_name, parse_train_args
from terra_rl.cli.main import main
from terra_rl.config import TrainConfig, get_preset
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.logger import read_metrics

REPO = Path(__file__).resolve().parents[1]
def train_mixed(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATASET_PATH", "DATASET_SIZE")}
    return subprocess.run([sys.executable, str(REPO / "train_mixed.py"), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A run of 2 updates with its checkpoint at update 2 (read-only: tests copy it)."""
    root = tmp_path_factory.mktemp("resume_flags")
    result = train_mixed(train_flags(root, "run", updates=2))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = root / "run"
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).latest_step() == 2
    return run_dir


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every path under `directory`: a file's size, mtime and content hash; a directory."""
    state = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_file():
            stat = path.stat()
            state[name] = (stat.st_size, stat.st_mtime_ns,
                           hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            state[name] = ("dir",)
    return state


def train_updates(run_dir: Path) -> list[int]:
    return [r["update"] for r in read_metrics(run_dir / "metrics.jsonl")
            if "train/actor_loss" in r]


def eval_updates(run_dir: Path) -> list[int]:
    return [r["update"] for r in read_metrics(run_dir / "metrics.jsonl")
            if "eval/completion_rate" in r]


def test_allowed_flags_take_effect_on_resume_and_persist(trained_run, tmp_path):
    """A resume that raises the total, stops early with --max_updates and changes the log,
    eval and checkpoint intervals and the checkpoints kept: each shows in what the resumed
    run writes, and the next resume, without flags, goes on with them."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    assert train_updates(run_dir) == [1, 2]
    assert eval_updates(run_dir) == [0, 2]
    changed = {"total_timesteps": 6 * STEPS_PER_UPDATE, "log_train_interval": 2,
               "log_eval_interval": 3, "checkpoint_interval": 1, "keep_checkpoints": 2}
    flags = [arg for name, value in changed.items() for arg in (f"--{name}", str(value))]
    first = train_mixed(["--resume", str(run_dir), *cache_flags(), *flags,
                         "--max_updates", "4"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert ("config changes: checkpoint_interval: 2 -> 1; keep_checkpoints: 3 -> 2; "
            "log_eval_interval: 4 -> 3; log_train_interval: 1 -> 2; "
            f"total_timesteps: {2 * STEPS_PER_UPDATE} -> {6 * STEPS_PER_UPDATE}") in first.stdout
    saved = json.loads((run_dir / "config.json").read_text())
    assert {name: saved[name] for name in changed} == changed
    # --max_updates 4 of 6: updates 3 and 4; train logs every 2nd update, an eval at 3, a
    # checkpoint after each update, of which the last 2 are kept.
    assert train_updates(run_dir) == [1, 2, 4]
    assert eval_updates(run_dir) == [0, 2, 3]
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).all_steps() == [3, 4]
    resumes = json.loads((run_dir / "manifest.json").read_text())["resumes"]
    assert [record["argv"][-2:] for record in resumes] == [["--max_updates", "4"]]

    # The next resume, without flags, keeps the changed settings to the new total.
    second = train_mixed(["--resume", str(run_dir), *cache_flags()])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "config changes: none" in second.stdout
    assert train_updates(run_dir) == [1, 2, 4, 6]
    assert eval_updates(run_dir) == [0, 2, 3, 6]
    assert CheckpointStore(run_dir / "checkpoints", read_only=True).all_steps() == [5, 6]
    assert json.loads((run_dir / "config.json").read_text()) == saved


# Flags the resume refuses, each a different kind: shapes, the env, the maps, the network,
# the algorithm, the seed, a boolean flag, and the saved value repeated (giving the flag is
# refused, whatever its value).
REFUSED = {
    "envs per device": ["--num_envs_per_device", "4"],
    "env": ["--env", "gymnax:CartPole-v1"],
    "map size": ["--map_size", "32"],
    "dataset": ["--dataset_path", "data/maps"],
    "network width": ["--hidden_dim", "64"],
    "learning rate": ["--lr", "0.1"],
    "seed": ["--seed", "3"],
    "boolean": ["--disable_action_mask"],
    "saved value": ["--num_steps", "8"],
}


def test_a_refused_flag_exits_2_naming_it_and_leaves_the_run_alone(trained_run, tmp_path,
                                                                   capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    before = snapshot(run_dir)
    # A real process: its exit status and its whole stderr.
    process = train_mixed(["--resume", str(run_dir), "--total_timesteps", "4096",
                           "--num_envs_per_device", "4"])
    assert process.returncode == 2, process.stdout + process.stderr
    assert process.stderr.splitlines() == [
        "train_mixed.py: error: --resume keeps the run's config; these flags cannot change: "
        "--num_envs_per_device"]
    assert process.stdout == ""
    assert snapshot(run_dir) == before
    # The others in this process (they stop while parsing, as the process did).
    for name, flags in REFUSED.items():
        with pytest.raises(SystemExit) as stopped:
            main(["--resume", str(run_dir), "--max_updates", "3", *flags])
        assert stopped.value.code == 2, name
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert len(lines) == 1 and not out, (name, out, err)
        assert lines[0].startswith("train_mixed.py: error: --resume keeps the run's config; "
                                   "these flags cannot change: "), lines[0]
        assert lines[0].endswith(f"cannot change: {flags[0]}"), (name, lines[0])
        assert snapshot(run_dir) == before, name
    # Several at once: all named, as typed, in one line.
    with pytest.raises(SystemExit) as stopped:
        main(["--resume", str(run_dir), "--seed=3", "--log_train_interval", "5",
              "--enable_compass", "--lr", "0.1"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "train_mixed.py: error: --resume keeps the run's config; these flags cannot change: "
        "--enable_compass, --lr, --seed"]
    assert snapshot(run_dir) == before


def flag_for(field: dataclasses.Field, base: TrainConfig) -> list[str]:
    """Flags that set `field` to its value in `base`."""
    value = getattr(base, field.name)
    hint = typing.get_type_hints(TrainConfig)[field.name]
    if hint is bool:
        return [f"--{'enable' if value else 'disable'}_{bool_flag_name(field.name)}"]
    if typing.get_origin(hint) is tuple:
        return [f"--{field.name}", ",".join(value)]
    return [f"--{field.name}", str(value)]


def test_the_rule_covers_every_config_field(tmp_path, capsys):
    """Each field of `RESUMABLE_FIELDS` may be given with --resume; every other field (all
    but `preset`, which --config sets) is refused by name. A field added to the config is
    refused on resume unless it is added to the rule."""
    base = get_preset("cpu_demo")
    fields = [field for field in dataclasses.fields(TrainConfig) if field.name != "preset"]
    # What --help promises: the total, logging and checkpoints (and where the compiles and
    # W&B go); none of these changes a shape, the algorithm or the step counters. A field
    # added here is a decision, made in this list too.
    assert RESUMABLE_FIELDS == {
        "total_timesteps", "log_train_interval", "log_eval_interval", "checkpoint_interval",
        "keep_checkpoints", "best_metric", "cache_clear_interval", "updates_per_dispatch",
        "compilation_cache_dir", "wandb_mode", "wandb_project", "wandb_entity", "wandb_tags"}
    assert RESUMABLE_FIELDS < {field.name for field in fields}
    for field in fields:
        flags = flag_for(field, base)
        if field.name in RESUMABLE_FIELDS:
            args = parse_train_args(["--resume", str(tmp_path), *flags])
            assert args.resume == str(tmp_path)
            assert args.overrides == {field.name: getattr(base, field.name)}, field.name
            continue
        with pytest.raises(SystemExit) as stopped:
            parse_train_args(["--resume", str(tmp_path), *flags])
        assert stopped.value.code == 2, field.name
        assert capsys.readouterr().err.strip().endswith(f"cannot change: {flags[0]}"), \
            field.name
    # The launch options are not config fields: a resume may take them.
    launched = parse_train_args(["--resume", str(tmp_path), "--max_updates", "7",
                                 "--distributed", "--num_processes", "2", "--process_id", "1",
                                 "--coordinator_address", "host:1234"])
    assert launched.max_updates == 7 and launched.distributed.num_processes == 2
    assert launched.overrides == {}
