"""Federated data as padded arrays with a leading client axis.

Client i's samples occupy rows ``[0, count[i])`` of ``x[i]`` and ``y[i]``; the remaining rows up to ``N_max`` are
zero padding with ``mask = False``. Everything that runs inside ``jit`` relies on that layout: a sample is valid iff
its row index is below the client's count.
"""
from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ClientArrays", "FederatedData", "pad_clients", "label_histogram"]


@flax.struct.dataclass
class ClientArrays:
    """Per-client samples: ``x [C, N_max, ...]``, ``y [C, N_max]``, ``mask [C, N_max]``, ``count [C]``.

    ``n_min`` and ``n_max`` (smallest and largest client count) are static, so batch plans can size their
    buffers without a host round trip.
    """

    x: jax.Array
    y: jax.Array
    mask: jax.Array
    count: jax.Array
    n_min: int = flax.struct.field(pytree_node=False, default=1)
    n_max: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def num_clients(self) -> int:
        return self.x.shape[0]

    def take(self, idx) -> "ClientArrays":
        """Rows of clients ``idx`` (keeps the static bounds of the whole population)."""
        return self.replace(x=self.x[idx], y=self.y[idx], mask=self.mask[idx], count=self.count[idx])

    def padded(self, n_max: int) -> "ClientArrays":
        """The same samples padded with masked rows to ``n_max`` rows per client (so data sets of different sizes
        share one shape, hence one compiled program)."""
        if n_max < self.n_max:
            raise ValueError(f"cannot pad to n_max={n_max}: a client already has {self.n_max} samples.")
        pad = lambda a: jnp.pad(a, [(0, 0), (0, n_max - self.n_max)] + [(0, 0)] * (a.ndim - 2))
        return self.replace(x=pad(self.x), y=pad(self.y), mask=pad(self.mask), n_max=n_max)

    def client(self, i: int) -> "ClientArrays":
        """Client ``i`` alone, without the client axis (host-side convenience)."""
        return jax.tree.map(lambda a: a[i], self)


@flax.struct.dataclass
class FederatedData:
    """A federated data set: per-client train and test splits plus static metadata."""

    train: ClientArrays
    test: ClientArrays
    num_classes: int = flax.struct.field(pytree_node=False, default=0)
    input_shape: tuple = flax.struct.field(pytree_node=False, default=())
    name: str = flax.struct.field(pytree_node=False, default="")
    description: str = flax.struct.field(pytree_node=False, default="")

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    def train_label_counts(self) -> np.ndarray:
        """``[C, num_classes]`` label histogram of every client's train split (host numpy)."""
        return label_histogram(self.train, self.num_classes)

    def summary(self) -> str:
        counts = np.asarray(self.train.count)
        test = np.asarray(self.test.count)
        return (f"{self.name}: {self.num_clients} clients, {self.num_classes} classes, input {self.input_shape}; "
                f"train samples/client min {counts.min()} median {int(np.median(counts))} max {counts.max()} "
                f"(total {counts.sum()}); test total {test.sum()}. {self.description}")


def label_histogram(arrays: ClientArrays, num_classes: int) -> np.ndarray:
    y = np.asarray(arrays.y)
    mask = np.asarray(arrays.mask)
    out = np.zeros((y.shape[0], num_classes), np.int64)
    for i in range(y.shape[0]):
        out[i] = np.bincount(y[i][mask[i]], minlength=num_classes)[:num_classes]
    return out


def pad_clients(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], x_dtype=np.float32,
                n_max: int | None = None) -> ClientArrays:
    """Stack ragged per-client arrays into a padded :class:`ClientArrays` (rows past each count are zero)."""
    counts = np.array([len(y) for y in ys], np.int32)
    n_max = int(max(counts.max(), 1) if n_max is None else n_max)
    feature_shape = np.asarray(xs[0]).shape[1:]
    x = np.zeros((len(xs), n_max) + feature_shape, x_dtype)
    y = np.zeros((len(ys), n_max), np.int32)
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        x[i, : len(yi)] = xi
        y[i, : len(yi)] = yi
    mask = np.arange(n_max)[None, :] < counts[:, None]
    return ClientArrays(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask), count=jnp.asarray(counts),
                        n_min=int(counts.min()), n_max=n_max)
