"""FedGiA's data sets as data sources of an experiment config (``data: {dataset: fedgia_qot, num_clients: 128}``).

Each registers itself here as every other data set does (:func:`fljax.data.register_source`, ``problem: consensus
regression``): its options (below), how to load it and the most clients it supplies; the data kind of consensus
regression (:func:`fljax.data.register_data_kind`) takes the packed clients as loaded and refuses the keys of a data
section that split examples into train and test (every client's rows train). A load draws one instance
from the data seed — the clients' ``(A_i, b_i)`` of :mod:`fljax.problems.fedgia_data` — and packs it into padded
size classes (:func:`~fljax.problems.pack_trials`), the data of one run (a :class:`~fljax.problems.ClientBlocks`,
grouped data: each size class is a group of the run's population).

Runs of several seeds run as lanes of one program only when their data have the same shapes. ``layout_seeds: T``
chooses the size classes' row counts from the client sizes of data seeds 0 … T − 1 together with the run's own
(:func:`~fljax.problems.size_blocks`), so the runs of those seeds share their shapes: Table IV's 20 trials use
``layout_seeds: 20``. Without it every run's classes fit its own clients.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from fljax.data import memory
from fljax.data.registry import DataKind, Source, register_data_kind, register_source
from fljax.errors import OptionError
from fljax.options import Options, at_least, between, option, with_default
from fljax.problems.fedgia_data import (ClientBlocks, pack_trials, qot_instance, qot_sizes, sct_standin_instance,
                                       size_blocks, v1_instance, v1_sizes)

__all__ = ["Packing", "V1Options", "QotOptions", "SctStandinOptions", "load_v1", "load_qot", "load_sct_standin",
           "PROBLEM"]

PROBLEM = "consensus regression"  # the problem these data sets pose (an algorithm's ``problem``)

V1_MAX_CLIENTS = 100_000
QOT_MAX_CLIENTS = 8992 // 2  # qot's rows, at least two per client


@dataclasses.dataclass(frozen=True)
class Packing(Options):
    """How the clients' rows are padded (spec §10.2): ``size_classes`` classes of clients ranked by size, each padded
    to its own row count; ``layout_seeds`` (module docstring); ``gram``: pack the least-squares statistics B_i,
    A_iᵀb_i, ‖b_i‖² (null: when every class has more padded rows than features)."""

    size_classes: int = option(1, "size classes the clients are padded in (ranked by rows; spec §10.2)",
                               between(1, 64))
    layout_seeds: int | None = option(None, "choose the size classes' rows over data seeds 0 … layout_seeds − 1 and "
                                            "the run's own, so those seeds' runs share shapes (lanes); null: the "
                                            "run's own clients", at_least(1))
    gram: bool | None = option(None, "pack the least-squares statistics B_i, A_iᵀb_i (null: when every size class "
                                     "has more padded rows than features)")


@dataclasses.dataclass(frozen=True)
class V1Options(Packing):
    """Example V.1 (:func:`~fljax.problems.v1_instance`): least-squares data, n features, d_i rows per client."""

    features: int = option(100, "features n", at_least(1))
    rows_min: int = option(50, "fewest rows of a client (d_i ~ UniformInt{rows_min..rows_max}, D6)", at_least(1))
    rows_max: int = option(150, "most rows of a client", at_least(1))
    generator: Literal["code", "paper_text"] = option("code", "the reference code's generator (D5) or the paper's "
                                                              "text")
    block_len: Literal["loop", "own"] = option("loop", "the code generator's block length: the loop counter's d_j "
                                                       "(the reference code) or the chosen client's own")

    def check(self) -> None:
        if self.rows_max < self.rows_min:
            raise OptionError("rows_max", f"must be >= rows_min = {self.rows_min}, got {self.rows_max}.")


@dataclasses.dataclass(frozen=True)
class QotOptions(Packing):
    """qot as Examples V.2/V.3 use it (:func:`~fljax.problems.qot_instance`): unit-norm columns, labels {0, 1}, the
    rows shuffled and cut into random contiguous clients."""

    size_classes: int = with_default(Packing, "size_classes", 6)
    min_client_frac: float = option(0.025, "every client holds more than min_client_frac·d/m rows (D8)",
                                    between(0, 1))


@dataclasses.dataclass(frozen=True)
class SctStandinOptions(Packing):
    """A synthetic stand-in for sct (D21, :func:`~fljax.problems.sct_standin_instance`): never to be compared with
    the paper's sct numbers."""

    size_classes: int = with_default(Packing, "size_classes", 6)
    rows: int = option(200_000, "rows d of the whole data set", at_least(2))
    features: int = option(200, "features n", at_least(1))
    positives: float = option(0.1, "fraction of the rows labelled 1", between(0, 1, open_=True))
    min_client_frac: float = option(0.025, "every client holds more than min_client_frac·d/m rows (D8)",
                                    between(0, 1))


