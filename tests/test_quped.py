"""QuPeD (Algorithm 2) and quantized Local Training (Algorithm 1): the spec's tests T4-T7 against their definitions
(T1-T3 and T8 test the operators: test_ops_quant.py, test_ops_schedule.py)."""
import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.algorithms.quped import tree_leaf
from fljax.data.batching import Batch
from fljax.engine import Simulation
from fljax.engine.population import ClientGroup
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.ops import quant
from fljax.ops.distill import kl_divergence

from conftest import assert_trees_close

# 5 clients x 2 classes, 12 train / 4 test per (client, class): I = 3 iterations of B = 8 per epoch
KW = dict(batch_size=8, local_steps=2, epochs=4, finetune_epochs=1, lr=0.1, lr_gamma=0.9)


@pytest.fixture(scope="module")
def data():
    return D.make_federated("digits", 5, "class_slots", seed=0, classes_per_client=2, train_per_slot=12,
                            test_per_slot=4, noise=0.5, test_per_class=40)


@pytest.fixture(scope="module")
def mlp(data):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[16, 12])  # the middle kernel is quantized


def _run(algo, data, model, rounds, groups=None, executor="vmap"):
    sim = Simulation(algo, data, model, executor=executor, seed=3, groups=groups)
    state, metrics = sim.run_rounds(sim.init(), rounds)
    return sim, state, metrics


