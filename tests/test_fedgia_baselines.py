"""FedGiA's baselines (fljax.algorithms.fedgia_baselines) against literal NumPy loops of spec §6 and its options."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.algorithms import regression_driver as drv
from fljax.algorithms.fedgia_baselines import FedAvgGD, FedPD, FedProxGD
from fljax.engine.executors import LoopExecutor, VmapExecutor
from fljax.problems import LeastSquares, Logistic, pack_trials
from tests.fedgia_reference import baseline_literal
from tests.test_fedgia import instance, ordered


def aggregates(method, data, rounds):
    """The aggregate at the start of each of ``rounds`` rounds of trial 0, through the driver's round_step."""
    with jax.enable_x64(True):
        one = jax.tree.map(lambda a: jnp.asarray(a[0]), data)
        run = drv.init_run(method, None, one)
        step = jax.jit(functools.partial(drv.round_step, method, VmapExecutor(), None, one, jax.random.PRNGKey(0)))
        out = []
        for _ in range(rounds):
            out.append(np.asarray(method.aggregate(None, one, run.alg)))
            run = step(run.replace(done=jnp.zeros((), bool)))
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
    with jax.enable_x64(True):
        one = jax.tree.map(lambda a: jnp.asarray(a[0]), data)
        assert float(FedAvgGD(loss=Logistic()).scale_a(one)) == pytest.approx(0.5 * 180 / 4)
        assert float(FedPD(loss=Logistic()).scale_eta(one)) == 400.0
        assert FedAvgGD(loss=LeastSquares()).scale_a(one) == 0.01
        assert FedProxGD(loss=LeastSquares()).scale_a(one) == 0.001
        assert FedPD(loss=LeastSquares()).scale_a(one) == 0.05 and FedPD(loss=LeastSquares()).scale_eta(one) == 1.0
    res = drv.solve(FedAvgGD(loss=LeastSquares(), k0=2, a=0.2), pack_trials([instance("ls", m=4)]))
    assert res.converged[0] and res.err[0] <= min(1e-7, 0.1 * res.hist_e[0, 0])
    capped = drv.solve(FedAvgGD(loss=LeastSquares(), k0=2, a=0.2, max_rounds=3), pack_trials([instance("ls", m=4)]))
    assert capped.rounds[0] == 3 and not capped.converged[0] and capped.iters[0] == 6
    with pytest.raises(ValueError, match="lr_index"):
        drv.solve(FedProxGD(loss=LeastSquares(), lr_index="outer"), data)


def test_fedpd_random_aggregation_counts_local_steps():
    data = pack_trials([instance("ls", m=4)])
    det = drv.solve(FedPD(loss=LeastSquares(), k0=1, max_rounds=30), data)
    one = drv.solve(FedPD(loss=LeastSquares(), k0=1, agg_prob=1.0, max_rounds=30), data)
    np.testing.assert_array_equal(det.hist_e, one.hist_e)            # p = 1: one step per round, as k0 = 1
    rnd = drv.solve(FedPD(loss=LeastSquares(), k0=1, agg_prob=0.25, max_rounds=30), data)
    assert rnd.iters[0] > 2 * rnd.rounds[0]                         # E[steps] = 4 per round


def test_baseline_executors_agree():
    data = pack_trials([instance("log", m=5, sizes=(3, 9))], blocks=2)
    method = FedPD(loss=Logistic(), k0=2, a=0.3, eta=2.0, max_rounds=2)
    ref = drv.solve(method, data, executor=LoopExecutor())
    got = drv.solve(method, data, executor=VmapExecutor())
    np.testing.assert_allclose(got.hist_e, ref.hist_e, rtol=1e-10)
    np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=1e-12)
