"""fljax.ops.prox against its mathematics: optimality conditions, brute-force minimisation, SVD definitions."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings, strategies as st

from fljax.ops import prox as P

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def rng_array(seed, shape, scale=1.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def objective(p, y, x, step):
    """½‖x − y‖² + step·R(x), float64."""
    return 0.5 * float(np.sum((np.asarray(x) - np.asarray(y)) ** 2)) + step * float(p.penalty(jnp.asarray(x)))


# ------------------------------------------------------------------------------------ optimality conditions


@SETTINGS
@given(seed=seeds, a=st.floats(0.0, 2.0))
def test_soft_threshold_subgradient_conditions(seed, a):
    with jax.enable_x64(True):
        x = rng_array(seed, (40,))
        z = np.asarray(P.L1(1.0)(jnp.asarray(x), a))
        nz = z != 0
        np.testing.assert_allclose((x - z)[nz], a * np.sign(z[nz]), atol=1e-12)
        assert np.all(np.abs(x[~nz]) <= a + 1e-12)


@SETTINGS
@given(seed=seeds, lam=st.floats(0.0, 3.0))
def test_l2norm_and_group_lasso_optimality(seed, lam):
    """z ≠ 0 ⇒ y − z = λ·z/‖z‖; z = 0 ⇒ ‖y‖ ≤ λ, per group (groups = output columns of an (in, out) kernel)."""
    with jax.enable_x64(True):
        y = rng_array(seed, (3, 5))
        for z, groups in [(np.asarray(P.L2Norm(lam)(jnp.asarray(y), 1.0)), [(slice(None), slice(None))]),
                          (np.asarray(P.GroupLasso(lam)(jnp.asarray(y), 1.0)), [(slice(None), j) for j in range(5)])]:
            for g in groups:
                zg, yg = z[g], y[g]
                if np.linalg.norm(zg) > 0:
                    np.testing.assert_allclose(yg - zg, lam * zg / np.linalg.norm(zg), atol=1e-10)
                else:
                    assert np.linalg.norm(yg) <= lam + 1e-10


def test_group_lasso_groups_are_output_filters():
    """Flax convention: a group is K[..., o] (one output filter / Dense column); a weak filter is zeroed whole."""
    k = np.ones((3, 3, 2, 4))
    k[..., 1] *= 0.01                        # filter 1 has norm 0.01·√18 < λ
    z = np.asarray(P.GroupLasso(0.5)(jnp.asarray(k, jnp.float32), 1.0))
    assert np.all(z[..., 1] == 0) and np.all(z[..., [0, 2, 3]] != 0)
    np.testing.assert_allclose(np.linalg.norm(z[..., 0]), np.sqrt(18) - 0.5, rtol=1e-5)
    gl = P.GroupLasso(2.0, axis=0)           # groups along axis 0 of a (3, 4) matrix = its rows
    np.testing.assert_allclose(float(gl.penalty(jnp.ones((3, 4)))), 2.0 * 3 * 2.0, rtol=1e-6)


# ----------------------------------------------------------------------------------------------- brute force

SEPARABLE = [P.L1(0.7), P.SquaredL2(1.3), P.ElasticNet(0.4, 0.9), P.Box(-0.5, 0.8), P.NonNegative(),
             P.chain(P.L1(0.6), P.NonNegative()), P.chain(P.L1(0.3), P.Box(-0.4, 1.0))]


@pytest.mark.parametrize("p", SEPARABLE, ids=lambda p: type(p).__name__)
def test_separable_prox_matches_grid_search(p):
    """Each coordinate of prox(y, step) is the argmin of ½(x − y)² + step·r(x) over a 1e-4 grid (chains of a
    separable prox and a box are the prox of the summed penalty)."""
    with jax.enable_x64(True):
        step = 0.8
        y = rng_array(0, (12,), 1.5)
        grid = jnp.linspace(-4, 4, 80001)
        r = np.asarray(jax.vmap(lambda g: p.penalty(g[None]))(grid))
        obj = 0.5 * (np.asarray(grid)[None, :] - y[:, None]) ** 2 + step * r[None, :]
        brute = np.asarray(grid)[np.argmin(obj, axis=1)]
        np.testing.assert_allclose(np.asarray(p(jnp.asarray(y), step)), brute, atol=1.1e-4)


def test_chain_special_cases_have_closed_forms():
    y = jnp.asarray(rng_array(1, (50,), 2.0), jnp.float32)
    np.testing.assert_allclose(P.chain(P.L1(0.5), P.NonNegative())(y, 2.0), np.maximum(np.asarray(y) - 1.0, 0),
                               atol=1e-6)
    np.testing.assert_allclose(P.chain(P.L1(0.3), P.SquaredL2(0.7))(y, 1.5), P.ElasticNet(0.3, 0.7)(y, 1.5),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(P.chain(P.L1(0.3), P.SquaredL2(0.7)).penalty(y), P.ElasticNet(0.3, 0.7).penalty(y),
                               rtol=1e-6)


def _scipy_min(p, y, step, starts):
    f = lambda v: objective(p, y, v.reshape(y.shape), step)  # noqa: E731
    best = None
    for x0 in starts:
        res = scipy.optimize.minimize(f, np.ravel(x0), method="Powell", options={"xtol": 1e-10, "ftol": 1e-14,
                                                                                 "maxfev": 40000})
        best = res if best is None or res.fun < best.fun else best
    return best.x.reshape(y.shape), best.fun


@pytest.mark.parametrize("p,shape", [(P.L2Norm(0.8), (2, 3)), (P.GroupLasso(0.6), (2, 3)), (P.Nuclear(0.5), (3, 2)),
                                     (P.L2Norm(5.0), (2, 2))], ids=["l2norm", "group", "nuclear", "l2norm-zero"])
def test_nonseparable_prox_matches_numerical_minimiser(p, shape):
    """The objective is 1-strongly convex, so for the numerical minimiser x̂: obj(x̂) ≥ obj(prox) and
    ‖x̂ − prox‖² ≤ 2(obj(x̂) − obj(prox))."""
    with jax.enable_x64(True):
        step = 1.0
        y = rng_array(3, shape)
        z = np.asarray(p(jnp.asarray(y), step))
        xs, fs = _scipy_min(p, y, step, [y, np.zeros(shape), z + 0.1])
        fz = objective(p, y, z, step)
        assert fs >= fz - 1e-10
        assert np.sum((xs - z) ** 2) <= 2 * (fs - fz) + 1e-6


def _l0_brute(y, step, cut_sq_half):
    """Enumerate supports: min ½‖x − y‖² + step·(τ²/2)·‖x‖₀."""
    best, best_x = np.inf, None
    for bits in itertools.product([0, 1], repeat=y.size):
        s = np.array(bits, bool)
        x = np.where(s, y, 0)
        f = 0.5 * np.sum((x - y) ** 2) + step * cut_sq_half * s.sum()
        if f < best:
            best, best_x = f, x
    return best_x


@SETTINGS
@given(seed=seeds, tau=st.floats(0.05, 2.0), step=st.floats(0.1, 2.0))
def test_hard_threshold_matches_support_enumeration(seed, tau, step):
    with jax.enable_x64(True):
        y = rng_array(seed, (6,))
        z = np.asarray(P.HardThreshold(threshold=tau)(jnp.asarray(y), step))
        np.testing.assert_allclose(z, _l0_brute(y, step, tau**2 / 2), atol=1e-12)
        np.testing.assert_allclose(float(P.HardThreshold(threshold=tau).penalty(jnp.asarray(z))),
                                   tau**2 / 2 * np.count_nonzero(z), rtol=1e-12)


# ------------------------------------------------------------------------------------------------- rank_mask


def _stable_argsort_mask(scores, k):
    """The k largest scores, ties to the lower flat index, by a stable argsort."""
    flat = np.ravel(scores)
    mask = np.zeros(flat.size, bool)
    mask[np.argsort(-flat, kind="stable")[:k]] = True
    return mask.reshape(np.shape(scores))


def test_rank_mask_ties_to_lower_index_and_matches_stable_argsort():
    s = jnp.array([1.0, 3.0, 3.0, 2.0, 3.0])
    np.testing.assert_array_equal(P.rank_mask(s, 2), [False, True, True, False, False])
    ranked = jax.jit(P.rank_mask)                                           # traced count
    for k in range(s.size + 1):
        np.testing.assert_array_equal(ranked(s, jnp.int32(k)), _stable_argsort_mask(s, k))
    scores = jnp.asarray(rng_array(0, (3, 4)), jnp.float32)                 # shape kept, k clipped at the size
    for k in (0, 1, 7, 12, 20):
        np.testing.assert_array_equal(ranked(scores, jnp.int32(k)), _stable_argsort_mask(scores, min(k, 12)))


# ---------------------------------------------------------------------------------------------- nuclear / SVT


@SETTINGS
@given(seed=seeds, shape=st.sampled_from([(1, 4), (3, 3), (5, 2), (4, 6)]), tau=st.floats(0.0, 3.0))
def test_svt_equals_svd_definition_and_optimality(seed, shape, tau):
    """Z = U diag(max(s − τ, 0)) Vᵀ; with r = #{s > τ}: U_rᵀ(X − Z)V_r = τI_r and ‖X − Z‖₂ ≤ τ (FedSLR §8)."""
    with jax.enable_x64(True):
        m, n = shape
        x = rng_array(seed, (m, n), 2.0)
        z, stats = P.svt(jnp.asarray(x), tau)
        u, s, vt = np.linalg.svd(x, full_matrices=False)
        np.testing.assert_allclose(z, (u * np.maximum(s - tau, 0)) @ vt, atol=1e-10)
        r = int(np.sum(s > tau))
        assert int(stats.rank) == r and int(stats.max_rank) == min(m, n)
        assert int(stats.params) == min(r * (m + n), m * n)
        ur, vr = u[:, :r], vt[:r].T
        np.testing.assert_allclose(ur.T @ (x - np.asarray(z)) @ vr, tau * np.eye(r), atol=1e-9)
        assert np.linalg.norm(x - np.asarray(z), 2) <= tau + 1e-9