def test_T4_no_distillation_is_local_training_and_w_only_decays(data, mlp):
    """λ_p = 0: every client's (x, c) trajectory is Algorithm 1's (quantized Local Training), and the global model
    moves only through weight decay: w_T = Π_t (1 − η₁(t)·wd) · w_0."""
    rounds = 3
    _, qs, _ = _run(make_algorithm("quped", **KW, lam_p=0.0), data, mlp, rounds)
    sim, ls, _ = _run(make_algorithm("quped_local", **KW), data, mlp, rounds)
    assert_trees_close(qs.clients, ls.clients, rtol=1e-6, atol=1e-7)
    algo = sim.algorithm
    iters = np.arange(rounds * KW["local_steps"])
    eta = KW["lr"] * KW["lr_gamma"] ** (iters // algo.iters_per_epoch(data.train.n_max))
    w0 = Simulation(make_algorithm("quped", **KW), data, mlp, seed=3).init().server["params"]
    expect = tree.scale(float(np.prod(1 - eta * algo.weight_decay)), w0)
    assert_trees_close(qs.server["params"], expect, rtol=1e-5, atol=1e-7)


def test_T4_fedavg_one_step_equal_clients_is_sgd_on_the_union(mlp):
    """FedAvg with τ = 1 (one full-batch step) on equal-size clients is one gradient step on the pooled data."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(6, 8, 8, 1)).astype(np.float32) for _ in range(4)]
    ys = [rng.integers(0, 10, 6).astype(np.int32) for _ in range(4)]
    arr = D.pad_clients(xs, ys)
    fed = D.FederatedData(train=arr, test=arr, num_classes=10, input_shape=(8, 8, 1), name="eq")
    algo = make_algorithm("fedavg", lr=0.3, cohort_size=None, local_steps=1, batch_size=None)
    sim = Simulation(algo, fed, mlp, executor="vmap", seed=0)
    s0 = sim.init()
    s1, _ = sim.run_rounds(s0, 1)
    w = s0.server["params"]
    pooled = Batch(x=jnp.asarray(np.concatenate(xs)), y=jnp.asarray(np.concatenate(ys)), mask=jnp.ones(24, bool))
    expect = tree.axpy(-0.3, jax.grad(mlp.loss)(w, pooled), w)
    assert_trees_close(s1.server["params"], expect, rtol=1e-5, atol=1e-6)


def test_T5_mixed_population_matches_loop_and_sampling_modes_agree(data, mlp):
    """A 2-bit group and an FP group with its own λ_p: the vectorised program equals the per-client loop, and the
    masked and gathered cohorts (D32) agree, unsampled clients untouched."""
    groups = [ClientGroup("q2", 2, mlp), ClientGroup("fp", 3, mlp, hp={"bits": None, "lam_p": 0.15})]
    ref = _run(make_algorithm("quped", **KW, cohort_size=3), data, mlp, 2, groups, "loop")[1]
    for mode in ("gather", "mask"):
        out = _run(make_algorithm("quped", **KW, cohort_size=3, cohort_mode=mode), data, mlp, 2, groups)[1]
        assert_trees_close(out.clients, ref.clients, rtol=1e-5, atol=1e-6)
        assert_trees_close(out.server, ref.server, rtol=1e-5, atol=1e-6)


def test_T6_one_teacher_vjp_equals_the_two_gradients(data, mlp):
    """Line 14: one VJP of the summed cotangent = ∇_w KL(z_w ‖ sg z_x) + ∇_w KL(z_w ‖ sg z_q)."""
    algo = make_algorithm("quped", **KW)
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w, xa, xb = (mlp.init(kk) for kk in k)
    batch = Batch(x=data.train.x[0, :8], y=data.train.y[0, :8], mask=jnp.ones(8, bool))
    zw, vjp_w = jax.vjp(lambda v: mlp.apply(v, batch.x), w)
    got, _ = algo.global_step(mlp, mlp, w, None, (zw, vjp_w), [xa, xb], batch, 0.1, 0.25)
    students = [mlp.apply(xa, batch.x), mlp.apply(xb, batch.x)]
    grads = [jax.grad(lambda v, s=s: kl_divergence(mlp.apply(v, batch.x), s, mask=batch.mask))(w) for s in students]
    g = tree.add(tree.scale(0.25, tree.add(*grads)), tree.scale(algo.weight_decay, w))
    assert_trees_close(got, tree.axpy(-0.1, g, w), rtol=1e-5, atol=1e-7)


def test_T7_finetuning_switch_freezes_indices_on_the_centers(data, mlp):
    """After the switch every quantized leaf takes values in its centers through frozen indices, R = 0 and the
    c-prox is a no-op; FP leaves keep training."""
    algo = make_algorithm("quped", **KW)
    sim = Simulation(algo, data, mlp, executor="vmap", seed=3)
    per_round = KW["local_steps"]
    t_ft = algo.finetune_start(data.train.n_max)
    state = sim.init()
    state, _ = sim.run_rounds(state, t_ft // per_round + 1)  # the switch lies inside this round
    first = state.clients
    state, _ = sim.run_rounds(state, 1)
    later = state.clients
    path = algo.spec(mlp).paths[0]
    for cl in (first, later):
        assert bool(jnp.all(cl["switched"]))
        x, c, idx = tree_leaf(cl["x"], path), cl["c"][path], cl["idx"][path]
        np.testing.assert_array_equal(x, jax.vmap(lambda cc, i: cc[i])(c, idx))
        np.testing.assert_allclose(jax.vmap(quant.R)(x, c), 0.0, atol=1e-6)
    np.testing.assert_array_equal(first["idx"][path], later["idx"][path])  # frozen
    assert not np.allclose(first["c"][path], later["c"][path])  # centers keep training
    assert not np.allclose(first["x"]["Dense_0"]["kernel"], later["x"]["Dense_0"]["kernel"])  # FP leaves too
    c0, x0 = later["c"][path][0], tree_leaf(later["x"], path)[0]
    prox = functools.partial(quant.center_update, c0, jnp.zeros_like(c0), x0, 1e-3, 10.0)
    np.testing.assert_array_equal(prox(prox=True), prox(prox=False))


def test_quantized_model_is_deployed_and_sized(data, mlp):
    """Size accounting (§7) of the deployed 1-bit model, the teacher-health metric, and a positive r-rule κ."""
    algo = make_algorithm("quped", **KW, bits=1)
    sim, state, _ = _run(algo, data, mlp, 1)
    summary, _ = sim.evaluate(state)
    shapes = jax.eval_shape(mlp.init, jax.random.PRNGKey(0))
    mask = tree.map_with_path(lambda p, _: p in algo.spec(mlp).paths, shapes)
    bits, per_param, _ = quant.bits_accounting(shapes, mask, 1)
    np.testing.assert_allclose(summary["bits_per_param"], per_param, rtol=1e-6)
    np.testing.assert_allclose(summary["model_mb"], bits / 8e6, rtol=1e-6)
    assert 0 < float(summary["teacher_max_prob"]) <= 1
    assert bool(jnp.all(state.clients["kappa"] > 0))


@pytest.mark.parametrize("kw,key", [(dict(bits=0), "bits"), (dict(lam_p=1.5), "lam_p"),
                                    (dict(finetune_epochs=4), "finetune_epochs"), (dict(clip_norm=1.0), "clip_norm"),
                                    (dict(center_prox_sign="up"), "center_prox_sign"),
                                    (dict(assign_rule="sign", bits=2), "assign_rule"), (dict(kappa=-1.0), "kappa"),
                                    (dict(local_epochs=1), "local_epochs")])
def test_bad_hyperparameters_are_one_line_errors(kw, key):
    """Bad values are refused by their declaration; an option QuPeD does not take (its steps are proximal SGD on
    the epoch clock: no clip_norm, no local_epochs; Local Training has no λ_p) is refused as an unknown key."""
    with pytest.raises(OptionError, match=f"^{key} "):
        make_algorithm("quped", **{**KW, **kw}).validate(5)
    with pytest.raises(OptionError, match="^lam_p "):
        make_algorithm("quped_local", **KW, lam_p=0.2).validate(5)


def test_config_groups_build_a_mixed_population():
    """configs/quped.yaml with Table 4 (ii)'s groups: a 2-bit CNN1-S half and an FP CNN2-S half (λ_p 0.15, D26)."""
    import os

    from fljax.api import build
    from fljax.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(root, "configs", "quped.yaml"),
                      ['groups=[{"name":"cnn1_2bit","size":5},{"name":"cnn2_fp","size":5,"model":{"name":"cnn2_s"},'
                       '"algo":{"bits":null,"lam_p":0.15}}]'])
    sim = build(cfg)
    a, b = sim.population.groups
    assert (a.model, a.size, b.size, b.model.name, b.overrides) == (None, 5, 5, "cnn2_s", {"bits": None, "lam_p": 0.15})
    assert sim.model.name == "cnn1_s"


