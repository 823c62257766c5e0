"""fljax.ops.robust against the papers' rules written out in NumPy (float64 loops over coordinates, subsets and
iterations), on pytrees of two leaves whose invalid slots hold junk (huge values, NaN) that would change every answer
if it leaked in (spec R1), for several valid counts k including the run-time fallbacks below each rule's bound;
jit and vmap over a lane axis with traced options equal eager; the host-side checks."""
import functools
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import tree as T
from fljax.errors import OptionError
from fljax.ops import robust as R

N = 11  # the cohort buffer


@functools.cache
def _jit(name):
    fn = getattr(R, name)
    return jax.jit(fn, static_argnames=[a for a in ("iters",) if a in inspect.signature(fn).parameters])


class _Jitted:
    """``J.krum(…)``: the rules under ``jit`` with their numeric options traced (f as int32, β, τ, M, ν, v₀, g₀),
    only ``iters`` static: the reference tests run the traced path (eager is the vmap test's baseline)."""

    def __getattr__(self, name):
        return _jit(name)


J = _Jitted()
SHAPES = ((3, 2), (5,))


def _uploads(seed, valid, junk=1e30, scale=1.0):
    """A pytree of N stacked uploads whose invalid rows are ``junk`` (1e30, or NaN for the second leaf)."""
    rng = np.random.default_rng(seed)
    leaves = {}
    for i, s in enumerate(SHAPES):
        x = scale * rng.normal(size=(N,) + s)
        bad = np.full((N,) + s, junk if i == 0 else np.nan)
        leaves[f"l{i}"] = jnp.asarray(np.where(np.asarray(valid).reshape((N,) + (1,) * len(s)), x, bad), jnp.float32)
    return leaves


def _valid(k, seed=0):
    """A mask of N slots with k valid ones at random positions."""
    v = np.zeros(N, bool)
    v[np.random.default_rng(100 + seed).choice(N, k, replace=False)] = True
    return jnp.asarray(v)


def _flat(u):
    """``[N, d]`` float64 rows (all leaves)."""
    return np.concatenate([np.asarray(x, np.float64).reshape(N, -1) for x in jax.tree.leaves(u)], axis=1)


def _unflat(vec, like):
    out, i = {}, 0
    for key, x in like.items():
        size = int(np.prod(x.shape[1:]))
        out[key] = vec[i:i + size].reshape(x.shape[1:])
        i += size
    return out


def _close(got, want, rtol=2e-5, atol=2e-6):
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key], np.float64), want[key], rtol=rtol, atol=atol, err_msg=key)


# -------------------------------------------------------------------------------------- the papers in NumPy


def ref_median(V):
    """Per coordinate: sort, the middle value or the mean of the two middle ones."""
    k, d = V.shape
    out = np.zeros(d)
    for c in range(d):
        s = sorted(V[:, c])
        out[c] = s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2
    return out


def ref_trimmed(V, beta):
    k, d = V.shape
    b = math.floor(beta * k + 1e-9)  # β as a decimal: 0.21·300 = 63
    return np.array([np.mean(sorted(V[:, c])[b:k - b]) for c in range(d)])


