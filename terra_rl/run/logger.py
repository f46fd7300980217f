"""Host-side logging of a training run: metrics.jsonl, Weights & Biases, and a progress line.

`RunLogger` is what the trainer's host loop uses; the three parts it composes are usable alone.
Only one process of a multi-host job should create a RunLogger (process 0); the others use
`NullRunLogger`.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from terra_rl import env_vars
from terra_rl.run.run_dir import METRICS_FILE

WANDB_MODES = ("online", "offline", "disabled")
DEFAULT_WANDB_MODE = "disabled"
_WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}  # values wandb itself accepts


def to_python_scalar(value: Any) -> Any:
    """A numpy/jax/Python scalar (or one-element array) as a Python bool, int or float.
    Strings and None pass through; anything that is not a single number raises TypeError."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise TypeError(f"expected a scalar number, got {type(value).__name__} {array.shape}")
    return array.reshape(()).item()


def to_json_value(value: Any) -> Any:
    """`to_python_scalar`, with NaN and +-inf as None (strict JSON has no such numbers)."""
    value = to_python_scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per `write` to a JSON-lines file, flushed on every write (to
    the operating system: a killed process loses none); `sync` also puts them on the disk.

    Each line holds `update`, `env_step`, `wall_time` (Unix time in seconds, so lines written
    before and after a resume share one clock) and the metrics; NaN/inf become null.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")

    def write(self, update: int, env_step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Writes one line and returns the record written."""
        if self._file is None:
            raise ValueError(f"MetricsWriter for {self.path} is closed")
        record: dict[str, Any] = {"update": int(update), "env_step": int(env_step)}
        record["wall_time"] = time.time()
        for key, value in metrics.items():
            if key in record:
                raise ValueError(f"metric name {key!r} collides with a reserved field")
            record[key] = to_json_value(value)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        return record

    def sync(self) -> None:
        """Waits until every record written is on the disk (a crash of the machine keeps
        them too): the trainer calls it before each checkpoint, which covers them."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file. A torn last line (a crash mid-write) is skipped.
    A resume truncates the file to its checkpoint first (`truncate_metrics`), so no update
    appears twice."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON") from None
    return records


