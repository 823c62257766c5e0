import jax
import numpy as np
import pytest

from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.models import make_model
from fljax.ops import partition

from conftest import assert_trees_close

BASE = dict(lr=0.1, cohort_size=4, batch_size=10)
EPOCHS = dict(local_epochs=1)  # FedPer's and LG-FedAvg's; FedRep's local work is its head and body epochs


def _sim(data, name, executor="vmap", **kw):
    model = make_model("mlp", data.input_shape, data.num_classes, hidden=[16])
    hp = {**BASE, **({} if name == "fedrep" else EPOCHS), **kw}
    return Simulation(make_algorithm(name, **hp), data, model, executor=executor, seed=0)


def _head(p):
    return p["head"]["kernel"]


def test_fedper_shares_body_keeps_heads(digits10):
    sim = _sim(digits10, "fedper")
    s0 = sim.init()
    s1, m = sim.round(s0)
    heads0, heads1 = _head(s0.clients["params"]), _head(s1.clients["params"])
    changed = [not np.array_equal(heads0[i], heads1[i]) for i in range(10)]
    assert sum(changed) == 4  # only the cohort's personal heads moved
    # the server's head is never updated; its body is the weighted mean of the cohort's bodies
    np.testing.assert_array_equal(_head(s1.server["params"]), _head(s0.server["params"]))
    ids = np.flatnonzero(changed)
    w = np.asarray(digits10.train.count)[ids].astype(np.float64)
    body = s1.clients["params"]["Dense_0"]["kernel"][ids]
    np.testing.assert_allclose(s1.server["params"]["Dense_0"]["kernel"], np.tensordot(w / w.sum(), body, 1),
                               rtol=1e-5, atol=1e-6)
    head_bytes = sum(x.size * 4 for x in jax.tree.leaves(s0.server["params"]["head"]))
    total = sum(x.size * 4 for x in jax.tree.leaves(s0.server["params"]))
    assert float(m["bytes_up"]) == 4 * (total - head_bytes) == float(m["bytes_down"])


def test_lg_fedavg_communicates_only_the_head(digits10):
    sim = _sim(digits10, "lg_fedavg")
    s0 = sim.init()
    s1, m = sim.round(s0)
    head_bytes = sum(x.size * 4 for x in jax.tree.leaves(s0.server["params"]["head"]))
    assert float(m["bytes_up"]) == 4 * head_bytes
    assert not np.array_equal(_head(s1.server["params"]), _head(s0.server["params"]))
    np.testing.assert_array_equal(s1.server["params"]["Dense_0"]["kernel"], s0.server["params"]["Dense_0"]["kernel"])


def test_fedrep_phases_touch_only_their_part(digits10):
    s = _sim(digits10, "fedrep", head_epochs=1, body_epochs=0)
    s0 = s.init()
    s1, _ = s.round(s0)
    # no body epochs: every stored body equals the server's broadcast body; heads moved
    bodies = partition.split(s1.clients["params"], s.algorithm.shared_mask(s0.server["params"]))[0]
    for leaf, ref in zip(jax.tree.leaves(bodies), jax.tree.leaves(s.algorithm.split(s0.server["params"])[0])):
        np.testing.assert_array_equal(leaf, np.broadcast_to(ref, leaf.shape))
    s = _sim(digits10, "fedrep", head_epochs=0, body_epochs=1)
    s0 = s.init()
    s1, _ = s.round(s0)
    np.testing.assert_array_equal(_head(s1.clients["params"]), _head(s0.clients["params"]))


def test_fedrep_executors_agree(digits10):
    a = _sim(digits10, "fedrep", "vmap")
    b = _sim(digits10, "fedrep", "loop")
    sa, ma = a.run_rounds(a.init(), 2)
    sb, mb = b.run_rounds(b.init(), 2)
    assert_trees_close(sa.clients, sb.clients, rtol=1e-4, atol=1e-5)
    assert_trees_close(sa.server, sb.server, rtol=1e-4, atol=1e-5)


def test_partial_refuses_a_split_that_shares_nothing(digits10):
    with pytest.raises(ValueError, match="selects every parameter"):
        _sim(digits10, "fedper", personal=".").init()
    # a regex that selects nothing lists the real parameter paths
    with pytest.raises(ValueError, match=r"personal 'classifier' selects no parameter of the model, whose "
                                         r"parameters are Dense_0/bias, Dense_0/kernel, .*head/kernel; choose"):
        _sim(digits10, "fedper", personal="classifier").init()
