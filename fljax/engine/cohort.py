"""Running a sampled cohort, and every client, over a population of client groups.

``run_cohort`` runs the clients of a cohort (sorted ids over the whole population) and commits their new state; the
rest keep theirs bit for bit. Two ways (QuPeD spec §8, D32), which agree up to floating-point reassociation:

* ``"gather"``: the cohort's states and data are gathered into a buffer, run, and scattered back. Without groups the
  buffer is the cohort itself (exactly the clients sampled). With groups each group has a fixed buffer of
  ``min(K, n_g)`` slots filled with its sampled members (ascending ids) and a validity mask; empty slots compute on
  a copy of the group's last client and are dropped.
* ``"mask"``: every client computes and the result is committed with ``where(sampled_i, new, old)`` (exact; costs
  n/K times the work of the cohort).

The stacked :class:`~fljax.engine.protocol.ClientResult` (whose ``state`` is None with groups: the new states are
returned per group) holds the entries of every computed client in id order
(groups in order); ``valid`` marks the sampled ones (None when every entry is), and invalid entries have weight and
upload zero, so weighted means and sums over the client axis see the cohort only. With groups, the per-group results
are concatenated along the client axis: every group must upload pytrees of the same shapes (a global model of one
architecture), or the algorithm cannot aggregate them and the round refuses to trace.

A Poisson cohort (:meth:`~fljax.engine.context.RoundContext.sample_poisson`) is a buffer of ids with a validity mask
``valid`` (empty slots hold an out-of-range id): under ``"gather"`` its empty slots compute on a copy of the last
client and are dropped, like a group's; under ``"mask"`` the valid ids are the sampled ones. :func:`entry_ids` gives
the client id of every entry of the stacked result (what per-client state beside the algorithm's, e.g. the upload
residuals of :mod:`fljax.privacy`, is gathered and scattered by).

Under a client-state store (:mod:`fljax.engine.store`) the per-client state is a buffer of the block's clients, not
the population: the states are gathered from and scattered to their rows (:meth:`RoundContext.rows`), while data,
keys and budgets stay indexed by client id; only ``"gather"`` runs there, on one homogeneous population.

``run_all`` maps a function over every client of every group (evaluation; an algorithm's per-client
precomputation); outputs are concatenated in id order. Each client's keys come from its id (``ctx.client_ids``), so
a context restricted to some clients (an evaluation sample, :meth:`~fljax.engine.context.RoundContext.evaluated`)
gives them exactly the outputs they have in the whole population's. ``run_every`` runs every client's update (full
participation: the consensus-regression algorithms of :mod:`fljax.algorithms.regression`).
Every group runs through ``ctx.run_clients``, hence the executor: one vectorised (or chunked, sharded, looped) call
per group, all inside the round's one compiled program.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.engine.context import TRAIN, RoundContext
from fljax.engine.population import after, concat_results, each_group

__all__ = ["COHORT_MODES", "run_cohort", "run_all", "run_every", "entry_ids"]

COHORT_MODES = ("gather", "mask")


def _masked(result, valid):
    """``result`` with ``valid`` set and the invalid entries' weight and upload zeroed."""
    upload = tree.where(valid, result.upload, tree.zeros_like(result.upload))
    weight = jnp.where(valid, result.weight, jnp.zeros_like(result.weight))
    return result.replace(upload=upload, weight=weight, valid=valid)


