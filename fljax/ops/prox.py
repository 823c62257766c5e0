"""Proximal operators on pytrees.

A :class:`Prox` ``p`` maps ``(y, step)`` to ``prox_{step·R}(y) = argmin_x ½‖x − y‖² + step·R(x)``, where
``R = p.penalty`` is separable over leaves. Every operator works leaf by leaf, so it is pure, jittable, and vectorises
over a client axis with ``jax.vmap`` (apply it to one client's tree; ``vmap`` adds the client axis). Leaves are selected by path with :func:`on` / :func:`per_leaf` (paths
come from :func:`fljax.tree.path_str`, e.g. ``params/Dense_0/kernel``) and composed with :func:`chain`.

Conventions: ``step`` is a Python or traced scalar (a traced step never recompiles); results keep each leaf's dtype.
Kernel layouts are Flax's: Dense ``(in, out)``, Conv ``HWIO = (kh, kw, in, out)``.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from fljax.ops.partition import Selector, matches
from fljax.tree import map_with_path, path_str

PyTree = Any

__all__ = [
    "Prox", "Identity", "L1", "SquaredL2", "L2Norm", "GroupLasso", "ElasticNet", "Box", "NonNegative", "HardThreshold",
    "Nuclear", "on", "per_leaf", "chain", "soft_threshold", "rank_mask", "matricize", "unmatricize", "svt",
    "LowRankStats", "measured_stats", "transmission_bytes", "proximal_penalty", "PROXES", "make_prox",
]


def _sum(values):
    values = list(values)
    return sum(values[1:], values[0]) if values else jnp.zeros(())


def _map2(fn: Callable[[str, Any], tuple[Any, Any]], tree: PyTree) -> tuple[PyTree, PyTree]:
    """``map_with_path`` for a leaf function returning a pair; returns the pair of trees."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    pairs = [fn(path_str(p), x) for p, x in leaves]
    return jax.tree.unflatten(treedef, [a for a, _ in pairs]), jax.tree.unflatten(treedef, [b for _, b in pairs])


# --------------------------------------------------------------------------------------------------------- base


@dataclasses.dataclass(frozen=True)
class Prox:
    """Base class. ``p(y, step) = argmin_x Σ_leaves ½‖x − y‖² + step·R(x)`` and ``p.penalty(tree) = R(tree)``.

    Subclasses implement the leaf rules ``_prox(path, x, step)`` and ``_penalty(path, x)``; the path lets
    selectors (:func:`on`, :func:`per_leaf`) dispatch. Indicator penalties return 0 inside the set and ``inf`` outside.
    """

    def __call__(self, tree: PyTree, step) -> PyTree:
        return map_with_path(lambda p, x: self._prox(p, x, step), tree)

    def penalty(self, tree: PyTree):
        """The regulariser R(tree), summed over leaves (a scalar)."""
        return _sum(jax.tree.leaves(map_with_path(self._penalty, tree)))

    def _prox(self, path: str, x, step):
        raise NotImplementedError

    def _penalty(self, path: str, x):
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Identity(Prox):
    """R = 0; prox = identity."""

    def _prox(self, path, x, step):
        return x

    def _penalty(self, path, x):
        return jnp.zeros((), x.dtype)


