"""DFedAlt / DFedSalt and the decentralized template: the identities of the DFedAlt spec (§9 claim 5, issue point 5)
and executor agreement."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import ClientInput, ClientResult, make_algorithm
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.ops import gossip, partition

from conftest import assert_trees_close

M = 12
TRAIN = dict(lr=0.1, momentum=0.9, weight_decay=5e-3, clip_norm=10.0, batch_size=10, local_epochs=1)
DFL = dict(TRAIN, topology="random_k", k=3)
ALT = dict(DFL, personal_epochs=1, personal_lr=0.05)


@pytest.fixture(scope="module")
def pat12():
    """12 clients of 20 noisy digits, 2 classes each (the spec §9 sampler, scaled down)."""
    return D.make_federated("digits", M, "client_pathological", seed=0, classes_per_client=2, samples_per_client=20,
                            test_per_client=20, noise=0.5)


def _sim(data, name, executor="vmap", seed=0, chunk_size=None, **kw):
    model = make_model("mlp", data.input_shape, data.num_classes, hidden=[16])
    return Simulation(make_algorithm(name, **kw), data, model, executor=executor, seed=seed, chunk_size=chunk_size)


_RUNS: dict = {}


def _run(data, name, executor="vmap", rounds=2, **kw):
    """(state, metrics) after ``rounds`` rounds; memoised per configuration, so tests share compiled runs."""
    key = (id(data), name, executor, rounds, tuple(sorted(kw.items())))
    if key not in _RUNS:
        sim = _sim(data, name, executor, **kw)
        _RUNS[key] = sim.run_rounds(sim.init(), rounds)
    return _RUNS[key]


def _bitwise_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def test_dfedavg_on_complete_graph_equals_fedavg_with_full_participation(pat12):
    # Same init stream, same per-client TRAIN keys (fold_in(round key, TRAIN), client id), same local SGD: with
    # W = 11ᵀ/m every node holds the uniform mean, which is FedAvg's server model with uniform weights.
    hp = dict(TRAIN, momentum=0.0)
    dfl, _ = _run(pat12, "dfedavg", rounds=3, topology="full", **hp)
    cfl, _ = _run(pat12, "fedavg", rounds=3, cohort_size=None, weighting="uniform", **hp)
    for i in (0, M - 1):
        assert_trees_close(tree.take_clients(dfl.clients["params"], i), cfl.server["params"], rtol=1e-4, atol=1e-5)
    z = dfl.clients["z"]  # ... while the pre-gossip models are the clients' own local models
    assert not np.allclose(z["head"]["kernel"][0], z["head"]["kernel"][1])


def test_identity_mixing_equals_local_training(pat12):
    dfl, _ = _run(pat12, "dfedavgm", topology="identity", **TRAIN)
    local, _ = _run(pat12, "local", cohort_size=None, **TRAIN)
    assert_trees_close(dfl.clients["params"], local.clients["params"], rtol=1e-5, atol=1e-6)


def test_dfedalt_with_identity_mixing_is_isolated(pat12):
    """W = I: no information flows, so changing the other clients' data leaves client 0 bit-identical."""
    state, _ = _run(pat12, "dfedalt", **dict(ALT, topology="identity"))
    x = pat12.train.x.at[1:].set(jax.random.normal(jax.random.PRNGKey(3), pat12.train.x[1:].shape))
    other = pat12.replace(train=pat12.train.replace(x=x))
    state2, _ = _run(other, "dfedalt", **dict(ALT, topology="identity"))
    assert _bitwise_equal(tree.take_clients(state.clients, 0), tree.take_clients(state2.clients, 0))
    assert not _bitwise_equal(tree.take_clients(state.clients, 1), tree.take_clients(state2.clients, 1))


