"""`PatchConv`: `nn.Conv` (SAME padding, square kernel) as image patches times the kernel
matrix, for XLA:CPU, where a `lax.conv` gradient inside the PPO loops is slow
(docs/MODEL.md, "Convolutions on CPU")."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

CONV_KERNEL_INIT = nn.initializers.orthogonal(np.sqrt(2))
"""Kernel init of every convolution of the policies, `nn.Conv` and `PatchConv` alike."""


class PatchConv(nn.Module):
    """`nn.Conv` (SAME padding, square kernel) computed as image patches times the kernel
    matrix: [..., H, W, C] -> [..., ceil(H / stride), ceil(W / stride), features].

    The parameters are `nn.Conv`'s (`kernel` [k, k, C, features], `bias` [features]), so a
    checkpoint fits either. Why: on XLA:CPU a convolution's gradient inside a `lax.scan` or
    `fori_loop` runs about 15x slower than at top level (jax-ml/jax#12868), which forced the
    PPO loops to be unrolled; the patches' gradient is pads and adds and the product's a
    matmul, all as fast inside a loop as outside, so the loops can stay rolled and the
    compile no longer grows with epochs x minibatches.
    """

    features: int
    kernel: int
    stride: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        channels = x.shape[-1]
        kernel = self.param("kernel", CONV_KERNEL_INIT,
                            (self.kernel, self.kernel, channels, self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        batch_shape = x.shape[:-3]
        images = x.reshape((-1,) + x.shape[-3:]).astype(self.dtype)
        patches = image_patches(images, self.kernel, self.stride)  # [B, H', W', k * k * C]
        matrix = kernel.reshape(-1, self.features).astype(self.dtype)
        out = patches @ matrix + bias.astype(self.dtype)
        return out.reshape(batch_shape + out.shape[1:])


def image_patches(images: jax.Array, kernel: int, stride: int) -> jax.Array:
    """[B, H, W, C] -> [B, ceil(H / stride), ceil(W / stride), kernel * kernel * C]: the
    SAME-padded k x k patch at each output position, (row, col, channel)-major, built from
    k * k strided slices. Its gradient is pads and adds, so it stays fast inside XLA:CPU
    loops (`lax.conv_general_dilated_patches` is a convolution, and its gradient is not)."""
    _, height, width, _ = images.shape
    out_h, out_w = -(-height // stride), -(-width // stride)
    pad_h = max((out_h - 1) * stride + kernel - height, 0)
    pad_w = max((out_w - 1) * stride + kernel - width, 0)
    padded = jnp.pad(images, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                              (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    slices = [
        jax.lax.slice(padded, (0, row, col, 0),
                      (padded.shape[0], row + (out_h - 1) * stride + 1,
                       col + (out_w - 1) * stride + 1, padded.shape[3]),
                      (1, stride, stride, 1))
        for row in range(kernel) for col in range(kernel)
    ]
    return jnp.concatenate(slices, axis=-1)
