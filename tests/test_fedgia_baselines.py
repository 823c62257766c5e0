"""FedGiA's baselines (fljax.algorithms.fedgia_baselines) against literal NumPy loops of spec §6 and its options,
through fljax.engine in float64."""
import jax
import numpy as np
import pytest

from fljax.algorithms.fedgia_baselines import FedAvgGD, FedPD, FedProxGD
from fljax.engine.executors import ChunkedExecutor, LoopExecutor, VmapExecutor
from fljax.errors import OptionError
from fljax.problems import LeastSquares, Logistic, pack_trials
from tests.fedgia_reference import baseline_literal
from tests.test_fedgia import instance, ordered, simulation, solve, x64  # noqa: F401 (x64: autouse fixture)


def aggregates(method, data, rounds):
    """The aggregate at the start of each of ``rounds`` plain engine rounds of trial 0."""
    sim = simulation(method, data)
    state = sim.init()
    out = []
    for _ in range(rounds):
        out.append(np.asarray(method.aggregate(sim.data, state.server)))
        state, _ = sim.round(state)
    return out


CASES = [(FedAvgGD, "fedavg", "ls", dict()), (FedAvgGD, "fedavg", "log", dict(agg="data_weighted")),
         (FedProxGD, "fedprox", "ls", dict(lr_index="inner")), (FedProxGD, "fedprox", "log", dict(local_scale="1/m")),
         (FedPD, "fedpd", "ls", dict()), (FedPD, "fedpd", "log", dict(lr_index="round"))]


@pytest.mark.parametrize("cls,name,kind,options", CASES)
def test_baseline_matches_literal_loops(cls, name, kind, options):
    inst = instance(kind, m=5, n=4, sizes=(3, 9))
    data = pack_trials([inst], blocks=2, gram=kind == "ls")
    loss, mu = (LeastSquares(), 0.0) if kind == "ls" else (Logistic(), 1e-3)
    extra = {"fedprox": dict(mu=0.3), "fedpd": dict(eta=2.0)}.get(name, {})
    method = cls(loss=loss, k0=3, a=0.2, iters=2, **extra, **options)
    got = aggregates(method, data, 4)
    ref = baseline_literal(name, kind, ordered(inst, data), 3, 4, 0.2, mu=mu, prox_mu=extra.get("mu", 0.0),
                           eta=extra.get("eta", 1.0), iters=2, **options)
    for s in range(4):
        np.testing.assert_allclose(got[s], ref[s], rtol=0, atol=1e-13 * max(1.0, np.abs(ref[s]).max()))


def test_paper_settings_and_stopping():
    """Defaults follow §V-D: a = 0.01 / 0.001 / 0.05 and η = 1 on least squares, a = 0.5d/m and
    η = max{400, d/50} on the logistic examples; the run stops at Error ≤ tol or after max_rounds."""
    inst = instance("log", m=4, rows=[30, 40, 50, 60])
    data = pack_trials([inst])
    one = jax.device_put(data.trials()[0])
    assert float(FedAvgGD(loss=Logistic()).scale_a(one)) == pytest.approx(0.5 * 180 / 4)
    assert float(FedPD(loss=Logistic()).scale_eta(one)) == 400.0
    assert FedAvgGD(loss=LeastSquares()).scale_a(one) == 0.01
    assert FedProxGD(loss=LeastSquares()).scale_a(one) == 0.001
    assert FedPD(loss=LeastSquares()).scale_a(one) == 0.05 and FedPD(loss=LeastSquares()).scale_eta(one) == 1.0
    ls = pack_trials([instance("ls", m=4)])
    res = solve(FedAvgGD(loss=LeastSquares(), k0=2, a=0.2), ls, max_iters=None, max_rounds=1000)
    assert res.converged[0] and res.err[0] <= min(1e-7, 0.1 * res.hist_e[0, 0])
    capped = solve(FedAvgGD(loss=LeastSquares(), k0=2, a=0.2), ls, max_iters=None, max_rounds=3)
    assert capped.rounds[0] == 3 and not capped.converged[0] and capped.iters[0] == 6
    assert np.isnan(capped.hist_e[0, 4:]).all() and not np.isnan(capped.hist_e[0, :4]).any()
    for bad in [dict(lr_index="outer"), dict(agg="median"), dict(local_scale="2"), dict(iters=0), dict(a=-1.0),
                dict(k0=0)]:
        with pytest.raises(OptionError) as e:
            simulation(FedProxGD(loss=LeastSquares(), **bad), data)
        assert e.value.key == next(iter(bad)) and "\n" not in str(e.value)
    for bad in [dict(mu=-0.1)]:
        with pytest.raises(OptionError, match="mu"):
            simulation(FedProxGD(**bad), data)
    for bad in [dict(eta=0.0), dict(agg_prob=1.5)]:
        with pytest.raises(OptionError, match=next(iter(bad))):
            simulation(FedPD(**bad), data)


