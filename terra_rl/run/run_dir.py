"""Run directories: where one training run keeps its config, manifest, metrics and checkpoints.

Layout of `<runs_dir>/<run_name>/`:

    config.json      the resolved training config (indented, sorted keys)
    manifest.json    provenance: git commit, package versions, devices, command line, resumes
    metrics.jsonl    one JSON object per log call (written by `terra_rl.run.logger`)
    checkpoints/     orbax checkpoints
    wandb/           W&B files when W&B is offline or online

A new run never reuses a directory that already holds a config.json; resuming goes through
`open_run_dir` and `append_resume_record`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from terra_rl import env_vars

CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"

VERSIONED_PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "chex",
    "wandb",
    "gymnax",
)
REPRODUCIBILITY_ENV_VARS = (
    "XLA_FLAGS",
    "DATASET_PATH",
    "DATASET_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_ID",
)


class RunDirError(Exception):
    """A run directory cannot be created or opened; the message says why and what to do."""


def default_run_name(config_name: str) -> str:
    """`<config_name>-<YYYYmmdd>-<HHMMSS>-<4 hex>` in local time, e.g.
    `solo_excavator-20261122-153012-a3f9`; the random suffix keeps two runs started in the
    same second apart."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config_name}-{stamp}-{secrets.token_hex(2)}"


def create_run_dir(
    runs_dir: str | os.PathLike, run_name: str, config: dict[str, Any], argv: list[str]
) -> Path:
    """Creates `<runs_dir>/<run_name>/` with `checkpoints/`, `config.json` and `manifest.json`.

    Raises RunDirError if the directory already holds a config.json (another run's).
    Returns the run directory.
    """
    run_dir = Path(runs_dir) / run_name
    config_text = _config_text(config)  # an unserializable config fails before any write
    check_writable(Path(runs_dir))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Exclusive create, so two processes racing for the same name cannot both win.
        with open(run_dir / CONFIG_FILE, "x", encoding="utf-8") as f:
            f.write(config_text)
    except FileExistsError:
        raise RunDirError(
            f"{run_dir} already holds a run ({CONFIG_FILE} exists); choose another run name, "
            "or resume that run instead"
        ) from None
    except OSError as error:
        raise RunDirError(f"cannot create run directory {run_dir}: {error.strerror}; pick "
                          "another --runs_dir") from None
    (run_dir / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    _write_json_atomic(run_dir / MANIFEST_FILE, build_manifest(argv))
    return run_dir


def check_writable(runs_dir: Path) -> None:
    """RunDirError unless `runs_dir` (or its nearest existing parent) can be written, so a bad
    --runs_dir stops a run before anything is compiled or created."""
    existing = runs_dir.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(
            f"cannot write runs directory {runs_dir} ({existing} is not a writable "
            "directory); pick another --runs_dir"
        )


def write_config(run_dir: str | os.PathLike, config: dict[str, Any]) -> None:
    """Replaces the run's config.json (atomically): a resume's changed flags persist, so the
    next resume starts from them."""
    path = Path(run_dir) / CONFIG_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_config_text(config), encoding="utf-8")
    os.replace(tmp, path)


def config_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'name: old -> new' for every field whose value differs (missing counts as absent)."""
    return [
        f"{name}: {saved.get(name, '(absent)')!r} -> {new[name]!r}"
        for name in sorted(new)
        if name not in saved or saved[name] != new[name]
    ]


def _config_text(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True, default=_json_default) + "\n"


def open_run_dir(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Opens an existing run directory for resuming; returns (run_dir, config dict)."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise RunDirError(
            f"cannot resume: run directory {run_dir} does not exist; pass the path of an "
            "existing run (runs/<run_name>) or start a new run without resuming"
        )
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise RunDirError(
            f"cannot resume: {run_dir} has no {CONFIG_FILE}, so it is not a terra_rl run "
            "directory; pass the directory a run created (runs/<run_name>)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunDirError(
            f"cannot resume: {config_path} is unreadable ({first_line}); restore it from the "
            "original run or start a new run"
        ) from None
    if not isinstance(config, dict):
        raise RunDirError(f"cannot resume: {config_path} does not hold a JSON object")
    return run_dir, config


def append_resume_record(run_dir: str | os.PathLike, argv: list[str]) -> dict[str, Any]:
    """Appends {time, argv, git_commit, git_dirty} to the manifest's `resumes` list.

    A missing manifest is recreated holding only `resumes` rather than failing the resume.
    Returns the record.
    """
    manifest_path = Path(run_dir) / MANIFEST_FILE
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise RunDirError(
                f"{manifest_path} is not valid JSON; repair or delete it, then resume again"
            ) from None
    commit, dirty = git_state()
    record = {"time": _now_iso(), "argv": list(argv), "git_commit": commit, "git_dirty": dirty}
    manifest.setdefault("resumes", []).append(record)
    _write_json_atomic(manifest_path, manifest)
    return record


def build_manifest(argv: list[str]) -> dict[str, Any]:
    """Provenance of this process: code version, package versions, devices, host, command."""
    import jax  # Imported here so the module stays importable without initializing JAX.

    commit, dirty = git_state()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "packages": {name: _package_version(name) for name in VERSIONED_PACKAGES},
        "devices": [
            {"id": d.id, "platform": d.platform, "device_kind": d.device_kind}
            for d in jax.devices()
        ],
        "process_count": jax.process_count(),
        "hostname": socket.gethostname(),
        "cpu": cpu_info(),
        "argv": list(argv),
        "python_executable": sys.executable,
        "start_time": _now_iso(),
        "env": env_vars.set_values(REPRODUCIBILITY_ENV_VARS),
    }


# Instruction sets XLA:CPU compiles for when the host has them. Kernels for other sets round
# differently, so a CPU seed's course is the same only on hosts with the same ones
# (docs/TRAINING.md "Run directory").
CPU_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                 "avx512_bf16", "avx512_vnni", "amx_bf16", "asimd", "sve")


def cpu_info(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict[str, Any]:
    """The host CPU: `model` (its name, or `platform.processor()` where there is no
    /proc/cpuinfo) and `isa` (the `CPU_ISA_FLAGS` it has, None where unknown)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "isa": None}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())  # the first processor's
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    model = fields.get("model name") or fields.get("Model") or platform.machine()
    return {"model": model, "isa": [flag for flag in CPU_ISA_FLAGS if flag in flags]}


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding this package; (None, None) when the code
    is not in a git checkout or git is missing. Dirty counts untracked, non-ignored files too,
    because they can change what runs."""
    repo = Path(__file__).resolve().parent
    commit = _git(repo, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(repo, "status", "--porcelain")
    return commit, (None if status is None else bool(status))


def _git(repo: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _now_iso() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _json_default(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # numpy / jax scalars and arrays
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"config value of type {type(value).__name__} is not JSON serializable")


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