def soft_threshold(x, a):
    """S_a(x) = sign(x)·max(|x| − a, 0), FedSLR Eq. (16)."""
    return (jnp.sign(x) * jnp.maximum(jnp.abs(x) - a, 0)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class L1(Prox):
    """R(x) = λ‖x‖₁; prox = soft threshold S_{λ·step}, FedSLR Eq. (16)–(17) (Phase II, Eq. (7): a = μ·η_l)."""

    lam: Any = 1.0

    def _prox(self, path, x, step):
        return soft_threshold(x, self.lam * step)

    def _penalty(self, path, x):
        return self.lam * jnp.sum(jnp.abs(x))


@dataclasses.dataclass(frozen=True)
class SquaredL2(Prox):
    """R(x) = (λ/2)‖x‖²; prox = x / (1 + λ·step) (weight-decay shrink; Ditto's decoupled prox, DFedAlt D21)."""

    lam: Any = 1.0

    def _prox(self, path, x, step):
        return (x / (1 + self.lam * step)).astype(x.dtype)

    def _penalty(self, path, x):
        return 0.5 * self.lam * jnp.sum(jnp.square(x))


def _block_shrink(x, norms, thr):
    safe = jnp.where(norms > 0, norms, 1)
    return (x * jnp.where(norms > thr, 1 - thr / safe, 0)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class L2Norm(Prox):
    """R(x) = λ‖x‖₂ for the whole leaf (one group per leaf); prox = block soft threshold
    x·max(0, 1 − λ·step/‖x‖₂)."""

    lam: Any = 1.0

    def _prox(self, path, x, step):
        return _block_shrink(x, jnp.sqrt(jnp.sum(jnp.square(x))), self.lam * step)

    def _penalty(self, path, x):
        return self.lam * jnp.sqrt(jnp.sum(jnp.square(x)))


@dataclasses.dataclass(frozen=True)
class GroupLasso(Prox):
    """R(x) = λ Σ_g ‖x_g‖₂, groups = the slices along ``axis``; prox shrinks each group by its norm.

    Convention: ``axis`` indexes the groups and the norm runs over all other axes. The default ``axis=-1`` is the
    output axis of Flax kernels, so a group is one output unit's fan-in (Dense ``(in, out)``: a column ``W[:, j]``,
    i.e. a row of the PyTorch ``(out, in)`` weight) or one output filter of a conv (HWIO: ``K[..., o]``). Pruning a
    group removes a neuron / filter. On a 1-D leaf every entry is its own group (= L1); restrict with :func:`on`.
    """

    lam: Any = 1.0
    axis: int = -1

    def _norms(self, x):
        axes = tuple(a for a in range(x.ndim) if a != self.axis % x.ndim)
        return jnp.sqrt(jnp.sum(jnp.square(x), axis=axes, keepdims=True))

    def _prox(self, path, x, step):
        return _block_shrink(x, self._norms(x), self.lam * step)

    def _penalty(self, path, x):
        return self.lam * jnp.sum(self._norms(x))


@dataclasses.dataclass(frozen=True)
class ElasticNet(Prox):
    """R(x) = l1‖x‖₁ + (l2/2)‖x‖²; prox = S_{l1·step}(x) / (1 + l2·step) (= ``chain(L1(l1), SquaredL2(l2))``)."""

    l1: Any = 1.0
    l2: Any = 1.0

    def _prox(self, path, x, step):
        return (soft_threshold(x, self.l1 * step) / (1 + self.l2 * step)).astype(x.dtype)

    def _penalty(self, path, x):
        return self.l1 * jnp.sum(jnp.abs(x)) + 0.5 * self.l2 * jnp.sum(jnp.square(x))


@dataclasses.dataclass(frozen=True)
class Box(Prox):
    """R = indicator of [lo, hi]^d; prox = projection clip(x, lo, hi) (``step`` ignored)."""

    lo: Any = -1.0
    hi: Any = 1.0

    def _prox(self, path, x, step):
        return jnp.clip(x, self.lo, self.hi).astype(x.dtype)

    def _penalty(self, path, x):
        inside = jnp.all((x >= self.lo) & (x <= self.hi))
        return jnp.where(inside, 0.0, jnp.inf).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class NonNegative(Box):
    """R = indicator of x ≥ 0; prox = max(x, 0)."""

    lo: Any = 0.0
    hi: Any = jnp.inf


# ------------------------------------------------------------------------------------- hard threshold / ranks


def _sortable_bits(x):
    """uint32 keys with the order of the float32 values (−0 is read as +0): the sign bit flipped for x ≥ 0, all
    bits flipped for x < 0."""
    x = jnp.asarray(x, jnp.float32)
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x), jnp.uint32)  # (x + 0.0 is folded under jit)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def rank_mask(scores, k):
    """Boolean mask of the ``k`` largest entries of ``scores`` (ties to the lower flat index; no NaNs).

    ``k`` may be traced (DisPFL's prune and regrow count ceil(a_t·nnz); DFedAlt spec §10). The k-th largest value is
    found by a 32-step bitwise search over order-preserving integer keys (O(32·n), no sort: XLA:CPU sorts were
    ~14× slower), then the entries above it and the first tied ones up to k are kept.
    """
    flat = scores.ravel()
    keys = _sortable_bits(flat)
    k = jnp.asarray(k, jnp.int32)

    def set_bit(b, t):  # the largest threshold t with #{keys >= t} >= k, built from the top bit down
        cand = t | (jnp.uint32(1) << (31 - b).astype(jnp.uint32))
        return jnp.where(jnp.sum(keys >= cand) >= k, cand, t)

    t = jax.lax.fori_loop(0, 32, set_bit, jnp.uint32(0))
    above = keys > t
    ties = keys == t
    keep = above | (ties & (jnp.cumsum(ties) <= k - jnp.sum(above)))
    return (keep & (k > 0)).reshape(scores.shape)


