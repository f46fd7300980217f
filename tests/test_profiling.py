"""`scripts/profile_rollout_components.py`: every section of one update timed at the tiny
config's shapes, on one scale (env steps per second of an update). No timing is asserted,
only the report's structure and its arithmetic.

The profile itself runs as a real `scripts/profile_rollout_components.py` process, as a user
runs it. In-process, after the other test files of a pytest-xdist worker, XLA:CPU aborted
(once a segfault) while serializing the profiler's rollout executable for the persistent
compilation cache, deterministically at this test in two clean-clone CI runs (2026-11-25);
the same test alone, or after test_preemption.py in one process, passed. A fresh process
never carries another test's state into the profiler's compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from test_trainer import load_script

from terra_rl.validation.small import PLAIN_ENV_FLAGS, SMOKE_FIELDS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_rollout_components.py"
SECTIONS = ["env_step", "env_step_without_rules", "env_step_policy",
            "env_step_policy_without_rules", "policy_forward", "derived_inputs", "network",
            "rollout", "gae", "minibatch_gradient", "optimizer_apply", "full_update",
            "host_overhead"]


def tiny_flags() -> list[str]:
    flags = ["--config", "cpu_demo", "--num_devices", "1", "--total_timesteps", "64",
             *PLAIN_ENV_FLAGS]
    for name in ("max_steps", "num_maps", "num_envs_per_device", "num_steps", "update_epochs",
                 "num_minibatches", "map_feature_dim", "hidden_dim", "eval_episodes"):
        flags += [f"--{name}", str(SMOKE_FIELDS[name])]
    return flags


def test_profile_reports_every_section_on_one_scale(tmp_path):
    out, trace = tmp_path / "profile.json", tmp_path / "trace"
    # The suite's compilation cache (this worker's directory; tests/conftest.py) and devices.
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    result = subprocess.run(
        # Two updates a dispatch: the full update is timed as the trainer dispatches it (with
        # K > 1 the compiled update takes a count; calling it without one was a crash).
        [sys.executable, str(SCRIPT), *tiny_flags(), "--updates_per_dispatch", "2",
         "--repeats", "2", "--json", str(out), "--trace", str(trace)],
        env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    table = result.stdout
    assert all(name in table for name in SECTIONS)
    record = json.loads(out.read_text())
    sections = {s["name"]: s for s in record["sections"]}
    assert list(sections) == SECTIONS
    per_update = SMOKE_FIELDS["num_envs_per_device"] * SMOKE_FIELDS["num_steps"]
    minibatch_steps = SMOKE_FIELDS["update_epochs"] * SMOKE_FIELDS["num_minibatches"]
    for name, section in sections.items():
        assert section["seconds"] > 0, name
        calls = minibatch_steps if name in ("minibatch_gradient", "optimizer_apply") else 1
        assert section["calls_per_update"] == calls
        assert section["seconds_per_update"] == pytest.approx(section["seconds"] * calls)
        assert section["steps_per_second"] == pytest.approx(
            per_update / section["seconds_per_update"])
    assert record["config"]["num_envs_per_device"] == SMOKE_FIELDS["num_envs_per_device"]
    # cpu_demo masks its actions: the step without the rules, timed in the same rounds.
    ratio = sections["env_step"]["seconds"] / sections["env_step_without_rules"]["seconds"]
    assert f"env step with the rules / without: {ratio:.2f}x" in table
    # And the policy's actions, replayed with and without the rules.
    ratio = (sections["env_step_policy"]["seconds"]
             / sections["env_step_policy_without_rules"]["seconds"])
    assert f"env step with the rules / without, the policy's actions: {ratio:.2f}x" in table
    assert record["runtime"]["backend"] == "cpu"

    # The trace of 2 dispatches of 2 updates, read by trace_top_ops.py: its device ops are the
    # update's, named by the HLO beside it, and the tables add up.
    assert f"trace_top_ops.py {trace} --updates 4" in table
    hlo = (trace / "update.hlo.txt").read_text()
    assert hlo.startswith("HloModule ")
    top_ops = load_script("trace_top_ops")
    summary = top_ops.summarise(
        top_ops.load_trace_events(trace, top_ops.hlo_module_name(hlo)),
        top_ops.parse_hlo_sources(hlo), 4, 10**6)
    assert summary["device_op_ms_per_update"] > 0 and 0 < summary["busy_share"] <= 1
    for table in ("by_file", "by_line", "ops"):
        shares = [row["share"] for row in summary[table]]
        assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    files = {row["name"] for row in summary["by_file"]}
    assert {"envs/env.py", "terra_rl/nets/models.py"} <= files, files
    assert sum(op["location"] != "" for op in summary["ops"]) > len(summary["ops"]) / 2


def test_profiler_rejects_zero_repeats(capsys):
    script = load_script(SCRIPT.stem)
    with pytest.raises(SystemExit) as error:
        script.main([*tiny_flags(), "--repeats", "0"])
    assert error.value.code == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_a_bad_train_flag_names_the_profiler(capsys):
    script = load_script(SCRIPT.stem)
    with pytest.raises(SystemExit) as error:
        script.main([*tiny_flags(), "--num_minibatches", "zero"])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("profile_rollout_components.py: error:") and "\n" not in err


def test_the_table_gives_no_rate_for_the_host_overhead():
    """The host overhead is what a logged update adds, not a path with a rate: its row has
    seconds only (a near-zero overhead printed as trillions of env steps/s before)."""
    from terra_rl.perf.profiling import Section, format_table

    sections = [Section("env_step", 0.25, 1, 2048), Section("full_update", 0.5, 1, 2048),
                Section("host_overhead", 1e-9, 1, 2048)]
    rows = {line.split()[0]: line.split() for line in format_table(sections).splitlines()[1:]}
    assert rows["env_step"][-2:] == ["8,192", "100.0%"]
    assert rows["full_update"][-2:] == ["4,096", "50.0%"]
    assert len(rows["host_overhead"]) == 4
    assert "with the rules / without" not in format_table(sections)


def test_the_table_gives_the_env_steps_ratio_with_and_without_the_rules():
    from terra_rl.perf.profiling import Section, format_table

    sections = [Section("env_step", 0.25, 1, 2048), Section("env_step_without_rules", 0.1, 1, 2048),
                Section("env_step_policy", 0.4, 1, 2048),
                Section("env_step_policy_without_rules", 0.125, 1, 2048),
                Section("full_update", 0.5, 1, 2048)]
    table = format_table(sections)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:-2]}
    assert rows["env_step_without_rules"][-2:] == ["20,480", "250.0%"]
    assert rows["env_step_policy"][-2:] == ["5,120", "62.5%"]
    assert table.splitlines()[-2:] == [
        "env step with the rules / without: 2.50x",
        "env step with the rules / without, the policy's actions: 3.20x"]


def test_init_params_without_a_checkpoint_is_one_line(tmp_path, capsys):
    script = load_script(SCRIPT.stem)
    with pytest.raises(SystemExit) as error:
        script.main([*tiny_flags(), "--init_params", str(tmp_path)])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("profile_rollout_components.py: error: --init_params:")
    assert "holds no checkpoints/" in err and "\n" not in err
