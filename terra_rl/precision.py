"""The precision policy in one place: compute dtypes, float32 casts and action masking.

Parameters and optimizer state are always float32; the model computes in the chosen
dtype. Logits and values are cast to float32 before any log-softmax, distribution, mask,
ratio, entropy or loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRECISIONS = ("float32", "bfloat16", "float16")

# Finite and far below any real logit, yet its magnitude stays far from float32 overflow
# when differences of two masked logits are formed inside log-softmax.
MASKED_LOGIT = float(jnp.finfo(jnp.float32).min) / 4


def compute_dtype(precision: str) -> jnp.dtype:
    """The model compute dtype for a `--precision` value."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return jnp.dtype(precision)


def to_float32(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def apply_action_mask(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """float32 logits [..., A] with invalid actions set to `MASKED_LOGIT`.

    mask bool [..., A] (True = allowed) or None (logits returned in float32, untouched).
    """
    logits = to_float32(logits)
    if mask is None:
        return logits
    return jnp.where(mask, logits, MASKED_LOGIT)
