"""train_mixed.py's `main` on the tiny config: a run trained once per module, its resume, a
warm start and `--max_updates`, and the scripts that read a trained run (play_episode.py,
diagnose_failures.py) or build the same shapes (benchmark_train.py). (Split from
tests/test_trainer.py, whose shared tiny trainer these do not use, so they can run on
another worker.)"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from PIL import Image
from test_trainer import NUM_DEVICES, TINY, leaves_equal, load_script

import terra_rl.cli.main
from terra_rl.analysis.failure_diagnosis import CATEGORIES
from terra_rl.cli.main import main
from terra_rl.run.checkpointing import CheckpointStore
from terra_rl.run.logger import read_metrics
from terra_rl.run.train_loop import TrainResult
from terra_rl.run.trainer import policy_config

pytestmark = pytest.mark.slow


def cli_flags(runs_dir, run_name: str) -> list[str]:
    """train_mixed.py flags for the tiny config on cpu_demo, two updates on 4 devices."""
    flags = ["--config", "cpu_demo", "--runs_dir", str(runs_dir), "--run_name", run_name,
             "--wandb_mode", "disabled", "--compilation_cache_dir", ""]
    for name, value in TINY.items():
        if name not in ("preset", "wandb_mode", "compilation_cache_dir", "map_types",
                        "curriculum", "use_action_mask", "use_compass",
                        "use_dig_distance", "use_pose_distance", "mask_cut_off_digs",
                        "stall_steps"):  # cpu_demo's
            flags += [f"--{name}", str(value)]
    return flags + ["--num_devices", str(NUM_DEVICES), "--total_timesteps", str(2 * 8 * 8 * 4)]


@pytest.fixture(scope="module")
def tiny_cli_run(tmp_path_factory):
    """(run directory, stdout) of `train_mixed.py` on `cli_flags`, trained in this process
    once: it compiles for over a minute, so the tests that read a trained run share it, and a
    test that changes the run works on a copy."""
    root = tmp_path_factory.mktemp("tiny_cli_run")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(cli_flags(root, "run")) == 0
    return root / "run", stdout.getvalue()


def test_cli_runs_and_resumes(tiny_cli_run, tmp_path, capsys):
    trained, stdout = tiny_cli_run
    *_, directory_line, headline = stdout.strip().splitlines()
    assert directory_line == f"run directory: {trained}"
    assert re.fullmatch(r"held-out completion rate \(\d+ maps\): greedy \d+\.\d%, "
                        r"sampled \d+\.\d%", headline)
    run_dir = tmp_path / "cli"
    shutil.copytree(trained, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["num_devices"] == NUM_DEVICES and config["preset"] == "cpu_demo"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "jax" in manifest["packages"] and manifest["argv"][0] == "train_mixed.py"

    # As if a crash had come after logging update 3 but before its checkpoint, mid-write.
    with open(run_dir / "metrics.jsonl", "a") as metrics_file:
        metrics_file.write('{"update": 3, "env_step": 768, "train/actor_loss": 9.0}\n{"upd')
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--total_timesteps", str(3 * 8 * 8 * 4)]) == 0
    out = capsys.readouterr().out
    assert "config changes: total_timesteps: 512 -> 768" in out
    assert "dropped 2 metrics.jsonl record(s) after update 2" in out
    assert json.loads((run_dir / "config.json").read_text())["total_timesteps"] == 768
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["update"] for r in records if "train/actor_loss" in r] == [1, 2, 3]
    assert 9.0 not in [r["train/actor_loss"] for r in records if "train/actor_loss" in r]
    assert CheckpointStore(run_dir / "checkpoints").latest_step() == 3
    resumes = json.loads((run_dir / "manifest.json").read_text())["resumes"]
    assert len(resumes) == 1

    # The persisted total holds: a second resume has nothing to do, says so, exits 3.
    with pytest.raises(SystemExit) as nothing:
        main(["--resume", str(run_dir)])
    assert nothing.value.code == 3
    assert "already at update 3 of 3: nothing to do" in capsys.readouterr().err

    # A checkpoint of another network (here: a wider trunk in config.json) stops the resume
    # with one line and exit 2, not a traceback.
    config["hidden_dim"] = 2 * TINY["hidden_dim"]
    (run_dir / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["--resume", str(run_dir), "--total_timesteps", str(4 * 8 * 8 * 4)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("train_mixed.py: error: ") and "trunk" in error


def test_cli_warm_start_passes_the_checkpoint_or_stops_with_one_line(tiny_cli_run, tmp_path,
                                                                      capsys, monkeypatch):
    """`--init_params` reaches `train` as the checkpoint's parameters (train itself is
    replaced here: the test above trains from them); a missing run or another network
    stops before anything compiles, exit 2 and one line."""
    trained = tiny_cli_run[0]
    passed = {}

    def fake_train(trainer, logger, checkpoints, **kwargs):
        passed.update(kwargs)
        return TrainResult(None, 0, 0, {}, {}, 0.0)

    monkeypatch.setattr(terra_rl.cli.main, "train", fake_train)
    restored = ocp.StandardCheckpointer().restore(trained / "checkpoints" / "2" / "state")
    expected = jax.tree.map(lambda x: np.asarray(x)[0], restored["policy"]["params"])
    flags = cli_flags(tmp_path, "warm")
    assert main([*flags, "--init_params", str(trained), "--init_params_checkpoint", "2"]) == 0
    assert leaves_equal(passed["init_params"], expected)
    assert f"policy parameters from {trained} (update 2)" in capsys.readouterr().out
    assert json.loads((tmp_path / "warm" / "config.json").read_text())["init_params"] == str(
        trained)

    errors = {
        "nowhere": (["--init_params", str(tmp_path / "nowhere")], "holds no checkpoints/"),
        "wider": (["--init_params", str(trained), "--hidden_dim", str(2 * TINY["hidden_dim"])],
                  "the network must match"),
        "which": (["--init_params", str(trained), "--init_params_checkpoint", "last"],
                  "must be latest, best or an update number"),
    }
    for name, (extra, phrase) in errors.items():
        with pytest.raises(SystemExit) as stopped:
            main([*cli_flags(tmp_path, name), *extra])
        assert stopped.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("train_mixed.py: error: ") and phrase in err[0]
        assert not (tmp_path / name).exists(), name


def test_cli_max_updates_counts_in_total_and_exits_3_when_already_there(
        tiny_cli_run, tmp_path, capsys, monkeypatch):
    """`--max_updates N` on a resume: a run whose checkpoint is at N has nothing to do, exits
    3 and writes nothing, even when its total is further; otherwise N reaches `train` as
    `stop_after` (train itself is replaced: the test above trains to it)."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_cli_run[0], run_dir)  # at update 2 of 2
    before = [(run_dir / name).read_text() for name in ("config.json", "manifest.json")]
    four_updates = str(4 * 8 * 8 * 4)
    capsys.readouterr()
    with pytest.raises(SystemExit) as nothing:
        main(["--resume", str(run_dir), "--total_timesteps", four_updates, "--max_updates", "2"])
    assert nothing.value.code == 3
    assert "is already at update 2 of 2: nothing to do" in capsys.readouterr().err
    assert [(run_dir / name).read_text() for name in ("config.json", "manifest.json")] == before

    passed = {}

    def fake_train(trainer, logger, checkpoints, **kwargs):
        passed.update(kwargs)
        return TrainResult(None, 3, 0, {}, {}, 0.0)

    monkeypatch.setattr(terra_rl.cli.main, "train", fake_train)
    assert main(["--resume", str(run_dir), "--total_timesteps", four_updates,
                 "--max_updates", "3"]) == 0
    assert passed["stop_after"] == 3 and passed["resume"] is True


