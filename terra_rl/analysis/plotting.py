"""Learning curves from run directories (`metrics.jsonl` + `config.json`), for
`scripts/plot_metrics.py`.

A run's curve of a metric is its values against env steps, the last record winning where an
update was logged twice (a run resumed by an older version, before resumes cut
`metrics.jsonl` back to their checkpoint). Runs whose configs differ only in the seed (and
in names and paths) form one group, drawn as the mean over seeds with a shaded min-max band;
a field missing from an older run's config counts as its default.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from terra_rl.config import TrainConfig
from terra_rl.run.logger import read_metrics
from terra_rl.run.run_dir import CONFIG_FILE, METRICS_FILE

# Config fields that do not make two runs different experiments.
NOT_THE_EXPERIMENT = frozenset({
    "seed", "run_name", "runs_dir", "compilation_cache_dir", "wandb_mode", "wandb_project",
    "wandb_entity", "wandb_tags", "log_train_interval", "checkpoint_interval",
    "keep_checkpoints", "cache_clear_interval", "updates_per_dispatch",
})


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[str, ...]
    """Drawn together; the first solid, the others dashed (e.g. greedy and sampled)."""


PANELS: tuple[Panel, ...] = (
    Panel("held-out completion rate (solid greedy; dashed sampled, then validation)",
          ("eval/completion_rate", "eval_sampled/completion_rate",
           "validation/completion_rate")),
    Panel("eval positive terminations", ("eval/positive_terminations",)),
    Panel("eval return of the first episode", ("eval/first_episode_return",)),
    Panel("train episode progress", ("train/mean_episode_progress",)),
    Panel("policy entropy", ("train/entropy",)),
    Panel("value loss", ("train/value_loss",)),
    Panel("explained variance", ("train/explained_variance",)),
    Panel("curriculum mean level", ("curriculum/mean_level",)),
)


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    config: dict
    curves: dict[str, tuple[np.ndarray, np.ndarray]]
    """metric -> (env steps int64 [K], values float64 [K]), steps increasing."""
    action_names: tuple[str, ...]
    """Actions whose greedy eval share was logged (`eval/<ACTION>`)."""


@dataclasses.dataclass(frozen=True)
class Group:
    label: str
    runs: tuple[Run, ...]


class PlotError(ValueError):
    """A run directory that cannot be plotted; the message says why."""


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise PlotError(f"{run_dir} has no {METRICS_FILE}; pass a run directory of train_mixed.py")
    config_path = run_dir / CONFIG_FILE
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    latest: dict[str, dict[int, float]] = {}
    for record in read_metrics(path):  # skips a torn last line (a run still being written)
        step = int(record.get("env_step", 0))
        for name, value in record.items():
            if name in ("update", "env_step", "wall_time") or not isinstance(value, int | float):
                continue
            latest.setdefault(name, {})[step] = float(value)  # a later record wins
    curves = {
        name: (np.array(sorted(by_step), np.int64),
               np.array([by_step[s] for s in sorted(by_step)], np.float64))
        for name, by_step in latest.items()
    }
    actions = tuple(sorted(name.removeprefix("eval/") for name in curves
                           if name.startswith("eval/") and name.removeprefix("eval/").isupper()))
    return Run(config.get("run_name") or run_dir.name, config, curves, actions)


def _config_defaults() -> dict:
    """`TrainConfig`'s field defaults as `config.json` writes them (tuples as lists)."""
    return {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
            for f in dataclasses.fields(TrainConfig)
            if f.default is not dataclasses.MISSING}


