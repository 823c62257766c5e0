"""FedSLR against its equations (FedSLR spec §3, §4, §8 unit tests)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.algorithms.base import ClientInput, ClientResult
from fljax.algorithms.fedslr import prox_with_stats
from fljax.engine import Simulation, sample_cohort
from fljax.engine.context import SAMPLE
from fljax.engine.driver import _round_key
from fljax.models import make_model
from fljax.models.model import Model
from fljax.ops import prox
from fljax.experiment import default_model

from conftest import assert_trees_close

FULL_BATCH = dict(batch_size=None, local_epochs=2, personal_epochs=1, lr=0.1, lr_decay=0.9, weight_decay=1e-3,
                  personal_weight_decay=1e-3, eta_g=2.0, lam=0.05, mu=0.01)


def _mlp(data):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[16])


def _cohort(state, t, num_clients, size):
    return np.asarray(sample_cohort(jax.random.fold_in(_round_key(state.key, t), SAMPLE), num_clients, size))


def _np_svt(w, tau):
    u, s, vt = np.linalg.svd(np.asarray(w, np.float64), full_matrices=False)
    return (u * np.maximum(s - tau, 0)) @ vt


def _reference_round(model, data, w, gamma, p, cohort, t, hp):
    """Algorithm 2 written out client by client (full-batch local steps), independent of the engine's code."""
    lr = hp["lr"] * hp["lr_decay"] ** t
    eta_g = hp["eta_g"]
    gamma, p = [dict(g) for g in gamma], [dict(q) for q in p]
    uploads = []
    for i in cohort:
        batch = D.Batch(data.train.x[i], data.train.y[i], data.train.mask[i])
        wi = dict(w)
        for _ in range(hp["local_epochs"]):
            g = jax.grad(model.loss)(wi, batch)
            wi = jax.tree.map(lambda x, gx, gam, x0: x - lr * (gx + hp["weight_decay"] * x - gam + (x - x0) / eta_g),
                              wi, g, gamma[i], w)
        gamma[i] = jax.tree.map(lambda gam, x0, x: gam + (x0 - x) / eta_g, gamma[i], w, wi)
        pi = p[i]
        for _ in range(hp["personal_epochs"]):
            g = jax.grad(lambda q: model.loss(jax.tree.map(jnp.add, w, q), batch))(pi)
            step = jax.tree.map(lambda q, gq: q - lr * (gq + hp["personal_weight_decay"] * q), pi, g)
            pi = jax.tree.map(lambda q: np.sign(q) * np.maximum(np.abs(q) - hp["mu"] * lr, 0), step)
        p[i] = pi
        uploads.append(wi)
    z = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *uploads)
    gbar = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *gamma)
    z = jax.tree.map(lambda a, b: a - eta_g * b, z, gbar)
    w_new = jax.tree.map(lambda x: _np_svt(x, hp["lam"] * eta_g) if x.ndim == 2 else x, z)
    return w_new, gamma, p


@pytest.mark.parametrize("cohort_size", [3, None])
def test_fedslr_equals_algorithm_2_written_out(digits10, cohort_size):
    """Alg. 2 (partial participation) and Alg. 1 (cohort_size=None): Phase I, the dual of Eq. (5), Phase II's
    soft-thresholded steps on w_t + p, and the server's SVT of mean w_i − η_g·mean_M γ_i."""
    model = _mlp(digits10)
    algo = make_algorithm("fedslr", cohort_size=cohort_size, **FULL_BATCH)
    sim = Simulation(algo, digits10, model, executor="vmap", seed=3)
    state = sim.init()
    w = state.server["params"]
    gamma = tree.unstack(state.clients["gamma"])
    p = tree.unstack(state.clients["p"])
    for t in range(2):
        cohort = _cohort(state, t, 10, cohort_size) if cohort_size else np.arange(10)
        w, gamma, p = _reference_round(model, digits10, w, gamma, p, cohort, t, FULL_BATCH)
        state, _ = sim.round(state)
    assert_trees_close(state.server["params"], w, rtol=2e-4, atol=2e-5)
    assert_trees_close(state.clients["gamma"], tree.stack(gamma), rtol=2e-4, atol=2e-5)
    assert_trees_close(state.clients["p"], tree.stack(p), rtol=2e-4, atol=2e-5)
    assert 0 < int(np.sum(state.server["params"]["head"]["kernel"] != 0))  # not trivially zero