def test_hwio_route_equals_oihw_route_and_reshape_round_trips():
    k_hwio = jnp.asarray(rng_array(4, (3, 2, 4, 5)), jnp.float32)           # (kh, kw, I, O)
    k_oihw = jnp.transpose(k_hwio, (3, 2, 0, 1))                            # (O, I, kh, kw)
    w = np.asarray(P.matricize(k_hwio))
    np.testing.assert_array_equal(w, P.matricize(k_oihw, layout="oihw"))
    assert w.shape == (5 * 3, 4 * 2)
    o, i, a, b = 3, 2, 1, 1                                                 # W[(o,a),(i,b)] = K[o,i,a,b]
    assert w[o * 3 + a, i * 2 + b] == k_oihw[o, i, a, b]
    for layout, k in (("hwio", k_hwio), ("oihw", k_oihw)):
        for cr in ("fedslr", "flat"):
            np.testing.assert_array_equal(P.unmatricize(P.matricize(k, layout, cr), k.shape, layout, cr), k)
    dense = jnp.ones((4, 3))
    assert P.matricize(dense) is dense
    # Nuclear prox on an HWIO leaf = unmatricize(SVT(matricize)) and matches the OIHW route.
    z_hwio = P.Nuclear(0.3)(k_hwio, 1.0)
    z_oihw = P.unmatricize(P.svt(P.matricize(k_oihw, "oihw"), 0.3)[0], k_oihw.shape, "oihw")
    np.testing.assert_allclose(jnp.transpose(z_hwio, (3, 2, 0, 1)), z_oihw, atol=1e-5)


