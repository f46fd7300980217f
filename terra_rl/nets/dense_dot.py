"""A Dense layer's matmul whose kernel gradient runs at full speed on XLA:CPU.

Autodiff of `inputs [B, I] @ kernel [I, O]` computes the kernel's gradient as one dot that
contracts the batch dimension of both operands into an [I, O] result. XLA:CPU runs that
form about 1.7x slower than the same products summed into an [O, I] result: 3.0 against
1.8 ms for the flat map encoder's 512 x 2048 x 128 on the 2-core CPU. Its simplifier also
folds a plain transpose of the fast form back into the slow one. `cpu_dense_dot_general`
computes the fast form behind an optimization barrier and transposes it. The products are
the same. On an AVX-512 host XLA:CPU sums them in the same order in both forms, so the bits
are the same; on an AVX2 host the orders differ, and a few entries move by about one float32
step of the largest (`tests/test_dense_dot.py`). Runs on one host repeat either way.

Only the flat map encoder's layer (2,048 inputs) uses it. On the policies' smaller layers
(4 to 528 inputs) the autodiff form was as fast or faster: 0.52 against 0.61 ms at 528 x 128.
docs/PERFORMANCE.md has the figures.
"""

from __future__ import annotations

import functools

import jax

# nn.Dense's contraction: the inputs' last axis with the kernel's first.
_DENSE = lambda ndim: (((ndim - 1,), (0,)), ((), ()))  # noqa: E731


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense_dot(inputs: jax.Array, kernel: jax.Array, precision=None) -> jax.Array:
    """inputs [..., I] @ kernel [I, O] -> [..., O], as `lax.dot_general`; only the backward
    pass differs (see the module docstring)."""
    return jax.lax.dot_general(inputs, kernel, _DENSE(inputs.ndim), precision=precision)


def _dense_dot_fwd(inputs, kernel, precision):
    return dense_dot(inputs, kernel, precision), (inputs, kernel)


def _dense_dot_bwd(precision, residuals, cotangent):
    inputs, kernel = residuals
    d_inputs = jax.lax.dot_general(cotangent, kernel, (((cotangent.ndim - 1,), (1,)), ((), ())),
                                   precision=precision)
    flat_inputs = inputs.reshape(-1, inputs.shape[-1])
    flat_cotangent = cotangent.reshape(-1, cotangent.shape[-1])
    # [O, I]; without the barrier XLA rewrites transpose(dot) into the slow [I, O] dot.
    d_kernel_t = jax.lax.optimization_barrier(
        jax.lax.dot_general(flat_cotangent, flat_inputs, (((0,), (0,)), ((), ())),
                            precision=precision)
    )
    return d_inputs.astype(inputs.dtype), d_kernel_t.T.astype(kernel.dtype)


dense_dot.defvjp(_dense_dot_fwd, _dense_dot_bwd)


def cpu_dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                          preferred_element_type=None):
    """`nn.Dense(dot_general=...)`: `dense_dot` for nn.Dense's own contraction, and
    `lax.dot_general` for anything else."""
    if dimension_numbers == _DENSE(lhs.ndim) and rhs.ndim == 2 and preferred_element_type is None:
        return dense_dot(lhs, rhs, precision)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)


def dense_dot_general_for_backend():
    """What `nn.Dense` should use as `dot_general` here: `cpu_dense_dot_general` on
    XLA:CPU, None (Flax's default, `lax.dot_general`) elsewhere, where the GPU's matmul
    libraries take either operand order at full speed."""
    return cpu_dense_dot_general if jax.default_backend() == "cpu" else None
