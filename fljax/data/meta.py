"""Few-shot federated splits with a server-held set and target clients (AugFL spec §4, §6: ``partition: meta_pairs``).

From a pooled data set (its train and test pools together, put in a canonical order by their contents, so the
source's own seeded train/test shuffle changes nothing):

1. **Server split** 𝒟_s: ``server_per_class`` samples of every class, drawn with ``server_seed`` (fixed by default,
   so every run seed shares one server set and hence one pretrained model), disjoint from every client.
2. **Class pairs** (``pairs='paper'``): random permutations of the C classes are concatenated up to 2K slots,
   consecutive slots are paired and duplicates removed by swaps, so classes are balanced over the K clients.
   ``pairs='code'`` (the authors' code): client u holds classes (2u, 2u+1) mod C.
3. **Sizes**: ``'paper'``: D_i ~ U{M, …, 2M} split ⌈D_i/2⌉ / ⌊D_i/2⌋ between the two classes; ``'code'``:
   ⌊M/2⌋ + U{0, …, ⌊M/2⌋} per class. Samples are drawn without replacement, so clients are disjoint.
4. **Support / query**: each class of a client gives ⌊f·n_c⌋ samples (f = ``support_fraction``, 1/2 by default)
   to the support set and the rest to the query set. A client's train split holds its support rows first and then
   its query rows (``ClientArrays.support``); its test split is its query set.
5. **Target clients**: the client ids are shuffled and the last ``target_clients`` never train
   (``FederatedData.num_target``).
6. **Preprocessing**: identical for clients and server, no augmentation; ``standardize`` subtracts the scalar mean
   of 𝒟_s and divides by its scalar standard deviation.

Labels stay global (C-way), as in the authors' code. ``labels='pair'`` (spec D16's alternative) relabels every
client 2-way, y ↦ 0 for the first class of its pair and 1 for the second (so the meta-model gets a 2-way head,
``num_classes`` = 2); the server's set keeps its global labels (``ServerData.num_classes`` = C).

The module registers the partition ``meta_pairs`` (:func:`fljax.data.partitioners.register_partitioner`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Literal

import jax.numpy as jnp
import numpy as np

from fljax.data.federated import FederatedData, ServerData, pad_clients
from fljax.data.partitioners import PartitionOptions, Partitioner, register_partitioner
from fljax.data.types import DataError, Pooled
from fljax.errors import OptionError
from fljax.options import at_least, between, option, seed_check

__all__ = ["MetaPairsOptions", "class_pairs", "meta_pairs"]


@dataclasses.dataclass(frozen=True)
class MetaPairsOptions(PartitionOptions):
    """Options of ``meta_pairs``, the few-shot split with a server set and target clients (AugFL spec §4, §6;
    :mod:`fljax.data.meta`)."""

    samples_min: int = option(20, "M: client i draws D_i ~ U{M..2M} samples of its two classes", at_least(4))
    target_clients: int | None = option(None, "clients that never train, only evaluated (null: 20% of "
                                              "num_clients)", at_least(1))
    server_per_class: int = option(100, "samples of every class held by the server (a split disjoint from all "
                                        "clients)", at_least(1))
    server_seed: int = option(0, "seed of the server split (fixed across run seeds, so they share one pretrained "
                                 "model)", seed_check)
    pairs: Literal["paper", "code"] = option("paper", "class pairs: balanced random (paper) or (2u, 2u+1) mod C "
                                                      "with M/2 + U{0..M/2} per class (the authors' code)")
    support_fraction: float = option(0.5, "share of each class of a client in its support set (floor)",
                                     between(0, 1, open_=True))
    standardize: bool = option(True, "standardise every image with the scalar mean and std of the server set")
    labels: Literal["global", "pair"] = option("global", "client labels: the global C-way classes (the authors' "
                                                         "code), or per client 2-way (its pair's first class 0, "
                                                         "the second 1; the server keeps global labels)")

    def num_target(self, num_clients: int) -> int:
        """``target_clients`` (null: 20 % of ``num_clients``, at least 1); refused unless some clients train."""
        n = self.target_clients if self.target_clients is not None else max(1, int(round(0.2 * num_clients)))
        if n >= num_clients:
            raise OptionError("target_clients", f"must be below num_clients={num_clients} (some clients must "
                                                f"train), got {n}.")
        return n


def class_pairs(num_clients: int, num_classes: int, rng: np.random.Generator, kind: str = "paper") -> np.ndarray:
    """``[K, 2]`` distinct class pairs: balanced random pairs (``'paper'``) or (2u, 2u+1) mod C (``'code'``)."""
    if kind == "code":
        u = np.arange(num_clients)
        return np.stack([(2 * u) % num_classes, (2 * u + 1) % num_classes], axis=1)
    reps = -(-2 * num_clients // num_classes)
    slots = np.concatenate([rng.permutation(num_classes) for _ in range(reps)])[: 2 * num_clients]
    pairs = slots.reshape(num_clients, 2).copy()
    for i in range(num_clients):
        if pairs[i, 0] != pairs[i, 1]:
            continue
        c = pairs[i, 0]
        for j in rng.permutation(num_clients):  # swap second elements with a pair that stays distinct
            if j != i and pairs[j, 0] != c and pairs[j, 1] != c:
                pairs[i, 1], pairs[j, 1] = pairs[j, 1], c
                break
        else:
            raise DataError(f"meta_pairs: cannot give {num_clients} clients two distinct classes out of "
                            f"{num_classes}.")
    return pairs


def _draw(pools: list[np.ndarray], used: np.ndarray, c: int, n: int) -> np.ndarray:
    if used[c] + n > len(pools[c]):
        raise DataError(f"meta_pairs: class {c} has {len(pools[c])} client samples, too few for the clients that "
                        f"hold it; lower num_clients, samples_min or server_per_class.")
    out = pools[c][used[c]: used[c] + n]
    used[c] += n
    return out


def _canonical_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A permutation that sorts the samples by a hash of their bytes (pixels and label): the same order for the same
    set of samples whatever order they came in (equal samples are interchangeable)."""
    keys = [hashlib.blake2b(xi.tobytes() + yi.tobytes(), digest_size=8).digest() for xi, yi in zip(x, y)]
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), np.int64)