@dataclasses.dataclass(frozen=True)
class HardThreshold(Prox):
    """R(x) = (τ²/2)‖x‖₀ with τ = ``threshold``; prox_{step·R} keeps x_j iff |x_j| > τ·√step, per entry (at
    ``step=1`` the cut is τ). ``make_prox("l0", λ)`` is this prox with τ = √(2λ)."""

    threshold: Any

    def _prox(self, path, x, step):
        return jnp.where(jnp.abs(x) > self.threshold * jnp.sqrt(step), x, 0).astype(x.dtype)

    def _penalty(self, path, x):
        return (0.5 * self.threshold ** 2 * jnp.count_nonzero(x)).astype(x.dtype)


# ------------------------------------------------------------------------------------------------------ nuclear


def matricize(kernel, layout: str = "hwio", conv_reshape: str = "fedslr"):
    """Weight → matrix for the nuclear norm (FedSLR §2, footnote 1).

    * 2-D leaves are used as is (Flax Dense (in, out) is the transpose of PyTorch's (out, in); SVT commutes with it).
    * 4-D conv kernels, ``conv_reshape="fedslr"``: W[(o,a),(i,b)] = K[o,i,a,b], an (O·kh) × (I·kw) matrix.
      Flax HWIO (kh,kw,I,O): transpose (3,0,2,1) → (O,kh,I,kw) → reshape. PyTorch OIHW (O,I,kh,kw): swap axes 1,2
      → (O,kh,I,kw) → reshape. ``conv_reshape="flat"`` gives (kh·kw·I) × O (the non-faithful D10 option).
    * other ranks: (∏ leading dims) × last dim.
    """
    if kernel.ndim == 2:
        return kernel
    if kernel.ndim == 4 and conv_reshape == "fedslr":
        if layout == "hwio":
            kh, kw, i, o = kernel.shape
            return jnp.transpose(kernel, (3, 0, 2, 1)).reshape(o * kh, i * kw)
        if layout == "oihw":
            o, i, kh, kw = kernel.shape
            return jnp.swapaxes(kernel, 1, 2).reshape(o * kh, i * kw)
        raise ValueError(f"unknown layout {layout!r}; valid: 'hwio', 'oihw'")
    if conv_reshape not in ("fedslr", "flat"):
        raise ValueError(f"unknown conv_reshape {conv_reshape!r}; valid: 'fedslr', 'flat'")
    if layout == "oihw" and kernel.ndim == 4:
        kernel = jnp.transpose(kernel, (2, 3, 1, 0))
    return kernel.reshape(-1, kernel.shape[-1])


