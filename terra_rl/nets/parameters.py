"""Counting and grouping the parameters of any of `terra_rl.nets.models`' networks (their
top-level names are `policy_head`, `value_head` and the encoders)."""

from __future__ import annotations

import jax
import numpy as np


def _unwrap(params):
    """The `params` collection from either `model.init(...)`'s variables or params."""
    if set(params) == {"params"}:
        return params["params"]
    return params


def count_parameters(params) -> int:
    """Number of scalars in a parameter pytree (arrays or `jax.ShapeDtypeStruct`s)."""
    return int(sum(np.prod(leaf.shape, dtype=np.int64) for leaf in jax.tree.leaves(params)))


def parameter_groups(params) -> dict[str, dict]:
    """{"policy_head", "value_head", "encoder"}: a partition of the top-level parameters.

    "encoder" holds everything else: `encoder`, or `actor_encoder` and `critic_encoder`.
    Accepts the variables from `init` or their "params" collection.
    """
    params = _unwrap(params)
    missing = {"policy_head", "value_head"} - set(params)
    if missing:
        raise ValueError(f"params lack {sorted(missing)}; top-level keys are {sorted(params)}")
    heads = ("policy_head", "value_head")
    encoders = {name: tree for name, tree in params.items() if name not in heads}
    return {
        "policy_head": params["policy_head"],
        "value_head": params["value_head"],
        "encoder": encoders,
    }
