"""Asynchronous FL on a virtual clock, vectorised and exact: FedBuff (Nguyen et al. 2022) and FedAsync (Xie et al.
2019) on one template, :class:`Asynchronous`.

C clients train at once (``concurrency``), each from the server model of the version current when it was dispatched;
its result arrives at its dispatch time plus its round time on its device (the run's participation: device speeds,
:class:`fljax.participation.devices.Devices`, and a per-dispatch jitter). One fljax round is one server step: the K
earliest arrivals (``buffer_size``; ties by lower client id) update the server (:meth:`Asynchronous.server_step`),
the version goes from t to t + 1, and as many clients are dispatched as reported (uniformly among the idle ones).

H3 (heterogeneity spec): a client's update depends only on the model version it starts from, so it is computed by
the step that sees that version; its arrival time, version and update wait in a pool of C slots inside the state.
Two dispatch rules (``dispatch``):

* ``step`` (default): the K replacements are dispatched at the server step (the K-th arrival's time), all from
  w_{t+1};
* ``arrival`` (FLSim, the FedBuff paper): each arrival frees its slot at once and its replacement starts then, with
  the model current then: the first K − 1 of a step from w_t (one may even arrive within the same step), the K-th's
  after the step, from w_{t+1}.

Either way every client that trains from w_t is known once step t's arrivals are: the clients dispatched at the end
of step t − 1 (K under ``step``, 1 under ``arrival``) and those dispatched during step t (0, or K − 1). So each step
is: (1) the event phase — under ``step`` the K earliest arrivals of the pool at once (ties: lower id), under
``arrival`` K pops of the earliest one in a ``fori_loop``, each dispatching a replacement into the freed slot; (2) the
K clients that start from w_t train as one vmapped cohort; (3) the server steps on the K popped updates; (4) the pool
keeps the updates of the trained clients still in flight, and the end-of-step replacements are dispatched.
Initialisation dispatches C clients at time 0 and trains all but those the first step trains (the last K, or 1).

Dispatches are numbered from 0 over the run; dispatch d draws its jitter and its training randomness from
``fold_in(fold_in(run_key, DISPATCH), d)``. Clients dispatched at one moment (the C at time 0, the K after a ``step``
server step, each single one under ``arrival``) are a batch whose first dispatch's draw picks them: the idle training
clients of smallest uniform key, in that order (a uniformly random ordered subset of the idle). A plain event loop (a
heap of arrival times, one client at a time, as FLSim and FedScale run: ``tests/test_asynchrony.py``) drawing by the
same rule sees the same events in the same order with the same numbers.

The server state holds, beside the model: the version t, the virtual clock, the pool (client ids, arrival times,
start versions, dispatch numbers, stored updates) and ``last``, the events of the latest step (popped client ids,
their arrival times and start versions, in pop order). Round metrics: ``train_loss`` (the step's trained clients),
``staleness`` (mean t − τ_i over the step's updates), ``round_time`` (virtual seconds of the step), bytes (K uploads
and K downloads).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Algorithm, ClientInput, ClientResult
from fljax.algorithms.families import ASYNCHRONOUS
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.engine.context import DISPATCH
from fljax.errors import OptionError
from fljax.ops import prox
from fljax.ops.heterogeneity import staleness_weight
from fljax.options import at_least, greater_than, interval, option
from fljax.participation import Work
from fljax.participation.devices import add

__all__ = ["Asynchronous", "FedBuff", "FedAsync", "Pool"]


@flax.struct.dataclass
class Pool:
    """The C in-flight slots: ``ids`` [C] client ids, ``arrival`` [C] arrival times (+inf: an empty slot during a
    step), ``version`` [C] the server version each started from, ``dispatch`` [C] its dispatch number, ``pending``
    [C] its index in the current step's training cohort (−1: its update is already in ``update``), ``update`` the
    stored updates ([C, …])."""

    ids: jax.Array
    arrival: jax.Array
    version: jax.Array
    dispatch: jax.Array
    pending: jax.Array
    update: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asynchronous(Algorithm):
    """The asynchronous template (module docstring). Subclasses give :meth:`buffer` (K), :meth:`stored` (what the
    pool keeps of a trained client) and :meth:`server_step`."""

    asynchronous: ClassVar[bool] = True  # runs on a virtual clock: its participation must have device speeds
    samples_cohorts = True  # the participation draws whom it dispatches and when each one arrives
    supports_groups = False

    local: LocalTraining = local_training()
    concurrency: int = option(20, "C: clients training at once", at_least(1))
    dispatch: Literal["step", "arrival"] = option(
        "step", "when replacements start: 'step' (all K at the server step, from the new model) or 'arrival' (each "
                "at its predecessor's arrival, from the model current then: FLSim, the FedBuff paper)")
    staleness: Literal["constant", "polynomial", "hinge"] = option(
        "polynomial", "s(τ) of an update τ versions old: 'constant' 1, 'polynomial' (τ + 1)^-a, 'hinge' 1 for τ <= b "
                      "else 1/(a(τ − b) + 1)")
    staleness_a: float = option(0.5, "a of the polynomial (exponent) or hinge (slope) staleness weight",
                                at_least(0))
    staleness_b: float = option(4.0, "b of the hinge staleness weight: versions without discount", at_least(0))

    def buffer(self) -> int:
        """K: the arrivals of one server step."""
        raise NotImplementedError

    def check(self) -> None:
        super().check()
        if self.buffer() > self.concurrency:
            raise OptionError("buffer_size", f"must be at most the concurrency {self.concurrency} (the clients in "
                                             f"flight), got {self.buffer()}.")

    def validate(self, num_clients: int) -> None:
        if self.concurrency > num_clients:
            raise OptionError("concurrency", f"must be at most the {num_clients} training clients (each client "
                                             f"trains once at a time), got {self.concurrency}.")

    def participants(self, num_clients: int) -> int:
        return self.buffer()

    def ends(self) -> int:
        """Clients dispatched after a server step: K (``step``) or 1 (``arrival``)."""
        return self.buffer() if self.dispatch == "step" else 1

    # ------------------------------------------------------------------------------------------------ clients
    def local_loss(self, model, params, batch, variables, key, anchor):
        """The local objective (FedAsync adds its proximal term)."""
        return model.train_loss(params, batch, variables, key)

    def client_update(self, inp: ClientInput) -> ClientResult:
        loss_fn = lambda p, b, v, k: self.local_loss(inp.model, p, b, v, k, inp.down)  # noqa: E731
        params, _, loss = self.local.train_with_state(loss_fn, inp.down, inp)
        return ClientResult(state=inp.state, upload=self.stored(params, inp.down), weight=inp.train.count,
                            metrics={"train_loss": loss})

    def stored(self, trained, start):
        """What the pool keeps of a client that trained ``trained`` from ``start``."""
        raise NotImplementedError

    def server_step(self, server, updates, staleness):
        """The new server parameters from the step's K stored ``updates`` ([K, …]) and their ``staleness`` [K]."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------ events
    def work(self, ctx, params) -> Work:
        """Every client's local work and bytes (the model down, the stored update up)."""
        nbytes = 2.0 * tree.nbytes(params)
        return Work.of(self.plan(), ctx.data.train, nbytes)

    def _dispatch(self, ctx, devices, work, busy, first, count: int, now):
        """Dispatch ``count`` clients at once at time ``now``, as dispatches ``first``, ``first`` + 1, …: (clients,
        arrival times, busy with them marked). The batch takes the ``count`` idle training clients of smallest
        uniform key from dispatch ``first``'s draw, in that order (a uniformly random ordered subset of the idle);
        each one's time from its device, jittered by its own dispatch's draw."""
        n = ctx.num_train_clients
        base = jax.random.fold_in(ctx.run_key, DISPATCH)
        u = jnp.where(busy, 2.0, jax.random.uniform(jax.random.fold_in(jax.random.fold_in(base, first), 0), (n,)))
        clients = jax.lax.top_k(-u, count)[1].astype(jnp.int32)
        seconds = devices.seconds(clients, work.steps[clients], work.samples[clients], work.nbytes)
        jitter = ctx.participation.jitter
        if jitter:
            keys = jax.vmap(lambda d: jax.random.fold_in(jax.random.fold_in(base, d), 1))(first + jnp.arange(count))
            seconds = seconds * jnp.exp(jitter * jax.vmap(jax.random.normal)(keys))
        return clients, add(now, seconds), busy.at[clients].set(True)

    def _train(self, ctx, ids, numbers, params, version):
        """The clients ``ids`` (dispatch ``numbers``) trained from ``params`` of server ``version``: one cohort."""
        keys = jax.vmap(lambda d: jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(ctx.run_key, DISPATCH),
                                                                         d), 2))(numbers)
        safe = jnp.minimum(ids, ctx.num_clients - 1)
        return dataclasses.replace(ctx, round=version).run_clients(
            self.client_update, params, {}, ctx.data.train.take(safe), keys, clock_keys=ctx.clock_keys(safe), ids=safe)

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        c, ends = self.concurrency, self.ends()
        devices, work = ctx.participation.devices(ctx.num_train_clients), self.work(ctx, params)

        ids, arrival, _ = self._dispatch(ctx, devices, work, jnp.zeros(ctx.num_train_clients, bool), 0, c,
                                         jnp.float32(0))
        numbers = jnp.arange(c, dtype=jnp.int32)
        update = tree.broadcast_clients(tree.zeros_like(params), c)  # the last `ends` train in the first step
        if c > ends:
            trained = self._train(ctx, ids[:c - ends], numbers[:c - ends], params, jnp.int32(0)).upload
            update = jax.tree.map(lambda u, v: u.at[:c - ends].set(v.astype(u.dtype)), update, trained)
        pending = jnp.concatenate([jnp.full(c - ends, -1, jnp.int32), jnp.arange(ends, dtype=jnp.int32)])
        pool = Pool(ids, arrival, jnp.zeros(c, jnp.int32), numbers, pending, update)
        k = self.buffer()
        last = {"ids": jnp.zeros(k, jnp.int32), "arrival": jnp.zeros(k, jnp.float32),
                "version": jnp.zeros(k, jnp.int32)}
        return {"params": params, "version": jnp.int32(0), "now": jnp.float32(0), "dispatched": jnp.int32(c),
                "pool": pool, "last": last}, {}

    def round(self, ctx, server, clients):
        k, ends = self.buffer(), self.ends()
        middle = k - ends  # dispatched during the step, from w_t
        params, t, pool = server["params"], server["version"], server["pool"]
        devices, work = ctx.participation.devices(ctx.num_train_clients), self.work(ctx, params)
        busy = jnp.zeros(ctx.num_train_clients, bool).at[pool.ids].set(True)
        # the step's training cohort: the clients dispatched at the end of the last step, then those of this step
        carried = jnp.where(pool.pending >= 0, pool.pending, k)  # (k: out of range, dropped)
        cohort_ids = jnp.zeros(k, jnp.int32).at[carried].set(pool.ids, mode="drop")
        cohort_numbers = jnp.zeros(k, jnp.int32).at[carried].set(pool.dispatch, mode="drop")
        cohort_slots = jnp.zeros(k, jnp.int32).at[carried].set(jnp.arange(self.concurrency), mode="drop")

        if middle:  # `arrival`: one arrival at a time, each replacement starting then, from w_t
            def pop(j, carry):
                pool, busy, number, now, popped, cohort = carry
                first = jnp.min(pool.arrival)
                slot = jnp.argmin(jnp.where(pool.arrival == first, pool.ids, jnp.iinfo(jnp.int32).max))
                popped = jax.tree.map(lambda a, v: a.at[j].set(v), popped,
                                      (pool.ids[slot], first, pool.version[slot], pool.pending[slot], slot))
                busy = busy.at[pool.ids[slot]].set(False)
                refill = j < middle  # (the last pop's replacement starts after the step)
                client, at, refilled = self._dispatch(ctx, devices, work, busy, number, 1, first)
                pool = pool.replace(ids=pool.ids.at[slot].set(jnp.where(refill, client[0], pool.ids[slot])),
                                    arrival=pool.arrival.at[slot].set(jnp.where(refill, at[0], jnp.inf)),
                                    version=pool.version.at[slot].set(jnp.where(refill, t, pool.version[slot])),
                                    dispatch=pool.dispatch.at[slot].set(jnp.where(refill, number,
                                                                                  pool.dispatch[slot])),
                                    pending=pool.pending.at[slot].set(jnp.where(refill, ends + j,
                                                                                pool.pending[slot])))
                at_j = jnp.minimum(ends + j, k - 1)
                cohort = jax.tree.map(lambda a, v: a.at[at_j].set(jnp.where(refill, v, a[at_j])), cohort,
                                      (client[0], number, slot))
                busy = jnp.where(refill, refilled, busy)
                return pool, busy, number + refill.astype(jnp.int32), first, popped, cohort

            popped0 = (jnp.zeros(k, jnp.int32), jnp.zeros(k, jnp.float32), jnp.zeros(k, jnp.int32),
                       jnp.zeros(k, jnp.int32), jnp.zeros(k, jnp.int32))
            pool, busy, number, now, popped, cohort = jax.lax.fori_loop(
                0, k, pop, (pool, busy, server["dispatched"], server["now"], popped0,
                            (cohort_ids, cohort_numbers, cohort_slots)))
            pop_ids, pop_arrival, pop_version, pop_pending, pop_slot = popped
            cohort_ids, cohort_numbers, cohort_slots = cohort
        else:  # `step`: nobody starts during the step, so its arrivals are the K earliest, ties by lower id
            pop_slot = jnp.lexsort((pool.ids, pool.arrival))[:k].astype(jnp.int32)
            pop_ids, pop_arrival = pool.ids[pop_slot], pool.arrival[pop_slot]
            pop_version, pop_pending = pool.version[pop_slot], pool.pending[pop_slot]
            busy = busy.at[pop_ids].set(False)
            pool = pool.replace(arrival=pool.arrival.at[pop_slot].set(jnp.inf))
            number, now = server["dispatched"], pop_arrival[-1]

        # the K clients that start from w_t train as one cohort; the ones still in flight keep their update in the
        # pool, and the popped updates come from the cohort or from the pool
        result = self._train(ctx, cohort_ids, cohort_numbers, params, t)
        in_flight = ~jnp.any(jnp.arange(k)[:, None] == jnp.where(pop_pending >= 0, pop_pending, -1)[None, :], axis=1)
        keep = jnp.where(in_flight, cohort_slots, self.concurrency)
        read = lambda update: jax.tree.map(lambda a: a[pop_slot], update)  # noqa: E731
        if middle:  # `arrival`: a popped slot may have been refilled by a client still in flight: read, then write
            from_pool = read(pool.update)
            stored = jax.tree.map(lambda s, u: s.at[keep].set(u, mode="drop"), pool.update, result.upload)
        else:  # `step`: the in-flight clients' slots are not popped ones: write first, and the pool is not copied
            stored = jax.tree.map(lambda s, u: s.at[keep].set(u, mode="drop"), pool.update, result.upload)
            from_pool = read(stored)
        updates = tree.where(pop_pending >= 0, jax.tree.map(lambda a: a[jnp.maximum(pop_pending, 0)], result.upload),
                             from_pool)
        staleness = (t - pop_version).astype(jnp.float32)
        new_params = self.server_step(params, updates, staleness)
        pool = pool.replace(update=stored, pending=pool.pending.at[keep].set(-1, mode="drop"))
        # the end-of-step replacements start from w_{t+1}
        free = pop_slot[middle:]  # the slots the last `ends` pops freed (all K under `step`)

        fresh, at, busy = self._dispatch(ctx, devices, work, busy, number, ends, now)
        pool = pool.replace(ids=pool.ids.at[free].set(fresh), arrival=pool.arrival.at[free].set(at),
                            version=pool.version.at[free].set(t + 1),
                            dispatch=pool.dispatch.at[free].set(number + jnp.arange(ends, dtype=jnp.int32)),
                            pending=pool.pending.at[free].set(jnp.arange(ends, dtype=jnp.int32)))
        number = number + ends
        last = {"ids": pop_ids, "arrival": pop_arrival, "version": pop_version}
        new_server = {"params": new_params, "version": t + 1, "now": now, "dispatched": number, "pool": pool,
                      "last": last}
        up = float(tree.nbytes(jax.tree.map(lambda a: a[0], result.upload))) * k
        metrics = {"train_loss": jnp.mean(result.metrics["train_loss"]), "staleness": jnp.mean(staleness),
                   "round_time": now - server["now"], "bytes_up": jnp.float32(up),
                   "bytes_down": jnp.float32(tree.nbytes(params) * k)}
        return new_server, clients, metrics

    # ------------------------------------------------------------------------------------------------ evaluation
    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared


@register("fedbuff", family=ASYNCHRONOUS, example="configs/fedbuff.yaml",
          summary="FedBuff: buffered asynchronous aggregation of K staleness-weighted updates (Nguyen et al. 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedBuff(Asynchronous):
    """FedBuff (Nguyen et al. 2022): the server keeps a buffer and, once K updates Δ_i = w_i − w_{τ_i} have arrived,
    steps w ← w + η_g·(1/K)·Σ_i s(t − τ_i)Δ_i, s(τ) = 1/√(1 + τ) by default (spec, "FedBuff")."""

    buffer_size: int = option(5, "K: arrivals per server step", at_least(1))
    server_lr: float = option(1.0, "global step size η_g: w ← w + η_g·(1/K)·Σ s(τ_i)Δ_i", greater_than(0))

    def buffer(self) -> int:
        return self.buffer_size

    def stored(self, trained, start):
        return tree.sub(trained, start)

    def server_step(self, server, updates, staleness):
        weights = staleness_weight(staleness, self.staleness, self.staleness_a, self.staleness_b)
        total = jax.tree.map(lambda u: jnp.tensordot(weights.astype(u.dtype), u, axes=(0, 0)), updates)  # Σ s(τ_i)Δ_i
        return tree.axpy(self.server_lr / self.buffer_size, total, server)


@register("fedasync", family=ASYNCHRONOUS, example="configs/fedasync.yaml",
          summary=("FedAsync: every arrival mixes the client's model in with a staleness-discounted weight (Xie et "
                   "al. 2019)"))
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAsync(Asynchronous):
    """FedAsync (Xie et al. 2019): every arrival updates w ← (1 − α_t)w + α_t w_i, α_t = α·s(t − τ_i), where the
    client minimised f_i(w) + (ρ/2)‖w − w_{τ_i}‖² from w_{τ_i} (spec, "FedAsync")."""

    alpha: float = option(0.6, "α of the mixing weight α_t = α·s(t − τ)", interval(0, 1, "(]"))
    rho: float = option(0.0, "ρ of the proximal term (ρ/2)‖w − w_τ‖² of the local objective", at_least(0))

    def buffer(self) -> int:
        return 1

    def local_loss(self, model, params, batch, variables, key, anchor):
        loss, variables = model.train_loss(params, batch, variables, key)
        return loss + prox.proximal_penalty(params, anchor, self.rho), variables

    def stored(self, trained, start):
        return trained

    def server_step(self, server, updates, staleness):
        alpha = self.alpha * staleness_weight(staleness[0], self.staleness, self.staleness_a, self.staleness_b)
        model = jax.tree.map(lambda a: a[0], updates)
        return jax.tree.map(lambda w, x: (1 - alpha) * w + alpha * x, server, model)
