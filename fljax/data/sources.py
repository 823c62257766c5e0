"""Built-in data sources.

Offline (no download): FedProx's Synthetic(α, β), scikit-learn's bundled digits, and qot (vendored). Online: TFDS
image classification sets through ``tfds.data_source`` (the data must be prepared or downloadable on the user's
machine; tests use ``tfds.testing.mock_data``).

A source is either *pooled* (global train/test arrays, to be partitioned) or *natural* (it defines its own clients).
"""
from __future__ import annotations

import dataclasses
import hashlib
from importlib import resources

import numpy as np

__all__ = ["Pooled", "Natural", "synthetic", "digits", "qot_arrays", "qot", "tfds_source", "SOURCES", "load_source",
           "DataError"]


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
class Natural:
    """A data set that defines its own clients: ``xs[i], ys[i]`` are client i's samples."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]
    num_classes: int
    name: str


def synthetic(num_clients: int, alpha: float = 1.0, beta: float = 1.0, seed: int = 0, dim: int = 60,
              num_classes: int = 10, max_samples: int | None = 1000, iid: bool = False) -> Natural:
    """FedProx's Synthetic(α, β) benchmark (Li et al. 2020; the LEAF generator).

    For client k: u_k ~ N(0, α), B_k ~ N(0, β); W_k ∈ R^{C×d}, b_k ∈ R^C have entries ~ N(u_k, 1);
    v_k ∈ R^d has entries ~ N(B_k, 1); x ~ N(v_k, Σ) with Σ_jj = j^(−1.2); y = argmax(W_k x + b_k).
    Client sizes: ⌊lognormal(4, 2)⌋ + 50 (LEAF), capped at ``max_samples`` to bound padding (None = no cap).
    As in the LEAF code, the second parameter of each normal is its standard deviation.
    ``iid=True`` shares one (W, b) and one v across clients (the Synthetic-IID setting).
    """
    if alpha < 0 or beta < 0:
        raise DataError(f"synthetic: alpha and beta must be >= 0, got alpha={alpha}, beta={beta}.")
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    cov = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    w_shared, b_shared = rng.normal(0, 1, (num_classes, dim)), rng.normal(0, 1, num_classes)
    v_shared = np.zeros(dim)
    xs, ys = [], []
    for k in range(num_clients):
        if iid:
            w, b, v = w_shared, b_shared, v_shared
        else:
            u, big_b = rng.normal(0, alpha), rng.normal(0, beta)
            w = rng.normal(u, 1, (num_classes, dim))
            b = rng.normal(u, 1, num_classes)
            v = rng.normal(big_b, 1, dim)
        x = rng.normal(v, np.sqrt(cov), (sizes[k], dim))
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w.T + b, axis=1).astype(np.int32))
    return Natural(xs, ys, num_classes, f"synthetic({alpha:g},{beta:g})")


def digits(seed: int = 0, test_per_class: int = 50, noise: float = 0.0) -> Pooled:
    """scikit-learn's bundled 8×8 digits (1,797 images, 10 classes), pixels scaled to [0, 1], shape 8×8×1.

    ``test_per_class`` images of every class are held out as the test pool. ``noise`` > 0 adds fixed
    N(0, noise²) pixel noise drawn once from the seed (used by papers to make the task harder).
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int32)
    rng = np.random.default_rng(seed)
    if noise > 0:
        x = x + rng.normal(0, noise, x.shape).astype(np.float32)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:test_per_class] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return Pooled(x[train], y[train], x[test], y[test], 10, "digits")


_QOT_SHA256 = "af94b5ce08065edc67c2c0d82c5209baa4416a461ca215ce41a4555314bd8e97"


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
    assert (b == 1).sum() == 741 and (b == -1).sum() == 8251 and a.any(axis=0).all()
    return a, b


def qot(seed: int = 0, test_fraction: float = 0.2) -> Pooled:
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
              "cifar10": "cifar10", "cifar100": "cifar100"}


def _read_tfds(name: str, split: str, data_dir: str | None, limit: int | None):
    import tensorflow_datasets as tfds

    src = tfds.data_source(name, split=split, data_dir=data_dir)
    n = len(src) if limit is None else min(limit, len(src))
    examples = [src[i] for i in range(n)]
    images = [np.asarray(ex["image"]) for ex in examples]
    labels = [int(ex["label"]) for ex in examples]
    return np.stack(images).astype(np.float32) / 255.0, np.asarray(labels, np.int32)


def tfds_source(name: str, data_dir: str | None = None, limit: int | None = None) -> Pooled:
    """An image classification set through ``tfds.data_source`` (ArrayRecord; no TensorFlow needed).

    Pixels are scaled to [0, 1]; the official train/test splits become the train and test pools. ``limit`` keeps
    the first ``limit`` examples of each split (for quick runs).
    """
    if name not in TFDS_NAMES:
        raise DataError(f"unknown TFDS data set {name!r}; choose one of {sorted(TFDS_NAMES)}.")
    tfds_name = TFDS_NAMES[name]
    try:
        x_tr, y_tr = _read_tfds(tfds_name, "train", data_dir, limit)
        x_te, y_te = _read_tfds(tfds_name, "test", data_dir, limit)
    except Exception as e:  # network-less machines end up here: say what to do
        raise DataError(f"could not load {tfds_name!r} through tensorflow_datasets ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); prepare it once on a machine with network "
                        f"(tfds.data_source downloads it) or pass data_dir.") from e
    num_classes = int(max(y_tr.max(), y_te.max()) + 1)
    return Pooled(x_tr, y_tr, x_te, y_te, num_classes, name)


SOURCES = {
    "synthetic": "FedProx Synthetic(alpha, beta): 60 features, 10 classes, natural clients (offline)",
    "digits": "scikit-learn digits: 1,797 8x8 grey images, 10 classes (offline)",
    "qot": "QSAR oral toxicity: 8,992 x 1,024 binary fingerprints, 2 classes (offline, vendored)",
    "mnist": "MNIST through TFDS (needs the data prepared or network)",
    "fashion_mnist": "Fashion-MNIST through TFDS",
    "emnist": "EMNIST balanced (47 classes) through TFDS",
    "cifar10": "CIFAR-10 through TFDS",
    "cifar100": "CIFAR-100 through TFDS",
}


def load_source(name: str, *, num_clients: int, seed: int, synthetic_alpha: float = 1.0,
                synthetic_beta: float = 1.0, data_dir: str | None = None, limit: int | None = None,
                max_samples: int | None = 1000, noise: float = 0.0) -> Pooled | Natural:
    """Load a source by name (see :data:`SOURCES`)."""
    if name == "synthetic":
        return synthetic(num_clients, synthetic_alpha, synthetic_beta, seed, max_samples=max_samples)
    if name == "digits":
        return digits(seed, noise=noise)
    if name == "qot":
        return qot(seed)
    if name in TFDS_NAMES:
        return tfds_source(name, data_dir, limit)
    import difflib

    close = difflib.get_close_matches(name, SOURCES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DataError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}.{hint}")