def test_play_episode_from_a_trained_checkpoint(tiny_cli_run, tmp_path, capsys, monkeypatch):
    """A tiny trained run's policy plays a held-out map: one GIF frame per step, its
    checkpoints chosen by name; a run without checkpoints or of another env is refused."""
    run_dir = tiny_cli_run[0]
    play = load_script("play_episode")
    played = []
    load = play.load_trained_policy
    monkeypatch.setattr(play, "load_trained_policy",
                        lambda *args: played.append(load(*args)) or played[-1])
    # The second run dir is relative to the working directory, as a user types it.
    monkeypatch.chdir(run_dir.parent)
    for step, sample, where in (("latest", False, str(run_dir)), ("2", True, run_dir.name)):
        out = tmp_path / f"{step}.gif"
        capsys.readouterr()
        assert play.main(["--checkpoint", where, "--checkpoint-step", step,
                          "--map-index", "5", "--tile-pixels", "2", "--out", str(out),
                          *(["--sample"] if sample else [])]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0].endswith(f"checkpoint of update 2, held-out map 5 of 8, "
                                 f"{'sampled' if sample else 'greedy'}")
        steps = int(lines[-1].split("steps=")[1].split()[0])
        assert 1 <= steps <= TINY["max_steps"]  # the eval env's horizon, no stall limit
        with Image.open(out) as gif:
            assert gif.n_frames == steps

    errors = {
        "no checkpoint": (["--checkpoint", str(tmp_path / "nowhere")], "does not exist"),
        "map index": (["--checkpoint", str(run_dir), "--map-index", "8"], "not below the run's 8"),
        "policy too": (["--checkpoint", str(run_dir), "--policy", "eager"], "exclude each other"),
        "step": (["--checkpoint", str(run_dir), "--checkpoint-step", "7"], "no checkpoint 7"),
    }
    other = tmp_path / "cartpole"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"env": "gymnax:CartPole-v1"}))
    errors["another env"] = (["--checkpoint", str(other)], "excavation runs only")
    for name, (args, phrase) in errors.items():
        with pytest.raises(SystemExit) as stopped:
            play.main([*args, "--out", str(tmp_path / "x.gif")])
        err = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(err) == 1 and phrase in err[0], (name, err)
    assert not (tmp_path / "x.gif").exists()

    # The run has no wheeled excavators, but a caller may play one (--agent-type wheeled).
    assert played and not policy_config(played[0].config).wheeled_agents
    assert all(trained.policy.config.wheeled_agents for trained in played)


