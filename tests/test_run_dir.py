"""Run directories: config and manifest contents, no overwrites, resume errors and records."""

from __future__ import annotations

import datetime
import json
import re
import subprocess

import jax
import pytest

from terra_rl.run import run_dir as run_dir_module
from terra_rl.run.run_dir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    MANIFEST_FILE,
    VERSIONED_PACKAGES,
    RunDirError,
    append_resume_record,
    cpu_info,
    create_run_dir,
    default_run_name,
    git_state,
    open_run_dir,
)

CONFIG = {"seed": 3, "lr": 2.5e-4, "preset": "solo_excavator", "map_types": ["trenches"]}
ARGV = ["train_mixed.py", "--config", "solo_excavator", "--seed", "3"]


def test_default_run_name_has_config_name_local_time_and_distinct_suffix():
    # 200 names within a second or two: a random 4-hex suffix repeats about 0.3 times among
    # them (birthday odds over 65,536), 6 repeats has odds of about 1e-6, and names without
    # the random part would all repeat. (20 names that must all differ failed 1 run in 350.)
    names = {default_run_name("solo_excavator") for _ in range(200)}
    assert len(names) >= 195, "runs started in the same second must get different names"
    for name in names:
        match = re.fullmatch(r"solo_excavator-(\d{8}-\d{6})-[0-9a-f]{4}", name)
        assert match, name
        started = datetime.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
        assert abs((datetime.datetime.now() - started).total_seconds()) < 60


def test_create_run_dir_writes_layout_and_sorted_indented_config(tmp_path):
    path = create_run_dir(tmp_path / "runs", "r1", CONFIG, ARGV)
    assert path == tmp_path / "runs" / "r1"
    assert (path / CHECKPOINTS_DIR).is_dir()
    text = (path / CONFIG_FILE).read_text()
    assert json.loads(text) == CONFIG
    assert text == json.dumps(CONFIG, indent=2, sort_keys=True) + "\n"


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "commit.gpgsign=false", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """The package seen from a git checkout of one commit (`run_dir.py`'s location decides
    which checkout `git_state` reads): (checkout, its commit)."""
    repo = tmp_path / "checkout"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "run_dir.py").write_text("# stand-in\n")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", "pkg/run_dir.py")
    git(repo, "commit", "-q", "-m", "one")
    monkeypatch.setattr(run_dir_module, "__file__", str(repo / "pkg" / "run_dir.py"))
    return repo, git(repo, "rev-parse", "HEAD")


def test_manifest_contents_and_types(tmp_path, monkeypatch, checkout):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("DATASET_PATH", raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n"
                       "flags\t\t: fpu avx2 fma avx512f\n")
    monkeypatch.setattr(run_dir_module.cpu_info, "__defaults__", (str(cpuinfo),))
    path = create_run_dir(tmp_path / "runs", "r1", CONFIG, ARGV)
    manifest = json.loads((path / MANIFEST_FILE).read_text())

    assert manifest["argv"] == ARGV
    assert manifest["python"].count(".") == 2
    assert set(manifest["packages"]) == set(VERSIONED_PACKAGES)
    assert manifest["packages"]["jax"] == jax.__version__
    assert all(v is None or isinstance(v, str) for v in manifest["packages"].values())
    assert manifest["devices"] == [
        {"id": d.id, "platform": d.platform, "device_kind": d.device_kind} for d in jax.devices()
    ]
    assert manifest["process_count"] == jax.process_count()
    assert isinstance(manifest["hostname"], str) and manifest["hostname"]
    assert manifest["cpu"] == {"model": "Test CPU 9000", "isa": ["avx2", "fma", "avx512f"]}
    started = datetime.datetime.fromisoformat(manifest["start_time"])
    assert started.tzinfo is not None
    assert manifest["env"] == {"XLA_FLAGS": "--xla_gpu_autotune_level=0", "SLURM_JOB_ID": "4242"}
    repo, commit = checkout
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert (manifest["git_commit"], manifest["git_dirty"]) == (commit, False)
    # An untracked file can change what runs: the checkout is dirty.
    (repo / "pkg" / "extra.py").write_text("x = 1\n")
    path = create_run_dir(tmp_path / "runs", "r2", CONFIG, ARGV)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert (manifest["git_commit"], manifest["git_dirty"]) == (commit, True)


