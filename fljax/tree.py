"""Pytree arithmetic used everywhere in fljax.

Every function here is pure, works on arbitrary pytrees of arrays, and is safe under ``jit`` and ``vmap``.
Functions whose name ends in ``_clients`` treat the *leading* axis of every leaf as the client axis
(the layout of per-client state in :mod:`fljax.engine`).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = [
    "add", "sub", "scale", "axpy", "mul", "neg", "vdot", "sq_norm", "norm", "where", "zeros_like",
    "ones_like", "full_like", "cast", "size", "nbytes", "count_nonzero", "random_normal_like",
    "mean_clients", "sum_clients", "weighted_mean_clients", "masked_mean_clients", "take_clients",
    "put_clients", "broadcast_clients", "num_clients", "stack", "unstack", "ravel", "all_finite",
    "map_with_path", "path_str", "paths", "lerp", "float_dtype",
]


def add(a: PyTree, b: PyTree) -> PyTree:
    """a + b, leaf by leaf."""
    return jax.tree.map(jnp.add, a, b)


def sub(a: PyTree, b: PyTree) -> PyTree:
    """a - b, leaf by leaf."""
    return jax.tree.map(jnp.subtract, a, b)


def mul(a: PyTree, b: PyTree) -> PyTree:
    """Elementwise product a ⊙ b."""
    return jax.tree.map(jnp.multiply, a, b)


def neg(a: PyTree) -> PyTree:
    """-a."""
    return jax.tree.map(jnp.negative, a)


def scale(alpha, a: PyTree) -> PyTree:
    """alpha · a for a scalar alpha (Python or traced)."""
    return jax.tree.map(lambda x: (alpha * x).astype(x.dtype), a)


def axpy(alpha, x: PyTree, y: PyTree) -> PyTree:
    """alpha · x + y (the BLAS name)."""
    return jax.tree.map(lambda a, b: (alpha * a + b).astype(b.dtype), x, y)


def lerp(t, a: PyTree, b: PyTree) -> PyTree:
    """(1 − t) · a + t · b."""
    return jax.tree.map(lambda x, y: ((1 - t) * x + t * y).astype(x.dtype), a, b)


def vdot(a: PyTree, b: PyTree):
    """⟨a, b⟩ summed over all leaves (a scalar)."""
    leaves = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.vdot(x.ravel(), y.ravel()), a, b))
    return sum(leaves) if leaves else jnp.zeros(())


def sq_norm(a: PyTree):
    """‖a‖² over all leaves."""
    leaves = [jnp.sum(jnp.square(x)) for x in jax.tree.leaves(a)]
    return sum(leaves) if leaves else jnp.zeros(())


def norm(a: PyTree):
    """Global Euclidean norm ‖a‖₂ over all leaves."""
    return jnp.sqrt(sq_norm(a))


def where(cond, a: PyTree, b: PyTree) -> PyTree:
    """Select leaf by leaf: ``cond ? a : b``.

    ``cond`` is a scalar, or an array that broadcasts against the *leading* axes of every leaf (for example a
    ``[C]`` client mask against ``[C, ...]`` leaves).
    """
    cond = jnp.asarray(cond)

    def pick(x, y):
        c = cond.reshape(cond.shape + (1,) * (x.ndim - cond.ndim))
        return jnp.where(c, x, y)

    return jax.tree.map(pick, a, b)


def zeros_like(a: PyTree) -> PyTree:
    return jax.tree.map(jnp.zeros_like, a)


def ones_like(a: PyTree) -> PyTree:
    return jax.tree.map(jnp.ones_like, a)


def full_like(a: PyTree, value) -> PyTree:
    return jax.tree.map(lambda x: jnp.full_like(x, value), a)


def cast(a: PyTree, dtype) -> PyTree:
    """Cast every floating leaf to ``dtype``; integer and boolean leaves are left alone."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, a)


def size(a: PyTree) -> int:
    """Total number of entries (a Python int; shapes are static)."""
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(a)))


def float_dtype(a: PyTree):
    """The dtype in which constants for ``a`` are computed: the widest floating dtype of its leaves, at least float32
    (a run's precision: float64 in an x64 run with float64 parameters; float32 for half-precision leaves or none)."""
    dtypes = [jnp.dtype(leaf.dtype) if hasattr(leaf, "dtype") else jnp.result_type(leaf) for leaf in jax.tree.leaves(a)]
    floats = [d for d in dtypes if jnp.issubdtype(d, jnp.floating)]
    return jnp.dtype(jnp.result_type(jnp.float32, *floats))


