"""fljax.ops.admm against hand formulas, first-order conditions and jnp.linalg.solve (float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from fljax.ops import admm as A


def r(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


def tree(seed, lead=()):
    return {"a": r(seed, *lead, 3, 2), "b": r(seed + 100, *lead, 4)}


def close(x, y, tol=1e-10):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=tol, rtol=tol), x, y)


def test_dual_ascent_z_form_gd_branch_hand_formulas():
    with jax.enable_x64(True):
        pi, xi, x, s = tree(0), tree(1), tree(2), 0.37
        close(A.dual_ascent(pi, xi, x, s), jax.tree.map(lambda p, a, b: p + s * (a - b), pi, xi, x))
        close(A.z_form(xi, pi, s), jax.tree.map(lambda a, p: a + p / s, xi, pi))
        g = tree(3)
        xb, pib, zb = A.gd_branch(x, g, s)                     # FedGiA (15)–(17)
        close(xb, x)
        close(pib, jax.tree.map(jnp.negative, g))
        close(zb, jax.tree.map(lambda a, gg: a - gg / s, x, g))


@pytest.mark.parametrize("kind", ["scalar", "diagonal", "cholesky", "woodbury"])
def test_linearized_primal_minimises_the_linearised_lagrangian(kind):
    """x_i = x − S⁻¹(g + π) is the stationary point of ⟨g + π, x_i − x⟩ + ½‖x_i − x‖²_S (FedGiA (12), (18)–(19))."""
    with jax.enable_x64(True):
        x, g, pi = tree(4), tree(5), tree(6)
        n = 10
        a_mat = r(7, 6, n)
        c1, c0 = 0.3, 0.8
        s_dense = {"scalar": 2.5 * jnp.eye(n), "cholesky": c1 * a_mat.T @ a_mat + c0 * jnp.eye(n),
                   "woodbury": c1 * a_mat.T @ a_mat + c0 * jnp.eye(n)}
        if kind == "diagonal":
            curv = jax.tree.map(lambda v: jnp.abs(v) + 0.5, tree(8))
            s_dense["diagonal"] = jnp.diag(ravel_pytree(curv)[0])
        else:
            curv = {"scalar": 2.5, "cholesky": A.cholesky_solver(a_mat.T @ a_mat, c1, c0),
                    "woodbury": A.woodbury_solver(a_mat, c1, c0)}[kind]
        xi = A.linearized_primal(x, g, pi, curv)
        flat = lambda t: ravel_pytree(t)[0]  # noqa: E731
        grad = flat(g) + flat(pi) + s_dense[kind] @ (flat(xi) - flat(x))
        np.testing.assert_allclose(grad, 0, atol=1e-10)


def test_cholesky_woodbury_and_inverse_solvers_match_linalg_solve():
    with jax.enable_x64(True):
        for d, n in ((5, 12), (12, 5)):                         # wide and tall A (Woodbury needs no n ≤ d)
            a_mat = r(d * n, d, n)
            v = r(1, n)
            c1, c0 = 1 / (4 * 7 * 3), 0.05
            exact = jnp.linalg.solve(c1 * a_mat.T @ a_mat + c0 * jnp.eye(n), v)
            np.testing.assert_allclose(A.cholesky_solver(a_mat.T @ a_mat, c1, c0)(v), exact, rtol=1e-9)
            np.testing.assert_allclose(A.woodbury_solver(a_mat, c1, c0)(v), exact, rtol=1e-9)
            np.testing.assert_allclose(A.inverse_solver(a_mat.T @ a_mat, c1, c0)(v), exact, rtol=1e-9)
            np.testing.assert_allclose(A.woodbury_inverse_solver(a_mat, c1, c0)(v), exact, rtol=1e-9)
        np.testing.assert_allclose(A.woodbury_inverse_solver(jnp.concatenate([a_mat, jnp.zeros((3, n))]), c1, c0)(v),
                                   exact, rtol=1e-9)
        padded = jnp.concatenate([a_mat, jnp.zeros((3, n))])    # zero padding rows are harmless
        np.testing.assert_allclose(A.woodbury_solver(padded, c1, c0)(v), exact, rtol=1e-9)


def test_cg_solver_matches_linalg_solve_and_stops_early():
    """CGSolver: (c1·AᵀA + c0·I)⁻¹v by conjugate gradients (FedGiA D14): exact in ≤ n iterations; inexact when
    ``maxiter`` is smaller (the residual is then visibly non-zero)."""
    with jax.enable_x64(True):
        a_mat, v = r(3, 9, 7), r(4, 7)
        c1, c0 = 0.2, 0.05
        s = c1 * a_mat.T @ a_mat + c0 * jnp.eye(7)
        np.testing.assert_allclose(A.cg_solver(a_mat, c1, c0, tol=1e-13)(v), jnp.linalg.solve(s, v), rtol=1e-9)
        rough = A.cg_solver(a_mat, c1, c0, tol=1e-13, maxiter=2)(v)
        assert jnp.linalg.norm(s @ rough - v) > 1e-6 * jnp.linalg.norm(v)
        vm = jax.vmap(lambda ai: A.cg_solver(ai, c1, c0, tol=1e-13))(jnp.stack([a_mat, 2 * a_mat]))
        np.testing.assert_allclose(jax.vmap(lambda sol: sol(v))(vm)[1],
                                   jnp.linalg.solve(4 * c1 * a_mat.T @ a_mat + c0 * jnp.eye(7), v), rtol=1e-9)


def test_solvers_are_pytrees_that_vmap_over_clients():
    with jax.enable_x64(True):
        a = r(9, 4, 6, 5)                                       # 4 clients, 6 rows, 5 features
        v = r(10, 4, 5)
        solvers = jax.vmap(lambda ai: A.woodbury_solver(ai, 0.5, 0.2))(a)
        out = jax.vmap(lambda s, vi: s(vi))(solvers, v)
        for i in range(4):
            np.testing.assert_allclose(out[i], jnp.linalg.solve(0.5 * a[i].T @ a[i] + 0.2 * jnp.eye(5), v[i]),
                                       rtol=1e-9)


def test_consensus_from_z_minimises_the_augmented_lagrangian():
    """argmin_x Σ_i [⟨π_i, x_i − x⟩ + σ/2‖x_i − x‖²] = mean_i (x_i + π_i/σ) (FedGiA (11))."""
    with jax.enable_x64(True):
        m, sigma = 5, 0.7
        X, Pi = tree(11, (m,)), tree(12, (m,))
        f = r(13, m)
        x_star = A.consensus_from_z(A.z_form(X, Pi, sigma))
        grad = jax.grad(lambda x: A.augmented_lagrangian(f, x, X, Pi, sigma))(x_star)
        assert max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(grad)) < 1e-10
        mask = jnp.array([1, 1, 0, 1, 0])
        masked = A.consensus_from_z(X, mask)
        close(masked, jax.tree.map(lambda v: v[np.array([0, 1, 3])].mean(0), X))


def test_augmented_lagrangian_hand_formula_with_per_client_sigma():
    with jax.enable_x64(True):
        m = 3
        X, Pi, x = tree(14, (m,)), tree(15, (m,)), tree(16)
        f = r(17, m)
        sig = jnp.array([0.5, 1.0, 2.0])
        expect = 0.0
        for i in range(m):
            d = [np.ravel(X[k][i] - x[k]) for k in ("a", "b")]
            p = [np.ravel(Pi[k][i]) for k in ("a", "b")]
            expect += float(f[i]) + sum(pp @ dd for pp, dd in zip(p, d)) + sig[i] / 2 * sum(dd @ dd for dd in d)
        np.testing.assert_allclose(A.augmented_lagrangian(f, x, X, Pi, sig), expect, rtol=1e-12)


def test_augfl_linearised_prox_and_dual():
    """θ_i = θ − (y + w·ĝ)/ρ solves ∇[w⟨ĝ, θ_i − θ⟩ + ⟨y, θ_i − θ⟩ + ρ/2‖θ_i − θ‖²] = 0 (AugFL (9), (11))."""
    with jax.enable_x64(True):
        th, y, g, w, rho = tree(18), tree(19), tree(20), 0.3, 0.7
        ti = A.linearised_prox(th, y, g, w, rho)
        close(ti, jax.tree.map(lambda t, a, b: t - (a + w * b) / rho, th, y, g))
        stat = jax.tree.map(lambda t, a, b, tt: w * b + a + rho * (tt - t), th, y, g, ti)
        assert max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(stat)) < 1e-12
        # after the dual step (12) the dual is the negative weighted gradient: y_i = −w·ĝ
        yi = A.dual_ascent(y, ti, th, rho)
        close(yi, jax.tree.map(lambda b: -w * b, g))


def test_admm_consensus_eq13():
    with jax.enable_x64(True):
        n = 4
        ti, yi = tree(21, (n,)), tree(22, (n,))
        rho = jnp.array([0.5, 0.7, 1.1, 2.0])
        G, lam = tree(23), 3.0
        out = A.admm_consensus(ti, yi, rho, G, lam)
        expect = jax.tree.map(lambda t, y, gg: (jnp.einsum("i,i...->...", rho, t) + y.sum(0) - lam * gg) / rho.sum(),
                              ti, yi, G)
        close(out, expect)
        one = A.admm_consensus(jax.tree.map(lambda v: v[:1], ti), jax.tree.map(lambda v: v[:1], yi), rho[:1])
        close(one, jax.tree.map(lambda t, y: t[0] + y[0] / rho[0], ti, yi))   # spec §11: θ⁺ = θ₁ + y₁/ρ₁
        # minimiser of Σ_i[⟨y_i, θ_i − θ⟩ + ρ_i/2‖θ_i − θ‖²] + λ⟨G, θ⟩ (R_h linearised)
        def lagr(th):
            tot = lam * sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(G), jax.tree.leaves(th)))
            for i in range(n):
                for t, y, c in zip(jax.tree.leaves(ti), jax.tree.leaves(yi), jax.tree.leaves(th)):
                    tot += jnp.vdot(y[i], t[i] - c) + rho[i] / 2 * jnp.sum((t[i] - c) ** 2)
            return tot
        grad = jax.grad(lagr)(out)
        assert max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(grad)) < 1e-10
        close(A.admm_consensus(ti, yi, 0.7), A.admm_consensus(ti, yi, jnp.full((n,), 0.7)))   # scalar ρ


def test_consensus_terms_sum_to_eq13():
    with jax.enable_x64(True):
        n = 3
        ti, yi = tree(24, (n,)), tree(25, (n,))
        rho = jnp.array([0.4, 1.5, 2.5])
        terms = A.consensus_terms(ti, yi, rho)
        close(terms, jax.tree.map(lambda t, y: y + rho.reshape((n,) + (1,) * (t.ndim - 1)) * t, ti, yi))  # s_i
        zero = jax.tree.map(jnp.zeros_like, ti)
        close(A.admm_consensus(zero, terms, rho), A.admm_consensus(ti, yi, rho))  # Eq. 13 = Σ_i s_i / Σ_i ρ_i


# ------------------------------------------------------------------- augmented-Lagrangian gradient, dual ascent


@pytest.mark.parametrize("form", ["sigma", "eta"])
@pytest.mark.parametrize("sign", [1, -1, None])
def test_augmented_lagrangian_grad_is_the_gradient_of_the_coupling_term(form, sign):
    """σ(x_i − x) + s·π = ∇_{x_i}[s⟨π, x_i − x⟩ + (σ/2)‖x_i − x‖²] (autodiff), σ = 1/η in the divisor form."""
    with jax.enable_x64(True):
        xi, x, pi, c = tree(30), tree(31), tree(32), 0.37
        sigma = c if form == "sigma" else 1 / c

        def term(v):
            d = [a - b for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(x))]
            quad = 0.5 * sigma * sum(jnp.sum(dd ** 2) for dd in d)
            return quad if sign is None else quad + sign * sum(jnp.vdot(p, dd) for p, dd in zip(jax.tree.leaves(pi), d))

        kw = {form: c}
        got = (A.augmented_lagrangian_grad(xi, x, **kw) if sign is None
               else A.augmented_lagrangian_grad(xi, x, pi, dual_sign=sign, **kw))
        close(got, jax.grad(term)(xi), 1e-12)


def test_penalty_takes_exactly_one_of_sigma_and_eta_and_a_unit_sign():
    x = tree(33)
    with pytest.raises(ValueError, match="exactly one of sigma"):
        A.augmented_lagrangian_grad(x, x, sigma=1.0, eta=1.0)
    with pytest.raises(ValueError, match="exactly one of sigma"):
        A.dual_ascent(x, x, x)
    with pytest.raises(ValueError, match="dual_sign"):
        A.augmented_lagrangian_grad(x, x, x, sigma=1.0, dual_sign=2)


# Bit-identity with the algorithms' inline expressions (the references below are copied from fljax/algorithms as
# they stand), on float32 trees of mixed magnitudes: eager, and jitted with the scalars traced.

def f32_tree(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    shapes = {"conv": (3, 3, 2, 4), "dense": (7, 5), "bias": (5,)}
    return {k: jnp.asarray(rng.normal(size=s) * 10.0 ** rng.uniform(-3, 3, size=s), dtype) for k, s in shapes.items()}


def assert_bitwise(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x.view(f"u{x.itemsize}"), y.view(f"u{y.itemsize}"))


def _inline_cases():
    """name → (reference, operator, scalar): both take (t1, t2, t3, c); c is the caller's scalar."""
    from fljax import tree as T
    return {
        # FedSLR Phase I (fedslr.py FedSLR.phase_one), c = η_g
        "fedslr_pull": (lambda w, w_t, gamma, c: T.sub(T.scale(1.0 / c, T.sub(w, w_t)), gamma),
                        lambda w, w_t, gamma, c: A.augmented_lagrangian_grad(w, w_t, gamma, sigma=1.0 / c,
                                                                             dual_sign=-1), 10.0),
        "fedslr_dual": (lambda w_t, w_i, gamma, c: T.axpy(1.0 / c, T.sub(w_t, w_i), gamma),
                        lambda w_t, w_i, gamma, c: A.dual_ascent(gamma, w_t, w_i, 1.0 / c), 10.0),
        # FedDyn (feddyn.py FedDyn.client_update), c = α
        "feddyn_pull": (lambda w, theta, g, c: T.sub(T.scale(c, T.sub(w, theta)), g),
                        lambda w, theta, g, c: A.augmented_lagrangian_grad(w, theta, g, sigma=c, dual_sign=-1), 0.1),
        "feddyn_dual": (lambda theta_i, theta, g, c: T.axpy(-c, T.sub(theta_i, theta), g),
                        lambda theta_i, theta, g, c: A.dual_ascent(g, theta_i, theta, -c), 0.1),
        "feddyn_dual_swapped": (lambda theta_i, theta, g, c: T.axpy(-c, T.sub(theta_i, theta), g),
                                lambda theta_i, theta, g, c: A.dual_ascent(g, theta, theta_i, c), 0.1),
        # pFedMe (pfedme.py PFedMe.local_round), c = λ (inner pull) or η·λ (outer step); t3 unused / weight decay
        "pfedme_pull": (lambda th, w, th2, c: T.axpy(1e-3, th, T.scale(c, T.sub(th, w))),
                        lambda th, w, th2, c: T.axpy(1e-3, th, A.augmented_lagrangian_grad(th, w, sigma=c)), 15.0),
        "pfedme_outer": (lambda w, theta, _, c: T.axpy(-c * 15.0, T.sub(w, theta), w),
                         lambda w, theta, _, c: A.dual_ascent(w, w, theta, -c * 15.0), 0.005),
        # FedPD (fedgia_baselines.py FedPD.client_update, which calls the operators), c = η; arrays, leaf by leaf
        "fedpd_pull": (lambda u, x0_i, lam, c: jax.tree.map(lambda u, x0_i, lam: lam + (u - x0_i) / c, u, x0_i, lam),
                       lambda u, x0_i, lam, c: A.augmented_lagrangian_grad(u, x0_i, lam, eta=c), 1.0),
        "fedpd_dual": (lambda x_i, x0_i, lam, c: jax.tree.map(lambda x_i, x0_i, lam: lam + (x_i - x0_i) / c,
                                                              x_i, x0_i, lam),
                       lambda x_i, x0_i, lam, c: A.dual_ascent(lam, x_i, x0_i, eta=c), 1.0),
    }


