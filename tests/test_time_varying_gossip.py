"""Time-varying gossip (heterogeneity spec, "Decentralized"): links that fail with probability p and nodes that are
unavailable, each round's mixing matrix re-weighted by Metropolis–Hastings on the surviving graph — against the
weights written out in NumPy from the same draws, symmetric and doubly stochastic; through DFedAvg, an unavailable
node keeps its model and the others mix with that W_t."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.engine.context import MIXING
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.ops import gossip


def _mh(adjacency):
    """Metropolis–Hastings weights written out: w_ij = 1/(1 + max(d_i, d_j)) on a link, w_ii = 1 − Σ_j w_ij."""
    m = len(adjacency)
    deg = adjacency.sum(1)
    w = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if i != j and adjacency[i, j]:
                w[i, j] = 1.0 / (1 + max(deg[i], deg[j]))
        w[i, i] = 1 - w[i].sum()
    return w


def _surviving_written_out(base, key, p, available):
    """The surviving graph from the same draws: link i–j (i < j) of the base graph survives when its uniform is
    >= p and both ends are available."""
    m = base.shape[0]
    u = np.asarray(jax.random.uniform(key, (m, m)))
    adjacency = np.zeros((m, m), bool)
    for i in range(m):
        for j in range(i + 1, m):
            linked = base[i, j] > 0 or base[j, i] > 0
            if linked and u[i, j] >= p and available[i] and available[j]:
                adjacency[i, j] = adjacency[j, i] = True
    return adjacency


@pytest.mark.parametrize("name,kw", [("ring", {}), ("torus", {}), ("random_k", {"k": 3}), ("exp", {})])
def test_the_surviving_graph_is_reweighted_by_metropolis_hastings(name, kw):
    m = 12
    topo = gossip.make_topology(name, m, **kw)
    for r in range(4):
        base = topo.sample(jax.random.PRNGKey(r))
        key = jax.random.PRNGKey(100 + r)
        available = np.asarray(jax.random.uniform(jax.random.PRNGKey(200 + r), (m,)) >= 0.25)
        w = np.asarray(gossip.surviving(base, key, 0.3, jnp.asarray(available)).W, np.float64)
        adjacency = _surviving_written_out(np.asarray(base.W), key, 0.3, available)
        np.testing.assert_allclose(w, _mh(adjacency), atol=1e-6)
        assert gossip.is_symmetric(w) and gossip.is_doubly_stochastic(w) and (w >= 0).all()
        for i in np.flatnonzero(~available):  # an unavailable node keeps its model
            np.testing.assert_array_equal(w[i], np.eye(m)[i])


def test_links_fail_at_the_declared_rate():
    m = 40
    ring = gossip.make_topology("full", m).sample()
    kept = [np.asarray(gossip.surviving(ring, jax.random.PRNGKey(s), 0.3).W > 0).sum() - m for s in range(20)]
    rate = 1 - np.mean(kept) / (m * (m - 1))
    assert abs(rate - 0.3) < 4 * np.sqrt(0.3 * 0.7 / (20 * m * (m - 1) / 2))


def test_dfedavg_round_mixes_with_the_surviving_graph():
    """No local steps: a round is z ← W_t z exactly; the unavailable nodes' models are untouched."""
    m = 10
    data = D.make_federated("synthetic", num_clients=m, seed=0)
    alg = make_algorithm("dfedavg", topology="ring", local_steps=0, local_epochs=None, link_failure=0.4,
                         node_dropout=0.3, client_init="independent")
    sim = Simulation(alg, data, make_model("logreg", data.input_shape, data.num_classes), executor="vmap", seed=7)
    state = sim.init()
    for r in range(3):
        before = jax.device_get(state.clients["params"])
        state, _ = sim.round(state)
        round_key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(7), 1), r)
        stream = jax.random.fold_in(round_key, MIXING)
        available = np.asarray(jax.random.uniform(jax.random.fold_in(stream, 2), (m,)) >= 0.3)
        ring = np.asarray(gossip.make_topology("ring", m).sample().W)
        w = _mh(_surviving_written_out(ring, jax.random.fold_in(stream, 1), 0.4, available))
        for got, old in zip(jax.tree.leaves(state.clients["params"]), jax.tree.leaves(before)):
            want = np.tensordot(w, np.asarray(old, np.float64), axes=(1, 0))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(np.asarray(got)[~available], np.asarray(old)[~available])


def test_an_unavailable_node_does_not_train():
    m = 10
    data = D.make_federated("synthetic", num_clients=m, seed=0)
    alg = make_algorithm("dfedavg", topology="ring", local_steps=2, local_epochs=None, node_dropout=0.5)
    sim = Simulation(alg, data, make_model("logreg", data.input_shape, data.num_classes), executor="vmap", seed=7)
    state = sim.init()
    before = jax.device_get(state.clients)
    state, _ = sim.round(state)
    stream = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(7), 1), 0), MIXING)
    available = np.asarray(jax.random.uniform(jax.random.fold_in(stream, 2), (m,)) >= 0.5)
    assert 0 < available.sum() < m
    for got, old in zip(jax.tree.leaves(state.clients), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(got)[~available], np.asarray(old)[~available])
        assert not np.allclose(np.asarray(got)[available], np.asarray(old)[available])


def test_the_gather_form_is_refused_for_a_time_varying_graph():
    with pytest.raises(OptionError, match="'gather' needs a graph of static degree"):
        make_algorithm("dfedavg", topology="ring", gossip_form="gather", link_failure=0.1).validate(10)
