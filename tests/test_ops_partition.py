"""fljax.ops.partition: split/merge by path, mask arithmetic, mask-aware averaging."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.ops import partition as Pt


def params():
    return {"params": {"Conv_0": {"kernel": jnp.ones((3, 3, 1, 2))}, "Dense_0": {"kernel": jnp.ones((4, 3)),
                                                                                "bias": jnp.zeros(3)},
                       "head": {"kernel": 2 * jnp.ones((3, 2))}}}


def test_mask_from_paths_regex_and_predicate():
    p = params()
    m = Pt.mask_from_paths(p, "^params/head/")
    assert m == {"params": {"Conv_0": {"kernel": False}, "Dense_0": {"kernel": False, "bias": False},
                            "head": {"kernel": True}}}
    assert Pt.mask_from_paths(p, lambda path, x: x.ndim == 4)["params"]["Conv_0"]["kernel"] is True
    with pytest.raises(TypeError):
        Pt.mask_from_paths(p, 3)


def test_split_merge_round_trip_and_grad_through_one_part():
    p = params()
    mask = Pt.mask_from_paths(p, "head")
    v, u = Pt.split(p, mask)
    assert v["params"]["Dense_0"]["kernel"] is None and u["params"]["head"]["kernel"] is None
    assert len(jax.tree.leaves(v)) == 1 and len(jax.tree.leaves(u)) == 3
    merged = Pt.merge(v, u)
    assert jax.tree.structure(merged) == jax.tree.structure(p)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), merged, p)
    loss = lambda vv: sum(jnp.sum(x ** 2) for x in jax.tree.leaves(Pt.merge(vv, u)))  # noqa: E731
    g = jax.grad(loss)(v)
    assert len(jax.tree.leaves(g)) == 1
    np.testing.assert_array_equal(g["params"]["head"]["kernel"], 4 * jnp.ones((3, 2)))


def test_mask_arithmetic_leaf_and_entry_masks():
    p = params()
    a = Pt.mask_from_paths(p, "kernel")
    b = Pt.mask_from_paths(p, "Dense_0")
    assert jax.tree.leaves(Pt.mask_not(a)) == [False, True, False, False]          # leaf order: Conv, bias, k, head
    assert all(type(m) is bool for m in jax.tree.leaves(Pt.mask_not(b)))             # leaf masks stay static
    assert Pt.count(a, p) == 18 + 12 + 6 and Pt.count(Pt.mask_not(a), p) == 3
    e1 = {"x": jnp.array([True, False, True])}
    np.testing.assert_array_equal(Pt.mask_not(e1)["x"], [False, True, False])
    assert int(Pt.count(e1)) == 2
    assert int(Pt.count({"x": jnp.array([True, False])}, {"x": jnp.ones((4, 2))})) == 4   # broadcast entry mask


def test_masked_average_entry_masks_against_loop():
    r = np.random.default_rng(0)
    c = 5
    vals = {"w": jnp.asarray(r.normal(size=(c, 3, 4)), jnp.float32), "b": jnp.asarray(r.normal(size=(c, 2)))}
    masks = {"w": jnp.asarray(r.random((c, 3, 4)) < 0.4), "b": jnp.array([1, 0, 1, 0, 0], bool)}
    out = Pt.masked_average(vals, masks)
    w, m = np.asarray(vals["w"]), np.asarray(masks["w"])
    expect = np.zeros((3, 4))
    for idx in np.ndindex(3, 4):
        held = [w[(i,) + idx] for i in range(c) if m[(i,) + idx]]
        expect[idx] = np.mean(held) if held else 0.0                 # nobody holds it: 0 (max(Σm, 1))
    np.testing.assert_allclose(out["w"], expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["b"], (vals["b"][0] + vals["b"][2]) / 2, rtol=1e-6)


def test_masked_average_with_adjacency_is_dispfl_gossip():
    r = np.random.default_rng(1)
    c = 4
    v = jnp.asarray(r.normal(size=(c, 6)), jnp.float32)
    m = jnp.asarray(r.random((c, 6)) < 0.5)
    adj = jnp.asarray([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], jnp.float32)
    out = Pt.masked_average({"v": v}, {"v": m}, adjacency=adj)["v"]
    for i in range(c):
        nb = np.flatnonzero(np.asarray(adj[i]))
        expect = Pt.masked_average({"v": v[nb]}, {"v": m[nb]})["v"]
        np.testing.assert_allclose(out[i], expect, rtol=1e-5, atol=1e-6)
    full = Pt.masked_average({"v": v}, {"v": m}, adjacency=jnp.ones((c, c)))["v"]
    np.testing.assert_allclose(full, jnp.broadcast_to(Pt.masked_average({"v": v}, {"v": m})["v"], (c, 6)),
                               rtol=1e-6)
