"""The registries of data sets and of the kinds of data they load: a reader registers its data sets where it is
defined (as a TFDS builder registers itself), never in a central literal.

A data set is a :class:`Source`: a one-line summary, its options (a dataclass of :mod:`fljax.options`, whose fields
are the keys it adds to a config's ``data:`` section), how to load it and what it supplies. A reader module defines
its loader and calls :func:`register_source` beside it (:mod:`fljax.data.synthetic_data`, :mod:`fljax.data.leaf`,
FedGiA's :mod:`fljax.problems.sources`, …; docs/data.md shows a reader of one's own): importing the module registers
its sets, and the package :mod:`fljax.data` imports its built-in readers. The layers run one way: the types
(:mod:`fljax.data.types`), this registry, the readers that register in it, and what reads it
(:mod:`fljax.data.config`, :mod:`fljax.data.build`); nothing here imports a reader.

What a data set loads depends on the problem it poses (``Source.problem``, what an algorithm solves:
``Algorithm.problem``). A :class:`DataKind` per problem says which keys of a data section apply to it (``check``)
and turns what its sources load into the clients' data a simulation runs on (``assemble``; a
:class:`fljax.engine.protocol.SimulationData`): classification federates labelled examples
(:mod:`fljax.data.build`), consensus regression takes the clients' rows as its sources pack them
(:mod:`fljax.problems.sources`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fljax.data.types import DataError, Natural, Pooled
from fljax.options import Options, parse, suggest

__all__ = ["Source", "SOURCES", "register_source", "load_source", "DataKind", "DATA_KINDS", "register_data_kind"]


@dataclasses.dataclass(frozen=True)
class Source:
    """A data set: a one-line ``summary``, its ``options`` (an :class:`~fljax.options.Options` dataclass), how to
    ``load`` it and what it supplies.

    ``load(options, num_clients, seed)`` returns what the data kind of ``problem`` assembles: a :class:`Pooled` or
    :class:`Natural` set for classification (a consensus-regression set: the run's packed clients,
    :mod:`fljax.problems.sources`); ``max_clients(options)`` is the most clients it can supply (a pooled set: one
    training sample each; a natural one: as many as it generates; ``max_clients_ragged``: with ragged storage, None:
    the same); ``input_shape`` and ``num_classes`` describe one sample (a :class:`~fljax.data.text.TokenShape` for
    token sequences; None and 0 where the files say, once they are read), ``shape_of(options)`` the input shape its
    options give (None: ``input_shape``); ``natural``: it defines its own clients (partition 'natural')."""

    summary: str
    options: type[Options]
    load: Callable[..., Any]
    max_clients: Callable[[Options], int]
    input_shape: tuple | None
    num_classes: int
    natural: bool = False
    max_clients_ragged: Callable[[Options], int] | None = None
    problem: str = "classification"
    shape_of: Callable[[Options], tuple] | None = None

    def shape(self, options: Options) -> tuple | None:
        """One sample's shape with these options (a text set's configured ``seq_len`` and ``vocab``, not its
        defaults)."""
        return self.input_shape if self.shape_of is None else self.shape_of(options)


SOURCES: dict[str, Source] = {}


@dataclasses.dataclass(frozen=True)
class DataKind:
    """The data of one kind of problem: ``check(config)`` refuses the keys of a data section
    (:class:`~fljax.data.DataConfig`) that do not apply to it, in one line naming the key;
    ``assemble(config, loaded, seed)`` makes the clients' data a simulation runs on of what one of its sources
    loaded with data seed ``seed``."""

    summary: str
    assemble: Callable[..., Any]
    check: Callable[[Any], None] = lambda config: None


DATA_KINDS: dict[str, DataKind] = {}


def _register(registry: dict, what: str, name: str, entry, kind: type) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise DataError(f"a {what}'s name must be a non-empty string without surrounding spaces, got {name!r}.")
    if not isinstance(entry, kind):
        raise DataError(f"{what} {name!r} must be registered as a fljax.data.{kind.__name__}, got "
                        f"{type(entry).__name__}.")
    if name in registry:
        raise DataError(f"{what} {name!r} is registered already ({registry[name].summary}); choose another name.")
    registry[name] = entry


def register_source(name: str, source: Source) -> Source:
    """Make ``source`` the data set ``name`` (``data.dataset: name`` in a config, ``fljax list``); refuses a name
    that is taken. Returns ``source``."""
    if isinstance(source, Source) and not (isinstance(source.options, type) and issubclass(source.options, Options)):
        raise DataError(f"data set {name!r}: options must be a fljax.options.Options dataclass (NoOptions for "
                        f"none), got {source.options!r}.")
    _register(SOURCES, "data set", name, source, Source)
    return source


def register_data_kind(problem: str, kind: DataKind) -> DataKind:
    """Make ``kind`` the data of the problem ``problem`` (the ``problem`` of its sources and algorithms)."""
    _register(DATA_KINDS, "data kind", problem, kind, DataKind)
    return kind


def load_source(name: str, *, num_clients: int, seed: int, **options) -> Pooled | Natural:
    """Load a source by name (see :data:`SOURCES`) with its options (e.g. ``noise=0.5`` for digits)."""
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}.{suggest(name, SOURCES)}")
    source = SOURCES[name]
    return source.load(parse(source.options, options, f" for data set {name!r}"), num_clients, seed)
