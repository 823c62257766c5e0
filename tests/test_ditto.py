import jax
import numpy as np

from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.models import make_model

BASE = dict(lr=0.1, cohort_size=None, batch_size=10, local_epochs=1, personal_epochs=2)


def _personal(data, **kw):
    model = make_model("mlp", data.input_shape, data.num_classes, hidden=[16])
    sim = Simulation(make_algorithm("ditto", **{**BASE, **kw}), data, model, executor="vmap", seed=0)
    s0 = sim.init()
    s1, _ = sim.round(s0)
    return s0, s1


def test_ditto_lambda_zero_modes_agree_and_large_lambda_stays_near_global(digits10):
    _, a = _personal(digits10, lam=0.0, prox_mode="gradient")
    _, b = _personal(digits10, lam=0.0, prox_mode="decoupled")
    for x, y in zip(jax.tree.leaves(a.clients["v"]), jax.tree.leaves(b.clients["v"])):
        np.testing.assert_array_equal(x, y)
    s0, near = _personal(digits10, lam=5.0, prox_mode="decoupled")  # ηλ = 0.5: a strong pull towards w_t
    w0 = s0.server["params"]
    dist = lambda s: float(tree.norm(tree.sub(s.clients["v"], tree.broadcast_clients(w0, 10))))
    assert dist(near) < 0.5 * dist(a)


def test_ditto_gradient_mode_is_sgd_on_the_regularised_objective(digits10):
    s0, s1 = _personal(digits10, lam=0.3, personal_epochs=1, batch_size=None)  # one full-batch step
    sim_model = make_model("mlp", digits10.input_shape, digits10.num_classes, hidden=[16])
    from fljax.data import Batch
    i = 3
    v0 = jax.tree.map(lambda x: x[i], s0.clients["v"])
    batch = Batch(digits10.train.x[i], digits10.train.y[i], digits10.train.mask[i])
    g = jax.grad(sim_model.loss)(v0, batch)
    expect = tree.axpy(-0.1, tree.add(g, tree.scale(0.3, tree.sub(v0, s0.server["params"]))), v0)
    got = jax.tree.map(lambda x: x[i], s1.clients["v"])
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(expect)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_ditto_both_prox_modes_at_positive_lambda_equal_the_written_out_steps(digits10):
    """Ditto (Li et al. 2021, Alg. 1) at λ = 0.5, full batch, two rounds, every client: the global model is FedAvg
    (w_i = w_t − η∇f_i(w_t), w_{t+1} = Σ n_i w_i/Σ n_i) and the personal model continues from its own v_i with, per
    step, 'gradient': v ← v − η(∇f_i(v) + λ(v − w_t)); 'decoupled' (DFedAlt spec D21): v ← v − η∇f_i(v), then
    v ← v − ηλ(v − w_t)."""
    from reference import gd, rows

    model = make_model("mlp", digits10.input_shape, digits10.num_classes, hidden=[16])
    lr, lam, epochs = 0.1, 0.5, 2
    data = [rows(digits10.train, i) for i in range(10)]
    n = np.array([len(y) for _, y in data], np.float64)
    for mode in ("gradient", "decoupled"):
        algo = make_algorithm("ditto", lr=lr, lam=lam, prox_mode=mode, cohort_size=None, batch_size=None,
                              local_epochs=1, personal_epochs=epochs)
        sim = Simulation(algo, digits10, model, executor="vmap", seed=0)
        s0 = sim.init()
        got, _ = sim.run_rounds(s0, 2)
        w = s0.server["params"]
        v = [w] * 10
        for _ in range(2):
            pull = lambda p, a=w: jax.tree.map(lambda u, b: lam * (u - b), p, a)  # noqa: E731
            for i, (x, y) in enumerate(data):
                if mode == "gradient":
                    v[i] = gd(model, v[i], x, y, lr, epochs, extra=pull)
                else:
                    for _ in range(epochs):
                        step = gd(model, v[i], x, y, lr, 1)
                        v[i] = jax.tree.map(lambda s, d: s - lr * d, step, pull(step))
            local = [gd(model, w, x, y, lr, 1) for x, y in data]
            w = jax.tree.map(lambda *leaves: sum(ni * leaf for ni, leaf in zip(n, leaves)) / n.sum(), *local)
        for i in range(10):
            got_v = jax.tree.map(lambda a: a[i], got.clients["v"])
            for a, b in zip(jax.tree.leaves(got_v), jax.tree.leaves(v[i])):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{mode}, client {i}")
        for a, b in zip(jax.tree.leaves(got.server["params"]), jax.tree.leaves(w)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=mode)
