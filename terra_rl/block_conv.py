"""`BlockConv`: a strided `nn.Conv` (SAME padding, square kernel, the stride dividing the
kernel) computed as a stride-1 convolution over stride x stride blocks of the image.

Why: the Nature-DQN encoder's first convolution (8x8, stride 4) sees 8 input channels. GPU
tensor-core convolutions want many channels; with 8 they ran at about 50 TFLOP/s on an H200
and took a third of `solo_excavator`'s update (docs/PERFORMANCE.md, GPU figures). Folding
each 4x4 block of the image into the channels gives the same product as a 2x2 convolution over
128 channels.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from terra_rl.patch_conv import CONV_KERNEL_INIT


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) zero padding of `nn.Conv`'s SAME for one spatial axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def space_to_depth(images: jax.Array, block: int) -> jax.Array:
    """[B, H, W, C] -> [B, H / block, W / block, block * block * C], channels ordered
    (row in block, column in block, channel). H and W must be multiples of `block`."""
    batch, height, width, channels = images.shape
    blocks = images.reshape(batch, height // block, block, width // block, block, channels)
    return blocks.transpose(0, 1, 3, 2, 4, 5).reshape(
        batch, height // block, width // block, block * block * channels)


def kernel_to_blocks(kernel: jax.Array, block: int) -> jax.Array:
    """[k, k, C, F] -> [k / block, k / block, block * block * C, F], matching
    `space_to_depth`'s channel order."""
    size, _, channels, features = kernel.shape
    blocks = kernel.reshape(size // block, block, size // block, block, channels, features)
    return blocks.transpose(0, 2, 1, 3, 4, 5).reshape(
        size // block, size // block, block * block * channels, features)


class BlockConv(nn.Module):
    """`nn.Conv(features, (kernel, kernel), strides=stride, padding="SAME")` with
    `kernel % stride == 0`: [..., H, W, C] -> [..., ceil(H / stride), ceil(W / stride),
    features]. The parameters are `nn.Conv`'s (`kernel` [k, k, C, features], `bias`
    [features]), so a checkpoint fits either; the result is the same to float rounding."""

    features: int
    kernel: int
    stride: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.kernel % self.stride:
            raise ValueError(f"BlockConv needs the stride to divide the kernel, got kernel "
                             f"{self.kernel} and stride {self.stride}")
        channels = x.shape[-1]
        kernel = self.param("kernel", CONV_KERNEL_INIT,
                            (self.kernel, self.kernel, channels, self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        batch_shape = x.shape[:-3]
        images = x.reshape((-1,) + x.shape[-3:]).astype(self.dtype)
        padding = [(0, 0), same_padding(images.shape[1], self.kernel, self.stride),
                   same_padding(images.shape[2], self.kernel, self.stride), (0, 0)]
        # SAME pads each axis to (out - 1) * stride + kernel, a multiple of the stride.
        blocks = space_to_depth(jnp.pad(images, padding), self.stride)
        out = jax.lax.conv_general_dilated(
            blocks, kernel_to_blocks(kernel, self.stride).astype(self.dtype), (1, 1), "VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        out = out + bias.astype(self.dtype)
        return out.reshape(batch_shape + out.shape[1:])