def test_cpu_info_names_the_model_and_the_instruction_sets(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n"
                       "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n")
    assert cpu_info(cpuinfo) == {"model": "AMD EPYC 9R14",
                                 "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw"]}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert cpu_info(arm)["isa"] == ["asimd", "sve"]
    missing = cpu_info(tmp_path / "nowhere")
    assert missing["isa"] is None and isinstance(missing["model"], str)


def test_git_state_is_none_without_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert git_state() == (None, None)


def test_git_state_is_none_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir_module, "__file__", str(tmp_path / "pkg" / "run_dir.py"))
    (tmp_path / "pkg").mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_state() == (None, None)


def test_create_run_dir_refuses_to_overwrite_a_run(tmp_path):
    path = create_run_dir(tmp_path, "r1", CONFIG, ARGV)
    before = (path / CONFIG_FILE).read_text(), (path / MANIFEST_FILE).read_text()
    with pytest.raises(RunDirError, match="already holds a run") as info:
        create_run_dir(tmp_path, "r1", {"seed": 99}, ["other"])
    assert "\n" not in str(info.value)
    assert ((path / CONFIG_FILE).read_text(), (path / MANIFEST_FILE).read_text()) == before


def test_create_run_dir_accepts_an_existing_empty_directory(tmp_path):
    (tmp_path / "r1").mkdir()
    path = create_run_dir(tmp_path, "r1", CONFIG, ARGV)
    assert (path / CONFIG_FILE).is_file()


def test_unserializable_config_fails_before_creating_anything(tmp_path):
    with pytest.raises(TypeError, match="object"):
        create_run_dir(tmp_path, "r1", {"bad": object()}, ARGV)
    assert not (tmp_path / "r1").exists()


def test_open_run_dir_returns_the_config(tmp_path):
    path = create_run_dir(tmp_path, "r1", CONFIG, ARGV)
    opened, config = open_run_dir(str(path))
    assert opened == path and config == CONFIG


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "has no config.json"),
        (lambda p: (p.mkdir(), (p / CONFIG_FILE).write_text("{not json")), "unreadable"),
        (lambda p: (p.mkdir(), (p / CONFIG_FILE).write_text("[1]")), "JSON object"),
    ],
)
def test_open_run_dir_errors_are_one_line(tmp_path, setup, message):
    path = tmp_path / "r1"
    setup(path)
    with pytest.raises(RunDirError, match=message) as info:
        open_run_dir(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_append_resume_record_keeps_manifest_and_appends_history(tmp_path):
    path = create_run_dir(tmp_path, "r1", CONFIG, ARGV)
    original = json.loads((path / MANIFEST_FILE).read_text())
    append_resume_record(path, ["train_mixed.py", "--resume", str(path)])
    append_resume_record(path, ["train_mixed.py", "--resume", str(path), "--seed", "4"])
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    resumes = manifest.pop("resumes")
    assert manifest == original
    assert [r["argv"][-1] for r in resumes] == [str(path), "4"]
    for record in resumes:
        assert set(record) == {"time", "argv", "git_commit", "git_dirty"}
        assert datetime.datetime.fromisoformat(record["time"]).tzinfo is not None
        assert record["git_commit"] == original["git_commit"]
    assert not list(path.glob("*.tmp"))


def test_append_resume_record_recreates_a_missing_manifest(tmp_path):
    path = create_run_dir(tmp_path, "r1", CONFIG, ARGV)
    (path / MANIFEST_FILE).unlink()
    append_resume_record(path, ["resume"])
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert [r["argv"] for r in manifest["resumes"]] == [["resume"]]
