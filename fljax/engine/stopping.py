"""Run rounds until a stopping rule fires: one run, or every lane of a :class:`~fljax.engine.Lanes`, as one compiled
``lax.while_loop``.

Papers that count "rounds to reach a tolerance" (FedGiA's CR in Table IV) run an algorithm until a rule on the
metrics its rounds report says stop, or a cap is reached. A round (``Simulation.round_fn``: the algorithm's
``round``) returns the next state and its metrics m_s; for this driver m_s should describe the state the round
*starts* from (FedGiA: f and Error at the aggregate x^s formed at the start of round s). With a
:class:`Stopping` (the rule, the caps and the metrics to keep), the driver runs::

    S ← init;  s ← 0;  k ← 0                                   s: completed rounds, k: local iterations
    repeat:
        S', m_s ← round(S)
        if s = 0:  r ← rule.init(m_s)                           e.g. tol = min(tol0, 0.1·Error(x⁰))
        converged ← rule.reached(r, m_s)                        e.g. Error(x^s) ≤ tol
        diverged  ← a recorded metric of m_s is not finite      (the rule's metric and ``track``)
        capped    ← s ≥ max_rounds  or  k ≥ max_iters
        history[s] ← the recorded metrics of m_s
        if converged or diverged or capped: stop (S is kept: the stopping round's work is discarded)
        S ← S';  s ← s + 1;  k ← k + m_s[steps_metric]

At the stop, S is the state the last metrics describe, s the completed rounds and k the local iterations (the sum
of the rounds' ``steps_metric``, e.g. FedGiA's k0 per round). The history holds max_rounds + 1 entries per recorded
metric, NaN after the stop (for the papers' figures).

Lanes (seeds, trials with their own data, points of a hyperparameter grid: :class:`~fljax.engine.Lanes`): the
loop is vmapped over the lane axis and runs until every lane has stopped; the body applies
``where(done, old, new)`` to the whole carry, so a lane that has stopped is frozen bit for bit while the others go
on, and each lane ends exactly where its own run would.

Compilation and time: the loop is compiled through the simulation's compile cache (``Simulation.compiled``:
one program per structure and shapes; traced hyperparameters and the rule's parameters are arguments, so a grid of
them reuses it) and timed apart from compilation; the initial state (the algorithm's ``init``, e.g. FedGiA's
precomputation) is timed apart too (``init_seconds``). The first run of a freshly compiled ``init`` is a warm-up
and not timed: it took about twice as long as the next ones (FedGiA on V.1: 1.1 s against 0.57 s for 20 lanes),
which made the first point of every grid look slow; the loop's first run showed no such cost (≤ 1 ms per lane). Under
the loop executor the same body runs eagerly, one round at a time.

    rule = Stopping(Tolerance(tol0=1e-7, metric="error"), max_rounds=1000, track=("train_loss",))
    res = run_until(Simulation(FedGiA(k0=5), data, executor="vmap"), rule)
    res.rounds, res.converged, res.metrics["train_loss"], res.history["error"]
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.engine import blas
from fljax.engine.driver import Simulation
from fljax.engine.lanes import Lanes
from fljax.engine.state import State
from fljax.errors import OptionError
from fljax.models.model import precision_scope

__all__ = ["StoppingRule", "Tolerance", "Stopping", "Progress", "StopResult", "run_until", "start", "step"]


class StoppingRule(Protocol):
    """A stopping rule: pure functions of the metrics of a round. ``metric`` names the metric it reads (recorded
    in the history and checked for divergence); ``init(metrics)`` is the rule's state after round 0 (a pytree);
    ``reached(state, metrics)`` whether round s's metrics satisfy it (a traced boolean)."""

    metric: str

    def init(self, metrics: dict) -> Any: ...

    def reached(self, state: Any, metrics: dict) -> jax.Array: ...


@flax.struct.dataclass
class Tolerance:
    """Stop when ``metrics[metric]`` ≤ tol (< tol with ``strict``), the tolerance fixed at round 0 as
    tol = min(tol0, relative·metric₀), or tol0 with ``relative=None``. ``tol0`` and ``relative`` are traced
    (changing them reuses the compiled program); ``metric`` and ``strict`` are static."""

    tol0: Any
    relative: Any = 0.1
    metric: str = flax.struct.field(pytree_node=False, default="error")
    strict: bool = flax.struct.field(pytree_node=False, default=False)

    def validate(self) -> None:
        for key in ("tol0", "relative"):
            value = getattr(self, key)
            if value is not None and np.ndim(value) == 0 and not float(value) > 0:
                raise OptionError(key, f"must be > 0, got {value}.")

    def init(self, metrics: dict):
        value = metrics[self.metric]
        if self.relative is None:
            return jnp.asarray(self.tol0, value.dtype)
        return jnp.minimum(self.tol0, self.relative * value)

    def reached(self, tol, metrics: dict):
        value = metrics[self.metric]
        return value < tol if self.strict else value <= tol


