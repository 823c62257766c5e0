"""Shared / personal parameter partitions, mask arithmetic and mask-aware averaging.

Two kinds of mask appear in fljax:

* **leaf masks**: a pytree with one Python ``bool`` per leaf (built from paths with :func:`mask_from_paths`). They are
  static: they decide *which leaves* an operation touches (the shared body ``u`` vs the personal head ``v`` of DFedAlt,
  FedRep, LG-FedAvg; the quantized leaves of QuPeD).
* **entry masks**: a pytree of boolean/0-1 arrays shaped like the leaves (optionally with a leading client axis), as in
  DisPFL's per-client sparse masks.

:func:`split` / :func:`merge` follow the equinox ``partition``/``combine`` pattern: the part that is not selected holds
``None`` in its slots, so ``jax.grad(lambda u: loss(merge(u, v)))(u)`` differentiates only the shared part.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Union

import jax
import jax.numpy as jnp
import numpy as np

from fljax.tree import map_with_path, paths

PyTree = Any
Selector = Union[str, Callable[[str, Any], bool], bool]

__all__ = [
    "matches", "mask_from_paths", "as_leaf_mask", "split", "merge", "mask_not", "count", "masked_average",
    "selection_problem",
]


def matches(selector: Selector, path: str, leaf) -> bool:
    """Whether a leaf is selected.

    ``selector`` is a regex (``re.search`` against the '/'-joined path, e.g. ``'Dense_1/'`` or ``'kernel$'``), a
    predicate ``(path, leaf) -> bool``, or a plain ``bool`` (select all / nothing).
    """
    if isinstance(selector, bool):
        return selector
    if isinstance(selector, str):
        return re.search(selector, path) is not None
    if callable(selector):
        return bool(selector(path, leaf))
    raise TypeError(f"selector must be a regex string, a predicate (path, leaf) -> bool, or a bool; got {selector!r}")


def selection_problem(selector: Selector, tree: PyTree, selected: str) -> str:
    """The message for a selector that selects ``selected`` ('no' or 'every') leaf of ``tree``, listing the real
    paths to choose from."""
    return (f"{selector!r} selects {selected} parameter of the model, whose parameters are "
            f"{', '.join(paths(tree))}; choose a regex matching part of them (e.g. 'head').")


def mask_from_paths(tree: PyTree, selector: Selector) -> PyTree:
    """Leaf mask: a tree of Python bools, ``True`` where :func:`matches` selects the leaf (paths from
    :func:`fljax.tree.path_str`, e.g. ``params/Dense_1/kernel``)."""
    return map_with_path(lambda p, x: matches(selector, p, x), tree)


def as_leaf_mask(tree: PyTree, mask) -> PyTree:
    """Normalise ``mask`` (``None`` = everything, a selector, or an existing leaf mask tree) to a leaf mask of
    ``tree``."""
    if mask is None:
        return jax.tree.map(lambda _: True, tree)
    if isinstance(mask, (str, bool)) or callable(mask):
        return mask_from_paths(tree, mask)
    return mask


def split(tree: PyTree, mask: PyTree) -> tuple[PyTree, PyTree]:
    """``(selected, rest)``: ``selected`` keeps the leaves where the leaf mask is True and holds ``None`` elsewhere;
    ``rest`` is the complement. ``merge(selected, rest) == tree``. DFedAlt §10 (u/v split)."""
    sel = jax.tree.map(lambda m, x: x if m else None, mask, tree)
    rest = jax.tree.map(lambda m, x: None if m else x, mask, tree)
    return sel, rest


def merge(a: PyTree, b: PyTree) -> PyTree:
    """Inverse of :func:`split`: take each leaf from ``a`` unless it is ``None`` there, else from ``b``."""
    return jax.tree.map(lambda x, y: y if x is None else x, a, b, is_leaf=lambda x: x is None)


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def mask_not(a: PyTree) -> PyTree:
    """Logical NOT of a mask."""
    return jax.tree.map(lambda x: jnp.logical_not(x) if _is_array(x) else (not x), a)


def count(mask: PyTree, tree: PyTree | None = None):
    """Number of selected entries.

    Entry masks: Σ of the mask entries. Leaf masks need ``tree`` and count the entries of the selected leaves
    (a Python int).
    """
    if tree is None:
        leaves = [jnp.sum(jnp.asarray(m, jnp.int32)) for m in jax.tree.leaves(mask)]
        return sum(leaves) if leaves else jnp.zeros((), jnp.int32)
    sizes = jax.tree.map(lambda m, x: (jnp.sum(jnp.broadcast_to(m, np.shape(x)), dtype=jnp.int32) if _is_array(m)
                                       else int(np.prod(np.shape(x))) * bool(m)), mask, tree)
    return sum(jax.tree.leaves(sizes))


def masked_average(values: PyTree, masks: PyTree, adjacency=None) -> PyTree:
    """Mask-aware average over the leading client axis (DisPFL's aggregation, DFedAlt spec §7/§10).

    Without ``adjacency``: per entry ``Σ_i m_i v_i / max(Σ_i m_i, 1)``, returning leaves without the client axis.
    With a ``[C, C]`` 0/1 ``adjacency`` (self included): per receiver i,
    ``ṽ_i = Σ_l A[i,l] m_l v_l / max(Σ_l A[i,l] m_l, 1)`` (the DisPFL gossip, which ignores the mixing weights),
    returning leaves with the client axis. The caller re-applies its own mask (``ṽ_i ⊙ M_i``).

    ``masks`` mirrors ``values``; each leaf is a ``[C]`` per-client leaf flag, or a ``[C, ...]`` entry mask shaped like
    the values (any leading-axes prefix broadcasts).
    """

    def avg(v, m):
        m = jnp.asarray(m, v.dtype)
        m = m.reshape(m.shape + (1,) * (v.ndim - m.ndim))
        mv = m * v
        m = jnp.broadcast_to(m, v.shape)
        if adjacency is None:
            return jnp.sum(mv, axis=0) / jnp.maximum(jnp.sum(m, axis=0), 1)
        a = jnp.asarray(adjacency, v.dtype)
        num = jnp.einsum("il,l...->i...", a, mv, precision=jax.lax.Precision.HIGHEST)
        den = jnp.einsum("il,l...->i...", a, m, precision=jax.lax.Precision.HIGHEST)
        return num / jnp.maximum(den, 1)

    return jax.tree.map(avg, values, masks)
