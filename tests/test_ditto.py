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