def test_memory_efficient_algorithm_3_gives_the_same_iterates(digits10):
    model = _mlp(digits10)
    kw = dict(FULL_BATCH, cohort_size=4)
    runs = []
    for me in (False, True):
        sim = Simulation(make_algorithm("fedslr", memory_efficient=me, **kw), digits10, model, executor="vmap", seed=0)
        state, _ = sim.run_rounds(sim.init(), 3)
        runs.append(state)
    assert_trees_close(runs[0].server["params"], runs[1].server["params"], rtol=1e-4, atol=1e-6)
    assert_trees_close(runs[0].clients, runs[1].clients, rtol=1e-4, atol=1e-6)
    # γ̄ is the mean of the clients' duals
    assert_trees_close(runs[1].server["gamma_bar"], tree.mean_clients(runs[1].clients["gamma"]), rtol=1e-4,
                       atol=1e-6)


@dataclasses.dataclass(frozen=True)
class _Quadratic(Model):
    """f_i(W, b) = ½ mean_j ‖x_j W + b − e_{y_j}‖²: L-smooth and convex."""

    def loss(self, params, batch):
        r = self.apply(params, batch.x) - jax.nn.one_hot(batch.y, self.num_classes)
        m = batch.mask.astype(r.dtype)
        return 0.5 * jnp.sum(jnp.sum(r * r, -1) * m) / jnp.maximum(jnp.sum(m), 1.0)


def test_quadratic_dual_is_local_gradient_and_iterates_reach_the_prox_gd_fixed_point():
    """Eq. (25): with an exact local argmin γ_{i,t+1} = ∇f_i(w_{i,t+1}); with full participation and η_g ≤ 1/(2L)
    w_t converges to the fixed point w = Prox_{λη_g‖·‖_*}(w − η_g∇f(w)) of centralised prox-GD on P1."""
    rng = np.random.default_rng(0)
    num, n, d, c = 4, 24, 5, 3
    xs = [rng.normal(size=(n, d)).astype(np.float32) + i * 0.3 for i in range(num)]
    ys = [rng.integers(0, c, n).astype(np.int32) for _ in range(num)]
    arr = D.pad_clients(xs, ys)
    data = D.FederatedData(train=arr, test=arr, num_classes=c, input_shape=(d,), name="quad")
    base = make_model("logreg", (d,), c)
    model = _Quadratic(base.module, base.input_shape, c, "quad")
    a = [np.hstack([x, np.ones((n, 1), np.float32)]) for x in xs]
    hess = [ai.T @ ai / n for ai in a]
    big_l = np.linalg.eigvalsh(np.mean(hess, 0)).max()
    eta_g = 1.0 / (2 * big_l)
    lr = 1.0 / (max(np.linalg.eigvalsh(h).max() for h in hess) + 1 / eta_g)
    algo = make_algorithm("fedslr", cohort_size=None, batch_size=None, local_epochs=100, personal_epochs=0, lr=lr,
                          lr_decay=1.0, weight_decay=0.0, eta_g=eta_g, lam=0.1, mu=0.0)
    sim = Simulation(algo, data, model, executor="vmap", seed=0)
    state, _ = sim.run_rounds(sim.init(), 120)
    before = state
    state, _ = sim.round(state)
    batches = [D.Batch(arr.x[i], arr.y[i], arr.mask[i]) for i in range(num)]
    for i in range(num):
        g_old, g_new = (jax.tree.map(lambda x: x[i], s.clients["gamma"]) for s in (before, state))
        w_i = tree.sub(before.server["params"], tree.scale(eta_g, tree.sub(g_new, g_old)))  # from Eq. (5)
        assert_trees_close(g_new, jax.grad(model.loss)(w_i, batches[i]), rtol=1e-3, atol=1e-4)
    w = state.server["params"]
    grad_f = tree.mean_clients(tree.stack([jax.grad(model.loss)(w, b) for b in batches]))
    fixed = prox.Nuclear(0.1)(tree.axpy(-eta_g, grad_f, w), eta_g)
    assert float(tree.norm(tree.sub(fixed, w))) < 1e-4 * float(tree.norm(w))
    rank = np.linalg.matrix_rank(np.asarray(w["Dense_0"]["kernel"]), tol=1e-4)
    assert 0 < rank < 3  # the nuclear prox is active at the fixed point


def _rounds(data, rounds=3, **kw):
    """(algorithm, state before the last round, state after it, the last round's metrics, eval_metrics)."""
    model = _mlp(data)
    args = dict(cohort_size=None, batch_size=None, local_epochs=5, lr=0.1, eta_g=10.0, lam=1e-3, mu=1e-3)
    sim = Simulation(make_algorithm("fedslr", **{**args, **kw}), data, model, executor="vmap", seed=0)
    state = sim.init()
    for _ in range(rounds):
        before = state
        state, metrics = sim.round(state)
    return before, state, metrics, jax.device_get(sim.algorithm.eval_metrics(state.server, state.clients))


