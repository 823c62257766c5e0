"""From a source to :class:`FederatedData`: partition, per-client test splits, padded or ragged client arrays.

Per-client test splits follow each client's own label distribution:

* pooled sources: client i receives ``test_per_client`` images from the global test pool, with per-class counts
  proportional to its train label histogram (largest-remainder rounding), drawn without replacement within a
  client and independently across clients (papers' protocol: FedSLR §7, DFedAlt §5);
* natural sources (Synthetic, LEAF, the stand-ins): a stratified hold-out of ``test_fraction`` of each client's own
  samples; for next-token sequences the last ``test_fraction`` of each client's sequences (:func:`tail_mask`); a
  source that brings its own test splits (your per-client files with test arrays) keeps them.

That is the data of the classification problem, registered here as its data kind
(:func:`fljax.data.registry.register_data_kind`); :func:`load_federated` loads any data set and has the data kind
of its problem assemble it.
"""
from __future__ import annotations

import numpy as np

from fljax.data import memory, partitioners as partition_lib
from fljax.data.config import DataConfig
from fljax.data.federated import FederatedData, pad_flat, sample_dtype
from fljax.data.ragged import ragged_clients
from fljax.data.registry import DATA_KINDS, DataKind, register_data_kind
from fljax.data.text import TokenShape
from fljax.data.types import DataError, Natural, Pooled
from fljax.errors import OptionError

__all__ = ["pool_test_split", "holdout_mask", "tail_mask", "holdout_split", "stack_clients", "federate",
           "make_federated",
           "load_federated"]


TEST_ROUNDING = ("largest_remainder", "floor", "ceil")


def _class_counts(props: np.ndarray, total: int, rounding: str) -> np.ndarray:
    """Per-class test counts from label proportions: exactly ``total`` (largest remainder), ⌊p·T⌋ (FedSLR §7) or
    ⌈p·T⌉ (DFedAlt §5)."""
    raw = props * total
    if rounding == "floor":
        return np.floor(raw + 1e-9).astype(int)
    if rounding == "ceil":
        return np.ceil(raw - 1e-9).astype(int)
    if rounding != "largest_remainder":
        raise DataError(f"test rounding must be one of {TEST_ROUNDING}, got {rounding!r}.")
    out = np.floor(raw).astype(int)
    for j in np.argsort(-(raw - out))[: total - out.sum()]:
        out[j] += 1
    return out


def pool_test_split(train_labels: list[np.ndarray], test_labels: np.ndarray, num_classes: int,
                    per_client: int, seed: int, rounding: str = "largest_remainder") -> list[np.ndarray]:
    """Indices into the test pool for every client, with class counts ∝ its train label histogram (capped at the
    class's pool size; drawn without replacement within a client, independently across clients)."""
    rng = np.random.default_rng(seed + 7919)
    pools = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
    out = []
    for labels in train_labels:
        hist = np.bincount(labels, minlength=num_classes).astype(float)
        want = _class_counts(hist / hist.sum(), per_client, rounding)
        idx = [rng.choice(pools[c], min(k, len(pools[c])), replace=False) for c, k in enumerate(want) if k > 0]
        out.append(np.sort(np.concatenate(idx)) if idx else np.zeros(0, np.int64))
    return out


