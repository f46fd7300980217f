"""metrics.jsonl, W&B modes without network or account, and the progress display."""

from __future__ import annotations

import io
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.run.logger import (
    MetricsWriter,
    ProgressDisplay,
    RunLogger,
    WandbLogger,
    read_metrics,
    resolve_wandb_mode,
    truncate_metrics,
)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch):
    """No API key, no netrc, no global W&B settings, nothing written outside tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))
    monkeypatch.setenv("WANDB_DIR", str(home / "wandb-dir-not-used"))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir


# metrics.jsonl


def test_metrics_round_trip_with_non_finite_and_array_scalars(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write(1, 4096, {"loss": 0.5, "nan": float("nan"), "inf": np.float32(np.inf)})
    writer.write(
        np.int64(2),
        jnp.asarray(8192),
        {"np32": np.float32(0.25), "jax": jnp.asarray(1.5), "count": np.int32(7), "ok": True},
    )
    # Flushed on every write: readable before close, as after a crash.
    records = read_metrics(path)
    writer.close()

    assert [(r["update"], r["env_step"]) for r in records] == [(1, 4096), (2, 8192)]
    assert records[0]["loss"] == 0.5 and records[0]["nan"] is None and records[0]["inf"] is None
    assert records[1]["np32"] == 0.25 and records[1]["jax"] == 1.5
    assert records[1]["count"] == 7 and type(records[1]["count"]) is int
    assert records[1]["ok"] is True
    for line in path.read_text().splitlines():
        assert "NaN" not in line and "Infinity" not in line
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert all(isinstance(r["wall_time"], float) for r in records)
    assert abs(records[1]["wall_time"] - records[0]["wall_time"]) < 60


def test_metrics_writer_appends_across_writers_and_skips_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with_first = MetricsWriter(path)
    with_first.write(1, 10, {"a": 1.0})
    with_first.close()
    resumed = MetricsWriter(path)
    resumed.write(2, 20, {"a": 2.0})
    resumed.close()
    with open(path, "a") as f:
        f.write('{"update": 3, "env_')  # a crash mid-write
    assert [r["a"] for r in read_metrics(path)] == [1.0, 2.0]


def test_truncate_metrics_keeps_the_checkpointed_updates_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert truncate_metrics(path, 3) == 0 and not path.exists()
    writer = MetricsWriter(path)
    for update in (0, 1, 2, 2, 3, 4):
        writer.write(update, 10 * update, {"a": float(update)})
    writer.close()
    before = path.read_bytes()
    assert truncate_metrics(path, 4) == 0 and path.read_bytes() == before  # untouched
    with open(path, "a") as f:
        f.write('{"update": 5, "env_')  # a crash mid-write
    assert truncate_metrics(path, 2) == 3  # updates 3 and 4, and the torn line
    assert [r["update"] for r in read_metrics(path)] == [0, 1, 2, 2]
    assert path.read_text().endswith("}\n")
    with open(path, "a") as f:
        f.write('{"update": 1, "env_\n{"update": 2}\n')  # a torn line that is not the last
    with pytest.raises(ValueError, match="not valid JSON"):
        truncate_metrics(path, 2)


def test_metrics_writer_rejects_bad_values(tmp_path):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="reserved"):
        writer.write(1, 1, {"update": 3.0})
    with pytest.raises(TypeError, match="scalar"):
        writer.write(1, 1, {"vector": np.zeros(3)})
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(1, 1, {})


# W&B


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, None, "disabled"),
        (None, "offline", "offline"),
        (None, "online", "online"),
        (None, "dryrun", "offline"),
        ("disabled", "online", "disabled"),
        ("offline", "disabled", "offline"),
        ("Online", None, "online"),
    ],
)
def test_resolve_wandb_mode(monkeypatch, flag, env, expected):
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    assert resolve_wandb_mode(flag) == expected


def test_resolve_wandb_mode_rejects_unknown(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(ValueError, match="online, offline, disabled"):
        resolve_wandb_mode("sometimes")


def test_wandb_disabled_writes_nothing(no_wandb_account):
    logger = WandbLogger(no_wandb_account, config={"a": 1})
    assert logger.mode == "disabled" and logger.run_id is None
    logger.log({"loss": 1.0}, step=1)
    logger.finish()
    assert list(no_wandb_account.iterdir()) == []


def _offline_run_dirs(run_dir):
    return list((run_dir / "wandb").glob("offline-run-*"))


def test_wandb_offline_writes_under_run_dir(no_wandb_account):
    logger = WandbLogger(no_wandb_account, name="r1", config={"lr": 1e-3}, mode="offline")
    assert logger.mode == "offline"
    logger.log({"loss": np.float32(0.5), "nan": float("nan")}, step=4096)
    logger.finish()
    logger.finish()
    [offline] = _offline_run_dirs(no_wandb_account)
    assert offline.name.endswith(logger.run_id)
    assert (offline / f"run-{logger.run_id}.wandb").stat().st_size > 0


def test_wandb_mode_env_var_is_used_when_no_flag(no_wandb_account, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(no_wandb_account)
    logger.finish()
    assert logger.mode == "offline" and len(_offline_run_dirs(no_wandb_account)) == 1

    # An explicit mode wins over the environment, also inside wandb itself.
    monkeypatch.setenv("WANDB_MODE", "disabled")
    explicit = WandbLogger(no_wandb_account, mode="offline")
    explicit.finish()
    assert explicit.mode == "offline" and len(_offline_run_dirs(no_wandb_account)) == 2
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert WandbLogger(no_wandb_account, mode="disabled").mode == "disabled"
    assert len(_offline_run_dirs(no_wandb_account)) == 2


def test_wandb_online_without_account_falls_back_to_offline(no_wandb_account, capsys):
    logger = WandbLogger(no_wandb_account, mode="online", init_timeout_s=10)
    logger.log({"loss": 1.0}, step=1)
    logger.finish()
    warning = capsys.readouterr().err.strip().splitlines()
    assert logger.mode == "offline"
    assert [line for line in warning if line.startswith("warning: W&B online init failed")]
    assert len(_offline_run_dirs(no_wandb_account)) == 1


# progress display


def test_progress_plain_lines_are_rate_limited(monkeypatch):
    clock, stream = FakeClock(), io.StringIO()
    display = ProgressDisplay(100, stream, min_interval_s=30.0, clock=clock)
    for update in range(1, 101):
        clock.now += 1.0  # one update per second
        display.update(update, update * 1024, 1024.0, None)
    display.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    # First, then every 30 s (updates 31, 61, 91), then always the last.
    assert [line.split()[1] for line in lines] == ["1/100", "31/100", "61/100", "91/100", "100/100"]
    assert "(31.0%)" in lines[1] and "1.02k steps/s" in lines[1] and "31.74k steps" in lines[1]
    assert "ETA --" in lines[0]  # no rate from a single sample
    assert "ETA 0:01:09" in lines[1]  # 69 updates left at 1 update/s
    assert "ETA 0:00:00" in lines[-1]


def test_progress_eta_uses_the_recent_rate():
    clock, stream = FakeClock(), io.StringIO()
    display = ProgressDisplay(1000, stream, min_interval_s=0.0, clock=clock)
    clock.now += 600.0  # a slow first update (compilation)
    display.update(1, 1, None, None)
    for update in range(2, 101):
        clock.now += 2.0
        display.update(update, update, None, None)
    last = stream.getvalue().splitlines()[-1]
    assert "-- steps/s" in last and "ETA 0:30:00" in last  # 900 updates at 2 s each


def test_progress_shows_last_eval_numbers():
    stream = io.StringIO()
    display = ProgressDisplay(10, stream, clock=FakeClock())
    display.update(1, 100, 50.0, {"eval/return": 12.3456, "eval/success": 0.5, "eval/len": 3})
    assert "eval return 12.35 success 0.5 len 3" in stream.getvalue()
    keys_display = ProgressDisplay(10, io.StringIO(), eval_keys=["eval/success"])
    line = keys_display.format_line(1, 100, 50.0, {"eval/return": 1.0, "eval/success": None})
    assert line.endswith("eval success nan")


def test_progress_on_tty_rewrites_one_line():
    clock, stream = FakeClock(), FakeTTY()
    display = ProgressDisplay(3, stream, min_interval_s=0.0, clock=clock)
    display.update(1, 10, 5.0, None)
    clock.now += 1.0
    display.update(2, 20, 5.0, None)
    display.message("checkpoint saved")
    clock.now += 1.0
    display.update(3, 30, 5.0, None)
    display.close()
    out = stream.getvalue()
    assert out.startswith("\rupdate 1/3") and "\rupdate 2/3" in out
    assert out.count("\n") == 2  # after the message and after the last update
    message_line, final_line = out.split("\n")[:2]
    assert message_line.split("\r")[-1].rstrip() == "checkpoint saved"
    assert final_line.split("\r")[-1].startswith("update 3/3 (100.0%)")
    assert "\rupdate 2/3" in final_line  # the progress line was redrawn after the message


def test_progress_tty_close_ends_an_unfinished_line():
    stream = FakeTTY()
    display = ProgressDisplay(10, stream, clock=FakeClock())
    display.update(1, 10, None, None)
    display.close()
    display.close()
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


# RunLogger


def test_run_logger_composes_metrics_wandb_and_progress(no_wandb_account):
    stream = io.StringIO()
    wandb = WandbLogger(no_wandb_account, mode="offline")
    with RunLogger(no_wandb_account, 2, wandb=wandb, stream=stream) as logger:
        logger.log_train(1, 100, {"loss": np.float32(0.5)})
        logger.progress(1, 100, 1000.0)
        logger.log_eval(1, 100, {"return": float("nan"), "eval/success": 1.0})
        logger.message("evaluated")
        logger.progress(2, 200, 1000.0)
    records = read_metrics(no_wandb_account / "metrics.jsonl")
    assert records[0]["loss"] == 0.5
    assert records[1]["eval/return"] is None and records[1]["eval/success"] == 1.0
    assert logger.last_eval == {"eval/return": None, "eval/success": 1.0}
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("update 1/2") and "eval" not in lines[0]
    assert lines[1] == "evaluated"
    assert lines[2].startswith("update 2/2") and "eval return nan success 1" in lines[2]
    assert wandb._run is None and len(_offline_run_dirs(no_wandb_account)) == 1
    assert not math.isnan(records[0]["wall_time"])


def test_a_resumed_run_continues_its_wandb_run(no_wandb_account):
    """train_mixed.py keeps the W&B run id in the run directory and passes it back on resume."""
    from terra_rl.cli.main import WANDB_ID_FILE, make_logger
    from terra_rl.config import TrainConfig

    config = TrainConfig(num_devices=1, wandb_mode="offline", run_name="resumed")
    with make_logger(no_wandb_account, config, ()) as first:
        first.log_train(1, 10, {"loss": 1.0})
    run_id = (no_wandb_account / WANDB_ID_FILE).read_text()
    with make_logger(no_wandb_account, config, ()) as resumed:
        resumed.log_train(2, 20, {"loss": 0.5})
    assert (no_wandb_account / WANDB_ID_FILE).read_text() == run_id
    runs = _offline_run_dirs(no_wandb_account)
    # offline-run-<time>-<id>, with "-1" appended when both start in the same second
    assert len(runs) == 2 and all(f"-{run_id}" in run.name for run in runs)
