"""The round driver: one jitted program per round, ``lax.scan`` over blocks of rounds between evaluations.

:class:`Simulation` binds an algorithm, a model and federated data to an executor. ``round(state)`` runs one round;
``run_rounds(state, n)`` runs n rounds as one compiled ``lax.scan`` (metrics stay on device inside the block);
``evaluate(state)`` scores every client (or a fixed sample of them, ``eval_clients``); ``run(rounds, eval_every)``
alternates the two and reports progress. Under the loop executor rounds run eagerly in Python, one jitted per-client
call at a time (the reference).

Those methods run programs built from the simulation's pure functions, which are public for the drivers that build
programs of their own (lanes, :mod:`fljax.engine.lanes`; the stopping-rule loop, :mod:`fljax.engine.stopping`; the
runner's check of traceable hyperparameters, :mod:`fljax.runner.plan`): :meth:`Simulation.init_fn`,
:meth:`Simulation.round_fn`, :meth:`Simulation.block_fn` and :meth:`Simulation.evaluate_fn` (functions of the state,
the data and the traced hyperparameters only), and :meth:`Simulation.compiled`, the compile cache every program
goes through.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from fljax import tree
from fljax.engine import blas, budget, compile_cache, compile_clock, compile_pool, processes, sampling, store
from fljax.engine.sampling import check_sample
from fljax.engine.context import RoundContext
from fljax.engine.executors import Executor, choose_executor, make_executor
from fljax.engine.loop import NonFiniteError, NonFiniteGuard, RunLog, block_capacity, drive, wait_compiling
from fljax.engine.population import Population, check_groups
from fljax.engine.protocol import FederatedAlgorithm
from fljax.engine.state import State
from fljax.models import conv_table
from fljax.errors import OptionError
from fljax.models.model import PRECISIONS, Model, precision_scope

__all__ = ["Simulation", "RunResult"]


# Evaluation runs only between blocks of rounds, so on CPU it is compiled for compile speed, at XLA's backend
# optimisation level 0. Measured on the quick-start FedAvg (MLP 64, 50 clients; 2 cores under load ~13): 1.0 s
# instead of 1.9 s to compile, 1.0 ms instead of 0.5 ms to run; its losses can differ in the last bit (2e-7
# relative), its accuracies did not. Initialisation keeps the full optimisation although level 0 compiled it in
# 1.2 s instead of 3.9 s: level 0 changed the initial parameters' last bits, and with them every trained result
# (a committed DFedAlt cell moved from 0.8450 to 0.8538). The blocks of rounds keep it too (level 0 ran them 3x slower).
QUICK_COMPILE = ("evaluate", "lanes_evaluate", "store_evaluate", "store_summary")


def _compiler_options(name: str) -> dict | None:
    """XLA options of the program called ``name`` (see QUICK_COMPILE)."""
    if name in QUICK_COMPILE and jax.default_backend() == "cpu":
        return {"xla_backend_optimization_level": 0}
    return None


def _round_key(base, round_):
    return jax.random.fold_in(jax.random.fold_in(base, 1), round_)


@dataclasses.dataclass
class RunResult:
    """``history``: one dict per evaluation (round, metrics, cumulative bytes, wall seconds);
    ``per_client``: the last evaluation's per-client accuracies."""

    state: State
    history: list[dict]
    per_client: dict
    compile_seconds: float
    run_seconds: float

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}

    def to_frame(self):
        """The history as a pandas DataFrame (one row per evaluation, ``round`` first)."""
        from fljax.frames import history_frame

        return history_frame(self.history)

    def __repr__(self) -> str:
        from fljax.frames import headline

        return (f"RunResult({headline(self.final)}, evaluations={len(self.history)}, "
                f"compile_seconds={self.compile_seconds:.1f}, run_seconds={self.run_seconds:.1f})")