def test_fml_joint_step_is_each_models_own_gradient(data, mlp):
    """FML (spec §10): the joint loss's gradient is, for x, ∇[(1 − a)CE(x) + a KL(sg p_w ‖ p_x)] and, for w,
    ∇[(1 − b)CE(w) + b KL(sg p_x ‖ p_w)], both from the pre-update logits; a mixed-width population runs."""
    algo = make_algorithm("fml", a=0.3, b=0.2, lr=0.1, batch_size=8, local_steps=2)
    x, w = (mlp.init(k) for k in jax.random.split(jax.random.PRNGKey(1)))
    batch = Batch(x=data.train.x[0, :8], y=data.train.y[0, :8], mask=jnp.ones(8, bool))
    gx, gw = jax.grad(lambda p: algo.joint_loss(mlp, mlp, p, batch))((x, w))
    zx, zw = mlp.apply(x, batch.x), mlp.apply(w, batch.x)
    ce = lambda v: mlp.loss(v, batch)  # noqa: E731
    ex = jax.grad(lambda v: 0.7 * ce(v) + 0.3 * kl_divergence(zw, mlp.apply(v, batch.x), mask=batch.mask))(x)
    ew = jax.grad(lambda v: 0.8 * ce(v) + 0.2 * kl_divergence(zx, mlp.apply(v, batch.x), mask=batch.mask))(w)
    assert_trees_close((gx, gw), (ex, ew), rtol=1e-5, atol=1e-7)
    wide = make_model("mlp", data.input_shape, data.num_classes, hidden=[24, 12])
    _, state, metrics = _run(algo, data, mlp, 1, [ClientGroup("a", 2, mlp), ClientGroup("b", 3, wide, hp={"a": 0.15})])
    assert np.isfinite(metrics["train_loss"]).all() and state.clients[1]["x"]["Dense_0"]["kernel"].shape[-1] == 24