def test_gossip_never_changes_the_personal_part(pat12):
    # the same local round (one jitted per-client program under the loop executor), then different gossip: heads
    # and pre-gossip bodies bit-identical, post-gossip bodies mixed only under `full`
    full, _ = _run(pat12, "dfedalt", "loop", rounds=1, **dict(ALT, topology="full"))
    iso, _ = _run(pat12, "dfedalt", "loop", rounds=1, **dict(ALT, topology="identity"))
    assert _bitwise_equal(full.clients["params"]["head"], iso.clients["params"]["head"])
    assert _bitwise_equal(full.clients["z"], iso.clients["z"])
    assert not np.allclose(full.clients["params"]["Dense_0"]["kernel"], iso.clients["params"]["Dense_0"]["kernel"])
    # the aggregation step itself hands the personal leaves through untouched
    algo = _sim(pat12, "dfedalt", **ALT).algorithm
    local = {"params": full.clients["params"]}
    result = ClientResult(local, algo.shared_part(local["params"]), None, {})
    out = algo.aggregate(gossip.make_topology("random_k", M, k=3).sample(jax.random.PRNGKey(1)), result)
    assert out["params"]["head"]["kernel"] is local["params"]["head"]["kernel"]


def test_dfedsalt_with_rho_zero_equals_dfedalt(pat12):
    alt, _ = _run(pat12, "dfedalt", **ALT)
    salt0, _ = _run(pat12, "dfedsalt", sam_on="uv", rho=0.0, **ALT)
    salt, _ = _run(pat12, "dfedsalt", sam_on="uv", rho=0.7, **ALT)
    assert _bitwise_equal(alt.clients, salt0.clients)
    for part in ("head", "Dense_0"):  # SAM moves both phases' parts differently
        assert not np.allclose(alt.clients["params"][part]["kernel"], salt.clients["params"][part]["kernel"])


def test_dfedalt_all_shared_without_personal_phase_equals_dfedavgm(pat12):
    a, _ = _run(pat12, "dfedalt", personal="(?!)", personal_epochs=0, **DFL)
    b, _ = _run(pat12, "dfedavgm", **DFL)
    assert_trees_close(a.clients, b.clients, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,extra", [("dfedalt", ALT), ("dfedsalt", dict(ALT, sam_on="uv", rho=0.7)),
                                        ("dfedavgm", DFL), ("dfedsam", DFL), ("dispfl", dict(DFL, anneal_rounds=10))])
def test_executors_agree_with_loop(pat12, name, extra):
    rounds = 1 if name == "dispfl" else 2  # DisPFL's eager loop round is the slowest; one round covers its steps
    ref, mref = _run(pat12, name, "loop", rounds=rounds, **extra)
    st, m = _run(pat12, name, "vmap", rounds=rounds, **extra)
    assert_trees_close(st.clients, ref.clients, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m["consensus"], mref["consensus"], rtol=1e-4)


def test_dispfl_masks_sparsity_and_mask_aware_gossip(pat12):
    hp = dict(DFL, anneal_rounds=10)
    sim = _sim(pat12, "dispfl", **hp)
    s0 = sim.init()
    kernels = ["Dense_0", "head"]
    sizes = sum(s0.clients["params"][k]["kernel"][0].size for k in kernels)
    kept = sum(int(s0.clients["mask"][k]["kernel"][0].sum()) for k in kernels)
    assert kept == pytest.approx(0.5 * sizes, abs=2)  # ERK at overall density 0.5 over the kernels
    assert not np.array_equal(s0.clients["mask"]["Dense_0"]["kernel"][0], s0.clients["mask"]["Dense_0"]["kernel"][1])
    s2, m = _run(pat12, "dispfl", rounds=1, **hp)
    for leaf, mask, mask0 in zip(jax.tree.leaves(s2.clients["params"]), jax.tree.leaves(s2.clients["mask"]),
                                 jax.tree.leaves(s0.clients["mask"])):
        assert not np.asarray(leaf)[~np.asarray(mask)].any()  # w_i = w_i ⊙ M_i after the round
        np.testing.assert_array_equal(mask.reshape(M, -1).sum(1), mask0.reshape(M, -1).sum(1))  # counts kept
    assert not np.array_equal(s2.clients["mask"]["Dense_0"]["kernel"], s0.clients["mask"]["Dense_0"]["kernel"])
    assert np.all((0.5 < np.asarray(m["density"])) & (np.asarray(m["density"]) < 1))  # kernels 0.5, biases dense
    # the aggregation against a loop over receivers and coordinates
    rng = np.random.default_rng(0)
    vals = {"k": jnp.asarray(rng.normal(size=(M, 3, 2)), jnp.float32)}
    trained = {"k": jnp.asarray(rng.random((M, 3, 2)) < 0.5)}
    new = {"k": jnp.asarray(rng.random((M, 3, 2)) < 0.5)}
    local = {"params": jax.tree.map(lambda v, t: v * t, vals, trained), "trained_mask": trained, "mask": new}
    mixing = gossip.make_topology("random_k", M, k=3).sample(jax.random.PRNGKey(2))
    result = ClientResult({"params": local["params"], "mask": new}, {"params": local["params"], "mask": trained},
                          None, {})
    out = np.asarray(sim.algorithm.aggregate(mixing, result)["params"]["k"])
    a = np.asarray(mixing.W) > 0
    v, t, n = (np.asarray(x["k"]) for x in (local["params"], trained, new))
    for i in range(M):
        nb = np.flatnonzero(a[i])
        expect = v[nb].sum(0) / np.maximum(t[nb].sum(0), 1) * n[i]
        np.testing.assert_allclose(out[i], expect, rtol=1e-6, atol=1e-7)