class Simulation:
    """An algorithm bound to data, a model and an executor.

    ``data``: the clients' data, read through :class:`~fljax.engine.protocol.SimulationData` (classification data,
    :class:`~fljax.data.FederatedData`; FedGiA's regression blocks, :class:`fljax.problems.ClientBlocks`; one's own
    pytree that states the protocol and that the algorithm understands). ``model``: the model the clients run
    (:func:`fljax.models.make_model`, :func:`fljax.models.own_model`; the one a config's ``model.name: auto`` picks
    is :func:`fljax.experiment.default_model`); labelled data needs one, other data runs without (the algorithm's
    own functions, ``ctx.model`` is None). ``executor``: 'auto' | 'vmap' | 'chunked' | 'sharded' |
    'loop' or an :class:`Executor`. ``conv_impl``: the form of the models' convolutions ('native', 'patches',
    'shifts': :mod:`fljax.models.layers`); 'auto' picks per backend, model and executor from the committed
    measurements (:func:`fljax.models.conv_table.choose`). ``unroll``: the ``lax.scan`` unroll factor of the local
    steps ('auto': see :meth:`_auto_unroll`). ``precision``: 'tf32' (the backend's default for the model's float32
    products: TF32 on NVIDIA GPUs since Ampere, exact on CPU), 'fp32' (exact float32 products) or 'bf16' (the model
    computes in bfloat16 from float32 master weights); whatever it is, everything outside the model (aggregation,
    the algorithms' own linear algebra) runs with exact float32 products (:data:`fljax.models.model.PRECISIONS`).

    ``groups``: a heterogeneous population (:class:`~fljax.engine.population.Population` or a list of
    :class:`~fljax.engine.population.ClientGroup` whose sizes add up to the data's clients): each group runs its own
    model (None: ``model``) and hyperparameter overrides, ``model`` is then the global model's, and the per-client
    state is a tuple of one pytree per group. None: one homogeneous population, or the data's own groups when the
    data comes in groups of their own shapes (its ``group_sizes``: FedGiA's size classes).

    ``memory_budget``: GiB of temporaries each compiled program may use (None: a fraction of the device's memory,
    :func:`fljax.engine.budget.default_budget`); client maps that would exceed it run in chunks that fit
    (:mod:`fljax.engine.budget`), and ``memory_plans`` records each program's budget and XLA's own count of its
    temporaries.

    ``eval_clients``: evaluate on a fixed sample of this many clients (None: every client): the same sorted ids at
    every evaluation (:func:`fljax.engine.sampling.evaluation_sample`, kept as :attr:`eval_ids`), each scored as
    in an evaluation of every client; the summaries and per-client arrays are then over the sample. For
    classification data of one homogeneous population without target clients (refused otherwise, one line:
    :func:`fljax.engine.sampling.check_sample`, the rule :func:`fljax.experiment.resolve` asks of a config).

    ``privacy``: the run's differential privacy and compressed uploads (:class:`fljax.privacy.Privacy`, resolved by
    :func:`fljax.experiment.privacy_of`; None: none), handed to the algorithm in every round's context. Its traced
    value (the noise multiplier, ``"privacy.noise_multiplier"`` in ``hp``) may differ per lane of one program.

    ``aggregator`` (a :class:`fljax.aggregation.Rule`; None: the weighted mean) and ``attack`` (a
    :class:`fljax.aggregation.Attack`; None: every client honest) make, with the privacy's encoder, the
    :class:`fljax.aggregation.Aggregator` a centralized server reduces its uploads with; ``participation`` (a
    :class:`fljax.participation.Participation`; None: uniform cohorts, Poisson ones under client-level privacy)
    draws every round's cohort. Their numeric options may be traced per lane (``"attack.fraction"``,
    ``"aggregator.beta"`` in ``hp``).

    ``state_store``: where every client's state is kept between the blocks of rounds (:mod:`fljax.engine.store`):
    'device' (the default: in :class:`State`, a leading axis of every client), 'host' (host memory) or 'disk' (files
    in ``store_dir``; None: a temporary directory); the device then holds only the clients a block samples, and the
    results are the device's bit for bit. With a store, :attr:`State.clients <fljax.engine.State>` is a
    :class:`~fljax.engine.store.StoredClients` handle and :func:`fljax.engine.store.client_states` reads the rows.

    ``validated_for``: the number of training clients that ``algorithm`` (and each client group's hyperparameters)
    has already been validated for (:meth:`~fljax.engine.protocol.FederatedAlgorithm.validate`;
    :func:`fljax.experiment.resolve` does it once per experiment, and :func:`fljax.experiment.build` passes the
    number on). When it is this data's number of training clients the checks are not repeated; None: they run here.

    Every compiled call runs through :func:`fljax.engine.blas.call` (one BLAS thread when the user allowed more).
    """

    def __init__(self, algorithm: FederatedAlgorithm, data, model: Model | None = None, *,
                 executor: str | Executor = "auto", chunk_size: int | None = None, seed: int = 0,
                 conv_impl: str = "auto", unroll: int | str = "auto", groups=None,
                 memory_budget: float | None = None, precision: str = "tf32", privacy=None,
                 eval_clients: int | None = None, validated_for: int | None = None, aggregator=None, attack=None,
                 participation=None, state_store: str = "device", store_dir: str | None = None):
        from fljax.aggregation import Mean
        from fljax.participation import default_participation

        compile_cache.enable()
        self.privacy = privacy
        self.aggregator = Mean() if aggregator is None else aggregator
        self.attack = attack
        self.participation = participation if participation is not None else default_participation(
            privacy is not None and privacy.plan is not None and privacy.plan.options.level == "client",
            clocked=algorithm.asynchronous)
        if memory_budget is not None and not memory_budget > 0:
            raise ValueError(f"memory_budget must be > 0 GiB (or None: from the device), got {memory_budget}.")
        self.memory_budget = memory_budget
        self.num_train_clients = data.num_train_clients  # all but a meta-learning split's target clients
        validate = validated_for != self.num_train_clients
        if validate:
            algorithm.validate(self.num_train_clients)
        if model is None and data.labelled:
            raise ValueError("Simulation needs the model its clients run for classification data: pass one, e.g. "
                             "fljax.models.make_model('mlp', data.input_shape, data.num_classes) or "
                             "fljax.experiment.default_model(data).")
        population = self._population(algorithm, data, model, groups, validate)
        check_sample(eval_clients, clients=data.num_clients, train_clients=self.num_train_clients,
                     labelled=data.labelled, grouped=population is not None)
        self.algorithm = algorithm
        self.data = data
        self.eval_ids = sampling.evaluation_sample(data.num_clients, eval_clients)
        self.seed = int(seed)
        models = [m for m in [model] + ([] if population is None else [g.model for g in population.groups])
                  if m is not None]
        if isinstance(executor, Executor):
            self.executor = executor
        elif executor == "auto":
            self.executor = self._auto_executor(models, algorithm, chunk_size)
        else:
            self.executor = make_executor(executor, chunk_size=chunk_size)
        if precision not in PRECISIONS:
            raise OptionError("precision", f"must be one of {list(PRECISIONS)}, got {precision!r}.")
        self.precision = precision
        self.model = None if model is None else self._configured(model, conv_impl)
        self.population = None if population is None else Population(tuple(
            dataclasses.replace(g, model=self._configured(g.model, conv_impl) if g.model is not None else None)
            for g in population.groups))
        self.unroll = self._auto_unroll(models, algorithm) if unroll == "auto" else int(unroll)
        # the algorithm's caveats about the models it trains (Algorithm.model_warning), for the runner to show
        pairs = [(algorithm, model)] if population is None else [
            (algorithm.for_group(g), g.model or model) for g in population.groups]
        self.model_warnings = sorted({w for a, m in pairs if m is not None for w in [a.model_warning(m)] if w})
        self.compile_seconds = 0.0
        self._compiled: dict = {}
        self._executables: dict = {}
        self.memory_plans: dict = {}
        store.check(self, state_store)
        self.state_store = state_store
        self.store_engine = None if state_store == "device" else store.StoreEngine(self, state_store, store_dir)
        self._planned = False
        self._check_deadline()

    def _check_deadline(self) -> None:
        """Refuse, before anything runs, a participation deadline that no client meets with its whole work (one step
        under ``policy: partial``) and its bytes (the state's shapes, traced without computing anything)."""
        if self.participation.deadline is None or not self.data.labelled or not self.algorithm.samples_cohorts:
            return
        from fljax.participation import Work

        key = jax.random.PRNGKey(self.seed)
        nbytes = self.algorithm.bytes_per_client(self.context(self.data, jnp.int32(0), key, key),
                                                 self.state_shapes().server)
        try:
            self.participation.check_deadline(self.num_train_clients,
                                              Work.of(self.algorithm.plan(), self.data.train, nbytes))
        except OptionError as e:
            raise e.within("participation") from None

    def _population(self, algorithm, data, model: Model | None, groups, validate: bool) -> Population | None:
        """The population of client groups (``groups``, else the data's own groups, else None), refused in one line
        when the algorithm or the data cannot run it (:func:`~fljax.engine.population.check_groups`; every group
        trains the global model's architecture unless the algorithm mixes them); ``validate``: every group's
        hyperparameters are checked for the training clients
        (:meth:`~fljax.engine.protocol.FederatedAlgorithm.validate`; :func:`fljax.experiment.resolve` did it once
        for an experiment's)."""
        if data.group_sizes is not None:
            if groups is not None:
                raise ValueError("this data comes in groups of its own (data.group_sizes); client groups cannot be "
                                 "added to it.")
            return Population.of_sizes(data.group_sizes)
        if groups is None:
            return None
        population = Population.of(groups)
        check_groups(algorithm, [g.size for g in population.groups], data.num_clients, stacked=data.stacked)
        if model is None:
            raise ValueError("client groups need the global model (model=).")
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        for group in population.groups:
            if group.model is not None and not algorithm.mixed_architectures and \
                    jax.eval_shape(group.model.init, jax.random.PRNGKey(0)) != shapes:
                raise ValueError(f"algorithm {algorithm.name!r} trains the global model ({model.name}) on every "
                                 f"client; client group {group.name!r} runs another architecture "
                                 f"({group.model.name}).")
            if validate:
                algorithm.for_group(group).validate(self.num_train_clients)
        return population

    @property
    def eval_clients(self) -> int:
        """How many clients an evaluation scores (all of them without an evaluation sample)."""
        return self.data.num_clients if self.eval_ids is None else len(self.eval_ids)

    # ---------------------------------------------------------------------------------------------- sizing
    def _configured(self, model: Model, conv_impl: str) -> Model:
        """``model`` with its convolution form (``auto``: :func:`fljax.models.conv_table.choose` for this backend,
        model and executor) and the simulation's precision."""
        if conv_impl == "auto":
            conv_impl = conv_table.choose(jax.default_backend(), model.name, self.executor.vectorised)
        return model.with_conv(conv_impl).with_precision(self.precision)

    def _auto_executor(self, models: list[Model], algorithm: FederatedAlgorithm,
                       chunk_size: int | None) -> Executor:
        """Resolve 'auto' from the workload (see :func:`fljax.engine.executors.choose_executor`; the largest of the
        models sizes a chunk, and any convolutional one counts)."""
        cohort = algorithm.participants(self.num_train_clients)
        params = max((m.num_params() for m in models), default=0)
        # parameters, gradients, optimizer state, updates; local data
        per_client_bytes = 16 * params + self.data.client_nbytes()
        return choose_executor(backend=jax.default_backend(), device_count=jax.device_count(),
                               has_conv=any(m.has_conv for m in models), cohort=cohort,
                               per_client_bytes=per_client_bytes, chunk_size=chunk_size)

    def _auto_unroll(self, models: list[Model], algorithm: FederatedAlgorithm) -> int:
        """Unroll the local-step scan fully for convolutional models on CPU, where XLA:CPU runs convolutions
        inside a while loop several times slower than unrolled (engine.md, measured in benchmarks; at most 64
        steps, to bound compile time); else 1."""
        plan = algorithm.plan()
        if any(m.has_conv for m in models) and jax.default_backend() == "cpu" and plan is not None:
            return max(1, min(64, plan.num_steps(self.data.train.n_max)))  # cap: compile time
        return 1

    def work_per_round(self) -> tuple[int, int]:
        """(client-steps, samples) of local training per round, from the algorithm's batch plan ((0, 0) without
        one)."""
        algo = self.algorithm
        plan = algo.plan()
        if plan is None:
            return 0, 0
        n_max = self.data.train.n_max
        cohort = algo.participants(self.num_train_clients)
        steps = algo.steps_per_round(n_max)
        return cohort * steps, cohort * steps * plan.width(n_max)

    def context(self, data, round_, key, run_key=None, hp: dict | None = None, slots=None) -> RoundContext:
        """The round context the algorithm sees (the model, unroll factor, population, privacy, aggregator and
        participation bound here; their traced values from ``hp``; ``slots``: the client ids of a state buffer's
        rows, under a client-state store)."""
        from fljax.aggregation import Aggregator

        privacy = None if self.privacy is None else self.privacy.at(hp)
        aggregator = Aggregator(self.aggregator, None if privacy is None else privacy.uploads,
                                self.attack).at(hp)
        return RoundContext(self.executor, data, round_, key, self.model, self.unroll, run_key=run_key,
                            population=self.population, privacy=privacy, aggregator=aggregator,
                            participation=self.participation, slots=slots)

    def algorithm_at(self, hp: dict | None):
        """The algorithm with the hyperparameters in ``hp`` replaced: inside a compiled program their values are
        traced arguments, so one program serves a whole grid of them (a value that Python control flow inspects
        cannot be traced: tracing it raises, and such a grid runs as separate programs). Dotted keys of other
        sections (``privacy.noise_multiplier``) go to the context (:meth:`context`)."""
        own = {k: v for k, v in (hp or {}).items() if "." not in k}
        return self.algorithm if not own else self.algorithm.with_values(**own)

    # ---------------------------------------------------------------------------------------------- state
    def init(self, seed: int | None = None, hp: dict | None = None) -> State:
        """The initial state of the run with ``seed`` (default: the simulation's) and hyperparameters ``hp``
        (default: the algorithm's), compiled once per simulation (eagerly under the loop executor)."""
        if self.store_engine is not None:
            if hp is not None:
                raise ValueError("a client-state store runs the algorithm's own hyperparameters (hp=None): its runs "
                                 "are not lanes.")
            seed = self.seed if seed is None else seed
            return self.store_engine.init(seed, self.store_engine.make_store(seed))
        key = jax.random.PRNGKey(self.seed if seed is None else seed)
        if not self.executor.jittable:
            return self._eager(self.init_fn, key, hp)
        return self.compiled("init", self.init_fn, (key, hp, self.data))(key, hp, self.data)

    def state_shapes(self) -> State:
        """The state's structure, shapes and dtypes (``jax.ShapeDtypeStruct`` leaves), e.g. to restore a checkpoint
        into; nothing is computed. With a client-state store its clients are a
        :class:`~fljax.engine.store.StoredClients` handle (of no store: the caller attaches the run's)."""
        shapes = jax.eval_shape(self.init_fn, jax.random.PRNGKey(self.seed))
        return shapes if self.store_engine is None else shapes.replace(clients=store.StoredClients(None))

    # ---------------------------------------------------------------------------------------------- pure functions
    def init_fn(self, key, hp: dict | None = None, data=None) -> State:
        """The initial :class:`State` of the run with PRNG key ``key`` (``jax.random.PRNGKey(seed)``), traced
        hyperparameters ``hp`` (None: the algorithm's own) and ``data`` (None: the simulation's): the algorithm's
        ``init_population`` at round 0. Pure: traceable under ``jit``, ``vmap`` and ``eval_shape``."""
        ctx = self.context(self.data if data is None else data, jnp.int32(0), jax.random.fold_in(key, 0), key, hp)
        server, clients = self.algorithm_at(hp).init_population(ctx)
        return State(server=server, clients=clients, round=jnp.int32(0), key=key)

    def round_fn(self, state: State, data, hp: dict | None = None, slots=None, cohort=None):
        """``(next state, metrics)``: one round of the algorithm on ``data`` with traced hyperparameters ``hp``;
        ``metrics`` are the round's scalars plus ``finite_params`` (the new state is finite) and ``finite`` (so are
        its losses). The round's key is ``fold_in(fold_in(state.key, 1), state.round)``. ``slots``: the state holds
        a client-state store's buffer of these clients (:attr:`RoundContext.slots`; None: every client);
        ``cohort``: the round's cohort, drawn ahead (None: drawn in the round). Pure."""
        ctx = self.context(data, state.round, _round_key(state.key, state.round), state.key, hp, slots)
        ctx = ctx if cohort is None else dataclasses.replace(ctx, cohort=cohort)
        server, clients, metrics = self.algorithm_at(hp).round(ctx, state.server, state.clients)
        metrics = dict(metrics)
        losses = {k: v for k, v in metrics.items() if "loss" in k}
        metrics["finite_params"] = tree.all_finite((server, clients))
        metrics["finite"] = metrics["finite_params"] & tree.all_finite(losses)
        return State(server=server, clients=clients, round=state.round + 1, key=state.key), metrics

    def block_fn(self, state: State, data, n, hp: dict | None = None, slots=None, cohorts=None,
                 capacity: int | None = None):
        """``(state after n rounds, the rounds' metrics stacked along axis 0)``: :meth:`round_fn` applied ``n``
        times in a loop (``n`` a Python int: a ``lax.scan``, differentiable; a traced integer: a loop whose metrics
        fill the first n of ``capacity`` rows, so that one program serves blocks of every length up to ``capacity``
        — running n rounds in one call or in several calls of it gives the same results bit for bit, as every call
        runs the same compiled round). The round is traced once (its jaxpr gives the metrics' shapes and is the
        loop's body). A client-state store's block (:mod:`fljax.engine.store`) passes the block's ``slots`` and its
        rounds' ``cohorts`` drawn ahead, stacked: a ``lax.scan`` over them, ``n`` static. Pure."""
        if cohorts is not None:
            return jax.lax.scan(lambda s, c: self.round_fn(s, data, hp, slots, c), state, cohorts, length=n)
        capacity = n if capacity is None else capacity
        closed, shapes = jax.make_jaxpr(self.round_fn, return_shape=True)(state, data, hp)
        round_, tree_ = jax_core.jaxpr_as_fun(closed), jax.tree.structure(shapes)
        rows = jax.tree.map(lambda m: jnp.zeros((capacity, *m.shape), m.dtype), shapes[1])

        def one(i, carry):
            s, rows_ = carry
            s, metrics = jax.tree.unflatten(tree_, round_(*jax.tree.leaves((s, data, hp))))
            return s, jax.tree.map(lambda row, m: row.at[i].set(m), rows_, metrics)

        return jax.lax.fori_loop(0, n, one, (state, rows))

    def evaluate_fn(self, state: State, data, hp: dict | None = None):
        """``(scalar summaries, per-client arrays)``: the algorithm's evaluation of ``state`` on ``data`` with traced
        hyperparameters ``hp``, over the evaluation sample when there is one (:attr:`eval_ids`). Pure."""
        ctx = self.context(data, state.round, _round_key(state.key, state.round), state.key, hp)
        ctx = dataclasses.replace(ctx, eval_ids=self.eval_ids)
        return self.algorithm_at(hp).evaluate(ctx, state.server, state.clients)

    # ---------------------------------------------------------------------------------------------- programs
    def compiled(self, name: str, fn: Callable, args, static: tuple = (), lanes: int = 1):
        """AOT-compile ``fn`` once per (name, static, structure and shapes of ``args``) and account the compile
        time. ``static`` must hold every Python value ``fn`` depends on beyond ``args`` (``fn`` itself is not part
        of the key). The program is returned wrapped in :func:`fljax.engine.blas.call`. On several processes its
        inputs and outputs are replicated on every device (:func:`fljax.engine.processes.program_shardings`).
        A program asked for earlier (:meth:`request`) is waited for here; ``compile_seconds`` counts the tracing
        and the wait.

        Memory: the program is traced under its budget (:meth:`program_budget`; ``lanes``: it runs that many lanes
        side by side, each gets 1/lanes), so its client maps run in chunks that fit; when XLA's count of its
        temporaries (``memory_analysis()``) still exceeds the budget and it maps clients, it is planned again with the
        budget scaled by their ratio and compiled once more. ``memory_plans[name, static]`` keeps the budget and
        XLA's counts."""
        key = self.request(name, fn, args, static, lanes)
        if isinstance(self._compiled[key], _Pending):
            t0 = time.perf_counter()
            self._finish(key)
            self.compile_seconds += time.perf_counter() - t0
        return self._compiled[key]

    def _finish(self, key) -> None:
        """The compiled program of a pending entry (waited for), planned again when XLA counts more temporaries
        than its budget (:meth:`compiled`), in place of the entry."""
        entry = self._compiled[key]
        compiled = entry.future.result()
        plan = entry.plan
        plan["xla_temp_bytes"] = _temp_bytes(compiled)
        if entry.maps and plan["xla_temp_bytes"] is not None and plan["xla_temp_bytes"] > entry.total:
            scaled = entry.total * entry.total / plan["xla_temp_bytes"]
            lowered, maps = self._lower(entry.name, entry.fn, entry.args, scaled, entry.source)
            compiled = lowered.compile(_compiler_options(entry.name))
            plan.update(first_xla_temp_bytes=plan["xla_temp_bytes"], replanned_bytes=scaled,
                        xla_temp_bytes=_temp_bytes(compiled), maps=maps)
        self.memory_plans[entry.name, entry.static] = plan
        self._compiled[key] = lambda *a: blas.call(compiled, *a)
        self._executables[entry.name, entry.static] = compiled

    def wait(self, report: Callable[[list[str], float], None] | None = None, every: float = 1.0) -> None:
        """Wait for every program asked for (:meth:`request`), calling ``report(names still compiling, seconds
        waited)`` every ``every`` seconds meanwhile (a progress bar's "compiling …"); counted in
        ``compile_seconds``."""
        t0 = time.perf_counter()
        while names := self.pending():
            if report is not None:
                report(names, time.perf_counter() - t0)
            concurrent.futures.wait([e.future for e in self._compiled.values()
                                     if isinstance(e, _Pending) and not e.future.done()],
                                    timeout=every, return_when=concurrent.futures.FIRST_COMPLETED)
        for key in [k for k, e in self._compiled.items() if isinstance(e, _Pending)]:
            self._finish(key)
        self.compile_seconds += time.perf_counter() - t0

    def request(self, name: str, fn: Callable, args, static: tuple = (), lanes: int = 1):
        """Trace and lower ``fn`` now (in this thread) and compile it in the background
        (:mod:`fljax.engine.compile_pool`): the first :meth:`compiled` call with the same name, static values and
        argument shapes waits for it. ``args`` may be ``jax.ShapeDtypeStruct`` s. Returns the program's key; a
        program asked for before is not traced again."""
        leaves, treedef = jax.tree.flatten(args)
        key = (name, static, treedef, tuple((np.shape(x), str(getattr(x, 'dtype', type(x)))) for x in leaves))
        if key not in self._compiled:
            t0 = time.perf_counter()
            total, source = self.program_budget(args, lanes)
            lowered, maps = self._lower(name, fn, args, total, source)
            self._compiled[key] = _Pending(compile_pool.submit(lowered.compile, _compiler_options(name)), name,
                                           static, fn, args, total, source, maps,
                                           {"budget_bytes": total, "budget": source, "maps": maps})
            self.compile_seconds += time.perf_counter() - t0
        return key

    def pending(self) -> list[str]:
        """The names of the programs asked for (:meth:`request`) whose compilation has not ended."""
        return [entry.name for entry in self._compiled.values()
                if isinstance(entry, _Pending) and not entry.future.done()]

    def cancel_pending(self) -> None:
        """Drop the programs asked for whose compilation has not begun (they are compiled again if asked for)."""
        for key, entry in list(self._compiled.items()):
            if isinstance(entry, _Pending) and entry.future.cancel():
                del self._compiled[key]

    def release(self) -> None:
        """Forget every compiled program (their memory is freed; a later call compiles, or loads from the compile
        cache, again)."""
        self.cancel_pending()
        self._compiled.clear()
        self._executables.clear()

    def _lower(self, name: str, fn: Callable, args, budget_bytes: float, source: str):
        """(lowered program, its client maps' plans) of ``fn`` traced under ``budget_bytes``. Traced afresh every
        time: ``jax.jit`` of the same function object reuses its earlier trace, whose plan was made under another
        budget (a re-plan would then compile the same program again)."""
        def program(*a):
            return fn(*a)

        program.__name__ = name  # the compiled module's name: jit_init, jit_block, ...
        with budget.scope(budget_bytes, PROGRAMS.get(name, name), source) as maps, precision_scope("fp32"):
            lowered = jax.jit(program, **processes.program_shardings()).lower(*args)
        return lowered, maps

    def program_budget(self, args, lanes: int = 1) -> tuple[float, str]:
        """(bytes, description) of the temporaries a program with arguments ``args`` may use: ``memory_budget``
        GiB, else :func:`fljax.engine.budget.default_budget`; divided among ``lanes`` lanes run side by side."""
        if self.memory_budget is not None:
            total, source = self.memory_budget * 2 ** 30, f"memory_budget={self.memory_budget:g} GiB"
        else:
            total, source = budget.default_budget(args)
        if lanes > 1:
            total, source = total / lanes, f"{source}, shared by {lanes} lanes"
        return total, source

    def compile(self, rounds: int = 1) -> dict:
        """Compile, without running anything, the programs of a run: initialisation, blocks of up to ``rounds``
        rounds and evaluation (:meth:`prepare`), and wait for them; later calls with those shapes reuse them.
        Returns :attr:`memory_plans` (per program: the budget, XLA's count of its temporaries and each client map's
        plan). Raises :class:`~fljax.engine.budget.MemoryPlanError` when a program cannot fit even one client at a
        time. Not for the loop executor, whose programs are per client."""
        if not self.executor.jittable:
            raise ValueError("Simulation.compile needs a jitted executor (not 'loop').")
        for name, fn, args, static in self.programs(rounds):
            self.compiled(name, fn, args, static)
        return self.memory_plans

    def prepare(self, capacity: int) -> None:
        """Ask for the programs of a run whose blocks have at most ``capacity`` rounds (:meth:`programs`): traced
        now, compiled in the background side by side (:mod:`fljax.engine.compile_pool`); nothing under the loop
        executor."""
        if self.executor.jittable and self.store_engine is None:  # a store's programs compile as its blocks need them
            for name, fn, args, static in self.programs(capacity):
                self.request(name, fn, args, static)

    def programs(self, capacity: int) -> list[tuple]:
        """``(name, fn, args, static)`` of the programs a run compiles, from shapes only: the block of up to
        ``capacity`` rounds (first: the longest to compile), initialisation and evaluation."""
        key = jax.eval_shape(lambda: jax.random.PRNGKey(self.seed))
        data = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), self.data)
        state = self.state_shapes()
        n = jax.ShapeDtypeStruct((), jnp.int32)
        return [("block", lambda s, d, k: self.block_fn(s, d, k, capacity=capacity), (state, data, n), (capacity,)),
                ("init", self.init_fn, (key, None, data), ()),
                ("evaluate", self.evaluate_fn, (state, data), ())]

    def plan_memory(self) -> None:
        """Trace the programs of a run under their memory budgets — initialisation, one round and evaluation —
        without compiling or running anything, so that one whose client maps cannot fit even one client at a time is
        refused (:class:`~fljax.engine.budget.MemoryPlanError`) before a run directory is written (the run plans
        them again when it compiles them); with a client-state store, its programs on a block's buffer and an
        evaluation chunk (:meth:`fljax.engine.store.StoreEngine.programs`). Once per simulation; nothing under the
        loop executor, whose programs are per client."""
        if self._planned or not self.executor.jittable:
            return
        key = jax.eval_shape(lambda: jax.random.PRNGKey(self.seed))
        data = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), self.data)
        state = self.state_shapes()
        programs = (("init", self.init_fn, (key, None, data)),
                    ("block", lambda s, d: self.block_fn(s, d, 1), (state, data)),
                    ("evaluate", self.evaluate_fn, (state, data))) if self.store_engine is None \
            else self.store_engine.programs(key, data)
        for name, fn, args in programs:
            total, source = self.program_budget(args)
            with budget.scope(total, PROGRAMS[name], source), precision_scope("fp32"):
                jax.eval_shape(fn, *args)
        self._planned = True

    def executable(self, name: str, static: tuple = ()):
        """The last compiled program of ``name`` ('init', 'block' with ``static=(n,)`` for n rounds, 'evaluate'):
        a ``jax.stages.Compiled`` whose ``cost_analysis()`` and ``memory_analysis()`` give XLA's FLOP and byte
        counts and buffer sizes (benchmarks read them); None before it was compiled or under the loop executor."""
        return self._executables.get((name, static))

    def _eager(self, fn: Callable, *args):
        """``fn(*args)`` run from Python (an executor that is not jittable), its jit compilations accounted."""
        c0 = compile_clock.compile_seconds()
        try:
            with precision_scope("fp32"):
                return blas.call(fn, *args)
        finally:
            self.compile_seconds += compile_clock.compile_seconds() - c0

    def round(self, state: State):
        """One round: ``(new state, metrics)``."""
        return self.run_rounds(state, 1, stack=False)

    def run_rounds(self, state: State, n: int, stack: bool = True, capacity: int | None = None):
        """n rounds as one compiled loop; returns the state and the per-round metrics stacked along axis 0.
        ``capacity``: the program runs any number of rounds up to it (the number is an argument, so one program
        serves blocks of every length up to ``capacity``: :meth:`block_fn`); the metrics then have ``capacity``
        rows, the first n of them this call's (default: n, exactly). With a client-state store, the store's block of
        n rounds (its metrics n rows)."""
        if isinstance(state.clients, store.StoredClients):
            state, metrics = self.store_engine.run_rounds(state, n)
        elif not self.executor.jittable:
            outs = []
            for _ in range(n):
                state, m = self._eager(self.round_fn, state, self.data)
                outs.append(m)
            metrics = tree.stack(outs)
        else:
            capacity = n if capacity is None else capacity
            if not 1 <= n <= capacity:
                raise ValueError(f"run_rounds: n = {n} rounds must be between 1 and capacity = {capacity}.")
            fn = self.compiled("block", lambda s, d, k: self.block_fn(s, d, k, capacity=capacity),
                               (state, self.data, jnp.int32(n)), (capacity,))
            state, metrics = fn(state, self.data, jnp.int32(n))
        return state, (metrics if stack else jax.tree.map(lambda x: x[0], metrics))

    def evaluate(self, state: State) -> tuple[dict, dict]:
        """(scalar summaries, per-client accuracies) of the global and personalized models."""
        if isinstance(state.clients, store.StoredClients):
            return self.store_engine.evaluate(state)
        if not self.executor.jittable:
            return self._eager(self.evaluate_fn, state, self.data)
        return self.compiled("evaluate", self.evaluate_fn, (state, self.data))(state, self.data)

    # ---------------------------------------------------------------------------------------------- run
    def run(self, rounds: int, eval_every: int | None = None, state: State | None = None,
            callback: Callable[[dict, State], None] | None = None, progress: bool = True,
            stop_on_nonfinite: bool = True, *, log: RunLog | None = None, checkpoint_every: int = 0,
            on_checkpoint: Callable[[State, RunLog], None] | None = None) -> RunResult:
        """Run until ``rounds`` rounds are done, evaluating every ``eval_every`` rounds (default: about 10 times)
        and at the end. ``callback(record, state)`` runs after every evaluation.

        Resuming: pass the ``state`` and the :class:`RunLog` of an earlier run (both from a checkpoint); the
        blocks of rounds then end where the uninterrupted run's end, so the results are the same bit for bit.
        ``on_checkpoint(state, log)`` runs every ``checkpoint_every`` rounds (0: only after the last round), only
        after the rounds it covers were checked finite.
        """
        eval_every = eval_every or max(1, math.ceil(rounds / 10))
        self.prepare(block_capacity(rounds, eval_every, checkpoint_every))  # compiled side by side
        if progress:
            wait_compiling(self)
        state = state if state is not None else self.init()
        log = log if log is not None else RunLog()
        lane_callback = None if callback is None else (lambda _, record, s: callback(record, s))
        lane_checkpoint = None if on_checkpoint is None else (lambda _, s, lg: on_checkpoint(s, lg))
        guards = (NonFiniteGuard(),) if stop_on_nonfinite else ()
        state, per_client, stopped = drive(self, state, [log], rounds, eval_every, checkpoint_every, lanes=False,
                                           callback=lane_callback, on_checkpoint=lane_checkpoint, guards=guards,
                                           progress=progress)
        if stopped:
            raise NonFiniteError(f"{stopped[0]}; lower the learning rate (algo.lr) or check the data.")
        return RunResult(state, log.history, jax.device_get(per_client), self.compile_seconds, log.run_seconds)


@dataclasses.dataclass
class _Pending:
    """A program being compiled (:meth:`Simulation.request`): the compilation's future; the program's name, static
    values, function and arguments (to plan it again); its memory budget (bytes and where it came from), its client
    maps' plans and its memory plan so far."""

    future: concurrent.futures.Future
    name: str
    static: tuple
    fn: Callable
    args: tuple
    total: float
    source: str
    maps: list
    plan: dict


# the programs' names in messages and progress lines
PROGRAMS = {"init": "initialisation", "block": "rounds", "evaluate": "evaluation", "until": "stopping-rule loop",
            "store_init": "initialisation", "store_init_rows": "clients' initialisation", "store_draws": "cohorts",
            "store_block": "rounds", "store_evaluate": "evaluation", "store_summary": "evaluation",
            "lanes_init": "lanes' initialisation", "lanes_block": "lanes' rounds",
            "lanes_evaluate": "lanes' evaluation", "lanes_until": "lanes' stopping-rule loop"}


def _temp_bytes(compiled) -> int | None:
    """XLA's count of a compiled program's temporary bytes (None where the backend gives none)."""
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis
        return None
    return None if mem is None else int(mem.temp_size_in_bytes)
