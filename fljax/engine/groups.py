"""Clients in groups whose arrays have different shapes, each group run through the executor.

Some data cannot give every client one padded shape without waste: FedGiA's qot clients hold from ~30 to several
hundred rows, so :func:`fljax.problems.pack_trials` pads them per *size class*; heterogeneous client groups (other
models or other data per group) have the same structure. A grouped data set is a sequence of groups, each a pytree
with its own leading client axis, holding consecutive clients: group 0 clients 0 … n_0 − 1, group 1 the next n_1,
and so on.

:func:`each_group` is the one loop over groups: ``run(k, lo, hi)`` for group k (clients lo … hi − 1), a per-group
callable, since each group may run its own model or function; the outputs concatenated along the client axis in
client order (their structures and trailing shapes must agree, else :class:`GroupShapeError`) or returned per group.
:func:`map_groups` (grouped data) and :mod:`fljax.engine.cohort` (client groups of a population) are built on it.

:func:`map_groups` computes ``fn(shared, (group_data_i, per_client_i, per_group_i))`` for every client i of every
group. Each group goes through ``executor.map_clients`` on its own (one program per group shape, vmapped, chunked or
looped like any other client map); the outputs are concatenated along the client axis in client order, or returned
per group when their shapes differ (``concat=False``: per-group factorisations, say).

``serial=True`` is a workaround for XLA:CPU, kept here so that no algorithm carries it. XLA:CPU runs independent
operations of one program concurrently, and jaxlib's batched LAPACK kernels (Cholesky, triangular solves) split
their batch over the same thread pool and wait for it: two such kernels at once (the Cholesky factorisations of two
size classes) left both threads of a 2-core machine waiting forever (diagnosed with gdb: two ``lapack_dpotrf_ffi``
thunks in ``jax::ParallelBatchMap``). A true data dependency orders them (an ``optimization_barrier`` does not order
execution): group k + 1 receives ``shared`` with 0·p added to every floating-point leaf, p a finite probe read from
every output leaf of group k (``where(isfinite(p), p, 0)·0``, so the values are unchanged bit for bit), and so
cannot start before group k has finished.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.engine.executors import Executor

__all__ = ["each_group", "map_groups", "concat_results", "GroupShapeError"]


class GroupShapeError(ValueError):
    """Client groups returned pytrees of different structures or shapes where they must be stacked."""


def each_group(sizes: Sequence[int], run: Callable, *, concat: bool = True, what: str = "outputs"):
    """``run(k, lo, hi)`` for every group k of ``sizes`` (its clients lo … hi − 1, in id order); the outputs
    concatenated along the client axis (``concat``; ``what`` names them in the error) or a tuple per group."""
    outs, lo = [], 0
    for k, n in enumerate(sizes):
        outs.append(run(k, lo, lo + n))
        lo += n
    return concat_results(outs, what) if concat else tuple(outs)


def concat_results(outs: Sequence, what: str):
    """Concatenate per-group outputs along the client axis (their structures and trailing shapes must agree)."""
    if len(outs) == 1:
        return outs[0]
    structs = {jax.tree.structure(o) for o in outs}
    shapes = {tuple(jnp.shape(x)[1:] for x in jax.tree.leaves(o)) for o in outs}
    if len(structs) > 1 or len(shapes) > 1:
        raise GroupShapeError(f"the client groups' {what} differ in structure or shape (e.g. models of different "
                              f"architectures); this algorithm cannot combine them across groups.")
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)


def map_groups(executor: Executor, fn: Callable, shared: Any, groups: Sequence, per_client: Any = None,
               per_group: Sequence | None = None, *, concat: bool = True, serial: bool = False):
    """``fn(shared, (group_data_i, per_client_i, per_group_i))`` for every client i of every group (module
    docstring).

    ``groups``: per-group client data, in client order (each a pytree whose leaves have the group's client axis
    first). ``per_client``: a pytree with the full client axis (sliced per group), or None. ``per_group``: one
    client-stacked pytree per group (shapes may differ between groups), or None. ``concat``: concatenate the
    outputs along the client axis (every group's per-client outputs must have the same shapes); else a tuple of the
    groups' outputs. ``serial``: each group waits for the previous one (``shared`` needs a floating-point leaf).
    """
    if per_group is not None and len(per_group) != len(groups):
        raise ValueError(f"per_group has {len(per_group)} entries for {len(groups)} groups.")
    if serial and not any(_floating(leaf) for leaf in jax.tree.leaves(shared)):
        raise ValueError("map_groups(serial=True) orders the groups through a floating-point leaf of shared; "
                         "shared has none.")
    previous = []  # the last group's output, which the next one waits for (serial)

    def run(k, lo, hi):
        args = (groups[k], jax.tree.map(lambda a: a[lo:hi], per_client), None if per_group is None else per_group[k])
        out = executor.map_clients(fn, _plus(shared, _zero_after(previous[-1])) if serial and previous else shared,
                                   args)
        previous.append(out)
        return out

    return each_group([tree.num_clients(g) for g in groups], run, concat=concat)


def _floating(leaf) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def _zero_after(out):
    """A zero that depends on every leaf of ``out`` (a finite probe times 0)."""
    probe = sum(jnp.ravel(leaf)[0] for leaf in jax.tree.leaves(out) if jnp.size(leaf))
    return jnp.where(jnp.isfinite(probe), probe, 0.0) * 0.0


def _plus(shared, zero):
    """``shared`` with ``zero`` added to every floating-point leaf (other leaves unchanged)."""
    return jax.tree.map(lambda s: s + zero.astype(jnp.result_type(s)) if _floating(s) else s, shared)