def run_cohort(ctx: RoundContext, update_for: Callable, down, clients, cohort, mode: str = "gather", valid=None,
               steps=None):
    """Run the cohort's clients (``update_for(g)`` is group g's client update; g = None without groups); returns the
    new per-client state (a pytree, or a tuple per group) and the stacked :class:`ClientResult`. ``valid``: the
    cohort is a buffer whose slots where it is False are empty (a Poisson cohort; homogeneous populations only).
    ``steps``: each cohort member's local-step budget (``ClientInput.steps``; None: every one runs its whole
    plan)."""
    if mode not in COHORT_MODES:
        raise ValueError(f"cohort mode must be one of {COHORT_MODES}, got {mode!r}.")
    if ctx.slots is not None and (mode != "gather" or ctx.population is not None):
        raise ValueError("a client-state store runs the cohort in 'gather' mode on one homogeneous population.")
    budget = _Budget(ctx.num_clients, cohort if valid is None else jnp.where(valid, cohort, ctx.num_clients), steps)
    if valid is not None:
        if ctx.population is not None:
            raise ValueError("a cohort buffer with empty slots (Poisson sampling) runs on one homogeneous "
                             "population, not on client groups.")
        return _run_buffer(ctx, update_for(None), down, clients, cohort, valid, mode, budget)
    if ctx.population is None:
        return _run_homogeneous(ctx, update_for(None), down, clients, cohort, mode, budget)
    sampled = jnp.zeros(ctx.num_clients, bool).at[cohort].set(True)
    runs = each_group(_sizes(ctx), lambda g, lo, hi: _run_group(ctx.for_group(g), update_for(g), down, clients[g],
                                                                   sampled[lo:hi], lo, cohort.shape[0], mode, budget),
                      concat=False)
    # each group keeps its own state; the rest is stacked
    return (tuple(state for state, _ in runs),
            concat_results([result.replace(state=None) for _, result in runs], "client results (uploads, metrics)"))


def _sizes(ctx) -> list[int]:
    return [g.size for g in ctx.population.groups]


class _Budget:
    """The cohort's local-step budgets by client id (``steps`` [k] of the cohort's ``ids`` [k]; an id past the last
    client is an empty slot): :meth:`of` gives the budgets of the clients a call runs (None without budgets)."""

    def __init__(self, num_clients: int, ids, steps):
        self.by_id = None if steps is None else jnp.full(num_clients, jnp.iinfo(jnp.int32).max, jnp.int32).at[
            ids].set(jnp.asarray(steps, jnp.int32), mode="drop")

    def of(self, ids):
        return None if self.by_id is None else self.by_id[jnp.asarray(ids)]


def _run_homogeneous(ctx, update, down, clients, cohort, mode, budget):
    n, k = ctx.num_clients, cohort.shape[0]
    if mode == "mask" and k < n:
        ids = jnp.arange(n)
        result = ctx.run_clients(update, down, clients, ctx.data.train, ctx.client_keys(ids, TRAIN),
                                 clock_keys=ctx.clock_keys(ids), ids=ids, steps=budget.of(ids))
        sampled = jnp.zeros(n, bool).at[cohort].set(True)
        return tree.where(sampled, result.state, clients), _masked(result, sampled)
    full = k == n
    rows = ctx.rows(cohort)
    result = ctx.run_clients(update, down, clients if full else tree.take_clients(clients, rows),
                             ctx.data.train if full else ctx.data.train.take(cohort), ctx.client_keys(cohort, TRAIN),
                             clock_keys=ctx.clock_keys(cohort), ids=cohort, steps=budget.of(cohort))
    return (result.state if full else tree.put_clients(clients, rows, result.state)), result


def _run_buffer(ctx, update, down, clients, cohort, valid, mode, budget):
    """A cohort buffer with empty slots (``valid`` False): ``mask`` runs every client and commits the valid ids';
    ``gather`` runs the buffer's slots (empty ones on a copy of the last client) and scatters the valid ones back."""
    n = ctx.num_clients
    ids = jnp.where(valid, cohort, n)  # an empty slot points past the last client: dropped by every scatter
    if mode == "mask":
        every = jnp.arange(n)
        result = ctx.run_clients(update, down, clients, ctx.data.train, ctx.client_keys(every, TRAIN),
                                 clock_keys=ctx.clock_keys(every), ids=every, steps=budget.of(every))
        sampled = jnp.zeros(n, bool).at[ids].set(True, mode="drop")
        return tree.where(sampled, result.state, clients), _masked(result, sampled)
    safe = jnp.minimum(ids, n - 1)
    result = ctx.run_clients(update, down, tree.take_clients(clients, ctx.rows(safe, gather=True)),
                             ctx.data.train.take(safe), ctx.client_keys(safe, TRAIN), clock_keys=ctx.clock_keys(safe),
                             ids=ids, steps=budget.of(safe))
    rows = ctx.rows(ids)
    new = jax.tree.map(lambda x, v: x.at[rows].set(v.astype(x.dtype), mode="drop"), clients, result.state)
    return new, _masked(result, valid)


