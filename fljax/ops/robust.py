"""Robust aggregation rules (Byzantine-robust defences) over a cohort's stacked uploads.

Every rule is a pure function ``rule(uploads, valid=None, weights=None, *, options) -> (aggregate, selected)``:

* ``uploads``: a pytree whose leaves have a leading client axis ``[n, …]`` (n static: the cohort's buffer);
* ``valid``: ``[n]`` bool, the sampled slots (None: all). Only valid slots count (spec R1): an invalid (padded or
  unsampled) slot never enters a median, a distance, a count, a score or a mean; its rows are replaced by zeros
  before anything is computed, so junk, infinities or NaN there cannot leak through a zero weight. The number of valid
  uploads k = Σ valid is a traced value: rules sort with invalid entries pushed to the end and select by rank masks,
  never by slicing on k;
* ``weights``: ``[n]`` float, the run's aggregation weights p_i. Robust rules are unweighted over the valid uploads
  as their papers define them (spec R2) and ignore ``weights``; ``mean``, ``norm_bound`` and ``geometric_median``
  (RFA's α_i) use them (None: uniform over the valid uploads);
* options (f, β, τ, M, …) are keyword-only and may be traced scalars (a sweep's lane under ``vmap``); f may be a
  traced int32;
* ``aggregate``: the uploads' pytree without the client axis, in the uploads' dtypes;
* ``selected``: ``[n]`` float32, the share each upload has in the aggregate (zero for invalid slots): the engine
  counts from it how often a malicious upload is picked. Per rule: ``mean``, ``median``, ``trimmed_mean``: 1.0 for
  every valid upload that entered (``mean``: with a positive weight), as coordinate-wise rules have no per-upload
  share; ``krum``: one-hot; ``multi_krum``: 1/m on the m picked; ``bulyan``: 1/θ on the θ uploads of its Krum stage;
  ``geometric_median``: the final Weiszfeld weights β_i/Σβ_j; ``centered_clip``, ``norm_bound``: 1/k on every
  valid upload; ``fltrust``: TS_i/Σ_j TS_j.

Distances and norms run over the whole flattened upload (all leaves); coordinate-wise rules act per entry.
Pairwise distances are summed differences ‖u_i − u_j‖² (:func:`pairwise_sq_dists`), not a Gram expansion
‖u_i‖² + ‖u_j‖² − 2⟨u_i, u_j⟩, whose cancellation an attacker with a huge upload could exploit.

The rules (Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent"; El Mhamdi
et al. 2018, "The Hidden Vulnerability of Distributed Learning in Byzantium"; Yin et al. 2018, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates"; Pillutla et al. 2022, "Robust Aggregation for Federated
Learning" (RFA); Karimireddy et al. 2021, "Learning from History for Byzantine Robust Optimization"; Sun et al.
2019, "Can You Really Backdoor Federated Learning?"; Cao et al. 2021, "FLTrust: Byzantine-robust Federated Learning
via Trust Bootstrapping"), with k valid uploads u_i:

* :func:`mean`: Σ p_i u_i / Σ p_i, :func:`fljax.tree.weighted_mean_clients` bit for bit (McMahan et al. 2017).
* :func:`median`: per coordinate the median of the k values; for even k the mean of the two middle ones (Yin et al.).
* :func:`trimmed_mean`: per coordinate drop the b = ⌊βk⌋ largest and b smallest values, average the k − 2b others
  (Yin et al., Definition 2).
* :func:`krum`: score(i) = Σ_{j ∈ N_i} ‖u_i − u_j‖², N_i the k − f − 2 nearest other valid uploads; output the upload
  of least score (Blanchard et al., Section 4). :func:`krum_scores` exposes the scores.
* :func:`multi_krum`: the mean of the m uploads of least Krum score, scores computed once (m = k − f by default;
  Blanchard et al., Section 5).
* :func:`bulyan`: θ = k − 2f uploads picked by Krum applied recursively (each pick removed from the set, Krum scored
  again on the rest); then per coordinate the mean of the β = θ − 2f picked values closest to their median (El Mhamdi
  et al., Section 4).
* :func:`geometric_median`: RFA's smoothed Weiszfeld, v ← Σ β_i u_i / Σ β_i with β_i = p_i / max(ν, ‖v − u_i‖),
  T iterations from the weighted mean (Pillutla et al., Algorithm 2; T = 3, ν = 1e-6).
* :func:`centered_clip`: v ← v + (1/k) Σ_i (u_i − v)·min(1, τ/‖u_i − v‖), L iterations from v₀ = the previous
  round's aggregate (Karimireddy et al. 2021, Eq. 2; L = 1; the caller keeps v₀ as server state).
* :func:`norm_bound`: u_i ← u_i·min(1, M/‖u_i‖), then the weighted mean (Sun et al. 2019, Section 3).
* :func:`fltrust`: TS_i = ReLU(cos(u_i, g₀)), ū_i = u_i·‖g₀‖/‖u_i‖, output Σ TS_i ū_i / Σ TS_i, g₀ the server's own
  update on its root data, computed by the caller (Cao et al. 2021, Eqs. 2–4).

Too few valid uploads at run time (a Poisson cohort, partial participation): the rules never return NaN.

* Krum, Multi-Krum and Bulyan need k ≥ 2f + 3 (Bulyan k ≥ 4f + 3). With fewer valid uploads they run with the
  largest f' ≤ f that k admits, f' = max(0, min(f, ⌊(k − 3)/2⌋)) (Bulyan: ⌊(k − 3)/4⌋), and as the literal rule
  whenever k suffices. Bulyan with f' = 0 is the unweighted mean of the valid uploads.
* A Krum score sums at least one neighbour: max(r − f' − 2, 1) of the r − 1 others (r the uploads still in play).
  The literal count is below one only at Bulyan's last picks with f' = 1 (r = 2f' + 1), where an empty sum would
  make every score 0 and the pick the lowest index.
* No valid upload: every rule returns zeros (``centered_clip`` returns v₀, ``fltrust`` returns g₀) with
  ``selected`` all zero.
* ``fltrust`` when Σ TS_i = 0 (no valid upload within 90° of g₀): the paper's quotient is 0/0; the output is g₀, the
  one update the server trusts, so the round trains on the root data alone (``selected`` all zero). A zero upload
  has cos = 0, hence TS = 0.

Ties: Krum's and Multi-Krum's picks and Bulyan's closest-to-median values go to the lower slot index (stable sorts).

Host-side checks (:func:`check_rule` and one ``check_<rule>`` per rule) refuse options that are impossible for a
cohort buffer of n slots with :class:`fljax.errors.OptionError` one-liners naming the option (Krum n < 2f + 3,
Bulyan n < 4f + 3, a trimmed mean that trims everything, …); the config layer calls them before a run.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from fljax import tree as T
from fljax.errors import OptionError

PyTree = Any

__all__ = ["mean", "median", "trimmed_mean", "krum_scores", "krum", "multi_krum", "bulyan", "geometric_median",
           "centered_clip", "norm_bound", "fltrust", "pairwise_sq_dists", "row_sq_norms", "row_dots", "RULES",
           "check_rule", "check_trimmed_mean", "check_krum", "check_multi_krum", "check_bulyan",
           "check_geometric_median", "check_centered_clip", "check_norm_bound"]

HIGHEST = jax.lax.Precision.HIGHEST  # float32 products on accelerators (no TF32/bf16 passes)


# ------------------------------------------------------------------------------------------------------ helpers


def _valid(uploads: PyTree, valid) -> jax.Array:
    n = T.num_clients(uploads)
    return jnp.ones(n, bool) if valid is None else jnp.asarray(valid, bool)


def _clean(uploads: PyTree, valid) -> PyTree:
    """The uploads with every invalid row replaced by zeros (R1: nothing of an invalid slot can leak)."""
    return T.where(valid, uploads, T.zeros_like(uploads))


def _acc(x):
    """The accumulation dtype of a leaf: its own, at least float32."""
    return jnp.result_type(x.dtype, jnp.float32)


def _rows(fn: Callable, uploads: PyTree) -> jax.Array:
    """Σ over leaves of ``fn(leaf [n, d_l]) -> [n]`` (a per-upload reduction over the whole flattened upload)."""
    leaves = [fn(x.reshape(x.shape[0], -1).astype(_acc(x))) for x in jax.tree.leaves(uploads)]
    return sum(leaves[1:], leaves[0])


def row_sq_norms(uploads: PyTree) -> jax.Array:
    """``[n]``: ‖u_i‖² of every upload over all its leaves (float32 or wider)."""
    return _rows(lambda x: jnp.sum(x * x, axis=1), uploads)


def row_dots(uploads: PyTree, g: PyTree) -> jax.Array:
    """``[n]``: ⟨u_i, g⟩ of every upload with one tree ``g`` (no client axis), over all leaves."""
    leaves = [jnp.dot(x.reshape(x.shape[0], -1).astype(_acc(x)), y.reshape(-1).astype(_acc(x)), precision=HIGHEST)
              for x, y in zip(jax.tree.leaves(uploads), jax.tree.leaves(g))]
    return sum(leaves[1:], leaves[0])


def _combine(uploads: PyTree, coef) -> PyTree:
    """Σ_i c_i u_i over the client axis (c ``[n]``), accumulated in float32 and cast to each leaf's dtype."""
    return jax.tree.map(lambda x: jnp.tensordot(coef.astype(_acc(x)), x.astype(_acc(x)), axes=(0, 0),
                                                precision=HIGHEST).astype(x.dtype), uploads)


