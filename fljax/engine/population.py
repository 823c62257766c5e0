"""Client populations in groups: one mechanism for heterogeneous clients and for data of several shapes.

A :class:`Population` is a sequence of :class:`ClientGroup` s. Group g holds consecutive client ids (group 0 the first
``size_0`` clients, group 1 the next ``size_1``, …). Every group's clients are stacked along their own leading axis,
so the simulation state's per-client part is a tuple with one pytree per group (shapes may differ between groups),
each mapped through the executor like any cohort (one vectorised program per group inside the round's one compiled
program); all groups share the round clock, the server and the cohort drawn over the whole population
(:mod:`fljax.engine.cohort`). Per-client randomness is keyed by client id, so splitting a population into groups of
the same type changes no number. Groups arise two ways:

* **model groups** (:class:`~fljax.engine.Simulation` ``groups=``): a group runs its own model (architecture) and
  may override hyperparameters of the algorithm (a bit width, QuPeD's λ_p per architecture); the data is one
  padded set, sliced per group (order it so, e.g. by a random partition);
* **data-shaped groups**: the data itself comes in groups whose arrays have their own shapes, e.g. clients' rows
  padded per *size class* (FedGiA's qot clients hold from ~30 to several hundred rows:
  :func:`fljax.problems.pack_trials`); the data states its population (``group_sizes`` of
  :class:`fljax.engine.protocol.SimulationData`), and group g's context holds ``data.group(g)``.

:func:`each_group` is the one loop over groups (cohorts, evaluation and full-participation rounds run on it):
``run(k, lo, hi)`` for group k (clients lo … hi − 1); the outputs concatenated along the client axis in client order
(their structures and trailing shapes must agree, else :class:`GroupShapeError`) or returned per group.

``serial=True`` is a workaround for XLA:CPU, kept in the engine so that no algorithm carries it. XLA:CPU runs
independent operations of one program concurrently, and jaxlib's batched LAPACK kernels (Cholesky, triangular
solves) split their batch over the same thread pool and wait for it: two such kernels at once (the Cholesky
factorisations of two size classes) left both threads of a 2-core machine waiting forever (diagnosed with gdb: two
``lapack_dpotrf_ffi`` thunks in ``jax::ParallelBatchMap``). A true data dependency orders them (an
``optimization_barrier`` does not order execution): :func:`after` gives group k + 1 its input with 0·p added to every
floating-point leaf, p a finite probe read from every output leaf of group k (``where(isfinite(p), p, 0)·0``, so
the values are unchanged bit for bit), so it cannot start before group k has finished.

Without a population (``Simulation(groups=None)`` and data of one shape) the per-client state is one pytree with
one leading axis; a population of one group is a tuple of one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ClientGroup", "Population", "check_groups", "each_group", "concat_results", "after", "GroupShapeError"]


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

    @property
    def sizes(self) -> list[int]:
        return [g.size for g in self.groups]

    def bounds(self, g: int) -> tuple[int, int]:
        """Client ids [lo, hi) of group g."""
        lo = sum(grp.size for grp in self.groups[:g])
        return lo, lo + self.groups[g].size

    @classmethod
    def of_sizes(cls, sizes) -> "Population":
        """The population of groups ((name, number of clients), …) of consecutive clients (data in groups of their own
        shapes: ``group_sizes`` of :class:`fljax.engine.protocol.SimulationData`)."""
        return cls(tuple(ClientGroup(name, size) for name, size in sizes))

    def ids(self, g: int) -> np.ndarray:
        lo, hi = self.bounds(g)
        return np.arange(lo, hi)

    def group_of(self) -> np.ndarray:
        """``[num_clients]``: the group index of every client."""
        return np.repeat(np.arange(len(self.groups)), [g.size for g in self.groups])

    def describe(self) -> str:
        return ", ".join(f"{g.name} ({g.size} clients{', ' + g.model.name if g.model is not None else ''})"
                         for g in self.groups)


def check_groups(algorithm, sizes: Sequence[int], clients: int, *, stacked: bool) -> None:
    """Refuse, in one line naming ``groups``, client groups of ``sizes`` that ``algorithm`` (its class's
    ``supports_groups``) or the data (``clients`` clients; ``stacked``: every client's arrays stacked along one
    axis, which groups slice) cannot run. The one rule, asked of a config by :func:`fljax.experiment.resolve` and
    of its arguments by :class:`~fljax.engine.Simulation`."""
    from fljax.errors import OptionError

    if not algorithm.supports_groups:
        raise OptionError("groups", f"cannot be run by algorithm {algorithm.name!r}: it does not run client groups "
                                    f"(a population of models); remove groups.")
    if sum(sizes) != clients:
        raise OptionError("groups", f"sizes must add up to data.num_clients={clients}, got {sum(sizes)}.")
    if not stacked:
        raise OptionError("groups", "need padded client arrays (data.storage: padded), which groups slice; the data "
                                    "is stored ragged.")


# ---------------------------------------------------------------------------------------------------- the group loop


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


def after(value, previous):
    """``value`` made to wait for ``previous`` (a group's outputs; None: no wait): 0·p added to every floating-point
    leaf, p a finite probe of every leaf of ``previous`` (module docstring: the ``serial`` workaround). ``value``
    needs a floating-point leaf."""
    if previous is None:
        return value
    if not any(_floating(leaf) for leaf in jax.tree.leaves(value)):
        raise ValueError("groups run serially are ordered through a floating-point leaf of what they share; it has "
                         "none.")
    probe = sum(jnp.ravel(leaf)[0] for leaf in jax.tree.leaves(previous) if jnp.size(leaf))
    zero = jnp.where(jnp.isfinite(probe), probe, 0.0) * 0.0
    return jax.tree.map(lambda s: s + zero.astype(jnp.result_type(s)) if _floating(s) else s, value)


def _floating(leaf) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)