def test_flat_reshape_is_a_different_prox():
    k = jnp.asarray(rng_array(5, (3, 3, 4, 6)), jnp.float32)
    assert not np.allclose(P.Nuclear(1.0).penalty(k), P.Nuclear(1.0, conv_reshape="flat").penalty(k))


def test_nuclear_leaves_vectors_alone_and_reports_stats():
    tree = {"bias": jnp.arange(4.0), "kernel": jnp.asarray(rng_array(6, (5, 4)), jnp.float32)}
    z, stats = P.Nuclear(0.8).with_stats(tree, 1.0)
    assert z["bias"] is tree["bias"]
    assert int(stats["bias"].rank) == 0 and int(stats["bias"].params) == 4
    assert float(P.Nuclear(0.8).penalty({"bias": tree["bias"]})) == 0.0
    np.testing.assert_allclose(z["kernel"], P.svt(tree["kernel"], 0.8)[0])


@pytest.mark.parametrize("tau", [0.0, 1.5, 3.0, 100.0])
def test_transmission_bytes_counts_factors_and_vectors(tau):
    """bytes = 4·min(r(m+n), mn) per matrix + 4·numel per vector (FedSLR §2, §5)."""
    x = jnp.asarray(rng_array(7, (8, 6), 2.0), jnp.float32)
    r = int(P.svt(x, tau)[1].rank)
    tree = {"w": x, "b": jnp.ones(3)}
    zt, st_tree = P.Nuclear(tau).with_stats(tree, 1.0)
    expect = 4 * (min(r * 14, 48) + 3)
    sent, dense = P.transmission_bytes(st_tree)
    assert (int(sent), int(dense)) == (expect, 4 * (48 + 3))
    assert int(P.transmission_bytes(zt)[0]) == expect                      # ranks measured again
    assert (r * 14 < 48) == (int(sent) < int(dense))                        # factors iff r(m+n) < mn