def holdout_mask(labels: np.ndarray, counts, fraction: float, seed: int) -> np.ndarray:
    """Stratified hold-out within every client, vectorised over all samples: ``labels [S]`` stored client after
    client (``counts [C]``); returns the test mask ``[S]``.

    Within client i, each class c with n_ic ≥ 2 samples gives ``round(fraction·n_ic)`` (at least one) samples, drawn
    uniformly without replacement, to the test split; the train split is never left empty. (One sort of all samples
    by (client, class, a uniform key): the first samples of every (client, class) group are its test samples.)
    """
    labels = np.asarray(labels, np.int64)
    counts = np.asarray(counts, np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(seed + 104729)
    order = np.lexsort((rng.random(len(labels)), labels, owner))
    group = owner[order] * (int(labels.max(initial=0)) + 1) + labels[order]
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    size = np.diff(np.r_[first, len(group)])
    rank = np.arange(len(group)) - np.repeat(first, size)
    n = np.repeat(size, size)
    take = np.maximum(1, np.round(fraction * n).astype(np.int64))
    mask = np.zeros(len(labels), bool)
    mask[order] = (n >= 2) & (rank < take)
    return mask


def tail_mask(counts, fraction: float) -> np.ndarray:
    """The test mask ``[S]`` of samples stored client after client (``counts [C]``) that holds out the last
    ``round(fraction·n_i)`` samples of every client with n_i ≥ 2 (at least one, never all): the split of text, whose
    consecutive sequences continue one another, so no test sequence's context was trained on."""
    counts = np.asarray(counts, np.int64)
    take = np.where(counts >= 2, np.clip(np.round(fraction * counts), 1, counts - 1), 0).astype(np.int64)
    rank = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return rank >= np.repeat(counts - take, counts)


def holdout_split(labels: list[np.ndarray], fraction: float, seed: int) -> tuple[list, list]:
    """:func:`holdout_mask` on per-client label arrays: returns (train indices, test indices) per client."""
    counts = [len(y) for y in labels]
    test = holdout_mask(np.concatenate(labels) if labels else np.zeros(0, np.int64), counts, fraction, seed)
    parts = np.split(test, np.cumsum(counts)[:-1])
    return [np.flatnonzero(~t) for t in parts], [np.flatnonzero(t) for t in parts]


STORAGES = ("padded", "ragged")


def stack_clients(x: np.ndarray, y: np.ndarray, counts, storage: str = "padded", rows=None):
    """Client arrays of samples stored client after client in ``x[rows]``/``y[rows]`` (``rows`` None: the leading
    rows): padded (:func:`~fljax.data.federated.pad_flat`) or ragged (:func:`~fljax.data.ragged.ragged_clients`)."""
    if storage not in STORAGES:
        raise DataError(f"storage must be one of {STORAGES}, got {storage!r}.")
    if storage == "padded":
        return pad_flat(x, y, counts, rows=rows, x_dtype=sample_dtype(x))
    return ragged_clients(x, y, counts, rows=rows)


def _flat(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], storage: str):
    """Client arrays of the rows ``parts[i]`` of ``x``/``y`` for every client i."""
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return stack_clients(x, y, [len(p) for p in parts], storage, rows=idx)


def federate(source: Pooled | Natural, num_clients: int, partition: str, seed: int, *,
             test_per_client: int | None = None, test_fraction: float = 0.2,
             test_rounding: str = "largest_remainder", storage: str = "padded", **options) -> FederatedData:
    """Partition a source into clients and build train/test client arrays, padded or ragged (``storage``,
    :mod:`fljax.data.ragged`); ``options`` are the partitioner's (e.g. ``alpha=0.1`` for dirichlet)."""
    if isinstance(source, Natural):
        if partition not in ("natural",):
            raise DataError(f"{source.name} defines its own clients; use partition='natural', not {partition!r}.")
        if len(source.counts) != num_clients:
            raise DataError(f"{source.name} was generated for {len(source.counts)} clients, not {num_clients}.")
        input_shape = source.input_shape or source.x.shape[1:]
        if source.test is not None:
            train = stack_clients(source.x, source.y, source.counts, storage)
            test = stack_clients(source.test.x, source.test.y, source.test.counts, storage)
            desc = "natural clients with their own test splits"
        else:
            tokens = source.y.ndim > 1
            test_mask = tail_mask(source.counts, test_fraction) if tokens else \
                holdout_mask(source.y, source.counts, test_fraction, seed)
            owner = np.repeat(np.arange(num_clients), source.counts)
            train, test = (stack_clients(source.x, source.y, np.bincount(owner[m], minlength=num_clients), storage,
                                         rows=np.flatnonzero(m)) for m in (~test_mask, test_mask))
            desc = (f"natural clients, the last {test_fraction:.0%} of every client's sequences held out" if tokens
                    else f"natural clients, stratified {test_fraction:.0%} per-client hold-out")
    elif partition_lib.PARTITIONERS.get(partition) is not None and partition_lib.PARTITIONERS[partition].build:
        entry = partition_lib.PARTITIONERS[partition]
        if storage != "padded":
            raise OptionError("storage", f"must be 'padded' for partition {partition!r} (it builds its own client "
                                         f"arrays), got {storage!r}.")
        return entry.build(source, num_clients, seed, partition_lib.parse(entry.options, options,
                                                                            f" for partition {partition!r}"))
    else:
        if partition == "natural":
            raise DataError(f"{source.name} has no natural clients; use one of "
                            f"{sorted(set(partition_lib.PARTITIONERS) - {'natural'})}.")
        parts = partition_lib.partition(partition, source.y_train, num_clients, seed, **options)
        per_client = max(1, int(np.ceil(len(source.y_test) / num_clients))) if test_per_client is None else \
            test_per_client
        entry = partition_lib.PARTITIONERS[partition]
        if entry.split_test is not None:
            if test_per_client is not None:
                raise OptionError("test_per_client", f"is not used by partition {partition!r}, which cuts its own "
                                                     f"test slices; remove it.")
            opts = partition_lib.parse(entry.options, options, f" for partition {partition!r}")
            tests = entry.split_test([source.y_train[p] for p in parts], source.y_test, seed, opts)
        else:
            tests = pool_test_split([source.y_train[p] for p in parts], source.y_test, source.num_classes,
                                    per_client, seed, test_rounding)
        empty = [i for i, t in enumerate(tests) if len(t) == 0]
        if empty:
            raise OptionError("test_per_client", f"is too small: {per_client} with test_rounding={test_rounding!r} "
                                                 f"leaves {len(empty)} of {num_clients} clients without test samples "
                                                 f"(first: client {empty[0]}); raise it or use test_rounding="
                                                 f"'largest_remainder'.")
        train = _flat(source.x_train, source.y_train, parts, storage)
        test = _flat(source.x_test, source.y_test, tests, storage)
        input_shape = source.x_train.shape[1:]
        desc = (f"partition {partition}, " + ("test slices cut by the partitioner" if entry.split_test is not None else
                                              f"per-client test sets of {per_client} following each client's labels"))
    return FederatedData(train=train, test=test, num_classes=source.num_classes,
                         input_shape=input_shape if isinstance(input_shape, TokenShape) else tuple(input_shape),
                         name=source.name, description=desc)


