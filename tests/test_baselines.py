"""The personalized-FL baselines of the FedSLR spec §10: each update rule against a hand computation, every
executor against the loop, and per-client state untouched in rounds where the client is not sampled."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.algorithms.base import ClientInput, ClientResult
from fljax.engine import Simulation, sample_cohort
from fljax.engine.context import SAMPLE
from fljax.engine.driver import _round_key
from fljax.models import make_model

from conftest import assert_trees_close

SGD = dict(lr=0.05, batch_size=8, local_epochs=1)
CASES = {  # name -> (hyperparameters, per-client state keys that persist between participations)
    "fedslr": (dict(SGD, lam=1e-2, mu=1e-2), ("gamma", "p")),
    "fedslr_lpgd": (dict(SGD, solver="lpgd", lam=1e-2), ("p",)),
    "feddyn": (dict(SGD), ("g",)),
    "scaffold": (dict(SGD), ("c",)),
    "apfl": (dict(SGD, adaptive_alpha=True), ("v", "alpha")),
    "perfedavg": (dict(alpha=0.01, beta=0.05, batch_size=4, local_epochs=1), ()),
    "perfedavg_hf": (dict(alpha=0.01, beta=0.05, batch_size=4, local_epochs=1, hvp_mode="exact"), ()),
    "pfedme": (dict(lr=0.05, local_steps=3, batch_size=8, lam=5.0, inner_steps=2), ("theta",)),
    "ditto": (dict(SGD, lam=0.1), ("v",)),
    "fedper": (dict(SGD), ("params",)),
    "lg_fedavg": (dict(SGD), ("params",)),
    "local": (dict(SGD), ("params",)),
}


@pytest.fixture(scope="module")
def small():
    return D.make_federated("synthetic", 8, seed=0, max_samples=30)


def _model(data):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[8])


def _algo(case, **kw):
    hp, _ = CASES[case]
    return make_algorithm(case.split("_")[0] if case.startswith(("fedslr", "perfedavg")) else case, **{**hp, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_executors_agree_with_loop_and_unsampled_clients_keep_their_state(small, case):
    runs = {}
    for ex in ("loop", "vmap", "chunked"):
        sim = Simulation(_algo(case, cohort_size=3), small, _model(small), executor=ex, chunk_size=2, seed=1)
        states = [sim.init()]
        metrics = []
        for _ in range(2):
            s, m = sim.round(states[-1])
            states.append(s)
            metrics.append(m)
        runs[ex] = (states, metrics, sim.evaluate(states[-1])[0])
    ref_states, ref_metrics, ref_summary = runs["loop"]
    for ex in ("vmap", "chunked"):
        states, metrics, summary = runs[ex]
        assert_trees_close((states[-1].server, states[-1].clients), (ref_states[-1].server, ref_states[-1].clients),
                           rtol=1e-4, atol=1e-5)
        for m, rm in zip(metrics, ref_metrics):
            for k in rm:
                np.testing.assert_allclose(m[k], rm[k], rtol=1e-4, atol=1e-6, err_msg=f"{ex} {k}")
        for k in ref_summary:
            np.testing.assert_allclose(summary[k], ref_summary[k], rtol=1e-4, atol=1e-5, err_msg=f"{ex} {k}")
    states = ref_states
    for t in range(2):
        cohort = np.asarray(sample_cohort(jax.random.fold_in(_round_key(states[t].key, t), SAMPLE), 8, 3))
        for key in CASES[case][1]:
            before, after = states[t].clients[key], states[t + 1].clients[key]
            for i in range(8):
                same = all(np.array_equal(a[i], b[i]) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
                assert same == (i not in cohort), (case, key, t, i)


# ---------------------------------------------------------------------------------------------- hand computations


def _one_client(n=12, d=5, c=3, seed=0):
    rng = np.random.default_rng(seed)
    arr = D.pad_clients([rng.normal(size=(n, d)).astype(np.float32)], [rng.integers(0, c, n).astype(np.int32)])
    return arr.client(0), D.Batch(arr.x[0], arr.y[0], arr.mask[0]), make_model("mlp", (d,), c, hidden=[4])


def _inp(model, state, train, key, down=None, round_=0):
    """One client's input, as the engine builds it."""
    return ClientInput(state=state, train=train, key=key, round=jnp.int32(round_), down=down, model=model)


def _ctx(num_clients, round_=0):
    return dataclasses.make_dataclass("Ctx", ["num_clients", "round"])(num_clients, jnp.int32(round_))


def _rand_like(p, seed, scale=0.1):
    return tree.random_normal_like(jax.random.PRNGKey(seed), p, scale)


