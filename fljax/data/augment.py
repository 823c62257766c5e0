"""Image augmentation for server-side training batches (AugFL spec D18: the authors' code crops and flips the server's
images; the fljax default is none).

``crop_flip(x, dy, dx, flip, pad)``: every image of ``x [B, H, W, C]`` is zero-padded by ``pad`` pixels on each side
of H and W, the H×W window with top-left corner (dy_b, dx_b) is cut out, and it is mirrored left–right where
``flip_b``:

    out_b[h, w] = P_b[dy_b + h, dx_b + w']  with  w' = W − 1 − w if flip_b else w,   P_b = pad(x_b, pad).

``random_crop_flip(key, x, pad)`` draws dy_b, dx_b ~ U{0, …, 2·pad} and flip_b ~ Bernoulli(1/2) independently per
image (torchvision's ``RandomCrop(H, padding=pad)`` followed by ``RandomHorizontalFlip()``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["crop_flip", "random_crop_flip"]


def crop_flip(x, dy, dx, flip, pad: int):
    """The crops at offsets ``dy, dx [B]`` of the ``pad``-padded images ``x [B, H, W, C]``, mirrored where
    ``flip [B]`` (see the module docstring)."""
    h, w = x.shape[1], x.shape[2]
    padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))

    def one(img, oy, ox, f):
        crop = jax.lax.dynamic_slice(img, (oy, ox, 0), (h, w, img.shape[-1]))
        return jnp.where(f, crop[:, ::-1], crop)

    return jax.vmap(one)(padded, dy, dx, flip)


def random_crop_flip(key, x, pad: int):
    """``crop_flip`` with offsets uniform on {0, …, 2·pad} and a fair coin for the flip, per image."""
    k_y, k_x, k_f = jax.random.split(key, 3)
    b = x.shape[0]
    dy = jax.random.randint(k_y, (b,), 0, 2 * pad + 1)
    dx = jax.random.randint(k_x, (b,), 0, 2 * pad + 1)
    return crop_flip(x, dy, dx, jax.random.bernoulli(k_f, 0.5, (b,)), pad)
