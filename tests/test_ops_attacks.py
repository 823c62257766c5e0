"""fljax.ops.attacks against the papers written out in NumPy: the model-poisoning attacks on stacked deltas with
padded slots and malicious rows at random positions (only valid malicious rows change, every other row keeps its
bits; the omniscient attacks see only the benign valid rows, R5), ALIE's z_max from scipy, Min-Max/Min-Sum by the
paper's while loop (R6); the data poisoning per client (label flip, backdoor triggers of the three input kinds, the
row choice, ASR) against loops; jit and vmap over lanes with traced options equal eager."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from fljax.errors import OptionError
from fljax.ops import attacks as A

N = 10
SHAPES = ((3, 2), (4,))


def _deltas(seed, valid, junk=1e30):
    rng = np.random.default_rng(seed)
    out = {}
    for i, s in enumerate(SHAPES):
        x = 0.5 + rng.normal(size=(N,) + s)
        out[f"l{i}"] = jnp.asarray(np.where(np.asarray(valid).reshape((N,) + (1,) * len(s)), x,
                                            junk if i == 0 else np.nan), jnp.float32)
    return out


def _masks(k, f, seed=0):
    """``(valid, malicious)``: k valid slots of which f malicious, and malicious invalid slots besides."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(N)
    valid = np.zeros(N, bool)
    valid[order[:k]] = True
    malicious = np.zeros(N, bool)
    malicious[order[:f]] = True
    malicious[order[k:][:2]] = True  # unsampled malicious slots stay untouched
    return jnp.asarray(valid), jnp.asarray(malicious)


def _flat(t):
    return np.concatenate([np.asarray(x, np.float64).reshape(N, -1) for x in jax.tree.leaves(t)], axis=1)


