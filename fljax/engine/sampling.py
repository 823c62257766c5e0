"""Client sampling, seeded per round: fixed-size cohorts (:func:`sample_cohort`) and Poisson cohorts in a static buffer
with a validity mask (:func:`poisson_cohort`, from :mod:`fljax.ops.privacy`: the sampling DP-FedAvg is accounted
for); and the one fixed sample of clients that evaluation scores when a run asks for one (:func:`evaluation_sample`,
``eval_clients``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fljax.ops.privacy import poisson_cohort

__all__ = ["sample_cohort", "poisson_cohort", "smallest_keys", "bernoulli_mask", "evaluation_sample", "check_sample",
           "PERMUTATION_MAX_CLIENTS", "EVAL_SAMPLE_SEED"]

# Up to this many clients a cohort is the head of a random permutation (jax.random.choice: two sorts of the whole
# population's keys); beyond, a linear-time selection of the smallest keys (smallest_keys). Measured on a loaded
# 2-core CPU (benchmarks/scale.py): 2.7 s against 0.03 s per cohort of 10,000 from 1,000,000 clients, more than the
# round itself. The bound keeps every population padded storage allows on its earlier cohorts, seed for seed.
PERMUTATION_MAX_CLIENTS = 100_000
_RADIX = 1 << 16


def sample_cohort(key, num_clients: int, size: int | None):
    """A fixed-size cohort drawn uniformly without replacement, as sorted client ids ``[size]``.

    ``size`` None (or >= ``num_clients``) is full participation: ``arange(num_clients)``. Up to
    :data:`PERMUTATION_MAX_CLIENTS` clients the cohort is ``jax.random.choice``'s; beyond, the ``size`` clients with
    the smallest of ``num_clients`` independent uniform 32-bit keys (:func:`smallest_keys`), a uniform subset too.
    """
    if size is None or size >= num_clients:
        return jnp.arange(num_clients)
    if num_clients > PERMUTATION_MAX_CLIENTS:
        return smallest_keys(jax.random.bits(key, (num_clients,), jnp.uint32), size)
    return jnp.sort(jax.random.choice(key, num_clients, (size,), replace=False))


def smallest_keys(keys, k: int):
    """Sorted indices of the ``k`` smallest of the uint32 ``keys`` (ties: lower index first) in O(n): a two-pass
    radix select (a 65,536-bin histogram of the high 16 bits finds the bin of the k-th smallest key, one of the low
    16 bits within that bin finds the key T), then every key below T and the first ones equal to T."""

    def kth_bin(digits, valid, below):
        hist = jnp.zeros(_RADIX, jnp.int32).at[jnp.where(valid, digits, _RADIX)].add(1, mode="drop")
        cum = below + jnp.cumsum(hist)
        b = jnp.searchsorted(cum, k, side="left")  # the bin holding the k-th smallest key
        return b, cum[b] - hist[b]

    high, low = (keys >> 16).astype(jnp.int32), (keys & (_RADIX - 1)).astype(jnp.int32)
    b_high, below = kth_bin(high, jnp.ones(keys.shape, bool), 0)
    b_low, _ = kth_bin(low, high == b_high, below)
    kth = (b_high.astype(jnp.uint32) << 16) | b_low.astype(jnp.uint32)
    less, equal = keys < kth, keys == kth
    chosen = less | (equal & (jnp.cumsum(equal) <= k - jnp.sum(less)))
    return jnp.nonzero(chosen, size=k)[0]


def bernoulli_mask(key, num_clients: int, rate: float):
    """Each client participates independently with probability ``rate`` (a ``[C]`` boolean mask); an empty draw
    is replaced by one uniformly chosen client, so a round always has a participant."""
    k1, k2 = jax.random.split(key)
    mask = jax.random.bernoulli(k1, rate, (num_clients,))
    fallback = jnp.arange(num_clients) == jax.random.randint(k2, (), 0, num_clients)
    return jnp.where(mask.any(), mask, fallback)


EVAL_SAMPLE_SEED = 0  # the seed of the one permutation evaluation samples are prefixes of


def check_sample(size, *, clients: int, train_clients: int, labelled: bool, grouped: bool) -> None:
    """Refuse, in one line naming ``eval_clients``, an evaluation sample of ``size`` clients (None: every client)
    that cannot be scored as in an evaluation of every client: one that is not a whole number between 1 and the
    ``clients``; of data that is not ``labelled`` examples (a consensus-regression problem measures every client);
    of a ``grouped`` population (client groups, or data in groups of their own: each group is evaluated whole); of
    a population with target clients (fewer ``train_clients`` than ``clients``: they are evaluated apart). The one
    rule, asked of a config by :func:`fljax.experiment.resolve` and of its arguments by
    :class:`~fljax.engine.Simulation`."""
    from fljax.errors import OptionError

    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise OptionError("eval_clients", f"must be an integer number of clients or null (every client), got "
                                          f"{size!r}.")
    if not labelled:
        raise OptionError("eval_clients", "samples the clients of classification data; this problem's evaluation "
                                          "measures every client: set eval_clients to null.")
    if not 1 <= size <= clients:
        raise OptionError("eval_clients", f"must be between 1 and the {clients} clients of the data (or null: every "
                                          f"client), got {size}.")
    if grouped:
        raise OptionError("eval_clients", "samples a homogeneous population; client groups (groups, or data in "
                                          "groups of its own) are evaluated on every client: set eval_clients to "
                                          "null.")
    if train_clients < clients:
        raise OptionError("eval_clients", f"samples the training clients of a population; this split's "
                                          f"{clients - train_clients} target clients are evaluated apart on every "
                                          f"client: set eval_clients to null.")


def evaluation_sample(num_clients: int, size: int | None) -> np.ndarray | None:
    """The clients every evaluation of a run scores (``eval_clients``), as sorted ids (host numpy), or None for
    every client (``size`` None or at least ``num_clients``).

    The sample is the first ``size`` entries of one fixed permutation of the ids,
    ``numpy.random.default_rng(EVAL_SAMPLE_SEED).permutation(num_clients)``, sorted: a uniform subset without
    replacement that depends on the population's size alone. So it is the same at every evaluation (curves
    compare), for every run seed and every lane of a program, after a resume and on every process of a
    multi-process run; and a smaller sample is part of a larger one."""
    if size is None or size >= num_clients:
        return None
    if size < 1:
        raise ValueError(f"an evaluation sample needs at least one client, got {size}.")
    order = np.random.default_rng(EVAL_SAMPLE_SEED).permutation(num_clients)
    return np.sort(order[:size]).astype(np.int32)