def meta_pairs(source: Pooled, num_clients: int, seed: int, options: MetaPairsOptions) -> FederatedData:
    """The AugFL split of ``source`` (see the module docstring) for ``num_clients`` clients with run seed ``seed``."""
    o = options
    x = np.concatenate([source.x_train, source.x_test]).astype(np.float32)
    y = np.concatenate([source.y_train, source.y_test]).astype(np.int32)
    order = _canonical_order(x, y)
    x, y = x[order], y[order]
    c_num = source.num_classes
    n_target = o.num_target(num_clients)
    rng_s = np.random.default_rng(o.server_seed + 15485863)
    by_class = [np.flatnonzero(y == c) for c in range(c_num)]
    server_idx, pools = [], []
    for c, idx in enumerate(by_class):
        perm = rng_s.permutation(idx)
        if len(perm) <= o.server_per_class:
            raise OptionError("server_per_class", f"must leave client samples of class {c} ({len(perm)} in all), "
                                                  f"got {o.server_per_class}.")
        server_idx.append(perm[: o.server_per_class])
        pools.append(perm[o.server_per_class:])
    server_idx = np.concatenate(server_idx)
    rng = np.random.default_rng(seed + 32452843)
    pools = [rng.permutation(p) for p in pools]
    used = np.zeros(c_num, np.int64)
    pairs = class_pairs(num_clients, c_num, rng, o.pairs)
    half = o.samples_min // 2
    train_x, train_y, query_x, query_y, supports = [], [], [], [], []
    for i in range(num_clients):
        if o.pairs == "paper":
            d = int(rng.integers(o.samples_min, 2 * o.samples_min + 1))
            counts = (d - d // 2, d // 2)
        else:
            counts = tuple(int(half + rng.integers(0, half + 1)) for _ in range(2))
        sup, qry = [], []
        for c, n in zip(pairs[i], counts):
            idx = _draw(pools, used, int(c), n)
            k = int(np.floor(o.support_fraction * n))
            sup.append(idx[:k])
            qry.append(idx[k:])
        sup, qry = np.concatenate(sup), np.concatenate(qry)
        supports.append(len(sup))
        rows = np.concatenate([sup, qry])
        relabel = (lambda r: (y[r] == pairs[i][1]).astype(np.int32)) if o.labels == "pair" else (lambda r: y[r])
        train_x.append(x[rows]), train_y.append(relabel(rows)), query_x.append(x[qry]), query_y.append(relabel(qry))
    order = rng.permutation(num_clients)  # shuffle the ids; the last n_target are target clients
    if o.standardize:
        mean, std = float(x[server_idx].mean()), float(x[server_idx].std())
        scale = lambda a: (a - mean) / max(std, 1e-12)  # noqa: E731
    else:
        scale = lambda a: a  # noqa: E731
    train = pad_clients([scale(train_x[i]) for i in order], [train_y[i] for i in order])
    supports = np.asarray(supports, np.int32)[order]
    queries = np.asarray([len(q) for q in query_y], np.int32)[order]
    train = train.replace(support=jnp.asarray(supports), support_max=int(supports.max()),
                          query_max=int(queries.max()))
    test = pad_clients([scale(query_x[i]) for i in order], [query_y[i] for i in order])
    server = ServerData(x=jnp.asarray(scale(x[server_idx])), y=jnp.asarray(y[server_idx]), num_classes=c_num)
    desc = (f"meta_pairs: two classes per client ({o.pairs} pairs), D_i from M={o.samples_min}, support/query "
            f"{o.support_fraction:g}/{1 - o.support_fraction:g} per class"
            + (", labels 2-way per client" if o.labels == "pair" else ""))
    return FederatedData(train=train, test=test, num_classes=2 if o.labels == "pair" else c_num,
                         input_shape=tuple(x.shape[1:]),
                         name=source.name, description=desc, server=server, num_target=n_target)


register_partitioner("meta_pairs", Partitioner(
    "few-shot meta-learning split (AugFL): a server set disjoint from the clients, two classes per client, "
    "D_i ~ U{M..2M}, support/query halves, the last target_clients never train", MetaPairsOptions, None,
    build=meta_pairs))