def _check_rows(got, deltas, rows, want_rows=None, rtol=1e-5, atol=1e-6):
    """Rows outside ``rows`` keep their bits; the rows inside equal ``want_rows`` (``[n, d]`` float64, or one
    vector)."""
    for key in deltas:
        g, d = np.asarray(got[key]), np.asarray(deltas[key])
        for i in np.flatnonzero(~np.asarray(rows)):
            assert g[i].tobytes() == d[i].tobytes(), (key, i)
    if want_rows is not None:
        gf = _flat(got)[np.asarray(rows)]
        np.testing.assert_allclose(gf, np.broadcast_to(want_rows, gf.shape), rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------- the papers in NumPy


def ref_std(B, ddof=1):
    """σ per coordinate; 0 for a single benign upload (nothing to estimate a spread from)."""
    return B.std(axis=0, ddof=ddof) if len(B) > ddof else np.zeros(B.shape[1])


def ref_alie(B, n, f, ddof=1):
    """Baruch et al. 2019, Algorithm 1: s = ⌊n/2 + 1⌋ − f, z = Φ⁻¹((n − s)/n), μ − zσ per coordinate."""
    s = max(math.floor(n / 2 + 1) - f, 1)
    z = norm.ppf((n - s) / n)
    return B.mean(axis=0) - z * ref_std(B, ddof)


def ref_min_max(B, perturbation, objective, start=10.0, tol=1e-5):
    """Shejwalkar & Houmansadr 2021, Algorithm 1 as the paper's loop: γ from γ₀, step γ₀, keep γ if the condition holds
    (γ_succ = γ, γ += step/2) else γ −= step/2, step /= 2, while |γ_succ − γ| > τ."""
    mu = B.mean(axis=0)
    p = {"unit": -mu / np.linalg.norm(mu), "std": -ref_std(B), "sign": -np.sign(mu)}[perturbation]
    dist = lambda a, b: np.linalg.norm(a - b)  # noqa: E731
    if objective == "max":
        bound = max(dist(a, b) for a in B for b in B)
        ok = lambda m: max(dist(m, b) for b in B) <= bound  # noqa: E731
    else:
        bound = max(sum(dist(a, b) ** 2 for b in B) for a in B)
        ok = lambda m: sum(dist(m, b) ** 2 for b in B) <= bound  # noqa: E731
    gamma, step, good = start, start, 0.0
    while abs(good - gamma) > tol:
        if ok(mu + gamma * p):
            good, gamma = gamma, gamma + step / 2
        else:
            gamma = gamma - step / 2
        step /= 2
    return mu + good * p, good


# --------------------------------------------------------------------------------------------- simple attacks


@pytest.mark.parametrize("k,f", [(N, 3), (6, 2), (4, 0)])
def test_sign_flip_and_scale_replace_only_the_valid_malicious_rows(k, f):
    valid, malicious = _masks(k, f, k + f)
    d = _deltas(k, valid)
    rows = valid & malicious
    D = _flat(d)
    _check_rows(A.sign_flip(d, malicious, valid, s=2.5), d, rows, -2.5 * D[np.asarray(rows)])
    _check_rows(jax.jit(A.scale)(d, malicious, valid, gamma=jnp.float32(A.replacement_scale(10, 0.5))), d, rows,
                20.0 * D[np.asarray(rows)])
    _check_rows(A.sign_flip(d, malicious, None), d, malicious)  # valid=None: every slot is valid


def test_replacement_scale_is_n_over_eta_and_refuses_nonsense():
    assert A.replacement_scale(30, 0.5) == 60.0
    with pytest.raises(OptionError, match="η > 0"):
        A.replacement_scale(30, 0.0)


def test_gaussian_gives_each_malicious_client_its_own_draw():
    valid, malicious = _masks(N, 6, 1)
    d = {"w": jnp.zeros((N, 4000), jnp.float32)}
    keys = jax.random.split(jax.random.PRNGKey(3), N)
    got = np.asarray(A.gaussian(d, malicious, valid, sigma=0.7, keys=keys)["w"])
    rows = np.flatnonzero(np.asarray(malicious))
    _check_rows({"w": jnp.asarray(got)}, d, malicious)
    x = got[rows]
    n = x.size  # 24,000 normals: std within 5·σ/√(2n), mean within 5σ/√n
    assert abs(x.std() - 0.7) < 5 * 0.7 / math.sqrt(2 * n)
    assert abs(x.mean()) < 5 * 0.7 / math.sqrt(n)
    corr = np.corrcoef(x)[np.triu_indices(len(rows), 1)]  # independent draws per client
    assert np.all(np.abs(corr) < 5 / math.sqrt(x.shape[1]))
    other = keys.at[rows[0]].set(jax.random.PRNGKey(99))  # row i depends on keys[i] only
    again = np.asarray(A.gaussian(d, malicious, valid, sigma=0.7, keys=other)["w"])
    assert not np.array_equal(again[rows[0]], got[rows[0]])
    np.testing.assert_array_equal(again[rows[1:]], got[rows[1:]])


# ------------------------------------------------------------------------------------------- omniscient (R5)


@pytest.mark.parametrize("k,f", [(N, 2), (N, 6), (7, 3), (5, 1), (3, 2)])
def test_alie_and_ipm_craft_from_the_benign_valid_rows(k, f):
    """(N, 6), (3, 2): a malicious majority (s ≤ 0 is taken as 1)."""
    valid, malicious = _masks(k, f, 7 * k + f)
    d = _deltas(k + f, valid)
    rows = valid & malicious
    B = _flat(d)[np.asarray(valid & ~malicious)]
    _check_rows(A.alie(d, malicious, valid), d, rows, ref_alie(B, k, f))
    _check_rows(A.alie(d, malicious, valid, ddof=0), d, rows, ref_alie(B, k, f, ddof=0))
    _check_rows(A.ipm(d, malicious, valid, eps=0.1), d, rows, -0.1 * B.mean(axis=0))
    np.testing.assert_allclose(A.alie_z(k, f), norm.ppf((k - max(k // 2 + 1 - f, 1)) / k), rtol=1e-5)


@pytest.mark.parametrize("perturbation", A.PERTURBATIONS)
@pytest.mark.parametrize("objective", ["max", "sum"])
@pytest.mark.parametrize("k,f", [(N, 3), (6, 2), (4, 3)])
def test_min_max_and_min_sum_follow_the_papers_search(perturbation, objective, k, f):
    """(4, 3): one benign upload (bounds 0, σ = 0)."""
    valid, malicious = _masks(k, f, k + 3 * f)
    d = _deltas(3 * k + f, valid)
    rows = valid & malicious
    B = _flat(d)[np.asarray(valid & ~malicious)]
    want, gamma = ref_min_max(B, perturbation, objective)
    attack = A.min_max if objective == "max" else A.min_sum
    got = attack(d, malicious, valid, perturbation=perturbation)
    _check_rows(got, d, rows, want, rtol=1e-4, atol=1e-4)
    if len(B) > 1 and perturbation == "std":
        assert gamma > 0  # the search found a passing γ: the check above is not μ against μ


@pytest.mark.parametrize("start,tol", [(1.0, 0.1), (10.0, 0.01)])
def test_a_short_search_stops_where_the_papers_loop_stops(start, tol):
    """A coarse search (4 and 10 halvings) whose last step passes: one step more or less moves γ visibly."""
    valid, malicious = _masks(N, 3, 11)
    d = _deltas(11, valid)
    B = _flat(d)[np.asarray(valid & ~malicious)]
    for attack, objective in ((A.min_max, "max"), (A.min_sum, "sum")):
        want, _ = ref_min_max(B, "std", objective, start, tol)
        _check_rows(attack(d, malicious, valid, perturbation="std", start=start, tol=tol), d, valid & malicious, want)


def test_search_steps_match_the_while_loop():
    for start, tol in ((10.0, 1e-5), (1.0, 0.25), (5.0, 1e-3)):
        gamma, step, good, t = start, start, 0.0, 0
        while abs(good - gamma) > tol:
            gamma, step, t = gamma - step / 2, step / 2, t + 1
        assert A.search_steps(start, tol) == t


def test_without_benign_uploads_the_malicious_send_their_honest_deltas():
    valid, malicious = _masks(3, 3, 5)
    d = _deltas(5, valid)
    for attack, kw in ((A.alie, {}), (A.ipm, {"eps": 100.0}), (A.min_max, {}), (A.min_sum, {"perturbation": "sign"})):
        _check_rows(attack(d, malicious, valid, **kw), d, jnp.zeros(N, bool))


def _attack_options(name, lanes):
    return {"sign_flip": {"s": jnp.array([1.0, 2.0, 0.5])}, "scale": {"gamma": jnp.array([3.0, 10.0, 0.1])},
            "gaussian": {"sigma": jnp.array([1.0, 0.1, 2.0]),
                         "keys": jax.vmap(lambda i: jax.random.split(jax.random.PRNGKey(i), N))(jnp.arange(lanes))},
            "ipm": {"eps": jnp.array([0.1, 1.0, 100.0])}}.get(name, {})


@pytest.mark.parametrize("name", list(A.MODEL_ATTACKS))
def test_jit_and_vmap_over_lanes_with_traced_options_equal_eager(name):
    lanes = [_masks(k, f, i) for i, (k, f) in enumerate(((N, 3), (7, 2), (4, 1)))]
    ds = [_deltas(20 + i, v) for i, (v, _) in enumerate(lanes)]
    opts = _attack_options(name, 3)
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)  # noqa: E731
    fn = A.MODEL_ATTACKS[name]
    batched = jax.jit(jax.vmap(lambda d, m, v, o: fn(d, m, v, **o)))(
        stack(ds), stack([m for _, m in lanes]), stack([v for v, _ in lanes]), opts)
    for i, (d, (v, m)) in enumerate(zip(ds, lanes)):
        eager = fn(d, m, v, **jax.tree.map(lambda x: x[i], opts))
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jax.tree.map(lambda x: x[i], batched))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{name} lane {i}")


def test_check_attack_refuses_bad_options_with_one_line_errors():
    A.check_attack("alie")
    A.check_attack("min_max", perturbation="std", start=10.0, tol=1e-5)
    A.check_attack("gaussian", sigma=1.0)
    for (attack, options), key, text in [(("alie", {"eps": 1.0}), "eps", "not an option"),
                                         (("ipm", {}), "eps", "required"),
                                         (("min_sum", {"perturbation": "unit_vec"}), "perturbation", "unit, std"),
                                         (("gaussian", {"sigma": -1.0}), "sigma", "non-negative"),
                                         (("alie", {"ddof": 2}), "ddof", "population std"),
                                         (("flip", {}), "attack", "sign_flip")]:
        with pytest.raises(OptionError, match=text) as e:
            A.check_attack(attack, **options)
        assert e.value.key == key and "\n" not in str(e.value)
    with pytest.raises(OptionError, match="target"):
        A.check_backdoor(10, 10, 0.5)
    with pytest.raises(OptionError, match="fraction"):
        A.check_backdoor(10, 3, 1.5)


# -------------------------------------------------------------------------------------------- data poisoning


def test_flip_labels_maps_y_to_c_minus_1_minus_y_on_valid_rows_only():
    y = jnp.array([0, 3, 9, 5, 0, 0], jnp.int32)
    mask = jnp.array([1, 1, 1, 1, 0, 0], bool)
    np.testing.assert_array_equal(A.flip_labels(y, 10, mask), [9, 6, 0, 4, 0, 0])
    np.testing.assert_array_equal(A.flip_labels(y, 10), [9, 6, 0, 4, 9, 9])
    stacked = jax.vmap(lambda a, m: A.flip_labels(a, 10, m))(jnp.stack([y, y]), jnp.stack([mask, ~mask]))
    np.testing.assert_array_equal(stacked, [[9, 6, 0, 4, 0, 0], [0, 3, 9, 5, 9, 9]])


@pytest.mark.parametrize("count", [20, 7, 1, 0])
def test_poison_rows_picks_the_rounded_fraction_of_valid_rows_deterministically(count):
    mask = jnp.arange(24) < count
    key = jax.random.PRNGKey(count)
    previous = np.zeros(24, bool)
    for fraction in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
        rows = np.asarray(jax.jit(A.poison_rows)(key, fraction, mask))
        assert rows.sum() == math.floor(fraction * count + 0.5)
        assert not np.any(rows & ~np.asarray(mask))
        assert np.all(rows >= previous)  # a larger fraction keeps the smaller one's rows
        np.testing.assert_array_equal(rows, A.poison_rows(key, fraction, mask))
        previous = rows
    if count >= 7:
        other = np.asarray(A.poison_rows(jax.random.PRNGKey(1000), 0.5, mask))
        assert not np.array_equal(other, np.asarray(A.poison_rows(key, 0.5, mask)))


def test_image_trigger_is_a_max_valued_corner_patch_on_the_chosen_rows():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0, 1, size=(6, 8, 7, 3)), jnp.float32)
    y = jnp.arange(6, dtype=jnp.int32)
    mask = jnp.array([1, 1, 1, 1, 1, 0], bool)
    trigger = A.make_trigger(x, (8, 7, 3))
    assert trigger == A.Trigger("image", float(np.max(np.asarray(x))))
    xs, ys, rows = A.backdoor(jax.random.PRNGKey(0), x, y, mask, trigger, 2, 0.6)
    rows = np.asarray(rows)
    assert rows.sum() == 3 and not rows[5]
    want_x, want_y = np.array(x), np.array(y)
    for i in np.flatnonzero(rows):
        for h in range(5, 8):
            for w in range(4, 7):
                want_x[i, h, w, :] = trigger.value
        want_y[i] = 2
    np.testing.assert_array_equal(xs, want_x)
    np.testing.assert_array_equal(ys, want_y)


def test_token_and_vector_triggers():
    x = jnp.asarray(np.random.default_rng(1).integers(4, 50, size=(5, 6)), jnp.int32)
    y_row, y_tok = jnp.arange(5, dtype=jnp.int32), x + 1
    rows = jnp.array([1, 0, 1, 0, 0], bool)
    trigger = A.make_trigger(x, (6,), token=3, position=2)
    assert trigger == A.Trigger("tokens", 3, position=2)
    got = np.asarray(trigger.stamp(x, rows))
    want = np.array(x)
    want[[0, 2], 2] = 3
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(trigger.relabel(y_row, rows, 7), [7, 1, 7, 3, 4])
    want = np.array(y_tok)
    want[[0, 2], 2] = 7  # per-token targets: the target follows the trigger
    np.testing.assert_array_equal(trigger.relabel(y_tok, rows, 7), want)
    v = jnp.asarray(np.random.default_rng(2).normal(size=(5, 10)), jnp.float32)
    trigger = A.make_trigger(v, (10,))
    assert trigger.kind == "vector" and trigger.value == float(np.max(np.asarray(v)))
    want = np.array(v)
    want[[0, 2], 7:] = trigger.value
    np.testing.assert_array_equal(trigger.stamp(v, rows), want)
    with pytest.raises(OptionError, match="trigger_token"):
        A.make_trigger(x, (6,))
    with pytest.raises(OptionError, match="trigger"):
        A.make_trigger(v.reshape(5, 2, 5), (2, 5))


def test_backdoor_vmapped_over_clients_equals_a_loop():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.uniform(size=(3, 9, 5, 5, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, size=(3, 9)), jnp.int32)
    mask = jnp.asarray(np.arange(9)[None, :] < np.array([[9], [4], [0]]))
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    trigger = A.Trigger("image", 1.0)
    batched = jax.jit(jax.vmap(lambda k, a, b, m, f: A.backdoor(k, a, b, m, trigger, 0, f)))(
        keys, x, y, mask, jnp.array([0.5, 0.5, 0.5]))
    for c in range(3):
        for a, b in zip(A.backdoor(keys[c], x[c], y[c], mask[c], trigger, 0, 0.5), batched):
            np.testing.assert_array_equal(a, b[c])


def test_attack_success_counts_triggered_rows_of_other_classes_classified_as_the_target():
    rng = np.random.default_rng(6)
    logits = jnp.asarray(rng.normal(size=(2, 30, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, size=(2, 30)), jnp.int32)
    mask = jnp.asarray(rng.uniform(size=(2, 30)) < 0.8)
    counted = hits = 0
    L, Y, M = np.asarray(logits), np.asarray(y), np.asarray(mask)
    for c in range(2):
        for i in range(30):
            if M[c, i] and Y[c, i] != 1:
                counted += 1
                hits += int(np.argmax(L[c, i]) == 1)
    assert float(A.attack_success(logits, y, 1, mask)) == pytest.approx(hits / counted)
    assert float(A.attack_success(logits, y, 1, jnp.zeros_like(mask))) == 0.0


def test_stamp_split_stamps_every_valid_row_and_keeps_the_labels():
    import fljax.data as D

    rng = np.random.default_rng(7)
    arrays = D.pad_clients([rng.uniform(size=(n, 4, 4, 1)).astype(np.float32) for n in (5, 3)],
                           [rng.integers(0, 3, n).astype(np.int32) for n in (5, 3)])
    trigger = A.Trigger("image", 2.0, size=2)
    out = A.stamp_split(arrays, trigger)
    np.testing.assert_array_equal(out.y, arrays.y)
    x, m = np.asarray(out.x), np.asarray(arrays.mask)
    assert np.all(x[m][:, 2:, 2:, :] == 2.0)
    np.testing.assert_array_equal(x[m][:, :2], np.asarray(arrays.x)[m][:, :2])
    np.testing.assert_array_equal(x[~m], np.asarray(arrays.x)[~m])