def _share(mask, count):
    """``mask`` as float32 divided by ``count`` (0 where count is 0)."""
    return jnp.where(mask, 1.0 / jnp.maximum(count, 1), 0.0).astype(jnp.float32)


def _zeros(uploads: PyTree) -> PyTree:
    return jax.tree.map(lambda x: jnp.zeros(x.shape[1:], x.dtype), uploads)


def pairwise_sq_dists(uploads: PyTree, valid=None) -> jax.Array:
    """``[n, n]`` squared distances ‖u_i − u_j‖² over the whole flattened upload, as sums of squared differences
    (exact up to rounding; no cancellation), invalid rows taken as zero. Row i is computed in one pass over the
    stacked uploads (``lax.map`` over i: memory O(n·d))."""
    clean = _clean(uploads, _valid(uploads, valid))
    flat = [x.reshape(x.shape[0], -1).astype(_acc(x)) for x in jax.tree.leaves(clean)]

    def row(i):
        parts = [jnp.sum(jnp.square(x - x[i]), axis=1) for x in flat]
        return sum(parts[1:], parts[0])

    return jax.lax.map(row, jnp.arange(flat[0].shape[0]))


def _rank_order(keys, axis=0):
    """The rank of every entry along ``axis`` in ascending order, ties to the lower index (stable)."""
    return jnp.argsort(jnp.argsort(keys, axis=axis, stable=True), axis=axis, stable=True)


