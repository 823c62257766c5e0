"""Ragged client storage: one flat array of samples and per-client offsets, no padding to the largest client.

A population of C clients with n_i samples each stores ``x [S + N_max, ...]`` and ``y [S + N_max]`` (S = Σ n_i: client
i's rows are ``[offset[i], offset[i] + count[i])``, followed by ``N_max`` zero rows so that every window of ``N_max``
rows lies inside the array), ``offset [C]`` and ``count [C]``. Memory is Σ n_i rows instead of the padded layout's
C·N_max (a power-law population of a million Synthetic clients capped at 64 samples: about 15 rows per client
against 64).

The padded per-client layout the client step expects (:class:`~fljax.data.ClientArrays` of one client: ``N_max``
rows, rows past the count zero and masked) is made only for the clients that run, inside the compiled round: the
engine hands the flat rows to the executor as shared arguments and each client's (offset, count) as its per-client
part (:func:`split_rows`), and the client call slices its window (:meth:`RaggedArrays.client_view`). Under the
chunked executor at most one chunk of clients is materialised at a time; a sampled cohort of K clients costs K
windows whatever the population's size. The per-client pad is ``N_max`` = the population's largest count (static,
so one compiled program serves every round, and every client step sees exactly the padded path's arrays: the two
layouts give the same numbers bit for bit, tests/test_ragged.py).

Decision (engine.md, non-negotiable 3): the flat arrays are arguments of the compiled round like padded data, not
host arrays gathered per round from Python, so a block of rounds stays one ``lax.scan`` and cohort sampling stays in
``jit``. On CPU they live in host memory; on an accelerator the unpadded population must fit in device memory.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax.data.federated import ClientArrays, pad_flat

__all__ = ["RaggedArrays", "ragged_clients", "split_rows", "join_rows"]


@flax.struct.dataclass
class RaggedArrays:
    """Per-client samples stored flat: ``x [S + N_max, ...]``, ``y [S + N_max]``, ``offset [C]``, ``count [C]`` (see
    the module docstring); ``n_min``/``n_max`` (static) are the smallest and largest counts, as in
    :class:`~fljax.data.ClientArrays`. ``offset``/``count`` are None in the rows part of :func:`split_rows`."""

    x: jax.Array
    y: jax.Array
    offset: jax.Array
    count: jax.Array
    n_min: int = flax.struct.field(pytree_node=False, default=1)
    n_max: int = flax.struct.field(pytree_node=False, default=1)
    support = None  # ragged storage declares no support/query split
    support_max = query_max = 0

    @property
    def num_clients(self) -> int:
        return self.offset.shape[0]

    def take(self, idx) -> "RaggedArrays":
        """Clients ``idx`` (the flat rows are shared; the static bounds stay the population's)."""
        return self.replace(offset=self.offset[idx], count=self.count[idx])

    def client_view(self, offset, count) -> ClientArrays:
        """One client's padded window (no client axis): ``N_max`` rows from ``offset``, rows past ``count`` zeroed and
        masked, exactly the padded layout's rows of that client."""
        rows = jnp.arange(self.n_max)
        mask = rows < count
        x = jax.lax.dynamic_slice_in_dim(self.x, offset, self.n_max)
        y = jax.lax.dynamic_slice_in_dim(self.y, offset, self.n_max)
        x = jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))
        y = jnp.where(mask.reshape((-1,) + (1,) * (y.ndim - 1)), y, 0)
        return ClientArrays(x=x, y=y, mask=mask, count=count, n_min=self.n_min, n_max=self.n_max)

    def to_padded(self) -> ClientArrays:
        """Every client in the padded layout (host numpy, then device arrays; for small populations and tests)."""
        rows = self._rows()
        return pad_flat(np.asarray(self.x)[rows], np.asarray(self.y)[rows], np.asarray(self.count), self.n_max,
                        np.asarray(self.x).dtype).replace(n_min=self.n_min)

    def _rows(self) -> np.ndarray:
        """Flat row index of every client's samples, client after client (host numpy)."""
        count = np.asarray(self.count)
        return np.repeat(np.asarray(self.offset) - np.cumsum(count) + count, count) + np.arange(count.sum())

    def tokens(self):
        """Target tokens per client (``[C]``), as :meth:`fljax.data.ClientArrays.tokens`: the non-padding targets of
        next-token data (y ``[S + N_max, T]``; PAD = 0), else the count."""
        if np.ndim(self.y) == 1:
            return self.count
        per_row = np.concatenate([[0], np.cumsum((np.asarray(self.y) != 0).sum(axis=-1))])
        start, count = np.asarray(self.offset), np.asarray(self.count)
        return jnp.asarray(per_row[start + count] - per_row[start], self.count.dtype)

    def owners_and_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(client id, label) of every stored sample (host numpy)."""
        count = np.asarray(self.count)
        return np.repeat(np.arange(len(count)), count), np.asarray(self.y)[self._rows()]

    def client_nbytes(self) -> int:
        """Bytes of one client's padded window (what a running client holds)."""
        return self.n_max * (self.x[0].nbytes + self.y[0].nbytes)


def _aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array on a 64-byte boundary: on CPU, ``jax.device_put`` then aliases it instead of copying
    (a million clients' samples are gigabytes)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(nbytes + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def ragged_clients(x: np.ndarray, y: np.ndarray, count, n_max: int | None = None, rows=None) -> RaggedArrays:
    """:class:`RaggedArrays` of samples stored client after client (client i's ``count[i]`` rows follow client
    i − 1's) in ``x[rows]``/``y[rows]`` (``rows`` None: the leading rows); ``n_max`` (default: the largest count) is
    the per-client window."""
    count = np.asarray(count, np.int32)
    n_max = int(max(count.max(), 1) if n_max is None else n_max)
    total = int(count.sum())
    rows = np.arange(total) if rows is None else np.asarray(rows)
    flat_x = _aligned_empty((total + n_max,) + np.shape(x)[1:], np.asarray(x[:0]).dtype)
    flat_y = _aligned_empty((total + n_max,) + np.shape(y)[1:], np.int32)
    # mode 'clip' (the rows are valid): NumPy buffers a whole copy of the result when 'raise' writes into ``out``
    np.take(x, rows, axis=0, out=flat_x[:total], mode="clip")
    np.take(np.asarray(y, np.int32), rows, axis=0, out=flat_y[:total], mode="clip")
    flat_x[total:], flat_y[total:] = 0, 0
    return RaggedArrays(x=jax.device_put(flat_x), y=jax.device_put(flat_y),
                        offset=jnp.asarray(np.cumsum(count) - count, jnp.int32), count=jnp.asarray(count),
                        n_min=int(count.min()), n_max=n_max)


def split_rows(arrays):
    """(shared part, per-client part) of client arrays for an executor: ragged storage splits into its flat rows
    (shared by every client) and the clients' (offset, count); padded arrays are all per-client (shared part None)."""
    if isinstance(arrays, RaggedArrays):
        return arrays.replace(offset=None, count=None), (arrays.offset, arrays.count)
    return None, arrays


def join_rows(rows, per_client):
    """One client's :class:`~fljax.data.ClientArrays` from the two parts of :func:`split_rows`."""
    return per_client if rows is None else rows.client_view(*per_client)
