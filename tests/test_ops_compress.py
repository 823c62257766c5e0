"""fljax.ops.compress against definitions: top-k by brute force, unbiasedness of random-k and QSGD by averaging many
draws (a z-test with the exact per-entry variance), scaled sign, error feedback's residual identity, the bytes a
client sends, one-line errors, and vmap over clients = a Python loop."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.ops import compress as C

DRAWS = 4000
Z_MAX = 5.0  # per-entry |z| bound; with ≤ 60 entries per test the family-wise false alarm is < 60·5.8e-7 ≈ 4e-5


def _tree(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"dense": {"kernel": jax.random.normal(k[0], (6, 5)), "bias": jax.random.normal(k[1], (5,))},
            "head": jax.random.normal(k[2], (7,)) * 3.0}


def _leaves64(t):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]


def test_kept_entries_is_a_ceiling_with_bounds():
    assert C.kept_entries(10, 0.1) == 1  # 0.1·10 is 1.0000000000000002 in floating point
    assert C.kept_entries(10, 0.11) == 2
    assert C.kept_entries(10, 1e-6) == 1 and C.kept_entries(10, 1.0) == 10
    assert C.kept_entries(30, 0.3) == 9 and C.kept_entries(7, 0.5) == 4


def test_top_k_keeps_the_largest_magnitudes_of_each_leaf_and_contracts():
    x = _tree()
    out = jax.jit(lambda t: C.TopK(0.3)(t, jax.random.PRNGKey(0)))(x)
    for a, b in zip(_leaves64(x), _leaves64(out)):
        k = C.kept_entries(a.size, 0.3)
        top = np.argsort(-np.abs(a.ravel()), kind="stable")[:k]
        want = np.zeros(a.size)
        want[top] = a.ravel()[top]
        np.testing.assert_array_equal(b.ravel(), want)
        # the k-contraction of Stich et al. 2018: ‖x − top_k(x)‖² ≤ (1 − k/d)‖x‖²
        assert np.sum((a - b) ** 2) <= (1 - k / a.size) * np.sum(a ** 2) + 1e-12


def _z_scores(mean, target, var):
    var = np.where(var > 0, var, np.inf)  # deterministic entries: compared exactly below
    return np.abs(mean - target) / np.sqrt(var / DRAWS)


def _draws(comp, x):
    keys = jax.random.split(jax.random.PRNGKey(7), DRAWS)
    return jax.jit(jax.vmap(lambda k: comp(x, k)))(keys)


def test_random_k_is_unbiased_with_its_exact_variance():
    x = _tree(1)
    comp = C.RandomK(0.25)
    out = _draws(comp, x)
    for a, draws in zip(_leaves64(x), [np.asarray(d, np.float64) for d in jax.tree.leaves(out)]):
        d, k = a.size, C.kept_entries(a.size, 0.25)
        flat = draws.reshape(DRAWS, d)
        assert np.all(np.count_nonzero(flat, axis=1) == k)  # exactly k entries (x has no zeros)
        nz = flat != 0
        np.testing.assert_allclose(flat[nz], np.broadcast_to(a.ravel() * d / k, flat.shape)[nz], rtol=1e-6)
        # E = x and Var = (d/k − 1)·x² per entry (P(i ∈ S) = k/d): a z-test of the mean of the draws
        z = _z_scores(flat.mean(0), a.ravel(), (d / k - 1) * a.ravel() ** 2)
        assert z.max() < Z_MAX, z.max()


def test_qsgd_is_unbiased_on_its_grid_with_its_exact_variance():
    x = _tree(2)
    for bits in (1, 3):
        comp = C.QSGD(bits)
        s = comp.levels
        out = _draws(comp, x)
        for a, draws in zip(_leaves64(x), [np.asarray(d, np.float64) for d in jax.tree.leaves(out)]):
            flat = draws.reshape(DRAWS, a.size)
            norm = np.linalg.norm(a)
            levels = np.abs(flat) * s / norm  # ξ_i ∈ {⌊r_i⌋, ⌊r_i⌋ + 1}
            r = s * np.abs(a.ravel()) / norm
            assert np.all(np.abs(levels - np.round(levels)) < 1e-4)
            assert np.all((np.round(levels) == np.floor(r)) | (np.round(levels) == np.floor(r) + 1))
            assert np.all((np.sign(flat) == np.sign(a.ravel())) | (flat == 0))
            p = r - np.floor(r)
            z = _z_scores(flat.mean(0), a.ravel(), (norm / s) ** 2 * p * (1 - p))
            assert z.max() < Z_MAX, (bits, z.max())


def test_qsgd_of_a_zero_leaf_is_zero():
    out = C.QSGD(2)({"w": jnp.zeros(5)}, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(out["w"], np.zeros(5))


def test_scaled_sign_is_mean_magnitude_times_sign():
    x = {"w": jnp.array([0.5, -2.0, 0.0, 1.5]), "b": jnp.array([-1.0, 3.0])}
    out = C.ScaledSign()(x, jax.random.PRNGKey(0))
    np.testing.assert_allclose(out["w"], [1.0, -1.0, 1.0, 1.0])  # mean |x| = 1; sign(0) is sent as +1
    np.testing.assert_allclose(out["b"], [-2.0, 2.0])
    for a, b in zip(_leaves64(_tree()), _leaves64(C.ScaledSign()(_tree(), jax.random.PRNGKey(0)))):
        assert np.linalg.norm(b) <= np.linalg.norm(a) * (1 + 1e-6)  # ‖x‖₁/√d ≤ ‖x‖₂


@pytest.mark.parametrize("comp", [C.TopK(0.2), C.RandomK(0.2), C.QSGD(2), C.ScaledSign()], ids=lambda c: c.name)
def test_error_feedback_residual_identity_and_telescoping(comp):
    """e_{t+1} = e_t + x_t − c_t at every step (bit for bit eagerly; under jit XLA may recompute c inside another
    fusion, so within a rounding), hence Σ_t c_t + e_T = Σ_t x_t (e_0 = 0)."""
    step = lambda x, e, k: C.error_feedback(comp, x, e, k)  # noqa: E731
    jitted = jax.jit(step)
    e = jax.tree.map(jnp.zeros_like, _tree())
    sent_sum, x_sum = [np.zeros_like(a) for a in _leaves64(e)], [np.zeros_like(a) for a in _leaves64(e)]
    for t in range(6):
        x = _tree(10 + t)
        c, e_new = step(x, e, jax.random.PRNGKey(t))
        for ev, xv, cv, nv in zip(*(jax.tree.leaves(a) for a in (e, x, c, e_new))):
            np.testing.assert_array_equal(nv, (ev + xv) - cv)  # bit for bit, as computed
        for a, b in zip(jax.tree.leaves((c, e_new)), jax.tree.leaves(jitted(x, e, jax.random.PRNGKey(t)))):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        sent_sum = [s + v for s, v in zip(sent_sum, _leaves64(c))]
        x_sum = [s + v for s, v in zip(x_sum, _leaves64(x))]
        if comp.name == "top_k":  # the residual is zero exactly where an entry was sent
            for cv, nv in zip(_leaves64(c), _leaves64(e_new)):
                assert np.all(nv[cv != 0] == 0)
        e = e_new
    for s, e_t, xs in zip(sent_sum, _leaves64(e), x_sum):
        np.testing.assert_allclose(s + e_t, xs, rtol=1e-5, atol=1e-5)


def test_error_feedback_post_is_applied_before_the_residual():
    comp = C.TopK(0.5)
    x, e = {"w": jnp.array([3.0, -4.0, 0.5, 0.1])}, {"w": jnp.zeros(4)}
    half = lambda t: jax.tree.map(lambda a: a / 2, t)  # noqa: E731
    c, e_new = C.error_feedback(comp, x, e, jax.random.PRNGKey(0), post=half)
    np.testing.assert_allclose(c["w"], [1.5, -2.0, 0.0, 0.0])
    np.testing.assert_allclose(e_new["w"], [1.5, -2.0, 0.5, 0.1])  # what the server did not receive


def test_bytes_count_what_is_sent():
    x = {"k": jnp.zeros((10, 10)), "b": jnp.zeros(7)}  # 100 + 7 float32 entries
    assert C.Identity().bytes(x) == 4 * 107
    # top-k 10%: k = 10 and 1 values + int32 indices
    assert C.TopK(0.1).bytes(x) == (10 + 1) * (4 + 4)
    # random-k: the same values, no indices, one 64-bit seed per client
    assert C.RandomK(0.1).bytes(x) == (10 + 1) * 4 + 8
    # QSGD 2 bits: a float32 norm + 3 bits (2 level bits, 1 sign bit) per entry, each leaf rounded up to bytes
    assert C.QSGD(2).bytes(x) == (4 + math.ceil(300 / 8)) + (4 + math.ceil(21 / 8))
    assert C.ScaledSign().bytes(x) == (4 + math.ceil(100 / 8)) + (4 + 1)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), x)  # shapes suffice
    assert C.QSGD(2).bytes(shapes) == C.QSGD(2).bytes(x)


def test_make_compressor_and_one_line_errors():
    assert C.make_compressor("top_k", fraction=0.1) == C.TopK(0.1)
    assert C.make_compressor("qsgd", bits=4) == C.QSGD(4)
    assert isinstance(C.make_compressor("none"), C.Identity) and isinstance(C.make_compressor("sign"), C.ScaledSign)
    for call, msg in [(lambda: C.make_compressor("topk", fraction=0.1), "Did you mean 'top_k'"),
                      (lambda: C.make_compressor("top_k"), "needs fraction"),
                      (lambda: C.make_compressor("qsgd", bits=2, fraction=0.5), "takes no fraction"),
                      (lambda: C.TopK(0.0), r"in \(0, 1\]"),
                      (lambda: C.QSGD(0), "between 1 and 16")]:
        with pytest.raises(ValueError, match=msg) as e:
            call()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("comp", [C.Identity(), C.TopK(0.3), C.RandomK(0.3), C.QSGD(3), C.ScaledSign()],
                         ids=lambda c: c.name)
def test_vmap_over_clients_equals_a_loop(comp):
    clients = 4
    xs = jax.tree.map(lambda *a: jnp.stack(a), *[_tree(20 + i) for i in range(clients)])
    es = jax.tree.map(lambda a: 0.1 * a, jax.tree.map(lambda *a: jnp.stack(a), *[_tree(30 + i)
                                                                                 for i in range(clients)]))
    keys = jax.random.split(jax.random.PRNGKey(3), clients)
    f = lambda x, e, k: C.error_feedback(comp, x, e, k)  # noqa: E731
    batched = jax.jit(jax.vmap(f))(xs, es, keys)
    for i in range(clients):
        one = jax.tree.map(lambda a: a[i], (xs, es))
        looped = f(*one, keys[i])
        for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(jax.tree.map(lambda a: a[i], batched))):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_contractive_random_k_sends_the_kept_entries_unscaled():
    """ω = d/k − 1 exactly, so C(x)/(1 + ω) is x on the kept subset S and 0 elsewhere (Stich et al.'s rand_k)."""
    x, key = _tree(4), jax.random.PRNGKey(5)
    comp = C.RandomK(0.25)
    scaled, plain = C.Contractive(comp)(x, key), comp(x, key)
    for a, s, p in zip(_leaves64(x), _leaves64(scaled), _leaves64(plain)):
        kept = p != 0
        np.testing.assert_allclose(s[kept], a[kept], rtol=1e-6)
        assert np.all(s[~kept] == 0) and kept.sum() == C.kept_entries(a.size, 0.25)
    assert C.Contractive(comp).bytes(x) == comp.bytes(x)
    assert comp.contractive() == C.Contractive(comp) and C.TopK(0.2).contractive() == C.TopK(0.2)
    with pytest.raises(ValueError, match="biased"):
        C.Contractive(C.ScaledSign())


@pytest.mark.parametrize("comp", [C.RandomK(0.1), C.QSGD(2)], ids=lambda c: c.name)
def test_an_unbiased_compressor_scaled_by_its_variance_bound_contracts(comp):
    """E‖x − C(x)/(1+ω)‖² ≤ (1 − 1/(1+ω))‖x‖² per leaf (Karimireddy et al. 2019, Remark 6), measured over many
    draws; the unscaled compressor's error exceeds ‖x‖² on these leaves (which is why error feedback diverges with
    it): E‖C(x) − x‖² = ω‖x‖² for random-k, and for QSGD the exact Σ (‖x‖/s)²p_i(1 − p_i) ≤ ω‖x‖²."""
    x = {"w": jax.random.normal(jax.random.PRNGKey(6), (400,))}
    a = np.asarray(x["w"], np.float64)
    omega = comp.variance_factor(a.size)
    scaled = np.asarray(_draws(C.Contractive(comp), x)["w"], np.float64).reshape(DRAWS, -1)
    plain = np.asarray(_draws(comp, x)["w"], np.float64).reshape(DRAWS, -1)
    err_scaled = np.sum((scaled - a) ** 2, axis=1)
    err_plain = np.sum((plain - a) ** 2, axis=1)
    sq = np.sum(a ** 2)
    bound = (1 - 1 / (1 + omega)) * sq
    se = err_scaled.std() / math.sqrt(DRAWS)
    assert err_scaled.mean() - 5 * se <= bound, (err_scaled.mean(), bound)  # not significantly above the bound
    if comp.name == "random_k":  # x off the kept subset: E = (1 − k/d)‖x‖², the bound itself
        assert abs(err_scaled.mean() - bound) < 5 * se
        np.testing.assert_allclose(err_plain.mean(), omega * sq, rtol=5 * err_plain.std() / err_plain.mean() / 60)
    else:
        norm, s = np.linalg.norm(a), comp.levels
        r = s * np.abs(a) / norm
        p = r - np.floor(r)
        exact = np.sum((norm / s) ** 2 * p * (1 - p))
        assert exact <= omega * sq
        assert abs(err_plain.mean() - exact) < 5 * err_plain.std() / math.sqrt(DRAWS)
    assert err_plain.mean() > sq  # the unscaled error exceeds ‖x‖²: not a contraction


@pytest.mark.parametrize("comp", [C.RandomK(0.1), C.QSGD(2)], ids=lambda c: c.name)
def test_error_feedback_stays_bounded_with_the_contractive_form_and_grows_without(comp):
    """The same upload x every step for T steps. With C/(1+ω) (δ = 1/(1+ω)) the residual obeys
    E‖e_t‖² ≤ 4(1 − δ)/δ²·‖x‖² (Karimireddy et al. 2019, Lemma 3), and the mean sent Σ_t c_t / T approaches x; with the
    unscaled unbiased compressor the residual grows past that bound."""
    x = {"w": jax.random.normal(jax.random.PRNGKey(7), (200,))}
    sq = float(jnp.sum(x["w"] ** 2))
    T = 300

    def run(c, key):
        def step(carry, k):
            e, sent = carry
            out, e = C.error_feedback(c, x, e, k)
            return (e, jax.tree.map(jnp.add, sent, out)), jnp.sum(e["w"] ** 2)
        zeros = jax.tree.map(jnp.zeros_like, x)
        (e, sent), norms = jax.lax.scan(step, (zeros, zeros), jax.random.split(key, T))
        return sent, norms

    delta = 1 / (1 + comp.variance_factor(200))
    bound = 4 * (1 - delta) / delta ** 2 * sq
    sent, norms = jax.jit(run, static_argnums=0)(C.Contractive(comp), jax.random.PRNGKey(8))
    assert float(norms.max()) <= bound
    # Σ_t c_t + e_T = T·x, so the mean sent is x up to e_T/T
    gap = np.linalg.norm(np.asarray(sent["w"]) / T - np.asarray(x["w"])) / math.sqrt(sq)
    assert gap <= math.sqrt(bound / sq) / T + 1e-5
    _, plain_norms = jax.jit(run, static_argnums=0)(comp, jax.random.PRNGKey(8))
    assert not bool(jnp.all(plain_norms <= bound))  # past the bound (random-k: on to overflow, NaN)
