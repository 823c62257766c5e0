"""Your own data, already split over clients: ``from_arrays(train=[(x_1, y_1), …], test=[(x_1', y_1'), …])``.

Client i's train samples are ``x_i [n_i, *input_shape]`` with integer labels ``y_i [n_i]`` in [0, num_classes); its
test split is the i-th pair of ``test`` (every client needs both, each with at least one sample). Inputs are stored
as float32, padded per client like every other :class:`~fljax.data.FederatedData`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fljax.data.federated import FederatedData, pad_clients
from fljax.data.sources import DataError

__all__ = ["from_arrays"]


def _checked(split: str, pairs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise DataError(f"{split} must be a non-empty list of (x, y) pairs, one per client.")
    xs, ys = [], []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise DataError(f"{split}[{i}] must be a pair (x, y), got {type(pair).__name__}.")
        x, y = np.asarray(pair[0]), np.asarray(pair[1])
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{split}[{i}]: y must be a 1-d array of integer labels, got shape {y.shape} of "
                            f"{y.dtype}.")
        if x.ndim < 2 or len(x) != len(y):
            raise DataError(f"{split}[{i}]: x must hold one row per label ({len(y)}), got shape {x.shape}.")
        if len(y) == 0:
            raise DataError(f"{split}[{i}]: client {i} has no samples; every client needs at least one.")
        if not np.all(np.isfinite(x)):
            raise DataError(f"{split}[{i}]: x holds NaN or Inf.")
        xs.append(x)
        ys.append(y)
    return xs, ys


def from_arrays(train, test, num_classes: int | None = None, name: str = "arrays") -> FederatedData:
    """A :class:`~fljax.data.FederatedData` from per-client ``(x, y)`` pairs (see the module docstring);
    ``num_classes`` defaults to 1 + the largest label. Every bad input is refused in one line."""
    xs, ys = _checked("train", train)
    xt, yt = _checked("test", test)
    if len(xt) != len(xs):
        raise DataError(f"test must have one (x, y) pair per client: {len(xs)} train pairs, {len(xt)} test pairs.")
    shapes = {x.shape[1:] for x in xs + xt}
    if len(shapes) > 1:
        raise DataError(f"every x must have the same shape per sample, got {sorted(shapes)}.")
    labels = np.concatenate(ys + yt)
    classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.min() < 0 or labels.max() >= classes:
        raise DataError(f"labels must be in [0, {classes}) (num_classes={classes}), got {labels.min()} to "
                        f"{labels.max()}.")
    return FederatedData(train=pad_clients(xs, ys), test=pad_clients(xt, yt), num_classes=classes,
                         input_shape=tuple(xs[0].shape[1:]), name=name,
                         description=f"your own arrays, {len(xs)} clients")
