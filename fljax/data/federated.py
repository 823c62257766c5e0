"""Federated data as padded arrays with a leading client axis.

Client i's samples occupy rows ``[0, count[i])`` of ``x[i]`` and ``y[i]``; the remaining rows up to ``N_max`` are
zero padding with ``mask = False``. Everything that runs inside ``jit`` relies on that layout: a sample is valid iff
its row index is below the client's count. Large populations store their samples ragged instead (one flat array and
per-client offsets, :mod:`fljax.data.ragged`), and each running client receives this layout inside the round.

Meta-learning splits (AugFL, Per-FedAvg with support/query sets) also set ``support [C]``: client i's first
``support[i]`` rows are its support set and the rest of its samples its query set (:meth:`ClientArrays.support_batch`,
:meth:`ClientArrays.query_batch`, :meth:`ClientArrays.support_view`), with the static bounds ``support_max`` and
``query_max`` (the largest support and query sets), so full-batch steps on either set compute on no more rows than
it can hold.

Two optional parts describe settings where not every client trains and the server holds data of its own:
``FederatedData.num_target`` (the last ``num_target`` clients are *target* clients: they never train and are only
evaluated, AugFL spec §6) and ``FederatedData.server`` (a :class:`ServerData`: the server's own labelled set and
the frozen models it holds, never sent to a client).
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax.data import memory
from fljax.data.batching import Batch

__all__ = ["ClientArrays", "FederatedData", "ServerData", "pad_clients", "pad_flat", "label_histogram", "sample_dtype"]


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
    support: Any = None  # [C] int or None: the first support[i] rows of client i form its support set
    support_max: int = flax.struct.field(pytree_node=False, default=0)  # largest support / query set (static)
    query_max: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def num_clients(self) -> int:
        return self.x.shape[0]

    def take(self, idx) -> "ClientArrays":
        """Rows of clients ``idx`` (keeps the static bounds of the whole population)."""
        return self.replace(x=self.x[idx], y=self.y[idx], mask=self.mask[idx], count=self.count[idx],
                            support=None if self.support is None else self.support[idx])

    def tokens(self):
        """Target tokens of the valid rows, per client (``[C]``; a scalar for one client's slice): the non-padding
        targets of next-token data (y ``[.., N, T]``; PAD = 0, :mod:`fljax.data.text`), else one per sample (the
        count)."""
        if self.y.ndim == self.mask.ndim:
            return self.count
        real = (self.y != 0) & jnp.expand_dims(self.mask, -1)
        return jnp.sum(real, axis=tuple(range(self.mask.ndim - 1, self.y.ndim))).astype(self.count.dtype)

    def support_batch(self):
        """One client's support set as a full :class:`~fljax.data.Batch` of ``support_max`` rows (past its size
        masked); its whole split when no support set is declared."""
        if self.support is None:
            return Batch(self.x, self.y, self.mask)
        rows = jnp.arange(self.support_max)
        return Batch(self.x[: self.support_max], self.y[: self.support_max], rows < self.support)

    def query_batch(self):
        """One client's query set (its samples after the support set) as a full :class:`~fljax.data.Batch` of
        ``query_max`` rows (past its size masked)."""
        if self.support is None:
            raise ValueError("these client arrays declare no support/query split (support is None).")
        rows = jnp.arange(self.query_max)
        idx = jnp.minimum(rows + self.support, self.n_max - 1)
        return Batch(jnp.take(self.x, idx, axis=0), jnp.take(self.y, idx, axis=0), rows < self.count - self.support)

    def support_view(self) -> "ClientArrays":
        """The support set as client arrays of their own (a prefix of the rows, so batch plans apply; ``n_min`` drops
        to 1, a safe static bound); itself when no support set is declared."""
        if self.support is None:
            return self
        rows = jnp.arange(self.mask.shape[-1])
        return self.replace(mask=self.mask & (rows < jnp.expand_dims(self.support, -1)), count=self.support,
                            n_min=1, support=None)

    def padded(self, n_max: int) -> "ClientArrays":
        """The same samples padded with masked rows to ``n_max`` rows per client (so data sets of different sizes
        share one shape, hence one compiled program)."""
        if n_max < self.n_max:
            raise ValueError(f"cannot pad to n_max={n_max}: a client already has {self.n_max} samples.")
        pad = lambda a: jnp.pad(a, [(0, 0), (0, n_max - self.n_max)] + [(0, 0)] * (a.ndim - 2))
        return self.replace(x=pad(self.x), y=pad(self.y), mask=pad(self.mask), n_max=n_max)

    def owners_and_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(client id, label) of every valid sample (host numpy)."""
        owner, row = np.nonzero(np.asarray(self.mask))
        return owner, np.asarray(self.y)[owner, row]

    def client_nbytes(self) -> int:
        """Bytes of one client's padded rows."""
        return (self.x.nbytes + self.y.nbytes) // max(self.num_clients, 1)

    def client(self, i: int) -> "ClientArrays":
        """Client ``i`` alone, without the client axis (host-side convenience)."""
        return jax.tree.map(lambda a: a[i], self)


