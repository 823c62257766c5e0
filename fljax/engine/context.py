"""What an algorithm's round sees: the static environment and the round's traced values."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from fljax.engine.executors import Executor
from fljax.engine.groups import map_groups
from fljax.engine.protocol import ClientInput
from fljax.engine.sampling import sample_cohort

__all__ = ["RoundContext", "ClientCall", "TRAIN", "EVAL", "SAMPLE", "INIT", "MIXING"]

# Stream tags: every random choice derives from fold_in(fold_in(run_key, round), tag) and then the client id, so
# results never depend on the executor, the cohort's order or the batch position of a client.
SAMPLE, TRAIN, EVAL, INIT = 0, 1, 2, 3
MIXING = 4  # the round's mixing matrix of decentralized algorithms (redrawn topologies)


@dataclasses.dataclass(frozen=True)
class ClientCall:
    """``update(ClientInput(...))`` for one client, as the executor's ``fn(shared, per_client)``: ``shared`` =
    (down, round), ``per_client`` = (state, train, key, test). Hashable (a bound method of a frozen
    algorithm, a hashable model), so the loop executor compiles it once."""

    update: Callable
    model: Any
    unroll: int

    def __call__(self, shared, per_client):
        down, round_ = shared
        state, train, key, test = per_client
        return self.update(ClientInput(state=state, train=train, key=key, round=round_, down=down, test=test,
                                       model=self.model, unroll=self.unroll))


@dataclasses.dataclass
class RoundContext:
    """``executor``: how the client axis runs; ``data``: the federated data (device arrays); ``round``: the round
    index (traced int); ``key``: this round's key; ``model``: the model clients run (static; None for problems
    without one); ``unroll``: the unroll factor of local-step loops (static)."""

    executor: Executor
    data: Any
    round: jax.Array
    key: jax.Array
    model: Any = None
    unroll: int = 1

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def map_clients(self, fn, shared, per_client):
        """``fn(shared, per_client[i])`` for every client i, stacked (see :mod:`fljax.engine.executors`)."""
        return self.executor.map_clients(fn, shared, per_client)

    def map_groups(self, fn, shared, groups, per_client=None, per_group=None, *, concat: bool = True,
                   serial: bool = False):
        """``fn`` over every client of every group of clients whose arrays differ in shape between groups (see
        :func:`fljax.engine.groups.map_groups`)."""
        return map_groups(self.executor, fn, shared, groups, per_client, per_group, concat=concat, serial=serial)

    def run_clients(self, update: Callable, down, states, train, keys, test=None):
        """``update(ClientInput)`` for every client whose stacked ``states``, ``train`` split, ``keys`` (and
        ``test`` split) are given, all receiving ``down``; the results stacked along the client axis."""
        return self.map_clients(ClientCall(update, self.model, self.unroll), (down, self.round),
                                (states, train, keys, test))

    def stream(self, tag: int):
        return jax.random.fold_in(self.key, tag)

    def client_keys(self, ids, tag: int = TRAIN):
        """One key per client id: ``fold_in(fold_in(round_key, tag), id)``."""
        base = self.stream(tag)
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids))

    def sample_cohort(self, size: int | None):
        """Sorted ids of a uniform cohort of ``size`` clients without replacement (all clients when None)."""
        return sample_cohort(self.stream(SAMPLE), self.num_clients, size)