def test_rank_and_downlink_fall_as_lambda_grows(digits10):
    dens, downs = [], []
    for lam in (0.0, 2e-2, 1e-1):
        before, state, metrics, summary = _rounds(digits10, lam=lam)
        dens.append(float(summary["gkr_rank_density"]))
        # the round's downlink is the previous GKR's factorised size, measured again from its singular values
        sent, dense = prox.transmission_bytes(before.server["params"])
        np.testing.assert_allclose(float(metrics["bytes_down"]), 10 * int(sent), rtol=1e-6)
        assert float(metrics["bytes_up"]) == 10 * int(dense)
        downs.append(float(metrics["bytes_down"]) / (10 * int(dense)))
        mats = [x for x in jax.tree.leaves(state.server["params"]) if x.ndim == 2]
        host = [np.linalg.matrix_rank(np.asarray(x), tol=1e-5 * np.abs(np.asarray(x)).max()) for x in mats]
        assert [float(summary[f"rank/{k}/kernel"]) for k in ("Dense_0", "head")] == host
    assert dens[0] == 1.0 and downs[0] == 1.0
    assert dens == sorted(dens, reverse=True) and dens[-1] < 0.5
    assert downs == sorted(downs, reverse=True) and downs[-1] < 0.5


def test_sparsity_rises_with_mu(digits10):
    fracs = []
    for mu in (0.0, 1e-2, 1e-1):
        _, state, _, s = _rounds(digits10, rounds=2, mu=mu)
        fracs.append(float(s["sparse_nnz_frac"]))
        nnz = np.array([sum(int(np.count_nonzero(x[i])) for x in jax.tree.leaves(state.clients["p"]))
                        for i in range(10)])
        np.testing.assert_allclose(s["mixed_params"], s["gkr_params"] + nnz.mean(), rtol=1e-6)
        np.testing.assert_allclose(s["mixed_params_std"], nnz.std(), rtol=1e-5)
    # μ = 0 leaves only never-touched entries at zero (always-blank pixels, dead units); μ > 0 zeroes more
    assert fracs[0] > 0.7 and fracs[0] > fracs[1] > fracs[2] and fracs[2] < 0.5 * fracs[0], fracs


def test_gpgd_server_is_the_prox_of_the_mean_and_lpgd_iterates_are_low_rank(digits10):
    model = _mlp(digits10)
    rng = np.random.default_rng(0)
    w0 = model.init(jax.random.PRNGKey(0))
    uploads = jax.tree.map(lambda x: jnp.asarray(x + rng.normal(size=(3,) + x.shape).astype(np.float32)), w0)
    result = ClientResult(state=None, upload=uploads, weight=jnp.ones(3), metrics={})
    ctx = dataclasses.make_dataclass("Ctx", ["num_clients", "round"])(10, jnp.int32(4))
    gpgd = make_algorithm("fedslr", solver="gpgd", lam=0.05, eta_g=10.0, lr=0.1, lr_decay=0.5)
    for mode, tau in (("eta_g", 0.5), ("eta_l", 0.05 * 0.1 * 0.5 ** 4)):
        algo = dataclasses.replace(gpgd, gpgd_threshold=mode)
        out = algo.server_update(ctx, {"params": w0}, {}, jnp.arange(3), result)
        expect = jax.tree.map(lambda x: _np_svt(x, tau) if x.ndim == 2 else x, tree.mean_clients(uploads))
        assert_trees_close(out["params"], expect, rtol=1e-4, atol=1e-5)
    lpgd = make_algorithm("fedslr", solver="lpgd", lam=5.0, lr=0.1, batch_size=10, local_epochs=1)
    inp = ClientInput(None, digits10.train.client(0), jax.random.PRNGKey(1), jnp.int32(0), model=model)
    w, numel, _ = lpgd.lpgd_local(w0, inp, inp.key)
    sent, _ = prox.transmission_bytes(w)
    assert int(numel) * 4 == int(sent) < 4 * tree.size(w0)


