"""The driver FedGiA and its baselines share on regression problems (spec §4, §10.6–10.7).

A method is a pytree (``flax.struct`` dataclass) whose hyperparameters (k0, α, step sizes) are leaves, so changing
them does not recompile; its structure (loss, conventions, caps) is static. It provides

* ``prepare(executor, data) -> consts`` — per-trial precomputation (FedGiA: r_i, σ, factorisations);
* ``init(consts, data) -> S`` — the per-client state at x_i⁰ = 0;
* ``aggregate(consts, data, S) -> x`` — the point where the round's metrics are measured (FedGiA (11));
* ``local(executor, consts, data, S, x, g, key, s, k) -> S`` — round s's local work, given ∇f_i(x) for every
  client, the round's key and the local iterations k done so far;
* ``capped(s, k)`` — the iteration cap, and ``history_length`` — a static bound on the rounds + 1.

One round (:func:`round_step`), for s = 0, 1, 2, …::

    x ← aggregate(S);  (f_i(x), ∇f_i(x)) for every client (the executor's map_clients)
    F ← mean_i f_i(x);  E ← Error(∇f(x));  if s = 0: tol ← tol rule(E)
    if E ≤ tol, or the cap is reached, or E is not finite: stop with Obj = F, CR = s
    S ← local(S, x, ∇f_i(x));  k ← k + k0 (the round's local iterations);  s ← s + 1

:func:`solve` runs it in a ``lax.while_loop`` vmapped over trials; the body applies ``where(done, old, new)`` to the
whole state, so a finished trial is frozen while the others go on. Under a non-jittable executor (the per-client
loop) the same round runs eagerly, one trial at a time.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

from fljax import tree
from fljax.engine.executors import Executor, make_executor
from fljax.problems.fedgia_data import ClientBlocks
from fljax.problems.regression import LeastSquares, Loss, map_blocks

__all__ = ["Conventions", "Method", "RunState", "Result", "init_run", "round_step", "prepare", "solve", "paper_tol0",
           "trial_keys"]


@dataclasses.dataclass(frozen=True)
class Conventions:
    """Error, tolerance and CR conventions (spec §4, decisions D1–D3).

    * ``error``: ``"code"`` Error = ‖∇f(x)‖²/m² (reference code, default) or ``"paper"`` ‖∇f(x)‖² (35);
    * ``tol_rule``: ``"min"`` tol = min(tol0, 0.1·Error(x⁰)) (default) or ``"fixed"`` tol = tol0;
    * ``stop_cmp``: ``"le"`` stop when Error ≤ tol (default) or ``"lt"`` Error < tol;
    * ``cr``: ``"rounds"`` CR = ⌈k/k0⌉ = completed rounds (default) or ``"paper_eq31"`` ⌊2k/k0⌋ (31).

    ``Conventions.preset("paper")`` switches all four to the paper-literal definitions.
    """

    error: str = "code"
    tol_rule: str = "min"
    stop_cmp: str = "le"
    cr: str = "rounds"

    CHOICES: ClassVar[dict] = {"error": ("code", "paper"), "tol_rule": ("min", "fixed"), "stop_cmp": ("le", "lt"),
                               "cr": ("rounds", "paper_eq31")}

    def __post_init__(self):
        for key, allowed in self.CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"conventions.{key} must be one of {allowed}, got {getattr(self, key)!r}.")

    @classmethod
    def preset(cls, name: str) -> "Conventions":
        """``"code"``: the reference-code conventions behind Table IV; ``"paper"``: (35), tol0, (31)."""
        if name == "code":
            return cls()
        if name == "paper":
            return cls(error="paper", tol_rule="fixed", stop_cmp="le", cr="paper_eq31")
        raise ValueError(f"unknown conventions preset {name!r}; choose 'code' or 'paper'.")

    def error_of(self, grad, m: int):
        sq = jnp.sum(jnp.square(grad))
        return sq / m ** 2 if self.error == "code" else sq

    def initial_tol(self, tol0, error0):
        return jnp.minimum(tol0, 0.1 * error0) if self.tol_rule == "min" else jnp.asarray(tol0, error0.dtype)

    def reached(self, error, tol):
        return error <= tol if self.stop_cmp == "le" else error < tol

    def cr_of(self, rounds):
        return rounds if self.cr == "rounds" else 2 * rounds


def paper_tol0(loss: Loss, d):
    """§V-B: tol0 = 10⁻⁷ for Example V.1 (least squares), 5·10⁻⁶/d for Examples V.2 and V.3 (d = Σ_i d_i)."""
    return 1e-7 if isinstance(loss, LeastSquares) else 5e-6 / d


@flax.struct.dataclass
class Method:
    """Base of the regression methods: ``loss`` and ``conventions`` are static; ``k0`` (local steps per round) and
    ``tol0`` (None → :func:`paper_tol0`) are leaves."""

    loss: Loss = flax.struct.field(pytree_node=False, default_factory=LeastSquares)
    conventions: Conventions = flax.struct.field(pytree_node=False, default_factory=Conventions)
    k0: Any = 1
    tol0: Any = None

    name: ClassVar[str] = "method"

    def validate(self) -> None:
        if isinstance(self.k0, (int, np.integer)) and self.k0 < 1:
            raise ValueError(f"k0 must be a positive integer, got {self.k0}.")
        if self.tol0 is not None and np.ndim(self.tol0) == 0 and float(self.tol0) <= 0:
            raise ValueError(f"tol0 must be positive, got {self.tol0}.")

    # ------------------------------------------------------------------------------------- protocol
    def prepare(self, executor: Executor, data: ClientBlocks):
        return None

    def host_seconds(self, data: ClientBlocks) -> np.ndarray:
        """Per-trial host time spent on this method's precomputation while packing the data (default none)."""
        return np.zeros(data.num_trials)

    def init(self, consts, data: ClientBlocks):
        raise NotImplementedError

    def aggregate(self, consts, data: ClientBlocks, state):
        raise NotImplementedError

    def local(self, executor: Executor, consts, data: ClientBlocks, state, x, g, key, s, k):
        raise NotImplementedError

    def capped(self, s, k):
        raise NotImplementedError

    def iterations(self, state):
        """Local iterations of the round that produced ``state`` (k0; FedPD's random aggregation overrides)."""
        return self.k0

    @property
    def history_length(self) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------- shared pieces
    def client_value_grad(self, x, per_client):
        """(f_i(x), ∇f_i(x)) of one client (the executor's ``fn``)."""
        blk, _, _ = per_client
        return self.loss.value_and_grad(x, blk)