def unmatricize(matrix, shape, layout: str = "hwio", conv_reshape: str = "fedslr"):
    """Inverse of :func:`matricize` for a kernel of ``shape``: HWIO reshape (O,kh,I,kw) then transpose (1,3,2,0);
    OIHW reshape (O,kh,I,kw) then swap axes 1,2."""
    shape = tuple(shape)
    if len(shape) == 2:
        return matrix
    if len(shape) == 4 and conv_reshape == "fedslr":
        if layout == "hwio":
            kh, kw, i, o = shape
            return jnp.transpose(matrix.reshape(o, kh, i, kw), (1, 3, 2, 0))
        o, i, kh, kw = shape
        return jnp.swapaxes(matrix.reshape(o, kh, i, kw), 1, 2)
    if layout == "oihw" and len(shape) == 4:
        o, i, kh, kw = shape
        return jnp.transpose(matrix.reshape(kh, kw, i, o), (3, 2, 0, 1))
    return matrix.reshape(shape)


@struct.dataclass
class LowRankStats:
    """Per-leaf statistics of a thresholded weight (traced int32 scalars; FedSLR §5 / D28).

    ``rank`` r; ``params`` = min(r(m+n), mn) (what the factorised downlink sends); ``max_rank`` = min(m, n);
    ``dense`` = m·n. Leaves that are not matrices have rank = max_rank = 0 and params = dense = numel.
    """

    rank: Any
    params: Any
    max_rank: Any
    dense: Any


def svt(matrix, tau) -> tuple[Any, LowRankStats]:
    """Singular value thresholding, FedSLR Eq. (15): Prox_{τ‖·‖_*}(X) = U diag(max(s − τ, 0)) Vᵀ (thin SVD).

    Returns ``(Z, stats)`` with r = #{s > τ} traced (no shape depends on it)."""
    u, s, vt = jnp.linalg.svd(matrix, full_matrices=False)
    s_new = jnp.maximum(s - tau, 0)
    z = ((u * s_new) @ vt).astype(matrix.dtype)
    m, n = matrix.shape
    return z, _matrix_stats(jnp.sum(s_new > 0).astype(jnp.int32), m, n)


def _matrix_stats(r, m: int, n: int) -> LowRankStats:
    return LowRankStats(rank=r, params=jnp.minimum(r * (m + n), m * n).astype(jnp.int32),
                        max_rank=jnp.int32(min(m, n)), dense=jnp.int32(m * n))


def measured_stats(x, conv_reshape: str = "fedslr", rtol: float | None = None) -> LowRankStats:
    """:class:`LowRankStats` of a leaf that was not thresholded (jittable; FedSLR §5, D28).

    Matrix leaves (ndim ≥ 2, through :func:`matricize`): the numerical rank r = #{s > s_max·max(m, n)·eps} of the
    singular values s (numpy's ``matrix_rank`` tolerance), or #{s > s_max·rtol} with ``rtol``. 1-D leaves: rank 0,
    params = dense = numel.
    """
    if x.ndim < 2:
        n = jnp.int32(x.size)
        return LowRankStats(rank=jnp.int32(0), params=n, max_rank=jnp.int32(0), dense=n)
    mat = matricize(x, conv_reshape=conv_reshape)
    m, n = mat.shape
    s = jnp.linalg.svd(mat, compute_uv=False)
    tol = s[0] * max(m, n) * jnp.finfo(mat.dtype).eps if rtol is None else s[0] * rtol
    return _matrix_stats(jnp.sum(s > tol).astype(jnp.int32), m, n)