def truncate_metrics(path: str | os.PathLike, last_update: int) -> int:
    """Drops the records of updates after `last_update` (the checkpoint a resume starts
    from) and a torn last line, rewriting the file atomically. Returns how many records were
    dropped; a missing file is left missing."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # torn by a crash mid-write
            raise ValueError(f"{path}:{number} is not valid JSON") from None
        if record.get("update", 0) <= last_update:
            kept.append(line)
    dropped = sum(1 for line in lines if line.strip()) - len(kept)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def resolve_wandb_mode(mode: str | None) -> str:
    """The W&B mode to use: an explicit `mode` wins, then the WANDB_MODE environment variable,
    then DEFAULT_WANDB_MODE ("disabled"), so nothing ever goes online unless asked to."""
    if mode is None:
        mode = env_vars.get("WANDB_MODE") or DEFAULT_WANDB_MODE
    mode = _WANDB_MODE_ALIASES.get(mode.strip().lower(), mode.strip().lower())
    if mode not in WANDB_MODES:
        raise ValueError(f"W&B mode must be one of {', '.join(WANDB_MODES)}; got {mode!r}")
    return mode


class WandbLogger:
    """A W&B run whose files live under `run_dir/wandb/`. `mode` is resolved with
    `resolve_wandb_mode`; "disabled" never imports wandb. If online init fails (no network,
    no API key) the run continues offline after a one-line warning on stderr; `self.mode` is
    the mode actually in use. Passing `run_id` continues that W&B run (resume="allow"); keep
    `self.run_id` (e.g. in the manifest) to continue the same W&B run when training resumes."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        project: str = "terra_rl",
        entity: str | None = None,
        name: str | None = None,
        tags: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        mode: str | None = None,
        run_id: str | None = None,
        init_timeout_s: float = 60.0,
    ):
        self.mode = resolve_wandb_mode(mode)
        self.run_id: str | None = None
        self._run = None
        if self.mode == "disabled":
            return
        import wandb

        kwargs = dict(
            project=project,
            entity=entity,
            name=name,
            tags=list(tags),
            config=dict(config or {}),
            dir=str(run_dir),
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(init_timeout=init_timeout_s),
        )
        try:
            self._run = wandb.init(mode=self.mode, **kwargs)
        except Exception as error:
            if self.mode != "online":
                raise
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            print(f"warning: W&B online init failed ({reason}); logging offline", file=sys.stderr)
            self.mode = "offline"
            self._run = wandb.init(mode="offline", **kwargs)
        self.run_id = self._run.id

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Logs scalars at `step` (RunLogger uses the env step)."""
        if self._run is not None:
            self._run.log({k: to_python_scalar(v) for k, v in metrics.items()}, step=int(step))

    def finish(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            try:
                run.finish()
            except Exception as error:  # a failed upload must not fail a finished run
                print(f"warning: W&B finish failed ({error})", file=sys.stderr)


class ProgressDisplay:
    """A progress line: `update done/total (pct) | env steps | steps/s | ETA | last eval`.

    On a TTY one line is rewritten with `\\r`; otherwise plain lines are printed, at most every
    `min_interval_s` plus always the first and last update, so Slurm logs stay readable.
    `min_interval_s=None` picks 0.2 s on a TTY and 30 s otherwise. The ETA uses the update rate
    over the last RATE_WINDOW calls, which leaves compilation of the first update out. Eval
    numbers shown are `eval_keys` (default: the first three keys of `last_eval`).
    """

    RATE_WINDOW = 20

    def __init__(
        self,
        total_updates: int,
        stream: TextIO | None = None,
        min_interval_s: float | None = None,
        *,
        eval_keys: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_updates = int(total_updates)
        self.stream = stream if stream is not None else sys.stdout
        self.is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        if min_interval_s is None:
            min_interval_s = 0.2 if self.is_tty else 30.0
        self.min_interval_s = float(min_interval_s)
        self.eval_keys = None if eval_keys is None else tuple(eval_keys)
        self._clock = clock
        self._samples: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=self.RATE_WINDOW
        )
        self._last_shown: float | None = None
        self._line = ""  # the progress line currently on a TTY, "" when none is showing

    def update(
        self,
        update: int,
        env_steps: int,
        steps_per_second: float | None = None,
        last_eval: Mapping[str, Any] | None = None,
    ) -> None:
        """Reports that `update` of `total_updates` updates are done."""
        now = self._clock()
        self._samples.append((now, update))
        is_last = update >= self.total_updates
        due = self._last_shown is None or now - self._last_shown >= self.min_interval_s
        if not (due or is_last):
            return
        self._last_shown = now
        line = self.format_line(update, env_steps, steps_per_second, last_eval)
        if self.is_tty:
            self._draw(line)
            if is_last:
                self.stream.write("\n")
                self._line = ""
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def format_line(self, update, env_steps, steps_per_second, last_eval) -> str:
        """The progress line for `update` arguments (see `update`)."""
        total = max(self.total_updates, 1)
        parts = [
            f"update {update}/{self.total_updates} ({100.0 * update / total:.1f}%)",
            f"{_si(env_steps)} steps",
            f"{_si(steps_per_second)} steps/s" if steps_per_second is not None else "-- steps/s",
            f"ETA {self._eta(update)}",
        ]
        if last_eval:
            keys = [k for k in self.eval_keys or tuple(last_eval)[:3] if k in last_eval]
            shown = [f"{k.removeprefix('eval/')} {_fmt(last_eval[k])}" for k in keys]
            parts.append("eval " + " ".join(shown))
        return " | ".join(parts)

    def message(self, text: str) -> None:
        """Prints `text` on its own line; a TTY progress line is redrawn below it."""
        if self.is_tty and self._line:
            line = self._line
            self._draw(text)
            self.stream.write("\n")
            self._line = ""
            self._draw(line)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends a TTY progress line that is still showing; safe to call twice."""
        if self.is_tty and self._line:
            self.stream.write("\n")
            self.stream.flush()
        self._line = ""

    def _draw(self, line: str) -> None:
        padding = " " * max(len(self._line) - len(line), 0)  # blank out a longer previous line
        self.stream.write("\r" + line + padding)
        self._line = line

    def _eta(self, update: int) -> str:
        if update >= self.total_updates:
            return "0:00:00"
        if len(self._samples) < 2:
            return "--"
        (t0, u0), (t1, u1) = self._samples[0], self._samples[-1]
        if u1 <= u0 or t1 <= t0:
            return "--"
        seconds = (self.total_updates - update) * (t1 - t0) / (u1 - u0)
        return _duration(seconds)