# --------------------------------------------------------------------------------------- coordinate-wise rules


def mean(uploads: PyTree, valid=None, weights=None) -> tuple[PyTree, jax.Array]:
    """Σ_i p_i u_i / Σ_i p_i over the valid uploads (``weights`` p, None: uniform). With ``valid=None`` this *is*
    :func:`fljax.tree.weighted_mean_clients` (bit for bit); with ``valid``, invalid rows are zeroed and weighted 0.
    ``selected``: 1.0 for every valid upload of positive weight."""
    v = _valid(uploads, valid)
    w = v.astype(jnp.float32) if weights is None else jnp.asarray(weights)
    if valid is not None:
        uploads, w = _clean(uploads, v), jnp.where(v, w, 0).astype(w.dtype)
    return T.weighted_mean_clients(uploads, w), (v & (w > 0)).astype(jnp.float32)


def _sorted_valid(x, v):
    """A leaf's values sorted along the client axis with the invalid slots pushed to the end (as +∞)."""
    x = x.astype(_acc(x))
    return jnp.sort(jnp.where(v.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.inf), axis=0)


def _rank_mask(rank_lo, rank_hi, like):
    """A ``[n, 1, …]`` mask of the sorted positions r with rank_lo ≤ r < rank_hi, broadcastable against ``like``."""
    r = jnp.arange(like.shape[0]).reshape((-1,) + (1,) * (like.ndim - 1))
    return (r >= rank_lo) & (r < rank_hi)


def _mean_of_ranks(s, lo, hi, dtype):
    """Mean of the sorted values at ranks [lo, hi) (zero when the range is empty)."""
    keep = _rank_mask(lo, hi, s)
    total = jnp.sum(jnp.where(keep, s, 0.0), axis=0)
    return (total / jnp.maximum(hi - lo, 1).astype(s.dtype)).astype(dtype)


