"""The participation seam: who takes part in a round, how much each one computes, and when its result arrives.

A participation is a value the centralized template owns (:class:`fljax.algorithms.base.CohortTemplate`): every round
it asks :meth:`Participation.draw` for the round's :class:`Cohort` — the client ids that train (a buffer of static
size with a validity mask when the number varies), each one's local-step budget and, where the participation keeps a
virtual clock, each one's round time. The draw is a pure function of the round's keys, so every executor, lane and
resume sees the same cohorts. The config section is ``participation:`` with ``name`` and the chosen participation's
own options (declared on its class, which registers itself in :data:`PARTICIPATIONS`)::

    participation: {name: poisson, capacity: 20}

* ``uniform`` (the default): m = ``algo.cohort_size`` clients without replacement, the engine's cohorts bit for bit
  (heterogeneity spec, "uniform(m)").
* ``poisson``: every training client independently with probability q = m/N, into a buffer of ``capacity`` slots
  (DP-FedAvg's sampling, McMahan et al. 2018; heterogeneity spec, "poisson(q)").

The privacy accountant asks the participation for its sampling (:meth:`Participation.sampling`: a
:class:`fljax.privacy.Sampling`, the dp-accounting event's description); a participation without an amplification
result returns None and client-level privacy refuses it in one line. Without a ``participation:`` section a run
draws uniform cohorts, or Poisson ones under client-level privacy (DP-FedAvg's sampling; docs/privacy.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax

from fljax.errors import OptionError
from fljax.options import Options, Registry, at_least, option

__all__ = ["Cohort", "Participation", "PARTICIPATIONS", "Uniform", "Poisson", "default_participation"]


@flax.struct.dataclass
class Cohort:
    """One round's participants: ``ids`` [m] client ids in ascending order (an empty slot of a buffer holds
    ``num_clients``, past the last client); ``valid`` [m] marks the slots that hold a sampled client (None: all do);
    ``steps`` [m] the local steps each one completes (None: its whole batch plan; fewer: a straggler's partial work,
    :class:`fljax.engine.protocol.ClientInput`'s ``steps``); ``time`` [m] the virtual seconds each one's round takes
    (None: the participation keeps no clock)."""

    ids: jax.Array
    valid: Any = None
    steps: Any = None
    time: Any = None


PARTICIPATIONS = Registry("participation")  # name -> class; `participation: {name: ..., options}` parses through it


@dataclasses.dataclass(frozen=True)
class Participation(Options):
    """Base of a participation: a frozen dataclass of its options (each declared with
    :func:`fljax.options.option`), with a ``name`` and a one-line ``summary``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def draw(self, ctx, cohort_size: int | None) -> Cohort:
        """The round's :class:`Cohort` among ``ctx``'s training clients (``ctx``: the round's
        :class:`~fljax.engine.context.RoundContext`; ``cohort_size`` m: the algorithm's, None for every client).
        Pure and traced."""
        raise NotImplementedError

    def sampling(self, population: int, cohort_size: int | None):
        """The :class:`fljax.privacy.Sampling` a privacy accountant accounts one round of this participation by
        (``population`` N training clients, ``cohort_size`` m; None: N), or None when it has no amplification
        result (client-level privacy then refuses it)."""
        return None

    def expected_size(self, population: int, cohort_size: int | None) -> float:
        """The expected number of clients that train in a round."""
        return float(population if cohort_size is None else min(cohort_size, population))

    def validate(self, population: int, cohort_size: int | None) -> None:
        """Refuse, in one line naming the key, options impossible for ``population`` training clients and cohorts of
        ``cohort_size``."""

    def to_dict(self) -> dict:
        return {"name": self.name, **super().to_dict()}


@PARTICIPATIONS.register
@dataclasses.dataclass(frozen=True)
class Uniform(Participation):
    """m = ``cohort_size`` training clients drawn uniformly without replacement each round (every one with None):
    :func:`fljax.engine.sampling.sample_cohort` on the round's SAMPLE stream. Accounted as sampling without
    replacement (replace-one adjacency)."""

    name = "uniform"
    summary = "m = algo.cohort_size clients uniformly without replacement each round (the default)"

    def draw(self, ctx, cohort_size):
        return Cohort(ids=ctx.sample_cohort(cohort_size))

    def sampling(self, population, cohort_size):
        from fljax.privacy import Sampling

        return Sampling("fixed", population, self.expected_size(population, cohort_size))


@PARTICIPATIONS.register
@dataclasses.dataclass(frozen=True)
class Poisson(Participation):
    """Every training client independently with probability q = m/N (m = ``cohort_size``, N the training clients),
    into a buffer of ``capacity`` slots (None: N, never truncated): sorted ids first, empty slots holding N
    (:func:`fljax.ops.privacy.poisson_cohort`, on the round's SAMPLE stream). DP-FedAvg's sampling (McMahan et al.
    2018, Alg. 1), accounted as Poisson subsampling (add-or-remove adjacency), truncated when ``capacity`` < N."""

    name = "poisson"
    summary = "each client independently with probability q = cohort_size / N (DP-FedAvg's sampling)"
    capacity: int | None = option(None, "slots of the cohort buffer; fewer than the training clients truncates a "
                                        "large draw (accounted by the PLD accountant only) (null: every client)",
                                  at_least(1))

    def slots(self, population: int) -> int:
        return population if self.capacity is None else self.capacity

    def validate(self, population, cohort_size):
        if self.capacity is not None and self.capacity > population:
            raise OptionError("capacity", f"must be at most the {population} training clients (null: all of them), "
                                          f"got {self.capacity}.")

    def draw(self, ctx, cohort_size):
        n = ctx.num_train_clients
        rate = self.expected_size(n, cohort_size) / n
        ids, valid = ctx.sample_poisson(rate, self.slots(n))
        return Cohort(ids=ids, valid=valid)

    def sampling(self, population, cohort_size):
        from fljax.privacy import Sampling

        return Sampling("poisson", population, self.expected_size(population, cohort_size), self.capacity)


def default_participation(client_privacy: bool) -> Participation:
    """The participation of a run without a ``participation:`` section: uniform cohorts, or Poisson ones under
    client-level privacy (the sampling DP-FedAvg is accounted by; docs/privacy.md)."""
    return Poisson() if client_privacy else Uniform()

