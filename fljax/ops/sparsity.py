"""Sparse entry masks: ERK layer densities, random masks and magnitude-prune / regrow (DisPFL; DFedAlt spec §7, D24).

Masks are trees of boolean arrays shaped like the parameters. Only *maskable* leaves (``ndim >= 2``: dense and
convolution kernels) are ever sparse; biases and normalisation parameters keep all-True masks, so mask arithmetic is
uniform over the tree.

* :func:`erk_densities` — Erdős–Rényi-Kernel densities (Evci et al. 2020, used by DisPFL): layer l gets density
  ε·(Σ_j s_lj)/(Π_j s_lj) for its shape s_l, with one ε chosen so that the kept entries are ``density`` of all
  maskable entries; a layer whose density would exceed 1 stays dense and ε is re-solved for the others.
* :func:`random_masks` — per layer exactly round(d_l·n_l) entries kept, chosen uniformly.
* :func:`prune_regrow` — per layer, drop the k = ⌈a·nnz⌉ active entries of smallest |w|, then regrow k inactive
  entries (uniformly at random, or by largest score such as |gradient|): the count of active entries is unchanged.
  Counts are traced (ranks from :func:`fljax.ops.prox.rank_mask`), so the anneal schedule a_t runs inside ``jit``.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fljax.ops.prox import rank_mask

PyTree = Any

__all__ = ["erk_densities", "layer_densities", "random_masks", "prune_regrow", "anneal_fraction"]


def _maskable(x) -> bool:
    """Whether a leaf can be sparse: kernels (``ndim >= 2``)."""
    return np.ndim(x) >= 2


def erk_densities(shapes: list[tuple[int, ...]], density: float) -> list[float]:
    """ERK densities of the layers with the given shapes, keeping ``density`` of their entries overall (host-side).

    d_l = min(1, ε·Σ(s_l)/Π(s_l)); layers that would exceed 1 are dense and ε is solved again for the rest, so
    Σ_l d_l·n_l = density·Σ_l n_l exactly."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}.")
    sizes = [math.prod(s) for s in shapes]
    raw = [sum(s) / n for s, n in zip(shapes, sizes)]
    dense: set[int] = set()
    while True:
        budget = density * sum(sizes) - sum(sizes[i] for i in dense)
        denom = sum(raw[i] * sizes[i] for i in range(len(shapes)) if i not in dense)
        eps = budget / denom if denom else 0.0
        over = {i for i in range(len(shapes)) if i not in dense and eps * raw[i] > 1}
        if not over:
            return [1.0 if i in dense else eps * raw[i] for i in range(len(shapes))]
        dense |= over


def layer_densities(params: PyTree, density: float, rule: str = "erk") -> PyTree:
    """Per-leaf densities (Python floats): ``rule`` 'erk' or 'uniform' (every maskable leaf at ``density``);
    non-maskable leaves get 1."""
    if rule not in ("erk", "uniform"):
        raise ValueError(f"layer density rule must be 'erk' or 'uniform', got {rule!r}.")
    leaves, treedef = jax.tree.flatten(params)
    idx = [i for i, x in enumerate(leaves) if _maskable(x)]
    out = [1.0] * len(leaves)
    dens = erk_densities([np.shape(leaves[i]) for i in idx], density) if rule == "erk" else [density] * len(idx)
    for i, d in zip(idx, dens):
        out[i] = d
    return jax.tree.unflatten(treedef, out)


def random_masks(key, params: PyTree, densities: PyTree) -> PyTree:
    """Boolean masks keeping exactly round(d·n) uniformly chosen entries of every leaf (all of a dense leaf)."""
    leaves, treedef = jax.tree.flatten(params)
    dens = jax.tree.leaves(densities)
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, x, d in zip(keys, leaves, dens):
        if d >= 1:
            out.append(jnp.ones(np.shape(x), bool))
        else:  # the count is static here, so lax.top_k of uniform scores picks a uniform subset
            keep = jax.lax.top_k(jax.random.uniform(k, (np.size(x),)), int(round(d * np.size(x))))[1]
            out.append(jnp.zeros(np.size(x), bool).at[keep].set(True).reshape(np.shape(x)))
    return jax.tree.unflatten(treedef, out)


def anneal_fraction(round_, total_rounds: int, factor: float = 0.5):
    """DisPFL's cosine-annealed drop fraction a_t = (factor/2)·(1 + cos(π·t/T)) (D24: factor 0.5)."""
    t = jnp.minimum(jnp.asarray(round_, jnp.float32), total_rounds)
    return 0.5 * factor * (1 + jnp.cos(jnp.pi * t / total_rounds))


def prune_regrow(params: PyTree, masks: PyTree, fraction, key, scores: PyTree | None = None) -> PyTree:
    """New masks after one prune/regrow step (per maskable leaf; others returned unchanged).

    k = ⌈fraction·nnz⌉ active entries with the smallest |w| are dropped (ties: lower flat index), then k entries
    among the inactive ones (the just-dropped included) are regrown: uniformly at random, or the largest ``scores``
    (e.g. |∇|) when given. The number of active entries is preserved; ``fraction`` may be traced."""
    leaves, treedef = jax.tree.flatten(params)
    mask_leaves = jax.tree.leaves(masks)
    score_leaves = jax.tree.leaves(scores) if scores is not None else [None] * len(leaves)
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, w, m, s in zip(keys, leaves, mask_leaves, score_leaves):
        if not _maskable(w):
            out.append(m)
            continue
        n_drop = jnp.ceil(fraction * jnp.sum(m)).astype(jnp.int32)
        dropped = rank_mask(jnp.where(m, -jnp.abs(w), -jnp.inf), n_drop)
        kept = m & ~dropped
        grow_score = jax.random.uniform(k, np.shape(w)) if s is None else jnp.abs(s)
        grown = rank_mask(jnp.where(kept, -jnp.inf, grow_score), n_drop)
        out.append(kept | grown)
    return jax.tree.unflatten(treedef, out)
