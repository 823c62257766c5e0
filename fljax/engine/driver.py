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
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.data.federated import FederatedData
from fljax.engine.context import RoundContext
from fljax.engine.evaluation import evaluate
from fljax.engine.executors import Executor, choose_executor, make_executor
from fljax.engine.state import State
from fljax.models.model import Model, make_model

if TYPE_CHECKING:  # the engine sits below the algorithms layer: no runtime import
    from fljax.algorithms.base import Algorithm

__all__ = ["Simulation", "RunResult", "default_model", "NonFiniteError"]


class NonFiniteError(FloatingPointError):
    """Training produced NaN or Inf."""


def default_model(data: FederatedData) -> Model:
    """Logistic regression for vector data, CNN1 for images."""
    name = "logreg" if len(data.input_shape) == 1 else "cnn1"
    return make_model(name, data.input_shape, data.num_classes)


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

    ``executor``: 'auto' | 'vmap' | 'chunked' | 'sharded' | 'loop' or an :class:`Executor`. ``conv_impl``: 'auto'
    uses the patches-plus-matmul convolution when clients are vectorised and the native one under the loop
    executor (measured: ``benchmarks/throughput.py``). ``unroll``: the ``lax.scan`` unroll factor of the local
    steps ('auto': see :meth:`_auto_unroll`).
    """

    def __init__(self, algorithm: "Algorithm", data: FederatedData, model: Model | None = None, *,
                 executor: str | Executor = "auto", chunk_size: int | None = None, seed: int = 0,
                 conv_impl: str = "auto", unroll: int | str = "auto"):
        algorithm.validate(data.num_clients)
        model = model or default_model(data)
        self.data = data
        self.seed = int(seed)
        if isinstance(executor, Executor):
            self.executor = executor
        elif executor == "auto":
            self.executor = self._auto_executor(model, algorithm, chunk_size)
        else:
            self.executor = make_executor(executor, chunk_size=chunk_size)
        impl = conv_impl if conv_impl != "auto" else ("patches" if self.executor.vectorised else "native")
        model = model.with_conv(impl)
        self.algorithm = algorithm.bind(model, self._auto_unroll(model, algorithm) if unroll == "auto" else int(unroll))
        self.compile_seconds = 0.0
        self._compiled: dict = {}

    # ---------------------------------------------------------------------------------------------- sizing
    def _auto_executor(self, model: Model, algorithm: "Algorithm", chunk_size: int | None) -> Executor:
        """Resolve 'auto' from the workload (see :func:`fljax.engine.executors.choose_executor`)."""
        cohort = getattr(algorithm, "cohort_size", None) or self.data.num_clients
        params = model.num_params()
        steps, width = 1, self.data.train.n_max
        if hasattr(algorithm, "plan"):
            plan = algorithm.plan()
            steps, width = plan.num_steps(self.data.train.n_max), plan.width(self.data.train.n_max)
        per_client_bytes = 16 * params  # parameters, gradients, optimizer state, updates (float32)
        return choose_executor(backend=jax.default_backend(), device_count=jax.device_count(),
                               has_conv=model.has_conv, client_round_flops=6.0 * params * width * steps,
                               cohort_bytes=cohort * per_client_bytes, chunk_size=chunk_size,
                               per_client_bytes=per_client_bytes)

    def _auto_unroll(self, model: Model, algorithm: "Algorithm") -> int:
        """Unroll the local-step scan fully for convolutional models on CPU, where XLA:CPU runs convolutions
        inside a while loop several times slower than unrolled (engine.md, measured in benchmarks; at most 64
        steps, to bound compile time); else 1."""
        if model.has_conv and jax.default_backend() == "cpu" and hasattr(algorithm, "plan"):
            return max(1, min(64, algorithm.plan().num_steps(self.data.train.n_max)))  # cap: compile time
        return 1

    def work_per_round(self) -> tuple[int, int]:
        """(client-steps, samples) of local training per round, from the algorithm's batch plan."""
        algo = self.algorithm
        if not hasattr(algo, "steps_per_round"):
            return 0, 0
        n_max = self.data.train.n_max
        cohort = getattr(algo, "cohort_size", None) or self.data.num_clients
        steps = algo.steps_per_round(n_max)
        return cohort * steps, cohort * steps * algo.plan().width(n_max)

    # ---------------------------------------------------------------------------------------------- state
    def init(self) -> State:
        key = jax.random.PRNGKey(self.seed)
        ctx = RoundContext(self.executor, self.data, jnp.int32(0), jax.random.fold_in(key, 0))
        server, clients = self.algorithm.init(ctx)
        return State(server=server, clients=clients, round=jnp.int32(0), key=key)

    # ---------------------------------------------------------------------------------------------- rounds
    def _round(self, state: State, data: FederatedData):
        ctx = RoundContext(self.executor, data, state.round, _round_key(state.key, state.round))
        server, clients, metrics = self.algorithm.round(ctx, state.server, state.clients)
        metrics = dict(metrics)
        loss_ok = jnp.all(jnp.isfinite(metrics.get("train_loss", jnp.float32(0))))
        metrics["finite"] = tree.all_finite((server, clients)) & loss_ok
        return State(server=server, clients=clients, round=state.round + 1, key=state.key), metrics

    def _block(self, state: State, data: FederatedData, n: int):
        return jax.lax.scan(lambda s, _: self._round(s, data), state, None, length=n)

    def _evaluate(self, state: State, data: FederatedData):
        ctx = RoundContext(self.executor, data, state.round, _round_key(state.key, state.round))
        return evaluate(self.algorithm, ctx, state.server, state.clients)

    def _compiled_fn(self, name: str, fn: Callable, args, static: tuple = ()):
        """AOT-compile ``fn`` once per (name, static) and account the compile time."""
        key = (name,) + static
        if key not in self._compiled:
            t0 = time.perf_counter()
            self._compiled[key] = jax.jit(fn).lower(*args).compile()
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
                state, m = self._round(state, self.data)
                outs.append(m)
            metrics = tree.stack(outs)
        else:
            fn = self._compiled_fn("block", lambda s, d: self._block(s, d, n), (state, self.data), (n,))
            state, metrics = fn(state, self.data)
        return state, (metrics if stack else jax.tree.map(lambda x: x[0], metrics))

    def evaluate(self, state: State) -> tuple[dict, dict]:
        """(scalar summaries, per-client accuracies) of the global and personalized models."""
        if not self.executor.jittable:
            return self._evaluate(state, self.data)
        return self._compiled_fn("evaluate", self._evaluate, (state, self.data))(state, self.data)

    # ---------------------------------------------------------------------------------------------- run
    def run(self, rounds: int, eval_every: int | None = None, state: State | None = None,
            callback: Callable[[dict, State], None] | None = None, progress: bool = True,
            stop_on_nonfinite: bool = True) -> RunResult:
        """Run until ``rounds`` rounds are done, evaluating every ``eval_every`` rounds (default: about 10 times)
        and at the end. ``callback(record, state)`` runs after every evaluation."""
        state = state if state is not None else self.init()
        eval_every = eval_every or max(1, math.ceil(rounds / 10))
        start = int(state.round)
        history: list[dict] = []
        per_client: dict = {}
        totals = {"bytes_up": 0.0, "bytes_down": 0.0}
        bar = _progress_bar(rounds, start, progress)
        run_seconds = 0.0
        try:
            while int(state.round) < rounds:
                r = int(state.round)
                n = min(eval_every - r % eval_every, rounds - r)
                t0, c0 = time.perf_counter(), self.compile_seconds
                state, metrics = self.run_rounds(state, n)
                jax.block_until_ready(state)
                summary, per_client = self.evaluate(state)
                summary, metrics = jax.device_get((summary, metrics))
                run_seconds += time.perf_counter() - t0 - (self.compile_seconds - c0)  # compile time apart
                for k in totals:
                    totals[k] += float(np.sum(metrics.get(k, 0.0)))
                record = {"round": int(state.round), **{k: float(v) for k, v in summary.items()},
                          "train_loss": float(np.mean(metrics["train_loss"])),
                          "bytes_up": totals["bytes_up"], "bytes_down": totals["bytes_down"],
                          "wall_seconds": run_seconds}
                history.append(record)
                if bar is not None:
                    bar.update(n)
                    bar.set_postfix(_postfix(record))
                if stop_on_nonfinite and not np.all(metrics["finite"]):
                    bad = r + int(np.argmin(metrics["finite"])) + 1
                    raise NonFiniteError(f"round {bad} produced NaN/Inf (train_loss "
                                         f"{float(np.ravel(metrics['train_loss'])[bad - r - 1]):.4g}); lower the "
                                         f"learning rate or check the data.")
                if callback is not None:
                    callback(record, state)
        finally:
            if bar is not None:
                bar.close()
        return RunResult(state, history, jax.device_get(per_client), self.compile_seconds, run_seconds)


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True, leave=False)


def _postfix(record: dict) -> dict:
    out = {"loss": f"{record['train_loss']:.3f}"}
    if "personal_acc" in record:
        out["pers"] = f"{record['personal_acc']:.3f}"
    if "global_acc" in record:
        out["glob"] = f"{record['global_acc']:.3f}"
    return out
