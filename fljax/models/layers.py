"""Layers whose implementation vectorises well over clients.

:class:`Conv` has exactly the parameters of ``flax.linen.Conv`` (``kernel`` in HWIO layout, optional ``bias``), so
parameters are interchangeable between its two implementations:

* ``impl="native"``: ``lax.conv_general_dilated``. Under ``vmap`` over per-client weights this becomes a grouped
  convolution, which XLA:CPU runs very slowly and GPUs run slowly in the backward pass.
* ``impl="patches"``: extract k_h×k_w patches with ``lax.conv_general_dilated_patches`` (features ordered
  channel-major: (C_in, k_h, k_w)), then one matmul with the kernel reshaped to (C_in·k_h·k_w, C_out). Under
  ``vmap`` this is a batched matmul, which vectorises well everywhere; the patch extraction is itself a
  convolution, but with a fixed kernel shared by every client (no per-client weights), and it materialises
  k_h·k_w copies of the input.
* ``impl="shifts"``: the convolution as a sum of k_h·k_w products, one per kernel offset (i, j): the input shifted by
  (i, j) (a strided slice of the padded input) times ``kernel[i, j]`` (C_in × C_out),

      y[n, p, q] = Σ_{i,j} x_pad[n, s·p + i, s·q + j] · W[i, j].

  Under ``vmap`` over clients' weights each term is a batched matmul; there is no convolution and no patch buffer
  (its backward pass is matmuls and pads).

The convolutions of every form compute the same function; which runs fastest depends on the backend, the model and
how many clients run side by side (``benchmarks/conv_forms.py``; ``auto``'s choice: :mod:`fljax.models.conv_table`).
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["Conv", "max_pool_2x2", "CONV_FORMS"]

CONV_FORMS = ("native", "patches", "shifts")


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
        elif self.impl == "shifts":
            y = shifted_matmuls(x, kernel, tuple(self.strides), self.padding)
        else:
            raise ValueError(f"unknown conv impl {self.impl!r}; choose one of {list(CONV_FORMS)}.")
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y


def shifted_matmuls(x, kernel, strides, padding):
    """``conv_general_dilated(x, kernel, strides, padding)`` (NHWC, HWIO) as Σ_{i,j} shift_{i,j}(x) · kernel[i, j]
    (module docstring)."""
    kh, kw = kernel.shape[:2]
    (sh, sw), (_, h, w, _) = strides, x.shape
    pads = jax.lax.padtype_to_pads((h, w), (kh, kw), strides, padding) if isinstance(padding, str) else padding
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    oh = (x.shape[1] - kh) // sh + 1
    ow = (x.shape[2] - kw) // sw + 1
    y = None
    for i in range(kh):
        for j in range(kw):
            part = x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :] @ kernel[i, j]
            y = part if y is None else y + part
    return y


def max_pool_2x2(x):
    """2×2 max pooling with stride 2 and VALID padding (odd trailing rows/columns dropped), written as a reshape
    and a max. Same values as ``flax.linen.max_pool(x, (2, 2), (2, 2))``; its gradient is an elementwise select
    instead of XLA's select-and-scatter, which XLA:CPU runs slowly (benchmarks/throughput.py)."""
    b, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
