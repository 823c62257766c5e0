"""What a reader returns, and the error of a data set that cannot be loaded as asked.

The bottom of :mod:`fljax.data`: it imports nothing of the package, and every reader, the registry
(:mod:`fljax.data.registry`) and the builder (:mod:`fljax.data.build`) import it. A data set is either *pooled*
(:class:`Pooled`: global train/test arrays, to be partitioned over clients) or *natural* (:class:`Natural`: it
defines its own clients).
"""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["DataError", "Pooled", "Samples", "Natural"]


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
