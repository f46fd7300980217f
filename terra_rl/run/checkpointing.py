"""Orbax checkpoints of the runner state: the last K steps plus the best one by an eval metric.

Layout under the run's ``checkpoints/`` directory: ``<step>/state`` (the runner-state pytree,
orbax StandardSave), ``<step>/config`` (the resolved config, JSON), the step's metrics as custom
metadata in ``<step>/_CHECKPOINT_METADATA``, and a full copy of the best checkpoint in
``best/<step>/``.

Two orbax ``CheckpointManager``s, both ``LatestN``: the main one keeps the last ``keep_last``
steps, the one under ``best/`` keeps one step and is written to only when a checkpoint beats the
previous best. Orbax's ``best_fn`` ranks every retained step by the metric (ties go to the newer
step), so one manager could not keep "the last K by recency" and "the single best, replaced only
by a strictly better value" at the same time. The price is a second write when the best improves.

Saves are synchronous. Orbax writes each step into ``<step>.orbax-checkpoint-tmp`` and renames it
into place only when complete, so a crash mid-save leaves the previous latest step intact; stale
tmp directories are ignored by step listing and removed before the next save.

Multi-process runs: the state passed to `save` is host numpy (gathered onto every process by
the trainer), and only process 0 saves; every process restores from the same files (a
filesystem shared by all nodes). Each process's managers therefore act alone (orbax's
``active_processes`` is the process itself): no orbax barrier waits for processes that never
call the store. The other processes open the store with ``read_only=True``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

DEFAULT_BEST_METRIC = "validation/completion_rate"
BEST_SUBDIR = "best"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or does not fit the target; the message says how to fix it."""


# Warnings orbax gives on every read-only manager (the stores of processes other than 0).
_READ_ONLY_NOTICES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


class _DropOrbaxInfo(logging.Filter):
    """Drops orbax's INFO/DEBUG records (dozens per save) and its read-only notices; other
    warnings and other libraries pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname:
            return True
        return record.levelno >= logging.WARNING and not str(record.msg).startswith(
            _READ_ONLY_NOTICES
        )


# Orbax logs through absl, whose records all go to the python logger named "absl".
_absl_logger = logging.getLogger("absl")
if not any(isinstance(f, _DropOrbaxInfo) for f in _absl_logger.filters):
    _absl_logger.addFilter(_DropOrbaxInfo())


def _multiprocessing_options() -> ocp.options.MultiprocessingOptions:
    """One process: orbax's defaults. Several: this process alone (see the module doc)."""
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    process = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=process, active_processes={process})


def _handler_registry(
    multiprocessing: ocp.options.MultiprocessingOptions,
) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    # Registering the items up front lets a fresh manager read metadata and restore single items
    # of checkpoints written by another process (orbax otherwise only knows items it has saved).
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    state_handler = ocp.handlers.StandardCheckpointHandler(multiprocessing_options=multiprocessing)
    config_handler = ocp.handlers.JsonCheckpointHandler(multiprocessing_options=multiprocessing)
    registry.add("state", ocp.args.StandardSave, state_handler)
    registry.add("state", ocp.args.StandardRestore, state_handler)
    registry.add("config", ocp.args.JsonSave, config_handler)
    registry.add("config", ocp.args.JsonRestore, config_handler)
    return registry


def _manager(directory: Path, keep: int, read_only: bool) -> ocp.CheckpointManager:
    multiprocessing = _multiprocessing_options()
    # Orbax refuses to create the directory when `active_processes` is set.
    create = multiprocessing.active_processes is None and not read_only
    if not read_only and not create:
        directory.mkdir(parents=True, exist_ok=True)
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False,
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        cleanup_tmp_directories=not read_only,
        read_only=read_only,
        create=create,
        multiprocessing_options=multiprocessing,
    )
    return ocp.CheckpointManager(
        directory, options=options, handler_registry=_handler_registry(multiprocessing)
    )


def _to_host(state: Any) -> Any:
    """Host numpy copy of `state` (a no-op for numpy leaves); rejects typed PRNG keys."""
    for leaf in jax.tree.leaves(state):
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
            raise CheckpointError(
                "typed PRNG keys cannot be checkpointed; store jax.random.key_data(key) "
                "(or raw jax.random.PRNGKey uint32 keys) in the runner state instead"
            )
    return jax.device_get(state)


def _json_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    # tolist() turns numpy and jax scalars into the python numbers JSON needs.
    return {str(k): np.asarray(v).tolist() for k, v in (metrics or {}).items()}