def test_split_variants_put_the_right_prox_on_each_part(digits10):
    _, ss, _, _ = _rounds(digits10, rounds=2, global_prox="l1", lam=1e-2)  # S+S: sparse global model
    zeros = sum(int(np.sum(x == 0)) for x in jax.tree.leaves(ss.server["params"]))
    assert zeros > 0.2 * tree.size(ss.server["params"])
    _, lrlr, _, _ = _rounds(digits10, rounds=2, personal_prox="nuclear", mu=1.0)  # LR+LR: low-rank personal part
    p = np.asarray(lrlr.clients["p"]["Dense_0"]["kernel"][0])
    assert np.linalg.matrix_rank(p, tol=1e-6 * max(np.abs(p).max(), 1e-12)) < 16


def test_server_prox_excludes_and_measures(digits10):
    params = _mlp(digits10).init(jax.random.PRNGKey(0))
    w, stats = prox_with_stats(make_algorithm("fedslr", nuclear_exclude="head").nuclear(), params, 1.0)
    np.testing.assert_array_equal(w["head"]["kernel"], params["head"]["kernel"])
    assert int(stats["head"]["kernel"].rank) == 10 and int(stats["Dense_0"]["kernel"].rank) < 16
    assert int(stats["Dense_0"]["bias"].params) == 16 and int(stats["Dense_0"]["bias"].max_rank) == 0


def test_fedslr_metrics_reach_the_run_history(digits10):
    sim = Simulation(make_algorithm("fedslr", cohort_size=4, batch_size=10, lam=1e-2), digits10, _mlp(digits10),
                     executor="vmap", seed=0)
    hist = sim.run(2, eval_every=1, progress=False).history
    assert [h["round"] for h in hist] == [0, 1, 2]  # round 0: the initial model
    for key in ("gkr_rank_density", "gkr_params", "sparse_nnz_frac", "mixed_params", "rank/Dense_0/kernel",
                "personal_acc", "global_acc"):
        assert key in hist[-1] and np.isfinite(hist[-1][key])
    assert hist[1]["bytes_down"] == 4 * 4 * tree.size(sim.init().server["params"])  # first round: dense w_0


@pytest.mark.parametrize("kw,msg", [({"solver": "lpdg"}, "solver must be one of"),
                                    ({"memory_efficient": True, "solver": "gpgd"}, "has no dual"),
                                    ({"eta_g": 0.0}, "eta_g must be > 0"),
                                    ({"personal_prox": "l2"}, "personal_prox must be one of")])
def test_fedslr_refuses_bad_options(digits10, kw, msg):
    with pytest.raises(ValueError, match=msg):
        Simulation(make_algorithm("fedslr", **kw), digits10, default_model(digits10))


def test_lpgd_iterates_are_the_svt_of_the_sgd_step_with_the_factored_size(digits10):
    """LPGD (Eqs. 18-19), full batch, two steps: w ← SVT_{lr·λ}(w − lr(∇CE(w) + wd·w)) on every matrix leaf (vectors
    take the plain step), with SVT computed by NumPy's SVD; the upload counts Σ min(r(m+n), mn) over matrices
    (r = #{s > lr·λ} of the last step's singular values) plus the vectors' sizes."""
    from reference import batch_of, rows

    model = _mlp(digits10)
    w0 = model.init(jax.random.PRNGKey(0))
    lr, lam, wd = 0.1, 3.0, 1e-3
    lpgd = make_algorithm("fedslr", solver="lpgd", lam=lam, lr=lr, weight_decay=wd, batch_size=None, local_epochs=2)
    inp = ClientInput(None, digits10.train.client(0), jax.random.PRNGKey(1), jnp.int32(0), model=model)
    w, numel, _ = lpgd.lpgd_local(w0, inp, inp.key)
    batch = batch_of(*rows(digits10.train, 0))
    tau = lr * lam
    ref = jax.tree.map(lambda a: np.asarray(a, np.float64), w0)
    for _ in range(2):
        g = jax.grad(model.loss)(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), ref), batch)
        y = jax.tree.map(lambda p, d: p - lr * (np.asarray(d, np.float64) + wd * p), ref, g)
        ref = jax.tree.map(lambda a: _np_svt(a, tau) if a.ndim == 2 else a, y)
        count = 0
        for a in jax.tree.leaves(y):
            if a.ndim == 2:
                r = int(np.sum(np.linalg.svd(a, compute_uv=False) > tau))
                count += min(r * sum(a.shape), a.size)
            else:
                count += a.size
    assert_trees_close(w, ref, rtol=1e-4, atol=1e-5)
    assert int(numel) == count
    mats = [np.asarray(a) for a in jax.tree.leaves(w) if a.ndim == 2]
    ranks = [np.linalg.matrix_rank(a, tol=1e-5) for a in mats]
    assert min(ranks) > 0 and any(r < min(a.shape) for r, a in zip(ranks, mats)), ranks  # the threshold bites