def median(uploads: PyTree, valid=None, weights=None) -> tuple[PyTree, jax.Array]:
    """Coordinate-wise median of the k valid uploads (Yin et al. 2018, Definition 1): the value of rank (k − 1)/2,
    or for even k the mean of ranks k/2 − 1 and k/2. Unweighted (R2). ``selected``: the valid slots (1.0)."""
    v = _valid(uploads, valid)
    k = jnp.sum(v)
    lo, hi = (k - 1) // 2, k // 2

    def leaf(x):
        s = _sorted_valid(x, v)
        return ((jnp.take(s, jnp.maximum(lo, 0), axis=0) + jnp.take(s, hi, axis=0)) / 2).astype(x.dtype)

    out = jax.tree.map(leaf, uploads)
    return T.where(k > 0, out, _zeros(uploads)), v.astype(jnp.float32)


def _trim_count(beta, k):
    """b = ⌊β·k⌋, with β·k evaluated in float32 plus 1e-4 so that a decimal β trims what its decimal says
    (0.21·300 is 62.999996 in float32), and at most ⌊(k − 1)/2⌋ so that one value (odd k) or two (even k) are
    left: a β that would trim every valid value at run time gives the median."""
    b = jnp.floor(jnp.asarray(beta, jnp.float32) * k + 1e-4).astype(jnp.int32)
    return jnp.maximum(jnp.minimum(b, (k - 1) // 2), 0)


def trimmed_mean(uploads: PyTree, valid=None, weights=None, *, beta) -> tuple[PyTree, jax.Array]:
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Definition 2): per coordinate, drop the b = ⌊βk⌋ largest
    and b smallest of the k valid values and average the k − 2b others (unweighted, R2). ``beta`` may be traced;
    :func:`check_trimmed_mean` refuses a β that trims all n slots, and a β that would trim all k valid values at run
    time (2⌊βk⌋ ≥ k) gives the median. ``selected``: the valid slots (1.0)."""
    v = _valid(uploads, valid)
    k = jnp.sum(v)
    b = _trim_count(beta, k)
    out = jax.tree.map(lambda x: _mean_of_ranks(_sorted_valid(x, v), b, k - b, x.dtype), uploads)
    return out, v.astype(jnp.float32)


# ------------------------------------------------------------------------------------------ Krum and Bulyan


def _krum_f(f, k, factor):
    """f' = max(0, min(f, ⌊(k − 3)/factor⌋)): the largest f ≤ the given one that k valid uploads admit
    (Krum: k ≥ 2f + 3, factor 2; Bulyan: k ≥ 4f + 3, factor 4)."""
    return jnp.maximum(0, jnp.minimum(jnp.asarray(f, jnp.int32), (k - 3) // factor))


def _scores(d2, active, f):
    """Krum scores of the ``active`` uploads among themselves: the sum of the m = max(r − f − 2, 1) smallest
    squared distances to the r − 1 other active uploads (r = Σ active); +∞ for inactive slots."""
    n = d2.shape[0]
    r = jnp.sum(active)
    m = jnp.minimum(jnp.maximum(r - f - 2, 1), r - 1)
    others = active[None, :] & active[:, None] & ~jnp.eye(n, dtype=bool)
    nearest = jnp.sort(jnp.where(others, d2, jnp.inf), axis=1)
    score = jnp.sum(jnp.where(jnp.arange(n)[None, :] < m, nearest, 0.0), axis=1)
    return jnp.where(active, score, jnp.inf)


def krum_scores(uploads: PyTree, valid=None, weights=None, *, f) -> jax.Array:
    """``[n]`` Krum scores (Blanchard et al. 2017, Section 4): score(i) = Σ of the k − f' − 2 smallest ‖u_i − u_j‖²
    over the other valid uploads j (at least one), f' the largest f ≤ ``f`` that k admits (k ≥ 2f' + 3); +∞ for
    invalid slots."""
    v = _valid(uploads, valid)
    return _scores(pairwise_sq_dists(uploads, v), v, _krum_f(f, jnp.sum(v), 2))


def _take(uploads: PyTree, i) -> PyTree:
    return jax.tree.map(lambda x: jnp.take(x, i, axis=0), uploads)


def krum(uploads: PyTree, valid=None, weights=None, *, f) -> tuple[PyTree, jax.Array]:
    """The valid upload of least Krum score (:func:`krum_scores`; ties to the lower slot), unweighted (R2).
    Needs n ≥ 2f + 3 (:func:`check_krum`). ``selected``: its one-hot."""
    v = _valid(uploads, valid)
    best = jnp.argmin(krum_scores(uploads, v, f=f))
    any_valid = jnp.any(v)
    out = T.where(any_valid, _take(_clean(uploads, v), best), _zeros(uploads))
    return out, ((jnp.arange(v.shape[0]) == best) & any_valid).astype(jnp.float32)


def multi_krum(uploads: PyTree, valid=None, weights=None, *, f, m=None) -> tuple[PyTree, jax.Array]:
    """Multi-Krum (Blanchard et al. 2017, Section 5): the unweighted mean of the m valid uploads of least Krum score
    (scores computed once; ties to the lower slot). m = k − f by default; a given m larger than k takes all k; at
    least one is averaged when k > 0. ``selected``: 1/m on the m picked."""
    v = _valid(uploads, valid)
    k = jnp.sum(v)
    count = k - jnp.asarray(f, jnp.int32) if m is None else jnp.asarray(m, jnp.int32)
    count = jnp.minimum(jnp.maximum(count, 1), k)
    picked = (_rank_order(krum_scores(uploads, v, f=f)) < count) & v
    share = _share(picked, count)
    return _combine(_clean(uploads, v), share), share


def bulyan(uploads: PyTree, valid=None, weights=None, *, f) -> tuple[PyTree, jax.Array]:
    """Bulyan over Krum (El Mhamdi et al. 2018, Section 4): pick θ = k − 2f' uploads by Krum applied recursively
    (each pick removed, the rest scored again), then per coordinate average the β = θ − 2f' picked values closest
    to the picks' coordinate-wise median (mean of the two middle values for even θ). f' = f when k ≥ 4f + 3, else
    the largest f' that k admits (f' = 0: the unweighted mean of the valid uploads). Unweighted (R2).
    ``selected``: 1/θ on the θ uploads of the Krum stage."""
    v = _valid(uploads, valid)
    n, k = v.shape[0], jnp.sum(v)
    f = _krum_f(f, k, 4)
    theta = k - 2 * f
    d2 = pairwise_sq_dists(uploads, v)

    def pick(t, picked):
        i = jnp.argmin(_scores(d2, v & ~picked, f))
        return picked | ((jnp.arange(n) == i) & (t < theta))

    picked = jax.lax.fori_loop(0, n, pick, jnp.zeros(n, bool))
    med, _ = median(uploads, picked)
    beta = theta - 2 * f

    def leaf(x, mid):
        x = x.astype(_acc(x))
        p = picked.reshape((-1,) + (1,) * (x.ndim - 1))
        dist = jnp.where(p, jnp.abs(x - mid.astype(x.dtype)), jnp.inf)
        _, closest = jax.lax.sort((dist, jnp.where(p, x, 0.0)), dimension=0, num_keys=1)
        return closest

    out = jax.tree.map(lambda x, mid: _mean_of_ranks(leaf(x, mid), 0, beta, x.dtype), uploads, med)
    return out, _share(picked, theta)


# ---------------------------------------------------------------------------------------- norm-based rules


def geometric_median(uploads: PyTree, valid=None, weights=None, *, iters=3, nu=1e-6) -> tuple[PyTree, jax.Array]:
    """RFA's smoothed Weiszfeld (Pillutla et al. 2022, Algorithm 2): from v = Σ p_i u_i / Σ p_i, ``iters`` times
    β_i = p_i / max(ν, ‖v − u_i‖), v ← Σ β_i u_i / Σ β_i over the valid uploads (p = ``weights``, None: uniform).
    ``iters`` is a Python int; ν may be traced. ``selected``: the last iteration's β_i / Σ β_j."""
    v = _valid(uploads, valid)
    p = jnp.where(v, 1.0 if weights is None else jnp.asarray(weights, jnp.float32), 0.0).astype(jnp.float32)
    clean = _clean(uploads, v)
    z, _ = mean(clean, None, p)
    share = p / jnp.maximum(jnp.sum(p), jnp.finfo(jnp.float32).tiny)
    for _ in range(iters):
        dist = jnp.sqrt(row_sq_norms(jax.tree.map(lambda x, c: x - c[None], clean, z)))
        beta = p / jnp.maximum(nu, dist)
        share = beta / jnp.maximum(jnp.sum(beta), jnp.finfo(jnp.float32).tiny)
        z = _combine(clean, share)
    return z, share.astype(jnp.float32)


