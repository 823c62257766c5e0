"""Layers whose implementation vectorises well over clients.

:class:`Conv` has exactly the parameters of ``flax.linen.Conv`` (``kernel`` in HWIO layout, optional ``bias``), so
parameters are interchangeable between its two implementations:

* ``impl="native"``: ``lax.conv_general_dilated``. Under ``vmap`` over per-client weights this becomes a grouped
  convolution, which XLA:CPU runs very slowly and GPUs run slowly in the backward pass.
* ``impl="patches"``: extract k_h×k_w patches with ``lax.conv_general_dilated_patches`` (features ordered
  channel-major: (C_in, k_h, k_w)), then one matmul with the kernel reshaped to (C_in·k_h·k_w, C_out). Under
  ``vmap`` this is a batched matmul, which vectorises well everywhere.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["Conv", "max_pool_2x2"]


class Conv(nn.Module):
    features: int
    kernel_size: Sequence[int]
    strides: Sequence[int] = (1, 1)
    padding: str = "SAME"
    use_bias: bool = True
    impl: str = "native"
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        kh, kw = self.kernel_size
        cin = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (kh, kw, cin, self.features))
        if self.impl == "native":
            y = jax.lax.conv_general_dilated(x, kernel, tuple(self.strides), self.padding,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
        elif self.impl == "patches":
            patches = jax.lax.conv_general_dilated_patches(x, (kh, kw), tuple(self.strides), self.padding,
                                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
            w = jnp.transpose(kernel, (2, 0, 1, 3)).reshape(cin * kh * kw, self.features)
            y = patches @ w
        else:
            raise ValueError(f"unknown conv impl {self.impl!r}; choose 'native' or 'patches'.")
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y


def max_pool_2x2(x):
    """2×2 max pooling with stride 2 and VALID padding (odd trailing rows/columns dropped), written as a reshape
    and a max. Same values as ``flax.linen.max_pool(x, (2, 2), (2, 2))``; its gradient is an elementwise select
    instead of XLA's select-and-scatter, which XLA:CPU runs slowly (benchmarks/throughput.py)."""
    b, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
