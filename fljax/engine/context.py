"""What an algorithm's round sees: the static environment and the round's traced values."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fljax.data.federated import FederatedData
from fljax.engine.executors import Executor
from fljax.engine.sampling import sample_cohort

__all__ = ["RoundContext", "TRAIN", "EVAL", "SAMPLE", "INIT", "MIXING"]

# Stream tags: every random choice derives from fold_in(fold_in(run_key, round), tag) and then the client id, so
# results never depend on the executor, the cohort's order or the batch position of a client.
SAMPLE, TRAIN, EVAL, INIT = 0, 1, 2, 3
MIXING = 4  # the round's mixing matrix of decentralized algorithms (redrawn topologies)


@dataclasses.dataclass
class RoundContext:
    """``data``: the federated data (device arrays); ``round``: the round index (traced int); ``key``: this round's
    key; ``executor``: how the client axis runs."""

    executor: Executor
    data: FederatedData
    round: jax.Array
    key: jax.Array

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def map_clients(self, fn, shared, per_client):
        """``fn(shared, per_client[i])`` for every client i, stacked (see :mod:`fljax.engine.executors`)."""
        return self.executor.map_clients(fn, shared, per_client)

    def stream(self, tag: int):
        return jax.random.fold_in(self.key, tag)

    def client_keys(self, ids, tag: int = TRAIN):
        """One key per client id: ``fold_in(fold_in(round_key, tag), id)``."""
        base = self.stream(tag)
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids))

    def sample_cohort(self, size: int | None):
        """Sorted ids of a uniform cohort of ``size`` clients without replacement (all clients when None)."""
        return sample_cohort(self.stream(SAMPLE), self.num_clients, size)
