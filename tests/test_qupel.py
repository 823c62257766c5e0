"""QuPeL (QuPeD spec §10): lines 10-14 against their definition, both couplings of D30, and a run (vmap = loop)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.algorithms.quped import tree_leaf
from fljax.data.batching import Batch
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.ops import quant

from conftest import assert_trees_close

from test_quped import KW, data, mlp  # noqa: F401 (QuPeD's small problem and its fixtures)


def _setup(algo, data, mlp):
    kx, kw = jax.random.split(jax.random.PRNGKey(4))
    state = algo.client_init(mlp, data.train.n_max, mlp.init(kx))
    w = mlp.init(kw)
    batch = Batch(x=data.train.x[0, :8], y=data.train.y[0, :8], mask=jnp.ones(8, bool))
    return state, w, batch


@pytest.mark.parametrize("coupling", ["x", "quantized"])
def test_one_iteration_is_the_definition(data, mlp, coupling):
    """Lines 10-13 (prox x step with the coupling gradient, center step on CE at the new x) and line 14
    (w ← w − η₃λ_p(w − s)), written out from the objective F = f(x) + f(Q_c(x)) + λR + (λ_p/2)‖x − w‖² (D30: with
    Q_c(x) in the penalty)."""
    algo = make_algorithm("qupel", **KW, coupling=coupling)
    state, w, batch = _setup(algo, data, mlp)
    eta1, lam, lp = 0.1, 3.0, 0.2
    new, students, _ = algo.prox_step(mlp, state, ((w, batch), (w, batch)), eta1, lam, lp)
    spec = algo.spec(mlp)
    x, c = state["x"], state["c"]
    ce = lambda v: mlp.loss(v, batch)  # noqa: E731
    quantized = lambda p: p in spec.paths  # noqa: E731
    pull = tree.map_with_path(lambda p, a, b: jnp.zeros_like(a) if coupling == "quantized" and quantized(p)
                              else lp * (a - b), x, w)
    g = tree.add(tree.add(jax.grad(ce)(x), pull), tree.scale(algo.weight_decay, x))
    y = tree.axpy(-eta1, g, x)
    x1 = tree.map_with_path(lambda p, v: quant.prox_x(v, c[p], lam * eta1 / 2) if quantized(p) else v, y)
    assert_trees_close(new["x"], x1, rtol=1e-5, atol=1e-7)

    def center_objective(cc):
        q = spec.quantize(x1, cc, "nearest")
        return ce(q) + (0.5 * lp * tree.sq_norm(tree.sub(q, w)) if coupling == "quantized" else 0.0)

    h = jax.grad(center_objective)(c)
    eta2 = algo.center_lr(mlp)
    for p in spec.paths:
        expect = quant.center_update(c[p], h[p], tree_leaf(x1, p).ravel(), eta2, lam)
        np.testing.assert_allclose(new["c"][p], expect, rtol=1e-5, atol=1e-7)
    target = x1 if coupling == "x" else spec.quantize(x1, new["c"], "nearest")
    w1, _ = algo.global_step(mlp, mlp, w, None, (w, None), students, batch, eta1, lp)
    assert_trees_close(w1, tree.axpy(-0.5 * lp, tree.sub(w, target), w), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_run_matches_the_loop_and_couples_w_to_the_clients(data, mlp):
    """Two rounds with half the clients sampled: vmap (masked and gathered cohorts) equals the per-client loop; the
    global model moved toward the personal models."""
    runs = {}
    for executor, mode in (("loop", "mask"), ("vmap", "mask"), ("vmap", "gather")):
        algo = make_algorithm("qupel", **KW, cohort_size=2, cohort_mode=mode)
        sim = Simulation(algo, data, mlp, executor=executor, seed=3)
        s0 = sim.init()
        runs[executor, mode] = (s0, sim.run_rounds(s0, 2)[0])
    s0, ref = runs["loop", "mask"]
    for key in (("vmap", "mask"), ("vmap", "gather")):
        assert_trees_close(runs[key][1].clients, ref.clients, rtol=1e-5, atol=1e-6)
        assert_trees_close(runs[key][1].server, ref.server, rtol=1e-5, atol=1e-6)
    w0, w2 = s0.server["params"], ref.server["params"]
    assert float(tree.sq_norm(tree.sub(w0, w2))) > 0


def test_bad_options_and_the_registry():
    with pytest.raises(OptionError, match="^coupling "):
        make_algorithm("qupel", **KW, coupling="q").validate(5)
    with pytest.raises(OptionError, match="^global_lr "):
        make_algorithm("qupel", **KW, global_lr=0.0).validate(5)
    algo = make_algorithm("qupel")
    assert (algo.lam_p, algo.global_lr, algo.coupling, algo.bits) == (0.2, 0.5, "x", 2)


def test_round_wiring_at_toy_size(data, mlp):
    """The CI-sized counterpart of the slow run test: two rounds of QuPeL with 2 of 5 clients sampled, full-batch
    iterations on the epoch clock (one chunk per epoch, so e = 1 + t, and the second round crosses into the
    fine-tuning phase at T_ft = 3), written out around the tested one-iteration pieces: each sampled client runs its
    τ iterations t = round·τ … with η₁ = η₁,₀γ^(e−1) and λ = κe, carrying its own copy w_i of the round's global
    model through lines 10-14; the server's new w is the unweighted mean of the cohort's w_i; the other clients are
    untouched, bit for bit."""
    from reference import batch_of, rows

    kw = {**KW, "batch_size": None, "chunks_per_epoch": 1, "kappa": 0.05, "cohort_size": 2}
    algo = make_algorithm("qupel", **kw)
    sim = Simulation(algo, data, mlp, executor="vmap", seed=3)
    state = sim.init()
    t_ft, tau = algo.finetune_start(data.train.n_max), kw["local_steps"]
    assert t_ft == 3
    for r in range(2):
        new, _ = sim.run_rounds(state, 1)
        take = lambda s, i: jax.tree.map(lambda a: a[i], s)  # noqa: E731
        same = [all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(take(state.clients, i)),
                                                         jax.tree.leaves(take(new.clients, i)))) for i in range(5)]
        cohort = [i for i in range(5) if not same[i]]
        assert len(cohort) == 2
        uploads = []
        for i in cohort:
            st, w = take(state.clients, i), state.server["params"]
            batch = batch_of(*rows(data.train, i))
            for t in range(r * tau, (r + 1) * tau):
                eta1, lam = KW["lr"] * KW["lr_gamma"] ** t, 0.05 * (1 + t)
                step = algo.finetune_step if t >= t_ft else algo.prox_step
                st, students, _ = step(mlp, st, ((w, batch), (w, batch)), eta1, lam, algo.lam_p)
                w, _ = algo.global_step(mlp, mlp, w, None, (w, None), students, batch, eta1, algo.lam_p)
            assert_trees_close(take(new.clients, i), st, rtol=1e-5, atol=1e-6)
            uploads.append(w)
        assert_trees_close(new.server["params"], tree.scale(0.5, tree.add(*uploads)), rtol=1e-5, atol=1e-6)
        state = new
    assert bool(jnp.any(state.clients["switched"]))  # the fine-tuning phase was reached
