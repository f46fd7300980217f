"""Multi-process training on one machine: two processes on loopback, 2 CPU devices each,
JAX's gloo CPU collectives, an explicit coordinator on 127.0.0.1.

One launch of `tests/distributed_worker.py` per process runs `train_mixed.py --distributed`
for 2 updates of the tiny config of `test_trainer.py` (cpu_demo + TINY shapes, without the
env's costly inputs: `PLAIN_ENV_FLAGS`); then, in the
same processes with the same compiled functions, resumes the run from its checkpoint for a
third update (every process restoring from the files), then repeats that update from memory. A hang
fails the test after `TIMEOUT_S` instead of blocking CI. The subprocesses use the persistent
compilation cache of the test session (`TERRA_RL_TEST_CACHE`, see conftest.py); on CPU only
process 0 gets cache hits (JAX writes entries from process 0 only, and a CPU cache key
differs per process), so process 1 always compiles.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from terra_rl.cli.flags import parse_train_args
from terra_rl.cli.main import main
from terra_rl.run.checkpointing import CheckpointError, CheckpointStore
from terra_rl.run.logger import read_metrics
from terra_rl.validation.small import PLAIN_ENV_FLAGS
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "distributed_worker.py"
NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
NUM_DEVICES = NUM_PROCESSES * DEVICES_PER_PROCESS
ENVS_PER_DEVICE, NUM_STEPS = 8, 8
STEPS_PER_UPDATE = NUM_STEPS * ENVS_PER_DEVICE * NUM_DEVICES
TIMEOUT_S = 900
# test_trainer.py's TINY shapes on the cpu_demo preset (as its CLI test runs them).
TINY_FLAGS = [
    "--config", "cpu_demo", "--map_size", "16", "--max_steps", "12", "--num_maps", "16",
    "--num_envs_per_device", str(ENVS_PER_DEVICE), "--num_steps", str(NUM_STEPS),
    "--update_epochs", "1", "--num_minibatches", "2", "--map_feature_dim", "32",
    "--hidden_dim", "32", "--precision", "float32", "--eval_episodes", "8",
    "--log_train_interval", "1", "--log_eval_interval", "2", "--checkpoint_interval", "2",
    "--wandb_mode", "disabled", "--num_devices", "0", *PLAIN_ENV_FLAGS,
]
CACHE_DIR = os.environ.get(
    "TERRA_RL_TEST_CACHE", str(Path.home() / ".cache" / "terra_rl" / "jax-test-cache")
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(log_dir: Path, flags: list[str]) -> list[tuple[int, str, str]]:
    """Runs the worker as processes 0 and 1; (exit code, stdout, stderr) of each. A process
    that has not exited after TIMEOUT_S fails the test (all are killed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        XLA_FLAGS=xla_flags(DEVICES_PER_PROCESS),
        JAX_PLATFORMS="cpu",
        PYTHONUNBUFFERED="1",
    )
    address = f"127.0.0.1:{free_port()}"
    procs, logs = [], []
    for process in range(NUM_PROCESSES):
        out, err = log_dir / f"stdout{process}.txt", log_dir / f"stderr{process}.txt"
        command = [sys.executable, str(WORKER), str(log_dir), *flags, "--distributed",
                   "--coordinator_address", address, "--num_processes", str(NUM_PROCESSES),
                   "--process_id", str(process)]
        with open(out, "w") as stdout, open(err, "w") as stderr:
            procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout,
                                          stderr=stderr))
        logs.append((out, err))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.wait()
        tails = "\n".join(f"--- process {i}\n{err.read_text()[-3000:]}"
                          for i, (_, err) in enumerate(logs))
        pytest.fail(f"the processes did not finish within {TIMEOUT_S} s:\n{tails}")
    return [(proc.returncode, out.read_text(), err.read_text())
            for proc, (out, err) in zip(procs, logs, strict=True)]


def params_of(arrays, stage: str) -> dict[str, np.ndarray]:
    prefix = f"{stage}/params"
    return {k.removeprefix(prefix): arrays[k] for k in arrays.files if k.startswith(prefix)}


def assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_two_processes_train_resume_and_agree(tmp_path):
    runs = tmp_path / "runs"
    flags = [*TINY_FLAGS, "--runs_dir", str(runs), "--run_name", "mp",
             "--total_timesteps", str(2 * STEPS_PER_UPDATE), "--compilation_cache_dir", CACHE_DIR]
    outcomes = launch(tmp_path, flags)
    for process, (code, _, stderr) in enumerate(outcomes):
        assert code == 0, f"process {process} exited {code}:\n{stderr[-3000:]}"
    run_dir = runs / "mp"
    # Only process 0 reports (and writes); process 1 prints nothing of the run.
    assert f"run directory: {run_dir}" in outcomes[0][1].splitlines()
    assert "run directory" not in outcomes[1][1] and "update" not in outcomes[1][1]

    procs = [np.load(tmp_path / f"process{i}.npz") for i in range(NUM_PROCESSES)]
    for process, arrays in enumerate(procs):
        assert int(arrays["process_count"]) == NUM_PROCESSES
        assert int(arrays["device_count"]) == NUM_DEVICES
        assert len(arrays["device_ids"]) == DEVICES_PER_PROCESS
        # Global step accounting: every device of both processes counts.
        for stage, updates in (("first", 2), ("resumed", 3), ("continued", 3)):
            assert int(arrays[f"{stage}/updates_done"]) == updates, (process, stage)
            assert int(arrays[f"{stage}/env_steps"]) == updates * 8 * 8 * 4, (process, stage)
            assert np.all(arrays[f"{stage}/update"] == updates), (process, stage)
    assert set(procs[0]["device_ids"]).isdisjoint(procs[1]["device_ids"])

    for stage in ("first", "resumed"):
        params = [params_of(arrays, stage) for arrays in procs]
        # Identical parameters on every device of both processes (gradients averaged over
        # all four devices), and training changed them between stages.
        assert_same_params(params[0], params[1])
        for rows in params[0].values():
            assert all(np.array_equal(rows[0], row) for row in rows[1:])
    first, resumed = params_of(procs[0], "first"), params_of(procs[0], "resumed")
    assert any(not np.array_equal(first[k], resumed[k]) for k in first)

    # Keys and envs differ per device across processes: the device keys were split over the
    # global device count and each process took its own slice.
    rng = np.concatenate([arrays["first/rng"] for arrays in procs])
    assert len({tuple(key) for key in rng}) == NUM_DEVICES
    assert not np.array_equal(procs[0]["first/age"], procs[1]["first/age"])

    # Resuming from the checkpoint equals going on in memory, bit for bit, on each process.
    for arrays in procs:
        assert_same_params(params_of(arrays, "resumed"), params_of(arrays, "continued"))
        for name in ("rng", "age", "update"):
            np.testing.assert_array_equal(arrays[f"resumed/{name}"], arrays[f"continued/{name}"])

    # Only process 0 wrote metrics: each update once, counted in global env steps.
    records = read_metrics(run_dir / "metrics.jsonl")
    train_records = [r for r in records if "train/actor_loss" in r]
    assert [r["update"] for r in train_records] == [1, 2, 3]
    assert [r["env_step"] for r in train_records] == [STEPS_PER_UPDATE * u for u in (1, 2, 3)]
    assert [r["update"] for r in records if "eval/rewards" in r] == [0, 2, 3]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["num_devices"] == NUM_DEVICES
    assert not {"distributed", "coordinator_address", "process_id"} & set(config)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["process_count"] == NUM_PROCESSES and len(manifest["devices"]) == NUM_DEVICES

    # The checkpoint holds every device's rows in global device order: process 0's rows
    # first, then process 1's, as gathered from both processes.
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [2, 3]
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(run_dir / "checkpoints" / "3" / "state")
    np.testing.assert_array_equal(np.asarray(state["rng"]),
                                  np.concatenate([a["resumed/rng"] for a in procs]))
    np.testing.assert_array_equal(np.asarray(state["env_state"]["age"]),
                                  np.concatenate([a["resumed/age"] for a in procs]))
    assert np.all(np.asarray(state["counters"]["update"]) == 3)
    saved = {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf
             in jax.tree_util.tree_flatten_with_path(state["policy"]["params"])[0]}
    rows = [params_of(arrays, "resumed") for arrays in procs]
    assert_same_params(saved, {k: np.concatenate([rows[0][k], rows[1][k]]) for k in rows[0]})