def test_feddyn_client_and_server_rules():
    train, batch, model = _one_client()
    a, lr, wd, k = 0.3, 0.1, 1e-2, 3
    algo = make_algorithm("feddyn", alpha=a, lr=lr, weight_decay=wd, batch_size=None, local_steps=k)
    theta = model.init(jax.random.PRNGKey(0))
    g_i = _rand_like(theta, 1)
    res = algo.client_update(_inp(model, {"g": g_i}, train, jax.random.PRNGKey(2), theta))
    w = theta
    for _ in range(k):
        grad = jax.grad(model.loss)(w, batch)
        w = jax.tree.map(lambda x, gx, gi, x0: x - lr * (gx + wd * x - gi + a * (x - x0)), w, grad, g_i, theta)
    assert_trees_close(res.upload, w, rtol=1e-5, atol=1e-6)
    assert_trees_close(res.state["g"], jax.tree.map(lambda gi, x, x0: gi - a * (x - x0), g_i, w, theta), rtol=1e-5,
                       atol=1e-6)
    # server: h ← h − α(1/M)Σ_{S_t}(θ_i − θ); θ' = mean θ_i − h/α
    ups = tree.stack([_rand_like(theta, s, 1.0) for s in (3, 4)])
    h = _rand_like(theta, 5)
    out = algo.server_update(_ctx(10), {"params": theta, "h": h}, None, jnp.arange(2),
                             ClientResult(None, ups, jnp.ones(2), {}))
    h_new = jax.tree.map(lambda hh, u, x: hh - a / 10 * (u[0] - x + u[1] - x), h, ups, theta)
    assert_trees_close(out["h"], h_new, rtol=1e-5, atol=1e-6)
    assert_trees_close(out["params"], jax.tree.map(lambda u, hh: u.mean(0) - hh / a, ups, h_new), rtol=1e-5,
                       atol=1e-6)


