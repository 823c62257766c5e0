"""Hypergradients of whole federated runs, and tuning by gradient (issue 39; docs/tuning.md).

Once its key k fixes every cohort, batch and draw, a run is one pure function of its traced hyperparameters h
(:meth:`fljax.engine.Simulation.algorithm_at`: the values a grid of lanes already traces):

    s_0 = init(k, h),   s_{t+1} = round_t(s_t, h)   (t = 0 … T−1),
    L(h) = (1/m) Σ_{t=T−m+1}^{T} metric(evaluate(s_t, D_eval, h))

with D_eval the clients' validation split (rows held out of their training split, :func:`holdout`), their test
split or their training split, and metric an evaluation loss (``global_loss``, ``personal_loss``, their
sample-weighted forms). :class:`RunObjective` compiles L and dL/dh from the simulation's pure functions
(``init_fn``, ``round_fn``, ``evaluate_fn``); nothing of an algorithm is written again here:

* reverse mode (``jax.value_and_grad``), one backward sweep for any number of hyperparameters. The sweep needs
  every round's intermediate values; ``remat`` (:data:`REMAT`) says which are stored: 'none' all of them (memory
  ∝ T × one round's activations: every client's local steps), 'round' only the T states, each round recomputed
  when the sweep reaches it (``jax.checkpoint`` per round: memory ∝ T × one state + one round's activations, one
  extra forward pass), 'block' only the states at the ends of blocks of B = ⌈√T⌉ rounds, each block recomputed
  round by round (two-level checkpointing, Griewank 1992: memory ∝ (T/B + B) states + one round, two extra passes);
* forward mode (``jax.jvp`` along the k unit tangents, vmapped, i.e. ``jax.jacfwd``): nothing stored, memory
  independent of T, about k + 1 times a run's arithmetic, for a handful of hyperparameters.

Both are exact derivatives of the same computation; tests/test_hypergrad.py checks them against each other and
against central finite differences of the whole run under the same key. What has no gradient is refused, in one
line, before anything compiles: a discrete hyperparameter (an int, bool, string or choice: ``fljax sweep`` compares
its values), a null one, one that Python control flow reads (it cannot be traced), a piecewise-constant metric (an
accuracy). A hyperparameter whose gradient comes out exactly zero does not enter the metric differentiably in this
run (a clip norm no gradient reaches, a median, a value the algorithm ignores here): :attr:`Hypergradient.zero`
names it.

Tuning (:func:`tune`): hypergradient descent in u = log h for positive hyperparameters (rates, μ, λ, clip norms),
u = logit h for those in (0, 1) (the server optimizer's β's), u = h otherwise (:func:`space_of`): steps of length α
along −∇_u L, each accepted only where the run of the same key is better (backtracking), the key re-drawn every step
(``keys='redraw'``, so the values do not fit one draw of cohorts and batches) or ``'fixed'``.
:func:`grid_search` evaluates a grid of points as lanes of one compiled program (vmap over the traced values, as
:class:`fljax.engine.Lanes` runs a sweep), for comparisons at equal cost (fljax/reproduce/tuning.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np

from fljax.aggregation import CLIENT_WEIGHTS
from fljax.algorithms.local_training import scanned_steps
from fljax.data.federated import ClientArrays, FederatedData, pad_clients
from fljax.data.ragged import RaggedArrays
from fljax.engine.driver import Simulation
from fljax.errors import ConfigError, OptionError
from fljax.options import declared, suggest

__all__ = ["REMAT", "MODES", "SPLITS", "SPACES", "holdout", "traced_key", "config_key", "space_of", "RunObjective",
           "Hypergradient", "TuneStep", "TuneResult", "tune", "grid_search", "client_steps", "zero_note",
           "objective_of", "check_tuning", "trajectory_table", "plot_trajectory", "plot_surface", "continuous_keys"]

REMAT = ("none", "round", "block")  # what reverse mode stores (module docstring)
MODES = ("reverse", "forward")
SPLITS = ("val", "test", "train")  # the split the metric is evaluated on
SPACES = ("log", "logit", "linear")  # where tuning steps: u = log h, logit h or h
KEYS = ("redraw", "fixed")


# ---------------------------------------------------------------------------------------------------- data


def holdout(data: FederatedData, fraction: float, seed: int = 0) -> tuple[FederatedData, ClientArrays]:
    """``(data with the validation rows removed from every client's training split, the validation split)``: a
    uniformly random ``fraction`` of each client's n_i training rows, round(fraction · n_i) of them, at least one
    and at most n_i − 1 (a client with one row keeps it and has an empty validation split, left out of the
    summaries as an empty test split is). Rows keep their order; the draw is ``numpy.random.default_rng(seed)``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise OptionError("val_fraction", f"must be in (0, 1): the share of each client's training rows held out "
                                          f"for validation, got {fraction!r}.")
    train = data.train
    if isinstance(train, RaggedArrays) or train.support is not None or data.num_target:
        raise ConfigError("a validation split is held out of padded client arrays without support sets or target "
                          "clients; use data.storage: padded and a partition without support/query sets, or "
                          "evaluate on the test split (split='test').")
    x, y, count = np.asarray(train.x), np.asarray(train.y), np.asarray(train.count)
    rng = np.random.default_rng(seed)
    kept, held = [], []
    for i, n in enumerate(count):
        k = min(max(int(round(fraction * n)), 1), n - 1) if n >= 2 else 0
        order = rng.permutation(int(n))
        kept.append(np.sort(order[k:]))
        held.append(np.sort(order[:k]))

    def arrays(rows):
        return pad_clients([x[i][r] for i, r in enumerate(rows)], [y[i][r] for i, r in enumerate(rows)],
                           x_dtype=x.dtype, n_max=max(1, max(len(r) for r in rows)))

    return data.replace(train=arrays(kept)), arrays(held)


# ---------------------------------------------------------------------------------------------------- names


def traced_key(name: str) -> str:
    """The simulation's key of a config key: ``algo.lr`` → ``lr`` (an algorithm field); ``privacy.*`` keys stay
    dotted (:meth:`fljax.engine.Simulation.context` reads them)."""
    return name[len("algo."):] if name.startswith("algo.") else name


def config_key(key: str) -> str:
    """The config key of a simulation's key (``lr`` → ``algo.lr``), as messages and results name it."""
    return key if "." in key else f"algo.{key}"


def _continuous(sim: Simulation, key: str):
    """The current value of hyperparameter ``key`` of ``sim``, after refusing, in one line, what has no gradient;
    ``aggregation.weights``, the per-client multipliers s_i of the aggregation weights (p_i·s_i), is a vector of
    ones over the clients (:data:`fljax.aggregation.CLIENT_WEIGHTS`)."""
    name = config_key(key)
    if key == CLIENT_WEIGHTS:
        if not sim.algorithm.reads_aggregate:
            raise OptionError(name, f"multiplies the weights of a server's aggregate; {sim.algorithm.name}'s server "
                                    f"reads its uploads otherwise (no aggregate to weigh).")
        return np.ones(sim.data.num_clients)
    if "." in key:
        traced = {} if sim.privacy is None else sim.privacy.traced()
        if key not in traced:
            raise OptionError(name, f"is not a traced value of this run; hypergradients are taken with respect to "
                                    f"the algorithm's continuous hyperparameters (algo.*)"
                                    + (f" and {', '.join(traced)}" if traced else "") + ".")
        return float(traced[key])
    algo = sim.algorithm
    fields = declared(type(algo))
    if key not in fields:
        raise OptionError(name, f"is not a hyperparameter of {algo.name}.{suggest(key, fields)} Its continuous ones: "
                                f"{sorted(config_key(k) for k in continuous_keys(algo))}.")
    hint = fields[key].type
    kinds = {a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)}
    if kinds != {float}:
        kind = "a choice" if typing.get_origin(hint) is typing.Literal else getattr(next(iter(kinds)), "__name__",
                                                                                      str(hint))
        raise OptionError(name, f"is discrete ({kind}): it has no gradient; compare its values with fljax sweep "
                                f"--grid {name}=V1,V2,...")
    value = algo.hyperparameters()[key]
    if value is None:
        raise OptionError(name, f"is null ({algo.name} then uses a default inside): give it a value to "
                                f"differentiate it, e.g. --set {name}=...")
    return float(value)


