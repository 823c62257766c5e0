"""Compressed uploads: sparsification, stochastic quantisation, scaled sign, error feedback and the bytes sent.

A :class:`Compressor` ``C`` maps one client's update (a pytree) and a PRNG key to the *decoded* update the server
reconstructs, leaf by leaf: every leaf (a layer's kernel or bias) is compressed on its own, so a leaf is QSGD's
bucket and the scaled sign's block, and top-k / random-k keep the same fraction of every leaf. Shapes are static
(k is a Python int per leaf), so each operator is jittable and vectorises over clients with ``vmap``.

* :class:`TopK` (Stich et al. 2018, "Sparsified SGD with memory", top_k): keep the k_l = ⌈f·d_l⌉ entries of largest
  |x| of each leaf, zero the rest. Biased; ‖x − C(x)‖² ≤ (1 − k_l/d_l)‖x‖² per leaf (the k-contraction).
* :class:`RandomK` (ibid., rand_k, unbiased form): keep a uniformly random k_l-subset S of each leaf and scale by
  d_l/k_l, C(x)_i = (d_l/k_l)·x_i·1[i ∈ S]; P(i ∈ S) = k_l/d_l, so E[C(x)] = x and Var C(x)_i = (d_l/k_l − 1)·x_i².
* :class:`QSGD` (Alistarh et al. 2017, Section 3.1, the quantiser Q_s): with s = 2^b − 1 levels and r_i = s·|x_i|/‖x‖,
  C(x)_i = ‖x‖·sign(x_i)·ξ_i/s with ξ_i = ⌊r_i⌋ + Bernoulli(r_i − ⌊r_i⌋); E[ξ_i] = r_i, so E[C(x)] = x and
  Var C(x)_i = (‖x‖/s)²·p_i(1 − p_i), p_i = r_i − ⌊r_i⌋. ‖x‖ is the leaf's L2 norm (the bucket is the leaf).
* :class:`ScaledSign` (Karimireddy et al. 2019, "Error feedback fixes SignSGD", C(x) = (‖x‖₁/d)·sign(x)): the
  leaf's mean |x| times its signs, with sign(0) sent as +1 (a 1-bit code). Biased; ‖C(x)‖₂ = ‖x‖₁/√d ≤ ‖x‖₂.
* :func:`error_feedback` (ibid., Alg. 2; Stich et al. 2018): v = e + x is compressed, c = C(v) is sent, and the
  residual e' = v − c (what the server did not receive) is the client's state for its next upload, so
  Σ_t c_t + e_T = Σ_t x_t + e_0. The residual stays bounded when C is a δ-contraction, E‖x − C(x)‖² ≤ (1 − δ)‖x‖²
  (Karimireddy et al. 2019, Assumption A): top-k (δ = k/d) and the scaled sign are; the unbiased compressors, whose
  error E‖C(x) − x‖² ≤ ω‖x‖² can exceed ‖x‖², are not, and error feedback with them diverges (docs/privacy.md).
* :class:`Contractive` (ibid., Remark 6): an unbiased C with variance bound ω scaled by 1/(1 + ω) is a δ-contraction
  with δ = 1/(1 + ω): E‖x − C(x)/(1+ω)‖² = ‖x‖² − 2‖x‖²/(1+ω) + E‖C(x)‖²/(1+ω)² ≤ (1 − 1/(1+ω))‖x‖², since
  E‖C(x)‖² = ‖x‖² + E‖C(x) − x‖² ≤ (1+ω)‖x‖². Per leaf, random-k's ω = d/k − 1 (exact: it then sends the kept
  entries unscaled, Stich et al.'s rand_k with memory) and QSGD's ω = min(d/s², √d/s) (Alistarh et al. 2017, Lemma
  3.1). It is what error feedback uses with an unbiased compressor by default (``ef_scaling: contractive``); the
  bytes are the same (the server knows ω from d, k and s).

Bytes sent per client (:meth:`Compressor.bytes`, a Python int, counted from what a real encoder would send, each
leaf's bits rounded up to whole bytes): dense float leaves d·itemsize; top-k k values + k 32-bit indices; random-k
k values + one 64-bit seed per client (the server regenerates the indices from it); QSGD a 32-bit norm + d·(b + 1)
bits (b level bits and a sign bit per entry, fixed-length codes, no Elias coding); scaled sign a 32-bit scale + d
bits.

Composition with differential privacy (docs/privacy.md): clip → compress → aggregate → noise; see
:mod:`fljax.ops.privacy`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = ["Compressor", "Identity", "TopK", "RandomK", "QSGD", "ScaledSign", "Contractive", "kept_entries",
           "error_feedback",
           "COMPRESSORS", "COMPRESSOR_OPTION", "make_compressor"]

SEED_BITS = 64  # a PRNG key (two uint32 words) from which the server regenerates random-k's indices
INDEX_BITS = 32  # an int32 position within a leaf
NORM_BITS = 32  # a float32 norm or scale


def kept_entries(size: int, fraction: float) -> int:
    """k = ⌈fraction·size⌉, at least 1 and at most ``size`` (a Python int: static under ``jit``). The product is
    rounded to 9 decimals first, so that 0.1·10 (= 1.0000000000000002 in floating point) keeps 1 entry, not 2."""
    return min(size, max(1, math.ceil(round(fraction * size, 9))))


def _itemsize_bits(x) -> int:
    return 8 * jnp.dtype(x.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Compressor:
    """Base class. ``C(tree, key)`` is the decoded update, leaf by leaf (each leaf gets its own key, split from
    ``key``), with the tree's structure, shapes and dtypes; :meth:`bytes` is what one client sends."""

    name: ClassVar[str] = "compressor"
    unbiased: ClassVar[bool] = False  # E[C(x)] = x

    def __call__(self, tree: PyTree, key) -> PyTree:
        leaves, treedef = jax.tree.flatten(tree)
        keys = jax.random.split(key, max(len(leaves), 1))
        return jax.tree.unflatten(treedef, [self._leaf(x, k).astype(x.dtype) for x, k in zip(leaves, keys)])

    def bytes(self, tree: PyTree) -> int:
        """Bytes one client uploads for ``tree`` (arrays or anything with ``shape`` and ``dtype``)."""
        return sum(math.ceil(self._leaf_bits(x) / 8) for x in jax.tree.leaves(tree)) + self._client_bits() // 8

    def _leaf(self, x, key):
        raise NotImplementedError

    def _leaf_bits(self, x) -> int:
        raise NotImplementedError

    def _client_bits(self) -> int:
        return 0

    def variance_factor(self, d: int) -> float:
        """ω of an unbiased compressor on a leaf of d entries: E‖C(x) − x‖² ≤ ω‖x‖²."""
        raise NotImplementedError(f"{self.name} is not unbiased: it has no variance factor")

    def contractive(self) -> "Compressor":
        """The compressor error feedback should use: an unbiased one scaled by 1/(1 + ω) (:class:`Contractive`),
        a biased (contractive) one as it is."""
        return Contractive(self) if self.unbiased and not isinstance(self, Identity) else self


