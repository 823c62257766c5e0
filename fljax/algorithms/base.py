"""The algorithm base class and the centralized templates.

An algorithm is a frozen dataclass whose fields are its hyperparameters and nothing else, each declared with
:func:`fljax.options.option` (default, one-line doc, check) and checked when the algorithm is constructed; settings
shared by several algorithms are values, not bases: its local training is a
:class:`~fljax.algorithms.local_training.LocalTraining` field (``local: LocalTraining = local_training(...)``), a
global model's server optimizer a :class:`~fljax.algorithms.server_optimizer.ServerOptimizer` field, each taking its
options flat under their own names (``algo.lr``, ``algo.server_lr``: :func:`fljax.options.nested`), so that
:meth:`Algorithm.hyperparameters` is flat and :meth:`Algorithm.with_values` replaces a hyperparameter by its flat
name. It is registered where it is defined (:func:`fljax.algorithms.registry.register`: its name, family, summary
and example config). Its methods are pure functions of pytrees. It implements the engine's contract (:class:`fljax.engine.protocol.FederatedAlgorithm`):
``init(ctx)``, ``round(ctx, server, clients)``, ``evaluate(ctx, server, clients)``, ``participants``, ``plan``,
``steps_per_round`` and ``validate``. The model a client runs arrives with its :class:`ClientInput` (``inp.model``)
and the server's with the :class:`~fljax.engine.context.RoundContext` (``ctx.model``).

Every client update has one contract, ``client_update(inp: ClientInput) -> ClientResult``. The templates differ
only in how the results are communicated: the cohort templates here send ``upload`` to a server —
:class:`Aggregating`'s reads them only through their aggregate (``server_step``), :class:`Centralized`'s reads the
cohort's stacked results (``server_update``), :class:`CohortTemplate`'s none (Local) —;
:class:`~fljax.algorithms.decentralized.Decentralized` gossips it to the neighbours. The templates are at most two
classes deep, so that an algorithm is at most four from :class:`Algorithm` (a test measures it): what several
algorithms share besides a template is a value (local training, the server optimizer) or a small mixin holding one
option and what reads it (:class:`Weighted`, :class:`~fljax.algorithms.model_state.BatchStatsOption`).

:meth:`Algorithm.evaluate` scores the global model (when there is one) and each client's personalized model on the
client's own test split: accuracy and loss per client, summarised by :func:`fljax.engine.evaluation.summarize`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.aggregation import AggregatorState, Keys, WithAggregator
from fljax.algorithms import model_state
from fljax.engine.cohort import COHORT_MODES, entry_ids, run_all, run_cohort
from fljax.data.federated import ClientArrays
from fljax.engine.context import ATTACK, EVAL, INIT, NOISE, SERVER, UPLOAD, RoundContext
from fljax.engine.evaluation import summarize
from fljax.engine.protocol import ClientInput, ClientResult
from fljax.errors import OptionError
from fljax.models.model import accuracy_stats, masked_cross_entropy
from fljax.models.sequence import token_stats, token_summary
from fljax.options import Options, at_least, flat_values, one_of, option, replace_flat
from fljax.participation import WithClock, Work

__all__ = ["Algorithm", "CohortTemplate", "Weighted", "Centralized", "Aggregating", "ClientInput", "ClientResult",
           "TestStats"]


@flax.struct.dataclass
class TestStats:  # noqa: D101 (not a pytest class)
    __test__ = False
    correct: jax.Array
    count: jax.Array
    loss: jax.Array
    tokens_correct: jax.Array | None = None  # token labels: correct and counted targets with specials (token_stats)
    tokens: jax.Array | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm(Options):
    """Every field is a hyperparameter declared with :func:`fljax.options.option` (default, one-line doc, value
    check); construction checks each value against its type and check, then :meth:`check` (checks across fields),
    raising :class:`~fljax.errors.OptionError` naming the field. :meth:`validate` holds only the checks that need the
    population (the number of clients). A copy made inside a compiled program (:meth:`with_values` with traced
    values, :meth:`fljax.engine.Simulation.algorithm_at`) is not checked again (:class:`~fljax.options.Options`).

    ``name``, ``summary``, ``family``, ``example`` and ``untuned`` are set by its registration
    (:func:`fljax.algorithms.registry.register`), the other class attributes by the algorithm or its template."""

    name: ClassVar[str] = "algorithm"
    summary: ClassVar[str] = ""
    family: ClassVar[str] = ""  # what it shares with the client, for people (fljax.algorithms.families)
    example: ClassVar[str | None] = None  # an example config that runs it (the built-ins': configs/<name>.yaml)
    untuned: ClassVar[tuple[str, str] | None] = None  # (key, note): a default that may not suit small problems
    # Its local training (a LocalTraining value), declared as a field by an algorithm that has one (``local:
    # LocalTraining = local_training(...)``, fljax.algorithms.local_training); None: its clients run a loop of their
    # own (QuPeD's epoch clock, Per-FedAvg's meta-steps, the consensus-regression solvers).
    local = None
    generic: ClassVar[bool] = True  # runs on any classification data set (part of the default `fljax compare`)
    problem: ClassVar[str] = "classification"  # the data it solves (experiment configs describe classification)

    supports_groups: ClassVar[bool] = True  # runs a population of client groups (fljax.engine.population)
    # groups may run architectures other than the global model's (False: every client trains the global model)
    mixed_architectures: ClassVar[bool] = False
    # its clients may train a model with BatchNorm or Dropout (fljax.algorithms.model_state.TrainsModelState)
    trains_model_state: ClassVar[bool] = False
    # example-level privacy (docs/privacy.md): a client touches its training data only through the local steps of
    # its batch plan (LocalTraining.train, fljax.algorithms.local_training.train_steps), so DP-SGD in every step makes
    # all it sends example-level private, accounted as plan().num_steps local steps per round
    private_steps: ClassVar[bool] = False
    # set by the Aggregating template (never by an algorithm): its server reads the uploads only through their
    # aggregate, so every aggregator of fljax.aggregation applies (robust rules, attacks, privacy, compression)
    reads_aggregate: ClassVar[bool] = False
    # set by the CohortTemplate (never by an algorithm): a participation draws its cohorts (fljax.participation)
    samples_cohorts: ClassVar[bool] = False
    # set by the asynchronous template (fljax.algorithms.asynchronous): it runs on the participation's virtual clock
    asynchronous: ClassVar[bool] = False

    def validate(self, num_clients: int) -> None:
        """Refuse hyperparameters impossible for ``num_clients`` clients with a one-line
        :class:`~fljax.errors.OptionError` naming the field (called before anything runs)."""

    def model_warning(self, model) -> str | None:
        """A caveat about training ``model`` with these hyperparameters (None: none), shown when a run starts (asked
        once the model is known, for the global model and each client group's)."""
        return None

    def hyperparameters(self) -> dict:
        """Every hyperparameter by its flat name (a value's options, e.g. the local training's ``lr``, under their
        own names): what ``resolved.yaml`` records and the runner keys its programs by."""
        return flat_values(self)

    def with_values(self, **values) -> "Algorithm":
        """This algorithm with hyperparameters replaced by flat name (``with_values(lr=0.05)`` replaces the local
        training's ``lr``); inside a compiled program the values are traced (a copy holding them is not checked
        again)."""
        return replace_flat(self, **values)

    def for_group(self, group) -> "Algorithm":
        """This algorithm with client group ``group``'s hyperparameter overrides (a
        :class:`~fljax.engine.population.ClientGroup`; None: no group)."""
        return self if group is None or not group.hp else self.with_values(**group.overrides)

    def group_algorithm(self, ctx: RoundContext, g: int | None) -> "Algorithm":
        """The algorithm group ``g`` of ``ctx``'s population runs (itself when g is None)."""
        return self if g is None else self.for_group(ctx.population.groups[g])

    def init_population(self, ctx: RoundContext):
        """``init`` over a population: the server from the whole context (the global model), each group's
        per-client state from its own context (its model, size and client ids), as a tuple."""
        server, clients = self.init(ctx)
        if ctx.population is None:
            return server, clients
        return server, tuple(self.group_algorithm(ctx, g).init(ctx.for_group(g))[1]
                             for g in range(len(ctx.population.groups)))

    # ------------------------------------------------------------------------------------------ protocol
    def init(self, ctx: RoundContext):
        raise NotImplementedError

    def round(self, ctx: RoundContext, server, clients):
        raise NotImplementedError

    def participants(self, num_clients: int) -> int:
        """Clients that train in a round (default: all)."""
        return num_clients

    def plan(self):
        """The batch plan of a client's local steps (default: its local training's, ``local``; none for an
        algorithm that holds none)."""
        return None if self.local is None else self.local.plan()

    def steps_per_round(self, n_max: int) -> int:
        """Local steps a participant runs per round (default: the batch plan's)."""
        plan = self.plan()
        return 0 if plan is None else plan.num_steps(n_max)

    def client_weights(self, train) -> list[float] | None:
        """Every client's aggregation weight p_k from its training data ``train`` (the population's arrays), as the
        server weighs its upload (what the privacy accountant's fixed denominator needs); None (the default): it
        aggregates no weighted uploads."""
        return None

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

    def personal_model(self, inp: ClientInput):
        """``(personal_params(inp), the model variables they are scored with)``: the client's own
        (``inp.variables``) unless personalizing trains them too (FedAvg-FT's fine-tuning of a BatchNorm model)."""
        return self.personal_params(inp), inp.variables

    def logits(self, model, params, x, variables=None):
        """The model's logits of ``x`` in evaluation mode (``variables``: its BatchNorm statistics)."""
        return model.apply(params, x, variables=variables)

    def eval_metrics(self, server, clients, values=None) -> dict:
        """Extra scalar metrics of the whole state, computed at every evaluation (traced under ``jit``) and merged
        into the evaluation summary, hence into every history record (default: none). Keys must not clash with
        the ``global_*`` / ``personal_*`` accuracy summaries. ``values``: every client's :meth:`client_values`
        ([N] arrays); ``clients``: every client's state, None when a client-state store keeps it
        (:mod:`fljax.engine.store`: it streams the values instead), so what reads the clients reads them through
        :meth:`client_values`."""
        return {}

    def client_values(self, state) -> dict:
        """Scalars of one client's state (no client axis) that :meth:`eval_metrics` summarises over every client,
        e.g. FedSLR's nnz(p_i) (default: none): computed client by client, so a client-state store streams them."""
        return {}

    def population_values(self, clients) -> dict:
        """:meth:`client_values` of every client of ``clients`` (the algorithm's own per-client state), as [N]
        arrays ({} when it has none)."""
        if type(self).client_values is Algorithm.client_values:
            return {}
        return jax.vmap(self.client_values)(model_state.unwrap(clients))

    def whole_population(self) -> str | None:
        """Why a round or an evaluation reads the state of clients outside the round's cohort (e.g. a server step
        that averages every client's dual), or None when it reads only the cohort's: what a client-state store,
        which holds only the cohorts' states on the device, must refuse (:mod:`fljax.engine.store`)."""
        return None

    def own_state(self, server, clients):
        """``(server, clients)`` without what the engine keeps beside the algorithm's own state (None stays
        None)."""
        return server, clients

    def test_stats(self, model, params, test, variables=None) -> TestStats:
        logits = self.logits(model, params, test.x, variables)
        correct, count = accuracy_stats(logits, test.y, test.mask)
        tokens = token_stats(logits, test.y, test.mask) if test.y.ndim > test.mask.ndim else (None, None)
        return TestStats(correct, count, masked_cross_entropy(logits, test.y, test.mask), *tokens)

    def evaluate_client(self, inp: ClientInput) -> dict:
        """``{"global": TestStats, "personal": TestStats}`` of one client (``global`` absent when there is no
        global model; it runs the global model's architecture, ``inp.global_model``), a model with BatchNorm
        scored with the variables ``inp.variables`` (:meth:`personal_model`'s for the personalized one). An entry
        ``"scalars"`` (a dict of per-client scalars) is averaged over the clients with a test split into the
        summary."""
        out = {}
        g = self.global_params(inp.down)
        if g is not None:
            out["global"] = self.test_stats(inp.global_model or inp.model, g, inp.test, inp.variables)
        p, variables = self.personal_model(inp)
        out["personal"] = self.test_stats(inp.model, p, inp.test, variables) if p is not None else out["global"]
        return out

    def evaluate(self, ctx: RoundContext, server, clients) -> tuple[dict, dict]:
        """(scalar summaries, per-client accuracy arrays) of the global and personalized models on every client's
        own test split (every group of a population with its own model), plus :meth:`eval_metrics`. With target
        clients (``data.num_target``) the ``global_*`` and ``personal_*`` summaries cover the training clients and
        ``target_global_*``, ``target_personal_*`` the target clients (their personalized model is the one
        :meth:`personal_params` adapts from the server's). An evaluation sample (``ctx.eval_ids``, the run's
        ``eval_clients``) scores only its clients, each as in an evaluation of every client, so every summary and
        the per-client arrays are over the sample; :meth:`eval_metrics` still sees the whole state.

        Two stages: :meth:`evaluation_stats`, client by client, and :meth:`evaluation_summary`, their reductions
        (a client-state store runs the first over chunks of clients and the second once)."""
        server, clients = self.own_state(server, clients)
        scored, states = ctx.evaluated(clients)
        stats = self.evaluation_stats(scored, server, states)
        return self.evaluation_summary(ctx, scored, server, clients, stats, self.population_values(clients))

    def evaluation_stats(self, scored: RoundContext, server, states) -> dict:
        """Every scored client's statistics (the clients of ``scored``, their states ``states``: the algorithm's
        own): ``{"global", "personal": TestStats, "scalars": {...}}`` (:meth:`evaluate_client`) and, under an attack
        that plants a trigger, ``"triggered"``: the same on the triggered test rows. Each client's entries depend
        only on its own state, data and id."""
        def evaluate_client(g):
            return model_state.client_fn(scored.model, self.group_algorithm(scored, g).evaluate_client, train=False)

        shared = model_state.attach(server, self.eval_shared(model_state.unwrap(server)))
        stats = run_all(scored, evaluate_client, shared, states, EVAL)
        attack = None if scored.aggregator is None else scored.aggregator.attack
        if attack is not None and attack.plants_trigger:
            def triggered(g):
                fn = evaluate_client(g)
                return lambda inp: fn(inp.replace(test=attack.triggered(inp.test)))

            hit = run_all(scored, triggered, shared, states, EVAL)
            hit.pop("scalars", None)
            stats["triggered"] = hit
        return stats

    def evaluation_summary(self, ctx: RoundContext, scored: RoundContext, server, clients, stats: dict,
                           values: dict) -> tuple[dict, dict]:
        """(summaries, per-client accuracies) from the scored clients' :meth:`evaluation_stats` ``stats``, with
        :meth:`eval_metrics` of the whole state (``clients``, None under a client-state store; ``values``: every
        client's :meth:`client_values`)."""
        stats = dict(stats)
        triggered = stats.pop("triggered", None)
        summary, per_client = {}, {}
        scalars = stats.pop("scalars", {})
        k = scored.num_train_clients
        for kind, s in stats.items():
            if k < scored.num_clients:
                summary.update(_summaries(jax.tree.map(lambda a: a[:k], s), kind))
                summary.update(_summaries(jax.tree.map(lambda a: a[k:], s), f"target_{kind}"))
            else:
                summary.update(_summaries(s, kind))
            per_client[f"{kind}_acc"] = s.correct / jnp.maximum(s.count.astype(jnp.float32), 1.0)
        valid = jnp.asarray(next(iter(stats.values())).count > 0, jnp.float32) if stats else None
        for name, v in scalars.items():
            summary[name] = jnp.sum(v * valid) / jnp.maximum(jnp.sum(valid), 1.0)
        extra = self.eval_metrics(model_state.unwrap(server), None if clients is None else model_state.unwrap(clients),
                                  values)
        clash = sorted(set(extra) & set(summary))
        if clash:
            raise ValueError(f"{type(self).__name__}.eval_metrics returns {clash}, which clash with the accuracy "
                             f"summaries; rename them.")
        summary.update(extra)
        attack = None if ctx.aggregator is None else ctx.aggregator.attack
        if attack is not None:
            summary.update(self._attacked(ctx, scored, stats, triggered, attack))
        return summary, per_client

    def _attacked(self, ctx, scored, stats, triggered, attack) -> dict:
        """Under an attack (robust spec): ``honest_{global,personal}_acc``, the mean accuracy of the honest clients
        (the malicious ones' own test splits left out: clean accuracy), and for an attack that plants a trigger
        (:meth:`fljax.aggregation.Attack.triggered`; ``triggered``: the scored clients' statistics on the triggered
        test rows) ``{global,personal}_asr``, its attack success rate: the share of the honest clients' triggered
        test rows whose true label is not the target that the model classifies as the target (pooled over those
        rows)."""
        from fljax.aggregation import malicious_mask

        malicious = malicious_mask(ctx.malicious_key, ctx.num_clients, attack.fraction)[jnp.asarray(scored.client_ids)]
        honest = ~malicious
        out = {f"honest_{kind}_acc": summarize(s.replace(count=jnp.where(honest, s.count, 0)), kind)[f"{kind}_acc"]
               for kind, s in stats.items()}
        for kind, s in (triggered or {}).items():
            hits, rows = jnp.sum(jnp.where(honest, s.correct, 0)), jnp.sum(jnp.where(honest, s.count, 0))
            out[f"{kind}_asr"] = hits / jnp.maximum(rows, 1)
        return out


def _summaries(stats: TestStats, prefix: str) -> dict:
    """The accuracy and loss summaries, and for token labels the accuracy with specials and the perplexity."""
    return {**summarize(stats, prefix), **token_summary(stats, prefix)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CohortTemplate(Algorithm):
    """Template for server-based algorithms (:class:`Aggregating`, a server that reads only the aggregate of its
    uploads, and :class:`Centralized`, one that reads the cohort's results, add the aggregation weights; this base
    serves the algorithms that aggregate nothing: Local, QuPeD's Local Training).

    Hyperparameters: ``cohort_size`` (clients per round; None = full participation) and ``cohort_mode`` (how the
    cohort runs, :mod:`fljax.engine.cohort`: 'gather' its clients, or compute every client and commit with a 'mask';
    equal up to float reassociation). Subclasses implement ``init``, ``broadcast``, ``client_update`` and
    ``server_update``; non-sampled clients' state is untouched. One round::

        S_t ← participation.draw();  down ← broadcast(server)
        result_i ← client_update(ClientInput(state_i, train_i, key_i, round, down))    every i ∈ S_t at once
        clients[S_t] ← result.state;  server ← server_update(server, result)

    Who takes part is the run's participation (``ctx.participation``, :mod:`fljax.participation`: uniform cohorts of
    ``cohort_size`` by default, Poisson ones with empty slots in a buffer, each client's step budget and virtual
    time); what the server makes of the uploads is :class:`Aggregating`'s.

    Over a population of client groups (:mod:`fljax.engine.population`) the cohort is drawn over all clients, each
    group runs its members with its own model and hyperparameters, and the server aggregates across groups.
    """

    samples_cohorts = True
    cohort_size: int | None = option(10, "clients per round (null: every client, full participation)", at_least(1))
    cohort_mode: str = option("gather", "how the cohort runs: 'gather' its clients, or compute every client and "
                                        "commit with a 'mask' (equal up to float reassociation)",
                              one_of(COHORT_MODES))

    def validate(self, num_clients: int) -> None:
        if self.cohort_size is not None and not 1 <= self.cohort_size <= num_clients:
            raise OptionError("cohort_size", f"must be between 1 and num_clients={num_clients} (or null for full "
                                             f"participation), got {self.cohort_size}.")

    def participants(self, num_clients: int) -> int:
        return num_clients if self.cohort_size is None else min(self.cohort_size, num_clients)

    def client_weights(self, train) -> list[float]:
        """Every client's aggregation weight p_k (what :meth:`aggregation_weights` gives its results): n_k."""
        return [float(c) for c in np.asarray(train.count)]

    def init_population(self, ctx: RoundContext):
        server, clients = super().init_population(ctx)
        aggregator = ctx.aggregator
        if aggregator is not None and aggregator.has_state:
            upload = model_state.unwrap(self.upload_reference(self.broadcast(model_state.unwrap(server))))
            state = aggregator.init(upload, ctx.num_clients)
            server, clients = WithAggregator(server, state.server), WithAggregator(clients, state.clients)
        if ctx.participation is not None and ctx.participation.clocked:  # the virtual clock starts at 0 s
            server = WithClock(server, jnp.float32(0))
        return server, clients

    def own_state(self, server, clients):
        """Without the virtual clock (:class:`WithClock`) and the aggregator's state
        (:class:`~fljax.aggregation.WithAggregator`)."""
        if isinstance(server, WithClock):
            server = server.state
        if isinstance(server, WithAggregator):
            server, clients = server.state, None if clients is None else clients.state
        return server, clients

    def broadcast(self, server):
        """What the server sends to the cohort (default: the server pytree's ``params``)."""
        return server["params"]

    def upload_reference(self, down):
        """The model a client's upload is trained from, shaped like the upload (default: what the server sent,
        ``down``): the w_t of its delta Δ_i = u_i − w_t."""
        return down

    def client_update(self, inp: ClientInput) -> ClientResult:
        raise NotImplementedError

    def server_update(self, ctx: RoundContext, server, clients, cohort, result: ClientResult):
        """New server pytree from the cohort's stacked results (``clients`` is already updated)."""
        raise NotImplementedError

    def server_round(self, ctx: RoundContext, server, clients, cohort, valid, result: ClientResult, state, down):
        """``(new server, aggregator state, metrics)`` from the cohort's stacked results: :meth:`server_update`
        here (:class:`Aggregating` aggregates first)."""
        return self.server_update(ctx, server, clients, cohort, result), state, {}

    def aggregation_weights(self, result: ClientResult):
        """Per-entry aggregation weights n_i (zero for the entries of unsampled clients, ``result.valid``), in the
        uploads' floating dtype (float64 in a float64 run: the 1/K of a mean is then float64's)."""
        return result.weight.astype(tree.float_dtype(result.upload))

    def comm_bytes(self, down, result: ClientResult, cohort_size) -> tuple:
        """(bytes up, bytes down) this round; default: every cohort member (``cohort_size``, traced under a
        participation with empty slots) downloads ``down`` and uploads its ``upload`` densely."""
        leaves = jax.tree.leaves(result.upload)
        per_client = tree.nbytes(result.upload) / leaves[0].shape[0] if leaves else 0.0
        return per_client * cohort_size, tree.nbytes(down) * cohort_size

    def client_bytes(self, ctx: RoundContext, down) -> float:
        """What one cohort member downloads and uploads in a round (bytes), as the virtual clock charges it: the
        broadcast ``down`` and one upload shaped like :meth:`upload_reference` (the encoder's count when uploads are
        compressed), what :meth:`comm_bytes` counts for the algorithms that keep its default."""
        one = model_state.unwrap(self.upload_reference(model_state.unwrap(down)))
        encoder = None if ctx.aggregator is None else ctx.aggregator.uploads
        return float(tree.nbytes(down)) + float(tree.nbytes(one) if encoder is None else encoder.bytes_up(one))

    def bytes_per_client(self, ctx: RoundContext, server) -> float:
        """:meth:`client_bytes` of the broadcast of ``server`` (the state's server, as :meth:`round` receives it;
        shapes suffice)."""
        if isinstance(server, WithClock):
            server = server.state
        if isinstance(server, WithAggregator):
            server = server.state
        return self.client_bytes(ctx, model_state.attach(server, self.broadcast(model_state.unwrap(server))))

    def round(self, ctx: RoundContext, server, clients):
        now = None
        if isinstance(server, WithClock):
            server, now = server.state, server.now
        state = None
        if isinstance(server, WithAggregator):
            state = AggregatorState(server.aggregator, clients.aggregator)
            server, clients = server.state, clients.state
        before = (server, clients, state)
        participation = ctx.participation
        if participation.system:  # systems heterogeneity: the round's work, times and drops (fljax.participation)
            down = model_state.attach(server, self.broadcast(model_state.unwrap(server)))
            work = Work.of(self.plan(), ctx.data.train, self.client_bytes(ctx, down), 0.0 if now is None else now)
            draw = participation.draw(ctx, self.cohort_size, work)
        else:  # a client-state store draws a block's cohorts ahead (RoundContext.cohort)
            draw = ctx.cohort if ctx.cohort is not None else participation.draw(ctx, self.cohort_size)
            down = model_state.attach(server, self.broadcast(model_state.unwrap(server)))
        cohort, valid = draw.ids, draw.valid

        def update(g):
            return model_state.client_fn(ctx.model, self.group_algorithm(ctx, g).client_update, train=True)

        clients, result = run_cohort(ctx, update, down, clients, cohort, self.cohort_mode, valid, steps=draw.steps)
        own_result = result.replace(upload=model_state.unwrap(result.upload))
        own, state, metrics = self.server_round(ctx, model_state.unwrap(server), model_state.unwrap(clients), cohort,
                                                valid, own_result, state, model_state.unwrap(down))
        server = model_state.aggregate(server, own, result, self.aggregation_weights(result))
        senders = cohort.shape[0] if valid is None else jnp.sum(valid).astype(jnp.float32)
        encoder = None if ctx.aggregator is None else ctx.aggregator.uploads
        if encoder is None:
            up, dn = self.comm_bytes(down, result, senders)
        else:  # what is sent: the encoder's bytes of one upload, by every participant
            one = jax.tree.map(lambda a: a[0], own_result.upload)
            up, dn = encoder.bytes_up(one) * senders, tree.nbytes(down) * senders
        if participation.system:  # every selected client downloaded the model, reporting or not
            per_client = jnp.where(senders > 0, dn / jnp.maximum(senders, 1.0), float(tree.nbytes(down)))
            dn = per_client * draw.metrics["clients_selected"]
        if result.valid is None:
            client_metrics = {k: jnp.mean(v) for k, v in result.metrics.items()}
        else:
            w = result.valid.astype(jnp.float32)
            client_metrics = {k: jnp.sum(v * w) / jnp.maximum(jnp.sum(w), 1.0) for k, v in result.metrics.items()}
        metrics = {**client_metrics, "bytes_up": jnp.float32(up), "bytes_down": jnp.float32(dn), **metrics}
        if participation.system:  # H4: a round in which nobody reported leaves every state as it was
            reported = draw.metrics["round_skipped"] == 0
            server, clients, state = tree.where(reported, (server, clients, state), before)
            metrics.update(draw.metrics)
        if state is not None:
            server, clients = WithAggregator(server, state.server), WithAggregator(clients, state.clients)
        if now is not None:
            server = WithClock(server, now + draw.duration)
        return server, clients, metrics


@dataclasses.dataclass(frozen=True, kw_only=True)
class Weighted:
    """The aggregation weights of an algorithm whose server aggregates its cohort's uploads (mixed into
    :class:`Centralized` and :class:`Aggregating`): ``weighting`` 'samples' (p_i ∝ n_i) or 'uniform'."""

    weighting: str = option("samples", "aggregation weights: 'samples' (n_i) or 'uniform'",
                            one_of(("samples", "uniform")))

    def client_weights(self, train) -> list[float]:
        """Every client's aggregation weight p_k: n_k, or 1 with ``weighting='uniform'``."""
        return [1.0] * train.num_clients if self.weighting == "uniform" else super().client_weights(train)

    def aggregation_weights(self, result: ClientResult):
        """Per-entry aggregation weights: n_i, or 1 with ``weighting='uniform'`` (zero for the entries of unsampled
        clients, ``result.valid``)."""
        if self.weighting == "uniform":
            ones = jnp.ones_like(result.weight, dtype=tree.float_dtype(result.upload))
            return ones if result.valid is None else ones * result.valid
        return super().aggregation_weights(result)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Centralized(Weighted, CohortTemplate):
    """The template of the algorithms whose server reads the cohort's stacked results (:class:`CohortTemplate`'s
    round and ``server_update``), weighted by ``weighting`` (:class:`Weighted`): SCAFFOLD, FedDyn, FedSLR, FedNova,
    AugFL."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Aggregating(Weighted, CohortTemplate):
    """The template of the algorithms whose server reads its cohort's uploads only through their aggregate: each
    upload u_i is a model trained from what the server sent (its :meth:`upload_reference` w_t), and the server steps
    from A_t, the run's aggregator of the uploads (:class:`fljax.aggregation.Aggregator`: the weighted mean
    Σ p_i u_i / Σ p_i by default; a robust rule, the malicious clients' attack, clipping, compression and privacy
    noise apply to every such algorithm with no code of its own). Subclasses implement :meth:`server_step`."""

    reads_aggregate = True

    def server_step(self, ctx: RoundContext, server, aggregate):
        """The new server pytree from the aggregate A_t of the cohort's uploads."""
        raise NotImplementedError

    def server_round(self, ctx, server, clients, cohort, valid, result, state, down):
        aggregator, ids, keys, root = ctx.aggregator, None, None, None
        weights = self.aggregation_weights(result)
        if aggregator.client_weights is not None:  # a hypergradient's per-client multipliers p_i·s_i
            ids = entry_ids(ctx, cohort, self.cohort_mode, valid)
            weights = weights * aggregator.client_weights[jnp.minimum(ids, ctx.num_clients - 1)].astype(weights.dtype)
        if not aggregator.is_default:
            ids = entry_ids(ctx, cohort, self.cohort_mode, valid)
            safe = jnp.minimum(ids, ctx.num_clients - 1)
            keys = Keys(server=ctx.stream(NOISE), clients=ctx.client_keys(safe, UPLOAD), attack=ctx.stream(ATTACK),
                        attack_clients=ctx.client_keys(safe, ATTACK), malicious=ctx.malicious_key)
        reference = self.upload_reference(down)
        if aggregator.rule.needs_root:
            root = tree.sub(self.root_update(ctx, clients, down), reference)
        aggregate, state, metrics = aggregator.apply(result.upload, weights, result.valid, ids, state, reference, keys,
                                                     ctx.num_clients, root, None if ids is None else ctx.rows(ids))
        return self.server_step(ctx, server, aggregate), state, metrics

    def root_update(self, ctx: RoundContext, clients, down):
        """FLTrust's server model update (Cao et al. 2021, Algorithm 1, ModelUpdate): the upload a client holding the
        server's root set (``ctx.server``) would send from ``down``, by this algorithm's own client update, with a
        fresh client's state (zeros shaped like a client's) and the server's stream of keys."""
        root = ctx.server
        n = root.y.shape[0]
        train = ClientArrays(x=root.x, y=root.y, mask=jnp.ones((n,), bool), count=jnp.int32(n), n_min=n, n_max=n)
        state = jax.tree.map(lambda a: jnp.zeros(a.shape[1:], a.dtype), clients)
        inp = ClientInput(state=state, train=train, key=ctx.stream(SERVER), round=ctx.round, down=down,
                          model=ctx.model, unroll=ctx.unroll, global_model=ctx.server_model)
        return self.client_update(inp).upload