def centered_clip(uploads: PyTree, valid=None, weights=None, *, v0: PyTree, tau, iters=1) -> tuple[PyTree,
                                                                                                 jax.Array]:
    """Centered clipping (Karimireddy et al. 2021, Eq. 2): ``iters`` (L) times
    v ← v + (1/k) Σ_{i valid} (u_i − v)·min(1, τ/‖u_i − v‖), from ``v0`` (the previous round's aggregate, kept by the
    caller as server state). Unweighted (R2); τ may be traced, ``iters`` is a Python int; a zero difference is kept
    as it is. ``selected``: 1/k on the valid slots."""
    v = _valid(uploads, valid)
    k = jnp.sum(v)
    clean = _clean(uploads, v)
    z = jax.tree.map(lambda x, c: jnp.asarray(c).astype(x.dtype), clean, v0)
    for _ in range(iters):
        diff = jax.tree.map(lambda x, c: x - c[None], clean, z)
        norm = jnp.sqrt(row_sq_norms(diff))
        scale = jnp.where(norm > tau, tau / jnp.where(norm > 0, norm, 1.0), 1.0)
        step = _combine(diff, _share(v, k) * scale)
        z = jax.tree.map(lambda c, s: (c + s).astype(c.dtype), z, step)
    return z, _share(v, k)


