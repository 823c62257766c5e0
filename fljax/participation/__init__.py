"""The participation seam: who takes part in a round, how much each one computes, and when its result arrives.

A participation is a value the centralized template owns (:class:`fljax.algorithms.base.CohortTemplate`): every round
it asks :meth:`Participation.draw` for the round's :class:`Cohort` — the client ids that train (a buffer of static
size with a validity mask when the number varies), each one's local-step budget and, where the participation keeps a
virtual clock, each one's report time and the round's duration. The draw is a pure function of the round's keys, so
every executor, lane and resume sees the same cohorts. The config section is ``participation:`` with ``name`` and the
chosen participation's own options (declared on its class, which registers itself in :data:`PARTICIPATIONS`)::

    participation: {name: poisson, capacity: 20}
    participation: {name: uniform, speed: synthetic, availability: diurnal, deadline: 60, over_selection: 0.3}

* ``uniform`` (the default): m = ``algo.cohort_size`` clients without replacement, the engine's cohorts bit for bit
  (heterogeneity spec, "uniform(m)"); with an availability model, m among the clients available at the round's start.
* ``poisson``: every training client independently with probability q = m/N, into a buffer of ``capacity`` slots
  (DP-FedAvg's sampling, McMahan et al. 2018; heterogeneity spec, "poisson(q)").

Every participation also describes the federation's systems (docs/heterogeneity.md), all off by default (the default
path is today's bit for bit):

* **devices** (``speed``): each client's milliseconds per training sample and bandwidth, synthetic (log-normal) or from
  FedScale's ``client_device_capacity`` trace — the virtual clock (:mod:`fljax.participation.devices`): a client's
  round time is its steps × batch × ms per sample plus the bytes it downloads and uploads over its bandwidth (the
  bytes fljax counts: compression shrinks the upload time), times an optional log-normal ``jitter``;
* **availability**: ``diurnal`` or FedScale's ``client_behave_trace`` (:mod:`fljax.participation.traces`); H1: a
  client that becomes unavailable before it reports fails (dropout), and ``dropout`` adds random mid-round failures;
* **deadline** T with a ``policy``: 'drop' a client slower than T (H2, the default: FedAvg as deployed) or keep its
  'partial' work, the steps that fit by T;
* **over-selection** (Bonawitz et al. 2019): select ⌈(1 + r)·m⌉ and keep the first m to report;
* **stragglers** (FedProx Section 5): a share of the selected clients do x ~ U{1, …, E} epochs instead of E; ``policy``
  'drop' drops them (FedAvg), 'partial' keeps their partial work (FedProx).

A round of a participation with any of them (:attr:`Participation.system`) is drawn by
:func:`fljax.participation.system.draw`; the template then runs its cohort's budgets, records the round's virtual
duration (``round_time``) and keeps the model of a round in which nobody reported (``round_skipped``: H4,
docs/heterogeneity.md). The device population (speeds, diurnal phases) is drawn once from the participation's own
``seed`` (H5): the same federation for every run seed, and the checks of impossible settings (a deadline nobody
meets) run on the host before anything runs.

The privacy accountant asks the participation for its sampling (:meth:`Participation.sampling`: a
:class:`fljax.privacy.Sampling`, the dp-accounting event's description); a participation without an amplification
result (an availability model, or one that drops clients) returns None and client-level privacy refuses it in one
line. Without a ``participation:`` section a run draws uniform cohorts, or Poisson ones under client-level privacy
(DP-FedAvg's sampling; docs/privacy.md); an asynchronous algorithm's default has synthetic device speeds.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax.errors import OptionError
from fljax.options import Options, Registry, at_least, between, greater_than, interval, option, seed_check
from fljax.participation.devices import Devices

__all__ = ["Cohort", "Work", "WithClock", "Participation", "PARTICIPATIONS", "Uniform", "Poisson",
           "default_participation", "Devices"]


@flax.struct.dataclass
class Cohort:
    """One round's participants: ``ids`` [m] client ids in ascending order (an empty slot of a buffer holds
    ``num_clients``, past the last client); ``valid`` [m] marks the slots that hold a client whose update counts
    (None: all do; a dropped, failed or late client is invalid); ``steps`` [m] the local steps each one completes
    (None: its whole batch plan; fewer: a straggler's partial work, :class:`fljax.engine.protocol.ClientInput`'s
    ``steps``); ``time`` [m] the virtual seconds from the round's start to each one's report (None: the
    participation keeps no clock); ``duration`` the round's virtual seconds and ``metrics`` the round's counts
    (None, {}: a participation without systems, :attr:`Participation.system`)."""

    ids: jax.Array
    valid: Any = None
    steps: Any = None
    time: Any = None
    duration: Any = None
    metrics: dict = flax.struct.field(default_factory=dict)


@flax.struct.dataclass
class Work:
    """A round's local work, as the clock and the straggler protocol need it, for every client of the population:
    ``steps`` [N] its whole plan's active steps, ``epoch`` [N] the steps of one epoch (1 when the plan counts steps,
    not epochs), ``samples`` [N] the samples of one step (its mean batch), ``nbytes`` what one client downloads and
    uploads (bytes), ``now`` the virtual time of the round's start (seconds)."""

    steps: jax.Array
    epoch: jax.Array
    samples: jax.Array
    nbytes: Any
    now: Any = 0.0

    @classmethod
    def of(cls, plan, train, nbytes, now=0.0) -> "Work":
        """The work of ``plan`` (a :class:`fljax.data.BatchPlan`; None: no local steps) on the population's
        ``train`` arrays (their counts), ``nbytes`` down and up per client, from virtual time ``now``."""
        count = jnp.asarray(train.count, jnp.int32)
        if plan is None:
            zeros = jnp.zeros_like(count)
            return cls(zeros, jnp.ones_like(count), zeros.astype(jnp.float32), nbytes, now)
        steps = jnp.broadcast_to(jnp.asarray(plan.active_steps(count, train.n_max), jnp.int32), count.shape)
        n = count.astype(jnp.float32)
        if plan.batch_size is None:  # full batches
            epoch, samples = jnp.ones_like(count), n
        elif plan.epochs is not None:  # E passes of ⌈n/B⌉ batches: n samples per epoch
            epoch = jnp.maximum((count + plan.batch_size - 1) // plan.batch_size, 1)
            samples = n / epoch
        else:  # K steps of B samples (Poisson batches: B expected)
            epoch, samples = jnp.ones_like(count), jnp.minimum(jnp.float32(plan.batch_size), n)
        return cls(steps, epoch, samples, nbytes, now)


@flax.struct.dataclass
class WithClock:
    """A server state ``state`` with the virtual clock ``now`` (seconds since the run's start): what a clocked
    participation's run carries from round to round (and checkpoints)."""

    state: Any
    now: jax.Array


PARTICIPATIONS = Registry("participation")  # name -> class; `participation: {name: ..., options}` parses through it

_NEEDS_CLOCK = ("availability", "deadline", "over_selection", "jitter")  # what has no meaning without device speeds
# options that apply only when another option has a value: option -> (that option, its values)
_ONLY_WITH = {"period": ("availability", ("diurnal",)), "on_fraction": ("availability", ("diurnal",)),
              "behave_trace": ("availability", ("trace",)), "ms_per_sample": ("speed", ("synthetic",)),
              "compute_sigma": ("speed", ("synthetic",)), "kbps": ("speed", ("synthetic",)),
              "bandwidth_sigma": ("speed", ("synthetic",)), "capacity_trace": ("speed", ("trace",))}


@dataclasses.dataclass(frozen=True)
class Participation(Options):
    """Base of a participation: a frozen dataclass of its options (each declared with
    :func:`fljax.options.option`), with a ``name`` and a one-line ``summary``. A subclass says whom it samples
    (:meth:`sample`); the systems options below are every participation's."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    availability: Literal["always", "diurnal", "trace"] = option(
        "always", "who may be selected at a round's virtual start: 'always' everyone, 'diurnal' each client on for "
                  "on_fraction of every period from its own phase, 'trace' FedScale's client_behave_trace intervals")
    period: float = option(86400.0, "diurnal: seconds of one availability cycle", greater_than(0))
    on_fraction: float = option(0.5, "diurnal: the share of each period a client is available", interval(0, 1, "(]"))
    behave_trace: str | None = option(None, "trace availability: a FedScale client_behave_trace file")
    speed: Literal["none", "synthetic", "trace"] = option(
        "none", "device speeds, the virtual clock: 'none' (no clock), 'synthetic' (log-normal around ms_per_sample "
                "and kbps) or 'trace' (FedScale's client_device_capacity)")
    ms_per_sample: float = option(5.0, "synthetic: median milliseconds of one training sample", greater_than(0))
    compute_sigma: float = option(0.6, "synthetic: σ of log(ms per sample) over devices (0: all equal; FedScale's "
                                       "tail skew 0.6)", at_least(0))
    kbps: float = option(5000.0, "synthetic: median bandwidth in kbit/s", greater_than(0))
    bandwidth_sigma: float = option(0.6, "synthetic: σ of log(bandwidth) over devices (0: all equal)", at_least(0))
    capacity_trace: str | None = option(None, "trace speeds: a FedScale client_device_capacity file")
    compute_factor: float = option(1.0, "multiplies every device's ms per sample (FedScale's traces hold inference "
                                        "latency and take 3 for forward + backward)", greater_than(0))
    jitter: float = option(0.0, "σ of a log-normal factor on each client's time in each round (0: none)",
                           at_least(0))
    seed: int = option(0, "seed of the device population (synthetic speeds, diurnal phases; the same for every "
                          "run seed, H5)", seed_check)
    deadline: float | None = option(None, "virtual seconds a round waits for reports (null: none); a slower client "
                                          "is handled by policy", greater_than(0))
    policy: Literal["drop", "partial"] = option(
        "drop", "a client that cannot do its whole local work (past the deadline, or a straggler): 'drop' it (H2; "
                "FedAvg as deployed) or keep its 'partial' work, the steps that fit (FedProx's γ-inexact clients)")
    over_selection: float = option(0.0, "select ⌈(1 + r)·m⌉ and keep the first m to report (Bonawitz et al. 2019; "
                                        "0: none)", at_least(0))
    stragglers: float = option(0.0, "FedProx Section 5: the share of the selected clients that do x ~ U{1, …, E} epochs "
                                    "instead of E (0: none)", between(0, 1))
    dropout: float = option(0.0, "probability that a selected client fails mid-round, at a uniform moment of its "
                                 "work (H1: its work is lost)", interval(0, 1, "[)"))

    # ------------------------------------------------------------------------------------------------ checks
    def check(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(Participation)}
        for key, (switch, values) in _ONLY_WITH.items():
            if getattr(self, switch) not in values and getattr(self, key) != defaults[key]:
                raise OptionError(key, f"applies to {switch}: {' or '.join(values)}, not {switch}: "
                                       f"{getattr(self, switch)}; remove it or set {switch}.")
        for switch, key in (("availability", "behave_trace"), ("speed", "capacity_trace")):
            if getattr(self, switch) == "trace" and getattr(self, key) is None:
                raise OptionError(key, f"must name a FedScale trace file with {switch}: trace.")
        if self.speed == "none":
            for key in _NEEDS_CLOCK:
                if getattr(self, key) != defaults[key]:
                    raise OptionError(key, "needs device speeds, the virtual clock (speed: synthetic or trace).")
        if self.policy != "drop" and self.deadline is None and not self.stragglers:
            raise OptionError("policy", f"{self.policy!r} applies to clients past a deadline or stragglers; set "
                                        f"deadline or stragglers.")

    @property
    def clocked(self) -> bool:
        """Whether the participation keeps a virtual clock (device speeds)."""
        return self.speed != "none"

    @property
    def system(self) -> bool:
        """Whether any systems option is on (the rounds are drawn by :func:`fljax.participation.system.draw`)."""
        return self.clocked or self.stragglers > 0 or self.dropout > 0

    @property
    def drops_clients(self) -> bool:
        """Whether some selected clients' updates may not count (availability, deadline, dropouts, stragglers
        dropped, over-selection): a sampling without an amplification result."""
        return (self.availability != "always" or self.over_selection > 0 or self.dropout > 0 or
                (self.policy == "drop" and (self.deadline is not None or self.stragglers > 0)))

    def selected(self, population: int, cohort_size: int | None) -> int:
        """How many clients a round selects: m, or ⌈(1 + r)·m⌉ with over-selection."""
        m = population if cohort_size is None else min(cohort_size, population)
        return math.ceil((1 + self.over_selection) * m - 1e-9)

    def validate(self, population: int, cohort_size: int | None) -> None:
        """Refuse, in one line naming the key, options impossible for ``population`` training clients and cohorts of
        ``cohort_size`` (the trace files are read and checked here)."""
        if self.over_selection and self.selected(population, cohort_size) > population:
            m = population if cohort_size is None else cohort_size
            raise OptionError("over_selection", f"selects ⌈(1 + {self.over_selection:g})·{m}⌉ = "
                                                f"{self.selected(population, cohort_size)} clients, more than the "
                                                f"{population} training clients.")
        self.devices(population)

    def validate_asynchronous(self, algorithm: str) -> None:
        """Refuse what an asynchronous algorithm (FedBuff, FedAsync) cannot take: it needs device speeds, and
        dispatches every client to the end of its work."""
        if not self.clocked:
            raise OptionError("speed", f"must be 'synthetic' or 'trace': {algorithm} runs on a virtual clock (the "
                                       f"device speeds order its arrivals).")
        defaults = {f.name: f.default for f in dataclasses.fields(Participation)}
        for key in ("availability", "deadline", "over_selection", "stragglers", "dropout", "policy"):
            if getattr(self, key) != defaults[key]:
                raise OptionError(key, f"is not supported by the asynchronous {algorithm} (its clients always finish "
                                       f"their work); remove it.")

    def check_deadline(self, population: int, work: "Work") -> None:
        """Refuse a ``deadline`` that no client of ``population`` can meet with its ``work`` (a :class:`Work`): its
        whole local steps under ``policy: drop``, one step under ``partial``, and its bytes down and up (without
        jitter)."""
        if self.deadline is None or not self.clocked:
            return
        dev = self.devices(population)
        steps = np.asarray(work.steps)[:population]
        steps = steps if self.policy == "drop" else np.minimum(steps, 1)
        compute = steps * np.asarray(work.samples, np.float64)[:population] * dev.ms_per_sample / 1000
        need = compute + 8 * float(work.nbytes) / (1000 * dev.kbps.astype(np.float64))
        fastest = int(np.argmin(need))
        if need[fastest] > self.deadline:
            what = f"{int(steps[fastest])} local step{'s' if steps[fastest] != 1 else ''}"
            raise OptionError("deadline", f"{self.deadline:g} s is shorter than every client's round: the fastest "
                                          f"(client {fastest}) needs {need[fastest]:.3g} s ({compute[fastest]:.3g} s "
                                          f"for its {what} (policy: {self.policy}), the rest to send "
                                          f"{float(work.nbytes):,.0f} bytes); raise the deadline or lower the work.")

    # ------------------------------------------------------------------------------------------------ devices
    def devices(self, population: int) -> Devices:
        """The :class:`~fljax.participation.devices.Devices` of ``population`` training clients (host arrays, made
        once per participation and population; the trace files are read and checked here)."""
        return _devices(self, population)

    # ------------------------------------------------------------------------------------------------ drawing
    def sample(self, ctx, size: int | None, available=None) -> Cohort:
        """Whom the round selects: ``size`` clients (None: every one) among ``ctx``'s training clients, or among
        those ``available`` ([N] bool) marks. Pure and traced."""
        raise NotImplementedError

    def draw(self, ctx, cohort_size: int | None, work: Work | None = None) -> Cohort:
        """The round's :class:`Cohort` among ``ctx``'s training clients (``ctx``: the round's
        :class:`~fljax.engine.context.RoundContext`; ``cohort_size`` m: the algorithm's, None for every client;
        ``work``: the round's :class:`Work`, needed when :attr:`system`). Pure and traced."""
        if not self.system:
            return self.sample(ctx, cohort_size)
        from fljax.participation.system import draw

        return draw(self, ctx, cohort_size, work)

    def sampling(self, population: int, cohort_size: int | None):
        """The :class:`fljax.privacy.Sampling` a privacy accountant accounts one round of this participation by
        (``population`` N training clients, ``cohort_size`` m; None: N), or None when it has no amplification
        result (client-level privacy then refuses it)."""
        return None

    def expected_size(self, population: int, cohort_size: int | None) -> float:
        """The expected number of clients selected in a round."""
        return float(population if cohort_size is None else min(cohort_size, population))

    def to_dict(self) -> dict:
        return {"name": self.name, **super().to_dict()}


@functools.lru_cache(maxsize=32)
def _devices(p: Participation, n: int) -> Devices:
    from fljax.participation import traces

    speeds: dict = {}
    if p.speed == "synthetic":
        rng = np.random.default_rng([p.seed, 0])
        speeds = dict(ms_per_sample=p.ms_per_sample * np.exp(p.compute_sigma * rng.standard_normal(n)),
                      kbps=p.kbps * np.exp(p.bandwidth_sigma * rng.standard_normal(n)))
    elif p.speed == "trace":
        capacity = traces.read_capacity(p.capacity_trace)
        _covers("capacity_trace", p.capacity_trace, capacity.clients, n)
        speeds = dict(ms_per_sample=capacity.ms_per_sample[:n], kbps=capacity.kbps[:n])
    if speeds:
        speeds["ms_per_sample"] = (speeds["ms_per_sample"] * p.compute_factor).astype(np.float32)
        speeds["kbps"] = speeds["kbps"].astype(np.float32)
    if p.availability == "diurnal":
        phase = np.random.default_rng([p.seed, 1]).random(n).astype(np.float32)
        return Devices(n, availability="diurnal", phase=phase, period=p.period, on_fraction=p.on_fraction, **speeds)
    if p.availability == "trace":
        trace = traces.read_behave_trace(p.behave_trace)
        _covers("behave_trace", p.behave_trace, trace.clients, n)
        if not np.isfinite(trace.active[:n]).any():
            raise OptionError("behave_trace", f"{p.behave_trace!r}: none of its first {n} clients is ever available.")
        return Devices(n, availability="trace", active=trace.active[:n].astype(np.float32),
                       inactive=trace.inactive[:n].astype(np.float32), finish=trace.finish[:n].astype(np.float32),
                       **speeds)
    return Devices(n, **speeds)


def _covers(key: str, path: str, records: int, population: int) -> None:
    if records < population:
        raise OptionError(key, f"{path!r} holds {records} clients, fewer than the {population} training clients it "
                               f"must cover (one record per client, in key order).")


@PARTICIPATIONS.register
@dataclasses.dataclass(frozen=True)
class Uniform(Participation):
    """m = ``cohort_size`` training clients drawn uniformly without replacement each round (every one with None):
    :func:`fljax.engine.sampling.sample_cohort` on the round's SAMPLE stream, or m uniformly among the available
    ones (fewer when fewer are available: empty slots). Accounted as sampling without replacement (replace-one
    adjacency)."""

    name = "uniform"
    summary = "m = algo.cohort_size clients uniformly without replacement each round (the default)"

    def sample(self, ctx, size, available=None):
        if available is None:
            return Cohort(ids=ctx.sample_cohort(size))
        n = ctx.num_train_clients
        size = n if size is None else min(size, n)
        u = jnp.where(available, jax.random.uniform(ctx.sample_stream(), (n,)), 2.0)
        chosen = jax.lax.top_k(-u, size)[1]  # the `size` smallest keys among the available: a uniform subset
        ids = jnp.sort(jnp.where(u[chosen] < 2.0, chosen, n)).astype(jnp.int32)
        return Cohort(ids=ids, valid=ids < n)

    def sampling(self, population, cohort_size):
        from fljax.privacy import Sampling

        return None if self.drops_clients else Sampling("fixed", population,
                                                        self.expected_size(population, cohort_size))


@PARTICIPATIONS.register
@dataclasses.dataclass(frozen=True)
class Poisson(Participation):
    """Every training client independently with probability q = m/N (m = ``cohort_size``, N the training clients),
    into a buffer of ``capacity`` slots (None: N, never truncated): sorted ids first, empty slots holding N
    (:func:`fljax.ops.privacy.poisson_cohort`, on the round's SAMPLE stream). DP-FedAvg's sampling (McMahan et al.
    2018, Alg. 1), accounted as Poisson subsampling (add-or-remove adjacency), truncated when ``capacity`` < N. With
    an availability model the unavailable clients are removed from the buffer after the draw."""

    name = "poisson"
    summary = "each client independently with probability q = cohort_size / N (DP-FedAvg's sampling)"
    capacity: int | None = option(None, "slots of the cohort buffer; fewer than the training clients truncates a "
                                        "large draw (accounted by the PLD accountant only) (null: every client)",
                                  at_least(1))

    def check(self) -> None:
        super().check()
        if self.over_selection:
            raise OptionError("over_selection", "selects a fixed number of clients; poisson's cohorts have no fixed "
                                                "size: use participation.name: uniform.")

    def slots(self, population: int) -> int:
        return population if self.capacity is None else self.capacity

    def validate(self, population, cohort_size):
        if self.capacity is not None and self.capacity > population:
            raise OptionError("capacity", f"must be at most the {population} training clients (null: all of them), "
                                          f"got {self.capacity}.")
        super().validate(population, cohort_size)

    def sample(self, ctx, size, available=None):
        n = ctx.num_train_clients
        rate = self.expected_size(n, size) / n
        ids, valid = ctx.sample_poisson(rate, self.slots(n))
        if available is not None:
            valid = valid & available[jnp.minimum(ids, n - 1)]
            ids = jnp.sort(jnp.where(valid, ids, n)).astype(jnp.int32)
            valid = ids < n
        return Cohort(ids=ids, valid=valid)

    def sampling(self, population, cohort_size):
        from fljax.privacy import Sampling

        return None if self.drops_clients else Sampling("poisson", population,
                                                        self.expected_size(population, cohort_size), self.capacity)


def default_participation(client_privacy: bool, clocked: bool = False) -> Participation:
    """The participation of a run without a ``participation:`` section: uniform cohorts, or Poisson ones under
    client-level privacy (the sampling DP-FedAvg is accounted by; docs/privacy.md); ``clocked`` (an asynchronous
    algorithm, which runs on a virtual clock): uniform with synthetic device speeds."""
    if clocked:
        return Uniform(speed="synthetic")
    return Poisson() if client_privacy else Uniform()