def test_transmission_bytes_of_conv_kernel_uses_fedslr_shape():
    k = jnp.asarray(rng_array(8, (3, 3, 4, 8)), jnp.float32)                # matrix (24, 12)
    _, stats = P.Nuclear(3.0).with_stats({"k": k}, 1.0)
    r = int(stats["k"].rank)
    assert int(P.transmission_bytes(stats)[0]) == 4 * min(r * 36, 288)


def model_tree(seed):
    """Conv HWIO kernels, Dense kernels (one of numerical rank 3) and biases, float32."""
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    return {"params": {"Conv_0": {"kernel": f(3, 3, 2, 8), "bias": f(8)},
                       "Conv_1": {"kernel": f(5, 5, 8, 4), "bias": f(4)},
                       "Dense_0": {"kernel": f(36, 16) * 0.3, "bias": f(16)},
                       "head": {"kernel": f(16, 3) @ f(3, 10), "bias": f(10)}}}


def test_measured_stats_is_numpy_matrix_rank():
    """r = #{s > s_max·max(m, n)·eps} (numpy's default ``matrix_rank``), or #{s > s_max·rtol}; jittable."""
    tree = model_tree(0)
    for conv_reshape in ("fedslr", "flat"):
        for rtol in (None, 0.3):
            leaves = jax.tree.leaves(tree)
            stats = jax.jit(lambda t: [P.measured_stats(x, conv_reshape, rtol) for x in t])(leaves)
            for x, st in zip(leaves, stats):
                if x.ndim < 2:
                    assert (int(st.rank), int(st.params), int(st.max_rank), int(st.dense)) == (0, x.size, 0, x.size)
                    continue
                mat = np.asarray(P.matricize(x, conv_reshape=conv_reshape))
                m, n = mat.shape
                s = np.linalg.svd(mat.astype(np.float64), compute_uv=False)
                r = (np.linalg.matrix_rank(mat) if rtol is None else int(np.sum(s > rtol * s[0])))
                assert (int(st.rank), int(st.params), int(st.max_rank), int(st.dense)) == (
                    r, min(r * (m + n), m * n), min(m, n), m * n)
    assert int(P.measured_stats(tree["params"]["head"]["kernel"]).rank) == 3


