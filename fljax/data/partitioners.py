"""Partitioners: assign the samples of a pooled data set to clients.

Every partitioner takes the pooled labels, the number of clients and a seed, and returns a list of index arrays
(one per client) that together use every sample exactly once. Each is reproducible from its seed and raises
:class:`PartitionError` with a one-line fix when it would leave a client without data.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PartitionError", "iid", "dirichlet", "pathological", "power_law", "PARTITIONERS", "partition"]


class PartitionError(ValueError):
    """A partition that cannot be built as asked (for example one that leaves a client empty)."""


def _check_clients(n: int, num_clients: int, name: str):
    if num_clients < 1:
        raise PartitionError(f"{name}: num_clients must be >= 1, got {num_clients}.")
    if n < num_clients:
        raise PartitionError(f"{name}: {n} samples cannot give each of {num_clients} clients at least one; "
                             f"lower num_clients to at most {n}.")


def _refuse_empty(parts: list[np.ndarray], name: str, hint: str):
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(f"{name} left {len(empty)} client(s) without data (first: client {empty[0]}); {hint}.")


def iid(labels: np.ndarray, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Shuffle, then cut into ``num_clients`` parts whose sizes differ by at most one."""
    _check_clients(len(labels), num_clients, "iid")
    perm = np.random.default_rng(seed).permutation(len(labels))
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int = 0, min_size: int = 1,
              max_tries: int = 100) -> list[np.ndarray]:
    """Label-skewed split of Hsu et al. (2019): class c's samples go to clients in proportions p_c ~ Dir(α·1).

    Small α gives few classes per client. Draws are repeated (deterministically, from the seed) until every client
    has at least ``min_size`` samples; after ``max_tries`` failures the split is refused.
    """
    if not alpha > 0:
        raise PartitionError(f"dirichlet: alpha must be > 0, got {alpha}; typical values are 0.1 to 1.0.")
    _check_clients(len(labels), num_clients, "dirichlet")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise PartitionError(f"dirichlet(alpha={alpha}) left a client with fewer than {min_size} samples in "
                         f"{max_tries} draws; raise alpha or lower num_clients (now {num_clients}).")


def pathological(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int = 0) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` distinct classes (McMahan et al.'s shard split, balanced).

    Each client takes the c classes held by the fewest clients so far (random among ties), so every class is held
    by about ``num_clients·c/C`` clients; each class's samples are then cut into equal shards among its holders.
    """
    classes = np.unique(labels)
    c = classes_per_client
    if not 1 <= c <= len(classes):
        raise PartitionError(f"pathological: classes_per_client must be in [1, {len(classes)}], got {c}.")
    _check_clients(len(labels), num_clients, "pathological")
    rng = np.random.default_rng(seed)
    holders: dict[int, list[int]] = {int(k): [] for k in classes}
    load = np.zeros(len(classes))
    for i in range(num_clients):  # the c least-held classes, random among ties: balanced and distinct
        chosen = np.lexsort((rng.random(len(classes)), load))[:c]
        load[chosen] += 1
        for k in classes[chosen]:
            holders[int(k)].append(i)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, who in holders.items():
        if not who:
            continue
        idx = rng.permutation(np.flatnonzero(labels == k))
        if len(idx) < len(who):
            raise PartitionError(f"pathological: class {k} has {len(idx)} samples for {len(who)} clients; "
                                 f"lower num_clients or classes_per_client.")
        for i, chunk in zip(who, np.array_split(idx, len(who))):
            parts[i].append(chunk)
    out = [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
    _refuse_empty(out, "pathological", "lower num_clients")
    return out


def power_law(labels: np.ndarray, num_clients: int, seed: int = 0, sigma: float = 1.0,
              min_size: int = 1) -> list[np.ndarray]:
    """IID labels with client sizes ∝ lognormal(0, σ) draws (a heavy-tailed, power-law-like size distribution).

    Every client keeps at least ``min_size`` samples; the rest are shared out in proportion to the draws.
    """
    n = len(labels)
    _check_clients(n, num_clients, "power_law")
    if n < num_clients * min_size:
        raise PartitionError(f"power_law: {n} samples cannot give {num_clients} clients {min_size} each; "
                             f"lower num_clients or min_size.")
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, sigma, num_clients)
    extra = n - num_clients * min_size
    sizes = min_size + np.floor(w / w.sum() * extra).astype(int)
    for i in np.argsort(-w)[: n - sizes.sum()]:  # distribute the rounding remainder to the largest clients
        sizes[i] += 1
    perm = rng.permutation(n)
    return [np.sort(p) for p in np.split(perm, np.cumsum(sizes)[:-1])]


PARTITIONERS = {
    "iid": "shuffle and cut into equal parts",
    "dirichlet": "label skew: class proportions over clients ~ Dir(alpha) (Hsu et al. 2019)",
    "pathological": "each client holds exactly classes_per_client classes (McMahan et al. shards)",
    "power_law": "IID labels, heavy-tailed client sizes ~ lognormal(0, sigma)",
    "natural": "the source's own clients (Synthetic(alpha, beta))",
}


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5,
              classes_per_client: int = 2, sigma: float = 1.0) -> list[np.ndarray]:
    """Dispatch by name; unknown names are refused with the list of valid ones."""
    if name == "iid":
        return iid(labels, num_clients, seed)
    if name == "dirichlet":
        return dirichlet(labels, num_clients, alpha, seed)
    if name == "pathological":
        return pathological(labels, num_clients, classes_per_client, seed)
    if name == "power_law":
        return power_law(labels, num_clients, seed, sigma)
    raise PartitionError(f"unknown partition {name!r}; choose one of {sorted(PARTITIONERS)}.")
