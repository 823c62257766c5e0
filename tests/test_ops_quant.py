"""fljax.ops.quant: QuPeD §14 tests T1–T3, penalty, center init, size accounting (§7 table)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fljax.ops import quant as Q

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def sorted_centers(r, m):
    return jnp.asarray(np.sort(r.normal(size=m)))


def test_assign_nearest_ties_to_lowest_index():
    c = jnp.array([-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(Q.assign(jnp.array([-0.5, 0.5, 2.0, -3.0, 0.1]), c), [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(Q.hard_quantize(jnp.array([-0.5, 0.5, 0.49]), c), [-1.0, 0.0, 0.0])


def test_R_is_half_l1_distance_to_quantized():
    r = np.random.default_rng(0)
    x, c = jnp.asarray(r.normal(size=(4, 5))), sorted_centers(r, 4)
    np.testing.assert_allclose(Q.R(x, c), 0.5 * jnp.sum(jnp.abs(Q.hard_quantize(x, c) - x)), rtol=1e-6)
    np.testing.assert_allclose(Q.R(c, c), 0.0)


# -------------------------------------------------------------------------------------------- T1: x-prox


@SETTINGS
@given(seed=seeds, m=st.integers(2, 5), lam=st.floats(0.0, 4.0), eta1=st.floats(0.05, 1.0))
def test_T1_prox_x_attains_minimum_over_candidates(seed, m, lam, eta1):
    """Each coordinate minimises (x − y)²/(2η₁) + (λ/2)min_j|x − c_j| over {c_j} ∪ {y ± th}, th = λη₁/2 (and the
    candidate minimum is the global one: checked on a fine grid)."""
    with jax.enable_x64(True):
        r = np.random.default_rng(seed)
        y, c = r.normal(size=30), np.sort(r.normal(size=m))
        th = lam * eta1 / 2
        z = np.asarray(Q.prox_x(jnp.asarray(y), jnp.asarray(c), th))

        def obj(x):
            return (x - y[:, None]) ** 2 / (2 * eta1) + lam / 2 * np.min(np.abs(x[..., None] - c), axis=-1)

        cands = np.concatenate([np.broadcast_to(c, (30, m)), (y - th)[:, None], (y + th)[:, None]], axis=1)
        best = obj(cands).min(axis=1)
        fz = obj(z[:, None])[:, 0]
        assert np.all(fz <= best + 1e-12)
        grid = np.linspace(-5, 5, 20001)
        assert np.all(fz <= obj(np.broadcast_to(grid, (30, grid.size))).min(axis=1) + 1e-12)


def test_T1_prox_x_limits():
    r = np.random.default_rng(1)
    y, c = jnp.asarray(r.normal(size=50), jnp.float32), sorted_centers(r, 4).astype(jnp.float32)
    np.testing.assert_array_equal(Q.prox_x(y, c, 0.0), y)
    big = float(jnp.max(jnp.abs(y - Q.hard_quantize(y, c)))) + 1e-3
    np.testing.assert_array_equal(Q.prox_x(y, c, big), Q.hard_quantize(y, c))


# -------------------------------------------------------------------------------------------- T2: c-prox


def test_T2_center_update_signs_balance_and_sorting():
    c = jnp.array([-1.0, 0.0, 1.0])
    x = jnp.array([-1.2, -0.8, 0.1, 0.2, 0.3])         # c0: balanced; c1: three members above; c2: none
    lam, eta2 = 0.2, 0.5
    zero = jnp.zeros(3)
    med = Q.center_update(c, zero, x, eta2, lam, sign="median")
    np.testing.assert_allclose(med, [-1.0, 0.0 + lam * eta2 / 2 * 3, 1.0], atol=1e-7)
    prn = Q.center_update(c, zero, x, eta2, lam, sign="printed")
    np.testing.assert_allclose(prn, [-1.0, 0.0 - lam * eta2 / 2 * 3, 1.0], atol=1e-7)
    np.testing.assert_allclose(Q.center_update(c, jnp.array([1.0, 2.0, 3.0]), x, eta2, lam, prox=False),
                               c - eta2 * jnp.array([1.0, 2.0, 3.0]), atol=1e-7)
    moved = Q.center_update(c, zero, x, eta2, 10.0, sign="median")   # c1 jumps past c2: output is re-sorted
    np.testing.assert_allclose(moved, [-1.0, 1.0, 7.5], atol=1e-6)
    with pytest.raises(ValueError):
        Q.center_update(c, zero, x, eta2, lam, sign="mean")


# ---------------------------------------------------------------------------------- T3: P → ∞ gradients


def test_T3_hard_quantizer_gradients():
    r = np.random.default_rng(2)
    x, c = jnp.asarray(r.normal(size=(6, 4))), sorted_centers(r, 4)
    wts = jnp.asarray(r.normal(size=(6, 4)))
    f = lambda q: jnp.sum(jnp.sin(q) * wts)  # noqa: E731
    gx, gc = jax.grad(lambda xx, cc: f(Q.hard_quantize(xx, cc)), argnums=(0, 1))(x, c)
    np.testing.assert_array_equal(gx, 0)
    q = Q.hard_quantize(x, c)
    seg = jax.ops.segment_sum(jax.grad(f)(q).ravel(), Q.assign(x, c).ravel(), num_segments=4)
    np.testing.assert_allclose(gc, seg, rtol=1e-6)


def test_T3_soft_quantizer_tends_to_hard():
    with jax.enable_x64(True):
        r = np.random.default_rng(3)
        c = jnp.asarray([-1.0, -0.2, 0.5, 1.4])
        mids = (c[1:] + c[:-1]) / 2
        x = jnp.asarray(r.uniform(-2, 2, size=200))
        x = x[jnp.min(jnp.abs(x[:, None] - mids), axis=1) > 0.05]      # away from the midpoints
        wts = jnp.asarray(r.normal(size=x.shape))
        f = lambda q: jnp.sum(jnp.sin(q) * wts)  # noqa: E731
        seg = jax.grad(lambda cc: f(Q.hard_quantize(x, cc)))(c)
        errs, gerrs = [], []
        for P in (10.0, 100.0, 1000.0):
            errs.append(float(jnp.max(jnp.abs(Q.soft_quantize(x, c, P) - Q.hard_quantize(x, c)))))
            gerrs.append(float(jnp.max(jnp.abs(jax.grad(lambda cc: f(Q.soft_quantize(x, cc, P)))(c) - seg))))
        assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-10
        assert gerrs[0] > gerrs[1] > gerrs[2] and gerrs[2] < 1e-8
        # definition at a point: c1 + Σ gaps·σ(P(x − mid))
        P, x0 = 2.0, 0.3
        manual = c[0] + sum((c[j] - c[j - 1]) / (1 + np.exp(-P * (x0 - (c[j] + c[j - 1]) / 2))) for j in range(1, 4))
        np.testing.assert_allclose(Q.soft_quantize(jnp.asarray(x0), c, P), manual, rtol=1e-12)


# ----------------------------------------------------------------------------------------- init, accounting


def test_init_centers():
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(4).normal(size=1000))
        c1 = Q.init_centers(x, 1)
        np.testing.assert_allclose(c1, [x[x < 0].mean(), x[x >= 0].mean()], rtol=1e-12)
        c2 = Q.init_centers(x, 2)
        np.testing.assert_allclose(c2, np.quantile(np.asarray(x), [0.125, 0.375, 0.625, 0.875]), rtol=1e-12)
        np.testing.assert_allclose(Q.init_centers(x, 2, "linspace"), np.linspace(x.min(), x.max(), 4))
        assert np.all(np.diff(np.asarray(Q.init_centers(x, 3))) > 0)


CNN1 = [5 * 5 * 3 * 6, 6, 5 * 5 * 6 * 16, 16, 400 * 120, 120, 120 * 84, 84, 84 * 10, 10]
CNN1_Q = [False, False, True, False, True, False, True, False, False, False]
CNN2 = CNN1[:4] + [5 * 5 * 16 * 32, 32, 800 * 120] + CNN1[5:]
CNN2_Q = CNN1_Q[:4] + [True, False, True] + CNN1_Q[5:]


@pytest.mark.parametrize("sizes,qmask,d,dq,bits,bpp,ratio", [
    (CNN1, CNN1_Q, 62006, 60480, 2, 2.745, 11.66), (CNN1, CNN1_Q, 62006, 60480, 1, 1.766, 18.12),
    (CNN2, CNN2_Q, 122838, 121280, 2, 2.385, 13.42), (CNN2, CNN2_Q, 122838, 121280, 1, 1.395, 22.93),
    ([150] + CNN1[1:], CNN1_Q, 61706, 60480, 2, 2.602, 12.30),
    ([150] + CNN1[1:], CNN1_Q, 61706, 60480, 1, 1.619, 19.76),
])
def test_bits_accounting_reproduces_quped_table(sizes, qmask, d, dq, bits, bpp, ratio):
    assert sum(sizes) == d and sum(s for s, q in zip(sizes, qmask) if q) == dq
    total, per_param, comp = Q.bits_accounting(sizes, qmask, bits)
    assert total == bits * dq + 32 * 2**bits * sum(qmask) + 32 * (d - dq)
    assert round(per_param, 3) == pytest.approx(bpp, abs=1e-3)
    assert round(comp, 2) == pytest.approx(ratio, abs=1e-2)


def test_bits_accounting_accepts_array_trees():
    tree = {"a": jnp.zeros((10, 10)), "b": jnp.zeros(5)}
    assert Q.bits_accounting(tree, {"a": True, "b": False}, 1)[0] == 100 + 64 + 5 * 32
    with pytest.raises(ValueError):
        Q.bits_accounting(tree, {"a": True}, 1)


# ------------------------------------------------------------------------------------ assignment rules (D7)


def test_assign_searchsorted_for_many_centers_equals_argmin():
    """m > 4 assigns by searchsorted on the midpoints: the same as the argmin (ties at midpoints to the lower)."""
    r = np.random.default_rng(5)
    c = jnp.asarray(np.sort(r.normal(size=8)), jnp.float32)
    x = jnp.concatenate([jnp.asarray(r.normal(size=500) * 2, jnp.float32), c])
    ref = jnp.argmin(jnp.abs(x[:, None] - c), axis=-1)
    np.testing.assert_array_equal(Q.assign(x, c), ref)
    grid = jnp.arange(8, dtype=jnp.float32)                     # exact midpoints 0.5, 1.5, ...: the lower index
    np.testing.assert_array_equal(Q.assign(grid[:-1] + 0.5, grid), np.arange(7))


def test_assign_sign_rule_for_one_bit():
    c = jnp.array([-0.1, 0.5])
    x = jnp.array([-2.0, -0.0, 0.0, 0.1, 0.2, 3.0])
    np.testing.assert_array_equal(Q.assign(x, c, "sign"), [0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(Q.assign(x, c), [0, 0, 0, 0, 0, 1])   # nearest (midpoint 0.2 goes down)
    with pytest.raises(ValueError, match="m = 2"):
        Q.assign(x, jnp.array([-1.0, 0.0, 1.0]), "sign")
    with pytest.raises(ValueError, match="unknown assign rule"):
        Q.assign(x, c, "floor")


def test_center_update_gradient_clip():
    c = jnp.array([-1.0, 1.0])
    out = Q.center_update(c, jnp.array([50.0, -3.0]), jnp.zeros(3), 0.1, 0.0, prox=False, grad_clip=10.0)
    np.testing.assert_allclose(out, [-1.0 - 1.0, 1.0 + 0.3], rtol=1e-6)


def test_center_update_pools_members_of_several_leaves():
    """One center vector for several leaves (D6 option): the counts run over the concatenated members."""
    c = jnp.array([-1.0, 1.0])
    a, b = jnp.array([1.2, 1.3]), jnp.array([[1.4], [0.9]])
    joint = Q.center_update(c, jnp.zeros(2), jnp.concatenate([a.ravel(), b.ravel()]), 1.0, 0.2)
    np.testing.assert_allclose(joint, [-1.0, 1.0 + 0.1 * (3 - 1)], rtol=1e-6)
