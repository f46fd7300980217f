"""`terra_rl.nets.dense_dot`: the Dense matmul whose kernel gradient XLA:CPU computes in the fast
operand order. Its outputs and input gradients must be autodiff's to the bit, its kernel
gradient the same sums of the same products, and the fast order must survive XLA's
simplifier."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terra_rl.nets.dense_dot import cpu_dense_dot_general, dense_dot, dense_dot_general_for_backend


def _loss(dot):
    def loss(inputs, kernel):
        out = dot(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))
        return jnp.sum(jnp.tanh(out.astype(jnp.float32)) * jnp.arange(out.shape[-1]))
    return loss


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("batch", [(96,), (6, 16)])
def test_outputs_and_gradients_equal_autodiffs(dtype, batch):
    """The value and the inputs' gradient to the bit. The kernel's gradient sums the same
    products: to the bit on an AVX-512 host, where XLA:CPU sums both operand orders alike;
    on an AVX2 one the orders differ, and 308 of the 9,600 float32 entries moved by at most
    1.2e-4, one float32 step of the largest (811; 2026-12-01). A wrong product or a
    transposed result would move them by far more than 4 such steps."""
    inputs = jax.random.normal(jax.random.PRNGKey(0), (*batch, 200)).astype(dtype)
    kernel = (0.1 * jax.random.normal(jax.random.PRNGKey(1), (200, 48))).astype(dtype)
    ours = jax.jit(jax.value_and_grad(_loss(cpu_dense_dot_general), argnums=(0, 1)))
    plain = jax.jit(jax.value_and_grad(_loss(jax.lax.dot_general), argnums=(0, 1)))
    (value, (d_inputs, d_kernel)), (ref_value, (ref_inputs, ref_kernel)) = (
        ours(inputs, kernel), plain(inputs, kernel))
    assert d_inputs.shape == inputs.shape and d_kernel.shape == kernel.shape
    assert d_inputs.dtype == dtype and d_kernel.dtype == dtype
    assert bool(jnp.all(jnp.isfinite(d_kernel.astype(jnp.float32))))
    assert float(jnp.max(jnp.abs(d_kernel.astype(jnp.float32)))) > 0
    np.testing.assert_array_equal(np.asarray(value), np.asarray(ref_value))
    np.testing.assert_array_equal(np.asarray(d_inputs, np.float32),
                                  np.asarray(ref_inputs, np.float32))
    ref_kernel = np.asarray(ref_kernel, np.float32)
    steps = 4 * np.finfo(np.float32).eps * np.abs(ref_kernel).max()
    np.testing.assert_allclose(np.asarray(d_kernel, np.float32), ref_kernel, rtol=0, atol=steps)


def test_the_kernel_gradient_keeps_the_fast_operand_order():
    """Autodiff's kernel gradient is an [I, O] dot contracting both operands' batch axis;
    ours is the [O, I] dot, which XLA would fold back into the [I, O] one without the
    barrier."""
    inputs = jnp.ones((64, 40))
    kernel = jnp.ones((40, 24))

    def dots(dot):
        grad = jax.jit(jax.grad(lambda k: jnp.sum(dot(inputs, k, (((1,), (0,)), ((), ()))))))
        text = grad.lower(kernel).compile().as_text()
        return re.findall(r"= f32\[(\d+),(\d+)\]\{[^}]*\} dot\(", text)

    assert ("40", "24") in dots(jax.lax.dot_general)  # what autodiff emits: [I, O]
    ours = dots(cpu_dense_dot_general)
    assert ("24", "40") in ours and ("40", "24") not in ours


def test_other_contractions_fall_back_to_lax_dot_general():
    lhs = jax.random.normal(jax.random.PRNGKey(2), (5, 7))
    rhs = jax.random.normal(jax.random.PRNGKey(3), (9, 7))
    dims = (((1,), (1,)), ((), ()))
    np.testing.assert_array_equal(cpu_dense_dot_general(lhs, rhs, dims),
                                  jax.lax.dot_general(lhs, rhs, dims))
    np.testing.assert_array_equal(dense_dot(lhs, rhs.T), lhs @ rhs.T)


def test_dense_layers_use_it_on_cpu_only():
    assert jax.default_backend() == "cpu"
    assert dense_dot_general_for_backend() is cpu_dense_dot_general
    dense = nn.Dense(3, dot_general=dense_dot_general_for_backend())
    x = jnp.ones((2, 4))
    params = dense.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(dense.apply(params, x), nn.Dense(3).apply(params, x))