@dataclasses.dataclass(frozen=True)
class Identity(Compressor):
    """No compression: C(x) = x, d·itemsize bytes."""

    name: ClassVar[str] = "none"
    unbiased: ClassVar[bool] = True

    def __call__(self, tree, key):
        return tree

    def _leaf_bits(self, x):
        return int(np.prod(x.shape)) * _itemsize_bits(x)


@dataclasses.dataclass(frozen=True)
class TopK(Compressor):
    """The k_l = ⌈fraction·d_l⌉ entries of largest magnitude of every leaf (ties: ``lax.top_k``'s order)."""

    fraction: float
    name: ClassVar[str] = "top_k"

    def __post_init__(self):
        _check_fraction(self.fraction)

    def _leaf(self, x, key):
        flat = x.ravel()
        k = kept_entries(flat.size, self.fraction)
        idx = jax.lax.top_k(jnp.abs(flat), k)[1]
        return jnp.zeros_like(flat).at[idx].set(flat[idx]).reshape(x.shape)

    def _leaf_bits(self, x):
        return kept_entries(int(np.prod(x.shape)), self.fraction) * (_itemsize_bits(x) + INDEX_BITS)


@dataclasses.dataclass(frozen=True)
class RandomK(Compressor):
    """A uniformly random k_l-subset of every leaf, scaled by d_l/k_l (unbiased)."""

    fraction: float
    name: ClassVar[str] = "random_k"
    unbiased: ClassVar[bool] = True

    def __post_init__(self):
        _check_fraction(self.fraction)

    def _leaf(self, x, key):
        flat = x.ravel()
        k = kept_entries(flat.size, self.fraction)
        idx = jax.lax.top_k(jax.random.uniform(key, (flat.size,)), k)[1]  # a uniform k-subset
        return jnp.zeros_like(flat).at[idx].set(flat[idx] * (flat.size / k)).reshape(x.shape)

    def _leaf_bits(self, x):
        return kept_entries(int(np.prod(x.shape)), self.fraction) * _itemsize_bits(x)

    def _client_bits(self):
        return SEED_BITS

    def variance_factor(self, d):
        return d / kept_entries(d, self.fraction) - 1.0


