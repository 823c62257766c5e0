"""Quantizers, the quantization penalty and its proximal maps (QuPeD §2, §3, §7; App. A.4, D.1).

One sorted center vector c ∈ ℝ^m (m = 2^b) per quantized leaf. ``x`` is any array, ``centers`` a 1-D sorted array;
all functions are elementwise in x, so they vectorise over clients with ``vmap`` (centers [C, m], x [C, ...]).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = [
    "ASSIGN_RULES", "assign", "hard_quantize", "soft_quantize", "R", "prox_x", "center_update", "init_centers",
    "bits_accounting",
]

ASSIGN_RULES = ("nearest", "sign")
SEARCHSORTED_ABOVE = 4  # m > 4 centers: assign by searchsorted on the midpoints (O(log m) memory per entry)


def assign(x, centers, rule: str = "nearest"):
    """a_k = argmin_j |x_k − c_j| for sorted centers, int32, no gradient (QuPeD §2, D7).

    ``"nearest"`` (default): ties go to the lowest index; for m ≤ 4 an argmin over |x − c|, for m > 4
    ``searchsorted`` on the midpoints (c_j + c_{j+1})/2 (a point exactly on a midpoint goes to the lower center; with
    two *equal* centers the higher of them may be chosen, which leaves Q_c(x) unchanged). ``"sign"`` (m = 2 only,
    the authors' code): a_k = 1 if x_k ≥ 0 else 0."""
    if rule == "sign":
        if centers.shape[-1] != 2:
            raise ValueError(f"assign rule 'sign' needs m = 2 centers, got {centers.shape[-1]}.")
        a = (x >= 0).astype(jnp.int32)
    elif rule == "nearest":
        if centers.shape[-1] > SEARCHSORTED_ABOVE:
            a = jnp.searchsorted((centers[1:] + centers[:-1]) / 2, x, side="left").astype(jnp.int32)
        else:
            a = jnp.argmin(jnp.abs(x[..., None] - centers), axis=-1).astype(jnp.int32)
    else:
        raise ValueError(f"unknown assign rule {rule!r}; valid: {ASSIGN_RULES}")
    return jax.lax.stop_gradient(a)


def hard_quantize(x, centers, rule: str = "nearest"):
    """Q_c(x)_k = c_{a_k} = centers[sg(a)]. Its x-gradient is exactly 0 and its center gradient is the segment-sum
    ∂f/∂c_j = Σ_{k: a_k = j} ∂f/∂q_k (QuPeD App. D.1, P → ∞): reverse-mode of a gather, no custom VJP needed."""
    return centers[assign(x, centers, rule)]


def soft_quantize(x, centers, P):
    """Qs_c(x) = c_1 + Σ_{j=2..m} (c_j − c_{j−1})·σ(P(x − (c_j + c_{j−1})/2)), sorted c, sharpness P > 0
    (QuPeD App. A.4). Qs → Q_c as P → ∞ away from the midpoints."""
    gaps = centers[1:] - centers[:-1]
    mids = (centers[1:] + centers[:-1]) / 2
    return centers[0] + jnp.sum(gaps * jax.nn.sigmoid(P * (x[..., None] - mids)), axis=-1)


def R(x, centers):
    """R(x, c) = ½ Σ_k min_j |x_k − c_j| = ½‖Q_c(x) − x‖₁ (QuPeD App. D.1, the l1 penalty of eq. (6))."""
    return 0.5 * jnp.sum(jnp.min(jnp.abs(x[..., None] - centers), axis=-1))


def prox_x(y, centers, th, rule: str = "nearest"):
    """prox_{η₁λR(·,c)}(y) with th = λη₁/2 (QuPeD App. D.1 eqs. (8)–(11)): with q = Q_c(y) the nearest center to y,
    y − th if y ≥ q + th, y + th if y ≤ q − th, q otherwise; i.e. q + sign(y − q)·max(|y − q| − th, 0), a soft
    threshold toward the nearest center (the piecewise form is exact at th = 0 and for large th). ``rule``: the
    assignment of :func:`assign` (D7)."""
    q = hard_quantize(y, centers, rule)
    d = y - q
    return jnp.where(jnp.abs(d) > th, y - th * jnp.sign(d), q).astype(y.dtype)


def center_update(centers, grad, x, eta2, lam, sign: str = "median", prox: bool = True, rule: str = "nearest",
                  grad_clip: float | None = None):
    """QuPeD Alg. 1 line 5 / Alg. 2 line 13: μ = c − η₂h, then the linearised c-prox with assignments of the new x
    under the old c, then sort (D18).

    With n_j^> = #{k: a_k = j, x_k > c_j}, n_j^< = #{k: a_k = j, x_k < c_j}:
    ``sign="median"`` (derivation, default D1) c_j = μ_j + (λη₂/2)(n_j^> − n_j^<), pulling c_j toward its members'
    median; ``sign="printed"`` (paper's formula, authors' code) uses the opposite sign; ``prox=False`` keeps only
    the gradient step μ. ``x`` may hold the members of several leaves (one center vector per client, D6: pass them
    concatenated). ``rule``: the assignment (D7). ``grad_clip``: clip h to [−clip, clip] first (D17 option, the
    authors' code uses 10; None: no clipping)."""
    if grad_clip is not None:
        grad = jnp.clip(grad, -grad_clip, grad_clip)
    mu = centers - eta2 * grad
    if prox:
        if sign not in ("median", "printed"):
            raise ValueError(f"unknown sign {sign!r}; valid: 'median', 'printed'")
        a = assign(x, centers, rule).ravel()
        xf = x.ravel()
        m = centers.shape[0]
        above = jax.ops.segment_sum((xf > centers[a]).astype(centers.dtype), a, num_segments=m)
        below = jax.ops.segment_sum((xf < centers[a]).astype(centers.dtype), a, num_segments=m)
        s = 1.0 if sign == "median" else -1.0
        mu = mu + s * (lam * eta2 / 2) * (above - below)
    return jnp.sort(mu)


def init_centers(x, bits: int, method: str = "quantile"):
    """Initial sorted centers of one leaf, m = 2^bits (QuPeD §7, D8).

    ``"quantile"``: m = 2 → [mean(x[x < 0]), mean(x[x ≥ 0])]; m > 2 → c_j = quantile(x, (j − ½)/m).
    ``"linspace"``: linspace(min x, max x, m) (authors' code)."""
    m = 2 ** bits
    x = x.ravel()
    if method == "linspace":
        return jnp.linspace(jnp.min(x), jnp.max(x), m).astype(x.dtype)
    if method != "quantile":
        raise ValueError(f"unknown method {method!r}; valid: 'quantile', 'linspace'")
    if m == 2:
        neg = x < 0
        lo = jnp.sum(jnp.where(neg, x, 0)) / jnp.maximum(jnp.sum(neg), 1)
        hi = jnp.sum(jnp.where(neg, 0, x)) / jnp.maximum(jnp.sum(~neg), 1)
        return jnp.stack([lo, hi]).astype(x.dtype)
    return jnp.quantile(x, (jnp.arange(m) + 0.5) / m).astype(x.dtype)


def bits_accounting(tree: PyTree, qmask: PyTree, bits: int) -> tuple[int, float, float]:
    """Model size of a quantized personal model (QuPeD §7): a quantized leaf of d_l entries costs b·d_l + 32·2^b bits
    (packed indices + an FP32 codebook per leaf), other entries 32 bits. Returns (total bits B, bits per parameter
    B/d, compression ratio 32d/B). Leaves are arrays (or anything with ``.shape``) or sizes (ints); ``qmask``
    holds a bool per leaf.
    """
    sizes = [int(np.prod(x.shape)) if hasattr(x, "shape") else int(x) for x in jax.tree.leaves(tree)]
    flags = jax.tree.leaves(qmask)
    if len(flags) != len(sizes):
        raise ValueError(f"qmask has {len(flags)} leaves, tree has {len(sizes)}")
    total = sum(bits * d + 32 * 2 ** bits if q else 32 * d for d, q in zip(sizes, flags))
    d = sum(sizes)
    return total, total / d, 32 * d / total
