"""What the engine needs from an algorithm and from the clients' data, stated once.

The engine (:class:`fljax.engine.Simulation`, the drivers and the executors) and the runner talk to an algorithm only
through :class:`FederatedAlgorithm`, which states every attribute and method they read, and read the clients' data
only through :class:`SimulationData`. Hyperparameters live on the algorithm object; the model, the executor, the
data and the round's key reach it through the :class:`~fljax.engine.context.RoundContext` (server side) and the
:class:`ClientInput` (client side), so an algorithm is plain data plus pure functions.

A client's update receives a :class:`ClientInput` and returns a :class:`ClientResult`, whatever the template:
centralized algorithms send ``upload`` to the server (weighted mean), decentralized ones to their neighbours
(gossip).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import flax.struct
import jax

if TYPE_CHECKING:
    from fljax.data.batching import BatchPlan
    from fljax.engine.context import RoundContext

__all__ = ["FederatedAlgorithm", "SimulationData", "ClientInput", "ClientResult"]


class SimulationData(Protocol):
    """What the engine reads of the clients' data, whatever its kind — :class:`fljax.data.FederatedData` (labelled
    examples with train and test splits), the consensus-regression clients of :mod:`fljax.problems`, one's own
    pytree — every array of which has a leading client axis; the algorithm reads the rest. The data layer states
    these of itself and imports nothing of the engine.

    * ``num_clients``: every client; ``num_train_clients``: those that may train, ids ``0 … num_train_clients − 1``
      (the others are a meta-learning split's target clients, which never train and are evaluated apart);
    * ``server``: the server's own data and frozen models (None: none);
    * ``group_sizes``: (name, number of clients) of each group of consecutive clients whose arrays have shapes of
      their own (FedGiA's size classes; :meth:`fljax.engine.population.Population.of_sizes` makes their population),
      and then ``group(g)``, group g's data, what the group's :class:`~fljax.engine.context.RoundContext` holds
      (itself client data); None: the clients' arrays are stacked, one population;
    * ``stacked``: every client's arrays stacked along one leading axis (padded), which model groups slice;
    * ``labelled``: examples with labels that a model learns (the clients run a model; an evaluation may score a
      fixed sample of the clients; the train split's ``n_max`` sizes the local steps);
    * ``client_nbytes()``: the bytes of one client's local data (what sizes a chunk of clients).
    """

    @property
    def num_clients(self) -> int: ...

    @property
    def num_train_clients(self) -> int: ...

    @property
    def server(self) -> Any: ...

    @property
    def group_sizes(self) -> tuple[tuple[str, int], ...] | None: ...

    @property
    def stacked(self) -> bool: ...

    @property
    def labelled(self) -> bool: ...

    def client_nbytes(self) -> int: ...


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
      (a :class:`fljax.privacy.ExamplePrivacy`, static; None: plain gradients);
    * ``variables`` — the non-parameter variables of its model (``{"batch_stats": ...}``; ``{}`` for a
      Dropout-only model), None for a model without BatchNorm or Dropout
      (:func:`fljax.algorithms.model_state.client_fn` places them).
    * ``id`` — its client id (None where the caller passes none): what the server broadcasts about individual
      clients is indexed by it (FedGiA's selection ``down.selected[inp.id]``).
    * ``steps`` — the local steps it completes this round (traced int32; None: its whole batch plan): a straggler's
      budget drawn by the run's participation (:mod:`fljax.participation`), which the round's local training honours
      (:meth:`fljax.algorithms.local_training.LocalTraining.train`: the steps past it leave the model unchanged).
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
    variables: Any = None
    id: Any = None
    privacy: Any = flax.struct.field(pytree_node=False, default=None)
    steps: Any = None


@flax.struct.dataclass
class ClientResult:
    """What one client's update returns: its new persistent ``state``, the ``upload`` it communicates (to the server
    or to its neighbours), its aggregation ``weight`` and scalar ``metrics``; ``variables``: its model's variables
    after training (an update that trains a model with BatchNorm or Dropout returns them; None: unchanged), which
    :func:`fljax.algorithms.model_state.client_fn` moves where they live. Stacked over clients by the engine,
    ``valid`` marks the entries of clients that were sampled (None: all were; see :mod:`fljax.engine.cohort`, whose
    invalid entries carry a zero weight and a zero upload)."""

    state: Any
    upload: Any
    weight: jax.Array
    metrics: dict
    valid: Any = None
    variables: Any = None


@runtime_checkable
class FederatedAlgorithm(Protocol):
    """The contract of an algorithm with the engine and the runner: everything they read from one, and nothing else
    (implemented by :class:`fljax.algorithms.Algorithm` and its templates). An algorithm is a frozen dataclass whose
    fields are its hyperparameters: the engine traces a grid of their values with ``dataclasses.replace``
    (:meth:`fljax.engine.Simulation.algorithm_at`), the runner's planning reads them by name.

    What it is (class attributes):

    * ``name``: its registry name, in messages; ``summary``: one line, shown when a run starts and by
      ``fljax list``;
    * ``problem``: the data it solves ('classification': an experiment config can describe it); ``generic``: it runs
      on any classification data set (part of the default ``fljax compare``);
    * ``supports_groups``: it runs a population of client groups (:mod:`fljax.engine.population`);
      ``mixed_architectures``: a group may run another architecture than the global model's;
      ``trains_model_state``: its clients may train a model with BatchNorm or Dropout (the model's variables arrive
      in :attr:`ClientInput.variables` and leave in :attr:`ClientResult.variables`);
    * ``reads_aggregate``: its server reads the uploads only through their aggregate (set by the
      :class:`fljax.algorithms.base.Aggregating` template: every aggregator of :mod:`fljax.aggregation` applies,
      robust rules, attacks, client-level privacy and compressed uploads included); ``samples_cohorts``: a
      participation draws its cohorts (set by the cohort template; :mod:`fljax.participation`); ``asynchronous``: it
      runs on the participation's virtual clock, one server step a round (set by the asynchronous template,
      :mod:`fljax.algorithms.asynchronous`);
      ``private_steps``: its clients touch their training data only through the local steps of its batch plan
      (example-level privacy applies: DP-SGD in every step).

    What it does:

    * ``validate(num_clients)`` refuses impossible hyperparameters (one line, before anything runs);
      ``model_warning(model)``: a caveat about training ``model`` with them (None: none), shown when a run starts;
    * ``hyperparameters()``: its hyperparameters by name (what ``resolved.yaml`` records);
      ``for_group(group)``: the algorithm a client group runs (its hyperparameter overrides applied);
    * ``init(ctx) -> (server, clients)``: the initial server pytree (or None) and the per-client pytree (leading
      axis ``num_clients``); ``init_population(ctx)``: the same over ``ctx.population``'s client groups (a tuple of
      per-group client pytrees; ``init(ctx)`` when there is no population);
    * ``round(ctx, server, clients) -> (server, clients, metrics)``: one round, traced inside ``jit`` (eagerly under
      the loop executor); ``metrics`` is a dict of scalars with ``train_loss``, ``bytes_up``, ``bytes_down``;
    * ``evaluate(ctx, server, clients) -> (summary, per_client)``: scalar summaries and per-client arrays;
    * ``participants(num_clients)``: clients that train in a round (the cohort; under Poisson sampling its expected
      size); ``client_weights(train)``: every client's aggregation weight from its training data (the
      population's ``ClientArrays``/``RaggedArrays``; None: it aggregates no weighted uploads);
    * ``plan()``: the batch plan of a client's local steps (None: no minibatch steps);
    * ``steps_per_round(n_max)``: local steps one participant runs per round.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    problem: ClassVar[str]
    generic: ClassVar[bool]
    supports_groups: ClassVar[bool]
    mixed_architectures: ClassVar[bool]
    trains_model_state: ClassVar[bool]
    reads_aggregate: ClassVar[bool]
    samples_cohorts: ClassVar[bool]
    asynchronous: ClassVar[bool]
    private_steps: ClassVar[bool]

    def validate(self, num_clients: int) -> None: ...

    def model_warning(self, model: Any) -> str | None: ...

    def hyperparameters(self) -> dict: ...

    def for_group(self, group: Any) -> "FederatedAlgorithm": ...

    def init(self, ctx: "RoundContext") -> tuple[Any, Any]: ...

    def init_population(self, ctx: "RoundContext") -> tuple[Any, Any]: ...

    def round(self, ctx: "RoundContext", server: Any, clients: Any) -> tuple[Any, Any, dict]: ...

    def evaluate(self, ctx: "RoundContext", server: Any, clients: Any) -> tuple[dict, dict]: ...

    def participants(self, num_clients: int) -> int: ...

    def client_weights(self, train: Any) -> list[float] | None: ...

    def plan(self) -> "BatchPlan | None": ...

    def steps_per_round(self, n_max: int) -> int: ...