@flax.struct.dataclass
class Stopping:
    """When a run stops: ``rule`` (a :class:`StoppingRule`; its fields may be traced), at most ``max_rounds``
    rounds, optionally at most ``max_iters`` local iterations (counted from the rounds' ``steps_metric``), and the
    metrics kept per round besides the rule's (``track``)."""

    rule: Any
    max_rounds: int = flax.struct.field(pytree_node=False, default=1000)
    max_iters: int | None = flax.struct.field(pytree_node=False, default=None)
    track: tuple = flax.struct.field(pytree_node=False, default=())
    steps_metric: str = flax.struct.field(pytree_node=False, default="local_steps")

    @property
    def recorded(self) -> tuple:
        """The metrics kept per round: the rule's, then ``track``."""
        return tuple(dict.fromkeys((self.rule.metric, *self.track)))

    def validate(self) -> None:
        if not (isinstance(self.max_rounds, (int, np.integer)) and self.max_rounds >= 1):
            raise OptionError("max_rounds", f"must be a positive integer, got {self.max_rounds!r}.")
        if self.max_iters is not None and not (isinstance(self.max_iters, (int, np.integer)) and self.max_iters >= 1):
            raise OptionError("max_iters", f"must be a positive integer or None, got {self.max_iters!r}.")
        if hasattr(self.rule, "validate"):
            self.rule.validate()


@flax.struct.dataclass
class Progress:
    """The loop's carry: the simulation ``state``, the ``rule``'s state, completed ``rounds`` s, local ``iters`` k,
    the flags, the last round's recorded ``metrics`` and their ``history`` (index s, NaN beyond the stop)."""

    state: State
    rule: Any
    rounds: jax.Array
    iters: jax.Array
    done: jax.Array
    converged: jax.Array
    diverged: jax.Array
    metrics: dict
    history: dict


@dataclasses.dataclass
class StopResult:
    """The outcome (host arrays; with a leading lane axis for :class:`Lanes`).

    ``rounds`` completed rounds s at the stop (FedGiA's CR); ``iters`` local iterations k; ``converged`` (the rule
    was met), ``diverged`` (a recorded metric was not finite), otherwise capped; ``metrics`` the recorded metrics of
    the stopping round (they describe ``state``); ``history`` per round ``[..., max_rounds + 1]``, NaN after the
    stop; ``state`` the final state (on the device); ``seconds`` the wall clock of the compiled loop and
    ``init_seconds`` of the initial state (all lanes together, compilation apart); ``compile_seconds`` the
    compilation this call did."""

    rounds: np.ndarray
    iters: np.ndarray
    converged: np.ndarray
    diverged: np.ndarray
    metrics: dict
    history: dict
    state: State
    seconds: float
    init_seconds: float
    compile_seconds: float

    @property
    def capped(self) -> np.ndarray:
        return ~(self.converged | self.diverged)


def start(sim: Simulation, stopping: Stopping, state: State, data, hp) -> Progress:
    """The carry before round 0 (the metrics' structure and dtypes come from tracing one round)."""
    _, metrics = jax.eval_shape(sim.round_fn, state, data, hp)
    needed = stopping.recorded + ((stopping.steps_metric,) if stopping.max_iters is not None else ())
    missing = [name for name in needed if name not in metrics]
    if missing:
        raise ValueError(f"the rounds of {type(sim.algorithm).__name__} report no metric {missing[0]!r} (they report "
                         f"{sorted(metrics)}).")
    recorded = {k: metrics[k] for k in stopping.recorded}
    rule = jax.eval_shape(stopping.rule.init, recorded)
    zeros = lambda s: jnp.zeros(s.shape, s.dtype)
    false = jnp.zeros((), bool)
    return Progress(state=state, rule=jax.tree.map(zeros, rule), rounds=jnp.int32(0), iters=jnp.int32(0),
                    done=false, converged=false, diverged=false, metrics=jax.tree.map(zeros, recorded),
                    history={k: jnp.full((stopping.max_rounds + 1,), jnp.nan, v.dtype) for k, v in recorded.items()})