@flax.struct.dataclass
class ServerData:
    """What the server holds and no client ever sees: its labelled set ``x [D_s, ...]``, ``y [D_s]`` (a split
    disjoint from every client's data) and, once attached (:func:`fljax.runner.pretrained.attach_pretrained`), a
    frozen pretrained model: its parameters ``pm_params`` and its penultimate features ``pm_features [D_s, d]`` and
    logits ``pm_logits [D_s, C]`` on ``x``, computed once. ``pm_model`` (static) is the PM's
    :class:`~fljax.models.Model`; ``pm_info`` (static) records how it was made and its accuracy on the server set,
    ``pm_scores`` its accuracy on the clients' test splits (``client_test_acc``; ``target_acc``: the target
    clients' query sets), for information only. ``num_classes`` (static): the classes of ``y`` when the clients
    use another label space (None: the data set's; see :attr:`FederatedData.server_classes`)."""

    x: jax.Array
    y: jax.Array
    pm_params: Any = None
    pm_features: Any = None
    pm_logits: Any = None
    pm_scores: Any = None
    pm_model: Any = flax.struct.field(pytree_node=False, default=None)
    pm_info: tuple = flax.struct.field(pytree_node=False, default=())
    num_classes: int | None = flax.struct.field(pytree_node=False, default=None)

    @property
    def size(self) -> int:
        return self.y.shape[0]

    @property
    def has_pretrained(self) -> bool:
        return self.pm_params is not None

    def describe_pm(self) -> str:
        info = dict(self.pm_info)
        scores = {k: float(np.mean(np.asarray(v))) for k, v in (self.pm_scores or {}).items()}
        where = f"{info['data']} (pretraining set)" if "data" in info else "server-set"
        parts = [f"{where} accuracy {info.get('server_acc', float('nan')):.4f}"]
        parts += [f"{k.replace('_', ' ')} {v:.4f}" for k, v in scores.items()]
        return f" Pretrained {info.get('model', '?')} ({info.get('epochs')} epochs): {', '.join(parts)}."


@flax.struct.dataclass
class FederatedData:
    """A federated data set: per-client train and test splits plus static metadata.

    ``num_target`` (static): the last ``num_target`` clients are target clients, which never train (templates
    sample cohorts from the first :attr:`num_train_clients`) and are evaluated apart (``target_*`` metrics).
    ``server``: the server's own data and frozen models (:class:`ServerData`), or None."""

    train: ClientArrays
    test: ClientArrays
    num_classes: int = flax.struct.field(pytree_node=False, default=0)
    input_shape: tuple = flax.struct.field(pytree_node=False, default=())
    name: str = flax.struct.field(pytree_node=False, default="")
    description: str = flax.struct.field(pytree_node=False, default="")
    server: Any = None
    num_target: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def server_classes(self) -> int:
        """The classes of the server's labels (its pretrained model's head): the clients' unless the split relabels
        the clients (e.g. ``meta_pairs`` with ``labels: pair``)."""
        if self.server is not None and self.server.num_classes is not None:
            return self.server.num_classes
        return self.num_classes

    @property
    def num_train_clients(self) -> int:
        """Clients that train: all but the target clients (the first ``num_clients - num_target`` ids)."""
        return self.num_clients - self.num_target

    # what the engine reads of client data (fljax.engine.protocol.SimulationData) beyond the fields above
    labelled = True  # examples with labels that a model learns
    group_sizes = None  # one population

    @property
    def stacked(self) -> bool:
        """Every client's arrays stacked along one axis (padded storage; ragged storage is one flat array)."""
        return isinstance(self.train, ClientArrays)

    def client_nbytes(self) -> int:
        """Bytes of one client's local data: its train split."""
        return self.train.client_nbytes()

    def train_label_counts(self) -> np.ndarray:
        """``[C, num_classes]`` label histogram of every client's train split (host numpy)."""
        return label_histogram(self.train, self.num_classes)

    def summary(self) -> str:
        counts = np.asarray(self.train.count)
        test = np.asarray(self.test.count)
        what = (f"{self.num_classes} classes, input {self.input_shape}" if not hasattr(self.input_shape, "vocab") else
                f"sequences of {self.input_shape[0]} tokens of {self.input_shape.vocab}"
                + ("" if self.input_shape.per_token else f", {self.num_classes} classes"))
        return (f"{self.name}: {self.num_clients} clients, {what}; "
                f"train samples/client min {counts.min()} median {int(np.median(counts))} max {counts.max()} "
                f"(total {counts.sum()}); test total {test.sum()}. {self.description}"
                + (f" {self.num_target} target clients (never train)." if self.num_target else "")
                + (f" Server holds {self.server.size} samples." if self.server is not None else "")
                + (self.server.describe_pm() if self.server is not None and self.server.has_pretrained else ""))