def continuous_keys(algorithm) -> list[str]:
    """The algorithm's hyperparameters declared as floats (the ones a hypergradient can be taken of when set)."""
    return [d.name for d in declared(type(algorithm)).values()
            if {a for a in (typing.get_args(d.type) or (d.type,)) if a is not type(None)} == {float}]


def space_of(algorithm, key: str) -> str:
    """Where tuning steps for hyperparameter ``key``, read from its declared check: 'log' when it must be
    positive (rates, μ, λ, norms), 'logit' when it must lie in (0, 1) (β's), else 'linear'."""
    fields = declared(type(algorithm))
    check = fields[key].check if key in fields else None
    if check is None:
        return "log" if key.startswith("privacy.") else "linear"
    if check(-0.5) is None:
        return "linear"
    return "logit" if check(1.5) is not None else "log"


def _to_u(h: float, space: str) -> float:
    return math.log(h) if space == "log" else math.log(h / (1 - h)) if space == "logit" else h


def _from_u(u: float, space: str) -> tuple[float, float]:
    """(h, dh/du) at u."""
    if space == "log":
        h = math.exp(u)
        return h, h
    if space == "logit":
        h = 1 / (1 + math.exp(-u))
        return h, h * (1 - h)
    return u, 1.0


# ---------------------------------------------------------------------------------------------------- objective