def nbytes(a: PyTree) -> int:
    """Total bytes of all leaves (a Python int)."""
    return int(sum(np.prod(np.shape(x)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(a)))


def count_nonzero(a: PyTree):
    """Number of non-zero entries over all leaves (traced integer)."""
    leaves = [jnp.count_nonzero(x) for x in jax.tree.leaves(a)]
    return sum(leaves) if leaves else jnp.zeros((), jnp.int32)


def random_normal_like(key, a: PyTree, stddev=1.0) -> PyTree:
    """Independent N(0, stddev²) entries with the structure, shapes and dtypes of ``a``."""
    leaves, treedef = jax.tree.flatten(a)
    keys = jax.random.split(key, max(len(leaves), 1))
    new = [stddev * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, new)


def all_finite(a: PyTree):
    """True iff every entry of every floating leaf is finite (traced boolean)."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(a) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


# ----------------------------------------------------------------------------------------------- client axis


def num_clients(a: PyTree) -> int:
    """Size of the leading (client) axis, read off the first leaf."""
    return jax.tree.leaves(a)[0].shape[0]


def sum_clients(a: PyTree) -> PyTree:
    """Σ_i a_i over the leading client axis."""
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), a)


def mean_clients(a: PyTree) -> PyTree:
    """(1/C) Σ_i a_i over the leading client axis."""
    return jax.tree.map(lambda x: jnp.mean(x, axis=0), a)


def weighted_mean_clients(a: PyTree, weights) -> PyTree:
    """Σ_i w_i a_i / Σ_i w_i over the leading client axis (weights ``[C]``, not necessarily normalised).

    With all weights zero the result is zero, not NaN.
    """
    weights = jnp.asarray(weights)
    weights = weights.astype(jnp.result_type(float)) if not jnp.issubdtype(weights.dtype, jnp.floating) else weights
    total = jnp.sum(weights)
    safe = jnp.where(total > 0, total, 1.0)

    def wmean(x):
        w = (weights / safe).astype(x.dtype)
        return jnp.tensordot(w, x, axes=(0, 0))

    return jax.tree.map(wmean, a)


def masked_mean_clients(a: PyTree, mask) -> PyTree:
    """Mean over the clients whose ``mask`` entry is true (zero when none is)."""
    return weighted_mean_clients(a, jnp.asarray(mask))


def take_clients(a: PyTree, idx) -> PyTree:
    """Gather clients ``idx`` (an integer array) along the leading axis."""
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), a)


def put_clients(a: PyTree, idx, values: PyTree) -> PyTree:
    """Scatter ``values`` (leading axis len(idx)) into clients ``idx`` of ``a``; the others are untouched."""
    return jax.tree.map(lambda x, v: x.at[idx].set(v.astype(x.dtype)), a, values)


def broadcast_clients(a: PyTree, n: int) -> PyTree:
    """Repeat ``a`` along a new leading client axis of size ``n``."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), a)


def stack(trees: list[PyTree]) -> PyTree:
    """Stack a list of identically structured pytrees along a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(a: PyTree) -> list[PyTree]:
    """Inverse of :func:`stack`."""
    n = num_clients(a)
    return [jax.tree.map(lambda x, i=i: x[i], a) for i in range(n)]


def ravel(a: PyTree):
    """Flatten to one vector; returns ``(vector, unravel)`` (``jax.flatten_util.ravel_pytree``)."""
    from jax.flatten_util import ravel_pytree

    return ravel_pytree(a)


# ------------------------------------------------------------------------------------------------------ paths


def path_str(path) -> str:
    """A '/'-joined readable name for a ``jax.tree_util`` key path, e.g. ``params/Dense_0/kernel``."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def paths(a: PyTree) -> list[str]:
    """The '/'-joined path of every leaf (what selectors match against), in leaf order."""
    return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(a)[0]]


def map_with_path(fn: Callable[[str, Any], Any], a: PyTree, *rest: PyTree) -> PyTree:
    """``tree.map`` that also passes each leaf's '/'-joined path string as the first argument."""
    return jax.tree_util.tree_map_with_path(lambda p, x, *r: fn(path_str(p), x, *r), a, *rest)
