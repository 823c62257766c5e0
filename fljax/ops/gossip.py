"""Mixing matrices, topologies and gossip over the leading client axis (DFedAlt §2, §10; FedGiA (11)).

Convention: **row i = receiver**, ``u_i ← Σ_l W[i,l] z_l``, and every node is its own neighbour. DFedAlt
Definition 1 asks for W ∈ [0,1]^{m×m} with w_ij > 0 iff (i,j) is an edge or i = j, W = Wᵀ, null(I − W) = span{1} and
I ⪰ W ≻ −I (hence doubly stochastic); λ = max(|λ₂|, |λ_m|), spectral gap 1 − λ, ‖W^t − 11ᵀ/m‖ ≤ λ^t.

A topology is a small frozen dataclass with ``sample(key) -> Mixing``; static topologies ignore the key and build W
once, random ones (``random_k``, ``random_k_mh``, ``erdos_renyi``) redraw it from the key inside ``jit`` with static
shapes, so one compilation serves every round.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fljax.ops.partition import as_leaf_mask

PyTree = Any
HIGHEST = jax.lax.Precision.HIGHEST

__all__ = [
    "Mixing", "surviving", "Ring", "Torus", "GridOffsets", "Exponential", "Complete", "RandomK", "RandomKMH", "ErdosRenyi",
    "Identity", "TOPOLOGIES", "make_topology", "metropolis_hastings", "is_row_stochastic", "is_column_stochastic",
    "is_doubly_stochastic", "is_symmetric", "is_connected", "MIXING_PROPERTIES", "check_mixing", "spectral_gap", "contraction", "gossip", "gossip_gather",
    "consensus_distance",
]


@struct.dataclass
class Mixing:
    """A round's mixing matrix: dense ``W`` [m, m] float32 and, where the degree is static, the neighbour-gather form
    ``idx`` [m, s] int32 / ``wts`` [m, s] with ``W[i, idx[i, s]] = wts[i, s]`` summed over slots (padding slots carry
    weight 0)."""

    W: Any
    idx: Any = None
    wts: Any = None


def _gather_form(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host-side: the padded neighbour lists of a dense W (padding points at the node itself with weight 0)."""
    m = w.shape[0]
    nbrs = [np.flatnonzero(w[i]) for i in range(m)]
    s = max(len(n) for n in nbrs)
    idx = np.tile(np.arange(m)[:, None], (1, s)).astype(np.int32)
    wts = np.zeros((m, s), np.float32)
    for i, n in enumerate(nbrs):
        idx[i, :len(n)] = n
        wts[i, :len(n)] = w[i, n]
    return idx, wts


def _static_mixing(w: np.ndarray) -> Mixing:
    idx, wts = _gather_form(w)
    return Mixing(W=jnp.asarray(w, jnp.float32), idx=jnp.asarray(idx), wts=jnp.asarray(wts))


def _uniform_from_neighbours(m: int, offsets) -> np.ndarray:
    """Circulant W with 1/(deg+1) on {i} ∪ {i + o mod m : o ∈ offsets} (offsets deduplicated, self removed)."""
    offs = sorted({o % m for o in offsets} - {0})
    w = np.eye(m)
    for o in offs:
        w[np.arange(m), (np.arange(m) + o) % m] = 1.0
    return w / (len(offs) + 1)


def metropolis_hastings(adjacency):
    """Metropolis–Hastings weights of an undirected graph (DFedAlt §2): w_ij = 1/(1 + max(d_i, d_j)) on edges,
    w_ii = 1 − Σ_{j≠i} w_ij. Symmetric and doubly stochastic; satisfies Definition 1 on a connected graph.
    Jittable; the diagonal of ``adjacency`` is ignored."""
    a = jnp.asarray(adjacency, jnp.float32)
    a = a * (1 - jnp.eye(a.shape[0], dtype=a.dtype))
    deg = jnp.sum(a, axis=1)
    off = a / (1 + jnp.maximum(deg[:, None], deg[None, :]))
    return off + jnp.diag(1 - jnp.sum(off, axis=1))


