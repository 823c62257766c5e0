"""The algorithm protocol and the centralized template.

An algorithm is a frozen dataclass: its fields are hyperparameters, its methods pure functions of pytrees. The
engine binds it to a model (:meth:`Algorithm.bind`) and then calls

* ``init(ctx) -> (server, clients)``: the initial server pytree (or None) and the per-client pytree (leading axis
  ``num_clients``);
* ``round(ctx, server, clients) -> (server, clients, metrics)``: one communication round, traced inside ``jit``
  (except under the loop executor). ``metrics`` is a dict of scalars; ``train_loss``, ``bytes_up`` and
  ``bytes_down`` are expected;
* ``evaluate_client(shared, per_client)``: the test statistics of one client's global and personalized model;
* ``eval_metrics(server, clients)`` (default: none): extra scalars computed from the whole state at each evaluation
  (e.g. the rank of a low-rank global model), merged into the evaluation summary.

Most algorithms subclass :class:`Centralized`, which implements ``round`` as the paper-style
sample → broadcast → client update (vectorised) → aggregate → server update, from four smaller methods.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.engine.context import INIT, TRAIN, RoundContext
from fljax.models.model import Model, accuracy_stats, masked_cross_entropy

__all__ = ["Algorithm", "Centralized", "ClientResult", "TestStats"]


@flax.struct.dataclass
class ClientResult:
    """What one client's update returns: its new persistent ``state``, the ``upload`` it sends the server, its
    aggregation ``weight`` and scalar ``metrics``."""

    state: Any
    upload: Any
    weight: jax.Array
    metrics: dict


@flax.struct.dataclass
class TestStats:  # noqa: D101 (not a pytest class)
    __test__ = False
    correct: jax.Array
    count: jax.Array
    loss: jax.Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm:
    name: ClassVar[str] = "algorithm"
    summary: ClassVar[str] = ""
    generic: ClassVar[bool] = True  # runs on any classification data set (part of the default `fljax compare`)
    model: Model | None = dataclasses.field(default=None, repr=False)
    unroll: int = dataclasses.field(default=1, repr=False)

    def bind(self, model: Model, unroll: int = 1) -> "Algorithm":
        """The same algorithm attached to a model (and the scan unroll factor chosen for it)."""
        return dataclasses.replace(self, model=model, unroll=unroll)

    def validate(self, num_clients: int) -> None:
        """Refuse impossible hyperparameters with a one-line message (called before anything runs)."""

    def hyperparameters(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "unroll")}

    # ------------------------------------------------------------------------------------------ protocol
    def init(self, ctx: RoundContext):
        raise NotImplementedError

    def round(self, ctx: RoundContext, server, clients):
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_shared(self, server):
        """What every client's evaluation needs from the server (default: nothing)."""
        return None

    def global_params(self, shared):
        """The global model's parameters, or None when the algorithm has none."""
        return None

    def personal_params(self, shared, client_state, train, key):
        """Client i's personalized parameters, or None when they equal the global model's."""
        return None

    def logits(self, params, x):
        return self.model.apply(params, x)

    def eval_metrics(self, server, clients) -> dict:
        """Extra scalar metrics of the whole state, computed at every evaluation (traced under ``jit``) and merged
        into the evaluation summary, hence into every history record (default: none). Keys must not clash with
        the ``global_*`` / ``personal_*`` accuracy summaries."""
        return {}

    def test_stats(self, params, test) -> TestStats:
        logits = self.logits(params, test.x)
        correct, count = accuracy_stats(logits, test.y, test.mask)
        return TestStats(correct, count, masked_cross_entropy(logits, test.y, test.mask))

    def evaluate_client(self, shared, per_client) -> dict:
        """``per_client = (client_state, train, test, key)``; returns ``{"global": TestStats, "personal": ...}``
        (``global`` absent when there is no global model)."""
        client_state, train, test, key = per_client
        out = {}
        g = self.global_params(shared)
        if g is not None:
            out["global"] = self.test_stats(g, test)
        p = self.personal_params(shared, client_state, train, key)
        out["personal"] = self.test_stats(p, test) if p is not None else out["global"]
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Centralized(Algorithm):
    """Template for server-based algorithms.

    Hyperparameters: ``cohort_size`` (clients per round; None = full participation) and ``weighting``
    ('samples': aggregate with weights n_i; 'uniform'). Subclasses implement ``init``, ``broadcast``,
    ``client_update`` and ``server_update``; non-sampled clients' state is untouched.
    """

    cohort_size: int | None = 10
    weighting: str = "samples"

    def validate(self, num_clients: int) -> None:
        if self.cohort_size is not None and not 1 <= self.cohort_size <= num_clients:
            raise ValueError(f"cohort_size={self.cohort_size} must be between 1 and num_clients={num_clients} "
                             f"(or null for full participation).")
        if self.weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {self.weighting!r}.")

    def broadcast(self, server):
        """What the server sends to the cohort (default: the server pytree's ``params``)."""
        return server["params"]

    def client_update(self, shared, per_client) -> ClientResult:
        """``shared = (downlink, round)``; ``per_client = (client_state, train, key)``."""
        raise NotImplementedError

    def server_update(self, ctx: RoundContext, server, clients, cohort, result: ClientResult):
        """New server pytree from the cohort's stacked results (``clients`` is already updated)."""
        raise NotImplementedError

    def aggregation_weights(self, result: ClientResult):
        if self.weighting == "uniform":
            return jnp.ones_like(result.weight, dtype=jnp.float32)
        return result.weight.astype(jnp.float32)

    def comm_bytes(self, down, result: ClientResult, cohort_size: int) -> tuple:
        """(bytes up, bytes down) this round; default: every cohort member downloads ``down`` and uploads its
        ``upload`` densely (``result.upload`` is stacked over the cohort, so its size is already the total)."""
        return float(tree.nbytes(result.upload)), float(tree.nbytes(down) * cohort_size)

    def round(self, ctx: RoundContext, server, clients):
        cohort = ctx.sample_cohort(self.cohort_size)
        full = cohort.shape[0] == ctx.num_clients
        down = self.broadcast(server)
        per_client = (clients if full else tree.take_clients(clients, cohort),
                      ctx.data.train if full else ctx.data.train.take(cohort),
                      ctx.client_keys(cohort, TRAIN))
        result = ctx.map_clients(self.client_update, (down, ctx.round), per_client)
        clients = result.state if full else tree.put_clients(clients, cohort, result.state)
        server = self.server_update(ctx, server, clients, cohort, result)
        up, dn = self.comm_bytes(down, result, cohort.shape[0])
        metrics = {k: jnp.mean(v) for k, v in result.metrics.items()}
        metrics.update(bytes_up=jnp.float32(up), bytes_down=jnp.float32(dn))
        return server, clients, metrics

    def init_key(self, ctx: RoundContext):
        return ctx.stream(INIT)