def test_fedpd_random_aggregation_counts_local_steps():
    data = pack_trials([instance("ls", m=4)])
    det = solve(FedPD(loss=LeastSquares(), k0=1), data, max_iters=None, max_rounds=30)
    one = solve(FedPD(loss=LeastSquares(), k0=1, agg_prob=1.0), data, max_iters=None, max_rounds=30)
    np.testing.assert_array_equal(det.hist_e, one.hist_e)            # p = 1: one step per round, as k0 = 1
    rnd = solve(FedPD(loss=LeastSquares(), k0=1, agg_prob=0.25), data, max_iters=None, max_rounds=30)
    assert rnd.iters[0] > 2 * rnd.rounds[0]                         # E[steps] = 4 per round


@pytest.mark.parametrize("method", [FedAvgGD(loss=Logistic(), k0=2, a=0.3),
                                    FedProxGD(loss=Logistic(), k0=2, a=0.3, mu=0.1, iters=2),
                                    FedPD(loss=Logistic(), k0=2, a=0.3, eta=2.0, iters=2)], ids=lambda m: m.name)
def test_baseline_executors_agree(method):
    data = pack_trials([instance("log", m=5, sizes=(3, 9))], blocks=2)
    ref = solve(method, data, executor=LoopExecutor(), max_iters=None, max_rounds=2)
    for ex in (VmapExecutor(), ChunkedExecutor(chunk_size=2)):
        got = solve(method, data, executor=ex, max_iters=None, max_rounds=2)
        np.testing.assert_array_equal(got.rounds, ref.rounds)
        np.testing.assert_allclose(got.hist_e, ref.hist_e, rtol=1e-10)
        np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=1e-12)


def test_traced_step_sizes_lanes_equal_separate_runs():
    """a, μ, η and FedPD's agg_prob are traced lane values: one program for the grid, each lane its own run."""
    from fljax.engine import Lanes, run_until
    from tests.test_fedgia import stop_rule

    data = pack_trials([instance("log", m=5, sizes=(3, 9))], blocks=2)
    trial = jax.device_put(data.trials()[0])
    for cls, points in [(FedProxGD, [{"a": 0.2, "mu": 0.1}, {"a": 0.4, "mu": 0.0}]),
                        (FedPD, [{"a": 0.2, "eta": 2.0, "agg_prob": 0.5}, {"a": 0.3, "eta": 5.0, "agg_prob": 1.0}])]:
        method = cls(loss=Logistic(), k0=2, iters=2)
        rule = stop_rule(method, data, max_iters=None, max_rounds=8)
        grid = run_until(Lanes(simulation(method, data), [3, 3], [trial, trial], hps=points), rule)
        for i, point in enumerate(points):
            alone = run_until(simulation(cls(loss=Logistic(), k0=2, iters=2, **point), data), rule, seed=3)
            assert alone.rounds == grid.rounds[i] and alone.iters == grid.iters[i]
            np.testing.assert_allclose(grid.history["error"][i], alone.history["error"], rtol=1e-10)


def test_fedpd_random_aggregation_takes_a_geometric_number_of_steps_per_round():
    """FedPD's random aggregation (agg_prob = p): after every local step the server aggregates with probability p,
    so a round runs S ~ Geometric(p) steps, S ∈ {1, 2, …}, E[S] = 1/p, drawn from the round's SAMPLE stream. The
    engine's per-round step counts are those draws (and a run's iteration count their sum); the trajectory equals
    the literal FedPD loop run with them; over 400 rounds their mean is 1/p within 4.5 standard errors."""
    from tests.test_fedgia import round_key

    p = 0.25
    inst = instance("ls", m=4, n=4, sizes=(3, 9))
    data = pack_trials([inst])
    method = FedPD(loss=LeastSquares(), k0=1, a=0.2, eta=2.0, iters=2, agg_prob=p)
    sim = simulation(method, data)
    state = sim.init(0)
    steps, xs = [], []
    for s in range(6):
        xs.append(np.asarray(method.aggregate(sim.data, state.server)))
        state, metrics = sim.round(state)
        steps.append(int(metrics["local_steps"]))
    with jax.enable_x64(True):
        draws = [int(jax.random.geometric(round_key(0, s), p)) for s in range(6)]
    assert steps == draws and min(steps) >= 1
    ref = baseline_literal("fedpd", "ls", ordered(inst, data), 1, 6, 0.2, eta=2.0, iters=2, steps=steps)
    for s in range(6):
        np.testing.assert_allclose(xs[s], ref[s], rtol=0, atol=1e-13 * max(1.0, np.abs(ref[s]).max()))
    long = solve(method, data, max_iters=None, max_rounds=400, tol0=1e-300)
    rounds, iters = int(long.rounds[0]), int(long.iters[0])
    assert rounds == 400
    with jax.enable_x64(True):
        assert iters == sum(int(jax.random.geometric(round_key(0, s), p)) for s in range(rounds))
    stderr = np.sqrt(1 - p) / p / np.sqrt(rounds)
    assert abs(iters / rounds - 1 / p) < 4.5 * stderr, (iters / rounds, 1 / p, stderr)
