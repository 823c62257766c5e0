"""Image classification sets through TensorFlow Datasets' ``tfds.data_source`` (ArrayRecord files; no TensorFlow
needed): prepared once on a machine with network, never downloaded during a run (tests use
``tfds.testing.mock_data``).

Registers the data sets of :data:`TFDS_SETS` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os

import numpy as np

from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Pooled
from fljax.options import Options, at_least, option

__all__ = ["TFDS_SETS", "tfds_source", "TfdsOptions"]

# name: (TFDS's name, summary, train images, one image's shape, classes)
TFDS_SETS = {
    "mnist": ("mnist", "MNIST through TFDS (needs the data prepared or network)", 60_000, (28, 28, 1), 10),
    "fashion_mnist": ("fashion_mnist", "Fashion-MNIST through TFDS", 60_000, (28, 28, 1), 10),
    "emnist": ("emnist/balanced", "EMNIST balanced (47 classes) through TFDS", 112_800, (28, 28, 1), 47),
    "emnist62": ("emnist/byclass", "EMNIST ByClass (62 classes) through TFDS, pooled (TFDS keeps no writer ids; "
                                   "natural writers: femnist62)", 697_932, (28, 28, 1), 62),
    "cifar10": ("cifar10", "CIFAR-10 through TFDS", 50_000, (32, 32, 3), 10),
    "cifar100": ("cifar100", "CIFAR-100 through TFDS (partition: pachinko for Reddi et al.'s 500 clients)", 50_000,
                 (32, 32, 3), 100),
}


def _prepared(name: str, data_dir: str | None) -> None:
    """Refuse, in one line and within a second, a TFDS data set that is not prepared where it is looked for
    (``data_dir``, else TFDS's default): TFDS's builder says whether its files are there without downloading or
    creating anything; a run never downloads (that retried for minutes offline and created ``data_dir``)."""
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
    if name not in TFDS_SETS:
        raise DataError(f"unknown TFDS data set {name!r}; choose one of {sorted(TFDS_SETS)}.")
    tfds_name = TFDS_SETS[name][0]
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
class TfdsOptions(Options):
    """Options of the TFDS data sets."""

    data_dir: str | None = option(None, "TFDS data directory (null: TFDS's default)")
    limit: int | None = option(None, "keep the first `limit` examples of each split (null: all)", at_least(1))
    standardize: bool = option(False, "per-channel standardization with the train pool's mean and std (QuPeD D31)")


def _load(name: str, o: TfdsOptions, num_clients: int, seed: int) -> Pooled:
    return tfds_source(name, o.data_dir, o.limit, o.standardize)


def _train_size(size: int, o: TfdsOptions) -> int:
    return size if o.limit is None else min(size, o.limit)


for _name, (_, _summary, _train, _shape, _classes) in TFDS_SETS.items():
    register_source(_name, Source(_summary, TfdsOptions, functools.partial(_load, _name),
                                  functools.partial(_train_size, _train), _shape, _classes))