def test_setup_errors_stop_every_process(tmp_path):
    """Set-up errors end every process with exit 2 and one line, before anything compiles:
    one that every process finds (a multi-process run must use every device), and one that
    only process 0 finds (the run directory is taken), which process 1 reports as such."""
    runs = tmp_path / "runs"
    flags = [*TINY_FLAGS, "--runs_dir", str(runs), "--compilation_cache_dir", ""]
    outcomes = launch(tmp_path, [*flags, "--num_devices", "2"])
    for code, _, stderr in outcomes:
        assert code == 2
        assert stderr.strip().splitlines()[-1].startswith(
            "train_mixed.py: error: --num_devices 2 asked but a --distributed run spans all "
            "4 devices of its 2 processes")
    assert not runs.exists()

    (runs / "taken").mkdir(parents=True)
    (runs / "taken" / "config.json").write_text("{}")
    outcomes = launch(tmp_path, [*flags, "--run_name", "taken"])
    errors = [stderr.strip().splitlines()[-1] for _, _, stderr in outcomes]
    assert [code for code, _, _ in outcomes] == [2, 2]
    assert errors[0].startswith(f"train_mixed.py: error: {runs / 'taken'} already holds a run")
    assert errors[1] == errors[0].replace("error: ", "error: process 0: ", 1)
    assert (runs / "taken" / "config.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--process_id", "1"], "--process_id needs --distributed"),
        (["--coordinator_address", "h:1", "--num_processes", "2"],
         "--coordinator_address, --num_processes needs --distributed"),
        (["--distributed", "--num_processes", "2", "--process_id", "2"],
         "--process_id 2 is not below --num_processes 2"),
        (["--distributed", "--coordinator_address", "nohost"], "must be HOST:PORT"),
        (["--distributed", "--num_processes", "0"], "--num_processes must be >= 1"),
    ],
)
def test_inconsistent_launch_flags_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as error:
        parse_train_args(argv)
    assert error.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_launch_flags_stay_out_of_the_config():
    args = parse_train_args(["--config", "cpu_demo", "--distributed", "--coordinator_address",
                             "10.0.0.1:1234", "--num_processes", "2", "--process_id", "1",
                             "--lr", "0.001"])
    assert args.distributed.enabled and args.distributed.coordinator_address == "10.0.0.1:1234"
    assert (args.distributed.num_processes, args.distributed.process_id) == (2, 1)
    assert args.overrides == {"lr": 0.001}
    resumed = parse_train_args(["--resume", "runs/x", "--distributed"])
    assert resumed.distributed.enabled and resumed.overrides == {}


SLURM_PROBE = """
import jax
from jax._src import distributed as jax_distributed
from terra_rl.run.distributed import DistributedOptions, initialize
initialize(DistributedOptions(enabled=True))
print(jax.process_count(), jax.process_index(), jax_distributed.global_state.coordinator_address,
      jax.config.read("jax_cuda_visible_devices"))
"""


@pytest.mark.parametrize(("local_device_ids", "visible"), [("", "0"), ("0,1,2,3", "0,1,2,3")])
def test_slurm_auto_detection(local_device_ids, visible):
    """`--distributed` without flags inside a (fake, one-task) Slurm job step: the coordinator
    is the first node, count and id come from SLURM_NTASKS / SLURM_PROCID, and on GPUs each
    process sees only GPU number SLURM_LOCALID unless JAX_LOCAL_DEVICE_IDS lists more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_"))}
    port = free_port()
    env.update(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="1",
               SLURM_PROCID="0", SLURM_LOCALID="0", JAX_COORDINATOR_PORT=str(port),
               JAX_LOCAL_DEVICE_IDS=local_device_ids, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SLURM_PROBE], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "0", f"localhost:{port}", visible]


def test_distributed_without_slurm_or_coordinator_exits_2():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([sys.executable, str(REPO / "train_mixed.py"), "--distributed"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("train_mixed.py: error: --distributed: "
                                  "jax.distributed.initialize failed: ")
    assert "no Slurm job step found: pass --coordinator_address HOST:PORT" in done.stderr


def test_initialize_failure_is_one_line_exit_2(capsys):
    """JAX refuses to initialize once this (test) process has used a backend."""
    jax.devices()
    with pytest.raises(SystemExit) as error:
        main(["--distributed", "--coordinator_address", "127.0.0.1:1", "--num_processes", "2",
              "--process_id", "0"])
    assert error.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("train_mixed.py: error: --distributed: jax.distributed.initialize "
                          "failed: jax.distributed.initialize() must be called before")


def test_read_only_store_restores_and_never_writes(tmp_path):
    """The checkpoint store of every process but process 0."""
    state = {"rng": np.arange(8, dtype=np.uint32).reshape(4, 2)}
    with CheckpointStore(tmp_path / "checkpoints") as store:
        store.save(2, state, {"seed": 0})
    with CheckpointStore(tmp_path / "checkpoints", read_only=True) as reader:
        assert reader.latest_step() == 2
        restored, config = reader.restore(None, state)
        np.testing.assert_array_equal(restored["rng"], state["rng"])
        assert config == {"seed": 0}
        with pytest.raises(CheckpointError, match="read-only"):
            reader.save(3, state, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "best"]
    with CheckpointStore(tmp_path / "absent", read_only=True) as reader:
        assert reader.latest_step() is None
    assert not (tmp_path / "absent").exists()
