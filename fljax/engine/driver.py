"""The round driver: one jitted program per round, ``lax.scan`` over blocks of rounds between evaluations.

:class:`Simulation` binds an algorithm, a model and federated data to an executor. ``round(state)`` runs one round;
``run_rounds(state, n)`` runs n rounds as one compiled ``lax.scan`` (metrics stay on device inside the block);
``evaluate(state)`` scores every client; ``run(rounds, eval_every)`` alternates the two and reports progress. Under
the loop executor rounds run eagerly in Python, one jitted per-client call at a time (the reference).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.data.federated import FederatedData
from fljax.engine import blas
from fljax.engine.context import RoundContext
from fljax.engine.executors import Executor, choose_executor, make_executor
from fljax.engine.protocol import FederatedAlgorithm
from fljax.engine.state import State
from fljax.models.model import Model, auto_model, make_model

__all__ = ["Simulation", "RunResult", "RunLog", "default_model", "NonFiniteError", "block_schedule", "drive",
           "nonfinite_message"]


class NonFiniteError(FloatingPointError):
    """Training produced NaN or Inf."""


def default_model(data: FederatedData) -> Model:
    """Logistic regression for vector data, CNN1 for images."""
    return make_model(auto_model(data.input_shape), data.input_shape, data.num_classes)


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


class Simulation:
    """An algorithm bound to data, a model and an executor.

    ``data``: classification data (:class:`~fljax.data.FederatedData`) or any pytree with a ``num_clients``
    property that the algorithm understands (FedGiA's regression blocks, :class:`fljax.problems.ClientBlocks`).
    ``model``: None picks :func:`default_model` for classification data; other data runs without a model (the
    algorithm's own functions, ``ctx.model`` is None). ``executor``: 'auto' | 'vmap' | 'chunked' | 'sharded' |
    'loop' or an :class:`Executor`. ``conv_impl``: 'auto' uses the patches-plus-matmul convolution when clients are
    vectorised and the native one under the loop executor (measured: ``benchmarks/throughput.py``). ``unroll``: the
    ``lax.scan`` unroll factor of the local steps ('auto': see :meth:`_auto_unroll`).

    Every compiled call runs through :func:`fljax.engine.blas.call` (one BLAS thread when the user allowed more).
    """

    def __init__(self, algorithm: FederatedAlgorithm, data, model: Model | None = None, *,
                 executor: str | Executor = "auto", chunk_size: int | None = None, seed: int = 0,
                 conv_impl: str = "auto", unroll: int | str = "auto"):
        algorithm.validate(data.num_clients)
        if model is None and isinstance(data, FederatedData):
            model = default_model(data)
        self.algorithm = algorithm
        self.data = data
        self.seed = int(seed)
        if isinstance(executor, Executor):
            self.executor = executor
        elif executor == "auto":
            self.executor = self._auto_executor(model, algorithm, chunk_size)
        else:
            self.executor = make_executor(executor, chunk_size=chunk_size)
        impl = conv_impl if conv_impl != "auto" else ("patches" if self.executor.vectorised else "native")
        self.model = None if model is None else model.with_conv(impl)
        self.unroll = self._auto_unroll(self.model, algorithm) if unroll == "auto" else int(unroll)
        self.compile_seconds = 0.0
        self._compiled: dict = {}

    # ---------------------------------------------------------------------------------------------- sizing
    def _auto_executor(self, model: Model | None, algorithm: FederatedAlgorithm, chunk_size: int | None) -> Executor:
        """Resolve 'auto' from the workload (see :func:`fljax.engine.executors.choose_executor`)."""
        cohort = algorithm.participants(self.data.num_clients)
        params = 0 if model is None else model.num_params()
        # parameters, gradients, optimizer state, updates; local data
        per_client_bytes = 16 * params + _client_data_bytes(self.data)
        return choose_executor(backend=jax.default_backend(), device_count=jax.device_count(),
                               has_conv=model is not None and model.has_conv, cohort=cohort,
                               per_client_bytes=per_client_bytes, chunk_size=chunk_size)

    def _auto_unroll(self, model: Model | None, algorithm: FederatedAlgorithm) -> int:
        """Unroll the local-step scan fully for convolutional models on CPU, where XLA:CPU runs convolutions
        inside a while loop several times slower than unrolled (engine.md, measured in benchmarks; at most 64
        steps, to bound compile time); else 1."""
        plan = algorithm.plan()
        if model is not None and model.has_conv and jax.default_backend() == "cpu" and plan is not None:
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
        cohort = algo.participants(self.data.num_clients)
        steps = algo.steps_per_round(n_max)
        return cohort * steps, cohort * steps * plan.width(n_max)

    def context(self, data, round_, key) -> RoundContext:
        """The round context the algorithm sees (the model and unroll factor bound here)."""
        return RoundContext(self.executor, data, round_, key, self.model, self.unroll)

    def algorithm_at(self, hp: dict | None):
        """The algorithm with the hyperparameters in ``hp`` replaced: inside a compiled program their values are
        traced arguments, so one program serves a whole grid of them (a value that Python control flow inspects
        cannot be traced: tracing it raises, and such a grid runs as separate programs)."""
        return self.algorithm if not hp else dataclasses.replace(self.algorithm, **hp)

    # ---------------------------------------------------------------------------------------------- state
    def init(self, seed: int | None = None, hp: dict | None = None) -> State:
        """The initial state of the run with ``seed`` (default: the simulation's) and hyperparameters ``hp``
        (default: the algorithm's), compiled once per simulation (eagerly under the loop executor)."""
        key = jax.random.PRNGKey(self.seed if seed is None else seed)
        if not self.executor.jittable:
            return blas.call(self._init, key, hp)
        return self._compiled_fn("init", self._init, (key, hp, self.data))(key, hp, self.data)

    def state_shapes(self) -> State:
        """The state's structure, shapes and dtypes (``jax.ShapeDtypeStruct`` leaves), e.g. to restore a checkpoint
        into; nothing is computed."""
        return jax.eval_shape(self._init, jax.random.PRNGKey(self.seed))

    def _init(self, key, hp: dict | None = None, data=None) -> State:
        ctx = self.context(self.data if data is None else data, jnp.int32(0), jax.random.fold_in(key, 0))
        server, clients = self.algorithm_at(hp).init(ctx)
        return State(server=server, clients=clients, round=jnp.int32(0), key=key)

    # ---------------------------------------------------------------------------------------------- rounds
    def _round(self, state: State, data: FederatedData, hp: dict | None = None):
        ctx = self.context(data, state.round, _round_key(state.key, state.round))
        server, clients, metrics = self.algorithm_at(hp).round(ctx, state.server, state.clients)
        metrics = dict(metrics)
        losses = {k: v for k, v in metrics.items() if "loss" in k}
        metrics["finite_params"] = tree.all_finite((server, clients))
        metrics["finite"] = metrics["finite_params"] & tree.all_finite(losses)
        return State(server=server, clients=clients, round=state.round + 1, key=state.key), metrics

    def _block(self, state: State, data: FederatedData, n: int, hp: dict | None = None):
        return jax.lax.scan(lambda s, _: self._round(s, data, hp), state, None, length=n)

    def _evaluate(self, state: State, data: FederatedData, hp: dict | None = None):
        ctx = self.context(data, state.round, _round_key(state.key, state.round))
        return self.algorithm_at(hp).evaluate(ctx, state.server, state.clients)

    def _compiled_fn(self, name: str, fn: Callable, args, static: tuple = ()):
        """AOT-compile ``fn`` once per (name, static, structure and shapes of ``args``) and account the compile
        time. ``static`` must hold every Python value ``fn`` depends on beyond ``args`` (``fn`` itself is not part
        of the key). The program is returned wrapped in :func:`fljax.engine.blas.call`."""
        leaves, treedef = jax.tree.flatten(args)
        key = (name, static, treedef, tuple((np.shape(x), str(getattr(x, 'dtype', type(x)))) for x in leaves))
        if key not in self._compiled:
            t0 = time.perf_counter()
            compiled = jax.jit(fn).lower(*args).compile()
            self._compiled[key] = lambda *a: blas.call(compiled, *a)
            self.compile_seconds += time.perf_counter() - t0
        return self._compiled[key]

    def round(self, state: State):
        """One round: ``(new state, metrics)``."""
        return self.run_rounds(state, 1, stack=False)

    def run_rounds(self, state: State, n: int, stack: bool = True):
        """n rounds as one compiled scan; returns the state and the per-round metrics stacked along axis 0."""
        if not self.executor.jittable:
            outs = []
            for _ in range(n):
                state, m = blas.call(self._round, state, self.data)
                outs.append(m)
            metrics = tree.stack(outs)
        else:
            fn = self._compiled_fn("block", lambda s, d: self._block(s, d, n), (state, self.data), (n,))
            state, metrics = fn(state, self.data)
        return state, (metrics if stack else jax.tree.map(lambda x: x[0], metrics))

    def evaluate(self, state: State) -> tuple[dict, dict]:
        """(scalar summaries, per-client accuracies) of the global and personalized models."""
        if not self.executor.jittable:
            return blas.call(self._evaluate, state, self.data)
        return self._compiled_fn("evaluate", self._evaluate, (state, self.data))(state, self.data)

    # ---------------------------------------------------------------------------------------------- run
    def run(self, rounds: int, eval_every: int | None = None, state: State | None = None,
            callback: Callable[[dict, State], None] | None = None, progress: bool = True,
            stop_on_nonfinite: bool = True, *, log: "RunLog | None" = None, checkpoint_every: int = 0,
            on_checkpoint: Callable[[State, "RunLog"], None] | None = None) -> RunResult:
        """Run until ``rounds`` rounds are done, evaluating every ``eval_every`` rounds (default: about 10 times)
        and at the end. ``callback(record, state)`` runs after every evaluation.

        Resuming: pass the ``state`` and the :class:`RunLog` of an earlier run (both from a checkpoint); the
        blocks of rounds then end where the uninterrupted run's end, so the results are the same bit for bit.
        ``on_checkpoint(state, log)`` runs every ``checkpoint_every`` rounds (0: only after the last round), only
        after the rounds it covers were checked finite.
        """
        state = state if state is not None else self.init()
        log = log if log is not None else RunLog()
        eval_every = eval_every or max(1, math.ceil(rounds / 10))
        lane_callback = None if callback is None else (lambda _, record, s: callback(record, s))
        lane_checkpoint = None if on_checkpoint is None else (lambda _, s, lg: on_checkpoint(s, lg))
        state, per_client = drive(self, state, [log], rounds, eval_every, checkpoint_every, lanes=False,
                                  callback=lane_callback, on_checkpoint=lane_checkpoint, progress=progress,
                                  stop_on_nonfinite=stop_on_nonfinite)
        return RunResult(state, log.history, jax.device_get(per_client), self.compile_seconds, log.run_seconds)


def _client_data_bytes(data) -> int:
    """Bytes of one client's local data: its train split for classification data, else an equal share of all."""
    if isinstance(data, FederatedData):
        train = data.train
        return (train.x.nbytes + train.y.nbytes) // max(train.x.shape[0], 1)
    return tree.nbytes(data) // max(data.num_clients, 1)


@dataclasses.dataclass
class RunLog:
    """What a run has measured so far (part of a checkpoint, so a resumed run continues it): one record per
    evaluation, the cumulative communication, and the seconds spent running (compilation apart) and compiling."""

    history: list = dataclasses.field(default_factory=list)
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    run_seconds: float = 0.0
    compile_seconds: float = 0.0

    def add_block(self, metrics: dict, seconds: float, compile_seconds: float):
        """Account one block of rounds (``metrics``: per-round arrays on the host)."""
        self.bytes_up += float(np.sum(metrics.get("bytes_up", 0.0)))
        self.bytes_down += float(np.sum(metrics.get("bytes_down", 0.0)))
        self.run_seconds += seconds
        self.compile_seconds += compile_seconds

    def add_record(self, round_: int, metrics: dict, summary: dict) -> dict:
        """The evaluation record after round ``round_`` (``metrics``: the last block's per-round arrays)."""
        order = sorted(summary, key=lambda k: (not k.startswith("personal"), k))  # personalized first
        record = {"round": round_, **{k: float(summary[k]) for k in order},
                  "train_loss": float(np.mean(metrics["train_loss"])),
                  "bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "wall_seconds": self.run_seconds}
        self.history.append(record)
        return record

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict) -> "RunLog":
        return cls(**values)


def block_schedule(start: int, rounds: int, eval_every: int, checkpoint_every: int = 0):
    """The blocks of rounds from ``start`` to ``rounds``: ``(size, evaluate, checkpoint)`` triples. A block ends at
    every multiple of ``eval_every`` (evaluate), of ``checkpoint_every`` (checkpoint; 0: never) and at ``rounds``
    (both). The ends depend only on these numbers, never on ``start``, so a resumed run uses the same blocks."""
    r = start
    while r < rounds:
        ends = [rounds, (r // eval_every + 1) * eval_every]
        if checkpoint_every:
            ends.append((r // checkpoint_every + 1) * checkpoint_every)
        end = min(ends)
        yield end - r, end % eval_every == 0 or end == rounds, bool(
            checkpoint_every and end % checkpoint_every == 0) or end == rounds
        r = end


def nonfinite_message(metrics: dict, summary: dict | None, start: int) -> str | None:
    """None when the block that began after round ``start`` stayed finite, else a one-line message naming the
    first bad round and what went non-finite (a per-round metric, the parameters, or an evaluation loss)."""
    finite = np.asarray(metrics["finite"])
    if finite.all():
        bad_eval = [k for k, v in (summary or {}).items() if k.endswith("_loss") and not np.isfinite(v)]
        if not bad_eval:
            return None
        what = ", ".join(f"{k}={float(summary[k])}" for k in bad_eval)
        return f"round {start + finite.size} produced NaN/Inf in the evaluation ({what})"
    i = int(np.argmin(finite))
    names = [f"{k}={float(np.ravel(v)[i]):.4g}" for k, v in sorted(metrics.items())
             if not k.startswith("finite") and not np.isfinite(np.ravel(v)[i])]
    if not np.ravel(metrics.get("finite_params", finite))[i]:
        names.append("the model parameters")
    return f"round {start + i + 1} produced NaN/Inf in {' and '.join(names)}"


def drive(sim, state, logs: list, rounds: int, eval_every: int, checkpoint_every: int, *, lanes: bool,
          callback=None, on_checkpoint=None, progress: bool = True, stop_on_nonfinite: bool = True,
          labels: list | None = None):
    """The run loop shared by one run and a batch of seeds (``lanes=True``: every leaf of ``state`` and of the
    metrics has a leading seed axis, and ``logs`` holds one :class:`RunLog` per seed).

    Runs the blocks of :func:`block_schedule` with ``sim.run_rounds``; after each, evaluates when due, checks that
    every round stayed finite (raising :class:`NonFiniteError` before anything of the bad block is recorded or
    checkpointed), appends the records and calls ``callback(lane, record, lane_state)`` and, when due,
    ``on_checkpoint(lane, lane_state, log)``. Returns the final state and the last per-client accuracies.
    """
    pick = (lambda tree_, i: jax.tree.map(lambda x: x[i], tree_)) if lanes else (lambda tree_, i: tree_)
    start = int(np.ravel(jax.device_get(state.round))[0])
    per_client: dict = {}
    bar = _progress_bar(rounds, start, progress)
    r = start
    try:
        for n, do_eval, do_checkpoint in block_schedule(start, rounds, eval_every, checkpoint_every):
            t0, c0 = time.perf_counter(), sim.compile_seconds
            state, metrics = sim.run_rounds(state, n)
            jax.block_until_ready(state)
            summary = None
            if do_eval:
                summary, per_client = sim.evaluate(state)
            summary, metrics = jax.device_get((summary, metrics))
            compile_s = sim.compile_seconds - c0
            seconds = time.perf_counter() - t0 - compile_s  # compile time apart
            if stop_on_nonfinite:
                for i in range(len(logs)):
                    message = nonfinite_message(pick(metrics, i), None if summary is None else pick(summary, i), r)
                    if message:
                        who = f"{labels[i]}: " if labels else ""
                        raise NonFiniteError(f"{who}{message}; lower the learning rate (algo.lr) or check the data.")
            r += n
            records = []
            for i, log in enumerate(logs):
                log.add_block(pick(metrics, i), seconds, compile_s)
                if do_eval:
                    records.append(log.add_record(r, pick(metrics, i), pick(summary, i)))
            if bar is not None:
                bar.update(n)
                if records:
                    bar.set_postfix(_postfix(records))
            for i, log in enumerate(logs):
                if records and callback is not None:
                    callback(i, records[i], pick(state, i))
                if do_checkpoint and on_checkpoint is not None:
                    on_checkpoint(i, pick(state, i), log)
    finally:
        if bar is not None:
            bar.close()
    return state, per_client


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True, leave=False)


def _postfix(records: list[dict]) -> dict:
    """The latest metrics for the progress bar (the mean over seeds when several run together)."""
    mean = lambda k: float(np.mean([r[k] for r in records]))
    out = {"loss": f"{mean('train_loss'):.3f}"}
    if "personal_acc" in records[0]:
        out["pers"] = f"{mean('personal_acc'):.3f}"
    if "global_acc" in records[0]:
        out["glob"] = f"{mean('global_acc'):.3f}"
    return out