def test_gossip_step_consensus_decays_within_the_spectral_bound_and_faster_on_denser_graphs(pat12):
    """The template's gossip step alone (no training) from independent initialisations: CD_t ≤ λ^{2t}·CD_0 for a
    symmetric doubly stochastic W, and CD orders as full < exp < torus < ring."""
    model = make_model("mlp", pat12.input_shape, pat12.num_classes, hidden=[16])
    x0 = jax.vmap(model.init)(jax.random.split(jax.random.PRNGKey(0), M))
    cd0 = float(gossip.consensus_distance(x0))
    cd = {}
    for topo in ("ring", "torus", "exp", "full"):
        algo = make_algorithm("dfedavg", topology=topo)
        mixing = algo.make_topology(M).sample()
        lam = 1 - float(gossip.spectral_gap(mixing))
        local = {"params": x0}
        for t in range(1, 5):
            local = algo.aggregate(mixing, ClientResult(local, algo.shared_part(local["params"]), None, {}))
            cd[topo] = float(gossip.consensus_distance(local["params"]))
            assert cd[topo] <= lam ** (2 * t) * cd0 * (1 + 1e-4) + 1e-9
    assert cd["full"] < 1e-9 < cd["exp"] < cd["torus"] < cd["ring"]
    # in training, the complete graph equalises all u_i (post-gossip CD ≈ 0) while the pre-gossip CD is not 0
    _, metrics = _run(pat12, "dfedavg", rounds=3, topology="full", **dict(TRAIN, momentum=0.0))
    assert np.all(np.asarray(metrics["consensus"]) < 1e-9) and np.all(np.asarray(metrics["consensus_local"]) > 1e-4)


def test_round_metrics_evaluation_points_and_consensus(pat12):
    state, metrics = _run(pat12, "dfedalt", **ALT)
    sim = _sim(pat12, "dfedalt", **ALT)
    shared = partition.split(state.clients["params"], sim.algorithm.shared_mask(state.clients["params"]))[0]
    assert float(metrics["bytes_up"][-1]) == pytest.approx(M * 3 * tree.nbytes(shared) / M)  # m·k messages
    summary, _ = sim.evaluate(state)
    assert summary["consensus"] == pytest.approx(float(metrics["consensus"][-1]), rel=1e-5)
    assert summary["consensus_local"] == pytest.approx(float(metrics["consensus_local"][-1]), rel=1e-5)
    assert summary["consensus"] < summary["consensus_local"]
    # 'local' scores (z^t, v^{t+1}); 'gossip' scores (u^{t+1}, v^{t+1}): the same run, another model
    post, _ = _run(pat12, "dfedalt", eval_point="gossip", **ALT)
    assert "z" not in post.clients
    assert_trees_close(post.clients["params"], state.clients["params"])
    post_summary, _ = _sim(pat12, "dfedalt", eval_point="gossip", **ALT).evaluate(post)
    assert "post_gossip_acc" not in post_summary
    assert float(summary["post_gossip_acc"]) == pytest.approx(float(post_summary["personal_acc"]), abs=1e-6)
    model0 = sim.algorithm.personal_params(ClientInput(tree.take_clients(state.clients, 0), None, None, None))
    assert_trees_close(partition.split(model0, sim.algorithm.shared_mask(model0))[0],
                       tree.take_clients(state.clients["z"], 0))