@dataclasses.dataclass
class Hypergradient:
    """``value`` L(h) and ``grad`` {key: dL/dh_key} at ``hp`` (config keys: ``algo.lr``), by ``mode``;
    ``zero``: the keys whose gradient is exactly zero (they do not enter the metric differentiably in this run);
    ``seconds``: the call's wall time (after compilation), ``compile_seconds`` the simulation's compile time so
    far."""

    value: float
    grad: dict
    hp: dict
    mode: str
    zero: tuple = ()
    seconds: float = 0.0
    compile_seconds: float = 0.0

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value) and all(np.all(np.isfinite(g)) for g in self.grad.values())

    def notes(self) -> list[str]:
        """One line per exactly-zero gradient (:func:`zero_note`)."""
        return [zero_note(k) for k in self.zero]

    def __str__(self) -> str:
        grads = ", ".join(f"d/d{k} = {g:.6g}" if np.ndim(g) == 0 else f"d/d{k} = [{len(g)} values]"
                          for k, g in self.grad.items())
        return f"{self.mode} mode: value {self.value:.6g}; {grads}"


class RunObjective:
    """L(h) of ``sim`` (module docstring): the ``metric`` of the evaluation on ``eval_data`` (a
    :class:`~fljax.data.FederatedData` whose *test* split is scored: the simulation's data with the validation split
    as its test split, see :func:`holdout`; None: the simulation's own test split), averaged over the evaluations
    after each of the last ``last`` of ``rounds`` rounds, as a function of the hyperparameters ``keys`` (the
    simulation's keys: ``lr``, ``server_lr``, ``privacy.noise_multiplier``) and the run's PRNG seed.

    ``remat``: what reverse mode stores ('none', 'round', 'block'; :data:`REMAT`), ``block``: the rounds of a block
    under 'block' (None: ⌈√rounds⌉). Every program is compiled through :meth:`Simulation.compiled` (its memory plan
    and compile cache), once per mode and shapes."""

    def __init__(self, sim: Simulation, keys, rounds: int, *, metric: str = "global_loss", eval_data=None,
                 last: int = 1, remat: str = "round", block: int | None = None):
        if not sim.executor.jittable:
            raise OptionError("executor", "'loop' runs rounds from Python; hypergradients need one compiled program: "
                                          "use vmap, chunked or auto.")
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise ConfigError("name at least one hyperparameter to differentiate, e.g. algo.lr.")
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            raise ConfigError(f"{config_key(twice)} is named twice; name each hyperparameter once.")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise OptionError("rounds", f"must be an integer >= 1, got {rounds!r}.")
        if isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= rounds:
            raise OptionError("last", f"must be an integer between 1 and rounds={rounds} (the final evaluations "
                                      f"averaged), got {last!r}.")
        if remat not in REMAT:
            raise OptionError("remat", f"must be one of {list(REMAT)}, got {remat!r}.{suggest(str(remat), REMAT)}")
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
            raise OptionError("block", f"must be an integer >= 1 (rounds per rematerialised block), got {block!r}.")
        self.sim, self.keys, self.rounds, self.last, self.remat = sim, tuple(keys), rounds, last, remat
        self.block = block or max(1, math.ceil(math.sqrt(rounds)))
        self.eval_data = sim.data if eval_data is None else eval_data
        self.start = {k: _continuous(sim, k) for k in self.keys}
        self.metric = metric
        self._check_traceable_and_metric()

    # ------------------------------------------------------------------------------------------ checks
    def _check_traceable_and_metric(self) -> None:
        hp = self.as_arrays(self.start)
        key = jax.random.PRNGKey(0)
        try:
            state = jax.eval_shape(lambda h: self.sim.init_fn(key, h), hp)
            jax.eval_shape(lambda s, h: self.sim.round_fn(s, self.sim.data, h), state, hp)
            summary, _ = jax.eval_shape(lambda s, h: self.sim.evaluate_fn(s, self.eval_data, h), state, hp)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                jax.errors.TracerIntegerConversionError) as e:
            one = self._untraceable(hp, key)
            raise ConfigError(f"{config_key(one) if one else ', '.join(map(config_key, self.keys))} cannot be "
                              f"traced: Python control flow reads its value ({str(e).splitlines()[0][:120]}); it "
                              f"has no hypergradient here.") from None
        losses = sorted(k for k in summary if "_acc" not in k)
        if self.metric not in summary:
            raise OptionError("metric", f"{self.metric!r} is not an evaluation metric of {self.sim.algorithm.name}."
                                        f"{suggest(self.metric, losses)} Choose one of {losses}.")
        if "_acc" in self.metric:
            raise OptionError("metric", f"{self.metric!r} counts correct predictions: it is piecewise constant in "
                                        f"the hyperparameters and its gradient is zero wherever it exists; choose a "
                                        f"loss: {[k for k in losses if 'loss' in k]}.")

    def _untraceable(self, hp, key) -> str | None:
        """The first key that cannot be traced alone (for the message)."""
        for k in self.keys:
            try:
                one = {k: hp[k]}
                state = jax.eval_shape(lambda h: self.sim.init_fn(key, h), one)
                jax.eval_shape(lambda s, h: self.sim.round_fn(s, self.sim.data, h), state, one)
            except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                    jax.errors.TracerIntegerConversionError):
                return k
        return None

    # ------------------------------------------------------------------------------------------ the function
    @staticmethod
    def as_arrays(hp: dict) -> dict:
        """``hp`` as scalar arrays of JAX's default float (float64 under x64), as a lane's traced values are."""
        dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
        return {k: jnp.asarray(v, dtype) for k, v in hp.items()}

    def loss(self, hp: dict, key, data, eval_data):
        """L(hp) for the run of PRNG key ``key``: pure, traceable (the function every program here compiles)."""
        sim, remat = self.sim, self.remat
        state = sim.init_fn(key, hp, data)

        def one_round(s):
            return sim.round_fn(s, data, hp)[0]

        def evaluated_round(s):
            s = one_round(s)
            return s, sim.evaluate_fn(s, eval_data, hp)[0][self.metric]

        step = jax.checkpoint(one_round, prevent_cse=False) if remat != "none" else one_round
        scored = jax.checkpoint(evaluated_round, prevent_cse=False) if remat != "none" else evaluated_round
        state = self._scan(step, state, self.rounds - self.last)
        _, values = jax.lax.scan(lambda s, _: scored(s), state, None, length=self.last)
        return jnp.mean(values)

    def _scan(self, step, state, n: int):
        """``n`` rounds of ``step``; under 'block' remat in checkpointed blocks of :attr:`block` rounds."""
        if n == 0:
            return state

        def rounds(s, length):
            return jax.lax.scan(lambda c, _: (step(c), None), s, None, length=length)[0]

        if self.remat != "block" or n <= self.block:
            return rounds(state, n)
        blocks, rest = divmod(n, self.block)
        block = jax.checkpoint(lambda s: rounds(s, self.block), prevent_cse=False)
        state = jax.lax.scan(lambda s, _: (block(s), None), state, None, length=blocks)[0]
        return rounds(state, rest) if rest else state

    def _static(self, what: str, lanes: int = 1) -> tuple:
        return (what, self.keys, self.rounds, self.last, self.remat, self.block, self.metric, lanes)

    def _program(self, what: str, fn, args, lanes: int = 1):
        """``fn`` compiled through the simulation's cache, the clients' local steps traced as scans in every
        program (:func:`fljax.algorithms.local_training.scanned_steps`: epochs over clients of different sizes are
        otherwise a while loop, which reverse mode cannot go through), so that all of them compute one function."""
        with scanned_steps():
            return self.sim.compiled(f"hypergrad_{what}", fn, args, self._static(what, lanes), lanes)

    def _args(self, hp: dict, seed: int):
        return self.as_arrays({k: hp[k] for k in self.keys}), jax.random.PRNGKey(seed), self.sim.data, self.eval_data

    def _check_hp(self, hp: dict) -> dict:
        hp = {**self.start, **(hp or {})}
        unknown = sorted(set(hp) - set(self.keys))
        if unknown:
            raise ConfigError(f"{config_key(unknown[0])} is not one of this objective's hyperparameters "
                              f"{[config_key(k) for k in self.keys]}.")
        return hp

    # ------------------------------------------------------------------------------------------ public
    def value(self, hp: dict | None = None, seed: int | None = None) -> float:
        """L(hp) (None: the simulation's own values) for the run of ``seed`` (None: the simulation's)."""
        hp = self._check_hp(hp)
        args = self._args(hp, self.sim.seed if seed is None else seed)
        return float(self._program("value", self.loss, args)(*args))

    def value_and_grad(self, hp: dict | None = None, seed: int | None = None, mode: str = "reverse"
                       ) -> Hypergradient:
        """L and dL/dh at ``hp`` (None: the simulation's own values) for the run of ``seed`` (None: the
        simulation's), by ``mode``: 'reverse' (``jax.value_and_grad`` with this objective's ``remat``) or 'forward'
        (``jax.jvp`` along every unit tangent, vmapped)."""
        if mode not in MODES:
            raise OptionError("mode", f"must be one of {list(MODES)}, got {mode!r}.{suggest(str(mode), MODES)}")
        hp = self._check_hp(hp)
        args = self._args(hp, self.sim.seed if seed is None else seed)
        fn = jax.value_and_grad(self.loss) if mode == "reverse" else self._forward
        program = self._program(mode, fn, args)
        t0 = time.perf_counter()
        value, grad = jax.block_until_ready(program(*args))
        seconds = time.perf_counter() - t0
        grad = {config_key(k): _plain(grad[k]) for k in self.keys}
        return Hypergradient(float(value), grad, {config_key(k): _plain(hp[k]) for k in self.keys}, mode,
                             tuple(k for k, g in grad.items() if not np.any(g)), seconds, self.sim.compile_seconds)

    def _forward(self, hp, key, data, eval_data):
        """(L, {key: dL/dh_key}) by forward mode: the jvp along each unit tangent, vmapped over the tangents."""
        vectors = [config_key(k) for k, v in hp.items() if jnp.ndim(v)]
        if vectors:
            raise OptionError("mode", f"'forward' takes one pass per hyperparameter value; {vectors[0]} holds one per "
                                      f"client: use mode 'reverse'.")
        names = sorted(hp)
        basis = {k: jnp.eye(len(names), dtype=hp[k].dtype)[i] for i, k in enumerate(names)}
        value, tangents = jax.vmap(lambda t: jax.jvp(lambda h: self.loss(h, key, data, eval_data), (hp,), (t,)),
                                   out_axes=(None, 0))(basis)
        return value, {k: tangents[i] for i, k in enumerate(names)}

    def temp_bytes(self, what: str) -> int | None:
        """XLA's count of the temporary bytes of this objective's compiled program ``what`` ('value', 'reverse',
        'forward', 'lanes'; None before it was compiled): its peak working memory beyond arguments and outputs."""
        plans = [plan for (name, static), plan in self.sim.memory_plans.items()
                 if name == f"hypergrad_{what}" and static[:-1] == self._static(what)[:-1]]
        return plans[-1]["xla_temp_bytes"] if plans else None

    def values(self, points: list[dict], seed: int | None = None) -> np.ndarray:
        """L at every point of ``points`` for the run of ``seed``, the points as lanes of one compiled program
        (vmap over the traced values)."""
        points = [self._check_hp(p) for p in points]
        hp = self.as_arrays({k: np.array([p[k] for p in points]) for k in self.keys})
        _, key, data, eval_data = self._args(points[0], self.sim.seed if seed is None else seed)
        fn = jax.vmap(self.loss, in_axes=(0, None, None, None))
        program = self._program("lanes", fn, (hp, key, data, eval_data), len(points))
        return np.asarray(program(hp, key, data, eval_data), float)