def norm_bound(uploads: PyTree, valid=None, weights=None, *, bound) -> tuple[PyTree, jax.Array]:
    """Norm bounding (Sun et al. 2019, Section 3): u_i ← u_i·min(1, M/‖u_i‖), then the weighted mean Σ p_i u_i / Σ p_i
    over the valid uploads (``weights`` p, None: uniform). An upload within the bound enters as it is. ``bound`` (M)
    may be traced. ``selected``: 1/k on the valid slots."""
    v = _valid(uploads, valid)
    clean = _clean(uploads, v)
    norm = jnp.sqrt(row_sq_norms(clean))
    scale = jnp.where(norm > bound, bound / jnp.where(norm > 0, norm, 1.0), 1.0)
    clipped = jax.tree.map(lambda x: jnp.where(
        (scale < 1).reshape((-1,) + (1,) * (x.ndim - 1)),
        (x * scale.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)), x), clean)
    out, _ = mean(clipped, v, weights)
    return out, _share(v, jnp.sum(v))


def fltrust(uploads: PyTree, valid=None, weights=None, *, g0: PyTree) -> tuple[PyTree, jax.Array]:
    """FLTrust (Cao et al. 2021, Eqs. 2–4): TS_i = ReLU(cos(u_i, g₀)), ū_i = u_i·‖g₀‖/‖u_i‖, and the output
    Σ_i TS_i ū_i / Σ_j TS_j over the valid uploads (unweighted, R2), g₀ the server's own update on its root data
    (computed by the caller). A zero upload has TS = 0. When Σ TS = 0 the output is g₀ itself (the paper's quotient
    is 0/0; g₀ is the one update the server trusts). ``selected``: TS_i / Σ_j TS_j (all zero when Σ TS = 0)."""
    v = _valid(uploads, valid)
    clean = _clean(uploads, v)
    norms = jnp.sqrt(row_sq_norms(clean))
    g0_norm = T.norm(jax.tree.map(lambda x: x.astype(_acc(x)), g0))
    cos = row_dots(clean, g0) / jnp.where((norms > 0) & (g0_norm > 0), norms * g0_norm, 1.0)
    ts = jnp.where(v, jnp.maximum(cos, 0.0), 0.0)
    total = jnp.sum(ts)
    share = ts / jnp.where(total > 0, total, 1.0)
    out = _combine(clean, share * g0_norm / jnp.where(norms > 0, norms, 1.0))
    g0 = jax.tree.map(lambda a, b: b.astype(a.dtype), out, g0)
    return T.where(total > 0, out, g0), share.astype(jnp.float32)


RULES: dict[str, Callable] = {
    "mean": mean, "median": median, "trimmed_mean": trimmed_mean, "krum": krum, "multi_krum": multi_krum,
    "bulyan": bulyan, "geometric_median": geometric_median, "centered_clip": centered_clip,
    "norm_bound": norm_bound, "fltrust": fltrust,
}


# ------------------------------------------------------------------------------------------ host-side checks


