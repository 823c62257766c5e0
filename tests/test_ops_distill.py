"""fljax.ops.distill: KL properties, temperature, feature L2, InfoNCE vs a loop, CRD vs its formula."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fljax.ops import distill as D

SETTINGS = settings(max_examples=25, deadline=None)


def logits(seed, shape, scale=2.0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), T=st.floats(0.5, 5.0))
def test_kl_nonnegative_zero_iff_equal_and_matches_definition(seed, T):
    with jax.enable_x64(True):
        t, s = logits(seed, (6, 5)), logits(seed + 1, (6, 5))
        kl = float(D.kl_divergence(t, s, T))
        pt, ps = np.asarray(jax.nn.softmax(t / T)), np.asarray(jax.nn.softmax(s / T))
        np.testing.assert_allclose(kl, np.mean(np.sum(pt * (np.log(pt) - np.log(ps)), axis=1)), rtol=1e-10)
        assert kl > 0
        assert abs(float(D.kl_divergence(t, t, T))) < 1e-14
        assert abs(float(D.kl_divergence(t, t + 3.0, T))) < 1e-12          # softmax is shift invariant


def test_kl_temperature_scaling_and_mask():
    with jax.enable_x64(True):
        t, s = logits(0, (8, 4)), logits(1, (8, 4))
        T = 4.0
        np.testing.assert_allclose(D.kl_divergence(t, s, T), D.kl_divergence(t / T, s / T), rtol=1e-12)
        np.testing.assert_allclose(D.kl_divergence(t, s, T, scale_t2=True), T**2 * D.kl_divergence(t, s, T),
                                   rtol=1e-12)
        mask = jnp.array([1, 1, 0, 1, 0, 0, 1, 0])
        keep = np.flatnonzero(np.asarray(mask))
        np.testing.assert_allclose(D.kl_divergence(t, s, mask=mask), D.kl_divergence(t[keep], s[keep]), rtol=1e-12)
        assert float(D.kl_divergence(t, s, mask=jnp.zeros(8))) == 0.0
        hot = jnp.where(jnp.arange(4) == 0, 0.0, -jnp.inf)[None].repeat(8, 0)   # one-hot teacher with −inf logits
        np.testing.assert_allclose(D.kl_divergence(hot, s), -jnp.mean(jax.nn.log_softmax(s)[:, 0]), rtol=1e-12)


def test_feature_l2():
    with jax.enable_x64(True):
        a, b = logits(2, (5, 3)), logits(3, (5, 3))
        np.testing.assert_allclose(D.feature_l2(a, b), np.mean(np.sum((np.asarray(a) - np.asarray(b)) ** 2, 1)))
        na = np.asarray(a) / np.linalg.norm(a, axis=1, keepdims=True)
        nb = np.asarray(b) / np.linalg.norm(b, axis=1, keepdims=True)
        np.testing.assert_allclose(D.feature_l2(a, b, normalize=True), np.mean(np.sum((na - nb) ** 2, 1)))
        assert float(D.feature_l2(a, a)) == 0.0
        np.testing.assert_allclose(D.feature_l2(a, b, mask=jnp.array([0, 1, 0, 0, 0])),
                                   np.sum((np.asarray(a[1]) - np.asarray(b[1])) ** 2))


def test_info_nce_against_naive_loop():
    with jax.enable_x64(True):
        za, zb = logits(4, (6, 3)), logits(5, (6, 3))
        tau = 0.3
        total = 0.0
        for j in range(6):
            scores = [float(za[j] @ zb[k]) / tau for k in range(6)]
            total += -(scores[j] - np.log(np.sum(np.exp(scores))))
        np.testing.assert_allclose(D.info_nce(za, zb, tau), total / 6, rtol=1e-12)


@pytest.mark.parametrize("hidden", [0, 16])
def test_projection_head_outputs_unit_vectors(hidden):
    head = D.ProjectionHead(out=8, hidden=hidden)
    x = logits(6, (4, 5))
    params = head.init(jax.random.PRNGKey(0), x)
    z = head.apply(params, x)
    assert z.shape == (4, 8)
    np.testing.assert_allclose(jnp.linalg.norm(z, axis=-1), 1.0, rtol=1e-5)
    assert len(params["params"]) == (2 if hidden else 1)


def test_crd_critic_and_loss_equal_the_formula():
    """h = e/(e + N/D), e = exp(⟨c,s⟩/τ)/Z; R_h = −E_pos log h − N·E_neg log(1 − h) (AugFL §3)."""
    with jax.enable_x64(True):
        b, n, d, data, tau, z = 4, 7, 5, 50, 0.5, 3.0
        norm = lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
        c_pos, s_pos, c_neg = norm(logits(7, (b, d))), norm(logits(8, (b, d))), norm(logits(9, (b, n, d)))
        h_pos = D.crd_critic(c_pos, s_pos, n, data, tau, z)
        h_neg = D.crd_critic(c_neg, s_pos[:, None, :], n, data, tau, z)
        e = np.exp(np.sum(np.asarray(c_pos) * np.asarray(s_pos), -1) / tau) / z
        np.testing.assert_allclose(h_pos, e / (e + n / data), rtol=1e-12)
        formula = -np.mean(np.log(h_pos)) - n * np.mean(np.log(1 - np.asarray(h_neg)))
        np.testing.assert_allclose(D.crd_loss(c_pos, s_pos, c_neg, data, tau, z), formula, rtol=1e-10)
        # the loss falls when the positive pair aligns
        assert float(D.crd_loss(s_pos, s_pos, c_neg, data, tau)) < float(D.crd_loss(-s_pos, s_pos, c_neg, data, tau))


def test_kl_teacher_only_softening():
    """QuPeD D4's option: the teacher softened by T, the student at T_s = 1."""
    r = np.random.default_rng(7)
    zt, zs = jnp.asarray(r.normal(size=(5, 4))), jnp.asarray(r.normal(size=(5, 4)))
    T = 3.0
    pt = np.exp(np.asarray(zt) / T) / np.exp(np.asarray(zt) / T).sum(-1, keepdims=True)
    ps = np.exp(np.asarray(zs)) / np.exp(np.asarray(zs)).sum(-1, keepdims=True)
    want = np.mean(np.sum(pt * (np.log(pt) - np.log(ps)), axis=-1))
    np.testing.assert_allclose(D.kl_divergence(zt, zs, T, student_temperature=1.0), want, rtol=1e-5)