def entry_ids(ctx: RoundContext, cohort, mode: str = "gather", valid=None):
    """The client id of every entry of :func:`run_cohort`'s stacked result (homogeneous populations): every client
    in id order when all of them computed (``mask`` mode with fewer sampled), else the cohort's ids (an empty slot
    of a buffer: ``num_clients``, out of range)."""
    n = ctx.num_clients
    if mode == "mask" and (valid is not None or cohort.shape[0] < n):
        return jnp.arange(n)
    return cohort if valid is None else jnp.where(valid, cohort, n)


def _run_group(gctx, update, down, states, sampled, lo: int, k: int, mode: str, budget):
    """One group's share of the cohort (``sampled``: its members' mask; ``lo``: its first client id)."""
    n = gctx.num_clients
    if mode == "mask":
        ids = jnp.arange(lo, lo + n)
        result = gctx.run_clients(update, down, states, gctx.data.train, gctx.client_keys(ids, TRAIN),
                                  clock_keys=gctx.clock_keys(ids), ids=ids, steps=budget.of(ids))
        return tree.where(sampled, result.state, states), _masked(result, sampled)
    cap = min(k, n)
    pos = jnp.nonzero(sampled, size=cap, fill_value=n)[0]  # sampled members, ascending; n marks an empty slot
    valid = pos < n
    safe = jnp.minimum(pos, n - 1)
    result = gctx.run_clients(update, down, tree.take_clients(states, safe), gctx.data.train.take(safe),
                              gctx.client_keys(lo + safe, TRAIN), clock_keys=gctx.clock_keys(lo + safe),
                              ids=lo + safe, steps=budget.of(lo + safe))
    new = jax.tree.map(lambda x, v: x.at[pos].set(v.astype(x.dtype), mode="drop"), states, result.state)
    return new, _masked(result, valid)


def run_all(ctx: RoundContext, fn_for: Callable, down, clients, keys_tag: int, test: bool = True, *,
            concat: bool = True, serial: bool = False):
    """``fn_for(g)(ClientInput)`` for every client of every group (g = None without groups), with the round keys of
    stream ``keys_tag``, the client ids and each client's test split (``test``); the outputs concatenated in id
    order (``concat``), else a tuple per group. ``clients``: the per-client states (a tuple per group), or None.
    ``serial``: each group starts once the previous one has finished (the XLA:CPU LAPACK workaround,
    :func:`fljax.engine.population.after`)."""
    if ctx.population is None:
        ids = jnp.asarray(ctx.client_ids)
        out = ctx.run_clients(fn_for(None), down, clients, ctx.data.train, ctx.client_keys(ids, keys_tag),
                              ctx.data.test if test else None, ids=ids)
        return out if concat else (out,)
    previous = []

    def run(g, lo, hi):
        gctx, ids = ctx.for_group(g), jnp.arange(lo, hi)
        shared = after(down, previous[-1]) if serial and previous else down
        previous.append(gctx.run_clients(fn_for(g), shared, None if clients is None else clients[g],
                                         gctx.data.train, gctx.client_keys(ids, keys_tag),
                                         gctx.data.test if test else None, ids=ids))
        return previous[-1]

    return each_group(_sizes(ctx), run, concat=concat)


def run_every(ctx: RoundContext, update_for: Callable, down, clients, keys_tag: int = TRAIN):
    """Every client's update, full participation: (the new per-client state — a tuple per group over a population,
    whose shapes may differ between groups —, the stacked :class:`ClientResult` with ``state`` None over a
    population). ``update_for(g)`` is group g's ``client_update``."""
    results = run_all(ctx, update_for, down, clients, keys_tag, test=False, concat=False)
    if ctx.population is None:
        return results[0].state, results[0]
    return (tuple(r.state for r in results),
            concat_results([r.replace(state=None) for r in results], "client results (uploads, metrics)"))
