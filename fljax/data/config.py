"""A federated data set described as plain data: the keys of a config's ``data:`` section.

The common keys (data set, number of clients, partition, data seed, per-client test split) are declared here; every
other key is an option of the chosen data set (:data:`fljax.data.registry.SOURCES`) or partitioner
(:data:`fljax.data.partitioners.PARTITIONERS`), which declare their own. The form stays flat::

    data: {dataset: digits, num_clients: 50, partition: dirichlet, alpha: 0.1}

A key that belongs to neither chosen component is refused, naming the components that have it; set to null it is
dropped instead (``--set data.alpha=null`` unsets a key a config file sets). Every error is an
:class:`fljax.errors.OptionError` naming its key.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Mapping

from fljax.data.partitioners import PARTITIONERS, Partitioner, PartitionOptions
from fljax.data.registry import DATA_KINDS, SOURCES, Source
from fljax.errors import OptionError
from fljax.options import Options, at_least, between, option, seed_check, show, suggest

__all__ = ["DataConfig"]


def _listing(kind: str, names: list[str]) -> str:
    """``partition 'a'``, ``partitions 'a' and 'b'``, or '' for none."""
    quoted = [repr(n) for n in names]
    if len(quoted) <= 1:
        return f"{kind} {quoted[0]}" if quoted else ""
    return f"{kind}s {', '.join(quoted[:-1])} and {quoted[-1]}"


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@dataclasses.dataclass(frozen=True)
class DataConfig(Options):
    """Which data set, how it is split over clients, and how each client's test split is drawn; ``options`` holds
    the data set's and the partitioner's own options (after construction: every one, defaults filled in)."""

    dataset: str = option("synthetic", "a data set from `fljax list`")
    num_clients: int = option(100, "number of clients (at most what the data set can supply)", at_least(1))
    partition: str | None = option(None, "a partitioner from `fljax list` (null: natural for synthetic, dirichlet "
                                         "otherwise)")
    seed: int | None = option(None, "data seed (null: the run seed, so every seed of a sweep draws its own "
                                    "partition)", seed_check)
    test_per_client: int | None = option(None, "pooled data sets: test samples per client from the test pool, "
                                               "following the client's labels (null: an equal share of the pool)",
                                         at_least(1))
    test_fraction: float = option(0.2, "natural clients: the stratified share of each client's samples held out "
                                       "for its test split", between(0, 1, open_=True))
    test_rounding: Literal["largest_remainder", "floor", "ceil"] = option(
        "largest_remainder", "pooled data sets: per-class test counts by largest remainder (exactly "
                             "test_per_client), floor (FedSLR) or ceil (DFedAlt)")
    storage: Literal["padded", "ragged"] = option(
        "padded", "client arrays padded to the largest client, or ragged: one flat array plus per-client offsets, "
                  "padded only for the clients that run (large populations; fljax.data.ragged)")
    test_rows: int | None = option(None, "pad every client's test split to this many rows (one shape whatever the "
                                         "seed, so that seeds with their own partitions still run as lanes)",
                                   at_least(1))
    options: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: Mapping) -> "DataConfig":
        """From the flat form: the common keys, and every other key as an option of the data set or partitioner."""
        common = set(_names(cls)) - {"options"}
        return cls(**{k: v for k, v in values.items() if k in common},
                   options={k: v for k, v in values.items() if k not in common})

    def to_dict(self) -> dict:
        """The flat form (after construction: every key of the chosen components, defaults filled in)."""
        flat = super().to_dict()
        return {**{k: v for k, v in flat.items() if k != "options"}, **flat["options"]}

    @property
    def source(self) -> Source:
        return SOURCES[self.dataset]

    @property
    def input_shape(self) -> tuple | None:
        """One sample's shape as this section configures it (a text set's ``seq_len`` and ``vocab``)."""
        return self.source.shape(self.components()[0])

    @property
    def partitioner(self) -> Partitioner:
        return PARTITIONERS[self.partition]

    @property
    def num_train_clients(self) -> int:
        """Clients that train: all but the partition's target clients (``meta_pairs``), as
        :attr:`fljax.data.FederatedData.num_train_clients` of the data this section describes; what an algorithm's
        hyperparameters are checked against (:meth:`fljax.algorithms.Algorithm.validate`)."""
        return self.num_clients - self.components()[1].num_target(self.num_clients)

    def components(self) -> tuple[Options, PartitionOptions]:
        """The data set's and the partitioner's options."""
        source_keys, partition_keys = _names(self.source.options), _names(self.partitioner.options)
        for key, value in self.options.items():
            if key not in source_keys and key not in partition_keys and value is not None:
                raise OptionError(str(key), self._foreign(str(key)))
        pick = lambda keys: {k: v for k, v in self.options.items() if k in keys}  # noqa: E731
        return self.source.options(**pick(source_keys)), self.partitioner.options(**pick(partition_keys))

    def check(self) -> None:
        if self.dataset not in SOURCES:
            raise OptionError("dataset", f"must be one of {sorted(SOURCES)}, got {show(self.dataset)}."
                                         f"{suggest(self.dataset, SOURCES)}")
        source = self.source
        partition = self.partition or ("natural" if source.natural else "dirichlet")
        if partition not in PARTITIONERS:
            raise OptionError("partition", f"must be one of {sorted(PARTITIONERS)}, got {show(partition)}."
                                           f"{suggest(partition, PARTITIONERS)}")
        if source.natural != (partition == "natural"):
            pooled = sorted(set(PARTITIONERS) - {"natural"})
            raise OptionError("partition", f"must be 'natural' for {self.dataset} (it defines its own clients), got "
                                           f"{partition!r}." if source.natural else
                                           f"cannot be 'natural' for {self.dataset} (it has no clients of its own); "
                                           f"choose one of {pooled}.")
        object.__setattr__(self, "partition", partition)
        source_options, partition_options = self.components()
        object.__setattr__(self, "options", {**source_options.to_dict(), **partition_options.to_dict()})
        most = (source.max_clients_ragged or source.max_clients)(source_options) if self.storage == "ragged" else \
            source.max_clients(source_options)
        if self.num_clients > most:
            supply = (f"the most clients {self.dataset} generates" if source.natural else
                      f"the training samples of {self.dataset}, at least one per client")
            raise OptionError("num_clients", f"must be at most {most} ({supply}), got {self.num_clients}.")
        if not source.natural:
            partition_options.check_data(most, source.num_classes)
        partition_options.num_target(self.num_clients)  # refuses target clients that leave none to train
        if source.problem not in DATA_KINDS:
            raise OptionError("dataset", f"{self.dataset} poses {source.problem} problems, whose data no data kind "
                                         f"assembles; register one (fljax.data.register_data_kind).")
        DATA_KINDS[source.problem].check(self)  # the keys that do not apply to data of its problem

    def _foreign(self, key: str) -> str:
        owners = [_listing("data set", [n for n, s in SOURCES.items() if key in _names(s.options)]),
                  _listing("partition", [n for n, p in PARTITIONERS.items() if key in _names(p.options)])]
        owners = [o for o in owners if o]
        chosen = f"data set {self.dataset!r} with partition {self.partition!r}"
        if owners:
            return f"is an option of {' and of '.join(owners)}, not of {chosen}; remove it (or set it to null)."
        valid = sorted({*_names(type(self)), *_names(self.source.options), *_names(self.partitioner.options)}
                       - {"options"})
        known = {*valid, *(k for s in SOURCES.values() for k in _names(s.options)),
                 *(k for p in PARTITIONERS.values() for k in _names(p.options))}
        hint = suggest(key, valid) or suggest(key, known)
        return f"is not a valid key for {chosen}.{hint} Valid keys: {valid}."