def test_dense_and_gather_gossip_forms_agree(pat12):
    a, _ = _run(pat12, "dfedalt", **ALT)  # gossip_form 'auto' = dense below GATHER_MIN_NODES
    b, _ = _run(pat12, "dfedalt", gossip_form="gather", **ALT)
    assert_trees_close(a.clients, b.clients, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hp,match", [
    (dict(topology="rnig"), "Did you mean 'ring'"),
    (dict(topology="random_k_mh", gossip_form="gather"), "no neighbour-gather form"),
    (dict(topology="random_k", k=12), "random_k needs 0 <= k < m"),
    (dict(topology="torus", torus_rows=5), "torus needs m = r\\*c"),
    (dict(sam_on="w"), "sam_on must be one of"),
    (dict(eval_point="after"), "eval_point must be one of"),
])
def test_bad_hyperparameters_are_refused_in_one_line(pat12, hp, match):
    with pytest.raises(ValueError, match=match) as e:
        _sim(pat12, "dfedalt", **hp)
    assert "\n" not in str(e.value)


@dataclasses.dataclass(frozen=True)
class _FixedTopology:
    """A topology whose every draw is the given W (rows as tuples, so that it hashes like the real ones)."""

    rows: tuple
    static: bool = True
    name: str = "fixed"

    def sample(self, key=None):
        return gossip.Mixing(W=jnp.asarray(self.rows, jnp.float32))


def _rows(w):
    return tuple(map(tuple, np.asarray(w, float)))


def _two_blocks(m):
    """Two complete blocks with no edge between them: row-stochastic, not connected."""
    w, h = np.zeros((m, m)), m // 2
    w[:h, :h], w[h:, h:] = 1 / h, 1 / (m - h)
    return _rows(w)


@pytest.mark.parametrize("name,rows,static,match", [
    ("ring", _two_blocks(M), True, "mixing matrix is not: connected \\(required: row_stochastic, connected\\)"),
    ("ring", _rows(0.9 * np.eye(M)), True, "not: row_stochastic, connected"),
    ("identity", _rows(0.9 * np.eye(M)), True, "not: row_stochastic \\(required: row_stochastic\\)"),
    ("random_k", _rows(np.full((M, M), 1.1 / M)), False, "not: row_stochastic .*draw from PRNGKey\\(0\\)"),
    ("identity", _rows(np.eye(M)), True, None),        # no communication by design: not required to be connected
    ("random_k", _two_blocks(M), False, None),         # one draw of a redrawn topology need not be connected
], ids=["static-disconnected", "static-not-stochastic", "identity-not-stochastic", "redrawn-not-stochastic",
        "identity-not-connected-ok", "redrawn-not-connected-ok"])
def test_validate_checks_the_mixing_matrix(monkeypatch, name, rows, static, match):
    """``Decentralized.validate`` refuses, in one line naming ``topology``, a mixing matrix that is not row-stochastic
    or (static, not ``identity``) not connected (``ops.gossip.check_mixing``)."""
    monkeypatch.setattr(gossip, "make_topology", lambda *a, **kw: _FixedTopology(rows, static))
    algo = make_algorithm("dfedavg", topology=name)
    if match is None:
        algo.validate(M)
        return
    with pytest.raises(OptionError, match=match) as e:
        algo.validate(M)
    assert e.value.key == "topology" and "\n" not in str(e.value)
    assert str(e.value).startswith(f"topology {name!r} with {M} clients: the {M}-node mixing matrix is not: ")


def test_every_topology_passes_the_mixing_check():
    """The library's topologies are valid: each at M nodes, and sparse random_k draws that are not connected (the
    DFedAlt neighbours study, k = 2 over 50 clients)."""
    for name in gossip.TOPOLOGIES:
        make_algorithm("dfedavg", topology=name, k=3).validate(M)
    assert not gossip.is_connected(gossip.make_topology("random_k", 50, k=2).sample(jax.random.PRNGKey(0)))
    make_algorithm("dfedavg", topology="random_k", k=2).validate(50)