def _check_f(f, n: int, need: int, rule: str) -> None:
    """f a non-negative int with n ≥ need·f + 3."""
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise OptionError("f", f"must be a non-negative integer (the number of malicious uploads {rule} tolerates), "
                               f"got {f!r}.")
    if n < need * f + 3:
        raise OptionError("f", f"{rule} needs a cohort of n ≥ {need}f + 3 = {need * f + 3} uploads, got n = {n}; "
                               f"lower f to at most {max((n - 3) // need, 0)} or sample more clients.")


def check_trimmed_mean(n: int, beta) -> None:
    """β ∈ [0, ½) with 2⌊βn⌋ < n (something is left to average)."""
    if not (isinstance(beta, (int, float)) and 0 <= beta):
        raise OptionError("beta", f"must be a number in [0, 0.5), got {beta!r}.")
    if 2 * math.floor(beta * n + 1e-9) >= n:
        raise OptionError("beta", f"={beta} trims 2⌊βn⌋ = {2 * math.floor(beta * n + 1e-9)} of n = {n} uploads, "
                                  f"leaving none to average; use β < 0.5.")


def check_krum(n: int, f) -> None:
    """Krum needs n ≥ 2f + 3."""
    _check_f(f, n, 2, "krum")


def check_multi_krum(n: int, f, m=None) -> None:
    """Multi-Krum needs n ≥ 2f + 3 and 1 ≤ m ≤ n − f."""
    _check_f(f, n, 2, "multi_krum")
    if m is not None and not (isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= n - f):
        raise OptionError("m", f"must be an integer between 1 and n − f = {n - f} (the uploads averaged), got {m!r}.")


def check_bulyan(n: int, f) -> None:
    """Bulyan needs n ≥ 4f + 3."""
    _check_f(f, n, 4, "bulyan")


def check_geometric_median(n: int, iters=3, nu=1e-6) -> None:
    """At least one Weiszfeld iteration and a positive smoothing ν."""
    if not (isinstance(iters, int) and not isinstance(iters, bool) and iters >= 1):
        raise OptionError("iters", f"must be an integer ≥ 1 (Weiszfeld iterations), got {iters!r}.")
    if not (isinstance(nu, (int, float)) and nu > 0):
        raise OptionError("nu", f"must be a positive number (the smoothing of RFA's Weiszfeld weights), got {nu!r}.")


def check_centered_clip(n: int, tau, iters=1) -> None:
    """A positive clipping radius τ and at least one iteration."""
    if not (isinstance(tau, (int, float)) and tau > 0):
        raise OptionError("tau", f"must be a positive number (the clipping radius), got {tau!r}.")
    if not (isinstance(iters, int) and not isinstance(iters, bool) and iters >= 1):
        raise OptionError("iters", f"must be an integer ≥ 1 (clipping iterations), got {iters!r}.")


def check_norm_bound(n: int, bound) -> None:
    """A positive norm bound M."""
    if not (isinstance(bound, (int, float)) and bound > 0):
        raise OptionError("bound", f"must be a positive number (the norm each upload is clipped to), got {bound!r}.")


RUN_TIME = ("v0", "g0")  # arguments the caller computes each round, not options

_CHECKS = {"trimmed_mean": check_trimmed_mean, "krum": check_krum, "multi_krum": check_multi_krum,
           "bulyan": check_bulyan, "geometric_median": check_geometric_median,
           "centered_clip": check_centered_clip, "norm_bound": check_norm_bound}


def check_rule(rule: str, n: int, **options) -> None:
    """Refuse a rule name, or options impossible for a cohort buffer of ``n`` uploads (host-side, Python values),
    with a one-line :class:`~fljax.errors.OptionError`. ``v0`` and ``g0`` are run-time values, not checked here."""
    if rule not in RULES:
        raise OptionError("rule", f"unknown robust aggregation rule {rule!r}; choose one of {', '.join(RULES)}.")
    params = [p for p in inspect.signature(RULES[rule]).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name not in RUN_TIME]
    known = [p.name for p in params]
    for key in options:
        if key not in known:
            raise OptionError(key, f"is not an option of the {rule} rule; its options: {', '.join(known) or 'none'}.")
    for p in params:
        if p.default is p.empty and p.name not in options:
            raise OptionError(p.name, f"is required by the {rule} rule; give it a value.")
    if rule in _CHECKS:
        _CHECKS[rule](n, **options)
