"""Dynamic loss scaling for float16 training, and the non-finite skip guard every
precision keeps.

float16 gradients underflow below about 6e-8 and overflow above 65504. The loss is
multiplied by `scale` before the backward pass and the float32 gradients are divided by
it afterwards; a step whose averaged gradients are not finite is skipped and halves the
scale, and `GROWTH_INTERVAL` finite steps in a row double it. float32 and bfloat16 keep a
constant scale of 1 (bfloat16 has float32's exponent range), multiply and divide by
nothing, but skip non-finite steps the same way. The update tests the gradients through
their global norm, which it computes anyway: a NaN or inf anywhere makes it non-finite, and
so does a norm past float32's range (`terra_rl.algo.update`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 2000
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
MIN_SCALE = 1.0
# Past 2^24 every float16 gradient above 0.004 overflows: growing further only buys
# overflows, and an unbounded scale would reach float32 inf in a long run.
MAX_SCALE = 2.0**24


@struct.dataclass
class LossScale:
    """scale: float32 [] the current loss scale. finite_steps: int32 [] consecutive finite
    steps since the scale last changed. overflow_steps: int32 [] cumulative minibatch
    updates skipped because the device-averaged gradients were not finite."""

    scale: jax.Array
    finite_steps: jax.Array
    overflow_steps: jax.Array


def is_dynamic(precision: str) -> bool:
    """Only float16 needs a dynamic scale; the others keep 1."""
    return precision == "float16"


def initial_loss_scale(precision: str) -> float:
    return INITIAL_SCALE if is_dynamic(precision) else 1.0


def init_loss_scale(precision: str) -> LossScale:
    return LossScale(
        scale=jnp.asarray(initial_loss_scale(precision), jnp.float32),
        finite_steps=jnp.zeros((), jnp.int32),
        overflow_steps=jnp.zeros((), jnp.int32),
    )


def all_finite(tree) -> jax.Array:
    """bool []: every element of every leaf is finite.

    One reduction over all leaves joined: a reduction per leaf gives a chain of scalar
    ANDs that XLA copies into every consumer (each parameter's select), thousands of
    instructions to compile."""
    # float32 keeps every half-precision value, inf and NaN; integers are always finite.
    leaves = [jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.isfinite(jnp.concatenate(leaves)))


def scale_loss(loss: jax.Array, scale: jax.Array, dynamic: bool) -> jax.Array:
    """The loss the backward pass starts from: times `scale` when it is dynamic; a static
    scale is 1, and x * 1 is x."""
    return loss * scale if dynamic else loss


def unscale(grads, scale: jax.Array, dynamic: bool = True):
    """Gradients of the scaled loss -> float32 gradients of the loss (no division by a
    static scale of 1)."""
    if not dynamic:
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    return jax.tree.map(lambda g: g.astype(jnp.float32) / scale, grads)


def next_loss_scale(loss_scale: LossScale, finite: jax.Array, dynamic: bool) -> LossScale:
    """The loss scale after one minibatch step whose averaged gradients were `finite`.

    Dynamic: overflow halves the scale (never below `MIN_SCALE`) and restarts the count;
    `GROWTH_INTERVAL` finite steps in a row double it (never above `MAX_SCALE`). Static:
    the scale never changes. Overflows are counted either way.
    """
    overflow_steps = loss_scale.overflow_steps + (~finite).astype(jnp.int32)
    if not dynamic:
        return loss_scale.replace(overflow_steps=overflow_steps)
    finite_steps = jnp.where(finite, loss_scale.finite_steps + 1, 0)
    grow = finite_steps >= GROWTH_INTERVAL
    scale = jnp.where(
        finite,
        jnp.where(grow, jnp.minimum(loss_scale.scale * GROWTH_FACTOR, MAX_SCALE), loss_scale.scale),
        jnp.maximum(loss_scale.scale * BACKOFF_FACTOR, MIN_SCALE),
    )
    return LossScale(
        scale=scale.astype(jnp.float32),
        finite_steps=jnp.where(grow, 0, finite_steps).astype(jnp.int32),
        overflow_steps=overflow_steps,
    )
