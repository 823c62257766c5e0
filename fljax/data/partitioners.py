"""Partitioners: assign the samples of a pooled data set to clients.

Every partitioner takes the pooled labels, the number of clients and a seed, and returns a list of index arrays
(one per client) that together use every sample exactly once. Each is reproducible from its seed and raises
:class:`PartitionError` with a one-line fix when it would leave a client without data.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PartitionError", "iid", "dirichlet", "pathological", "power_law", "client_centric", "PARTITIONERS",
           "partition"]


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


def client_centric(labels: np.ndarray, num_clients: int, samples_per_client: int, seed: int = 0, *,
                   alpha: float | None = None, classes_per_client: int | None = None,
                   on_exhausted: str = "refill") -> list[np.ndarray]:
    """Equal-size, client-centric label sampler (FedSLR spec §7 D15, DFedAlt spec §5 D15).

    Client i draws a class prior q_i: Dir(α·1_C) (``alpha``) or uniform over ``classes_per_client`` random classes.
    Each of its ``samples_per_client`` slots draws a class from q_i and takes the next unused sample of that class
    (class pools are shuffled once). When a class pool is exhausted: ``'refill'`` reshuffles the class's full pool
    and continues (so samples may repeat across clients, as in both papers' code); ``'redraw'`` draws another class
    from q_i (refilling only when every class of q_i is exhausted). Unlike the partitioners above, this is a
    sampler: samples can be used by several clients and some not at all.
    """
    if (alpha is None) == (classes_per_client is None):
        raise PartitionError("client_centric: give exactly one of alpha (Dirichlet prior) or classes_per_client.")
    if alpha is not None and not alpha > 0:
        raise PartitionError(f"client_centric: alpha must be > 0, got {alpha}; typical values are 0.1 to 1.0.")
    if samples_per_client < 1:
        raise PartitionError(f"client_centric: samples_per_client must be >= 1, got {samples_per_client}.")
    if on_exhausted not in ("refill", "redraw"):
        raise PartitionError(f"client_centric: on_exhausted must be 'refill' or 'redraw', got {on_exhausted!r}.")
    classes = np.unique(labels)
    if classes_per_client is not None and not 1 <= classes_per_client <= len(classes):
        raise PartitionError(f"client_centric: classes_per_client must be in [1, {len(classes)}], "
                             f"got {classes_per_client}.")
    if num_clients < 1:
        raise PartitionError(f"client_centric: num_clients must be >= 1, got {num_clients}.")
    rng = np.random.default_rng(seed)
    pools = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    next_free = {c: 0 for c in pools}
    out = []
    for _ in range(num_clients):
        if alpha is not None:
            prior = rng.dirichlet(np.full(len(classes), alpha))
        else:
            prior = np.zeros(len(classes))
            prior[rng.choice(len(classes), classes_per_client, replace=False)] = 1.0 / classes_per_client
        taken = []
        for _ in range(samples_per_client):
            c = int(classes[rng.choice(len(classes), p=prior)])
            if next_free[c] == len(pools[c]) and on_exhausted == "redraw":
                open_classes = [j for j, k in enumerate(classes) if prior[j] > 0 and next_free[int(k)] < len(pools[int(k)])]
                if open_classes:
                    p = prior[open_classes] / prior[open_classes].sum()
                    c = int(classes[open_classes[rng.choice(len(open_classes), p=p)]])
            if next_free[c] == len(pools[c]):  # refill: a fresh shuffle of the whole class
                pools[c] = rng.permutation(pools[c])
                next_free[c] = 0
            taken.append(pools[c][next_free[c]])
            next_free[c] += 1
        out.append(np.asarray(taken, np.int64))
    return out


PARTITIONERS = {
    "iid": "shuffle and cut into equal parts",
    "dirichlet": "label skew: class proportions over clients ~ Dir(alpha) (Hsu et al. 2019)",
    "pathological": "each client holds exactly classes_per_client classes (McMahan et al. shards)",
    "power_law": "IID labels, heavy-tailed client sizes ~ lognormal(0, sigma)",
    "client_dirichlet": "equal sizes (samples_per_client); each client's class prior ~ Dir(alpha), pools refilled "
                        "(FedSLR/DFedAlt papers' sampler; samples may repeat across clients)",
    "client_pathological": "equal sizes; each client samples uniformly from classes_per_client random classes",
    "natural": "the source's own clients (Synthetic(alpha, beta))",
}


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5,
              classes_per_client: int = 2, sigma: float = 1.0, samples_per_client: int | None = None,
              on_exhausted: str = "refill") -> list[np.ndarray]:
    """Dispatch by name; unknown names are refused with the list of valid ones."""
    if name in ("client_dirichlet", "client_pathological"):
        n = samples_per_client or len(labels) // num_clients
        if name == "client_dirichlet":
            return client_centric(labels, num_clients, n, seed, alpha=alpha, on_exhausted=on_exhausted)
        return client_centric(labels, num_clients, n, seed, classes_per_client=classes_per_client,
                              on_exhausted=on_exhausted)
    if name == "iid":
        return iid(labels, num_clients, seed)
    if name == "dirichlet":
        return dirichlet(labels, num_clients, alpha, seed)
    if name == "pathological":
        return pathological(labels, num_clients, classes_per_client, seed)
    if name == "power_law":
        return power_law(labels, num_clients, seed, sigma)
    raise PartitionError(f"unknown partition {name!r}; choose one of {sorted(PARTITIONERS)}.")
