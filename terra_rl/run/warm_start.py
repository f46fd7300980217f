"""Warm starts: a new run whose policy starts from the parameters of another run's checkpoint
(`--init_params RUN_DIR`, `--init_params_checkpoint latest|best|N`).

Only the policy's parameters carry over. The optimizer state, the counters, the envs and the
keys start fresh, and the new run counts its updates from 0 under its own config. The network
must match in every parameter's shape: a policy trained on 16x16 maps goes on to 32x32 maps
with `--map_pool 2`, whose pooled map has the 16x16 map's shape (docs/RESULTS.md, "What
mattered").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from terra_rl.run.checkpointing import CheckpointError, checkpoint_state_path
from terra_rl.run.run_dir import CHECKPOINTS_DIR


class WarmStartError(ValueError):
    """The parameters to start from cannot be loaded or do not fit; the message says why."""


def load_init_params(run_dir: str | Path, which: str, like: Any) -> tuple[Any, int]:
    """(parameters as host numpy in the dtypes of `like`, the checkpoint's update).

    `like`: the new network's parameters, or their `jax.ShapeDtypeStruct`s, without a device
    axis. `which`: "latest", "best" or an update number. Raises `WarmStartError` (one line)
    when the run or checkpoint is missing or a parameter's name or shape differs.
    """
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINTS_DIR).is_dir():
        raise WarmStartError(f"--init_params: {run_dir} holds no {CHECKPOINTS_DIR}/ directory; "
                             "pass the directory of a run that saved a checkpoint "
                             "(runs/<run_name>)")
    try:
        state_path, step = checkpoint_state_path(run_dir / CHECKPOINTS_DIR, which,
                                                 "--init_params_checkpoint")
    except CheckpointError as error:
        raise WarmStartError(f"--init_params: {error}") from None
    import orbax.checkpoint as ocp

    raw = ocp.StandardCheckpointer().restore(state_path)
    # Every device of the run holds the same parameters: take device 0's.
    loaded = jax.tree.map(lambda leaf: np.asarray(leaf)[0], raw["policy"]["params"])
    _check_fits(loaded, like, f"{run_dir} (update {step})")
    params = jax.tree.map(lambda leaf, want: leaf.astype(want.dtype), loaded, like)
    return params, step


def _check_fits(loaded: Any, like: Any, source: str) -> None:
    got = dict(_shapes(loaded))
    want = dict(_shapes(like))
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        names = ", ".join(missing[:3] or extra[:3])
        which = "lacks" if missing else "has parameters this network lacks:"
        raise WarmStartError(f"--init_params: {source} {which} {names}; start from a run of "
                             "the same network (map encoder, inputs, hidden sizes)")
    for name, shape in want.items():
        if got[name] != shape:
            raise WarmStartError(
                f"--init_params: {name} is {got[name]} in {source} but {shape} here; the "
                "network must match (on larger maps, --map_pool keeps the flat encoder's input)"
            )


def _shapes(tree: Any) -> list[tuple[str, tuple[int, ...]]]:
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return [("/".join(_key_name(k) for k in path), tuple(leaf.shape)) for path, leaf in leaves]


def _key_name(key: Any) -> str:
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
