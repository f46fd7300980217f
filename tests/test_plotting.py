"""`scripts/plot_metrics.py` and `terra_rl.analysis.plotting` on synthetic run directories: seed
groups, mean and min-max bands, a torn last line, a run resumed without truncation, and the PNG."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from terra_rl.analysis.plotting import group_runs, load_run, plot_groups, seed_band

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_metrics.py"


def write_run(root: Path, name: str, seed: int, lr: float, records: list[dict],
              tail: str = "") -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"run_name": name, "seed": seed, "lr": lr, "preset": "cpu_demo", "runs_dir": "x"}
    (run_dir / "config.json").write_text(json.dumps(config))
    lines = [json.dumps({"update": r["update"], "env_step": 100 * r["update"],
                         "wall_time": 0.0, **r["metrics"]}) for r in records]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    return run_dir


def records(completion: list[float], entropy: list[float]) -> list[dict]:
    out = []
    for update, (rate, ent) in enumerate(zip(completion, entropy, strict=True)):
        out.append({"update": update, "metrics": {"eval/completion_rate": rate,
                                                  "eval/DO": 0.5, "eval/FORWARD": 0.5}})
        out.append({"update": update, "metrics": {"train/entropy": ent}})
    return out


@pytest.fixture
def runs(tmp_path):
    a0 = write_run(tmp_path, "a_s0", 0, 1e-3, records([0.0, 0.2, 0.4], [2.0, 1.5, 1.0]))
    # Seed 1 was resumed by an older version (update 1 logged twice: the later wins) and is
    # still being written (a torn last line).
    resumed = records([0.0, 0.9, 0.6], [2.0, 1.9, 1.2])
    resumed.insert(4, {"update": 1, "metrics": {"eval/completion_rate": 0.4}})
    a1 = write_run(tmp_path, "a_s1", 1, 1e-3, resumed, tail='{"update": 3, "env_st')
    b0 = write_run(tmp_path, "b_s0", 0, 5e-4, records([0.0, 0.1], [2.0, 1.8]))
    return [a0, a1, b0]


def test_seed_groups_bands_and_last_record_wins(runs):
    loaded = [load_run(path) for path in runs]
    steps, values = loaded[1].curves["eval/completion_rate"]
    assert steps.tolist() == [0, 100, 200] and values.tolist() == [0.0, 0.4, 0.6]
    assert loaded[0].action_names == ("DO", "FORWARD")
    groups = group_runs(loaded)
    assert [g.label for g in groups] == ["a (2 seeds: 0,1)", "b_s0"]
    steps, mean, low, high = seed_band(groups[0].runs, "eval/completion_rate")
    assert steps.tolist() == [0, 100, 200]
    np.testing.assert_allclose(mean, [0.0, 0.3, 0.5])
    np.testing.assert_allclose(low, [0.0, 0.2, 0.4])
    np.testing.assert_allclose(high, [0.0, 0.4, 0.6])
    assert seed_band(groups[1].runs, "eval_sampled/completion_rate") is None


@pytest.mark.parametrize(("names", "seeds", "label"), [
    (("Breakout-MinAtar-s0", "Breakout-MinAtar-s12"), (0, 12), "Breakout-MinAtar (2 seeds: 0,12)"),
    (("run_seed3", "run_seed4"), (3, 4), "run (2 seeds: 3,4)"),
    # Digits that are not the run's own seed stay: 2026 is not seed 6's marker.
    (("exp-2026", "exp-2027"), (6, 7), "exp-2026 (2 seeds: 6,7)"),
    (("x-s1", "y-s2"), (1, 2), "x-s1 (2 seeds: 1,2)"),
])
def test_a_seed_group_is_named_without_its_seed_markers(tmp_path, names, seeds, label):
    paths = [write_run(tmp_path, name, seed, 1e-3, records([0.0, 0.2], [2.0, 1.5]))
             for name, seed in zip(names, seeds, strict=True)]
    assert [g.label for g in group_runs([load_run(path) for path in paths])] == [label]


def test_a_field_added_since_an_older_run_counts_as_its_default(tmp_path):
    """A run from before `gymnax_activation` existed groups with a newer run that records
    the default, not with one that records another value."""
    old = write_run(tmp_path, "old_s0", 0, 1e-3, records([0.0, 0.2], [2.0, 1.5]))
    paths = [old]
    for name, seed, activation in (("new_s1", 1, "tanh"), ("relu_s2", 2, "relu")):
        path = write_run(tmp_path, name, seed, 1e-3, records([0.0, 0.3], [2.0, 1.4]))
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config,
                                                      "gymnax_activation": activation}))
        paths.append(path)
    groups = group_runs([load_run(path) for path in paths])
    assert [g.label for g in groups] == ["old_s0 (2 seeds: 0,1)", "relu_s2"]


def test_script_writes_a_png_with_the_panels_that_have_data(runs, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("plot_metrics", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "curves.png"
    assert script.main([*map(str, runs), "--out", str(out), "--title", "test"]) == 0
    assert "3 panels, 3 run(s) in 2 group(s)" in capsys.readouterr().out
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width > 800 and image.height > 200
        pixels = np.asarray(image.convert("L"))
    assert pixels.min() < 100 and pixels.max() > 200  # lines drawn on a light background
    panels = plot_groups(group_runs([load_run(runs[2])]), tmp_path / "b.png")
    assert panels == ["held-out completion rate (solid greedy; dashed sampled, then validation)",
                      "policy entropy", "actions"]

    with pytest.raises(SystemExit) as error:
        script.main([str(tmp_path / "nowhere"), "--out", str(out)])
    assert error.value.code == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        script.main([str(runs[0]), "--out", str(tmp_path / "curves.pdf")])
    assert error.value.code == 2
    assert f"--out must name a .png file, got {tmp_path / 'curves.pdf'}" in \
        capsys.readouterr().err
    assert not (tmp_path / "curves.pdf").exists()