def test_nuclear_exclude_and_no_step_leave_leaves_alone():
    tree = model_tree(1)
    k = tree["params"]["Dense_0"]["kernel"]
    for exclude in ("Dense_0/kernel", lambda path, x: x.shape == (36, 16)):
        nuc = P.Nuclear(0.5, exclude=exclude)
        out, stats = nuc.with_stats(tree, 1.0)
        assert out["params"]["Dense_0"]["kernel"] is k
        assert int(stats["params"]["Dense_0"]["kernel"].rank) == 16                         # measured: full rank
        np.testing.assert_array_equal(out["params"]["head"]["kernel"], P.svt(tree["params"]["head"]["kernel"], 0.5)[0])
        full = P.Nuclear(0.5).penalty(tree)
        np.testing.assert_allclose(nuc.penalty(tree), full - P.Nuclear(0.5).penalty(k), rtol=1e-5)
        assert nuc(tree, 1.0)["params"]["Dense_0"]["kernel"] is k
    out, stats = P.Nuclear(0.5).with_stats(tree, None)
    assert all(a is b for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(tree)))
    assert P.Nuclear(0.5)(tree, None)["params"]["head"]["kernel"] is tree["params"]["head"]["kernel"]
    expect = [P.measured_stats(x) for x in jax.tree.leaves(tree)]
    got = jax.tree.leaves(stats, is_leaf=lambda s: isinstance(s, P.LowRankStats))
    assert [tuple(map(int, jax.tree.leaves(s))) for s in got] == [tuple(map(int, jax.tree.leaves(s))) for s in expect]


def assert_bitwise(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x.view(f"u{x.itemsize}"), y.view(f"u{y.itemsize}"))


@pytest.mark.parametrize("conv_reshape", ["fedslr", "flat"])
@pytest.mark.parametrize("exclude", [None, "head", "Conv_1/"])
@pytest.mark.parametrize("seed", range(3))
def test_nuclear_with_stats_is_the_per_leaf_svt_bit_for_bit(conv_reshape, exclude, seed):
    """``Nuclear(λ, conv_reshape, exclude).with_stats(z, η)`` = a literal per-leaf SVT with threshold λ·η on the
    selected matrix leaves and the numerical rank measured elsewhere (the server step FedSLR wrote by hand before
    it called Nuclear), params and stats, every bit; ``step=None`` thresholds nothing; eager and jitted."""
    z = model_tree(10 + seed)
    lam, eta = 10.0 ** np.random.default_rng(seed).uniform(-2, 0), 10.0
    nuc = P.Nuclear(lam, conv_reshape=conv_reshape, exclude=exclude)
    for step, tau in ((eta, lam * eta), (None, None)):
        ref = _literal_low_rank_step(z, tau, conv_reshape, exclude)
        assert_bitwise(nuc.with_stats(z, step), ref)
        assert_bitwise(jax.jit(lambda t: nuc.with_stats(t, step))(z), ref)
    thresholded = jax.tree.leaves(nuc.with_stats(z, eta)[1], is_leaf=lambda s: isinstance(s, P.LowRankStats))
    assert any(int(s.rank) < int(s.max_rank) for s in thresholded)     # the threshold bites somewhere


