"""`scripts/profile_rollout_components.py`: every section of one update timed at the tiny
config's shapes, on one scale (env steps per second of an update). No timing is asserted,
only the report's structure and its arithmetic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from terra_rl.validation.small import SMOKE_FIELDS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_rollout_components.py"
SECTIONS = ["env_step", "policy_forward", "rollout", "gae", "minibatch_gradient",
            "optimizer_apply", "full_update", "host_overhead"]


def load_script():
    spec = importlib.util.spec_from_file_location("profile_rollout_components", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def tiny_flags() -> list[str]:
    flags = ["--config", "cpu_demo", "--num_devices", "1", "--total_timesteps", "64"]
    for name in ("max_steps", "num_maps", "num_envs_per_device", "num_steps", "update_epochs",
                 "num_minibatches", "map_feature_dim", "hidden_dim", "eval_episodes"):
        flags += [f"--{name}", str(SMOKE_FIELDS[name])]
    return flags


def test_profile_reports_every_section_on_one_scale(tmp_path, capsys):
    script = load_script()
    out = tmp_path / "profile.json"
    assert script.main([*tiny_flags(), "--repeats", "2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
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
    assert record["runtime"]["backend"] == "cpu"

    with pytest.raises(SystemExit) as error:
        script.main([*tiny_flags(), "--repeats", "0"])
    assert error.value.code == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_a_bad_train_flag_names_the_profiler(capsys):
    script = load_script()
    with pytest.raises(SystemExit) as error:
        script.main([*tiny_flags(), "--num_minibatches", "zero"])
    assert error.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("profile_rollout_components.py: error:") and "\n" not in err