def _plain(value):
    """A scalar as a float, a vector (per-client weights) as a list of floats."""
    return float(value) if np.ndim(value) == 0 else [float(v) for v in np.ravel(value)]


def zero_note(key: str) -> str:
    """What an exactly-zero hypergradient of ``key`` means."""
    return (f"{key}: its gradient is exactly zero in this run: it does not enter the metric differentiably here (a "
            f"clip norm that no gradient reaches, a median, a value this configuration does not use)")


def client_steps(sim: Simulation, rounds: int) -> int:
    """The client-steps a run of ``rounds`` rounds schedules: rounds × participants per round × local steps per
    participant (at the largest client's size: the batch plan's steps)."""
    algo = sim.algorithm
    return int(rounds * algo.participants(sim.num_train_clients) * algo.steps_per_round(sim.data.train.n_max))


# ---------------------------------------------------------------------------------------------------- tuning


@dataclasses.dataclass
class TuneStep:
    """One point of a tuning trajectory: ``hp`` (config keys), the run's ``seed``, ``value`` L(hp) and ``grad`` on
    that run; then the step from it: ``tries`` runs of the same seed at proposed points (0 after the last point),
    the step length ``hyper_lr`` after them, and the wall ``seconds`` of the gradient and the tries."""

    step: int
    hp: dict
    seed: int
    value: float
    grad: dict
    tries: int
    hyper_lr: float
    seconds: float


