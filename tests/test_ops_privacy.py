"""fljax.ops.privacy against definitions: clipped norms never exceed the bound (hypothesis), clipping leaves short
updates bit for bit, the Gaussian noise's empirical std is z·C/W, z = 0 with a clip above every norm is plain weighted
averaging bit for bit, adaptive clipping's noise split and quantile tracking, per-example gradients and DP-SGD's
gradient against a loop over examples, Poisson sampling, and vmap over clients = a Python loop."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fljax import tree as T
from fljax.data.batching import Batch
from fljax.ops import privacy as P

SETTINGS = settings(max_examples=25, deadline=None)
ROUNDING = 1 + 16 * 2.0 ** -24  # a float32 norm is the true norm within a few ulps for these sizes
SIGMAS = 5.0  # statistical checks: 5 standard errors (false alarm < 6e-7 per check)


def _tree(seed, scale=1.0, shapes=((6, 5), (5,), (7,))):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return {f"l{i}": scale * jax.random.normal(k, s) for i, (k, s) in enumerate(zip(keys, shapes))}


def _norm64(t):
    return math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in jax.tree.leaves(t)))


def _stack(trees):
    return jax.tree.map(lambda *a: jnp.stack(a), *trees)


# --------------------------------------------------------------------------------------------------- clipping


@SETTINGS
@given(seed=st.integers(0, 2 ** 31 - 1), log_scale=st.floats(-6, 6), log_clip=st.floats(-3, 3),
       rows=st.integers(1, 40), cols=st.integers(1, 40), per_layer=st.booleans())
def test_clipped_norm_never_exceeds_the_bound(seed, log_scale, log_clip, rows, cols, per_layer):
    x = _tree(seed, 10.0 ** log_scale, ((rows, cols), (cols,), (3,)))
    c = 10.0 ** log_clip
    clipped, norm = (P.clip_per_layer if per_layer else P.clip_by_norm)(x, c)
    assert _norm64(clipped) <= c * ROUNDING
    assert float(norm) == pytest.approx(_norm64(x), rel=1e-5)
    if per_layer:
        bounds = P.layer_clip_norms(x, c)
        assert sum(b * b for b in jax.tree.leaves(bounds)) == pytest.approx(c * c, rel=1e-12)
        for leaf, b, orig in zip(jax.tree.leaves(clipped), jax.tree.leaves(bounds), jax.tree.leaves(x)):
            assert _norm64(leaf) <= b * ROUNDING
            if _norm64(orig) > b:  # a clipped leaf keeps its direction and lands on its bound
                np.testing.assert_allclose(np.asarray(leaf) * _norm64(orig) / b, orig, rtol=2e-5)
    elif _norm64(x) > c:
        assert _norm64(clipped) == pytest.approx(c, rel=1e-5)
        for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(x)):
            np.testing.assert_allclose(np.asarray(a) * _norm64(x) / c, b, rtol=2e-5)


def test_an_update_within_the_bound_is_left_bit_for_bit_and_the_clip_may_be_traced():
    x = _tree(1)
    n = _norm64(x)
    for fn in (P.clip_by_norm, P.clip_per_layer):
        out, _ = jax.jit(fn)(x, jnp.float32(100 * n))  # a traced clip norm (adaptive clipping)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(x)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    out, _ = P.clip_by_norm({"w": jnp.zeros(3)}, 1.0)  # a zero update is not divided by its norm
    np.testing.assert_array_equal(out["w"], np.zeros(3))


def test_layer_clip_norms_follow_the_leaf_sizes():
    x = {"a": jnp.zeros((3, 4)), "b": jnp.zeros(4)}  # 12 + 4 entries
    b = P.layer_clip_norms(x, 2.0)
    assert b["a"] == pytest.approx(2.0 * math.sqrt(12 / 16)) and b["b"] == pytest.approx(2.0 * math.sqrt(4 / 16))


# -------------------------------------------------------------------------------------------- Gaussian mechanism


def test_clip_above_every_norm_with_no_noise_is_plain_weighted_averaging_bit_for_bit():
    clients = 6
    uploads = _stack([_tree(10 + i) for i in range(clients)])
    weights = jnp.array([3.0, 1.0, 0.0, 2.0, 5.0, 1.0])
    big = 10 * max(_norm64(jax.tree.map(lambda a: a[i], uploads)) for i in range(clients))
    clipped = jax.vmap(lambda u: P.clip_by_norm(u, big)[0])(uploads)
    want = T.weighted_mean_clients(uploads, weights)
    for fn in (P.private_mean, jax.jit(P.private_mean, static_argnums=3)):
        got = fn(clipped, weights, jnp.sum(weights), 0)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # with a reference (uploads are models): the coefficient of the reference is exactly 0
    ref = _tree(99)
    got = P.private_mean(clipped, weights, jnp.sum(weights), 0, reference=ref)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_private_mean_with_a_reference_is_the_reference_plus_the_mean_delta():
    clients, W = 5, 7.5  # a fixed denominator other than Σw (Poisson sampling)
    ref = _tree(1)
    deltas = _stack([_tree(20 + i, 0.1) for i in range(clients)])
    uploads = jax.tree.map(lambda r, d: r + d, ref, deltas)
    w = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0])
    got = P.private_mean(uploads, w, W, 0, reference=ref)
    for g, r, d in zip(*(jax.tree.leaves(t) for t in (got, ref, deltas))):
        want = np.asarray(r, np.float64) + np.tensordot(np.asarray(w, np.float64), np.asarray(d, np.float64), 1) / W
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("z,clip,W", [(1.0, 0.5, 10.0), (0.3, 2.0, 3.5)])
def test_noise_std_is_z_times_clip_over_the_expected_weight(z, clip, W):
    """The convention: noise N(0, (zC)²) on the sum, divided by W, i.e. std zC/W on the mean. 2,000 draws of a
    40-entry aggregate: the sample variance of n = 80,000 normals is within 5·√(2/n) of σ² (relative), their mean
    within 5σ/√n of 0."""
    values = _stack([_tree(30 + i, shapes=((4, 5), (20,))) for i in range(4)])
    w = jnp.array([1.0, 0.5, 1.0, 0.0])
    base = P.private_mean(values, w, W, 0)
    draws = jax.jit(jax.vmap(lambda k: P.private_mean(values, w, W, z * clip, k)))(
        jax.random.split(jax.random.PRNGKey(0), 2000))
    noise = np.concatenate([(np.asarray(d, np.float64) - np.asarray(b, np.float64)).reshape(2000, -1)
                            for d, b in zip(jax.tree.leaves(draws), jax.tree.leaves(base))], axis=1).ravel()
    sigma, n = z * clip / W, noise.size
    assert abs(noise.var() / sigma ** 2 - 1) < SIGMAS * math.sqrt(2 / n)
    assert abs(noise.mean()) < SIGMAS * sigma / math.sqrt(n)


# -------------------------------------------------------------------------------------------- adaptive clipping


def test_adaptive_noise_split_composes_to_the_target_multiplier():
    """z_Δ for the updates and 2σ_b for the count (sensitivity ½) compose to one Gaussian of multiplier z: checked
    with dp-accounting (the RDP of Gaussians adds: α/2z_Δ² + α/2(2σ_b)² = α/2z²)."""
    import dp_accounting as dpa

    z, sb = 1.1, 2.5
    zd = P.adaptive_noise_multiplier(z, sb)
    assert zd ** -2 + (2 * sb) ** -2 == pytest.approx(z ** -2, rel=1e-12) and zd > z
    pair, one = dpa.rdp.RdpAccountant(), dpa.rdp.RdpAccountant()
    pair.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(zd), dpa.GaussianDpEvent(2 * sb)]))
    one.compose(dpa.GaussianDpEvent(z))
    assert pair.get_epsilon(1e-6) == pytest.approx(one.get_epsilon(1e-6), rel=1e-9)
    assert P.adaptive_noise_multiplier(0.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="σ_b > z/2"):
        P.adaptive_noise_multiplier(1.0, 0.5)


def test_noised_fraction_centres_the_count_and_is_unbiased():
    below = jnp.array([1, 0, 1, 1, 0, 1, 1, 0], bool)
    valid = jnp.array([1, 1, 1, 1, 1, 1, 0, 0], bool)  # the last two slots are empty
    exact = 4 / 6
    assert float(P.noised_fraction(None, below, 0, 6.0, valid)) == pytest.approx(exact)
    sb, n = 1.5, 4000
    draws = jax.vmap(lambda k: P.noised_fraction(k, below, sb, 6.0, valid))(jax.random.split(jax.random.PRNGKey(1), n))
    draws = np.asarray(draws, np.float64)
    assert abs(draws.mean() - exact) < SIGMAS * (sb / 6) / math.sqrt(n)
    assert abs(draws.std() / (sb / 6) - 1) < SIGMAS * math.sqrt(1 / (2 * n))


def test_geometric_update_tracks_the_target_quantile_of_update_norms():
    """C ← C·exp(−η(b̄ − γ)) with b̄ the fraction of norms ≤ C: from a clip 100× too large, 400 rounds of 200
    log-normal norms (noised count, σ_b = m/20) bring C to the γ-quantile (Andrew et al. 2021)."""
    m, gamma, lr = 200, 0.3, 0.2

    def round_(c, key):
        k_norms, k_noise = jax.random.split(key)
        norms = jnp.exp(jax.random.normal(k_norms, (m,)))
        frac = P.noised_fraction(k_noise, norms <= c, m / 20, float(m))
        return P.geometric_clip_update(c, frac, gamma, lr), c

    _, path = jax.lax.scan(round_, jnp.float32(100 * math.exp(0.0)), jax.random.split(jax.random.PRNGKey(2), 400))
    quantile = math.exp(0.5244005127080407 * -1)  # the 0.3-quantile of a standard log-normal: exp(Φ⁻¹(0.3))
    settled = np.asarray(path[-100:])
    assert abs(np.log(settled.mean() / quantile)) < 0.1
    assert P.geometric_clip_update(2.0, 0.3, 0.3, 0.2) == pytest.approx(2.0)  # at the quantile C stays put


# ------------------------------------------------------------------------------------------ per-example clipping


def _linear_problem(seed=0, n=6, d=4, classes=3):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {"w": jax.random.normal(k[0], (d, classes)), "b": jax.random.normal(k[1], (classes,))}
    batch = Batch(x=jax.random.normal(k[2], (n, d)), y=jnp.arange(n) % classes,
                  mask=jnp.array([1, 1, 1, 1, 0, 0][:n], jnp.float32))

    def loss(p, b):  # a masked mean cross-entropy, like Model.loss
        logits = b.x @ p["w"] + p["b"]
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), b.y[:, None], axis=1)[:, 0]
        return jnp.sum(ce * b.mask) / jnp.maximum(jnp.sum(b.mask), 1.0)

    return params, batch, loss


def _example(batch, j):
    return jax.tree.map(lambda a: a[j:j + 1], batch)


def test_per_example_gradients_equal_a_loop_over_examples():
    params, batch, loss = _linear_problem()
    losses, grads = jax.jit(P.per_example_value_and_grad, static_argnums=0)(loss, params, batch)
    for j in range(batch.x.shape[0]):
        lj, gj = jax.value_and_grad(loss)(params, _example(batch, j))
        assert float(losses[j]) == pytest.approx(float(lj), rel=1e-6, abs=1e-7)
        for a, b in zip(jax.tree.leaves(jax.tree.map(lambda g: g[j], grads)), jax.tree.leaves(gj)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("per_layer", [False, True])
def test_dp_sgd_gradient_is_the_clipped_masked_sum_over_the_batch_size(per_layer):
    params, batch, loss = _linear_problem(1)
    clip, n = 0.05, batch.x.shape[0]  # small enough to clip every example
    fn = jax.jit(P.private_value_and_grad(loss, clip, 0.0, per_layer=per_layer))
    value, g = fn(params, batch, None)
    want = jax.tree.map(jnp.zeros_like, params)
    for j in range(n):  # the definition, one example at a time
        gj = jax.grad(loss)(params, _example(batch, j))
        gj = (P.clip_per_layer if per_layer else P.clip_by_norm)(gj, clip)[0]
        want = jax.tree.map(lambda a, b: a + batch.mask[j] * b, want, gj)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, np.asarray(b) / n, rtol=1e-5, atol=1e-8)
    assert float(value) == pytest.approx(float(loss(params, batch)), rel=1e-6)
    # a fixed batch size B (the lot size) other than the batch's length divides instead
    _, g8 = P.private_value_and_grad(loss, clip, 0.0, batch_size=8, per_layer=per_layer)(params, batch, None)
    for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g)):
        np.testing.assert_allclose(a, np.asarray(b) * n / 8, rtol=1e-6)


def test_dp_sgd_noise_std_is_z_clip_over_batch_size():
    params, batch, loss = _linear_problem(2)
    z, clip, n = 1.3, 0.5, 6
    fn = P.private_value_and_grad(loss, clip, z)
    _, base = P.private_value_and_grad(loss, clip, 0.0)(params, batch, None)
    draws = jax.jit(jax.vmap(lambda k: fn(params, batch, k)[1]))(jax.random.split(jax.random.PRNGKey(3), 3000))
    noise = np.concatenate([(np.asarray(d, np.float64) - np.asarray(b, np.float64)).reshape(3000, -1)
                            for d, b in zip(jax.tree.leaves(draws), jax.tree.leaves(base))], axis=1).ravel()
    sigma = z * clip / n
    assert abs(noise.var() / sigma ** 2 - 1) < SIGMAS * math.sqrt(2 / noise.size)


# ------------------------------------------------------------------------------------------------ Poisson sampling


def test_poisson_cohort_draws_each_client_with_probability_q():
    n_clients, q, draws = 40, 0.15, 4000
    ids, valid = jax.jit(jax.vmap(lambda k: P.poisson_cohort(k, n_clients, q)))(
        jax.random.split(jax.random.PRNGKey(0), draws))
    ids, valid = np.asarray(ids), np.asarray(valid)
    member = np.zeros((draws, n_clients))
    for r in range(draws):
        chosen = ids[r][valid[r]]
        assert np.all(np.diff(chosen) > 0) and np.all(ids[r][~valid[r]] == n_clients)  # ascending, then the fill
        assert np.all(valid[r][:valid[r].sum()])  # the sampled ids come first
        member[r, chosen] = 1
    sd = math.sqrt(q * (1 - q) / draws)
    assert np.all(np.abs(member.mean(0) - q) < SIGMAS * sd)  # each client: Bernoulli(q) (5σ each, 40 clients)
    counts = member.sum(1)  # the cohort size is Binomial(N, q)
    assert abs(counts.mean() - n_clients * q) < SIGMAS * math.sqrt(n_clients * q * (1 - q) / draws)
    assert abs(counts.var() / (n_clients * q * (1 - q)) - 1) < 0.1
    corr = np.corrcoef(member[:, :2].T)[0, 1]  # independence of two clients
    assert abs(corr) < SIGMAS / math.sqrt(draws)


def test_poisson_cohort_truncates_to_a_uniform_subset_of_the_drawn_clients():
    n_clients, q, cap, draws = 12, 0.6, 4, 3000
    full = jax.jit(jax.vmap(lambda k: P.poisson_cohort(k, n_clients, q)))
    trunc = jax.jit(jax.vmap(lambda k: P.poisson_cohort(k, n_clients, q, cap)))
    keys = jax.random.split(jax.random.PRNGKey(5), draws)
    (fi, fv), (ti, tv) = full(keys), trunc(keys)
    kept_given_drawn = np.zeros(n_clients)
    drawn_count = np.zeros(n_clients)
    for r in range(draws):
        drawn = set(np.asarray(fi[r])[np.asarray(fv[r])])
        kept = np.asarray(ti[r])[np.asarray(tv[r])]
        assert len(kept) == min(cap, len(drawn)) and set(kept) <= drawn
        if len(drawn) > cap:
            for i in drawn:
                drawn_count[i] += 1
            kept_given_drawn[kept] += 1
    # by symmetry of the keys each drawn client is kept with the same probability: no client is favoured
    rate = kept_given_drawn / drawn_count
    p = kept_given_drawn.sum() / drawn_count.sum()
    assert np.all(np.abs(rate - p) < SIGMAS * np.sqrt(p * (1 - p) / drawn_count))


def test_poisson_cohort_edges():
    ids, valid = P.poisson_cohort(jax.random.PRNGKey(0), 5, 1.0)
    np.testing.assert_array_equal(ids, np.arange(5))
    np.testing.assert_array_equal(valid, np.ones(5, bool))
    ids, valid = P.poisson_cohort(jax.random.PRNGKey(0), 5, 0.0, 2)
    assert not np.any(valid) and np.all(np.asarray(ids) == 5)
    for bad in (lambda: P.poisson_cohort(jax.random.PRNGKey(0), 5, 1.5),
                lambda: P.poisson_cohort(jax.random.PRNGKey(0), 5, 0.5, 6)):
        with pytest.raises(ValueError):
            bad()


# ------------------------------------------------------------------------------------------------ vmap = loop


def test_operators_vmapped_over_clients_equal_a_loop():
    clients = 4
    xs = _stack([_tree(40 + i, 0.5 + i) for i in range(clients)])
    keys = jax.random.split(jax.random.PRNGKey(9), clients)
    params, batch, loss = _linear_problem(3)
    batches = _stack([jax.tree.map(lambda a: a + 0.1 * i if a.dtype == jnp.float32 else a, batch)
                      for i in range(clients)])
    dp_grad = P.private_value_and_grad(loss, 0.3, 1.0)
    ops = {
        "clip_by_norm": (lambda x, k: P.clip_by_norm(x, 2.0), xs),
        "clip_per_layer": (lambda x, k: P.clip_per_layer(x, 2.0), xs),
        "private_value_and_grad": (lambda b, k: dp_grad(params, b, k), batches),
        "poisson_cohort": (lambda x, k: P.poisson_cohort(k, 30, 0.2, 10), xs),
    }
    for name, (fn, data) in ops.items():
        batched = jax.jit(jax.vmap(fn))(data, keys)
        for i in range(clients):
            looped = fn(jax.tree.map(lambda a: a[i], data), keys[i])
            for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(jax.tree.map(lambda a: a[i], batched))):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
