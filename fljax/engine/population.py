"""Heterogeneous client populations: groups of clients with their own model and hyperparameters.

A :class:`Population` is a sequence of :class:`ClientGroup` s. Group g holds consecutive client ids (group 0 the first
``size_0`` clients, group 1 the next ``size_1``, …: order the data so, e.g. by a random partition), runs its own
model (architecture) and may override hyperparameters of the algorithm (a bit width, QuPeD's λ_p per architecture).
Every group's clients are stacked along their own leading axis, so the simulation state's per-client part is a
tuple with one pytree per group, each mapped through the executor like any cohort (one vectorised program per group
inside the round's one compiled program); all groups share the round clock, the server and the cohort drawn over
the whole population (:mod:`fljax.engine.cohort`). Per-client randomness is keyed by client id, so splitting a
population into groups of the same type changes no number.

Without a population (``Simulation(groups=None)``) the per-client state is one pytree with one leading axis, as
before; a population of one group is a tuple of one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

__all__ = ["ClientGroup", "Population"]


@dataclasses.dataclass(frozen=True)
class ClientGroup:
    """``size`` clients that run ``model`` (None: the simulation's model) with the algorithm's hyperparameters
    replaced by ``hp`` (a mapping or (key, value) pairs; kept as sorted pairs so the group is hashable)."""

    name: str
    size: int
    model: Any = None
    hp: tuple = ()

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"client group {self.name!r}: size must be >= 1, got {self.size}.")
        items = self.hp.items() if isinstance(self.hp, dict) else self.hp
        object.__setattr__(self, "hp", tuple(sorted((str(k), _frozen(v)) for k, v in items)))

    @property
    def overrides(self) -> dict:
        return dict(self.hp)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class Population:
    """Groups of clients with consecutive ids, in order."""

    groups: tuple[ClientGroup, ...]

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(self.groups))
        if not self.groups:
            raise ValueError("a population needs at least one client group.")
        names = [g.name for g in self.groups]
        if len(set(names)) < len(names):
            raise ValueError(f"client group names must be distinct, got {names}.")

    @classmethod
    def of(cls, groups: "Population | Sequence[ClientGroup]") -> "Population":
        return groups if isinstance(groups, Population) else cls(tuple(groups))

    @property
    def num_clients(self) -> int:
        return sum(g.size for g in self.groups)

    def bounds(self, g: int) -> tuple[int, int]:
        """Client ids [lo, hi) of group g."""
        lo = sum(grp.size for grp in self.groups[:g])
        return lo, lo + self.groups[g].size

    def ids(self, g: int) -> np.ndarray:
        lo, hi = self.bounds(g)
        return np.arange(lo, hi)

    def group_of(self) -> np.ndarray:
        """``[num_clients]``: the group index of every client."""
        return np.repeat(np.arange(len(self.groups)), [g.size for g in self.groups])

    def describe(self) -> str:
        return ", ".join(f"{g.name} ({g.size} clients{', ' + g.model.name if g.model is not None else ''})"
                         for g in self.groups)