def ref_krum_scores(V, f, factor=2):
    """Blanchard et al.: Σ of the k − f − 2 smallest squared distances to the others (f lowered to what k admits, at
    least one neighbour)."""
    k = len(V)
    f = max(0, min(f, (k - 3) // factor))
    m = min(max(k - f - 2, 1), k - 1)
    scores = []
    for i in range(k):
        d = sorted(float(np.sum((V[i] - V[j]) ** 2)) for j in range(k) if j != i)
        scores.append(sum(d[:m]))
    return np.array(scores)


def ref_bulyan(V, f):
    k = len(V)
    f = max(0, min(f, (k - 3) // 4))
    theta, beta = k - 2 * f, k - 4 * f
    remaining, picked = list(range(k)), []
    for _ in range(theta):  # Krum on the remaining set, recursively
        n_r = len(remaining)
        m = min(max(n_r - f - 2, 1), n_r - 1)
        scores = [sum(sorted(float(np.sum((V[i] - V[j]) ** 2)) for j in remaining if j != i)[:m]) for i in remaining]
        best = remaining[int(np.argmin(scores))]
        picked.append(best)
        remaining.remove(best)
    S = V[sorted(picked)]
    out = np.zeros(V.shape[1])
    for c in range(V.shape[1]):
        med = ref_median(S[:, c:c + 1])[0]
        order = sorted(range(theta), key=lambda i: abs(S[i, c] - med))  # stable: ties to the lower slot
        out[c] = np.mean([S[i, c] for i in order[:beta]])
    return out, sorted(picked)


def ref_geometric_median(V, p, iters, nu):
    z = p @ V / p.sum()
    for _ in range(iters):
        b = np.array([p[i] / max(nu, np.linalg.norm(z - V[i])) for i in range(len(V))])
        z = b @ V / b.sum()
    return z, b / b.sum()


def ref_centered_clip(V, v0, tau, iters):
    v = v0.copy()
    for _ in range(iters):
        v = v + sum((u - v) * min(1, tau / max(np.linalg.norm(u - v), 1e-300)) for u in V) / len(V)
    return v


def ref_fltrust(V, g0):
    ts = np.array([max(0.0, u @ g0 / (np.linalg.norm(u) * np.linalg.norm(g0))) for u in V])
    bars = [u * np.linalg.norm(g0) / np.linalg.norm(u) for u in V]
    return sum(t * b for t, b in zip(ts, bars)) / ts.sum(), ts / ts.sum()


# ----------------------------------------------------------------------------------------- coordinate-wise


@pytest.mark.parametrize("k", [N, 8, 7, 2, 1])
def test_median_and_trimmed_mean_follow_their_definitions_over_the_valid_slots(k):
    valid = _valid(k, k)
    u = _uploads(k, valid)
    V = _flat(u)[np.asarray(valid)]
    got, sel = J.median(u, valid)
    _close(got, _unflat(ref_median(V), u))
    np.testing.assert_array_equal(sel, np.asarray(valid, np.float32))
    for beta in (0.0, 0.1, 0.2, 0.35, 0.45):
        got, sel = J.trimmed_mean(u, valid, beta=beta)
        _close(got, _unflat(ref_trimmed(V, beta), u))
        np.testing.assert_array_equal(sel, np.asarray(valid, np.float32))


def test_trimmed_mean_counts_a_decimal_beta_exactly():
    """β = 0.21 of k = 300 trims 63 (0.21·300 is 62.999996 in float32): a 300-slot cohort whose 63 largest values
    are far out; trimming 62 would keep one of them."""
    x = np.concatenate([np.arange(237, dtype=np.float32), np.full(63, 1e6, np.float32)])[:, None]
    got, _ = J.trimmed_mean({"w": jnp.asarray(x)}, None, beta=0.21)
    assert float(got["w"][0]) == pytest.approx(np.mean(np.arange(63, 237)))


@pytest.mark.parametrize("k", [6, 5])
def test_a_trimmed_mean_that_would_trim_every_valid_value_is_the_median(k):
    """β = 0.5 passes the check for an odd buffer (n = 11: 2⌊5.5⌋ = 10 < 11) but trims everything of an even k at
    run time: the rule keeps the middle values."""
    valid = _valid(k, 9)
    u = _uploads(9, valid)
    _close(J.trimmed_mean(u, valid, beta=0.5)[0], _unflat(ref_median(_flat(u)[np.asarray(valid)]), u))


def test_mean_is_the_weighted_mean_bit_for_bit():
    valid = _valid(8)
    u = _uploads(3, jnp.ones(N, bool))  # invalid slots of the engine carry finite values and weight 0
    w = jnp.asarray(np.random.default_rng(0).uniform(0.5, 3, N), jnp.float32) * valid
    eager, jitted = T.weighted_mean_clients(u, w), jax.jit(T.weighted_mean_clients)(u, w)  # XLA fuses differently
    for got, want in ((R.mean(u, None, w)[0], eager), (R.mean(u, valid, w)[0], eager),
                      (jax.jit(R.mean)(u, None, w)[0], jitted), (jax.jit(R.mean)(u, valid, w)[0], jitted)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    junk = _uploads(3, valid)  # NaN in invalid rows never enters, nor does a weight given to an invalid slot
    w_all = w + jnp.where(valid, 0.0, 5.0)
    idx = np.asarray(valid)
    _close(J.mean(junk, valid, w_all)[0], _unflat(np.asarray(w)[idx] @ _flat(junk)[idx] / float(jnp.sum(w)), junk))
    np.testing.assert_array_equal(J.mean(junk, valid, w_all)[1], np.asarray(valid, np.float32))


# --------------------------------------------------------------------------------------------- Krum family


@pytest.mark.parametrize("k,f", [(N, 2), (N, 4), (7, 2), (5, 2), (3, 1), (2, 1), (1, 3)])
def test_krum_and_multi_krum_follow_blanchard_et_al(k, f):
    """(N, 4): k = 2f + 3 exactly; (7, 2), (5, 2), (3, 1), (2, 1), (1, 3): fewer valid uploads than the bound, f
    lowered to what k admits."""
    valid = _valid(k, k + f)
    u = _uploads(10 * k + f, valid)
    idx = np.flatnonzero(np.asarray(valid))
    V = _flat(u)[idx]
    scores = ref_krum_scores(V, f)
    got_scores = np.asarray(J.krum_scores(u, valid, f=f))
    np.testing.assert_allclose(got_scores[idx], scores, rtol=1e-5)
    assert np.all(np.isinf(np.delete(got_scores, idx)))
    out, sel = J.krum(u, valid, f=f)
    best = idx[int(np.argmin(scores))]
    np.testing.assert_array_equal(sel, np.eye(N, dtype=np.float32)[best])
    for key in u:
        assert np.asarray(out[key]).tobytes() == np.asarray(u[key][best]).tobytes()
    for m in (None, 1, 3, N):
        count = min(max((k - f) if m is None else m, 1), k)
        order = idx[np.argsort(scores, kind="stable")][:count]
        out, sel = J.multi_krum(u, valid, f=f, m=m)
        _close(out, _unflat(_flat(u)[order].mean(axis=0), u))
        want = np.zeros(N, np.float32)
        want[order] = 1 / count
        np.testing.assert_allclose(sel, want, rtol=1e-6)


@pytest.mark.parametrize("k,f", [(N, 2), (N, 1), (9, 1), (7, 1), (6, 1), (3, 2)])
def test_bulyan_is_recursive_krum_then_the_beta_closest_to_the_median(k, f):
    """(N, 2): k = 4f + 3; (9, 1), (7, 1): θ even and odd; (6, 1), (3, 2): below the bound (f' = 0: the mean)."""
    valid = _valid(k, 7 * k + f)
    u = _uploads(k + 31 * f, valid)
    idx = np.flatnonzero(np.asarray(valid))
    want, picked = ref_bulyan(_flat(u)[idx], f)
    out, sel = J.bulyan(u, valid, f=f)
    _close(out, _unflat(want, u))
    share = np.zeros(N, np.float32)
    share[idx[picked]] = 1 / len(picked)
    np.testing.assert_allclose(sel, share, rtol=1e-6)


def test_krum_family_selects_the_honest_cluster_against_outliers():
    """The geometry the rules exist for: 8 uploads near 0 and 3 colluding ones near 50. Krum and Multi-Krum with
    f = 3 (n = 11 ≥ 2f + 3), and Bulyan with f = 2 (n ≥ 4f + 3) although 3 are bad, pick only from the cluster."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(size=(8, 6)) * 0.1, 50 + rng.normal(size=(3, 6))])
    u = {"w": jnp.asarray(x, jnp.float32)}
    assert int(np.argmax(J.krum(u, None, f=3)[1])) < 8
    assert np.all(np.asarray(J.multi_krum(u, None, f=3)[1])[8:] == 0)
    assert np.all(np.asarray(J.bulyan(u, None, f=2)[1])[8:] == 0)


# --------------------------------------------------------------------------------------------- norm-based


@pytest.mark.parametrize("k", [N, 4, 1])
def test_geometric_median_centered_clip_norm_bound_and_fltrust_follow_their_papers(k):
    valid = _valid(k, 3 * k)
    u = _uploads(5 * k, valid)
    idx = np.flatnonzero(np.asarray(valid))
    V = _flat(u)[idx]
    rng = np.random.default_rng(k)
    w = jnp.asarray(rng.uniform(0.5, 2.0, N), jnp.float32)
    p = np.asarray(w, np.float64)[idx]
    for iters, nu in ((3, 1e-6), (1, 0.5)):
        got, sel = J.geometric_median(u, valid, w, iters=iters, nu=nu)
        want, share = ref_geometric_median(V, p, iters, nu)
        _close(got, _unflat(want, u))
        np.testing.assert_allclose(np.asarray(sel)[idx], share, rtol=1e-5)
    v0 = _unflat(rng.normal(size=V.shape[1]), u)
    for tau, iters in ((0.5, 1), (2.0, 3), (100.0, 1)):
        got, sel = J.centered_clip(u, valid, v0=jax.tree.map(jnp.asarray, v0), tau=tau, iters=iters)
        _close(got, _unflat(ref_centered_clip(V, np.concatenate([v0[key].ravel() for key in u]), tau, iters), u))
        np.testing.assert_allclose(sel, np.asarray(valid) / k, rtol=1e-6)
    bound = float(np.median(np.linalg.norm(V, axis=1)))
    got, sel = J.norm_bound(u, valid, w, bound=bound)
    clipped = np.array([x * min(1, bound / np.linalg.norm(x)) for x in V])
    _close(got, _unflat(p @ clipped / p.sum(), u))
    np.testing.assert_allclose(sel, np.asarray(valid) / k, rtol=1e-6)
    g0 = V.mean(axis=0) + 0.3 * rng.normal(size=V.shape[1])
    got, sel = J.fltrust(u, valid, g0=jax.tree.map(jnp.asarray, _unflat(g0, u)))
    want, share = ref_fltrust(V, g0)
    _close(got, _unflat(want, u))
    np.testing.assert_allclose(np.asarray(sel)[idx], share, rtol=1e-5, atol=1e-7)


def test_fltrust_relu_drops_opposed_uploads_and_returns_g0_when_none_is_trusted():
    g0 = {"w": jnp.array([1.0, 0.0, 0.0])}
    u = {"w": jnp.array([[2.0, 1.0, 0.0], [-5.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, -1.0, 0.0]])}
    out, sel = J.fltrust(u, None, g0=g0)
    ts = np.array([2 / np.sqrt(5), 0.0, 0.0, 1 / np.sqrt(2)])  # the opposed and the zero upload get TS = 0
    want = (ts[0] * np.array([2, 1, 0]) / np.sqrt(5) + ts[3] * np.array([1, -1, 0]) / np.sqrt(2)) / ts.sum()
    np.testing.assert_allclose(out["w"], want, rtol=1e-6)
    np.testing.assert_allclose(sel, ts / ts.sum(), rtol=1e-6)
    out, sel = J.fltrust(u, jnp.array([False, True, True, False]), g0=g0)
    np.testing.assert_array_equal(out["w"], g0["w"])
    np.testing.assert_array_equal(sel, np.zeros(4))


def test_no_valid_upload_gives_zeros_and_never_nan():
    valid = jnp.zeros(N, bool)
    u = _uploads(1, valid)
    v0 = jax.tree.map(lambda x: jnp.ones(x.shape[1:]), u)
    for name in R.RULES:
        out, sel = getattr(J, name)(u, valid, jnp.ones(N), **_options(name, u))
        want = v0 if name == "centered_clip" else _options(name, u).get("g0", jax.tree.map(jnp.zeros_like, v0))
        _close(out, {key: np.asarray(x) for key, x in want.items()}, rtol=0, atol=0)
        np.testing.assert_array_equal(sel, np.zeros(N), err_msg=name)


# ------------------------------------------------------------------------------------------- jit and vmap


def _options(name, u, f=2):
    first = jax.tree.map(lambda x: jnp.ones(x.shape[1:]), u)
    return {"trimmed_mean": {"beta": 0.2}, "krum": {"f": f}, "multi_krum": {"f": f}, "bulyan": {"f": f},
            "centered_clip": {"v0": first, "tau": 1.5}, "norm_bound": {"bound": 2.0},
            "fltrust": {"g0": first}}.get(name, {})


TRACED = ("beta", "f", "tau", "bound")


@pytest.mark.parametrize("name", list(R.RULES))
def test_jit_and_vmap_over_lanes_with_traced_options_equal_eager(name):
    """Three lanes with their own cohorts, valid masks (k = 11, 8, 3) and traced options (f an int32 per lane)."""
    lanes = [(_uploads(40 + i, _valid(k, i)), _valid(k, i), jnp.asarray(np.random.default_rng(i).uniform(1, 2, N),
                                                                           jnp.float32)) for i, k in
             enumerate((N, 8, 3))]
    opts = [_options(name, lanes[0][0], f) for f in (2, 1, 0)]
    traced = [{k: v for k, v in o.items() if k in TRACED} for o in opts]
    fixed = {k: v for k, v in opts[0].items() if k not in TRACED}
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)  # noqa: E731
    fn = getattr(R, name)
    lane = lambda u, v, w, t: fn(u, v, w, **fixed, **t)  # noqa: E731
    batched = jax.jit(jax.vmap(lane))(stack([a for a, _, _ in lanes]), stack([v for _, v, _ in lanes]),
                                      stack([w for _, _, w in lanes]),
                                      jax.tree.map(lambda *a: jnp.asarray(a), *traced) if traced[0] else {})
    for i, ((u, v, w), t) in enumerate(zip(lanes, traced)):
        eager = fn(u, v, w, **fixed, **t)
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jax.tree.map(lambda x: x[i], batched))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{name} lane {i}")
            assert np.all(np.isfinite(b))


def test_outputs_keep_the_uploads_dtypes():
    u = {"a": jnp.ones((5, 3), jnp.bfloat16), "b": jnp.ones((5, 2), jnp.float32)}
    for name, fn in R.RULES.items():
        out, sel = jax.eval_shape(lambda u: fn(u, None, None, **_options(name, u, 1)), u)
        assert out["a"].dtype == jnp.bfloat16 and out["b"].dtype == jnp.float32, name
        assert sel.dtype == jnp.float32


# --------------------------------------------------------------------------------------------------- checks


def test_checks_refuse_impossible_options_with_one_line_errors():
    R.check_rule("krum", 7, f=2)
    R.check_rule("bulyan", 11, f=2)
    R.check_rule("multi_krum", 7, f=2, m=5)
    R.check_rule("trimmed_mean", 10, beta=0.45)
    R.check_rule("centered_clip", 10, tau=1.0, iters=2)
    R.check_rule("median", 3)
    cases = [(("krum", 6), {"f": 2}, "f", "n ≥ 2f + 3 = 7"), (("bulyan", 10), {"f": 2}, "f", "n ≥ 4f + 3 = 11"),
             (("multi_krum", 7), {"f": 2, "m": 6}, "m", "n − f = 5"), (("krum", 7), {"f": -1}, "f", "non-negative"),
             (("trimmed_mean", 10), {"beta": 0.5}, "beta", "leaving none"),
             (("trimmed_mean", 4), {"beta": 0.5}, "beta", "leaving none"),
             (("norm_bound", 3), {"bound": 0}, "bound", "positive"),
             (("centered_clip", 3), {"tau": -1}, "tau", "positive"),
             (("geometric_median", 3), {"iters": 0}, "iters", "≥ 1"), (("median", 3), {"beta": 0.1}, "beta", "not an"),
             (("krum", 7), {}, "f", "required"), (("kurm", 7), {}, "rule", "krum")]
    for (rule, n), options, key, text in cases:
        with pytest.raises(OptionError, match=re.escape(text)) as e:
            R.check_rule(rule, n, **options)
        assert e.value.key == key and "\n" not in str(e.value)