@flax.struct.dataclass
class RunState:
    """One trial's driver state: the method's ``alg`` state, completed rounds ``s``, local iterations ``k``, the
    tolerance, flags, the last metrics and per-round histories (index s; NaN beyond the stop)."""

    alg: Any
    s: jax.Array
    k: jax.Array
    tol: jax.Array
    done: jax.Array
    converged: jax.Array
    diverged: jax.Array
    obj: jax.Array
    err: jax.Array
    x: jax.Array
    hist_f: jax.Array
    hist_e: jax.Array


def init_run(method: Method, consts, data: ClientBlocks) -> RunState:
    n, dtype = data.dim, data.blocks[0].A.dtype
    nan = jnp.full((method.history_length,), jnp.nan, dtype)
    false = jnp.zeros((), bool)
    zero = jnp.zeros((), dtype)
    return RunState(alg=method.init(consts, data), s=jnp.zeros((), jnp.int32), k=jnp.zeros((), jnp.int32),
                    tol=zero, done=false, converged=false, diverged=false, obj=zero, err=zero,
                    x=jnp.zeros((n,), dtype), hist_f=nan, hist_e=nan)


def _total_rows(data: ClientBlocks):
    return sum(jnp.sum(blk.d) for blk in data.blocks)


def round_step(method: Method, executor: Executor, consts, data: ClientBlocks, key, run: RunState) -> RunState:
    """One round of one trial (module docstring); a finished trial is returned unchanged."""
    conv = method.conventions
    m = data.num_clients
    x = method.aggregate(consts, data, run.alg)
    f_i, g_i = map_blocks(executor, method.client_value_grad, x, data.blocks)
    obj = jnp.mean(f_i)
    err = conv.error_of(jnp.mean(g_i, axis=0), m)
    tol0 = paper_tol0(method.loss, _total_rows(data)) if method.tol0 is None else method.tol0
    tol = jnp.where(run.s == 0, conv.initial_tol(tol0, err), run.tol)
    converged = conv.reached(err, tol)
    diverged = ~jnp.isfinite(err)
    stop = converged | diverged | method.capped(run.s, run.k)
    alg = method.local(executor, consts, data, run.alg, x, g_i, jax.random.fold_in(key, run.s), run.s, run.k)
    go = (~stop).astype(jnp.int32)
    steps = jnp.asarray(method.iterations(alg), jnp.int32)
    new = RunState(alg=tree.where(stop, run.alg, alg), s=run.s + go, k=run.k + go * steps,
                   tol=tol, done=stop, converged=converged & ~diverged, diverged=diverged, obj=obj, err=err, x=x,
                   hist_f=run.hist_f.at[run.s].set(obj), hist_e=run.hist_e.at[run.s].set(err))
    return tree.where(run.done, run, new)