def _save_args(state: Any, config: Mapping[str, Any]) -> ocp.args.Composite:
    return ocp.args.Composite(
        state=ocp.args.StandardSave(_to_host(state)), config=ocp.args.JsonSave(dict(config))
    )


def _finite_number(value: Any) -> bool:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return is_number and math.isfinite(value)


def _spec(leaf: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of an array, a `ShapeDtypeStruct` or an orbax metadata entry."""
    return jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype))


def _leaf_specs(tree: Any) -> dict[str, jax.ShapeDtypeStruct]:
    # Dataclass and namedtuple fields, dict keys and sequence indices give the same dotted names
    # as orbax's metadata tree, in which every container is a dict or a list.
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): _spec(leaf) for path, leaf in flat
    }


def _target_problems(saved_tree: Any, target_tree: Any) -> list[str]:
    """Differences between the saved metadata tree and the target, as short phrases."""
    saved, target = _leaf_specs(saved_tree), _leaf_specs(target_tree)
    problems = [f"{name} missing from the checkpoint" for name in target.keys() - saved.keys()]
    problems += [
        f"{name} in the checkpoint but not the target" for name in saved.keys() - target.keys()
    ]
    problems += [
        f"{name} is {saved[name].dtype}{list(saved[name].shape)} in the checkpoint, "
        f"{target[name].dtype}{list(target[name].shape)} in the target"
        for name in saved.keys() & target.keys()
        if saved[name] != target[name]
    ]
    return sorted(problems)


class CheckpointStore:
    """The run's checkpoints: the last `keep_last` steps plus the best step by `best_metric`.

    `best_metric` is read from the `metrics` passed to `save`; higher is better. A checkpoint
    becomes the best only if its value is finite and strictly greater than the best so far.
    `read_only` opens a store that only restores: it creates, cleans and saves nothing (the
    store of every process but process 0 in a multi-process run).
    """

    def __init__(
        self,
        directory: str | Path,
        keep_last: int = 3,
        best_metric: str = DEFAULT_BEST_METRIC,
        *,
        read_only: bool = False,
    ):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory).absolute()
        self.best_metric = best_metric
        self.read_only = read_only
        self._latest = _manager(self.directory, keep_last, read_only)
        self._best = _manager(self.directory / BEST_SUBDIR, 1, read_only)
        best_step = self._best.latest_step()
        best_metrics = self.metrics(best_step) if best_step is not None else {}
        value = best_metrics.get(best_metric)
        self._best_value = value if _finite_number(value) else None

    def latest_step(self) -> int | None:
        """The newest saved step, or None when there is none."""
        return self._latest.latest_step()

    def all_steps(self) -> list[int]:
        """The retained last-K steps, oldest first (the best step lives apart, see `best_step`)."""
        return sorted(self._latest.all_steps())

    def best_step(self) -> int | None:
        """The step of the best checkpoint so far, or None when none had the metric."""
        return self._best.latest_step()

    @property
    def best_value(self) -> float | None:
        """The best checkpoint's `best_metric` value (None if none, or if forced without one)."""
        return self._best_value

    def metrics(self, step: int | None = None) -> dict[str, Any]:
        """The metrics saved with `step` (default: latest); {} when none were given."""
        manager, step = self._locate(step)
        custom = manager.metadata(step).custom_metadata or {}
        return dict(custom.get("metrics") or {})

    def save(
        self,
        step: int,
        state: Any,
        config: Mapping[str, Any],
        metrics: Mapping[str, Any] | None = None,
        best: bool | None = None,
    ) -> bool:
        """Writes `state` (a pytree, host or device arrays) and `config` (JSON) as `step`.

        Returns once the checkpoint is complete on disk. `best=None` makes this the best
        checkpoint if `metrics[best_metric]` beats the previous best; True forces it, False
        never. Returns whether it became the best. `step` must exceed the latest saved step.
        """
        if self.read_only:
            raise CheckpointError(f"cannot save step {step}: {self.directory} is open read-only")
        step = int(step)
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise CheckpointError(
                f"cannot save step {step}: {self.directory} already holds step {latest}; "
                "save increasing steps, or use a fresh run directory"
            )
        metrics = _json_metrics(metrics)
        args = _save_args(state, config)
        self._latest.save(step, args=args, custom_metadata={"metrics": metrics}, force=True)
        value = metrics.get(self.best_metric)
        if best is None:
            best = self._beats_best(value)
        if best:
            self._best.save(step, args=args, custom_metadata={"metrics": metrics}, force=True)
            self._best_value = value if _finite_number(value) else None
        return bool(best)

    def save_best(
        self,
        step: int,
        state: Any,
        config: Mapping[str, Any],
        metrics: Mapping[str, Any],
    ) -> None:
        """Writes `step` as the new best checkpoint only (an eval between periodic checkpoints
        that beat the best): the last-K steps are untouched. `step` must exceed the best
        step so far."""
        if self.read_only:
            raise CheckpointError(f"cannot save step {step}: {self.directory} is open read-only")
        metrics = _json_metrics(metrics)
        self._best.save(int(step), args=_save_args(state, config),
                        custom_metadata={"metrics": metrics}, force=True)
        value = metrics.get(self.best_metric)
        self._best_value = value if _finite_number(value) else None

    def _beats_best(self, value: Any) -> bool:
        if not _finite_number(value):
            return False
        return self._best_value is None or value > self._best_value

    def restore(self, step: int | None, target: Any) -> tuple[Any, dict[str, Any]]:
        """Returns `(state, config)` of `step` (None: the latest; the best step also works).

        `target` is a pytree of the saved structure whose leaves have `.shape` and `.dtype`
        (numpy/jax arrays or `jax.ShapeDtypeStruct`); the state comes back as host numpy arrays
        in `target`'s pytree classes. A structure, shape or dtype mismatch raises.
        """
        manager, step = self._locate(step)
        saved = manager.item_metadata(step)["state"]
        problems = _target_problems(saved.tree if saved is not None else None, target)
        if problems:
            more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
            shown = "; ".join(problems[:3]) + more
            raise CheckpointError(
                f"checkpoint step {step} in {manager.directory} does not fit the target "
                f"({shown}); build the target from the checkpoint's config (restore_config) "
                "or start from a fresh run directory"
            )
        # ShapeDtypeStructs without sharding make orbax restore host numpy arrays.
        abstract = jax.tree.map(_spec, target)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), config=ocp.args.JsonRestore()
        )
        try:
            restored = manager.restore(step, args=args)
        except (ValueError, FileNotFoundError) as error:
            first_line = str(error).strip().splitlines()[0]
            raise CheckpointError(
                f"cannot restore step {step} from {manager.directory}: {first_line}"
            ) from error
        return restored["state"], dict(restored["config"])

    def restore_config(self, step: int | None = None) -> dict[str, Any]:
        """Only the config dict of `step` (None: the latest), without touching the state."""
        manager, step = self._locate(step)
        args = ocp.args.Composite(config=ocp.args.JsonRestore())
        return dict(manager.restore(step, args=args)["config"])

    def _locate(self, step: int | None) -> tuple[ocp.CheckpointManager, int]:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(
                    f"no checkpoint in {self.directory}; pass the checkpoints/ directory of a "
                    "run that saved one, or train without resuming"
                )
        if step in self._latest.all_steps():
            return self._latest, step
        if step == self.best_step():
            return self._best, step
        raise CheckpointError(
            f"no checkpoint for step {step} in {self.directory}; retained steps "
            f"{self.all_steps()}, best step {self.best_step()}"
        )

    def close(self) -> None:
        """Waits for pending work and releases orbax's resources."""
        self._latest.close()
        self._best.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def checkpoint_state_path(checkpoints: Path, which: str,
                          flag: str = "the checkpoint") -> tuple[Path, int]:
    """(the `state` directory, its update) of checkpoint `which` under a run's `checkpoints/`:
    "latest", "best" or an update number (retained, or the best). Raises `CheckpointError`
    (one line; `flag` names the option that chose `which`) when there is no such checkpoint."""
    try:
        store = CheckpointStore(checkpoints, read_only=True)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        raise CheckpointError(f"cannot open {checkpoints}: {error}") from None
    root = store.directory  # absolute, as orbax requires
    with store:
        if which == "latest":
            step, where = store.latest_step(), root
        elif which == "best":
            step, where = store.best_step(), root / BEST_SUBDIR
        elif which.isdigit():
            step = int(which)
            where = root if step in store.all_steps() else root / BEST_SUBDIR
            if step not in store.all_steps() and step != store.best_step():
                raise CheckpointError(f"no checkpoint {step} in {checkpoints}; retained "
                                      f"{store.all_steps()}, best {store.best_step()}")
        else:
            raise CheckpointError(f"{flag} must be latest, best or an update number, "
                                  f"got {which!r}")
    if step is None:
        raise CheckpointError(f"{checkpoints} holds no {which} checkpoint; train longer "
                              "or pick another run")
    return where / str(step) / "state", step
