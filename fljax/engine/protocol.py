"""What the engine needs from an algorithm, stated once.

The engine (:class:`fljax.engine.Simulation`, the drivers and the executors) talks to an algorithm only through
:class:`FederatedAlgorithm`. Hyperparameters live on the algorithm object; the model, the executor, the data and the
round's key reach it through the :class:`~fljax.engine.context.RoundContext` (server side) and the
:class:`ClientInput` (client side), so an algorithm is plain data plus pure functions.

A client's update receives a :class:`ClientInput` and returns a :class:`ClientResult`, whatever the template:
centralized algorithms send ``upload`` to the server (weighted mean), decentralized ones to their neighbours
(gossip).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import flax.struct
import jax

if TYPE_CHECKING:
    from fljax.data.batching import BatchPlan
    from fljax.engine.context import RoundContext

__all__ = ["FederatedAlgorithm", "ClientInput", "ClientResult"]


@flax.struct.dataclass
class ClientInput:
    """Everything one client has in a round (no client axis):

    * ``state`` — its persistent state (its slice of ``State.clients``);
    * ``train`` — its train split (:class:`fljax.data.ClientArrays` of one client); ``test`` at evaluation;
    * ``key`` — its key this round, ``fold_in(fold_in(round key, tag), client id)``;
    * ``round`` — the round index (traced);
    * ``down`` — what the server sent it this round (None when there is no server);
    * ``clock_key`` — its round-independent key ``fold_in(fold_in(run key, CLOCK), client id)`` (schedules that span
      rounds: the epoch clock's batches);
    * ``model`` — the model it runs (static; its group's in a heterogeneous population); ``global_model`` — the model
      of the server's global parameters (static; ``model`` unless a population's group runs another architecture);
      ``unroll`` — the unroll factor of its local-step loops (static); ``privacy`` — the DP-SGD its local steps take
      (a :class:`fljax.privacy.ExamplePrivacy`, static; None: plain gradients).
    """

    state: Any
    train: Any
    key: jax.Array
    round: jax.Array
    down: Any = None
    test: Any = None
    clock_key: Any = None
    model: Any = flax.struct.field(pytree_node=False, default=None)
    unroll: int = flax.struct.field(pytree_node=False, default=1)
    global_model: Any = flax.struct.field(pytree_node=False, default=None)
    privacy: Any = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class ClientResult:
    """What one client's update returns: its new persistent ``state``, the ``upload`` it communicates (to the server
    or to its neighbours), its aggregation ``weight`` and scalar ``metrics``. Stacked over clients by the engine,
    ``valid`` marks the entries of clients that were sampled (None: all were; see :mod:`fljax.engine.cohort`, whose
    invalid entries carry a zero weight and a zero upload)."""

    state: Any
    upload: Any
    weight: jax.Array
    metrics: dict
    valid: Any = None


@runtime_checkable
class FederatedAlgorithm(Protocol):
    """The engine's contract with an algorithm (implemented by :class:`fljax.algorithms.Algorithm` and its
    templates).

    * ``validate(num_clients)`` refuses impossible hyperparameters (one line, before anything runs);
      ``model_warning(model)``: a caveat about training ``model`` with them (None: none), shown when a run starts;
    * ``init(ctx) -> (server, clients)``: the initial server pytree (or None) and the per-client pytree (leading
      axis ``num_clients``); ``init_population(ctx)``: the same over ``ctx.population``'s client groups (a tuple of
      per-group client pytrees; ``init(ctx)`` when there is no population);
    * ``round(ctx, server, clients) -> (server, clients, metrics)``: one round, traced inside ``jit`` (eagerly under
      the loop executor); ``metrics`` is a dict of scalars with ``train_loss``, ``bytes_up``, ``bytes_down``;
    * ``evaluate(ctx, server, clients) -> (summary, per_client)``: scalar summaries and per-client arrays;
    * ``participants(num_clients)``: clients that train in a round (the cohort);
    * ``plan()``: the batch plan of a client's local steps (None: no minibatch steps);
    * ``steps_per_round(n_max)``: local steps one participant runs per round.
    """

    def validate(self, num_clients: int) -> None: ...

    def model_warning(self, model: Any) -> str | None: ...

    def init(self, ctx: "RoundContext") -> tuple[Any, Any]: ...

    def init_population(self, ctx: "RoundContext") -> tuple[Any, Any]: ...

    def round(self, ctx: "RoundContext", server: Any, clients: Any) -> tuple[Any, Any, dict]: ...

    def evaluate(self, ctx: "RoundContext", server: Any, clients: Any) -> tuple[dict, dict]: ...

    def participants(self, num_clients: int) -> int: ...

    def plan(self) -> "BatchPlan | None": ...

    def steps_per_round(self, n_max: int) -> int: ...