@dataclasses.dataclass(frozen=True)
class Nuclear(Prox):
    """R(W) = λ Σ_l ‖π(W_l)‖_* over the matrix leaves (ndim ≥ 2; π = :func:`matricize`) not selected by
    ``exclude``; 1-D and excluded leaves are left alone.

    prox = SVT with τ = λ·step on each matricised leaf, reshaped back (FedSLR Eq. (2), (15); server step of Alg. 2
    with step = η_g); ``step=None`` thresholds nothing. ``conv_reshape`` is ``"fedslr"`` (faithful, default) or
    ``"flat"``; ``exclude`` is a selector (a path regex or a predicate ``(path, leaf) -> bool``,
    :func:`fljax.ops.partition.matches`) of matrix leaves left out of the penalty (FedSLR D9, ``nuclear_exclude``).
    Apply per client (under ``vmap``): the leaf's own ndim decides matrix vs vector.
    """

    lam: Any = 1.0
    conv_reshape: str = "fedslr"
    exclude: Selector | None = None

    def _penalised(self, path, x) -> bool:
        return x.ndim >= 2 and not (self.exclude is not None and matches(self.exclude, path, x))

    def _svt(self, x, step):
        z, stats = svt(matricize(x, conv_reshape=self.conv_reshape), self.lam * step)
        return unmatricize(z, x.shape, conv_reshape=self.conv_reshape), stats

    def _prox(self, path, x, step):
        return self._svt(x, step)[0] if step is not None and self._penalised(path, x) else x

    def _penalty(self, path, x):
        if not self._penalised(path, x):
            return jnp.zeros((), x.dtype)
        return self.lam * jnp.sum(jnp.linalg.svd(matricize(x, conv_reshape=self.conv_reshape), compute_uv=False))

    def with_stats(self, tree: PyTree, step) -> tuple[PyTree, PyTree]:
        """``(prox(tree, step), stats)`` with a :class:`LowRankStats` per leaf: from the SVT on thresholded leaves
        (r = #{s > λ·step}), :func:`measured_stats` on the others (1-D, excluded, or every leaf when ``step`` is
        None). Jittable; FedSLR's server step (Alg. 2, Eq. 15)."""

        def leaf(path, x):
            if step is not None and self._penalised(path, x):
                return self._svt(x, step)
            return x, measured_stats(x, self.conv_reshape)

        return _map2(leaf, tree)


def transmission_bytes(tree_stats_or_tree: PyTree, conv_reshape: str = "fedslr", bytes_per_param: int = 4,
                       rtol: float | None = None):
    """Downlink bytes of a (thresholded) model sent as low-rank factors vs dense: ``(factored, dense)``.

    Each matrix leaf sends min(r(m+n), mn) numbers (factors iff r(m+n) < mn), 1-D leaves numel; float32 = 4 B
    (FedSLR §2, §5). Pass the stats tree from :meth:`Nuclear.with_stats`, or a parameter tree, whose ranks are then
    measured by :func:`measured_stats` (``rtol``); jittable either way. Counts are int32 (models up to ~5·10⁸
    parameters at 4 B each).
    """
    is_stats = lambda x: isinstance(x, LowRankStats)  # noqa: E731
    leaves = jax.tree.leaves(tree_stats_or_tree, is_leaf=is_stats)
    if leaves and not all(is_stats(s) for s in leaves):
        leaves = [measured_stats(x, conv_reshape, rtol) for x in leaves]
    sent = _sum(s.params.astype(jnp.int32) for s in leaves) * bytes_per_param
    dense = _sum(s.dense.astype(jnp.int32) for s in leaves) * bytes_per_param
    return sent, dense


# -------------------------------------------------------------------------------------------- selection, chains


@dataclasses.dataclass(frozen=True)
class _PerLeaf(Prox):
    rules: tuple = ()
    default: Prox = Identity()

    def _pick(self, path, x) -> Prox:
        for selector, prox in self.rules:
            if matches(selector, path, x):
                return prox
        return self.default

    def _prox(self, path, x, step):
        return self._pick(path, x)._prox(path, x, step)

    def _penalty(self, path, x):
        return self._pick(path, x)._penalty(path, x)


def per_leaf(rules: Sequence[tuple[Selector, Prox]], default: Prox = Identity()) -> Prox:
    """Dispatch by path: each leaf gets the prox of the first ``(selector, prox)`` whose selector matches (regex on
    the path, or predicate ``(path, leaf) -> bool``), else ``default``. The penalty dispatches the same way."""
    return _PerLeaf(rules=tuple((s, p) for s, p in rules), default=default)


def on(selector: Selector, prox: Prox) -> Prox:
    """Apply ``prox`` only to the selected leaves (identity, zero penalty elsewhere)."""
    return per_leaf([(selector, prox)])


@dataclasses.dataclass(frozen=True)
class _Chain(Prox):
    proxes: tuple = ()

    def _prox(self, path, x, step):
        for p in self.proxes:
            x = p._prox(path, x, step)
        return x

    def _penalty(self, path, x):
        return _sum(p._penalty(path, x) for p in self.proxes)