def test_dfedalt_refuses_a_split_that_shares_nothing(pat12):
    with pytest.raises(ValueError, match=r"selects every parameter of the model, whose parameters are .*head/kernel"):
        _sim(pat12, "dfedalt", personal=".").init()


# ------------------------------------------------------------------------------------------ Algorithm 1, written out
def _phase(grad_fn, p, steps, lr, momentum, wd, clip):
    """``steps`` full-batch steps of the DFedAlt spec's local optimizer from a fresh buffer (D9): g clipped to global
    norm ``clip`` (D17), d = g + wd·p (D7), buf = μ·buf + d, p ← p − η·buf (PyTorch SGD semantics)."""
    buf = None
    for _ in range(steps):
        g = grad_fn(p)
        norm = np.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in jax.tree.leaves(g)))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        d = jax.tree.map(lambda a, w: scale * np.asarray(a, np.float64) + wd * w, g, p)
        buf = d if buf is None else jax.tree.map(lambda b, x: momentum * b + x, buf, d)
        p = jax.tree.map(lambda w, b: w - lr * b, p, buf)
    return p


def test_dfedalt_rounds_equal_the_alternating_updates_and_ring_gossip_of_algorithm_1(pat12):
    """DFedAlt (Shi et al. 2023, Algorithm 1; DFedAlt spec §3, D7, D9, D17), full batch: each client first takes
    K_v steps at η_v on the head v with the body frozen at u_i^t, then K_u steps at η_u on the body u with the head
    frozen at the new v_i^{t+1}; then u_i^{t+1} = Σ_l W[i,l] z_l with the ring's W (1/3 on i−1, i, i+1) and the head
    stays private. Two rounds written out in float64 NumPy around the gradients of the model's loss."""
    from reference import rows

    model = make_model("mlp", pat12.input_shape, pat12.num_classes, hidden=[16])
    hp = dict(lr=0.1, personal_lr=0.03, momentum=0.9, weight_decay=5e-3, clip_norm=1.0, batch_size=None,
              local_epochs=2, personal_epochs=3, topology="ring")
    sim = Simulation(make_algorithm("dfedalt", **hp), pat12, model, executor="vmap", seed=0)
    s0 = sim.init()
    got, _ = sim.run_rounds(s0, 2)
    f64 = lambda t: jax.tree.map(lambda a: np.asarray(a, np.float64), t)  # noqa: E731
    body = [f64({"Dense_0": tree.take_clients(s0.clients["params"], i)["Dense_0"]}) for i in range(M)]
    head = [f64({"head": tree.take_clients(s0.clients["params"], i)["head"]}) for i in range(M)]
    data = [rows(pat12.train, i) for i in range(M)]
    loss = jax.jit(lambda p, x, y: model.loss(p, D.Batch(x, y, jnp.ones(y.shape, bool))))
    grad = jax.jit(jax.grad(lambda u, v, x, y: loss({**u, **v}, x, y), argnums=(0, 1)))
    cast = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), t)  # noqa: E731
    for _ in range(2):
        z = []
        for i, (x, y) in enumerate(data):
            head[i] = _phase(lambda v, i=i: grad(cast(body[i]), cast(v), x, y)[1], head[i], 3, 0.03, 0.9, 5e-3, 1.0)
            z.append(_phase(lambda u, i=i: grad(cast(u), cast(head[i]), x, y)[0], body[i], 2, 0.1, 0.9, 5e-3, 1.0))
        body = [jax.tree.map(lambda a, b, c: (a + b + c) / 3, z[(i - 1) % M], z[i], z[(i + 1) % M])
                for i in range(M)]
    for i in range(M):
        assert_trees_close(tree.take_clients(got.clients["params"], i), {**body[i], **head[i]}, rtol=2e-4, atol=2e-5)
        assert_trees_close(tree.take_clients(got.clients["z"], i)["Dense_0"], z[i]["Dense_0"], rtol=2e-4, atol=2e-5)
