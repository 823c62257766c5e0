"""The DFedAlt paper's baselines: DisPFL, FedBABU, Fed-RoD, FedAvg scored with stored local models; and the small
engine additions they use (Model.features, LocalTraining clipping, ClientArrays.padded)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import ClientInput, FedRoD, LocalTraining, make_algorithm
from fljax.engine import Simulation
from fljax.models import make_model

from conftest import assert_trees_close

M = 12
TRAIN = dict(lr=0.1, momentum=0.9, weight_decay=5e-3, clip_norm=10.0, batch_size=10, local_epochs=1)


@pytest.fixture(scope="module")
def pat12():
    return D.make_federated("digits", M, "client_pathological", seed=0, classes_per_client=2, samples_per_client=20,
                            test_per_client=20, noise=0.5)


def _model(data):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[16])


def _sim(data, name, executor="vmap", **kw):
    return Simulation(make_algorithm(name, **kw), data, _model(data), executor=executor, seed=0)


def test_model_features_are_the_head_input():
    model = make_model("mlp", (8, 8, 1), 10, hidden=[16])
    params = model.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 8, 8, 1))
    h = model.features(params, x)
    np.testing.assert_allclose(h @ params["head"]["kernel"] + params["head"]["bias"], model.apply(params, x),
                               rtol=1e-5, atol=1e-5)


def test_client_optimizer_clips_then_decays_then_steps():
    p = {"w": jnp.array([1.0, -2.0]), "b": jnp.array([3.0])}
    g = {"w": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}  # global norm 5
    opt = LocalTraining(lr=0.5, clip_norm=1.0, weight_decay=0.1).client_optimizer(0.5)
    updates, _ = opt.update(g, opt.init(p), p)
    expect = jax.tree.map(lambda gi, pi: -0.5 * (gi / 5.0 + 0.1 * pi), g, p)
    assert_trees_close(updates, expect)
    with pytest.raises(ValueError, match="clip_norm must be > 0"):
        LocalTraining(clip_norm=0.0)
    with pytest.raises(ValueError, match="clip_norm must be > 0"):  # an algorithm's local options: the same check
        make_algorithm("dfedavgm", clip_norm=0.0)


def test_client_arrays_padded(pat12):
    t = pat12.test.padded(pat12.test.n_max + 7)
    assert t.x.shape[1] == t.n_max == pat12.test.n_max + 7
    np.testing.assert_array_equal(t.count, pat12.test.count)
    np.testing.assert_array_equal(t.x[:, :pat12.test.n_max], pat12.test.x)
    assert not np.asarray(t.mask[:, pat12.test.n_max:]).any()
    with pytest.raises(ValueError, match="cannot pad"):
        pat12.test.padded(1)


def test_fedavg_stored_evaluation_keeps_each_clients_latest_local_model(pat12):
    sim = _sim(pat12, "fedavg", cohort_size=4, eval_model="stored", **TRAIN)
    s0 = sim.init()
    s1, _ = sim.round(s0)
    moved = [not np.array_equal(s1.clients["params"]["head"]["kernel"][i], s0.clients["params"]["head"]["kernel"][i])
             for i in range(M)]
    assert sum(moved) == 4  # the cohort stored its local models; the others keep the initial model
    stored = tree.take_clients(s1.clients["params"], int(np.flatnonzero(moved)[0]))
    assert not np.allclose(stored["head"]["kernel"], s1.server["params"]["head"]["kernel"])
    summary, _ = sim.evaluate(s1)
    assert summary["personal_acc"] != summary["global_acc"]


# ------------------------------------------------------------------------------------------------ FedBABU


def test_fedbabu_trains_the_body_under_a_fixed_head_and_fine_tunes_at_evaluation(pat12):
    sim = _sim(pat12, "fedbabu", cohort_size=4, **TRAIN)
    s0 = sim.init()
    s2, m = sim.run_rounds(s0, 2)
    np.testing.assert_array_equal(s2.server["params"]["head"]["kernel"], s0.server["params"]["head"]["kernel"])
    assert not np.allclose(s2.server["params"]["Dense_0"]["kernel"], s0.server["params"]["Dense_0"]["kernel"])
    body = tree.nbytes(sim.algorithm.split(s0.server["params"])[0])
    np.testing.assert_allclose(m["bytes_up"], 4 * body)
    np.testing.assert_allclose(m["bytes_down"], 4 * body)
    algo = sim.algorithm
    data0 = tree.take_clients(pat12.train, 0)
    inp = ClientInput({}, data0, jax.random.PRNGKey(0), jnp.int32(2), down=s2.server["params"], model=_model(pat12))
    tuned = algo.personal_params(inp)
    assert not np.allclose(tuned["Dense_0"]["kernel"], s2.server["params"]["Dense_0"]["kernel"])
    head_only = make_algorithm("fedbabu", finetune="head", **TRAIN)
    tuned = head_only.personal_params(inp)
    np.testing.assert_array_equal(tuned["Dense_0"]["kernel"], s2.server["params"]["Dense_0"]["kernel"])
    assert not np.allclose(tuned["head"]["kernel"], s2.server["params"]["head"]["kernel"])


# ------------------------------------------------------------------------------------------------ Fed-RoD


def test_fedrod_balanced_softmax_ignores_absent_classes_and_the_personal_head_learns_them_away(pat12):
    model = _model(pat12)
    algo = FedRoD(local=LocalTraining(lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=10, local_epochs=2))
    params = model.init(jax.random.PRNGKey(0))
    state = {"params": params, "p": tree.zeros_like(params["head"])}
    train = tree.take_clients(pat12.train, 0)
    absent = np.setdiff1d(np.arange(10), np.unique(np.asarray(train.y)[np.asarray(train.mask)]))
    assert len(absent) == 8
    res = algo.client_update(ClientInput(state, train, jax.random.PRNGKey(1), jnp.int32(0), down=params, model=model))
    w, p = res.state["params"], res.state["p"]
    # BSM: log π = −∞ for absent classes, so their generic logits get no gradient
    np.testing.assert_array_equal(w["head"]["bias"][absent], params["head"]["bias"][absent])
    assert not np.allclose(w["head"]["bias"], params["head"]["bias"])
    assert np.all(np.asarray(p["bias"])[absent] < 0)  # the personal head pushes absent classes down
    assert_trees_close(res.upload, w)  # only (u, g) goes to the server
    x = pat12.test.x[0]
    h = model.features(w, x)
    np.testing.assert_allclose(algo.logits(model, (w, p), x), model.apply(w, x) + h @ p["kernel"] + p["bias"],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fedbabu", "fedrod"])
def test_centralized_baselines_executors_agree_with_loop(pat12, name):
    hp = dict(TRAIN, cohort_size=4)
    a = _sim(pat12, name, "vmap", **hp)
    b = _sim(pat12, name, "loop", **hp)
    sa, _ = a.run_rounds(a.init(), 2)
    sb, _ = b.run_rounds(b.init(), 2)
    assert_trees_close(sa.server, sb.server, rtol=1e-4, atol=1e-5)
    assert_trees_close(sa.clients, sb.clients, rtol=1e-4, atol=1e-5)
    ea, eb = a.evaluate(sa)[0], b.evaluate(sb)[0]
    assert float(ea["personal_acc"]) == pytest.approx(float(eb["personal_acc"]), abs=1e-6)


def test_full_scale_config_validates():
    import os

    from fljax.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(root, "configs", "dfedalt_cifar10.yaml"))
    assert (cfg.algorithm, cfg.data.dataset, cfg.data.num_clients, cfg.rounds) == ("dfedalt", "cifar10", 100, 500)
    assert cfg.model.name == "resnet18_gn" and cfg.model.options == {"groups": 32, "head_bias": True}
