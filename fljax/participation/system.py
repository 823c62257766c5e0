"""One synchronous round of a participation with systems (:attr:`fljax.participation.Participation.system`),
vectorised over the selected clients: who reports, how many local steps each one completes, when, and how long the
round lasts (heterogeneity spec; docs/heterogeneity.md). In order, for the round starting at virtual time t₀:

1. **availability** at t₀ (:class:`~fljax.participation.devices.Devices`); the participation selects ⌈(1 + r)·m⌉
   (over-selection r, else m) among the available clients (:meth:`~fljax.participation.Participation.sample`);
2. **stragglers** (FedProx Section 5, Li et al. 2020): of the n selected, round(n·(1 − s)) do their whole work and the rest
   x ~ U{1, …, E} epochs (E the plan's epochs; with a plan of K steps, x ~ U{1, …, K} steps), drawn like the FedProx
   code (the same stragglers for every algorithm: the round's SAMPLE stream);
3. **time**: client i's report time τ_i = (steps_i · b_i · ms_i/1000 + 8·(D + U)/(1000·kbps_i)) · j_i, j_i a
   log-normal jitter (σ = ``jitter``);
4. **deadline** T: with ``policy: drop`` (H2) a client with τ_i > T is late and dropped; with ``partial`` it does the
   ⌊(T/j_i − comm_i)/step_i⌋ steps that fit (dropped when none fits); a straggler with fewer than its whole steps is
   dropped under ``drop`` (FedAvg in FedProx Section 5), kept with its budget under ``partial`` (FedProx);
5. **failures** (H1): a client whose availability ends before τ_i fails then; with ``dropout`` p each selected client
   also fails with probability p at a uniform moment u·τ_i; a failed client's work is lost;
6. **over-selection** (Bonawitz et al. 2019): of the clients that report, the m earliest (ties: lower id) are kept.

The round's duration (H4): the m-th report when over-selection got its m; else the last event of a selected client —
its report, its failure, its dropped partial work, or the deadline T for a late one. A round that selected nobody
(nobody available) waits until the next moment a client becomes available. A round in which nobody reports is
skipped (the template keeps the model: ``round_skipped`` = 1) and moves the clock by at least one float32 step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["draw", "stragglers"]


def stragglers(share: float, key, selected, full, epoch):
    """FedProx Section 5's stragglers among the ``selected`` slots: ``(steps, short)`` — each slot's local steps (its
    ``full`` steps, or x·``epoch`` with x ~ U{1, …, full/epoch} for the stragglers) and whether a straggler got fewer
    than its full steps. Exactly count − round(count·(1 − share)) of the count selected are stragglers (FedProx's
    code draws round(m·(1 − drop)) active clients)."""
    if not share:
        return full, jnp.zeros(full.shape, bool)
    k_pick, k_units = jax.random.split(key)
    count = jnp.sum(selected.astype(jnp.int32))
    active = jnp.round(count.astype(jnp.float32) * (1 - share)).astype(jnp.int32)
    u = jnp.where(selected, jax.random.uniform(k_pick, full.shape), 2.0)
    rank = jnp.argsort(jnp.argsort(u))
    straggler = selected & (rank >= active)
    units = jnp.maximum(full // epoch, 1)
    budget = jnp.minimum(jax.random.randint(k_units, full.shape, 1, units + 1) * epoch, full)
    return jnp.where(straggler, budget, full), straggler & (budget < full)


def draw(p, ctx, cohort_size: int | None, work):
    """The round's :class:`~fljax.participation.Cohort` of participation ``p`` (module docstring) for the round's
    :class:`~fljax.participation.Work` ``work`` (from virtual time ``work.now``)."""
    from fljax.participation import Cohort
    from fljax.participation.devices import add

    n = ctx.num_train_clients
    dev = p.devices(n)
    m = n if cohort_size is None else min(cohort_size, n)
    now = jnp.asarray(work.now, jnp.float32)
    base = p.sample(ctx, p.selected(n, cohort_size), dev.available(now))
    ids = base.ids
    selected = jnp.ones(ids.shape, bool) if base.valid is None else base.valid
    safe = jnp.minimum(ids, n - 1)
    k_straggle, k_jitter, k_fail, k_when = jax.random.split(jax.random.fold_in(ctx.sample_stream(), 1), 4)
    full = work.steps[safe]
    steps, short = stragglers(p.stragglers, k_straggle, selected, full, work.epoch[safe])

    factor = jnp.exp(p.jitter * jax.random.normal(k_jitter, ids.shape)) if p.jitter else jnp.ones(ids.shape)
    if dev.clocked:
        step_s = dev.step_seconds(safe, work.samples[safe]) * factor
        comm_s = dev.comm_seconds(safe, work.nbytes) * factor
    else:
        step_s = comm_s = jnp.zeros(ids.shape, jnp.float32)
    late = jnp.zeros(ids.shape, bool)
    if p.deadline is not None:
        limit = jnp.float32(p.deadline)
        if p.policy == "partial":
            fit = jnp.floor((limit - comm_s) / jnp.maximum(step_s, 1e-30)).astype(jnp.int32)
            short = short | (fit < steps)
            steps = jnp.clip(fit, 0, steps)
            late = (comm_s > limit) | ((steps < 1) & (full > 0))
        else:
            late = steps * step_s + comm_s > limit
    time = add(steps * step_s, comm_s)
    if p.deadline is not None and p.policy == "partial":
        time = jnp.minimum(time, p.deadline)
    dropped = short if p.policy == "drop" else jnp.zeros(ids.shape, bool)

    fail_at = dev.until(now)[safe] - now  # H1: its availability ends (+inf: always available)
    if p.dropout:
        fails = jax.random.bernoulli(k_fail, p.dropout, ids.shape)
        fail_at = jnp.where(fails, jnp.minimum(fail_at, jax.random.uniform(k_when, ids.shape) * time), fail_at)
    working = selected & ~late & ~dropped
    failed = working & (time > fail_at)
    reports = working & ~failed

    if p.over_selection:  # the m earliest reports, ties by id
        order = jnp.lexsort((ids, jnp.where(reports, time, jnp.inf)))
        reports = reports & (jnp.argsort(order) < m)
        enough = jnp.sum(reports.astype(jnp.int32)) >= m
    else:
        enough = jnp.bool_(False)
    event = jnp.where(failed, fail_at, jnp.where(late, p.deadline or 0.0, time))
    last = jnp.max(jnp.where(selected, event, 0.0))
    first_m = jnp.max(jnp.where(reports, time, 0.0))
    wait = dev.next_start(now) - now
    count = jnp.sum(selected.astype(jnp.int32))
    duration = jnp.where(count == 0, wait, jnp.where(enough, first_m, last)).astype(jnp.float32)
    reported = jnp.sum(reports.astype(jnp.float32))
    # a skipped round moves the clock at least to the next float32 time: one whose clients all failed at once (an
    # availability ending as the round starts) cannot repeat itself forever
    duration = jnp.where(reported == 0, jnp.maximum(duration, jnp.nextafter(now, jnp.float32(jnp.inf)) - now),
                         duration)

    metrics = {"clients_reported": reported, "clients_selected": count.astype(jnp.float32),
               "round_skipped": (reported == 0).astype(jnp.float32)}
    if dev.clocked:
        metrics["round_time"] = duration
    return Cohort(ids=ids, valid=reports, steps=steps.astype(jnp.int32), time=jnp.where(reports, time, jnp.inf),
                  duration=duration, metrics=metrics)
