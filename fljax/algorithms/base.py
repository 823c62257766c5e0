"""The algorithm base class and the centralized template.

An algorithm is a frozen dataclass whose fields are its hyperparameters and nothing else; its methods are pure
functions of pytrees. It implements the engine's contract (:class:`fljax.engine.protocol.FederatedAlgorithm`):
``init(ctx)``, ``round(ctx, server, clients)``, ``evaluate(ctx, server, clients)``, ``participants``, ``plan``,
``steps_per_round`` and ``validate``. The model a client runs arrives with its :class:`ClientInput` (``inp.model``)
and the server's with the :class:`~fljax.engine.context.RoundContext` (``ctx.model``).

Every client update has one contract, ``client_update(inp: ClientInput) -> ClientResult``. The two templates differ
only in how the results are communicated: :class:`Centralized` (here) sends ``upload`` to a server, which aggregates
(``server_update``); :class:`~fljax.algorithms.decentralized.Decentralized` gossips it to the neighbours.

:meth:`Algorithm.evaluate` scores the global model (when there is one) and each client's personalized model on the
client's own test split: accuracy and loss per client, summarised by :func:`fljax.engine.evaluation.summarize`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.engine.context import EVAL, INIT, TRAIN, RoundContext
from fljax.engine.evaluation import summarize
from fljax.engine.protocol import ClientInput, ClientResult
from fljax.errors import OptionError
from fljax.models.model import accuracy_stats, masked_cross_entropy

__all__ = ["Algorithm", "Centralized", "ClientInput", "ClientResult", "TestStats"]


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
    problem: ClassVar[str] = "classification"  # the data it solves (experiment configs describe classification)

    def validate(self, num_clients: int) -> None:
        """Refuse impossible hyperparameters with a one-line :class:`~fljax.errors.OptionError` naming the field
        (called before anything runs)."""

    def hyperparameters(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # ------------------------------------------------------------------------------------------ protocol
    def init(self, ctx: RoundContext):
        raise NotImplementedError

    def round(self, ctx: RoundContext, server, clients):
        raise NotImplementedError

    def participants(self, num_clients: int) -> int:
        """Clients that train in a round (default: all)."""
        return num_clients

    def plan(self):
        """The batch plan of a client's local steps (default: none)."""
        return None

    def steps_per_round(self, n_max: int) -> int:
        """Local steps a participant runs per round (default: the batch plan's)."""
        plan = self.plan()
        return 0 if plan is None else plan.num_steps(n_max)

    def init_key(self, ctx: RoundContext):
        return ctx.stream(INIT)

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_shared(self, server):
        """What every client's evaluation needs from the server (default: nothing)."""
        return None

    def global_params(self, shared):
        """The global model's parameters, or None when the algorithm has none."""
        return None

    def personal_params(self, inp: ClientInput):
        """Client i's personalized parameters (``inp.down`` is :meth:`eval_shared`), or None when they equal the
        global model's."""
        return None

    def logits(self, model, params, x):
        return model.apply(params, x)

    def eval_metrics(self, server, clients) -> dict:
        """Extra scalar metrics of the whole state, computed at every evaluation (traced under ``jit``) and merged
        into the evaluation summary, hence into every history record (default: none). Keys must not clash with
        the ``global_*`` / ``personal_*`` accuracy summaries."""
        return {}

    def test_stats(self, model, params, test) -> TestStats:
        logits = self.logits(model, params, test.x)
        correct, count = accuracy_stats(logits, test.y, test.mask)
        return TestStats(correct, count, masked_cross_entropy(logits, test.y, test.mask))

    def evaluate_client(self, inp: ClientInput) -> dict:
        """``{"global": TestStats, "personal": TestStats}`` of one client (``global`` absent when there is no
        global model)."""
        out = {}
        g = self.global_params(inp.down)
        if g is not None:
            out["global"] = self.test_stats(inp.model, g, inp.test)
        p = self.personal_params(inp)
        out["personal"] = self.test_stats(inp.model, p, inp.test) if p is not None else out["global"]
        return out

    def evaluate(self, ctx: RoundContext, server, clients) -> tuple[dict, dict]:
        """(scalar summaries, per-client accuracy arrays) of the global and personalized models on every client's
        own test split, plus :meth:`eval_metrics`."""
        data = ctx.data
        keys = ctx.client_keys(jnp.arange(data.num_clients), EVAL)
        stats = ctx.run_clients(self.evaluate_client, self.eval_shared(server), clients, data.train, keys, data.test)
        summary, per_client = {}, {}
        for kind, s in stats.items():
            summary.update(summarize(s, kind))
            per_client[f"{kind}_acc"] = s.correct / jnp.maximum(s.count.astype(jnp.float32), 1.0)
        extra = self.eval_metrics(server, clients)
        clash = sorted(set(extra) & set(summary))
        if clash:
            raise ValueError(f"{type(self).__name__}.eval_metrics returns {clash}, which clash with the accuracy "
                             f"summaries; rename them.")
        summary.update(extra)
        return summary, per_client


def check_choice(key: str, value, choices) -> None:
    """Refuse ``value`` for option ``key`` unless it is one of ``choices`` (one line, naming the choices)."""
    if value not in choices:
        raise OptionError(key, f"must be one of {list(choices)}, got {value!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Centralized(Algorithm):
    """Template for server-based algorithms.

    Hyperparameters: ``cohort_size`` (clients per round; None = full participation) and ``weighting``
    ('samples': aggregate with weights n_i; 'uniform'). Subclasses implement ``init``, ``broadcast``,
    ``client_update`` and ``server_update``; non-sampled clients' state is untouched. One round::

        S_t ← cohort;  down ← broadcast(server)
        result_i ← client_update(ClientInput(state_i, train_i, key_i, round, down))    every i ∈ S_t at once
        clients[S_t] ← result.state;  server ← server_update(server, result)           (weighted mean of uploads)
    """

    cohort_size: int | None = 10
    weighting: str = "samples"

    def validate(self, num_clients: int) -> None:
        if self.cohort_size is not None and not 1 <= self.cohort_size <= num_clients:
            raise OptionError("cohort_size", f"must be between 1 and num_clients={num_clients} (or null for full "
                                             f"participation), got {self.cohort_size}.")
        check_choice("weighting", self.weighting, ("samples", "uniform"))

    def participants(self, num_clients: int) -> int:
        return num_clients if self.cohort_size is None else min(self.cohort_size, num_clients)

    def broadcast(self, server):
        """What the server sends to the cohort (default: the server pytree's ``params``)."""
        return server["params"]

    def client_update(self, inp: ClientInput) -> ClientResult:
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
        result = ctx.run_clients(self.client_update, down,
                                 clients if full else tree.take_clients(clients, cohort),
                                 ctx.data.train if full else ctx.data.train.take(cohort),
                                 ctx.client_keys(cohort, TRAIN))
        clients = result.state if full else tree.put_clients(clients, cohort, result.state)
        server = self.server_update(ctx, server, clients, cohort, result)
        up, dn = self.comm_bytes(down, result, cohort.shape[0])
        metrics = {k: jnp.mean(v) for k, v in result.metrics.items()}
        metrics.update(bytes_up=jnp.float32(up), bytes_down=jnp.float32(dn))
        return server, clients, metrics