def test_diagnose_failures_judges_every_held_out_episode(tiny_cli_run, tmp_path, capsys):
    """`scripts/diagnose_failures.py`: each held-out episode of a tiny trained run is played
    to task_done or the horizon and judged once."""
    run_dir = tiny_cli_run[0]
    script = load_script("diagnose_failures")
    out = tmp_path / "failures.json"
    capsys.readouterr()
    assert script.main(["--checkpoint", str(run_dir), "--maps", "3",
                        "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "checkpoint of update 2, 3 held-out maps, greedy"
    report = json.loads(out.read_text())
    episodes, counts = report["episodes"], report["counts"]
    assert list(counts) == list(CATEGORIES) and sum(counts.values()) == len(episodes) == 3
    for episode in episodes:
        assert episode["category"] in CATEGORIES
        if episode["category"] == "done":
            assert episode["progress"] == 1.0 and episode["steps"] <= TINY["max_steps"]
        else:  # played to the eval horizon, no stall limit
            assert episode["steps"] == TINY["max_steps"] and episode["progress"] < 1.0
        assert (episode["solver_steps"] > 0) == (episode["category"] == "stalled while solvable")
        assert sum(episode["loop_actions"].values()) <= 40

    with pytest.raises(SystemExit) as error:
        script.main(["--checkpoint", str(run_dir), "--maps", "99"])
    assert error.value.code == 2
    assert "more than the run's 8 held-out maps" in capsys.readouterr().err


def test_benchmark_train_script(tmp_path, capsys):
    script = load_script("benchmark_train")
    skip = ("preset", "compilation_cache_dir", "map_types", "curriculum", "use_action_mask",
            "use_compass", "use_dig_distance", "use_pose_distance", "mask_cut_off_digs",
            "stall_steps")
    sets = [f"{name}={value}" for name, value in TINY.items() if name not in skip]
    sets += [f"num_devices={NUM_DEVICES}"]
    args = ["--config", "cpu_demo", "--updates", "1", "--json", str(tmp_path / "b.json")]
    for pair in sets:
        args += ["--set", pair]
    assert script.main(args) == 0
    record = json.loads((tmp_path / "b.json").read_text())
    assert record["env_steps_per_update"] == 8 * 8 * NUM_DEVICES
    assert record["steps_per_second"] > 0 and record["compile_seconds"] > 0
    assert "env steps/s" in capsys.readouterr().out
    with pytest.raises(SystemExit) as error:
        script.main(["--set", "no_such_field=1"])
    assert error.value.code == 2