def label_histogram(arrays, num_classes: int) -> np.ndarray:
    """``[C, num_classes]`` label counts of every client's samples (padded or ragged arrays; host numpy); with token
    labels ``[n, T]``, the counts of every client's non-padding target tokens."""
    owner, label = arrays.owners_and_labels()
    if label.ndim > 1:
        owner, label = np.repeat(owner, label[0].size), label.reshape(-1)
        owner, label = owner[label != 0], label[label != 0]
    keep = label < num_classes
    flat = np.bincount(owner[keep] * num_classes + label[keep], minlength=arrays.num_clients * num_classes)
    return flat.reshape(arrays.num_clients, num_classes)


def sample_dtype(x) -> np.dtype:
    """How inputs are stored: integer arrays (token ids) as int32, everything else as float32."""
    return np.dtype(np.int32 if np.issubdtype(np.asarray(x[:0]).dtype, np.integer) else np.float32)


def pad_flat(x: np.ndarray, y: np.ndarray, count, n_max: int | None = None, x_dtype=np.float32,
             rows=None) -> ClientArrays:
    """A padded :class:`ClientArrays` from samples stored client after client in ``x[rows]``/``y[rows]`` (client i's
    ``count[i]`` rows follow client i − 1's; ``rows`` None: the leading rows); rows past each count are zero. Labels
    are ``y [S]`` or token labels ``y [S, T]``."""
    count = np.asarray(count, np.int32)
    n_max = int(max(count.max(), 1) if n_max is None else n_max)
    row = int(np.prod(np.shape(x)[1:], dtype=np.int64)) * np.dtype(x_dtype).itemsize + \
        int(np.prod(np.shape(y)[1:], dtype=np.int64)) * 4 + 1
    memory.check_bytes(2 * len(count) * n_max * row, "lower data.num_clients, or set data.storage: ragged (which "
                                                     "stores the samples only)",
                       f"{len(count):,} clients padded to the largest one's {n_max:,} samples (host and device "
                       f"copies)")
    total = int(count.sum())
    owner = np.repeat(np.arange(len(count)), count)
    rank = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    xp = np.zeros((len(count), n_max) + np.shape(x)[1:], x_dtype)
    yp = np.zeros((len(count), n_max) + np.shape(y)[1:], np.int32)
    take = (lambda a: np.asarray(a)[:total]) if rows is None else (lambda a: np.asarray(a)[np.asarray(rows)])
    xp[owner, rank] = take(x)  # the leading rows as a view, not a copy of every sample
    yp[owner, rank] = take(y)
    mask = np.arange(n_max)[None, :] < count[:, None]
    return ClientArrays(x=jnp.asarray(xp), y=jnp.asarray(yp), mask=jnp.asarray(mask), count=jnp.asarray(count),
                        n_min=int(count.min()), n_max=n_max)


def pad_clients(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], x_dtype=np.float32,
                n_max: int | None = None) -> ClientArrays:
    """Stack ragged per-client arrays into a padded :class:`ClientArrays` (rows past each count are zero)."""
    return pad_flat(np.concatenate([np.asarray(x) for x in xs]), np.concatenate([np.asarray(y) for y in ys]),
                    [len(y) for y in ys], n_max, x_dtype)