def _solve_one(method: Method, executor: Executor, data: ClientBlocks, key, consts) -> RunState:
    run = init_run(method, consts, data)
    return jax.lax.while_loop(lambda r: ~r.done, lambda r: round_step(method, executor, consts, data, key, r), run)


@dataclasses.dataclass
class Result:
    """Per-trial outcomes (host NumPy arrays with a leading trial axis).

    ``obj``/``err``: f and Error at the aggregate where the run stopped; ``rounds`` = s; ``cr`` per the conventions;
    ``iters`` = k; ``converged`` (Error ≤ tol), ``diverged`` (non-finite Error), otherwise the cap was hit;
    ``x`` the final aggregate; ``hist_f``/``hist_e`` per round (NaN after the stop); ``seconds`` the wall clock
    per trial of the compiled solve, ``prep_seconds`` of the compiled precomputation (both exclude compilation).
    """

    obj: np.ndarray
    err: np.ndarray
    rounds: np.ndarray
    cr: np.ndarray
    iters: np.ndarray
    converged: np.ndarray
    diverged: np.ndarray
    x: np.ndarray
    hist_f: np.ndarray
    hist_e: np.ndarray
    seconds: np.ndarray
    prep_seconds: np.ndarray

    @property
    def capped(self) -> np.ndarray:
        return ~(self.converged | self.diverged)

    @classmethod
    def concatenate(cls, parts: list["Result"]) -> "Result":
        """Join results of consecutive trial chunks."""
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)})


def trial_keys(seed0: int, trials: int):
    """Selection keys: ``fold_in(PRNGKey(seed0), t)`` for trial t (spec §10.7)."""
    base = jax.random.PRNGKey(seed0)
    return jnp.stack([jax.random.fold_in(base, t) for t in range(trials)])


def _executor(executor) -> Executor:
    return make_executor(executor) if isinstance(executor, str) else executor


def _index(a, t):
    """Trial t of a pytree with a leading trial axis (the axis removed)."""
    return jax.tree.map(lambda x: x[t], a)


def _prepare_batch(ex: Executor, method: Method, data: ClientBlocks):
    return jax.vmap(lambda d: method.prepare(ex, d))(data)


def _solve_batch(ex: Executor, method: Method, data: ClientBlocks, keys, consts):
    return jax.vmap(lambda d, k, c: _solve_one(method, ex, d, k, c))(data, keys, consts)


_EXECUTABLES: dict = {}


def _one_blas_thread():
    """XLA:CPU's LAPACK kernels (Cholesky, triangular solves) call SciPy's OpenBLAS; with OpenBLAS's own thread pool,
    concurrent calls from XLA's threads deadlocked (the Woodbury solves of qot's size classes). One BLAS thread."""
    return threadpoolctl.threadpool_limits(1, user_api="blas")


def _run_compiled(fn, ex: Executor, *args):
    """``fn(ex, *args)`` jitted, compiled ahead of time once per (fn, executor, structure, shapes) and cached, so
    the returned wall clock excludes compilation (D20). Returns (output, seconds)."""
    leaves, treedef = jax.tree.flatten(args)
    key = (fn, ex, treedef, tuple((np.shape(x), np.dtype(x.dtype)) for x in leaves))
    if key not in _EXECUTABLES:
        _EXECUTABLES[key] = jax.jit(lambda *a: fn(ex, *a)).lower(*args).compile()
    with _one_blas_thread():
        start = time.perf_counter()
        out = jax.block_until_ready(_EXECUTABLES[key](*args))
        return out, time.perf_counter() - start


