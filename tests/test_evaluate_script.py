"""`scripts/evaluate.py`: a trained run's checkpoint on held-out maps, no run directory made.

One tiny run (cpu_demo's network on 16x16 trenches, 2 updates, one device) is trained here;
the script must reproduce the run's own final eval on the same maps, evaluate on other map
types and sizes, and refuse what it cannot do with one line."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

from terra_rl.analysis.checkpoint_eval import EvalRequest, eval_config, wilson_interval
from terra_rl.cli.main import main as train_main
from terra_rl.config import ConfigError, config_from_dict

REPO = Path(__file__).resolve().parents[1]
EPISODES = 8


def load_script():
    spec = importlib.util.spec_from_file_location("evaluate", REPO / "scripts" / "evaluate.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    flags = ["--config", "cpu_demo", "--runs_dir", str(root), "--run_name", "run",
             "--wandb_mode", "disabled", "--compilation_cache_dir", "", "--num_devices", "1",
             "--num_envs_per_device", "8", "--num_steps", "8", "--num_minibatches", "2",
             "--update_epochs", "1", "--max_steps", "24", "--eval_episodes", str(EPISODES),
             "--num_maps", "16", "--total_timesteps", str(2 * 8 * 8),
             "--log_eval_interval", "2", "--checkpoint_interval", "2", "--disable_eval_sampling"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert train_main(flags) == 0
    return root / "run"


def evaluate(capsys, *args):
    code = load_script().main([str(a) for a in args])
    return code, capsys.readouterr()


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_it_reproduces_the_runs_own_final_eval_and_writes_nothing(trained, capsys, tmp_path):
    before = listing(trained.parent)
    report_path = tmp_path / "report.json"
    code, out = evaluate(capsys, trained, "--json", report_path)
    assert code == 0, out.err
    assert listing(trained.parent) == before  # no run directory, no file in the run
    report = json.loads(report_path.read_text())
    final = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()
             if '"eval/completion_rate"' in line][-1]
    assert final["update"] == report["update"] == 2
    assert report["all"]["completion_rate"] == final["eval/completion_rate"]
    assert report["first_episode_return"] == pytest.approx(final["eval/first_episode_return"],
                                                           abs=1e-6)
    assert report["all"]["episodes"] == EPISODES and report["map_size"] == 16
    assert [row["group"] for row in report["groups"]] == ["trenches/tracked"]
    assert "95% interval (Wilson)" in out.out and "trenches/tracked" in out.out


def test_other_map_types_and_sizes(trained, capsys, tmp_path):
    report_path = tmp_path / "report.json"
    code, out = evaluate(capsys, trained, "--map_types", "foundations,trenches",
                         "--map_size", "32", "--episodes", "4", "--checkpoint", "best",
                         "--json", report_path)
    assert code == 0, out.err
    report = json.loads(report_path.read_text())
    assert (report["map_size"], report["map_pool"]) == (32, 2)  # the flat encoder's 16x16
    assert [row["group"] for row in report["groups"]] == ["foundations/tracked",
                                                         "trenches/tracked"]
    assert sum(row["episodes"] for row in report["groups"]) == report["all"]["episodes"] == 4
    for row in [*report["groups"], report["all"]]:
        low, high = row["interval_95"]
        assert 0.0 <= low <= row["completion_rate"] <= high <= 1.0


@pytest.mark.parametrize("args, phrase", [
    (["--checkpoint", "99"], "no checkpoint 99"),
    (["--map_size", "24"], "--map_size must be one of"),
    (["--map_types", "volcanos"], "--map_types must be a comma list"),
])
def test_bad_requests_exit_2_with_one_line(trained, capsys, args, phrase):
    with pytest.raises(SystemExit) as stopped:
        load_script().main([str(trained), *args])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evaluate.py: error: ") and phrase in err[0], err


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_script().main([str(tmp_path)])
    assert stopped.value.code == 2
    assert "is not a terra_rl run directory" in capsys.readouterr().err


def test_a_size_the_flat_encoder_cannot_take_is_refused_with_the_reason(trained):
    saved = config_from_dict(json.loads((trained / "config.json").read_text()))
    import dataclasses

    wide = dataclasses.replace(saved, map_size=32, map_pool=1)  # a 32x32 encoder input
    with pytest.raises(ConfigError, match="takes a 32x32 pooled map"):
        eval_config(wide, EvalRequest(trained, map_size=16))
    assert eval_config(wide, EvalRequest(trained, map_size=64)).map_pool == 2


def test_wilson_interval_values():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 20)[1] == pytest.approx(0.1611, abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