@pytest.mark.parametrize("name", list(_inline_cases()))
@pytest.mark.parametrize("seed", range(4))
def test_operators_are_bit_identical_to_the_algorithms_inline_expressions(name, seed):
    ref, op, c = _inline_cases()[name]
    args = [f32_tree(100 * seed + j) for j in range(3)]
    scalars = [c, float(np.random.default_rng(seed).uniform(0.01, 50.0))]
    for s in scalars:                                                   # Python scalars, eager
        assert_bitwise(op(*args, s), ref(*args, s))
    for s in scalars:                                                   # traced float32 scalars under jit
        s = jnp.float32(s)
        assert_bitwise(jax.jit(op)(*args, s), jax.jit(ref)(*args, s))
    assert_bitwise(jax.jit(op)(*args, jnp.float32(c)), jax.jit(ref)(*args, jnp.float32(c)))


@pytest.mark.parametrize("name", ["fedpd_pull", "fedpd_dual"])
def test_fedpd_division_form_is_bit_identical_in_float64(name):
    ref, op, _ = _inline_cases()[name]
    with jax.enable_x64(True):
        args = [f32_tree(j, np.float64) for j in range(3)]
        for eta in (1.0, 400.0, 37.3):
            assert_bitwise(op(*args, eta), ref(*args, eta))
            assert_bitwise(jax.jit(op)(*args, jnp.float64(eta)), jax.jit(ref)(*args, jnp.float64(eta)))


def test_single_leaf_programs_are_the_same_operations():
    """On one array the FedSLR/FedDyn/pFedMe pulls trace to the same jaxpr as the inline code: same operations, same
    order (the dual updates differ only in the order of a commutative add)."""
    cases = _inline_cases()
    x = [f32_tree(7 + j)["dense"] for j in range(3)]
    for name in ("fedslr_pull", "feddyn_pull", "pfedme_pull"):
        ref, op, c = cases[name]
        assert str(jax.make_jaxpr(op)(*x, jnp.float32(c))) == str(jax.make_jaxpr(ref)(*x, jnp.float32(c)))

