"""fljax.ops.gossip: every topology's claimed properties, gossip identities, dense == gather."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fljax.ops import gossip as G
from fljax.ops.partition import mask_from_paths

SETTINGS = settings(max_examples=25, deadline=None)
KEY = jax.random.PRNGKey(0)


def client_tree(m, seed=0):
    r = np.random.default_rng(seed)
    return {"body": {"w": jnp.asarray(r.normal(size=(m, 3, 2)), jnp.float32)},
            "head": {"b": jnp.asarray(r.normal(size=(m, 4)), jnp.float32)}}


# name, kwargs, symmetric, doubly stochastic
CLAIMS = [
    ("ring", {}, True, True), ("torus", {}, True, True), ("grid_offsets", {}, True, True), ("exp", {}, True, True),
    ("exp_onesided", {}, False, True), ("full", {}, True, True), ("random_k", {"k": 4}, False, False),
    ("random_k_mh", {"k": 4}, True, True), ("erdos_renyi", {"k": 4}, True, True), ("identity", {}, True, True),
]


@pytest.mark.parametrize("name,kw,sym,ds", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_topology_claimed_properties(name, kw, sym, ds):
    m = 20
    topo = G.make_topology(name, m, **kw)
    mix = topo.sample(jax.random.PRNGKey(3))
    w = np.asarray(mix.W)
    assert w.shape == (m, m) and mix.W.dtype == jnp.float32
    assert G.is_row_stochastic(w)
    assert np.all(np.diag(w) > 0)                                # every node is its own neighbour
    assert G.is_symmetric(w) == sym
    assert G.is_doubly_stochastic(w) == ds
    assert G.is_column_stochastic(w) == ds
    assert topo.static == (name not in ("random_k", "random_k_mh", "erdos_renyi"))
    assert G.is_connected(w) == (name != "identity")
    if sym and ds:                                               # Definition 1 (iv): I ⪰ W ≻ −I
        ev = np.linalg.eigvalsh(w)
        assert ev.min() > -1 + 1e-6 and ev.max() < 1 + 1e-6
    if mix.idx is not None:                                      # gather form encodes the same W
        rebuilt = np.zeros((m, m))
        np.add.at(rebuilt, (np.repeat(np.arange(m), mix.idx.shape[1]), np.ravel(mix.idx)), np.ravel(mix.wts))
        np.testing.assert_allclose(rebuilt, w, atol=1e-7)


def test_make_topology_unknown_name_lists_valid_choices():
    with pytest.raises(ValueError, match="valid: ring, torus"):
        G.make_topology("hypercube", 8)
    # TOPOLOGIES maps every buildable name to a one-line summary (the CLI lists it)
    assert set(G.TOPOLOGIES) == {c[0] for c in CLAIMS}
    assert all(isinstance(v, str) and "\n" not in v for v in G.TOPOLOGIES.values())


@pytest.mark.parametrize("m", [3, 4, 5, 8, 13, 40])
def test_ring_spectral_gap_oracle(m):
    gap = float(G.spectral_gap(G.Ring(m).sample().W))
    np.testing.assert_allclose(gap, 2 * (1 - np.cos(2 * np.pi / m)) / 3, atol=2e-6)


@pytest.mark.parametrize("m,rows", [(9, None), (12, 3), (20, None), (25, None), (36, None)])
def test_torus_eigenvalues_and_shape(m, rows):
    topo = G.Torus(m, rows)
    r, c = topo.shape()
    assert r * c == m and r >= 3 and (rows is not None or r == max(d for d in range(1, int(m**0.5) + 1) if m % d == 0))
    ev = np.sort(np.linalg.eigvalsh(np.asarray(topo.sample().W, np.float64)))
    a, b = np.meshgrid(np.arange(r), np.arange(c), indexing="ij")
    oracle = np.sort(((1 + 2 * np.cos(2 * np.pi * a / r) + 2 * np.cos(2 * np.pi * b / c)) / 5).ravel())
    np.testing.assert_allclose(ev, oracle, atol=1e-6)


def test_torus_rejects_thin_layouts():
    for m in (8, 14, 7):                                         # r = 2, 2, 1
        with pytest.raises(ValueError):
            G.Torus(m).shape()


def test_degrees_of_static_graphs():
    assert np.count_nonzero(G.Ring(10).sample().W[0]) == 3
    assert np.count_nonzero(G.GridOffsets(20).sample().W[0]) == 5
    np.testing.assert_allclose(G.GridOffsets(20).sample().W[0, 9], 0.2)
    # exp, m = 16: ±1, ±2, ±4, ±8 (8 ≡ −8) → 7 distinct neighbours; one-sided: +1, +2, +4, +8
    assert np.count_nonzero(G.Exponential(16).sample().W[0]) == 8
    assert np.count_nonzero(G.Exponential(16, one_sided=True).sample().W[0]) == 5
    np.testing.assert_allclose(G.Complete(5).sample().W, np.full((5, 5), 0.2))
    assert float(G.spectral_gap(G.Complete(7).sample().W)) == pytest.approx(1.0, abs=1e-6)


def test_random_k_rows_redraws_and_jit():
    m, k = 12, 3
    topo = G.RandomK(m, k)
    sample = jax.jit(topo.sample)
    w1, w2 = sample(jax.random.PRNGKey(1)), sample(jax.random.PRNGKey(2))
    for mix in (w1, w2):
        w = np.asarray(mix.W)
        np.testing.assert_allclose(w.sum(1), 1, atol=1e-6)
        assert np.all(np.count_nonzero(w, axis=1) == k + 1)        # k distinct others + self
        np.testing.assert_allclose(w[w > 0], 1 / (k + 1))
        assert np.all(np.diag(w) > 0)
    assert not np.array_equal(w1.W, w2.W)
    np.testing.assert_array_equal(sample(jax.random.PRNGKey(1)).W, w1.W)


def test_random_k_choice_is_uniform_over_others():
    """Each node receives from each other node with probability k/(m−1)."""
    m, k, n = 6, 2, 4000
    ws = jax.vmap(lambda key: G.RandomK(m, k).sample(key).W)(jax.random.split(KEY, n))
    freq = np.asarray((ws > 0).mean(0))
    off = freq[~np.eye(m, dtype=bool)]
    np.testing.assert_allclose(off, k / (m - 1), atol=0.03)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), m=st.sampled_from([2, 5, 9, 15]), p=st.floats(0.15, 0.9))
def test_metropolis_hastings_on_random_connected_graphs(seed, m, p):
    r = np.random.default_rng(seed)
    a = np.triu(r.random((m, m)) < p, 1)
    a = a | a.T
    ring = np.roll(np.eye(m, dtype=bool), 1, axis=1)              # union with a ring: connected
    a = a | ring | ring.T
    w = np.asarray(G.metropolis_hastings(a), np.float64)
    assert G.is_symmetric(w) and G.is_doubly_stochastic(w) and G.is_connected(w)
    deg = a.sum(1) - np.diag(a)
    i, j = np.nonzero(a & ~np.eye(m, dtype=bool))
    np.testing.assert_allclose(w[i, j], 1 / (1 + np.maximum(deg[i], deg[j])), rtol=1e-6)
    assert np.all(w[(~a) & ~np.eye(m, dtype=bool)] == 0)
    assert float(G.spectral_gap(w)) > 0
    assert np.linalg.eigvalsh(w).min() > -1


def test_erdos_renyi_static_option_ignores_key():
    er = G.ErdosRenyi(15, p=0.3, redraw=False, seed=4)
    np.testing.assert_array_equal(er.sample(jax.random.PRNGKey(1)).W, er.sample(jax.random.PRNGKey(2)).W)
    red = G.ErdosRenyi(15, p=0.3)
    assert not np.array_equal(red.sample(jax.random.PRNGKey(1)).W, red.sample(jax.random.PRNGKey(2)).W)
    disconnected = G.ErdosRenyi(15, p=0.0).sample(KEY).W            # no edges: W = I, gap 0
    np.testing.assert_allclose(disconnected, np.eye(15))
    assert float(G.spectral_gap(disconnected)) == pytest.approx(0.0, abs=1e-6)


def test_spectral_gap_uses_the_most_negative_eigenvalue():
    """λ = max(|λ₂|, |λ_m|): a 4-cycle with self-weight 0.1 and 0.45 per neighbour has eigenvalues
    0.1 + 0.9·cos(πa/2) = 1, 0.1, −0.8, 0.1, so λ = 0.8 (not λ₂ = 0.1) and 1 − λ = 0.2."""
    w = 0.1 * np.eye(4) + 0.45 * (np.roll(np.eye(4), 1, 1) + np.roll(np.eye(4), -1, 1))
    np.testing.assert_allclose(G.spectral_gap(jnp.asarray(w)), 0.2, atol=1e-6)
    np.testing.assert_allclose(G.contraction(jnp.asarray(w)), 0.8, atol=1e-6)


def test_contraction_matches_spectral_gap_for_symmetric_w():
    w = G.Torus(16).sample().W
    np.testing.assert_allclose(G.contraction(w), 1 - G.spectral_gap(w), atol=1e-5)
    assert float(G.contraction(G.Exponential(16, one_sided=True).sample().W)) < 1


# --------------------------------------------------------------------------------------------------- gossip


@pytest.mark.parametrize("name,kw", [(c[0], c[1]) for c in CLAIMS if c[3]])
def test_doubly_stochastic_gossip_preserves_client_mean(name, kw):
    m = 20
    tree = client_tree(m)
    w = G.make_topology(name, m, **kw).sample(jax.random.PRNGKey(5)).W
    out = G.gossip(w, tree)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a.mean(0), b.mean(0), atol=1e-5), out, tree)


def test_gossip_is_the_receiver_row_einsum():
    m = 5
    w = np.random.default_rng(0).random((m, m))
    w /= w.sum(1, keepdims=True)
    x = np.random.default_rng(1).normal(size=(m, 3))
    np.testing.assert_allclose(G.gossip(jnp.asarray(w, jnp.float32), jnp.asarray(x, jnp.float32)), w @ x, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("name,kw", [("ring", {}), ("torus", {}), ("exp", {}), ("random_k", {"k": 5}),
                                     ("full", {}), ("identity", {})])
def test_dense_and_gather_gossip_agree(name, kw):
    m = 16
    tree = client_tree(m, 2)
    mix = G.make_topology(name, m, **kw).sample(jax.random.PRNGKey(6))
    dense = G.gossip(mix, tree)
    gather = jax.jit(G.gossip_gather)(mix.idx, mix.wts, tree)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), dense, gather)


def test_masked_gossip_leaves_personal_leaves_bit_identical():
    m = 10
    tree = client_tree(m, 3)
    w = G.Complete(m).sample().W
    for mask in ("body", mask_from_paths(tree, "body"), lambda p, x: p.startswith("body")):
        out = G.gossip(w, tree, mask=mask)
        assert out["head"]["b"] is tree["head"]["b"]
        np.testing.assert_allclose(out["body"]["w"], np.broadcast_to(tree["body"]["w"].mean(0), (m, 3, 2)),
                                   atol=1e-6)
    mix = G.Ring(m).sample()
    out = G.gossip_gather(mix.idx, mix.wts, tree, mask="body")
    assert out["head"]["b"] is tree["head"]["b"]


def test_identity_and_full_gossip():
    m = 8
    tree = client_tree(m, 4)
    out = G.gossip(G.Identity(m).sample().W, tree)
    jax.tree.map(np.testing.assert_array_equal, out, tree)
    assert float(G.consensus_distance(G.gossip(G.Complete(m).sample().W, tree))) < 1e-10


@pytest.mark.parametrize("name", ["ring", "torus", "exp", "random_k_mh"])
def test_consensus_distance_decays_at_most_lambda_2t(name):
    """For symmetric doubly stochastic W: CD_t ≤ λ^{2t}·CD_0 (DFedAlt spec §9 claim 4)."""
    with jax.enable_x64(True):
        m = 16
        mix = G.make_topology(name, m, **({"k": 3} if name == "random_k_mh" else {})).sample(jax.random.PRNGKey(7))
        w = jnp.asarray(mix.W, jnp.float64)
        lam = 1 - float(G.spectral_gap(w))
        assert lam < 1
        tree = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), client_tree(m, 5))
        cd0 = float(G.consensus_distance(tree))
        for t in range(1, 15):
            tree = G.gossip(w, tree)
            assert float(G.consensus_distance(tree)) <= lam ** (2 * t) * cd0 * (1 + 1e-9) + 1e-15


def test_consensus_distance_definition():
    x = jnp.asarray([[0.0, 2.0], [2.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(G.consensus_distance({"x": x}), (2 + 2 + 0) / 3)


def test_gossip_inside_jit_with_redrawn_topology():
    m = 10
    topo = G.RandomK(m, 3)
    tree = client_tree(m, 6)

    @jax.jit
    def step(key, t):
        return G.gossip(topo.sample(key), t)

    out1, out2 = step(jax.random.PRNGKey(1), tree), step(jax.random.PRNGKey(2), tree)
    assert not np.allclose(out1["body"]["w"], out2["body"]["w"])
    assert step._cache_size() == 1


def test_random_k_draws_every_k_subset_of_the_others_equally_often():
    """Floyd's draw: each of the C(m−1, k) neighbour sets of a node is equally likely (not only each pair)."""
    import itertools

    m, k, n = 5, 2, 6000
    chosen = jax.vmap(lambda key: G.RandomK(m, k).sample(key).idx[:, 1:])(jax.random.split(KEY, n))
    chosen = np.sort(np.asarray(chosen), axis=-1)
    for i in range(m):
        others = [j for j in range(m) if j != i]
        subsets = list(itertools.combinations(others, k))
        counts = np.array([np.all(chosen[:, i] == s, axis=1).sum() for s in subsets])
        assert counts.sum() == n
        np.testing.assert_allclose(counts / n, 1 / len(subsets), atol=0.025)