def _leaves_as_arrays(method: Method) -> Method:
    """Hyperparameter leaves as NumPy arrays (fixed dtypes: the compiled executables are reused across values)."""
    return jax.tree.map(np.asarray, method)


def prepare(method: Method, data: ClientBlocks, executor: Executor | str = "vmap"):
    """``method``'s per-trial constants (trial axis first, or None) and the seconds per trial they took (compiled
    program time split evenly over the trials, plus :meth:`Method.host_seconds`)."""
    ex = _executor(executor)
    with jax.enable_x64(True):
        if not ex.jittable:
            start = time.perf_counter()
            with _one_blas_thread():
                outs = [jax.block_until_ready(method.prepare(ex, _index(data, t))) for t in range(data.num_trials)]
            consts = None if outs[0] is None else tree.stack(outs)
            seconds = time.perf_counter() - start
        else:
            consts, seconds = _run_compiled(_prepare_batch, ex, _leaves_as_arrays(method), jax.device_put(data))
        return consts, seconds / data.num_trials + method.host_seconds(data)


def solve(method: Method, data: ClientBlocks, *, seed0: int = 0, keys=None, executor: Executor | str = "vmap",
          consts=None, trial_chunk: int | None = None) -> Result:
    """Run ``method`` on every trial of ``data`` (float64; x64 is switched on for the call only).

    Trials run vmapped in chunks of ``trial_chunk`` (default: all at once), each chunk moved to the device, prepared
    (:func:`prepare`) and solved in turn; a chunk's compiled wall clock is split evenly over its trials, so
    ``trial_chunk=1`` gives per-trial times (D20) and larger chunks the ``batched`` time. ``consts`` from
    :func:`prepare` (for all of ``data``'s trials) may be passed to share one precomputation between runs; its time is
    then not in ``prep_seconds``. ``keys`` default to :func:`trial_keys` (``seed0``). Under the loop executor every
    trial runs eagerly on its own.
    """
    method.validate()
    ex = _executor(executor)
    trials = data.num_trials
    chunk = 1 if not ex.jittable else trials if trial_chunk is None else max(1, min(trial_chunk, trials))
    parts = []
    with jax.enable_x64(True):
        keys = trial_keys(seed0, trials) if keys is None else jnp.asarray(keys)
        for lo in range(0, trials, chunk):
            part = lambda a: None if a is None else jax.tree.map(lambda x: x[lo:lo + chunk], a)
            sub = jax.device_put(part(data))
            if consts is None:
                sub_consts, prep = prepare(method, sub, ex)
            else:
                sub_consts, prep = part(consts), np.zeros(sub.num_trials)
            if ex.jittable:
                run, sec = _run_compiled(_solve_batch, ex, _leaves_as_arrays(method), sub, part(keys), sub_consts)
            else:
                start = time.perf_counter()
                with _one_blas_thread():
                    run = tree.stack([_eager_solve(method, ex, _index(sub, 0), keys[lo], _index(sub_consts, 0))])
                sec = time.perf_counter() - start
            parts.append(_result(method, jax.device_get(run), sec, prep))
    return Result.concatenate(parts)


def _result(method: Method, run: RunState, seconds: float, prep_seconds) -> Result:
    trials = run.s.shape[0]
    return Result(obj=run.obj, err=run.err, rounds=run.s, cr=np.asarray(method.conventions.cr_of(run.s)),
                  iters=run.k, converged=run.converged, diverged=run.diverged, x=run.x, hist_f=run.hist_f,
                  hist_e=run.hist_e, seconds=np.full(trials, seconds / trials), prep_seconds=np.asarray(prep_seconds))


def _eager_solve(method: Method, ex: Executor, data: ClientBlocks, key, consts) -> RunState:
    """The same rounds without jit (for the per-client loop executor)."""
    run = init_run(method, consts, data)
    while not bool(run.done):
        run = round_step(method, ex, consts, data, key, run)
    return run