def _literal_low_rank_step(params, tau, conv_reshape, exclude):
    """The reference: SVT(τ) on every matrix leaf whose path does not match ``exclude``; every other leaf unchanged
    with its numerical rank #{s > max(m, n)·eps·s_max} measured (``tau=None``: nothing thresholded)."""
    import re

    from fljax.tree import path_str

    def measured(x):
        if x.ndim < 2:
            n = jnp.int32(x.size)
            return P.LowRankStats(rank=jnp.int32(0), params=n, max_rank=jnp.int32(0), dense=n)
        mat = P.matricize(x, conv_reshape=conv_reshape)
        m, n = mat.shape
        s = jnp.linalg.svd(mat, compute_uv=False)
        r = jnp.sum(s > s[0] * max(m, n) * jnp.finfo(mat.dtype).eps).astype(jnp.int32)
        return P.LowRankStats(rank=r, params=jnp.minimum(r * (m + n), m * n).astype(jnp.int32),
                              max_rank=jnp.int32(min(m, n)), dense=jnp.int32(m * n))

    def leaf(path, x):
        if tau is None or x.ndim < 2 or (exclude and re.search(exclude, path)):
            return x, measured(x)
        w, stats = P.svt(P.matricize(x, conv_reshape=conv_reshape), tau)
        return P.unmatricize(w, x.shape, conv_reshape=conv_reshape), stats

    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    pairs = [leaf(path_str(p), x) for p, x in leaves]
    return jax.tree.unflatten(treedef, [a for a, _ in pairs]), jax.tree.unflatten(treedef, [b for _, b in pairs])


# ------------------------------------------------------------------------------------------ selection, dtype


def params_tree():
    return {"params": {"Dense_0": {"kernel": jnp.asarray(rng_array(9, (4, 3)), jnp.float32),
                                   "bias": jnp.asarray(rng_array(10, (3,)), jnp.float32)},
                       "head": {"kernel": jnp.asarray(rng_array(11, (3, 2)), jnp.float32)}}}


def test_on_touches_only_selected_leaves():
    tree = params_tree()
    out = P.on("Dense_0/kernel", P.L1(0.5))(tree, 1.0)
    assert out["params"]["Dense_0"]["bias"] is tree["params"]["Dense_0"]["bias"]
    assert out["params"]["head"]["kernel"] is tree["params"]["head"]["kernel"]
    np.testing.assert_array_equal(out["params"]["Dense_0"]["kernel"],
                                  P.soft_threshold(tree["params"]["Dense_0"]["kernel"], 0.5))
    by_pred = P.on(lambda path, x: x.ndim == 2, P.L1(0.5))(tree, 1.0)
    assert by_pred["params"]["Dense_0"]["bias"] is tree["params"]["Dense_0"]["bias"]
    assert not np.array_equal(by_pred["params"]["head"]["kernel"], tree["params"]["head"]["kernel"])
    pen = P.on("head", P.L1(2.0)).penalty(tree)
    np.testing.assert_allclose(pen, 2.0 * np.abs(tree["params"]["head"]["kernel"]).sum(), rtol=1e-6)


def test_per_leaf_first_match_wins():
    tree = params_tree()
    p = P.per_leaf([("kernel", P.NonNegative()), ("Dense_0", P.L1(100.0))], default=P.SquaredL2(1.0))
    out = p(tree, 1.0)
    np.testing.assert_array_equal(out["params"]["Dense_0"]["kernel"],
                                  np.maximum(tree["params"]["Dense_0"]["kernel"], 0))
    np.testing.assert_array_equal(out["params"]["Dense_0"]["bias"], 0)
    np.testing.assert_array_equal(out["params"]["head"]["kernel"], np.maximum(tree["params"]["head"]["kernel"], 0))
    assert float(P.per_leaf([], default=P.SquaredL2(1.0)).penalty({"b": jnp.ones(2)})) == 1.0
    ident = P.Identity()
    assert ident(tree, 5.0)["params"]["head"]["kernel"] is tree["params"]["head"]["kernel"]
    assert float(ident.penalty(tree)) == 0.0


@pytest.mark.parametrize("p", SEPARABLE + [P.L2Norm(0.5), P.GroupLasso(0.5), P.Nuclear(0.5), P.Identity(),
                                           P.HardThreshold(threshold=0.5)],
                         ids=lambda p: type(p).__name__)
def test_prox_keeps_float32_and_structure(p):
    tree = params_tree()
    out = jax.jit(p)(tree, jnp.float32(0.3))
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    assert all(o.dtype == jnp.float32 and o.shape == t.shape
               for o, t in zip(jax.tree.leaves(out), jax.tree.leaves(tree)))