INSTANCE_COPIES = 3  # a client's rows held at once: generated, packed into its size class, their Gram statistics


def _check_instance(rows: int, features: int, advice: str, what: str) -> None:
    """Refuse an instance of ``rows`` × (``features`` + 1) float64 values that could not be held (generated and
    packed) in this machine's memory, before it is drawn."""
    memory.check_bytes(INSTANCE_COPIES * 8 * rows * (features + 1), advice, what)


def _pack(name: str, instance: list, sizes_of, o: Packing, seed: int) -> ClientBlocks:
    """One instance packed into ``o.size_classes`` classes, their rows chosen over ``o.layout_seeds`` (module
    docstring)."""
    own = np.array([len(b) for _, b in instance])
    memory.check_bytes((o.layout_seeds or 0) * (8 * len(own) + 112), "lower data.layout_seeds",
                       f"the client sizes of data.layout_seeds={o.layout_seeds:,} data seeds" if o.layout_seeds else "")
    seeds = [s for s in range(o.layout_seeds or 0) if s != seed]
    sizes = np.stack([own] + [sizes_of(s) for s in seeds])
    layout = size_blocks(sizes, o.size_classes)
    n = instance[0][0].shape[1]
    gram = all(rows > n for _, _, rows in layout) if o.gram is None else o.gram
    return dataclasses.replace(pack_trials([instance], blocks=o.size_classes, layout=layout, gram=gram).trials()[0],
                               name=name)


def load_v1(o: V1Options, num_clients: int, seed: int) -> ClientBlocks:
    _check_instance(num_clients * o.rows_max, o.features, "lower data.features, data.rows_max or data.num_clients",
                    f"fedgia_v1's {num_clients:,} clients of up to data.rows_max={o.rows_max:,} rows × "
                    f"data.features={o.features:,}")
    d_range = (o.rows_min, o.rows_max)
    instance = v1_instance(seed, m=num_clients, n=o.features, d_range=d_range, generator=o.generator,
                           block_len=o.block_len)
    return _pack("fedgia_v1", instance, lambda s: v1_sizes(s, num_clients, d_range), o, seed)


def load_qot(o: QotOptions, num_clients: int, seed: int) -> ClientBlocks:
    return _pack("fedgia_qot", qot_instance(seed, m=num_clients, min_client_frac=o.min_client_frac),
                 lambda s: qot_sizes(s, num_clients, o.min_client_frac), o, seed)


def load_sct_standin(o: SctStandinOptions, num_clients: int, seed: int) -> ClientBlocks:
    _check_instance(o.rows, o.features, "lower data.rows or data.features",
                    f"the sct stand-in's data.rows={o.rows:,} rows × data.features={o.features:,}")

    def instance(s):
        return sct_standin_instance(s, m=num_clients, d=o.rows, n=o.features, positives=o.positives,
                                    min_client_frac=o.min_client_frac)

    return _pack("fedgia_sct_standin", instance(seed), lambda s: np.array([len(b) for _, b in instance(s)]), o, seed)


def _check(config) -> None:
    """A consensus-regression data section splits no examples into train and test: every client's rows are training
    rows (spec §1), padded per size class."""
    unused = (("test_per_client", None), ("test_fraction", 0.2), ("test_rows", None), ("storage", "padded"))
    for key, default in unused:
        if getattr(config, key) != default:
            raise OptionError(key, f"does not apply to {config.dataset} (every client's rows are training rows, "
                                   f"padded per size class); remove it.")


register_data_kind(PROBLEM, DataKind("every client's rows (A_i, b_i), packed in size classes (ClientBlocks)",
                                     lambda config, blocks, seed: blocks, _check))
register_source("fedgia_v1", Source(
    "FedGiA's Example V.1: least-squares rows from N(0,1), Student-t(5) and U[-5,5], d_i in [rows_min, rows_max] "
    "per client (consensus regression, offline)", V1Options, load_v1, lambda o: V1_MAX_CLIENTS, None, 0,
    natural=True, problem=PROBLEM))
register_source("fedgia_qot", Source(
    "qot as FedGiA's Examples V.2/V.3 use it: unit-norm columns, labels {0,1}, rows cut into random contiguous "
    "clients (consensus regression, offline)", QotOptions, load_qot, lambda o: QOT_MAX_CLIENTS, None, 0,
    natural=True, problem=PROBLEM))
register_source("fedgia_sct_standin", Source(
    "a synthetic stand-in for sct (D21; not sct): 200,000 x 200 Gaussian rows, 10% positives (consensus "
    "regression, offline)", SctStandinOptions, load_sct_standin, lambda o: o.rows // 2, None, 0, natural=True,
    problem=PROBLEM))