def surviving(mixing: Mixing, key, link_failure=0.0, available=None) -> Mixing:
    """A time-varying round's mixing matrix (heterogeneity spec, "Decentralized"): the undirected graph of
    ``mixing`` (a link i–j where W_ij > 0 or W_ji > 0, i ≠ j) with each link failing independently with probability
    ``link_failure`` (one draw per link from ``key``) and every link of a node that ``available`` ([m] bool; None:
    all) marks unavailable removed, re-weighted by Metropolis–Hastings (:func:`metropolis_hastings`): symmetric and
    doubly stochastic, w_ii = 1 for a node left without links (it keeps its model). Dense form; jittable."""
    w = mixing.W
    m = w.shape[0]
    links = ((w > 0) | (w.T > 0)) & ~jnp.eye(m, dtype=bool)
    up = jnp.triu(jax.random.uniform(key, (m, m)) >= link_failure, k=1)
    links = links & (up | up.T)
    if available is not None:
        links = links & available[:, None] & available[None, :]
    return Mixing(W=metropolis_hastings(links))


class _Topology:
    name = ""
    static = True

    def sample(self, key=None) -> Mixing:
        """The mixing matrix (static topologies ignore ``key``)."""
        return _static_mixing(self.dense())

    def dense(self) -> np.ndarray:
        """The static mixing matrix as a float64 numpy array (host side)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Ring(_Topology):
    """Ring: neighbours i ± 1 mod m, weights 1/3 (m ≥ 3). 1 − λ = 2(1 − cos(2π/m))/3."""

    m: int
    name = "ring"

    def __post_init__(self):
        if self.m < 3:
            raise ValueError(f"ring needs m >= 3, got {self.m}")

    def dense(self):
        return _uniform_from_neighbours(self.m, (1, -1))


@dataclasses.dataclass(frozen=True)
class Torus(_Topology):
    """2-D torus r × c (r = largest divisor of m ≤ √m unless ``rows`` is given; error if r < 3): neighbours
    (row ± 1, col), (row, col ± 1) with wrap-around, MH weights (= 1/5). Eigenvalues
    (1 + 2cos(2πa/r) + 2cos(2πb/c))/5 (DFedAlt D3)."""

    m: int
    rows: int | None = None
    name = "torus"

    def shape(self) -> tuple[int, int]:
        """(r, c) of the torus layout."""
        r = self.rows or max(d for d in range(1, math.isqrt(self.m) + 1) if self.m % d == 0)
        if self.m % r or r < 3 or self.m // r < 3:
            raise ValueError(f"torus needs m = r*c with r, c >= 3; got m={self.m}, rows={r}")
        return r, self.m // r

    def dense(self):
        r, c = self.shape()
        a = np.zeros((self.m, self.m))
        for i in range(self.m):
            row, col = divmod(i, c)
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                a[i, ((row + dr) % r) * c + (col + dc) % c] = 1.0
        return np.asarray(metropolis_hastings(a), np.float64)


@dataclasses.dataclass(frozen=True)
class GridOffsets(_Topology):
    """Circulant 'grid' of the reference code: neighbours i ± o mod m for o in ``offsets`` (default ±1, ±9),
    weights 1/(deg+1) (= 1/5). Symmetric, doubly stochastic; not a torus."""

    m: int
    offsets: tuple = (1, 9)
    name = "grid_offsets"

    def dense(self):
        return _uniform_from_neighbours(self.m, tuple(self.offsets) + tuple(-o for o in self.offsets))


@dataclasses.dataclass(frozen=True)
class Exponential(_Topology):
    """Exponential graph: neighbours i ± 2^j mod m, j = 0..⌊log₂(m−1)⌋, deduplicated, weights 1/(deg+1).
    ``one_sided=True`` uses i + 2^j only (reference code): doubly stochastic but not symmetric."""

    m: int
    one_sided: bool = False

    @property
    def name(self):
        return "exp_onesided" if self.one_sided else "exp"

    def dense(self):
        hops = [2 ** j for j in range(int(math.floor(math.log2(self.m - 1))) + 1)] if self.m > 1 else []
        return _uniform_from_neighbours(self.m, hops if self.one_sided else hops + [-h for h in hops])


@dataclasses.dataclass(frozen=True)
class Complete(_Topology):
    """Complete graph, W = 11ᵀ/m (one gossip step = exact averaging, FedGiA (11)); 1 − λ = 1."""

    m: int
    name = "full"

    def dense(self):
        return np.full((self.m, self.m), 1.0 / self.m)


@dataclasses.dataclass(frozen=True)
class Identity(_Topology):
    """No communication, W = I (Local training; tests)."""

    m: int
    name = "identity"

    def dense(self):
        return np.eye(self.m)


def _random_k_choice(key, m: int, k: int):
    """[m, k] uniformly random k-subsets of the other nodes, one per row.

    Floyd's algorithm (Bentley & Floyd 1987) vectorised over rows: for j = n−k, …, n−1 (n = m − 1) draw t uniform in
    {0, …, j} and take t, or j when t is already taken; then skip the node itself (v ↦ v + [v ≥ i]). O(m·k²) work, so a
    draw stays linear in m and the neighbour-gather gossip keeps its O(m·k·d) advantage; row-wise top-k scores of an
    [m, m] uniform matrix (the DFedAlt spec's construction, the same distribution, D2) cost O(m²) every round."""
    n = m - 1

    def take(s, chosen):
        j = n - k + s
        t = jax.random.randint(jax.random.fold_in(key, s), (m,), 0, j + 1)
        return chosen.at[:, s].set(jnp.where(jnp.any(chosen == t[:, None], axis=1), j, t).astype(chosen.dtype))

    chosen = jax.lax.fori_loop(0, k, take, jnp.full((m, k), -1, jnp.int32))
    return chosen + (chosen >= jnp.arange(m)[:, None])


@dataclasses.dataclass(frozen=True)
class RandomK(_Topology):
    """Each node receives from k distinct uniformly drawn others, redrawn every round; W = (one-hots + I)/(k+1).
    Row-stochastic only (directed), as the reference code (DFedAlt D1)."""

    m: int
    k: int = 10
    name = "random_k"
    static = False

    def __post_init__(self):
        if not 0 <= self.k < self.m:
            raise ValueError(f"random_k needs 0 <= k < m, got k={self.k}, m={self.m}")

    def sample(self, key) -> Mixing:
        chosen = _random_k_choice(key, self.m, self.k)
        idx = jnp.concatenate([jnp.arange(self.m, dtype=chosen.dtype)[:, None], chosen], axis=1).astype(jnp.int32)
        w = jnp.zeros((self.m, self.m)).at[jnp.arange(self.m)[:, None], idx].add(1.0) / (self.k + 1)
        return Mixing(W=w, idx=idx, wts=jnp.full(idx.shape, 1.0 / (self.k + 1)))


@dataclasses.dataclass(frozen=True)
class RandomKMH(_Topology):
    """The :class:`RandomK` draw symmetrised (A ∨ Aᵀ, degree ≈ 2k) with MH weights: satisfies Definition 1 when the
    drawn graph is connected. Dense form only."""

    m: int
    k: int = 10
    name = "random_k_mh"
    static = False

    def sample(self, key) -> Mixing:
        chosen = _random_k_choice(key, self.m, self.k)
        a = jnp.zeros((self.m, self.m)).at[jnp.arange(self.m)[:, None], chosen].set(1.0)
        return Mixing(W=metropolis_hastings(jnp.maximum(a, a.T)))


@dataclasses.dataclass(frozen=True)
class ErdosRenyi(_Topology):
    """Erdős–Rényi G(m, p) with MH weights, p = k/(m−1) when only ``k`` is given. Redrawn from the key every round;
    with ``redraw=False`` one graph is drawn from ``seed`` and reused. A disconnected draw has 1 − λ = 0."""

    m: int
    p: float | None = None
    k: int | None = None
    redraw: bool = True
    seed: int = 0
    name = "erdos_renyi"

    def __post_init__(self):
        if self.p is None and self.k is None:
            raise ValueError("erdos_renyi needs p or k")

    @property
    def static(self):
        return not self.redraw

    def sample(self, key=None) -> Mixing:
        p = self.p if self.p is not None else self.k / (self.m - 1)
        key = key if self.redraw else jax.random.PRNGKey(self.seed)
        upper = jnp.triu(jax.random.uniform(key, (self.m, self.m)) < p, k=1).astype(jnp.float32)
        return Mixing(W=metropolis_hastings(upper + upper.T))


_REGISTRY = {  # name: (builder(m, **kw), one-line summary)
    "ring": (Ring, "ring i±1, weights 1/3 (static)"),
    "torus": (Torus, "2-D r×c torus, MH weights = 1/5 (static; rows=)"),
    "grid_offsets": (GridOffsets, "circulant i±1, i±9, weights 1/5 (static; offsets=)"),
    "exp": (Exponential, "exponential graph i±2^j, 1/(deg+1) (static)"),
    "exp_onesided": (lambda m, **kw: Exponential(m, one_sided=True, **kw),
                     "one-sided exponential i+2^j, not symmetric (static)"),
    "full": (Complete, "complete graph, W = 11ᵀ/m (static)"),
    "random_k": (RandomK, "k random in-neighbours per node, 1/(k+1), row-stochastic (redrawn; k=)"),
    "random_k_mh": (RandomKMH, "random_k symmetrised, MH weights (redrawn; k=)"),
    "erdos_renyi": (ErdosRenyi, "Erdős–Rényi G(m, p), MH weights (redrawn; p= or k=, redraw=)"),
    "identity": (Identity, "no communication, W = I (static)"),
}
TOPOLOGIES = {name: summary for name, (_, summary) in _REGISTRY.items()}


def make_topology(name: str, m: int, **kw):
    """Build a topology by name (the keys of ``TOPOLOGIES``, which maps each name to a one-line summary), e.g.
    ``make_topology("random_k", 100, k=10)``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown topology {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name][0](m, **kw)


# ------------------------------------------------------------------------------------------- validators (host)


def _np(w) -> np.ndarray:
    return np.asarray(w.W if isinstance(w, Mixing) else w, np.float64)


def is_row_stochastic(w, atol: float = 1e-6) -> bool:
    """W ≥ 0 and W1 = 1."""
    w = _np(w)
    return bool(np.all(w >= -atol) and np.allclose(w.sum(1), 1, atol=atol))


def is_column_stochastic(w, atol: float = 1e-6) -> bool:
    """W ≥ 0 and 1ᵀW = 1ᵀ."""
    return is_row_stochastic(_np(w).T, atol)


def is_doubly_stochastic(w, atol: float = 1e-6) -> bool:
    """Row and column stochastic (then the client mean is preserved by gossip)."""
    return is_row_stochastic(w, atol) and is_column_stochastic(w, atol)


def is_symmetric(w, atol: float = 1e-6) -> bool:
    """W = Wᵀ."""
    w = _np(w)
    return bool(np.allclose(w, w.T, atol=atol))


def is_connected(w) -> bool:
    """Strong connectivity of the graph {(i, l): W[i,l] > 0} (= connectivity for a symmetric W): every node's
    value reaches every other node under repeated gossip."""
    a = _np(w) > 0

    def reaches_all(adj):
        seen = np.zeros(len(adj), bool)
        seen[0] = True
        frontier = seen.copy()
        while frontier.any():
            frontier = adj[frontier].any(axis=0) & ~seen
            seen |= frontier
        return bool(seen.all())

    return reaches_all(a) and reaches_all(a.T)


MIXING_PROPERTIES = {
    "row_stochastic": is_row_stochastic, "column_stochastic": is_column_stochastic,
    "doubly_stochastic": is_doubly_stochastic, "symmetric": is_symmetric, "connected": is_connected,
}


def check_mixing(w, require=("row_stochastic", "connected"), atol: float = 1e-6) -> None:
    """Raise a one-line ValueError naming every property of ``require`` (keys of ``MIXING_PROPERTIES``) that the
    mixing matrix W (an array or a :class:`Mixing`) lacks; host-side. The default asks what gossip needs to reach
    consensus, W ≥ 0, W1 = 1 and a strongly connected graph; DFedAlt Definition 1 adds ``symmetric`` and
    ``doubly_stochastic``."""
    unknown = [r for r in require if r not in MIXING_PROPERTIES]
    if unknown:
        raise ValueError(f"unknown mixing properties {unknown}; valid: {', '.join(MIXING_PROPERTIES)}")
    failed = [r for r in require
              if not (is_connected(w) if r == "connected" else MIXING_PROPERTIES[r](w, atol))]
    if failed:
        raise ValueError(f"the {_np(w).shape[0]}-node mixing matrix is not: {', '.join(failed)} "
                         f"(required: {', '.join(require)})")


def spectral_gap(w):
    """1 − max(|λ₂|, |λ_m|) of a symmetric W (``eigvalsh``; jittable). DFedAlt Definition 1, Thm 1."""
    ev = jnp.linalg.eigvalsh(jnp.asarray(w.W if isinstance(w, Mixing) else w))
    return 1 - jnp.maximum(jnp.abs(ev[-2]), jnp.abs(ev[0]))


def contraction(w):
    """‖W − 11ᵀ/m‖₂, the per-step contraction of consensus error for a doubly stochastic (possibly non-symmetric) W."""
    w = jnp.asarray(w.W if isinstance(w, Mixing) else w)
    return jnp.linalg.norm(w - 1.0 / w.shape[0], ord=2)


# ----------------------------------------------------------------------------------------------------- gossip


def _on_selected(fn, tree: PyTree, mask) -> PyTree:
    mask = as_leaf_mask(tree, mask)
    return jax.tree.map(lambda m, x: fn(x) if m else x, mask, tree)


def gossip(w, tree: PyTree, mask=None) -> PyTree:
    """u_i ← Σ_l W[i,l] u_l for every leaf with a leading client axis (``einsum('il,l...->i...')`` at HIGHEST
    precision, so float32 means are exact enough on TF32 hardware). DFedAlt Alg. 1 line "u_i^{t+1} = Σ W z_l".

    ``w`` is a [m, m] array or a :class:`Mixing`. ``mask`` (a leaf mask, a path regex or a predicate) restricts the
    gossip to the selected (shared) leaves; the others are returned untouched (bit-identical)."""
    w = w.W if isinstance(w, Mixing) else w

    def mix(x):
        return jnp.einsum("il,l...->i...", w.astype(x.dtype), x, precision=HIGHEST)

    return _on_selected(mix, tree, mask)


def gossip_gather(idx, wts, tree: PyTree, mask=None) -> PyTree:
    """Neighbour-gather gossip, u_i ← Σ_s wts[i,s] · u_{idx[i,s]}: a ``fori_loop`` over the s slots, so memory stays
    O(m·d) (a one-shot ``x[idx]`` would hold m·s·d). Equals :func:`gossip` with the matching dense W."""

    def mix(x):
        def body(s, acc):
            wt = wts[:, s].astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
            return acc + wt * jnp.take(x, idx[:, s], axis=0)

        return jax.lax.fori_loop(0, idx.shape[1], body, jnp.zeros_like(x))

    return _on_selected(mix, tree, mask)


def consensus_distance(tree: PyTree):
    """CD = (1/m) Σ_i ‖u_i − ū‖² over all leaves (client axis leading); DFedAlt Lemmas 5–6."""
    sq = [jnp.sum(jnp.square(x - jnp.mean(x, axis=0))) / x.shape[0] for x in jax.tree.leaves(tree)]
    return sum(sq[1:], sq[0]) if sq else jnp.zeros(())