def test_scaffold_option_ii_and_true_step_count():
    train, batch, model = _one_client()
    lr, wd, k = 0.1, 1e-2, 4
    algo = make_algorithm("scaffold", lr=lr, weight_decay=wd, batch_size=None, local_steps=k)
    x = model.init(jax.random.PRNGKey(0))
    c, c_i = _rand_like(x, 1), _rand_like(x, 2)
    res = algo.client_update(_inp(model, {"c": c_i}, train, jax.random.PRNGKey(3), (x, c)))
    y = x
    for _ in range(k):
        grad = jax.grad(model.loss)(y, batch)
        y = jax.tree.map(lambda v, gv, ci, cc: v - lr * (gv + wd * v - ci + cc), y, grad, c_i, c)
    c_plus = jax.tree.map(lambda ci, cc, x0, v: ci - cc + (x0 - v) / (k * lr), c_i, c, x, y)
    assert_trees_close(res.upload[0], tree.sub(y, x), rtol=1e-5, atol=1e-6)
    assert_trees_close(res.state["c"], c_plus, rtol=1e-4, atol=1e-5)
    assert_trees_close(res.upload[1], tree.sub(c_plus, c_i), rtol=1e-4, atol=1e-5)
    # K is the number of steps actually taken: E·⌈n_i/B⌉ for a small client padded to a large one's rows
    plan = D.BatchPlan(batch_size=5, epochs=2)
    for count in (1, 5, 11, 30):
        _, _, active = plan.schedule(jax.random.PRNGKey(0), count, 1, 30)
        assert int(plan.active_steps(count, 30)) == int(active.sum()) == 2 * -(-count // 5)
    # server: x ← x + η_g mean(Δy); c ← c + (1/M)Σ Δc
    dy, dc = tree.stack([_rand_like(x, 7), _rand_like(x, 8)]), tree.stack([_rand_like(x, 9), _rand_like(x, 10)])
    algo = algo.with_values(server_lr=0.5)
    out = algo.server_update(_ctx(20), {"params": x, "c": c}, None, jnp.arange(2),
                             ClientResult(None, (dy, dc), jnp.array([3, 9]), {}))
    assert_trees_close(out["params"], jax.tree.map(lambda v, d: v + 0.5 * d.mean(0), x, dy), rtol=1e-5, atol=1e-6)
    assert_trees_close(out["c"], jax.tree.map(lambda v, d: v + d.sum(0) / 20, c, dc), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("adaptive", [False, True])
def test_apfl_step(adaptive):
    train, batch, model = _one_client()
    lr, wd, a, a_lr = 0.1, 1e-2, 0.3, 0.5
    algo = make_algorithm("apfl", lr=lr, weight_decay=wd, batch_size=None, local_steps=1, alpha=a,
                 adaptive_alpha=adaptive, alpha_lr=a_lr)
    w = model.init(jax.random.PRNGKey(0))
    v = tree.add(w, _rand_like(w, 1))
    res = algo.client_update(_inp(model, {"v": v, "alpha": jnp.float32(a)}, train, jax.random.PRNGKey(2), w))
    grad = lambda p: tree.axpy(wd, p, jax.grad(model.loss)(p, batch))  # noqa: E731
    v_bar = jax.tree.map(lambda vv, ww: a * vv + (1 - a) * ww, v, w)
    assert_trees_close(res.upload, tree.axpy(-lr, grad(w), w), rtol=1e-5, atol=1e-6)
    assert_trees_close(res.state["v"], tree.axpy(-lr * a, grad(v_bar), v), rtol=1e-5, atol=1e-6)
    a_new = np.clip(a - a_lr * float(tree.vdot(tree.sub(v, w), grad(v_bar))), 0, 1) if adaptive else a
    np.testing.assert_allclose(res.state["alpha"], a_new, rtol=1e-5)
    mixed = algo.personal_params(_inp(model, res.state, train, None, w))
    assert_trees_close(mixed, jax.tree.map(lambda vv, ww: a_new * vv + (1 - a_new) * ww, res.state["v"], w))


@pytest.mark.parametrize("hvp_mode", ["none", "exact"])
def test_perfedavg_step_first_order_and_hessian_free(hvp_mode):
    _, batch, model = _one_client(n=12)
    alpha, beta, wd = 0.05, 0.2, 1e-2
    algo = make_algorithm("perfedavg", alpha=alpha, beta=beta, weight_decay=wd, batch_size=4, hvp_mode=hvp_mode)
    w = model.init(jax.random.PRNGKey(0))
    got, _ = algo.meta_step(model, w, batch, alpha, beta)
    flat, unravel = tree.ravel(w)
    n = algo.batches_per_step
    part = lambda j: D.Batch(batch.x[j::n], batch.y[j::n], batch.mask[j::n])  # noqa: E731
    f = lambda v, b: model.loss(unravel(v), b) + 0.5 * wd * jnp.sum(v * v)  # noqa: E731
    w_tilde = flat - alpha * jax.grad(f)(flat, part(0))
    r = jax.grad(f)(w_tilde, part(1))
    if hvp_mode == "exact":
        r = r - alpha * jax.hessian(f)(flat, part(2)) @ r
    np.testing.assert_allclose(tree.ravel(got)[0], flat - beta * r, rtol=1e-4, atol=1e-6)
    assert algo.plan().num_steps(50) == 2 * -(-50 // (n * 4))  # 2 epochs; each step consumes n batches of B


def test_pfedme_local_round():
    train, batch, model = _one_client()
    eta, eta_p, lam, k, r, wd = 0.05, 0.1, 3.0, 3, 2, 1e-2
    algo = make_algorithm("pfedme", lr=eta, personal_lr=eta_p, lam=lam, inner_steps=k, local_steps=r,
                 batch_size=None, weight_decay=wd, beta=0.7)
    w_t = model.init(jax.random.PRNGKey(0))
    w_i, theta, _ = algo.local_round(w_t, _inp(model, None, train, jax.random.PRNGKey(1)), 0)
    w, th = w_t, w_t
    for _ in range(r):
        for _ in range(k):
            g = jax.grad(model.loss)(th, batch)
            th = jax.tree.map(lambda t, gt, ww: t - eta_p * (gt + lam * (t - ww) + wd * t), th, g, w)
        w = jax.tree.map(lambda ww, t: ww - eta * lam * (ww - t), w, th)
    assert_trees_close(theta, th, rtol=1e-5, atol=1e-6)
    assert_trees_close(w_i, w, rtol=1e-5, atol=1e-6)
    ups = tree.stack([w_i, _rand_like(w_t, 4, 1.0)])
    out = algo.server_step(_ctx(5), {"params": w_t}, tree.mean_clients(ups))
    assert_trees_close(out["params"], jax.tree.map(lambda x, u: 0.3 * x + 0.7 * u.mean(0), w_t, ups), rtol=1e-5,
                       atol=1e-6)


def test_ditto_approaches_local_as_lambda_vanishes(small):
    """Ditto's personal models with λ → 0 converge to Local's models (same schedule: full-batch steps, same
    cohorts), and equal them at λ = 0."""
    model = _model(small)
    common = dict(cohort_size=4, lr=0.1, batch_size=None, weight_decay=1e-3)
    local = Simulation(make_algorithm("local", local_epochs=2, **common), small, model, executor="vmap", seed=0)
    ref, _ = local.run_rounds(local.init(), 3)
    gaps = []
    for lam in (0.5, 0.02, 0.0):
        sim = Simulation(make_algorithm("ditto", lam=lam, personal_epochs=2, local_epochs=1, **common), small, model,
                         executor="vmap", seed=0)
        s, _ = sim.run_rounds(sim.init(), 3)
        gaps.append(float(tree.norm(tree.sub(s.clients["v"], ref.clients["params"]))))
    assert gaps[0] > gaps[1] > 0 and gaps[2] < 1e-5, gaps