@pytest.mark.parametrize("name,kw,sym,ds", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_check_mixing_accepts_claimed_properties_and_names_the_missing_ones(name, kw, sym, ds):
    mix = G.make_topology(name, 12, **kw).sample(jax.random.PRNGKey(1))
    claimed = {"row_stochastic": True, "column_stochastic": ds, "doubly_stochastic": ds, "symmetric": sym,
               "connected": name != "identity"}
    assert set(claimed) == set(G.MIXING_PROPERTIES)
    G.check_mixing(mix, [p for p, holds in claimed.items() if holds])
    missing = [p for p, holds in claimed.items() if not holds]
    if missing:
        with pytest.raises(ValueError, match=f"not: {', '.join(missing)} \\(required"):
            G.check_mixing(mix.W, list(G.MIXING_PROPERTIES))
    if name != "identity":
        G.check_mixing(mix)                                            # default: row-stochastic and connected


def test_check_mixing_one_line_errors():
    w = np.asarray(G.Ring(5).sample(None).W)
    bad = w.copy()
    bad[0, 0] -= 0.5                                                     # row 0 sums to 1/2
    with pytest.raises(ValueError, match=r"^the 5-node mixing matrix is not: row_stochastic \(required") as e:
        G.check_mixing(bad)
    assert "\n" not in str(e.value)
    neg = w + 0.2 * (np.eye(5) - np.roll(np.eye(5), 2, axis=1))          # rows sum to 1, one negative weight each
    with pytest.raises(ValueError, match="row_stochastic"):
        G.check_mixing(neg)
    with pytest.raises(ValueError, match="unknown mixing properties \\['stochastic'\\]; valid: row_stochastic"):
        G.check_mixing(w, ["stochastic"])
