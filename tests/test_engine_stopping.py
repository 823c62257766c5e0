"""The engine's stopping-rule driver (fljax.engine.stopping), data-shaped client groups (fljax.engine.population,
through fljax.engine.cohort.run_all) and the BLAS guard (fljax.engine.blas), on a toy algorithm whose runs stop at
different rounds."""
import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import threadpoolctl

from fljax.algorithms.base import Algorithm
from fljax.engine import (ClientGroup, Lanes, Population, RoundContext, Simulation, Stopping, Tolerance,
                          run_until)
from fljax.engine.cohort import run_all
from fljax.engine.executors import ChunkedExecutor, LoopExecutor, VmapExecutor
from fljax.engine.stopping import start, step
from fljax.errors import OptionError


class Toy:
    """What the engine reads of client data (fljax.engine.SimulationData), for toy data whose every client trains:
    no server data, no groups of its own, no labelled examples."""

    server = None
    group_sizes = None
    stacked = True
    labelled = False

    @property
    def num_train_clients(self) -> int:
        return self.num_clients

    def client_nbytes(self) -> int:
        return sum(x.nbytes for x in jax.tree.leaves(self)) // self.num_clients


@flax.struct.dataclass
class Values(Toy):
    """Toy data: one value per client."""

    v: jax.Array

    @property
    def num_clients(self) -> int:
        return self.v.shape[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decay(Algorithm):
    """x_i ← q·x_i + shift every round (``steps`` local steps of it); the round's metrics describe the state it
    starts from: error = mean_i x_i², train_loss = mean_i x_i."""

    name: ClassVar[str] = "decay"
    q: float = 0.5
    shift: float = 0.0
    steps: int = 2

    def init(self, ctx):
        return None, ctx.data.v

    def client(self, shared, x):
        q, shift = shared
        return q * x + shift

    def round(self, ctx, server, clients):
        metrics = {"error": jnp.mean(jnp.square(clients)), "train_loss": jnp.mean(clients),
                   "local_steps": jnp.asarray(self.steps, jnp.int32), "bytes_up": jnp.float32(0.0),
                   "bytes_down": jnp.float32(0.0)}
        return server, ctx.map_clients(self.client, (self.q, self.shift), clients), metrics

    def evaluate(self, ctx, server, clients):
        return {"error": jnp.mean(jnp.square(clients))}, {}


DATA = Values(v=jnp.array([1.0, -2.0, 3.0, 0.5]))
RULE = Stopping(Tolerance(tol0=1e-3, relative=None), max_rounds=50, track=("train_loss",))


def test_lanes_stop_at_different_rounds_and_each_equals_its_own_run():
    sim = Simulation(Decay(), DATA, executor="vmap")
    qs = [0.5, 0.8, 0.3]
    lanes = run_until(Lanes(sim, [0, 0, 0], hps=[{"q": q} for q in qs]), RULE)
    assert len(set(lanes.rounds.tolist())) == 3 and lanes.converged.all()
    for i, q in enumerate(qs):
        alone = run_until(Simulation(Decay(q=q), DATA, executor="vmap"), RULE)
        assert alone.rounds == lanes.rounds[i] and alone.iters == 2 * alone.rounds
        # a lane that stopped early was frozen: its final state is its own run's, bit for bit
        np.testing.assert_array_equal(lanes.state.clients[i], alone.state.clients)
        np.testing.assert_array_equal(lanes.history["error"][i], alone.history["error"])
        s = int(alone.rounds)
        err = np.mean(np.asarray(DATA.v) ** 2) * q ** (2 * np.arange(s + 1))
        np.testing.assert_allclose(alone.history["error"][:s + 1], err, rtol=1e-5)   # float32
        assert np.isnan(alone.history["error"][s + 1:]).all() and alone.history["error"].shape == (51,)
        assert err[s] <= 1e-3 < err[s - 1]                      # the first round at the tolerance, not after it
        assert alone.metrics["error"] == pytest.approx(err[s], rel=1e-5)
        # the state is the one the stopping round's metrics describe (its update is discarded)
        np.testing.assert_allclose(alone.state.clients, np.asarray(DATA.v) * q ** s, rtol=1e-5)


def test_a_stopped_carry_is_unchanged_bit_for_bit():
    sim = Simulation(Decay(q=0.5), DATA, executor="vmap")
    body = jax.jit(lambda c: step(sim, RULE, c, sim.data, None))
    carry = start(sim, RULE, sim.init(), sim.data, None)
    while not bool(carry.done):
        carry = body(carry)
    for u, v in zip(jax.tree.leaves(carry), jax.tree.leaves(body(body(carry)))):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_caps_divergence_and_tolerance_rules():
    slow = Simulation(Decay(q=0.99), DATA, executor="vmap")
    capped = run_until(slow, Stopping(Tolerance(1e-3), max_rounds=7))
    assert capped.rounds == 7 and capped.capped and not capped.converged and capped.iters == 14
    iters = run_until(slow, Stopping(Tolerance(1e-3), max_rounds=100, max_iters=9))
    assert iters.rounds == 5 and iters.iters == 10 and iters.capped           # k = 10 ≥ 9 after 5 rounds
    blowup = run_until(Simulation(Decay(q=1e30), DATA, executor="vmap"), Stopping(Tolerance(1e-3)))
    assert blowup.diverged and not blowup.converged and not blowup.capped
    assert not np.isfinite(blowup.metrics["error"]) and np.isfinite(blowup.history["error"][blowup.rounds - 1])
    # relative: tol = min(tol0, 0.1·error₀); strict: error < tol
    sim = Simulation(Decay(q=0.5), DATA, executor="vmap")
    rel = run_until(sim, Stopping(Tolerance(tol0=1.0, relative=0.1)))
    err0 = float(np.mean(np.asarray(DATA.v) ** 2))
    assert rel.metrics["error"] <= 0.1 * err0 < rel.history["error"][rel.rounds - 1]
    exact = Simulation(Decay(q=0.5), Values(v=jnp.array([1.0, 1.0])), executor="vmap")   # error = 0.25^s exactly
    assert run_until(exact, Stopping(Tolerance(0.0625, relative=None))).rounds == 2
    assert run_until(exact, Stopping(Tolerance(0.0625, relative=None, strict=True))).rounds == 3


def test_loop_and_chunked_executors_agree_with_the_compiled_loop():
    ref = run_until(Simulation(Decay(q=0.7, shift=0.01), DATA, executor="vmap"), RULE)
    for ex in (LoopExecutor(), ChunkedExecutor(chunk_size=3)):
        got = run_until(Simulation(Decay(q=0.7, shift=0.01), DATA, executor=ex), RULE)
        assert got.rounds == ref.rounds and got.converged == ref.converged
        np.testing.assert_allclose(got.history["error"], ref.history["error"], rtol=1e-6)


def test_programs_are_reused_and_bad_settings_refused():
    sim = Simulation(Decay(), DATA, executor="vmap")
    lanes = Lanes(sim, [0, 1], hps=[{"q": 0.5}, {"q": 0.6}])
    first = run_until(lanes, RULE)
    assert first.compile_seconds > 0 and first.seconds > 0 and first.init_seconds >= 0
    again = run_until(lanes.with_hyperparameters([{"q": 0.7}, {"q": 0.2}]), RULE.replace(rule=Tolerance(1e-4, None)))
    assert again.compile_seconds == 0.0                      # other traced values, other tol0: the same programs
    assert again.rounds[0] > again.rounds[1]
    with pytest.raises(ValueError, match="no metric 'objective'"):
        run_until(sim, Stopping(Tolerance(1e-3, metric="objective")))
    with pytest.raises(ValueError, match="no metric 'steps'"):
        run_until(sim, Stopping(Tolerance(1e-3), max_iters=5, steps_metric="steps"))
    for bad, key in [(Stopping(Tolerance(1e-3), max_rounds=0), "max_rounds"),
                     (Stopping(Tolerance(1e-3), max_iters=0), "max_iters"),
                     (Stopping(Tolerance(-1.0)), "tol0"), (Stopping(Tolerance(1.0, relative=0.0)), "relative")]:
        with pytest.raises(OptionError) as e:
            run_until(sim, bad)
        assert e.value.key == key and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ grouped clients


@flax.struct.dataclass
class Rows(Toy):
    """One group's data: its clients' rows (``train [clients, rows]``), no test split."""

    train: jax.Array
    test = None

    @property
    def num_clients(self) -> int:
        return self.train.shape[0]


@flax.struct.dataclass
class Grouped(Toy):
    """Toy data in groups of their own shapes (``group_sizes``, fljax.engine.SimulationData): groups of 2, 3 and 1
    clients with rows of 4, 7 and 2 values."""

    stacked = False

    rows: tuple

    @property
    def num_clients(self) -> int:
        return sum(r.shape[0] for r in self.rows)

    @property
    def group_sizes(self) -> tuple[tuple[str, int], ...]:
        return tuple((f"g{k}", r.shape[0]) for k, r in enumerate(self.rows))

    def group(self, g: int) -> Rows:
        return Rows(train=self.rows[g])


def _grouped() -> Grouped:
    rng = np.random.default_rng(0)
    return Grouped(tuple(jnp.asarray(rng.standard_normal((c, r))) for c, r in ((2, 4), (3, 7), (1, 2))))


def _context(data, executor=VmapExecutor()):
    return RoundContext(executor, data, jnp.int32(0), jax.random.PRNGKey(0), population=Population.of_sizes(data.group_sizes))


def _client(inp):
    """down · Σ row + the client's id + its state."""
    return inp.down * jnp.sum(inp.train) + inp.id + (0.0 if inp.state is None else inp.state)


@pytest.mark.parametrize("executor", [VmapExecutor(), ChunkedExecutor(chunk_size=2), LoopExecutor()],
                         ids=lambda e: e.name)
def test_grouped_data_runs_every_group_in_client_order(executor):
    """Every group's clients see their own rows and ids; the outputs are concatenated in client order, or kept per
    group with per-group states of their own shapes; the serial order changes no value."""
    data = _grouped()
    ctx = _context(data, executor)
    expect = np.concatenate([2.0 * np.asarray(r).sum(axis=1) for r in data.rows]) + np.arange(6.0)
    got = run_all(ctx, lambda g: _client, 2.0, None, 0, test=False)
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    np.testing.assert_array_equal(run_all(ctx, lambda g: _client, 2.0, None, 0, test=False, serial=True), got)
    states = (jnp.full((2,), 10.0), jnp.full((3,), 20.0), jnp.full((1,), 30.0))
    parts = run_all(ctx, lambda g: _client, 2.0, states, 0, test=False, concat=False)
    assert [p.shape for p in parts] == [(2,), (3,), (1,)]
    np.testing.assert_allclose(np.concatenate(parts), expect + np.repeat([10.0, 20.0, 30.0], [2, 3, 1]), rtol=1e-6)
    wide = run_all(ctx, lambda g: lambda inp: inp.train, 0.0, None, 0, test=False, concat=False)   # own shapes
    assert [w.shape for w in wide] == [(2, 4), (3, 7), (1, 2)]


def test_serial_groups_add_a_data_dependency():
    """serial=True: group k + 1 reads what it shares through a zero that depends on group k's outputs."""
    data = _grouped()
    run = lambda s, serial: run_all(_context(data), lambda g: _client, s, None, 0, test=False, serial=serial)
    plain, serial = (str(jax.make_jaxpr(lambda s: run(s, flag))(2.0)) for flag in (False, True))
    assert "is_finite" not in plain and serial.count("is_finite") == 2       # groups 1 and 2 wait for 0 and 1
    with pytest.raises(ValueError, match="floating-point leaf"):
        run_all(_context(data), lambda g: lambda inp: jnp.sum(inp.train), 3, None, 0, test=False, serial=True)


def test_a_simulation_takes_the_population_of_grouped_data():
    data = _grouped()
    sim = Simulation(Decay(), data, executor="vmap")
    assert sim.population.sizes == [2, 3, 1] and sim.model is None
    with pytest.raises(ValueError, match="groups of its own"):
        Simulation(Decay(), data, executor="vmap", groups=[ClientGroup("a", 6)])


# ------------------------------------------------------------------------------------------------ BLAS guard


def _blas_threads() -> int:
    return max(info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas")


def test_compiled_calls_run_with_one_blas_thread_when_the_user_allowed_more(monkeypatch):
    """A user's OPENBLAS_NUM_THREADS cannot reach a compiled program (XLA:CPU's LAPACK calls deadlocked with
    OpenBLAS's thread pool); their setting is back after the call. With OPENBLAS_NUM_THREADS=1 (what
    ``import fljax`` sets) nothing is done."""
    seen = []

    def record(x):
        seen.append(_blas_threads())
        return x

    fn = lambda x: jax.pure_callback(record, jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # noqa: E731
    sim = Simulation(Decay(), DATA, executor="vmap")
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
        sim.compiled("probe", fn, (DATA.v,))(DATA.v)
        assert seen == [1] and _blas_threads() == 2
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
        monkeypatch.setattr(threadpoolctl, "threadpool_limits", None)     # not called at all
        jax.block_until_ready(sim.compiled("probe", fn, (DATA.v,))(DATA.v))
        assert seen == [1, 2]