def _name_without_seed(run: Run) -> str:
    """The run's name without a trailing marker of its own seed (`Breakout-s3`, `a_seed3`,
    `b.3` -> `Breakout`, `a`, `b`); the name itself when there is none."""
    seed = run.config.get("seed")
    if not isinstance(seed, int):
        return run.name
    return re.sub(rf"(?:[-_.](?:seed|s)?|seed|s){seed}$", "", run.name) or run.name


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs of one experiment (configs equal but for `NOT_THE_EXPERIMENT`, a field added
    since an older run counting as its default) together, in the order of their first run;
    a group of several is labelled with its seeds, and with the name its runs share once
    their seed markers are dropped (else the first run's)."""
    defaults = _config_defaults()
    groups: dict[str, list[Run]] = {}
    for run in runs:
        config = {**defaults, **run.config}
        key = json.dumps({k: v for k, v in config.items() if k not in NOT_THE_EXPERIMENT},
                         sort_keys=True) if run.config else run.name
        groups.setdefault(key, []).append(run)
    out = []
    for members in groups.values():
        if len(members) == 1:
            label = members[0].name
        else:
            seeds = ",".join(str(run.config.get("seed", "?")) for run in members)
            names = {_name_without_seed(run) for run in members}
            name = names.pop() if len(names) == 1 else members[0].name
            label = f"{name} ({len(members)} seeds: {seeds})"
        out.append(Group(label, tuple(members)))
    return out


def seed_band(runs: Sequence[Run], metric: str) -> tuple[np.ndarray, ...] | None:
    """(steps, mean, min, max) over the runs that logged `metric` at each step, or None if
    none did."""
    per_step: dict[int, list[float]] = {}
    for run in runs:
        if metric in run.curves:
            for step, value in zip(*run.curves[metric], strict=True):
                per_step.setdefault(int(step), []).append(value)
    if not per_step:
        return None
    steps = np.array(sorted(per_step), np.int64)
    values = [np.array(per_step[s]) for s in steps]
    return (steps, np.array([v.mean() for v in values]), np.array([v.min() for v in values]),
            np.array([v.max() for v in values]))


def plot_groups(groups: Sequence[Group], out: str | Path, title: str = "") -> list[str]:
    """Writes the figure to `out` (PNG); returns the titles of the panels drawn (those with
    data in some run, plus the first group's greedy eval action shares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS
              if any(seed_band(g.runs, p.metrics[0]) is not None for g in groups)]
    actions = groups[0].runs[0].action_names if groups else ()
    count = len(panels) + (1 if actions else 0)
    if count == 0:
        raise PlotError("none of the runs logged a metric this script plots")
    columns = min(3, count)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.4 * rows),
                                squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, panel in zip(axes.flat, panels, strict=False):
        for index, group in enumerate(groups):
            colour = colours[index % len(colours)]
            for style, metric in zip(("-", "--", ":"), panel.metrics, strict=False):
                band = seed_band(group.runs, metric)
                if band is None:
                    continue
                steps, mean, low, high = band
                label = group.label if style == "-" else None
                axis.plot(steps, mean, style, color=colour, label=label, linewidth=1.6)
                if len(group.runs) > 1:
                    axis.fill_between(steps, low, high, color=colour, alpha=0.18, linewidth=0)
        _style(axis, panel.title)
    if actions:
        axis = axes.flat[len(panels)]
        for index, action in enumerate(actions):
            band = seed_band(groups[0].runs, f"eval/{action}")
            if band is not None:
                axis.plot(band[0], band[1], color=colours[index % len(colours)], label=action)
        _style(axis, f"greedy eval action shares: {groups[0].label}")
        axis.legend(fontsize=7, ncol=2)
    for axis in list(axes.flat)[count:]:
        axis.set_visible(False)
    top = 1.0 - 0.5 / (3.4 * rows)  # room for the title and the legend, in figure units
    figure.tight_layout(rect=(0, 0, 1, top))
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, top),
                      ncol=min(len(labels), 3), fontsize=9, frameon=False)
    if title:
        figure.suptitle(title, y=1.0 + 0.25 / (3.4 * rows), fontsize=11)
    figure.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return [p.title for p in panels] + (["actions"] if actions else [])


def _style(axis, title: str) -> None:
    axis.set_title(title, fontsize=9)
    axis.set_xlabel("env steps", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.grid(alpha=0.3)