@dataclasses.dataclass(frozen=True)
class QSGD(Compressor):
    """QSGD's stochastic quantiser Q_s with s = 2^bits − 1 levels per leaf (unbiased)."""

    bits: int
    name: ClassVar[str] = "qsgd"
    unbiased: ClassVar[bool] = True

    def __post_init__(self):
        if not (isinstance(self.bits, int) and 1 <= self.bits <= 16):
            raise ValueError(f"qsgd bits must be an integer between 1 and 16, got {self.bits!r}.")

    @property
    def levels(self) -> int:
        return 2 ** self.bits - 1

    def _leaf(self, x, key):
        s = self.levels
        norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32))))
        r = jnp.minimum(s * jnp.abs(x) / jnp.where(norm > 0, norm, 1.0), s)  # |x_i| ≤ ‖x‖, up to rounding
        low = jnp.floor(r)
        xi = low + (jax.random.uniform(key, x.shape) < r - low)
        return jnp.where(norm > 0, norm * jnp.sign(x) * xi / s, 0.0)

    def _leaf_bits(self, x):
        return NORM_BITS + int(np.prod(x.shape)) * (self.bits + 1)

    def variance_factor(self, d):
        s = self.levels
        return min(d / s ** 2, math.sqrt(d) / s)


@dataclasses.dataclass(frozen=True)
class ScaledSign(Compressor):
    """(‖x‖₁/d)·sign(x) per leaf, sign(0) = +1."""

    name: ClassVar[str] = "sign"

    def _leaf(self, x, key):
        scale = jnp.mean(jnp.abs(x.astype(jnp.float32)))
        return jnp.where(x >= 0, scale, -scale)

    def _leaf_bits(self, x):
        return NORM_BITS + int(np.prod(x.shape))


@dataclasses.dataclass(frozen=True)
class Contractive(Compressor):
    """An unbiased compressor scaled to a δ-contraction, C(x)/(1 + ω_l) on every leaf of d_l entries (ω_l the inner
    compressor's :meth:`~Compressor.variance_factor`); the same bytes as the inner compressor."""

    inner: Compressor
    name: ClassVar[str] = "contractive"

    def __post_init__(self):
        if not self.inner.unbiased:
            raise ValueError(f"Contractive scales an unbiased compressor; {self.inner.name} is biased.")

    def _leaf(self, x, key):
        d = int(np.prod(x.shape))
        return self.inner._leaf(x, key) / (1.0 + self.inner.variance_factor(d))

    def _leaf_bits(self, x):
        return self.inner._leaf_bits(x)

    def _client_bits(self):
        return self.inner._client_bits()


def _check_fraction(fraction):
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"fraction of entries kept must be in (0, 1], got {fraction!r}.")


def error_feedback(compress: Callable, x: PyTree, residual: PyTree, key, post: Callable | None = None):
    """One upload with error feedback: v = e + x, c = post(C(v)) is sent, e' = v − c. Returns ``(c, e')``.

    ``compress(tree, key)`` is a :class:`Compressor`; ``post`` (optional) acts on the decoded update before it is
    sent, e.g. the privacy pipeline's projection onto the clip ball, so that the residual keeps everything the
    server did not receive."""
    v = jax.tree.map(jnp.add, residual, x)
    c = compress(v, key)
    if post is not None:
        c = post(c)
    return c, jax.tree.map(jnp.subtract, v, c)


COMPRESSORS = {
    "none": "no compression: the dense update",
    "top_k": "top-k sparsification: the largest ⌈fraction·d⌉ entries of each leaf (+ indices); biased",
    "random_k": "random-k sparsification: a random ⌈fraction·d⌉ entries of each leaf, scaled by d/k; unbiased",
    "qsgd": "QSGD stochastic uniform quantisation with 2^bits − 1 levels per leaf (+ sign, + norm); unbiased",
    "sign": "scaled sign: mean |x| of each leaf times sign(x), one bit per entry; biased",
}


COMPRESSOR_OPTION = {"top_k": "fraction", "random_k": "fraction", "qsgd": "bits"}  # the one option each kind needs


def make_compressor(kind: str, fraction: float | None = None, bits: int | None = None) -> Compressor:
    """The compressor ``kind`` (a key of :data:`COMPRESSORS`): ``fraction`` for top_k / random_k, ``bits`` for
    qsgd (:data:`COMPRESSOR_OPTION`). A bad name or a missing or superfluous option raises a one-line ValueError."""
    if kind not in COMPRESSORS:
        close = difflib.get_close_matches(str(kind), COMPRESSORS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown compressor {kind!r}; valid: {', '.join(COMPRESSORS)}.{hint}")
    needs = COMPRESSOR_OPTION.get(kind)
    given = {"fraction": fraction, "bits": bits}
    for name, value in given.items():
        if name == needs and value is None:
            raise ValueError(f"compressor {kind!r} needs {name}.")
        if name != needs and value is not None:
            raise ValueError(f"compressor {kind!r} takes no {name} (got {value!r}).")
    if kind == "none":
        return Identity()
    if kind == "top_k":
        return TopK(fraction)
    if kind == "random_k":
        return RandomK(fraction)
    if kind == "qsgd":
        return QSGD(bits)
    return ScaledSign()
