"""fljax.ops.sam: ρ = 0 is the plain gradient; the quadratic oracle A(x + ρAx/‖Ax‖); ‖e‖ = ρ; masks."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from fljax.ops import sam as S

SETTINGS = settings(max_examples=25, deadline=None)


def quad_problem(seed, n=5):
    r = np.random.default_rng(seed)
    b = r.normal(size=(n, n))
    return jnp.asarray(b @ b.T + 0.1 * np.eye(n)), jnp.asarray(r.normal(size=n))


def sam_grad(vg, rho, **kw):
    """The SAM gradient alone, from ``sam_value_and_grad``."""
    return lambda *a: S.sam_value_and_grad(vg, rho, **kw)(*a)[1]


def test_rho_zero_is_the_plain_gradient_statically():
    vg = jax.value_and_grad(lambda p, batch: jnp.sum((p["w"] * batch) ** 2))
    assert S.sam_value_and_grad(vg, 0.0) is vg and S.sam_value_and_grad(vg, 0) is vg
    params, batch = {"w": jnp.arange(3.0)}, jnp.ones(3)
    traced = jax.jit(lambda p, b, rho: S.sam_value_and_grad(vg, rho)(p, b))(params, batch, 0.0)  # traced ρ = 0
    value, grad = vg(params, batch)
    np.testing.assert_allclose(traced[0], value)
    np.testing.assert_allclose(traced[1]["w"], grad["w"])


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), rho=st.floats(0.01, 2.0))
def test_sam_on_quadratic_matches_oracle(seed, rho):
    """f = ½xᵀAx: SAM gradient = A(x + ρAx/‖Ax‖), the value is f(x), and the perturbation has norm ρ."""
    with jax.enable_x64(True):
        a, x = quad_problem(seed)
        f = lambda v: 0.5 * v @ a @ v  # noqa: E731
        ax = a @ x
        value, grad = S.sam_value_and_grad(jax.value_and_grad(f), rho)(x)
        np.testing.assert_allclose(grad, a @ (x + rho * ax / jnp.linalg.norm(ax)), rtol=1e-9)
        np.testing.assert_allclose(value, f(x), rtol=1e-12)
        e = S.sam_perturbation(ax, rho)
        np.testing.assert_allclose(jnp.linalg.norm(e), rho, rtol=1e-9)


def test_masked_sam_perturbs_only_selected_leaves_with_their_own_norm():
    with jax.enable_x64(True):
        a, _ = quad_problem(1, 4)

        def loss(p, batch):
            u, v = p["body"]["u"], p["head"]["v"]
            return 0.5 * u @ a @ u + jnp.sum(u) * jnp.sum(v * batch) + jnp.sum(v ** 2)

        params = {"body": {"u": jnp.asarray([0.3, -1.0, 2.0, 0.5])}, "head": {"v": jnp.asarray([1.0, -2.0])}}
        batch = jnp.asarray([0.5, 1.5])
        vg = jax.value_and_grad(loss)
        g0 = vg(params, batch)[1]
        rho = 0.4
        e = S.sam_perturbation(g0, rho, mask="body")
        np.testing.assert_array_equal(e["head"]["v"], 0)
        np.testing.assert_allclose(jnp.linalg.norm(e["body"]["u"]), rho, rtol=1e-9)
        np.testing.assert_allclose(e["body"]["u"], rho * g0["body"]["u"] / jnp.linalg.norm(g0["body"]["u"]))
        shifted = {"body": {"u": params["body"]["u"] + e["body"]["u"]}, "head": params["head"]}
        value, out = S.sam_value_and_grad(vg, rho, mask="body")(params, batch)
        np.testing.assert_allclose(value, loss(params, batch))
        jax.tree.map(np.testing.assert_allclose, out, vg(shifted, batch)[1])
        # predicate and leaf-mask forms agree with the regex
        pred = sam_grad(vg, rho, mask=lambda path, x: path.startswith("body"))(params, batch)
        leafmask = sam_grad(vg, rho, mask={"body": {"u": True}, "head": {"v": False}})(params, batch)
        jax.tree.map(np.testing.assert_allclose, pred, out)
        jax.tree.map(np.testing.assert_allclose, leafmask, out)
        # unmasked SAM uses one global norm over all leaves
        e_all = S.sam_perturbation(g0, rho)
        norm = jnp.sqrt(sum(jnp.sum(v ** 2) for v in jax.tree.leaves(e_all)))
        np.testing.assert_allclose(norm, rho, rtol=1e-9)
        assert not np.allclose(e_all["body"]["u"], e["body"]["u"])


def test_sam_value_and_grad_returns_unperturbed_value_and_sam_grad():
    """Extra arguments reach both calls; with ``has_aux`` the value and aux are the unperturbed ones."""
    with jax.enable_x64(True):
        a, x = quad_problem(2)
        f = lambda v, scale: scale * 0.5 * v @ a @ v  # noqa: E731
        value, grad = S.sam_value_and_grad(jax.value_and_grad(f), 0.3)(x, 2.0)
        np.testing.assert_allclose(value, f(x, 2.0))
        ax = 2.0 * a @ x
        np.testing.assert_allclose(grad, 2.0 * a @ (x + 0.3 * ax / jnp.linalg.norm(ax)), rtol=1e-9)
        aux_vg = jax.value_and_grad(lambda v: (f(v, 1.0), {"n": jnp.sum(v)}), has_aux=True)
        (val, aux), aux_grad = S.sam_value_and_grad(aux_vg, 0.3)(x)
        np.testing.assert_allclose(val, f(x, 1.0))
        np.testing.assert_allclose(aux["n"], jnp.sum(x))
        np.testing.assert_allclose(aux_grad, a @ (x + 0.3 * (a @ x) / jnp.linalg.norm(a @ x)), rtol=1e-9)


def test_sam_zero_gradient_gives_finite_result():
    vg = jax.value_and_grad(lambda v: jnp.sum(v ** 2))
    value, grad = S.sam_value_and_grad(vg, 0.5)(jnp.zeros(3))
    assert float(value) == 0.0
    np.testing.assert_array_equal(grad, 0)