def chain(*proxes: Prox) -> Prox:
    """Apply ``proxes`` in order; the penalty is the sum.

    The composition equals the prox of the summed penalty only in special cases, e.g. (all checked in tests):
    a separable convex prox followed by :class:`Box` / :class:`NonNegative` (1-D: the constrained minimiser of a
    strictly convex function on an interval is the clip of the unconstrained one), so ``chain(L1(λ), NonNegative())``
    = max(x − λ·step, 0); and ``chain(L1(a), SquaredL2(b)) = ElasticNet(a, b)``. In general (e.g. L1 then Nuclear)
    it is only a splitting heuristic.
    """
    return _Chain(proxes=tuple(proxes))


# ----------------------------------------------------------------------------------------------------- registry


_REGISTRY: dict[str, tuple[Callable[..., Prox], str]] = {
    "none": (lambda strength: Identity(), "R = 0: the identity (strength ignored)"),
    "l1": (lambda strength: L1(strength), "λ‖x‖₁: soft threshold (FedSLR Eq. (16)–(17))"),
    "squared_l2": (lambda strength: SquaredL2(strength), "(λ/2)‖x‖²: shrink x/(1 + λ·step)"),
    "l2_norm": (lambda strength: L2Norm(strength), "λ‖x‖₂ per leaf: block soft threshold"),
    "group_lasso": (lambda strength, axis=-1: GroupLasso(strength, axis),
                    "λ Σ_g ‖x_g‖₂, a group per slice along axis= (default: output units / filters)"),
    "elastic_net": (lambda strength, l2=1.0: ElasticNet(strength, strength * l2),
                    "λ(‖x‖₁ + (l2/2)‖x‖²): soft threshold then shrink (l2= relative weight, default 1)"),
    "l0": (lambda strength: HardThreshold(threshold=math.sqrt(2 * strength)),
           "λ‖x‖₀: hard threshold, keep |x| > √(2λ·step)"),
    "nonnegative": (lambda strength: NonNegative(), "indicator of x ≥ 0: max(x, 0) (strength ignored)"),
    "box": (lambda strength, lo=-1.0, hi=1.0: Box(lo, hi), "indicator of [lo, hi]: clip (strength ignored)"),
    "nuclear": (lambda strength, conv_reshape="fedslr", exclude=None: Nuclear(strength, conv_reshape, exclude),
                "λ Σ_l ‖π(W_l)‖_* over matrix leaves: SVT (FedSLR Eq. (2), (15); conv_reshape=, exclude=)"),
}
PROXES = {name: summary for name, (_, summary) in _REGISTRY.items()}


def make_prox(name: str, strength=1.0, **options) -> Prox:
    """The prox of R = strength·R₁ by name (the keys of ``PROXES``, which maps each to a one-line summary), e.g.
    ``make_prox("l1", μ)`` = ``L1(μ)``, ``make_prox("nuclear", λ, exclude="head")``; FedSLR's ``global_prox`` /
    ``personal_prox`` names. Indicators (``nonnegative``, ``box``) and ``none`` ignore the strength (λ·ι = ι);
    ``l0`` is R = λ‖x‖₀, i.e. :class:`HardThreshold` with τ = √(2λ). Unknown names and options raise a one-line
    ValueError naming the valid ones."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown prox {name!r}; valid: {', '.join(_REGISTRY)}.{hint}")
    build = _REGISTRY[name][0]
    valid = list(inspect.signature(build).parameters)[1:]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"prox {name!r} takes no option {', '.join(map(repr, unknown))}; valid options: "
                         f"{', '.join(valid) or 'none'}.")
    return build(strength, **options)


# ------------------------------------------------------------------------------------ FedProx proximal term


def proximal_penalty(params: PyTree, anchor: PyTree, mu):
    """(μ/2)‖params − anchor‖², the FedProx proximal term (Li et al. 2020, Eq. (2)); FedGiA §6 baseline."""
    sq = [jnp.sum(jnp.square(a - b)) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(anchor))]
    return 0.5 * mu * _sum(sq)