@dataclasses.dataclass
class TuneResult:
    """Hypergradient descent: the ``trajectory`` (:class:`TuneStep` per point), the ``spaces`` stepped in, and the
    cost: ``gradients`` (hypergradients, one per point) and ``runs`` (runs at proposed points), ``client_steps``
    of one run, wall ``seconds`` and ``compile_seconds``."""

    trajectory: list
    spaces: dict
    mode: str
    keys: str
    gradients: int
    runs: int
    client_steps: int
    seconds: float
    compile_seconds: float

    @property
    def final(self) -> TuneStep:
        return self.trajectory[-1]

    def to_dict(self) -> dict:
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "trajectory"},
                "trajectory": [dataclasses.asdict(s) for s in self.trajectory]}


def check_tuning(steps: int, hyper_lr: float, keys: str, tries: int = 6) -> None:
    """Refuse, in one line, impossible settings of :func:`tune`."""
    if keys not in KEYS:
        raise OptionError("keys", f"must be one of {list(KEYS)}, got {keys!r}.{suggest(str(keys), KEYS)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise OptionError("steps", f"must be an integer >= 0 (hypergradient steps; 0: the hypergradient at the "
                                   f"start), got {steps!r}.")
    if not (isinstance(hyper_lr, (int, float)) and not isinstance(hyper_lr, bool) and hyper_lr > 0):
        raise OptionError("hyper_lr", f"must be a number > 0 (the longest step in u = log h), got {hyper_lr!r}.")
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
        raise OptionError("tries", f"must be an integer >= 1 (proposals per step), got {tries!r}.")


def tune(objective: RunObjective, steps: int, *, hyper_lr: float = 0.2, keys: str = "redraw", seed: int = 0,
         start: dict | None = None, spaces: dict | None = None, mode: str = "reverse", tries: int = 6,
         callback=None) -> TuneResult:
    """Hypergradient descent with backtracking on ``objective``'s hyperparameters, from ``start`` (None: the
    simulation's values), in u = space(h) (:func:`space_of`: log h for positive ones; ``spaces`` overrides per
    key). At point s, the run of seed r_s (``seed + s`` with ``keys='redraw'``, ``seed`` with ``'fixed'``) gives
    L_s(h_s) and its gradient g in u, and the step proposes

        u' = u_s − α · g / ‖g‖        (a step of length α in u),

    accepted when the run of the *same* seed is better there, L_s(h') < L_s(h_s) (the comparison sees the step, not
    another draw of cohorts and batches); α then doubles, up to ``hyper_lr``. A proposal that is not better (or not
    finite: a diverged run) halves α and is made again, at most ``tries`` times; then the point stays. The step's
    length never depends on the gradient's size: where training turns chaotic (the edge of stability of large
    rates), the hypergradient of a long run grows by orders of magnitude (Metz et al. 2019), and a step of length
    ∝ g, or an optimizer's momentum of it, would throw the point far past the edge. ``steps + 1`` points, each with
    its value and gradient (``steps=0``: the hypergradient at the start); ``callback(TuneStep)`` sees each."""
    check_tuning(steps, hyper_lr, keys, tries)
    if CLIENT_WEIGHTS in objective.keys:
        raise OptionError(CLIENT_WEIGHTS, "holds one weight per client: tune scalars here, and take its hypergradient "
                                          "with fljax.hypergradient (reverse mode).")
    algo = objective.sim.algorithm
    spaces = {k: (spaces or {}).get(config_key(k)) or space_of(algo, k) for k in objective.keys}
    for k, s in spaces.items():
        if s not in SPACES:
            raise OptionError("space", f"of {config_key(k)} must be one of {list(SPACES)}, got {s!r}.")
    hp = objective._check_hp({traced_key(k): v for k, v in (start or {}).items()})
    for k, s in spaces.items():
        if (s == "log" and not hp[k] > 0) or (s == "logit" and not 0 < hp[k] < 1):
            raise OptionError(config_key(k), f"= {hp[k]} cannot start a tuning in {s} space (it needs "
                                             f"{'h > 0' if s == 'log' else '0 < h < 1'}); start elsewhere or pass "
                                             f"another space.")

    def point(u):
        return {k: _from_u(float(u[i]), spaces[k])[0] for i, k in enumerate(objective.keys)}

    u, rate, trajectory, runs = np.array([_to_u(hp[k], spaces[k]) for k in objective.keys]), float(hyper_lr), [], 0
    compile0, t0 = objective.sim.compile_seconds, time.perf_counter()
    for step in range(steps + 1):
        run_seed = seed + step if keys == "redraw" else seed
        s0 = time.perf_counter()
        g = objective.value_and_grad(point(u), run_seed, mode)
        if not g.finite and step == 0:
            raise FloatingPointError(f"the run at the starting point {g.hp} is not finite (loss {g.value}); start "
                                     f"from smaller rates.")
        du = np.array([g.grad[config_key(k)] * _from_u(float(u[i]), spaces[k])[1]
                       for i, k in enumerate(objective.keys)])  # dL/du = dL/dh · dh/du
        norm, made = float(np.linalg.norm(du)), 0
        while step < steps and norm > 0 and made < tries:
            proposal = u - rate * du / norm
            made += 1
            if objective.value(point(proposal), run_seed) < g.value:  # False for a non-finite value
                u, rate = proposal, min(2 * rate, float(hyper_lr))
                break
            rate /= 2
        runs += made
        record = TuneStep(step, g.hp, run_seed, g.value, g.grad, made, rate, time.perf_counter() - s0)
        trajectory.append(record)
        if callback:
            callback(record)
    return TuneResult(trajectory, {config_key(k): s for k, s in spaces.items()}, mode, keys, len(trajectory), runs,
                      client_steps(objective.sim, objective.rounds), time.perf_counter() - t0,
                      objective.sim.compile_seconds - compile0)


def grid_search(objective: RunObjective, grid: dict, seed: int = 0) -> list[tuple[dict, float]]:
    """``[(point, L(point))]`` for every point of the product of ``grid`` ({key: values}, config or simulation
    keys), all points lanes of one compiled program for the run of ``seed``, in the grid's order."""
    keys = [traced_key(k) for k in grid]
    if sorted(keys) != sorted(objective.keys):
        raise ConfigError(f"the grid must give values of exactly {[config_key(k) for k in objective.keys]}, got "
                          f"{list(grid)}.")
    points = [dict(zip(keys, values)) for values in itertools.product(*grid.values())]
    values = objective.values(points, seed)
    return [({config_key(k): float(v) for k, v in p.items()}, float(x)) for p, x in zip(points, values)]


# ---------------------------------------------------------------------------------------------------- experiments


def objective_of(exp, data: FederatedData, keys, *, metric: str = "global_loss", split: str = "val",
                 val_fraction: float = 0.2, last: int = 1, remat: str = "round", block: int | None = None,
                 module=None) -> RunObjective:
    """The :class:`RunObjective` of a resolved experiment (:class:`fljax.experiment.Experiment`) on ``data`` (its
    data set), hyperparameters ``keys`` as config keys (``algo.lr``, ``algo.server_lr``): its simulation
    (:func:`fljax.experiment.build`) runs ``rounds`` rounds on the clients' training rows, less the validation rows
    (``split='val'``: ``val_fraction`` of each client's rows, held out with the run seed, :func:`holdout`), and the
    metric scores the validation, ``'test'`` or ``'train'`` split. ``module``: a Flax module of the user's own
    instead of the experiment's model."""
    from fljax.experiment import build, privacy_of

    if split not in SPLITS:
        raise OptionError("split", f"must be one of {list(SPLITS)}, got {split!r}.{suggest(str(split), SPLITS)}")
    if exp.algorithm.problem != "classification":
        raise ConfigError(f"hypergradients score the clients' held-out loss of classification runs; "
                          f"{exp.config.algorithm} solves {exp.algorithm.problem}.")
    keys = [keys] if isinstance(keys, str) else list(keys)
    eval_data = None
    if split == "val":
        data, val = holdout(data, val_fraction, exp.seed)
        eval_data = data.replace(test=val)
    elif split == "train":
        eval_data = data.replace(test=data.train)
    sim = build(exp, data, module, privacy=privacy_of(exp, data))
    return RunObjective(sim, [traced_key(k) for k in keys], exp.config.rounds, metric=metric, eval_data=eval_data,
                        last=last, remat=remat, block=block)


def trajectory_table(result: TuneResult) -> str:
    """The trajectory as a markdown table: step, seed, every hyperparameter, the loss, every gradient, the runs tried
    for the step from it and the step length after them."""
    from fljax.runner.report import markdown_table

    names = list(result.trajectory[0].hp)
    rows = [[str(s.step), str(s.seed), *(f"{s.hp[k]:.4g}" for k in names), f"{s.value:.5g}",
             *(f"{s.grad[k]:.4g}" for k in names), str(s.tries), f"{s.hyper_lr:.3g}"] for s in result.trajectory]
    return markdown_table(rows, ["step", "seed", *names, "loss", *(f"d loss/d {k}" for k in names), "tries",
                                 "step length"])


def plot_trajectory(result: TuneResult, path: str, metric: str = "loss") -> None:
    """``path`` (PNG): the loss at every step, and every hyperparameter's path (log axis for those tuned in log
    space)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fljax.runner import files, plots

    names = list(result.trajectory[0].hp)
    steps = [s.step for s in result.trajectory]
    with plt.rc_context(plots.rc()):
        fig, axes = plt.subplots(1, 1 + len(names), figsize=(3.4 * (1 + len(names)), 2.9), layout="constrained")
        axes[0].plot(steps, [s.value for s in result.trajectory], **plots.style(0))
        axes[0].set_xlabel("hypergradient step")
        axes[0].set_ylabel(metric)
        for i, name in enumerate(names, 1):
            axes[i].plot(steps, [s.hp[name] for s in result.trajectory], **plots.style(i))
            axes[i].set_xlabel("hypergradient step")
            axes[i].set_ylabel(name)
            if result.spaces[name] == "log":
                plots.log_axis(axes[i], "y")
        for ax in axes:
            plots.integer_axis(ax.xaxis)
        fig.suptitle(f"hypergradient descent ({result.mode} mode, keys {result.keys})")
        files.write_figure(path, fig)
        plt.close(fig)


def plot_surface(ax, grid: list, paths: dict | None = None, chosen: dict | None = None) -> None:
    """The loss surface of a two-hyperparameter grid on ``ax``: ``grid`` is :func:`grid_search`'s ``[(point,
    value)]`` over a product of log-spaced values (first key on x, second on y, both log axes; a non-finite value
    left blank), with ``paths`` ({label: [point, ...]}, e.g. a tuning trajectory's ``hp`` per step) drawn over it
    and the ``chosen`` point starred."""
    import matplotlib.colors as mcolors

    from fljax.runner import plots

    x_key, y_key = list(grid[0][0])
    xs, ys = sorted({p[x_key] for p, _ in grid}), sorted({p[y_key] for p, _ in grid})
    z = np.full((len(ys), len(xs)), np.nan)
    for p, v in grid:
        z[ys.index(p[y_key]), xs.index(p[x_key])] = v if math.isfinite(v) else np.nan

    def edges(v):  # cell edges halfway between log-spaced centres
        logs = np.log(v)
        mid = (logs[1:] + logs[:-1]) / 2
        return np.exp(np.concatenate([[2 * logs[0] - mid[0]], mid, [2 * logs[-1] - mid[-1]]]))

    finite = z[np.isfinite(z)]
    mesh = ax.pcolormesh(edges(xs), edges(ys), z, cmap="viridis", shading="flat",
                         norm=mcolors.LogNorm(finite.min(), finite.max()) if finite.size and finite.min() > 0
                         else None)
    ax.figure.colorbar(mesh, ax=ax, label="loss")
    ax.grid(False)
    for i, (label, points) in enumerate((paths or {}).items()):
        style = {**plots.style(i + 1), "color": ("white", "tab:red", "tab:orange")[i % 3]}
        ax.plot([p[x_key] for p in points], [p[y_key] for p in points], label=label, lw=1.5, ms=3, **{
            k: v for k, v in style.items() if k != "linestyle"})
        ax.plot(points[-1][x_key], points[-1][y_key], marker="o", ms=7, mfc="none", mec=style["color"])
    if chosen is not None:
        ax.plot(chosen[x_key], chosen[y_key], marker="*", ms=14, color="black", mec="white", ls="none",
                label="grid's best")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel=x_key, ylabel=y_key)
    if paths or chosen is not None:
        ax.legend(fontsize=7, loc="best")