def _federated(config: DataConfig, source: Pooled | Natural, seed: int) -> FederatedData:
    """The data of a classification set: ``source`` federated as ``config`` says (:func:`federate`), every client's
    test split padded to ``config.test_rows`` when set."""
    data = federate(source, config.num_clients, config.partition, seed, test_per_client=config.test_per_client,
                    test_fraction=config.test_fraction, test_rounding=config.test_rounding, storage=config.storage,
                    **config.components()[1].to_dict())
    if config.test_rows is not None:
        if config.storage != "padded":
            raise OptionError("test_rows", "pads padded client arrays; remove it with storage: ragged.")
        if config.test_rows < data.test.n_max:
            raise OptionError("test_rows", f"must be at least the largest client's test split "
                                           f"({data.test.n_max}), got {config.test_rows}.")
        test = data.test
        row = (test.x.nbytes + test.y.nbytes + test.mask.nbytes) // max(test.num_clients * test.n_max, 1)
        memory.check_bytes(2 * test.num_clients * config.test_rows * row, "lower data.test_rows",
                           f"{test.num_clients:,} clients' test splits padded to data.test_rows={config.test_rows:,} "
                           f"rows")
        data = data.replace(test=test.padded(config.test_rows))
    return data


register_data_kind("classification", DataKind(
    "labelled examples, split over clients by a partitioner or by the data set itself (FederatedData)", _federated))


def load_federated(config: DataConfig, seed: int):
    """The clients' data ``config`` describes, drawn with ``config.seed`` (``seed`` when that is null): what its
    data set loads, assembled by the data kind of the problem it poses (:data:`fljax.data.registry.DATA_KINDS`): a
    :class:`FederatedData` for classification, the clients' packed rows for consensus regression (a
    :class:`~fljax.problems.ClientBlocks`)."""
    seed = seed if config.seed is None else config.seed
    source = config.source
    loaded = source.load(config.components()[0], config.num_clients, seed)
    return DATA_KINDS[source.problem].assemble(config, loaded, seed)


def make_federated(dataset: str = "synthetic", num_clients: int = 100, partition: str | None = None, seed: int = 0,
                   **options) -> FederatedData:
    """Load ``dataset`` and federate it (the default partition is 'natural' for synthetic, 'dirichlet' otherwise).
    ``options``: the per-client test split keys and the data set's and partitioner's own options (``fljax list``
    shows them), checked as a config's ``data:`` section is (:class:`fljax.data.DataConfig`)."""
    config = DataConfig.from_dict({"dataset": dataset, "num_clients": num_clients, "partition": partition, **options})
    return load_federated(config, seed)
