"""What an algorithm's round sees: the static environment and the round's traced values."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax.data.ragged import join_rows, split_rows
from fljax.engine.executors import Executor, planned_vmap
from fljax.engine.protocol import ClientInput
from fljax.engine.sampling import poisson_cohort, sample_cohort

__all__ = ["RoundContext", "ClientCall", "TRAIN", "EVAL", "SAMPLE", "INIT", "MIXING", "CLOCK", "SERVER", "UPLOAD",
           "NOISE", "ATTACK", "DISPATCH"]

# Stream tags: every random choice derives from fold_in(fold_in(run_key, round), tag) and then the client id, so
# results never depend on the executor, the cohort's order or the batch position of a client.
SAMPLE, TRAIN, EVAL, INIT = 0, 1, 2, 3
MIXING = 4  # the round's mixing matrix of decentralized algorithms (redrawn topologies)
CLOCK = 5  # round-independent per-client streams: fold_in(fold_in(run_key, CLOCK), id) (the epoch clock's batches)
SERVER = 6  # the server's own draws on its data (e.g. AugFL's knowledge-transfer minibatches and negatives)
UPLOAD = 7  # a client's draws while encoding its upload (random-k's subset, QSGD's rounding: fljax.privacy)
NOISE = 8  # the server's privacy noise and adaptive clipping's count noise (fljax.privacy)
ATTACK = 9  # the malicious clients' draws: fold_in(run_key, ATTACK) who they are, the round's stream what they send
DISPATCH = 10  # an asynchronous run's d-th dispatch: fold_in(fold_in(run_key, DISPATCH), d) (fljax.algorithms.asynchronous)


@dataclasses.dataclass(frozen=True)
class ClientCall:
    """``update(ClientInput(...))`` for one client, as the executor's ``fn(shared, per_client)``: ``shared`` =
    (down, round, train rows, test rows, malicious mask), ``per_client`` = (state, train, key, test, clock_key, id,
    steps). With ragged storage the rows are the flat samples and the per-client train/test the client's (offset,
    count), joined into its padded window here (:func:`fljax.data.ragged.join_rows`); with padded data the rows are
    None. A data-poisoning ``attack`` (:class:`fljax.aggregation.Attack`) changes the train split of a client the
    malicious mask ``[num_clients]`` marks before it trains. Hashable (a bound method of a frozen algorithm, hashable
    models), so the loop executor compiles it once."""

    update: Callable
    model: Any
    unroll: int
    global_model: Any = None
    privacy: Any = None
    attack: Any = None

    def __call__(self, shared, per_client):
        down, round_, train_rows, test_rows, malicious = shared
        state, train, key, test, clock_key, id_, steps = per_client
        train, test = join_rows(train_rows, train), join_rows(test_rows, test)
        if self.attack is not None and train is not None:
            flag = malicious[jnp.minimum(id_, malicious.shape[0] - 1)] & (id_ < malicious.shape[0])
            train = self.attack.poison(train, flag, jax.random.fold_in(key, ATTACK))
        return self.update(ClientInput(state=state, train=train, key=key, round=round_, down=down, test=test,
                                       clock_key=clock_key, model=self.model, unroll=self.unroll,
                                       global_model=self.global_model or self.model, id=id_,
                                       privacy=self.privacy, steps=steps))


@dataclasses.dataclass
class RoundContext:
    """``executor``: how the client axis runs; ``data``: the federated data (device arrays, read through
    :class:`~fljax.engine.protocol.SimulationData`); ``round``: the round
    index (traced int); ``key``: this round's key; ``model``: the model clients run (static; None for problems
    without one); ``unroll``: the unroll factor of local-step loops (static). ``run_key``: the run's base key (for
    round-independent streams, :meth:`clock_keys`); ``population``: the client groups
    (:class:`~fljax.engine.population.Population`; None: one homogeneous population); ``global_model``: the model of
    the server's global parameters (None: ``model``); ``ids``: the client ids of ``data``'s rows (None: 0 … C − 1;
    a group's context holds its slice of the population, an evaluation sample's its clients); ``privacy``: the run's
    privacy and compression (:class:`fljax.privacy.Privacy`; None: none): its DP-SGD reaches every client's local
    steps (``ClientInput.privacy``), the rest is the centralized template's
    (:class:`fljax.algorithms.base.Centralized`). ``eval_ids``: the clients an evaluation scores (sorted ids, host
    numpy, :func:`fljax.engine.sampling.evaluation_sample`; None: every client), set in evaluation contexts only
    (:meth:`evaluated`). ``aggregator``: what a centralized server makes of its uploads
    (:class:`fljax.aggregation.Aggregator`: the weighted mean by default; its attack's data poisoning reaches the
    malicious clients' training here, :meth:`run_clients`); ``participation``: who takes part in a round
    (:class:`fljax.participation.Participation`: uniform cohorts by default).

    Server-side inputs: :attr:`server` is what the server holds (``data.server``, a
    :class:`~fljax.data.ServerData`: its own labelled set and frozen pretrained models), an argument of the compiled
    round like the client data but handed to no client: :meth:`run_clients` passes each client only its state, its
    train (and test) split, its key, the round and ``down``."""

    executor: Executor
    data: Any
    round: jax.Array
    key: jax.Array
    model: Any = None
    unroll: int = 1
    run_key: Any = None
    population: Any = None
    global_model: Any = None
    ids: Any = None
    privacy: Any = None
    eval_ids: Any = None
    aggregator: Any = None
    participation: Any = None

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    @property
    def client_ids(self):
        """The client ids of this context's clients (``[C]``, numpy)."""
        return np.arange(self.num_clients) if self.ids is None else self.ids

    @property
    def server_model(self):
        """The model of the global parameters (``global_model``, else ``model``)."""
        return self.global_model or self.model

    def for_group(self, g: int) -> "RoundContext":
        """The context of client group ``g`` of the population: its data (grouped data's ``group(g)``, else its
        slice of the data), its model and client ids."""
        group = self.population.groups[g]
        lo, hi = self.population.bounds(g)
        data = self.data.group(g) if self.data.group_sizes is not None else jax.tree.map(lambda a: a[lo:hi],
                                                                                           self.data)
        return dataclasses.replace(self, data=data, model=group.model or self.model, population=None,
                                   global_model=self.server_model, ids=np.arange(lo, hi))

    def evaluated(self, clients):
        """``(context, per-client states)`` of the clients an evaluation scores: this context and ``clients`` when
        every client is scored (``eval_ids`` None); else the sample's: its clients' train and test splits, states
        (gathered in id order; ``clients`` None stays None) and ids, so every client in it is scored exactly as in
        an evaluation of every client. Homogeneous populations without target clients
        (:class:`~fljax.engine.Simulation` refuses the others)."""
        if self.eval_ids is None:
            return self, clients
        ids = self.eval_ids
        data = self.data.replace(train=self.data.train.take(ids), test=self.data.test.take(ids))
        states = None if clients is None else jax.tree.map(lambda x: jnp.take(x, ids, axis=0), clients)
        return dataclasses.replace(self, data=data, ids=ids, eval_ids=None), states

    @property
    def num_train_clients(self) -> int:
        """Clients that may train: all but the data's target clients (ids ``0 … num_train_clients − 1``)."""
        return self.data.num_train_clients

    @property
    def server(self):
        """The server's own data and frozen models (``data.server``), or None."""
        return self.data.server

    def map_clients(self, fn, shared, per_client):
        """``fn(shared, per_client[i])`` for every client i, stacked (see :mod:`fljax.engine.executors`)."""
        return self.executor.map_clients(fn, shared, per_client)

    def map_init(self, fn, shared, per_client):
        """``fn(shared, per_client[i])`` for every client i, stacked: an initialisation's per-client draws, as one
        ``vmap`` planned against the program's memory budget (chunked when the clients do not all fit,
        :func:`fljax.engine.executors.planned_vmap`) whatever the cohort's executor, so that every executor starts
        from the same bits (the loop executor's per-client calls can round a reduction differently)."""
        return planned_vmap(fn, shared, per_client)

    def run_clients(self, update: Callable, down, states, train, keys, test=None, clock_keys=None, ids=None,
                    steps=None):
        """``update(ClientInput)`` for every client whose stacked ``states``, ``train`` split, ``keys`` (and
        ``test`` split, round-independent ``clock_keys``, client ``ids``, local-step budgets ``steps``) are given,
        all receiving ``down``; the results stacked along the client axis. The malicious clients of a
        data-poisoning attack (:attr:`aggregator`) train on their poisoned split (training only: ``test`` None)."""
        attack = None if self.aggregator is None or test is not None else self.aggregator.attack
        attack = attack if attack is not None and attack.poisons else None
        malicious = None
        if attack is not None:
            if ids is None:
                raise ValueError("a data-poisoning attack needs the training clients' ids.")
            from fljax.aggregation import malicious_mask

            malicious = malicious_mask(self.malicious_key, self.num_clients, attack.fraction)
        call = ClientCall(update, self.model, self.unroll, self.global_model,
                          None if self.privacy is None else self.privacy.example, attack)
        train_rows, train = split_rows(train)
        test_rows, test = split_rows(test)
        return self.map_clients(call, (down, self.round, train_rows, test_rows, malicious),
                                (states, train, keys, test, clock_keys, None if ids is None else jnp.asarray(ids),
                                 steps))

    @property
    def malicious_key(self):
        """The key of the run's one draw of its malicious clients (:func:`fljax.aggregation.malicious_mask`):
        ``fold_in(run_key, ATTACK)``, the same in every round."""
        return jax.random.fold_in(self.run_key, ATTACK)

    def stream(self, tag: int):
        return jax.random.fold_in(self.key, tag)

    def client_keys(self, ids, tag: int = TRAIN):
        """One key per client id: ``fold_in(fold_in(round_key, tag), id)``."""
        base = self.stream(tag)
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids))

    def clock_keys(self, ids):
        """One round-independent key per client id: ``fold_in(fold_in(run_key, CLOCK), id)`` (None without a run
        key)."""
        if self.run_key is None:
            return None
        base = jax.random.fold_in(self.run_key, CLOCK)
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids))

    def sample_stream(self):
        """The key of the round's cohort draws (the SAMPLE stream): whom a participation selects, and its systems'
        draws folded from it (:mod:`fljax.participation`)."""
        return self.stream(SAMPLE)

    def sample_cohort(self, size: int | None):
        """Sorted ids of a uniform cohort of ``size`` training clients without replacement (all of them when
        None); target clients are never sampled."""
        return sample_cohort(self.stream(SAMPLE), self.num_train_clients, size)

    def sample_poisson(self, rate: float, capacity: int):
        """``(ids [capacity], valid [capacity])``: every training client drawn independently with probability
        ``rate`` into a buffer of ``capacity`` slots, sorted ids first, empty slots holding ``num_train_clients``
        (:func:`fljax.engine.sampling.poisson_cohort`); the same stream as :meth:`sample_cohort`."""
        return poisson_cohort(self.stream(SAMPLE), self.num_train_clients, rate, capacity)
