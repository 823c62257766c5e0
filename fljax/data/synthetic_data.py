"""FedProx's Synthetic(α, β) (Li et al. 2020; LEAF's generator): natural clients drawn from a seed, offline.

Registers the data set ``synthetic`` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fljax.data import memory
from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Natural
from fljax.options import Options, at_least, option

__all__ = ["synthetic", "SyntheticOptions", "SYNTHETIC_MAX_CLIENTS", "SYNTHETIC_MAX_CLIENTS_RAGGED"]

SYNTHETIC_CHUNK = 1 << 20  # normal draws per generation chunk (8 MB of float64; bounds the generator's memory)


def synthetic(num_clients: int, alpha: float = 1.0, beta: float = 1.0, seed: int = 0, dim: int = 60,
              num_classes: int = 10, max_samples: int | None = 1000, iid: bool = False, min_samples: int = 50,
              size_log_mean: float = 4.0, size_log_std: float = 2.0) -> Natural:
    """FedProx's Synthetic(α, β) benchmark (Li et al. 2020; the LEAF generator).

    For client k: u_k ~ N(0, α), B_k ~ N(0, β); W_k ∈ R^{C×d}, b_k ∈ R^C have entries ~ N(u_k, 1);
    v_k ∈ R^d has entries ~ N(B_k, 1); x ~ N(v_k, Σ) with Σ_jj = j^(−1.2); y = argmax(W_k x + b_k).
    Client sizes (a power law): ⌊lognormal(size_log_mean, size_log_std)⌋ + min_samples (LEAF: lognormal(4, 2) + 50),
    capped at ``max_samples`` to bound the per-client pad (None = no cap).
    As in the LEAF code, the second parameter of each normal is its standard deviation.
    ``iid=True`` shares one (W, b) and one v across clients (the Synthetic-IID setting).

    Vectorised: client k's draws (u_k, B_k, W_k, b_k, v_k, then its samples) are consecutive standard normals of one
    stream, drawn a chunk of clients at a time and cut by index arithmetic, so the data equal a per-client loop's
    (``normal(m, s)`` is m + s·z) in seconds for a million clients.
    """
    if alpha < 0 or beta < 0:
        raise DataError(f"synthetic: alpha and beta must be >= 0, got alpha={alpha}, beta={beta}.")
    rng = np.random.default_rng(seed)
    sizes = np.floor(rng.lognormal(size_log_mean, size_log_std, num_clients)) + min_samples  # float: no overflow
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    total = float(np.sum(sizes))
    memory.check_bytes(total * (dim + 1) * 4, "lower data.max_samples (null: no cap), data.min_samples, "
                                              "data.size_log_mean or data.size_log_std",
                       f"synthetic's {total:,.0f} samples" if total < 1e15 else f"synthetic's {total:.3g} samples")
    sizes = sizes.astype(np.int64)
    scale = np.sqrt(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)
    w_shared, b_shared = rng.normal(0, 1, (num_classes, dim)), rng.normal(0, 1, num_classes)
    head = 0 if iid else 2 + num_classes * dim + num_classes + dim  # draws of a client before its samples
    draws = head + sizes * dim
    x_out = np.empty((int(sizes.sum()), dim), np.float32)
    y_out = np.empty(int(sizes.sum()), np.int32)
    ends = np.cumsum(draws)
    lo, row = 0, 0
    while lo < num_clients:
        hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - draws[lo] + SYNTHETIC_CHUNK, side="right")))
        n = sizes[lo:hi]
        z = rng.standard_normal(int(draws[lo:hi].sum()))
        start = np.cumsum(draws[lo:hi]) - draws[lo:hi]
        if iid:
            w = np.broadcast_to(w_shared, (hi - lo, num_classes, dim))
            b = np.broadcast_to(b_shared, (hi - lo, num_classes))
            v = np.zeros((hi - lo, dim))
        else:
            fixed = z[start[:, None] + np.arange(head)]
            u, big_b = alpha * fixed[:, :1], beta * fixed[:, 1:2]
            w = (u + fixed[:, 2:2 + num_classes * dim]).reshape(-1, num_classes, dim)
            b = u + fixed[:, 2 + num_classes * dim:2 + num_classes * dim + num_classes]
            v = big_b + fixed[:, head - dim:]
        owner = np.repeat(np.arange(hi - lo), n)
        rank = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        x = v[owner] + scale * z[(start[owner] + head + rank * dim)[:, None] + np.arange(dim)]
        logits = np.einsum("sd,scd->sc", x, w[owner]) + b[owner]
        x_out[row:row + len(x)] = x
        y_out[row:row + len(x)] = np.argmax(logits, axis=1)
        lo, row = hi, row + len(x)
    return Natural(x_out, y_out, sizes.astype(np.int32), num_classes, f"synthetic({alpha:g},{beta:g})")


@dataclasses.dataclass(frozen=True)
class SyntheticOptions(Options):
    """Options of Synthetic(alpha, beta)."""

    synthetic_alpha: float = option(1.0, "how much the clients' models differ: u_k ~ N(0, alpha)", at_least(0))
    synthetic_beta: float = option(1.0, "how much the clients' inputs differ: B_k ~ N(0, beta)", at_least(0))
    max_samples: int | None = option(1000, "cap on a client's size (null: no cap); at least 11, which guarantees "
                                     "every client two samples of one class, hence a test sample", at_least(11))
    min_samples: int = option(50, "samples every client has before its power-law share (LEAF: 50); at least 11, "
                                  "for a test sample", at_least(11))
    size_log_mean: float = option(4.0, "client sizes: floor(lognormal(size_log_mean, size_log_std)) + min_samples "
                                       "(LEAF: 4)")
    size_log_std: float = option(2.0, "the lognormal's sigma (LEAF: 2)", at_least(0))


SYNTHETIC_MAX_CLIENTS = 100_000  # beyond, the padded arrays (clients x max_samples x 60 floats) outgrow memory
SYNTHETIC_MAX_CLIENTS_RAGGED = 10_000_000  # ragged storage holds only the samples (1e6 clients of ~15: 3.7 GB)


def _load(o: SyntheticOptions, num_clients: int, seed: int) -> Natural:
    return synthetic(num_clients, o.synthetic_alpha, o.synthetic_beta, seed, max_samples=o.max_samples,
                     min_samples=o.min_samples, size_log_mean=o.size_log_mean, size_log_std=o.size_log_std)


register_source("synthetic", Source(
    "FedProx Synthetic(alpha, beta): 60 features, 10 classes, natural clients (offline)", SyntheticOptions, _load,
    lambda o: SYNTHETIC_MAX_CLIENTS, (60,), 10, natural=True,
    max_clients_ragged=lambda o: SYNTHETIC_MAX_CLIENTS_RAGGED))