def step(sim: Simulation, stopping: Stopping, carry: Progress, data, hp) -> Progress:
    """One round of the loop (module docstring); a carry that is done is returned unchanged."""
    new_state, metrics = sim.round_fn(carry.state, data, hp)
    recorded = {k: metrics[k] for k in stopping.recorded}
    rule = tree.where(carry.rounds == 0, stopping.rule.init(recorded), carry.rule)
    converged = stopping.rule.reached(rule, recorded)
    diverged = ~tree.all_finite(recorded)
    capped = carry.rounds >= stopping.max_rounds
    if stopping.max_iters is not None:
        capped = capped | (carry.iters >= stopping.max_iters)
    stop = converged | diverged | capped
    go = (~stop).astype(jnp.int32)
    steps = jnp.asarray(metrics.get(stopping.steps_metric, 0), jnp.int32)
    new = Progress(state=tree.where(stop, carry.state, new_state), rule=rule, rounds=carry.rounds + go,
                   iters=carry.iters + go * steps, done=stop, converged=converged & ~diverged, diverged=diverged,
                   metrics=recorded,
                   history={k: h.at[carry.rounds].set(recorded[k]) for k, h in carry.history.items()})
    return tree.where(carry.done, carry, new)


def _loop(sim: Simulation, stopping: Stopping, state: State, data, hp) -> Progress:
    carry = start(sim, stopping, state, data, hp)
    return jax.lax.while_loop(lambda c: ~c.done, lambda c: step(sim, stopping, c, data, hp), carry)


def _eager_loop(sim: Simulation, stopping: Stopping, state: State, data, hp) -> Progress:
    """The same rounds without jit (the loop executor dispatches per client)."""
    carry = start(sim, stopping, state, data, hp)
    while not bool(carry.done):
        carry = step(sim, stopping, carry, data, hp)
    return carry


def _precise(fn, *args):
    """``fn(*args)`` traced with exact float32 products outside the model, as the compiled programs are."""
    with precision_scope("fp32"):
        return fn(*args)


def _timed(fn, *args):
    """(``fn(*args)`` with its outputs ready, wall seconds)."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def run_until(runner: Simulation | Lanes, stopping: Stopping, *, seed: int | None = None, hp: dict | None = None,
              state: State | None = None) -> StopResult:
    """Run ``runner`` (one :class:`Simulation`, or every lane of a :class:`Lanes`) until ``stopping`` says stop
    (module docstring). A single run starts from ``state`` or ``Simulation.init(seed, hp)``; lanes from
    ``state`` (stacked) or ``Lanes.init()``."""
    stopping.validate()
    lanes = isinstance(runner, Lanes)
    sim = runner.sim if lanes else runner
    compile0 = sim.compile_seconds
    init_seconds = 0.0
    if state is None:
        init = (lambda: runner.init()) if lanes else (lambda: sim.init(seed, hp))
        state, init_seconds = _timed(init)
        if sim.compile_seconds > compile0:      # compiled now: that run was the warm-up, time another one
            state, init_seconds = _timed(init)
    static = (stopping.max_rounds, stopping.max_iters, stopping.track, stopping.steps_metric)
    if lanes:
        data, hp = runner.data, runner.hp
        fn = jax.vmap(lambda s, d, h, r: _loop(sim, stopping.replace(rule=r), s, d, h),
                      in_axes=(0, runner.data_axis, None if hp is None else 0, None))
        out, seconds = _timed(sim.compiled("lanes_until", fn, (state, data, hp, stopping.rule), static,
                                               len(runner.seeds)),
                              state, data, hp, stopping.rule)
    elif sim.executor.jittable:
        data = sim.data
        fn = lambda s, d, h, r: _loop(sim, stopping.replace(rule=r), s, d, h)
        out, seconds = _timed(sim.compiled("until", fn, (state, data, hp, stopping.rule), static),
                              state, data, hp, stopping.rule)
    else:
        out, seconds = _timed(lambda: _precise(blas.call, _eager_loop, sim, stopping, state, sim.data, hp))
    host = jax.device_get((out.rounds, out.iters, out.converged, out.diverged, out.metrics, out.history))
    return StopResult(*host, state=out.state, seconds=seconds, init_seconds=init_seconds,
                      compile_seconds=sim.compile_seconds - compile0)
