"""Partitioners: assign the samples of a pooled data set to clients.

Every partitioner takes the pooled labels, the number of clients and a seed, and returns a list of index arrays
(one per client) that together use every sample exactly once. Each is reproducible from its seed and raises
:class:`PartitionError` with a one-line fix when it would leave a client without data. Each is registered in
:data:`PARTITIONERS` with its options (a dataclass of :mod:`fljax.options`); :func:`partition` dispatches by name.
A partitioner defined in another module registers itself there (:func:`register_partitioner`; the few-shot split
``meta_pairs`` of :mod:`fljax.data.meta`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Literal

import numpy as np

from fljax.errors import OptionError
from fljax.options import Options, at_least, greater_than, option, parse, suggest

__all__ = ["PartitionError", "iid", "dirichlet", "pathological", "power_law", "client_centric", "class_slots",
           "pachinko", "pachinko_distributions", "CIFAR100_COARSE", "PachinkoOptions",
           "class_slots_test", "ClassSlotsOptions", "Partitioner",
           "PARTITIONERS", "partition", "PartitionOptions", "DirichletOptions", "PathologicalOptions", "PowerLawOptions",
           "ClientDirichletOptions", "ClientPathologicalOptions", "register_partitioner"]


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


def _slot_table(num_clients: int, classes: np.ndarray, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """An ``[n, c]`` table holding every class s = n·c/C times, every row c distinct classes: a uniformly shuffled
    multiset, then random swaps between a row with a repeated class and another row until no row repeats one (a
    swap is kept when it does not add repeats). Rejecting whole tables, as the spec words it, needs ~0.59^n draws
    for c = 4 of 10 classes, so it is only feasible for about 15 clients."""
    slots = num_clients * per_client // len(classes)
    table = rng.permutation(np.repeat(classes, slots)).reshape(num_clients, per_client)

    def repeats(row):
        return per_client - len(np.unique(row))

    bad = [i for i in range(num_clients) if repeats(table[i])]
    while bad:
        i = bad[rng.integers(len(bad))]
        vals, counts = np.unique(table[i], return_counts=True)
        a = rng.choice(np.flatnonzero(np.isin(table[i], vals[counts > 1])))
        j, b = rng.integers(num_clients), rng.integers(per_client)
        if j == i:
            continue
        before = repeats(table[i]) + repeats(table[j])
        table[i, a], table[j, b] = table[j, b], table[i, a]
        if repeats(table[i]) + repeats(table[j]) > before:
            table[i, a], table[j, b] = table[j, b], table[i, a]
        bad = [k for k in range(num_clients) if repeats(table[k])]
    return table


def class_slots(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int = 0,
                per_slot: int | None = None) -> list[np.ndarray]:
    """Balanced class slots (QuPeD spec §9, D22): every client holds ``classes_per_client`` = c distinct classes and
    every class is held by s = n·c/C clients; each class's shuffled samples are cut into s slices of ``per_slot``
    (None: ⌊class size/s⌋, i.e. all data), one per holder. The table is :func:`_slot_table`. Test slices come from
    :func:`class_slots_test` (the test pool cut the same way, one slice per holder, disjoint across clients)."""
    classes = np.unique(labels)
    c = classes_per_client
    if not 1 <= c <= len(classes):
        raise PartitionError(f"class_slots: classes_per_client must be in [1, {len(classes)}], got {c}.")
    if num_clients < 1 or num_clients * c % len(classes):
        raise PartitionError(f"class_slots: num_clients x classes_per_client = {num_clients} x {c} must be a multiple "
                             f"of the {len(classes)} classes, so that every class is held equally often.")
    rng = np.random.default_rng(seed)
    table = _slot_table(num_clients, classes, c, rng)
    return _cut_slots(labels, table, per_slot, rng, "train_per_slot")


def _cut_slots(labels: np.ndarray, table: np.ndarray, per_slot: int | None, rng: np.random.Generator,
               key: str, pool: str = "samples") -> list[np.ndarray]:
    """Client i gets one slice of ``per_slot`` shuffled samples of each class in row i of ``table`` (entries < 0
    are padding); each class's shuffled pool is cut into one slice per holder (None: an equal share)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(table.shape[0])]
    for k in np.unique(table[table >= 0]):
        holders = np.flatnonzero((table == k).any(axis=1))
        idx = rng.permutation(np.flatnonzero(labels == k))
        size = len(idx) // len(holders) if per_slot is None else per_slot
        if size < 1 or size * len(holders) > len(idx):
            raise PartitionError(f"class_slots: class {k} has {len(idx)} {pool} for {len(holders)} slots of "
                                 f"{size}; lower {key} or num_clients.")
        for slot, i in enumerate(holders):
            parts[i].append(idx[slot * size:(slot + 1) * size])
    return [np.sort(np.concatenate(p)) for p in parts]


