"""fljax.ops.meta: exact HVP vs the Hessian and finite differences; meta-gradient vs autodiff of the meta-objective."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from fljax.ops import meta as M


def loss(params, batch):
    """Softmax regression with a tanh feature layer: non-quadratic, so FD errors are O(δ²), not zero."""
    x, y = batch
    h = jnp.tanh(x @ params["w1"])
    z = h @ params["w2"] + params["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(z) * jax.nn.one_hot(y, 3), axis=-1))


def problem(seed=0):
    r = np.random.default_rng(seed)
    params = {"w1": jnp.asarray(r.normal(size=(4, 5))), "w2": jnp.asarray(r.normal(size=(5, 3))),
              "b": jnp.asarray(r.normal(size=3))}
    mk = lambda n: (jnp.asarray(r.normal(size=(n, 4))), jnp.asarray(r.integers(0, 3, n)))  # noqa: E731
    v = jax.tree.map(lambda p: jnp.asarray(r.normal(size=p.shape)), params)
    return params, mk(8), mk(6), v


def flat(t):
    return ravel_pytree(t)[0]


def test_adapt_is_one_gradient_step():
    with jax.enable_x64(True):
        params, s, _, _ = problem()
        g = jax.grad(loss)(params, s)
        np.testing.assert_allclose(flat(M.adapt(loss, params, s, 0.1)), flat(params) - 0.1 * flat(g), rtol=1e-12)


def test_exact_hvp_equals_hessian_and_fd():
    with jax.enable_x64(True):
        params, s, _, v = problem(1)
        p0, unravel = ravel_pytree(params)
        hess = jax.hessian(lambda p: loss(unravel(p), s))(p0)
        exact = flat(M.hvp(loss, params, v, s, mode="exact"))
        np.testing.assert_allclose(exact, hess @ flat(v), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(flat(M.hvp(loss, params, v, s, mode="fd", delta=1e-5)), exact, atol=1e-8)
        np.testing.assert_array_equal(flat(M.hvp(loss, params, v, s, mode="none")), 0)
        with pytest.raises(ValueError, match="valid: exact, fd, none"):
            M.hvp(loss, params, v, s, mode="bfgs")


def test_fd_hvp_converges_at_second_order():
    with jax.enable_x64(True):
        params, s, _, v = problem(2)
        exact = flat(M.hvp(loss, params, v, s, mode="exact"))
        deltas = [4e-2, 2e-2, 1e-2, 5e-3]
        errs = [float(jnp.linalg.norm(flat(M.hvp(loss, params, v, s, mode="fd", delta=d)) - exact)) for d in deltas]
        ratios = [errs[i] / errs[i + 1] for i in range(len(errs) - 1)]
        assert all(3.5 < q < 4.5 for q in ratios), ratios                  # halving δ quarters the error
        assert errs[-1] < errs[0] / 50


@pytest.mark.parametrize("alpha", [0.05, 0.3])
def test_meta_grad_exact_equals_autodiff_of_meta_objective(alpha):
    with jax.enable_x64(True):
        params, s, q, _ = problem(3)
        auto = jax.grad(lambda th: loss(M.adapt(loss, th, s, alpha), q))(params)
        np.testing.assert_allclose(flat(M.meta_grad(loss, params, s, q, alpha, mode="exact")), flat(auto),
                                   rtol=1e-10, atol=1e-12)
        fd = flat(M.meta_grad(loss, params, s, q, alpha, mode="fd", delta=1e-4))
        np.testing.assert_allclose(fd, flat(auto), atol=1e-7)
        r = jax.grad(loss)(M.adapt(loss, params, s, alpha), q)             # first order: ĝ = r
        np.testing.assert_allclose(flat(M.meta_grad(loss, params, s, q, alpha, mode="none")), flat(r), rtol=1e-12)
        assert not np.allclose(flat(r), flat(auto), rtol=1e-3)
