"""Client sampling, seeded per round."""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["sample_cohort", "bernoulli_mask"]


def sample_cohort(key, num_clients: int, size: int | None):
    """A fixed-size cohort drawn uniformly without replacement, as sorted client ids ``[size]``.

    ``size`` None (or >= ``num_clients``) is full participation: ``arange(num_clients)``.
    """
    if size is None or size >= num_clients:
        return jnp.arange(num_clients)
    return jnp.sort(jax.random.choice(key, num_clients, (size,), replace=False))


def bernoulli_mask(key, num_clients: int, rate: float):
    """Each client participates independently with probability ``rate`` (a ``[C]`` boolean mask); an empty draw
    is replaced by one uniformly chosen client, so a round always has a participant."""
    k1, k2 = jax.random.split(key)
    mask = jax.random.bernoulli(k1, rate, (num_clients,))
    fallback = jnp.arange(num_clients) == jax.random.randint(k2, (), 0, num_clients)
    return jnp.where(mask.any(), mask, fallback)