class RunLogger:
    """`run_dir/metrics.jsonl` + W&B + progress line, for the trainer's host loop:

        wandb = WandbLogger(run_dir, name=run_dir.name, config=config, mode=flags.wandb_mode)
        with RunLogger(run_dir, num_updates, wandb=wandb) as logger:
            logger.log_train(update, env_step, metrics)
            logger.progress(update, env_step, steps_per_second)

    Metrics go to W&B with `step=env_step`, plus an `update` field.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        total_updates: int,
        *,
        wandb: WandbLogger | None = None,
        stream: TextIO | None = None,
        progress_interval_s: float | None = None,
        eval_keys: Iterable[str] | None = None,
    ):
        self.metrics = MetricsWriter(Path(run_dir) / METRICS_FILE)
        self.progress_display = ProgressDisplay(
            total_updates, stream, progress_interval_s, eval_keys=eval_keys
        )
        self.wandb = wandb
        self.last_eval: dict[str, Any] | None = None

    def log_train(self, update: int, env_step: int, metrics: Mapping[str, Any]) -> None:
        """Writes training metrics (names as given) to metrics.jsonl and W&B."""
        self._log(update, env_step, dict(metrics))

    def log_eval(self, update: int, env_step: int, metrics: Mapping[str, Any]) -> None:
        """Writes evaluation metrics as `eval/<name>` (names already under `eval/`,
        `eval_sampled/` or `validation/` stay) and keeps them for the progress line."""
        prefixed = {
            k if k.startswith(("eval/", "eval_sampled/", "validation/")) else f"eval/{k}": v
            for k, v in metrics.items()
        }
        self.last_eval = self._log(update, env_step, prefixed)

    def progress(self, update: int, env_step: int, steps_per_second: float | None) -> None:
        self.progress_display.update(update, env_step, steps_per_second, self.last_eval)

    def sync(self) -> None:
        """Puts every metrics.jsonl record logged so far on the disk (`MetricsWriter.sync`)."""
        self.metrics.sync()

    def message(self, text: str) -> None:
        self.progress_display.message(text)

    def close(self) -> None:
        self.progress_display.close()
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _log(self, update: int, env_step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = self.metrics.write(update, env_step, metrics)
        if self.wandb is not None:
            self.wandb.log({"update": record["update"], **metrics}, step=env_step)
        return {k: record[k] for k in metrics}


class NullRunLogger:
    """`RunLogger`'s interface, writing and printing nothing: the logger of every process but
    process 0 in a multi-process run, which computes the same metrics but must not log them."""

    last_eval: dict[str, Any] | None = None

    def log_train(self, update: int, env_step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def log_eval(self, update: int, env_step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def progress(self, update: int, env_step: int, steps_per_second: float | None) -> None:
        pass

    def sync(self) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullRunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _si(value: float) -> str:
    """1234567 -> '1.23M'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _fmt(value: Any) -> str:
    return "nan" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    """3723.4 -> '1:02:03'."""
    if not math.isfinite(seconds) or seconds > 1e8:
        return "--"
    return str(datetime.timedelta(seconds=round(seconds)))