def _one_client(algo, data, mlp):
    kx, kw = jax.random.split(jax.random.PRNGKey(4))
    state = algo.client_init(mlp, data.train.n_max, mlp.init(kx))
    batch = Batch(x=data.train.x[0, :8], y=data.train.y[0, :8], mask=jnp.ones(8, bool))
    return state, mlp.apply(mlp.init(kw), batch.x), batch


@pytest.mark.parametrize("sharpness", [4.0, 1e6])
def test_D2_finite_sharpness_trains_through_the_soft_quantizer(data, mlp, sharpness):
    """D2's option: lines 10-13 with Qs_c in the Q-terms, i.e. g = ∇f(x) + ∇_x f(Qs_c(x)) on quantized leaves and
    h = ∇_c f(Qs_c(x_new)); a very sharp P gives the P → ∞ step (hard quantizer, zero x-gradient)."""
    algo = make_algorithm("quped", **KW, soft_sharpness=sharpness)
    state, zw, batch = _one_client(algo, data, mlp)
    eta1, lam, lp = 0.1, 3.0, 0.25
    new, _, _ = algo.prox_step(mlp, state, ((zw, batch), (zw, batch)), eta1, lam, lp)
    spec, x, c = algo.spec(mlp), state["x"], state["c"]
    soft = lambda v, cc: tree.map_with_path(  # noqa: E731
        lambda p, a: quant.soft_quantize(a, cc[p], sharpness) if p in spec.paths else a, v)
    loss = lambda v: algo.personal_loss(mlp, v, zw, batch, lp)  # noqa: E731
    gq = jax.grad(lambda v: loss(soft(v, c)))(x)
    g = tree.map_with_path(lambda p, a, b: a + b if p in spec.paths else a, jax.grad(loss)(x), gq)
    y = tree.axpy(-eta1, tree.axpy(algo.weight_decay, x, g), x)
    x1 = tree.map_with_path(lambda p, v: quant.prox_x(v, c[p], lam * eta1 / 2) if p in spec.paths else v, y)
    assert_trees_close(new["x"], x1, rtol=1e-5, atol=1e-7)
    h = jax.grad(lambda cc: loss(soft(x1, cc)))(c)
    for p in spec.paths:
        expect = quant.center_update(c[p], h[p], tree_leaf(x1, p).ravel(), algo.center_lr(mlp), lam)
        np.testing.assert_allclose(new["c"][p], expect, rtol=1e-5, atol=1e-7)
    hard, _, _ = make_algorithm("quped", **KW).prox_step(mlp, state, ((zw, batch), (zw, batch)), eta1, lam, lp)
    assert np.allclose(tree_leaf(new["x"], spec.paths[0]), tree_leaf(hard["x"], spec.paths[0]),
                       atol=1e-7) == (sharpness > 1e3)


