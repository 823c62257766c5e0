"""fljax.ops.sparsity (ERK densities, random masks, prune/regrow) and the linear-time rank_mask, against brute force."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.ops import sparsity
from fljax.ops.prox import rank_mask

SHAPES = [(64, 128), (128, 128), (128, 10)]


def _params(key=0):
    k = jax.random.split(jax.random.PRNGKey(key), 6)
    return {"a": {"kernel": jax.random.normal(k[0], SHAPES[0]), "bias": jax.random.normal(k[1], (128,))},
            "b": {"kernel": jax.random.normal(k[2], SHAPES[1]), "bias": jax.random.normal(k[3], (128,))},
            "head": {"kernel": jax.random.normal(k[4], SHAPES[2]), "bias": jax.random.normal(k[5], (10,))}}


def test_erk_densities_by_hand_and_budget():
    # raw Σ/Π: 192/8192, 256/16384, 138/1280; ε·138/1280 > 1 makes the head dense, then
    # ε = (0.5·25856 − 1280)/(192 + 256) = 26.0 → 0.609375 and 0.40625
    d = sparsity.erk_densities(SHAPES, 0.5)
    np.testing.assert_allclose(d, [0.609375, 0.40625, 1.0])
    sizes = [math.prod(s) for s in SHAPES]
    for density in (0.05, 0.3, 0.5, 0.9, 1.0):
        d = sparsity.erk_densities(SHAPES, density)
        assert sum(x * n for x, n in zip(d, sizes)) == pytest.approx(density * sum(sizes))
        assert all(0 < x <= 1 for x in d)
        free = [(x, s) for x, s in zip(d, SHAPES) if x < 1]  # non-capped layers: density ∝ Σ(s)/Π(s)
        ratios = [x / (sum(s) / math.prod(s)) for x, s in free]
        np.testing.assert_allclose(ratios, ratios[0] if ratios else [], rtol=1e-12)
    with pytest.raises(ValueError, match="density must be in"):
        sparsity.erk_densities(SHAPES, 0.0)


def test_random_masks_keep_exact_counts_and_dense_vectors():
    p = _params()
    dens = sparsity.layer_densities(p, 0.5)
    assert dens["a"]["bias"] == 1.0 and dens["head"]["kernel"] == 1.0
    draw = jax.jit(lambda key: sparsity.random_masks(key, p, dens))
    m1, m2 = draw(jax.random.PRNGKey(1)), draw(jax.random.PRNGKey(2))
    for leaf, mask, d in zip(jax.tree.leaves(p), jax.tree.leaves(m1), jax.tree.leaves(dens)):
        assert mask.dtype == bool and mask.shape == leaf.shape
        assert int(mask.sum()) == round(d * leaf.size)
    assert not np.array_equal(m1["a"]["kernel"], m2["a"]["kernel"])
    uni = sparsity.layer_densities(p, 0.25, "uniform")
    assert uni["head"]["kernel"] == 0.25 and uni["head"]["bias"] == 1.0


def test_prune_regrow_against_brute_force():
    p = _params(3)
    dens = sparsity.layer_densities(p, 0.3, "uniform")
    masks = jax.jit(lambda key: sparsity.random_masks(key, p, dens))(jax.random.PRNGKey(4))
    scores = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(5), x.shape), p)
    f = jax.jit(sparsity.prune_regrow)  # one compilation per regrowth rule: the fraction is traced
    for fraction in (0.0, 0.1, 0.37, 1.0):
        for sc in (None, scores):
            new = f(p, masks, jnp.float32(fraction), jax.random.PRNGKey(6), sc)
            for w, m, n, s in zip(jax.tree.leaves(p), jax.tree.leaves(masks), jax.tree.leaves(new),
                                  jax.tree.leaves(scores)):
                w, m, n, s = map(np.asarray, (w, m, n, s))
                if w.ndim < 2:
                    assert np.array_equal(m, n)
                    continue
                k = math.ceil(fraction * m.sum() - 1e-9)
                active = np.flatnonzero(m.ravel())
                dropped = active[np.argsort(np.abs(w.ravel()[active]), kind="stable")[:k]]
                kept = m.ravel().copy()
                kept[dropped] = False
                assert n.sum() == m.sum()  # counts preserved
                grown = n.ravel() & ~kept
                assert grown.sum() == k and np.array_equal(n.ravel() & kept, kept)
                if sc is not None:  # regrowth by largest score among the inactive entries
                    inactive = np.flatnonzero(~kept)
                    best = inactive[np.argsort(-np.abs(s.ravel()[inactive]), kind="stable")[:k]]
                    assert set(np.flatnonzero(grown)) == set(best)


def test_anneal_fraction_schedule():
    np.testing.assert_allclose([float(sparsity.anneal_fraction(t, 100)) for t in (0, 50, 100, 150)],
                               [0.5, 0.25, 0.0, 0.0], atol=1e-7)


def _rank_mask_reference(x, k):
    order = np.argsort(-x.ravel(), kind="stable")  # ties to the lower flat index
    out = np.zeros(x.size, bool)
    out[order[:k]] = True
    return out.reshape(x.shape)


def test_rank_mask_matches_stable_argsort_with_ties_signed_zeros_and_infinities():
    rng = np.random.default_rng(0)
    for trial in range(20):
        x = rng.integers(-3, 4, size=(7, 9)).astype(np.float32)  # many ties
        x[rng.random(x.shape) < 0.1] = -np.inf
        x[rng.random(x.shape) < 0.1] = np.inf
        x[rng.random(x.shape) < 0.1] = -0.0
        for k in (0, 1, 5, 31, 62, 63, 70):
            got = np.asarray(jax.jit(rank_mask)(jnp.asarray(x), k))
            np.testing.assert_array_equal(got, _rank_mask_reference(np.where(x == 0, 0.0, x), min(k, x.size)))