def class_slots_test(train_labels: list[np.ndarray], test_labels: np.ndarray, seed: int,
                     per_slot: int | None = None) -> list[np.ndarray]:
    """The test slices of :func:`class_slots`: client i's classes are those of its train split."""
    c = max(len(np.unique(y)) for y in train_labels)
    table = np.full((len(train_labels), c), -1)
    for i, y in enumerate(train_labels):
        held = np.unique(y)
        table[i, :len(held)] = held
    return _cut_slots(test_labels, table, per_slot, np.random.default_rng(seed + 7919), "test_per_slot",
                      "test samples")


# CIFAR-100's class hierarchy: the coarse class (of 20) of each fine class (of 100), both in the data set's
# alphabetical label order (Krizhevsky 2009): apple -> fruit_and_vegetables (4), aquarium_fish -> fish (1), ...
CIFAR100_COARSE = np.array([4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13,
                            15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4,
                            17, 4, 2, 0, 17, 4, 18, 17, 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13,
                            15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13])


def pachinko_distributions(coarse_of: np.ndarray, num_clients: int, alpha: float, beta: float,
                           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Every client's Pachinko distributions: θ_i ~ Dir(α·1) over the coarse classes ``[C, K]`` and, for each coarse
    class k, φ_ik ~ Dir(β·1) over its fine classes, stored as ``[C, F]`` (φ_i[f] is the probability of fine class f
    given its coarse class)."""
    rng = np.random.default_rng(seed + 1_000_003)
    num_coarse = int(coarse_of.max()) + 1
    theta = rng.dirichlet(np.full(num_coarse, alpha), num_clients)
    phi = np.zeros((num_clients, len(coarse_of)))
    for k in range(num_coarse):
        fine = np.flatnonzero(coarse_of == k)
        phi[:, fine] = rng.dirichlet(np.full(len(fine), beta), num_clients)
    return theta, phi


def pachinko(labels: np.ndarray, coarse_of: np.ndarray, num_clients: int, samples_per_client: int, seed: int,
             alpha: float = 0.1, beta: float = 10.0, stream: int = 0) -> list[np.ndarray]:
    """Reddi et al. (2021, App. C.2)'s Pachinko allocation of a pool with fine ``labels`` whose coarse classes are
    ``coarse_of[label]``: client i (in order) draws each of its ``samples_per_client`` samples by picking a coarse
    class k ~ θ_i, then a fine class f ~ φ_i restricted to k (:func:`pachinko_distributions`), then a sample of f
    uniformly without replacement. A fine class whose samples are exhausted is removed and the distributions over
    what remains renormalised (a coarse class goes when all its fine classes have). ``stream`` separates the draws of
    two pools (train 0, test 1) that share the clients' distributions."""
    classes = len(coarse_of)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise PartitionError(f"pachinko: labels must be fine classes in [0, {classes}).")
    if num_clients * samples_per_client > len(labels):
        raise PartitionError(f"pachinko: {num_clients} clients x {samples_per_client} samples need "
                             f"{num_clients * samples_per_client}, the pool holds {len(labels)}; lower num_clients "
                             f"or samples_per_client.")
    theta, phi = pachinko_distributions(coarse_of, num_clients, alpha, beta, seed)
    rng = np.random.default_rng([seed, 2_000_003, stream])
    pools = [list(rng.permutation(np.flatnonzero(labels == f))) for f in range(classes)]
    left = np.asarray([len(p) > 0 for p in pools])
    out = []
    for i in range(num_clients):
        taken = []
        for _ in range(samples_per_client):
            coarse_left = np.bincount(coarse_of[left], minlength=theta.shape[1]) > 0
            t = theta[i] * coarse_left
            k = rng.choice(len(t), p=t / t.sum()) if t.sum() > 0 else rng.choice(np.flatnonzero(coarse_left))
            f_mass = phi[i] * left * (coarse_of == k)
            f = rng.choice(classes, p=f_mass / f_mass.sum())
            taken.append(pools[f].pop())
            left[f] = len(pools[f]) > 0
        out.append(np.sort(np.asarray(taken, np.int64)))
    return out


def _alpha():
    return option(0.5, "Dirichlet concentration (> 0; small: few classes per client, typically 0.1 to 1.0)",
                  greater_than(0))


def _classes_per_client():
    return option(2, "classes each client holds", at_least(1))


def _samples_per_client():
    return option(None, "samples each client draws (null: the train pool's size / num_clients)", at_least(1))


def _on_exhausted():
    return option("refill", "when a class pool runs out: refill (reshuffle the whole class) or redraw (another of "
                            "the client's classes)")


@dataclasses.dataclass(frozen=True)
class PartitionOptions(Options):
    """A partitioner's options (none: iid, natural)."""

    def check_data(self, train_size: int, num_classes: int) -> None:
        """Refuse options that a data set with ``train_size`` training samples and ``num_classes`` classes cannot
        satisfy (raise :class:`OptionError`)."""

    def num_target(self, num_clients: int) -> int:
        """How many of the ``num_clients`` clients are *target* clients, which never train
        (:attr:`fljax.data.FederatedData.num_target`): none, but for ``meta_pairs``."""
        return 0


def _check_classes(classes_per_client: int, num_classes: int) -> None:
    if classes_per_client > num_classes:
        raise OptionError("classes_per_client", f"must be at most {num_classes} (the data set's classes), got "
                                                f"{classes_per_client}.")


def _check_samples(samples_per_client: int | None, train_size: int) -> None:
    if samples_per_client is not None and samples_per_client > train_size:
        raise OptionError("samples_per_client", f"must be at most {train_size} (the train pool's size), got "
                                                f"{samples_per_client}.")


@dataclasses.dataclass(frozen=True)
class DirichletOptions(PartitionOptions):
    alpha: float = _alpha()


@dataclasses.dataclass(frozen=True)
class PathologicalOptions(PartitionOptions):
    classes_per_client: int = _classes_per_client()

    def check_data(self, train_size: int, num_classes: int) -> None:
        _check_classes(self.classes_per_client, num_classes)


@dataclasses.dataclass(frozen=True)
class PowerLawOptions(PartitionOptions):
    sigma: float = option(1.0, "spread of the client sizes: lognormal(0, sigma) weights", at_least(0))


@dataclasses.dataclass(frozen=True)
class ClientDirichletOptions(PartitionOptions):
    alpha: float = _alpha()
    samples_per_client: int | None = _samples_per_client()
    on_exhausted: Literal["refill", "redraw"] = _on_exhausted()

    def check_data(self, train_size: int, num_classes: int) -> None:
        _check_samples(self.samples_per_client, train_size)


@dataclasses.dataclass(frozen=True)
class ClientPathologicalOptions(PartitionOptions):
    classes_per_client: int = _classes_per_client()
    samples_per_client: int | None = _samples_per_client()
    on_exhausted: Literal["refill", "redraw"] = _on_exhausted()

    def check_data(self, train_size: int, num_classes: int) -> None:
        _check_classes(self.classes_per_client, num_classes)
        _check_samples(self.samples_per_client, train_size)


@dataclasses.dataclass(frozen=True)
class ClassSlotsOptions(PartitionOptions):
    classes_per_client: int = option(4, "classes each client holds (num_clients x classes_per_client must be a "
                                        "multiple of the number of classes)", at_least(1))
    train_per_slot: int | None = option(None, "train samples per (client, class) slot (null: all data, an equal "
                                              "share of the class)", at_least(1))
    test_per_slot: int | None = option(None, "test samples per (client, class) slot, from the test pool (null: an "
                                             "equal share)", at_least(1))

    def check_data(self, train_size: int, num_classes: int) -> None:
        _check_classes(self.classes_per_client, num_classes)


@dataclasses.dataclass(frozen=True)
class PachinkoOptions(PartitionOptions):
    coarse_alpha: float = option(0.1, "Dirichlet concentration α of a client's coarse-class distribution (Reddi et "
                                      "al.: 0.1)", greater_than(0))
    fine_beta: float = option(10.0, "Dirichlet concentration β of a client's fine-class distribution within a coarse "
                                    "class (Reddi et al.: 10)", greater_than(0))
    samples_per_client: int | None = option(None, "train samples per client (null: the train pool's size / "
                                                  "num_clients; CIFAR-100 over 500 clients: 100)", at_least(1))

    def check_data(self, train_size: int, num_classes: int) -> None:
        if num_classes != len(CIFAR100_COARSE):
            raise OptionError("partition", f"pachinko splits CIFAR-100 by its coarse and fine classes; this data set "
                                           f"has {num_classes} classes, not 100.")
        _check_samples(self.samples_per_client, train_size)


@dataclasses.dataclass(frozen=True)
class Partitioner:
    """A partitioner by name: a one-line summary, its options, ``split(labels, num_clients, seed, options)`` (None
    for 'natural': the source's own clients) and, for partitioners that cut the test pool themselves,
    ``split_test(train_labels_per_client, test_labels, seed, options)`` (None: each client's test split follows its
    train labels, drawn from the test pool). ``build(source, num_clients, seed, options)``, when set, builds the
    whole :class:`~fljax.data.FederatedData` itself (splits that also carve out a server set, support/query sets or
    target clients)."""

    summary: str
    options: type[Options]
    split: Callable[..., list[np.ndarray]] | None
    split_test: Callable[..., list[np.ndarray]] | None = None
    build: Callable | None = None


def _samples(labels, num_clients: int, o) -> int:
    return o.samples_per_client or len(labels) // num_clients


PARTITIONERS: dict[str, Partitioner] = {
    "iid": Partitioner("shuffle and cut into equal parts", PartitionOptions,
                       lambda y, n, seed, o: iid(y, n, seed)),
    "dirichlet": Partitioner("label skew: class proportions over clients ~ Dir(alpha) (Hsu et al. 2019)",
                             DirichletOptions, lambda y, n, seed, o: dirichlet(y, n, o.alpha, seed)),
    "pathological": Partitioner("each client holds exactly classes_per_client classes (McMahan et al. shards)",
                                PathologicalOptions,
                                lambda y, n, seed, o: pathological(y, n, o.classes_per_client, seed)),
    "power_law": Partitioner("IID labels, heavy-tailed client sizes ~ lognormal(0, sigma)", PowerLawOptions,
                             lambda y, n, seed, o: power_law(y, n, seed, o.sigma)),
    "client_dirichlet": Partitioner(
        "equal sizes (samples_per_client); each client's class prior ~ Dir(alpha), pools refilled (FedSLR/DFedAlt "
        "papers' sampler; samples may repeat across clients)", ClientDirichletOptions,
        lambda y, n, seed, o: client_centric(y, n, _samples(y, n, o), seed, alpha=o.alpha,
                                             on_exhausted=o.on_exhausted)),
    "client_pathological": Partitioner(
        "equal sizes; each client samples uniformly from classes_per_client random classes",
        ClientPathologicalOptions,
        lambda y, n, seed, o: client_centric(y, n, _samples(y, n, o), seed, classes_per_client=o.classes_per_client,
                                             on_exhausted=o.on_exhausted)),
    "class_slots": Partitioner(
        "balanced class slots (QuPeD): classes_per_client distinct classes per client, every class on equally many "
        "clients, train_per_slot / test_per_slot samples per (client, class), disjoint", ClassSlotsOptions,
        lambda y, n, seed, o: class_slots(y, n, o.classes_per_client, seed, o.train_per_slot),
        lambda ys, y_test, seed, o: class_slots_test(ys, y_test, seed, o.test_per_slot)),
    "pachinko": Partitioner(
        "CIFAR-100 by Reddi et al.'s Pachinko allocation: per client Dir(coarse_alpha) over the 20 coarse classes, "
        "Dir(fine_beta) over each one's fine classes, samples_per_client samples without replacement; test slices "
        "drawn the same way from the test pool (an equal share each)", PachinkoOptions,
        lambda y, n, seed, o: pachinko(y, CIFAR100_COARSE, n, _samples(y, n, o), seed, o.coarse_alpha, o.fine_beta),
        lambda ys, y_test, seed, o: pachinko(y_test, CIFAR100_COARSE, len(ys), len(y_test) // len(ys), seed,
                                             o.coarse_alpha, o.fine_beta, stream=1)),
    "natural": Partitioner("the source's own clients (Synthetic, the LEAF sets, the stand-ins, your files)",
                           PartitionOptions, None),
}


def register_partitioner(name: str, partitioner: Partitioner) -> Partitioner:
    """Make ``partitioner`` the partition ``name`` (``data.partition: name``, ``fljax list``), from the module that
    defines it (:mod:`fljax.data.meta` registers ``meta_pairs``); refuses a name that is taken. Returns it."""
    if not isinstance(partitioner, Partitioner):
        raise PartitionError(f"partition {name!r} must be registered as a fljax.data.partitioners.Partitioner, got "
                             f"{type(partitioner).__name__}.")
    if name in PARTITIONERS:
        raise PartitionError(f"partition {name!r} is registered already ({PARTITIONERS[name].summary}); choose "
                             f"another name.")
    PARTITIONERS[name] = partitioner
    return partitioner


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, **options) -> list[np.ndarray]:
    """Dispatch by name with that partitioner's options (e.g. ``alpha=0.1`` for dirichlet); unknown names and
    options are refused with the closest valid one."""
    if name not in PARTITIONERS or PARTITIONERS[name].split is None:
        valid = sorted(n for n, p in PARTITIONERS.items() if p.split is not None)
        if name in PARTITIONERS and PARTITIONERS[name].build is not None:
            raise PartitionError(f"{name} builds whole federated data sets; use fljax.data.federate (or a config's "
                                 f"data section), not partition().")
        raise PartitionError(f"unknown partition {name!r}; choose one of {valid}.{suggest(name, valid)}")
    entry = PARTITIONERS[name]
    return entry.split(labels, num_clients, seed, parse(entry.options, options, f" for partition {name!r}"))