def test_D14_fresh_minibatches_are_drawn_per_sub_step():
    """'shared' hands line 10's clock batch to lines 12 and 14; 'fresh' draws two new batches of distinct valid
    rows of the client (masked past a small client's count), new at every iteration."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (9, 5)]
    arr = D.pad_clients(xs, [np.arange(n, dtype=np.int32) for n in (9, 5)])
    small = jax.tree.map(lambda a: a[1], arr)
    clock = Batch(x=small.x[:4], y=small.y[:4], mask=jnp.ones(4, bool))
    shared = make_algorithm("quped", **{**KW, "batch_size": 7}).sub_batches(small, clock, jax.random.PRNGKey(0), 3)
    assert all(b is clock for b in shared)
    fresh = make_algorithm("quped", **{**KW, "batch_size": 7}, minibatches="fresh")
    b10, b12, b14 = fresh.sub_batches(small, clock, jax.random.PRNGKey(0), 3)
    assert b10 is clock
    for b in (b12, b14):
        np.testing.assert_array_equal(b.mask, np.arange(7) < 5)
        assert sorted(np.asarray(b.y)[:5].tolist()) == list(range(5))  # every valid row once, in a random order
    orders = [np.asarray(fresh.sub_batches(small, clock, jax.random.PRNGKey(0), t)[1].y[:5]) for t in range(4)]
    assert len({tuple(o) for o in orders}) > 1


def test_D16_momentum_is_heavy_ball_sgd_with_coupled_weight_decay():
    """v₁ = g₁ + wd·p₀, p₁ = p₀ − ηv₁; v₂ = μv₁ + g₂ + wd·p₁, p₂ = p₁ − ηv₂ (PyTorch SGD); μ = 0 is plain SGD."""
    algo = make_algorithm("quped", **KW, momentum=0.9, weight_decay=0.01)
    p0, g1, g2 = jnp.array([1.0, -2.0]), jnp.array([0.5, 0.1]), jnp.array([-0.3, 0.2])
    p1, v1 = algo.sgd(p0, g1, jnp.zeros(2), 0.1)
    p2, v2 = algo.sgd(p1, g2, v1, 0.1)
    e1 = g1 + 0.01 * p0
    e2 = 0.9 * e1 + g2 + 0.01 * (p0 - 0.1 * e1)
    np.testing.assert_allclose(p2, p0 - 0.1 * e1 - 0.1 * e2, rtol=1e-6)
    np.testing.assert_allclose(v2, e2, rtol=1e-6)
    plain = make_algorithm("quped", **KW, weight_decay=0.01)
    p, buf = plain.sgd(p0, g1, None, 0.1)
    np.testing.assert_allclose(p, p0 - 0.1 * e1, rtol=1e-6)
    assert buf is None


@pytest.mark.slow
def test_D14_D16_options_run(data, mlp):
    """One round with fresh minibatches and one with momentum: finite, different from the default, and momentum's
    buffer lives in the client state."""
    base = _run(make_algorithm("quped", **KW), data, mlp, 1)[1]
    for kw in (dict(minibatches="fresh"), dict(momentum=0.9)):
        _, state, metrics = _run(make_algorithm("quped", **KW, **kw), data, mlp, 1)
        assert np.isfinite(metrics["train_loss"]).all()
        assert float(tree.sq_norm(tree.sub(state.clients["x"], base.clients["x"]))) > 0
        assert ("mom" in state.clients) == ("momentum" in kw)


def _leaf_files(root, writers: int, per_writer: int = 12):
    """A LEAF-format FEMNIST directory: two JSON files, writer k's labels cycling over 0..(letters included)."""
    import json

    rng = np.random.default_rng(0)
    users = [f"f{k:04d}" for k in range(writers)]
    for part, chunk in enumerate((users[: writers // 2], users[writers // 2:])):
        blob = {"users": chunk, "num_samples": [per_writer] * len(chunk),
                "user_data": {u: {"x": rng.uniform(size=(per_writer, 784)).round(3).tolist(),
                                  "y": [(k + j) % 14 for j in range(per_writer)]}
                              for k, u in enumerate(chunk)}}
        with open(os.path.join(root, f"all_data_{part}.json"), "w") as f:
            json.dump(blob, f)


def test_femnist_clients_are_groups_of_writers(tmp_path):
    """femnist (D23): digit samples only, 3 whole writers per client, seed-shuffled, every writer used once;
    femnist62 keeps the letters; one-line errors without files or with too few writers."""
    from fljax.data.leaf import femnist
    from fljax.data import DataError

    _leaf_files(str(tmp_path), 12)
    nat = femnist(str(tmp_path), 4, seed=1)
    assert len(nat.xs) == 4 and nat.num_classes == 10
    assert all(x.shape[1:] == (28, 28, 1) and len(x) == len(y) for x, y in zip(nat.xs, nat.ys))
    assert max(int(y.max()) for y in nat.ys) <= 9
    digits_per_writer = [sum((k + j) % 14 < 10 for j in range(12)) for k in range(6)] * 2  # k restarts per file
    assert sum(len(y) for y in nat.ys) == sum(digits_per_writer)  # every writer once
    assert all(len(y) in {sum(c) for c in itertools.combinations(digits_per_writer, 3)} for y in nat.ys)
    all62 = femnist(str(tmp_path), 4, seed=1, num_classes=62)
    assert sum(len(y) for y in all62.ys) == 144 and max(int(y.max()) for y in all62.ys) == 13
    with pytest.raises(DataError, match="need 15 writers"):
        femnist(str(tmp_path), 5, seed=1)
    with pytest.raises(DataError, match="set data.data_dir"):
        femnist(None, 4, seed=1)
    fed = D.make_federated("femnist", 4, "natural", seed=1, data_dir=str(tmp_path), test_fraction=0.1)
    assert fed.num_classes == 10 and fed.input_shape == (28, 28, 1)


def test_full_scale_femnist_config_validates_without_running():
    """configs/quped_femnist.yaml (Table 2's FEMNIST setting) parses and validates; its CNN1 on 28x28x1 inputs has
    the §7 size (61,706 parameters; 2-bit 2.602 bits/param)."""
    from fljax.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(root, "configs", "quped_femnist.yaml"))
    assert (cfg.algorithm, cfg.data.dataset, cfg.data.num_clients, cfg.data.partition) == ("quped", "femnist", 66,
                                                                                            "natural")
    algo = make_algorithm(cfg.algorithm, **cfg.algo)
    algo.validate(cfg.data.num_clients)
    assert (algo.epochs, algo.finetune_epochs, algo.kappa, algo.lr_center) == (30, 5, 5e-6, 1e-4)
    assert algo.chunks_per_epoch == 60 and algo.iters_per_epoch(336) == 60 and algo.plan().width(336) == 6  # §8
    assert cfg.rounds * algo.local_steps == algo.epochs * algo.iters_per_epoch(336)
    model = make_model(cfg.model.name, (28, 28, 1), 10, **cfg.model.options)
    assert tree.size(jax.eval_shape(model.init, jax.random.PRNGKey(0))) == 61_706
    np.testing.assert_allclose(algo.size(model)[1], 2.602, atol=5e-4)


def test_quantized_training_of_a_model_with_no_middle_layer_is_flagged(tmp_path, capsys):
    """§7 keeps the first and last layers FP: a 2-layer MLP trains at full precision, and the run says so."""
    from fljax.cli import main

    two_layers = make_model("mlp", (64,), 10, hidden=[16])
    three_layers = make_model("mlp", (64,), 10, hidden=[16, 12])
    assert "bits=2 quantizes no layer of model mlp" in make_algorithm("quped", bits=2).model_warning(two_layers)
    assert make_algorithm("quped", bits=2).model_warning(three_layers) is None
    assert make_algorithm("quped", bits=None).model_warning(two_layers) is None  # full precision: nothing to say
    argv = ["run", "--algorithm", "quped", "--dataset", "digits", "--set", "data.num_clients=4",
            "--set", "algo.cohort_size=null", "--set", "rounds=1", "--set", "model.options.hidden=[8]",
            "--out", str(tmp_path / "r"), "--quiet"]
    assert main(argv) == 0
    assert "fljax: warning: quped: algo.bits=2 quantizes no layer of model mlp" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ written out independently
def _np_prox_x(y, c, th):
    """QuPeD App. D.1 eqs. (8)-(11): q the nearest center (ties to the lower), y ∓ th outside [q − th, q + th],
    q inside."""
    q = c[np.argmin(np.abs(y[..., None] - c), axis=-1)]
    return np.where(y >= q + th, y - th, np.where(y <= q - th, y + th, q)).astype(np.float32)


def test_T4_lam_p_zero_is_algorithm_1_written_out(data, mlp):
    """λ_p = 0 against Algorithm 1 written out here (not the client code quped_local shares): full-batch iterations
    on the epoch clock (one chunk per epoch, so e = 1 + t), for every client:
    y = x − η₁(e)(∇CE(x) + wd·x); on the quantized leaf x = prox_x(y; c, λ(e)η₁/2), λ(e) = κe, elsewhere x = y;
    h_j = Σ_{k: a_k = j} ∂CE/∂q_k at q = c[a] (a = the new x's nearest centers), c ← sort(c − η₂h + (λη₂/2)(n_j^> −
    n_j^<)) (D1 'median'). The global model only decays: w_T = Π_t(1 − η₁(t)wd)·w_0."""
    from reference import rows

    kw = dict(batch_size=None, chunks_per_epoch=1, local_steps=2, epochs=6, finetune_epochs=0, lr=0.1, lr_gamma=0.9,
              kappa=0.05, lr_center=0.02, lam_p=0.0)
    rounds = 3
    sim = Simulation(make_algorithm("quped", **kw), data, mlp, executor="vmap", seed=3)
    s0 = sim.init()
    got, _ = sim.run_rounds(s0, rounds)
    algo = sim.algorithm
    path = algo.spec(mlp).paths[0]
    layer = path.split("/")[0]
    wd = algo.weight_decay
    grad = jax.jit(jax.grad(mlp.loss))
    for i in range(data.num_clients):
        x = jax.tree.map(lambda a: np.asarray(a[i]), s0.clients["x"])
        c = np.asarray(s0.clients["c"][path][i])
        batch = Batch(*(jnp.asarray(a) for a in rows(data.train, i)), mask=jnp.ones(int(data.train.count[i]), bool))
        for t in range(rounds * kw["local_steps"]):
            e = 1 + t
            eta1, lam = 0.1 * 0.9 ** (e - 1), 0.05 * e
            g = grad(x, batch)
            y = jax.tree.map(lambda p, d: (p - eta1 * (np.asarray(d) + wd * p)).astype(np.float32), x, g)
            x = {**y, layer: {**y[layer], "kernel": _np_prox_x(y[layer]["kernel"], c, lam * eta1 / 2)}}
            xq = x[layer]["kernel"]
            a = np.argmin(np.abs(xq[..., None] - c), axis=-1)
            gq = np.asarray(grad({**x, layer: {**x[layer], "kernel": c[a].astype(np.float32)}}, batch)[layer]["kernel"])
            h = np.bincount(a.ravel(), weights=gq.ravel(), minlength=len(c))
            above = np.bincount(a.ravel(), weights=(xq > c[a]).ravel(), minlength=len(c))
            below = np.bincount(a.ravel(), weights=(xq < c[a]).ravel(), minlength=len(c))
            c = np.sort(c - 0.02 * h + lam * 0.02 / 2 * (above - below)).astype(np.float32)
        assert_trees_close(jax.tree.map(lambda v: v[i], got.clients["x"]), x, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.clients["c"][path][i], c, rtol=1e-4, atol=1e-6)
    decay = np.prod([1 - 0.1 * 0.9 ** t * wd for t in range(rounds * kw["local_steps"])])
    assert_trees_close(got.server["params"], tree.scale(float(decay), s0.server["params"]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bits", [1, 2, None])
def test_quantized_model_size_is_counted_from_the_layer_shapes(data, mlp, bits):
    """§7's size accounting, from the MLP's shapes counted by hand (64 → 16 → 12 → 10; only the middle kernel,
    16×12, is quantized): a b-bit leaf of d entries costs b·d + 32·2^b bits (indices and an FP32 codebook), every
    other parameter 32 bits; ``bits_per_param`` = total/d and ``model_mb`` = total/8e6, as the run reports them."""
    d_fp = 64 * 16 + 16 + 12 + 12 * 10 + 10        # the first layer, both FP biases, the head
    d_q = 16 * 12
    total = 32 * (d_fp + d_q) if bits is None else 32 * d_fp + bits * d_q + 32 * 2 ** bits
    algo = make_algorithm("quped", **KW, bits=bits)
    sim, state, _ = _run(algo, data, mlp, 1)
    summary, _ = sim.evaluate(state)
    assert algo.size(mlp)[0] == total
    np.testing.assert_allclose(float(summary["bits_per_param"]), total / (d_fp + d_q), rtol=1e-6)
    np.testing.assert_allclose(float(summary["model_mb"]), total / 8e6, rtol=1e-6)
