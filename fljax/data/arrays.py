"""Your own data, already split over clients: ``from_arrays(train=[(x_1, y_1), …], test=[(x_1', y_1'), …])``.

Client i's train samples are ``x_i [n_i, *input_shape]`` with integer labels ``y_i [n_i]`` in [0, num_classes); its
test split is the i-th pair of ``test`` (every client needs both, each with at least one sample). Inputs are stored
as float32, padded per client like every other :class:`~fljax.data.FederatedData`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fljax.data.federated import FederatedData, pad_clients
from fljax.data.types import DataError
from fljax.options import show

__all__ = ["from_arrays"]


F32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = 2 ** 31 - 1  # labels are int32


def _array(value, split: str, i: int, which: str) -> np.ndarray:
    """``value`` as a numpy array of real numbers, or a one-line :class:`DataError` naming ``split[i]`` (client
    ``i``) and what is wrong: rows of different lengths, text, complex or other non-numbers."""
    where = f"{split}[{i}] (client {i}): {which}"
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # numpy refuses nested rows of different lengths
        raise DataError(f"{where} is ragged: its rows differ in length; every sample must have the same shape.") \
            from None
    if array.dtype == object:
        raise DataError(f"{where} is ragged or holds non-numbers (Python objects); pass an array of numbers with "
                        f"one row per sample.")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(f"{where} holds complex numbers; pass real values (e.g. the real and imaginary parts as two "
                        f"features).")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        kind = "text" if array.dtype.kind in "US" else f"{array.dtype.name} values"
        raise DataError(f"{where} must hold numbers, got {kind} (dtype {array.dtype.str}); encode text or categories "
                        f"as numbers first.")
    return array


def _checked(split: str, pairs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise DataError(f"{split} must be a non-empty list of (x, y) pairs, one per client.")
    xs, ys = [], []
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise DataError(f"{split}[{i}] (client {i}) must be a pair (x, y), got {type(pair).__name__}.")
        x, y = _array(pair[0], split, i, "x"), _array(pair[1], split, i, "y")
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{split}[{i}] (client {i}): y must be a 1-d array of integer labels, got shape "
                            f"{y.shape} of {y.dtype}.")
        if x.ndim < 2 or len(x) != len(y):
            raise DataError(f"{split}[{i}] (client {i}): x must hold one row per label ({len(y)}), got shape "
                            f"{x.shape}.")
        if len(y) == 0:
            raise DataError(f"{split}[{i}]: client {i} has no samples; every client needs at least one.")
        if not np.all(np.isfinite(x)):
            raise DataError(f"{split}[{i}] (client {i}): x holds NaN or Inf.")
        if x.size and np.abs(x).max() > F32_MAX:
            raise DataError(f"{split}[{i}] (client {i}): x holds values beyond float32's range (±{F32_MAX:.3e}), "
                            f"where inputs are stored; rescale them.")
        xs.append(x)
        ys.append(y)
    return xs, ys


def _num_classes(num_classes, labels: np.ndarray, ys: list[np.ndarray], yt: list[np.ndarray]) -> int:
    """``num_classes`` checked, or (None) 1 + the largest label, which must be a label int32 can hold (where labels
    are stored): a larger one is named with its client."""
    if num_classes is None:
        if labels.max() >= INT32_MAX:
            split, i, y = next((split, i, y) for split, group in (("train", ys), ("test", yt))
                               for i, y in enumerate(group) if y.max() >= INT32_MAX)
            raise DataError(f"{split}[{i}] (client {i}): label {y.max()} is larger than {INT32_MAX - 1}, the largest "
                            f"label int32 holds (labels are stored as int32); number the classes 0, 1, …, C-1.")
        return int(labels.max()) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise DataError(f"num_classes must be a positive integer (or None: 1 + the largest label), got "
                        f"{show(num_classes)}.")
    if not 1 <= num_classes <= INT32_MAX:
        raise DataError(f"num_classes must be between 1 and {INT32_MAX}, got {num_classes}.")
    return int(num_classes)


def from_arrays(train, test, num_classes: int | None = None, name: str = "arrays") -> FederatedData:
    """A :class:`~fljax.data.FederatedData` from per-client ``(x, y)`` pairs (see the module docstring);
    ``num_classes`` defaults to 1 + the largest label. Every bad input is refused in one line."""
    xs, ys = _checked("train", train)
    xt, yt = _checked("test", test)
    if len(xt) != len(xs):
        raise DataError(f"test must have one (x, y) pair per client: {len(xs)} train pairs, {len(xt)} test pairs.")
    shapes = {x.shape[1:] for x in xs + xt}
    if len(shapes) > 1:
        first = xs[0].shape[1:]
        where = next(f"{split}[{i}] (client {i})" for split, group in (("train", xs), ("test", xt))
                     for i, x in enumerate(group) if x.shape[1:] != first)
        raise DataError(f"every x must have the same shape per sample, got {sorted(shapes)} ({where} differs from "
                        f"train[0]'s {first}).")
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"name must be a non-empty string, got {show(name)}.")
    labels = np.concatenate(ys + yt)
    classes = _num_classes(num_classes, labels, ys, yt)
    if labels.min() < 0 or labels.max() >= classes:
        where = next(f"{split}[{i}] (client {i})" for split, group in (("train", ys), ("test", yt))
                     for i, y in enumerate(group) if y.min() < 0 or y.max() >= classes)
        bound = f"(num_classes={classes})" if num_classes is not None else "(num_classes: 1 + the largest label)"
        raise DataError(f"labels must be in [0, {classes}) {bound}, got {labels.min()} to {labels.max()} (first in "
                        f"{where}).")
    return FederatedData(train=pad_clients(xs, ys), test=pad_clients(xt, yt), num_classes=classes,
                         input_shape=tuple(xs[0].shape[1:]), name=name,
                         description=f"your own arrays, {len(xs)} clients")