# --------------------------------------------------------------------------------------- FedProx proximal term


def test_fedprox_proximal_term():
    with jax.enable_x64(True):
        w = {"a": jnp.asarray(rng_array(12, (3, 2))), "b": jnp.asarray(rng_array(13, (4,)))}
        anchor = {"a": jnp.asarray(rng_array(14, (3, 2))), "b": jnp.asarray(rng_array(15, (4,)))}
        mu = 0.7
        sq = sum(np.sum((np.asarray(w[k]) - np.asarray(anchor[k])) ** 2) for k in w)
        np.testing.assert_allclose(P.proximal_penalty(w, anchor, mu), mu / 2 * sq, rtol=1e-12)
        grad = jax.grad(P.proximal_penalty)(w, anchor, mu)                # the FedProx local gradient μ(w − anchor)
        for k in w:
            np.testing.assert_allclose(grad[k], mu * (np.asarray(w[k]) - np.asarray(anchor[k])), rtol=1e-12)


# ----------------------------------------------------------------------------------------------------- registry


REGISTRY_CASES = [   # name, options, the prox it must build for strength 0.3
    ("none", {}, P.Identity()), ("l1", {}, P.L1(0.3)), ("squared_l2", {}, P.SquaredL2(0.3)),
    ("l2_norm", {}, P.L2Norm(0.3)), ("group_lasso", {"axis": 0}, P.GroupLasso(0.3, 0)),
    ("elastic_net", {}, P.ElasticNet(0.3, 0.3)), ("elastic_net", {"l2": 2.0}, P.ElasticNet(0.3, 0.6)),
    ("l0", {}, P.HardThreshold(threshold=np.sqrt(0.6))), ("nonnegative", {}, P.NonNegative()),
    ("box", {"lo": 0.0, "hi": 2.0}, P.Box(0.0, 2.0)),
    ("nuclear", {"conv_reshape": "flat", "exclude": "head"}, P.Nuclear(0.3, "flat", "head")),
]


@pytest.mark.parametrize("name,options,expect", REGISTRY_CASES, ids=lambda c: c if isinstance(c, str) else "")
def test_make_prox_builds_the_named_prox_with_penalty_strength_times_r1(name, options, expect):
    """``make_prox(name, λ)`` is the library's prox of λ·R₁ (R₁ = the penalty at strength 1; indicators and R = 0
    are unchanged by λ > 0)."""
    got = P.make_prox(name, 0.3, **options)
    assert got == expect
    tree = jax.tree.map(lambda x: jnp.abs(x) / 4, params_tree()) if name in ("box", "nonnegative") else params_tree()
    unit = P.make_prox(name, 1.0, **options).penalty(tree)
    np.testing.assert_allclose(got.penalty(tree), unit if name in ("none", "nonnegative", "box") else 0.3 * unit,
                               rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got(tree, 0.7)), jax.tree.leaves(expect(tree, 0.7))):
        np.testing.assert_array_equal(a, b)


def test_make_prox_names_cover_fedslr_and_errors_are_one_line():
    assert set(P.PROXES) == {c[0] for c in REGISTRY_CASES}
    assert all(isinstance(v, str) and "\n" not in v for v in P.PROXES.values())
    assert {"nuclear", "l1", "none"} <= set(P.PROXES)                    # FedSLR's global_prox / personal_prox
    with pytest.raises(ValueError, match=r"unknown prox 'nucler'; valid: none, l1, .* Did you mean 'nuclear'\?"):
        P.make_prox("nucler", 1.0)
    with pytest.raises(ValueError, match="prox 'l1' takes no option 'axis'; valid options: none"):
        P.make_prox("l1", 1.0, axis=0)
    with pytest.raises(ValueError, match="valid options: conv_reshape, exclude"):
        P.make_prox("nuclear", 1.0, exlude="head")
