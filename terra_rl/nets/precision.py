"""The precision policy in one place: compute dtypes, float32 casts, action masking and
per-group gradient norms.

Parameters and optimizer state are always float32. The encoders compute in the chosen
dtype; the two heads (one Dense each, a negligible share of the FLOPs) compute in float32
from float32 features, so logits and values never pass through half precision. Every
log-softmax, distribution, mask, ratio, entropy, KL and loss sees float32 only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from envs.actions import DO_NOTHING
from terra_rl.choices import PRECISIONS

HEAD_DTYPE = jnp.float32
HEAD_GROUPS = ("policy_head", "value_head")

_FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)
# Logits are clipped to +-LOGIT_BOUND and masked ones set to MASKED_LOGIT, so inside
# log-softmax the largest difference is 3/8 of float32's max: finite, whatever the
# network emitted (even +-inf from a float16 overflow). exp(MASKED_LOGIT - x) is exactly 0,
# so a masked action has probability 0 and is never sampled.
LOGIT_BOUND = _FLOAT32_MAX / 8
MASKED_LOGIT = -_FLOAT32_MAX / 4


def compute_dtype(precision: str) -> jnp.dtype:
    """The encoders' compute dtype for a `--precision` value."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return jnp.dtype(precision)


def to_float32(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def apply_action_mask(
    logits: jax.Array, mask: jax.Array | None, fallback_action: int = DO_NOTHING
) -> jax.Array:
    """float32 logits [..., A], clipped to +-`LOGIT_BOUND`, invalid actions at `MASKED_LOGIT`.

    mask: bool [..., A] (True = allowed) or None (no masking). A row with no allowed action
    allows `fallback_action` (DO_NOTHING), so its log-probs stay finite and its action is
    defined.
    """
    logits = jnp.clip(to_float32(logits), -LOGIT_BOUND, LOGIT_BOUND)
    if mask is None:
        return logits
    mask = mask.astype(bool)
    nothing_allowed = ~jnp.any(mask, axis=-1, keepdims=True)
    is_fallback = jnp.arange(mask.shape[-1]) == fallback_action
    return jnp.where(mask | (nothing_allowed & is_fallback), logits, MASKED_LOGIT)


def gradient_norms(grads) -> dict[str, jax.Array]:
    """float32 [] global norm per parameter group: `policy_head`, `value_head` and
    `encoder` (every other top-level module: `encoder`, or `actor_encoder` and
    `critic_encoder`). Accepts the gradient of `init`'s variables or of their "params"."""
    if set(grads) == {"params"}:
        grads = grads["params"]
    encoder = {name: tree for name, tree in grads.items() if name not in HEAD_GROUPS}
    norms = {name: optax.tree.norm(grads[name]) for name in HEAD_GROUPS if name in grads}
    norms["encoder"] = optax.tree.norm(encoder)
    return norms
