import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation, sample_cohort
from fljax.engine.evaluation import summarize
from fljax.algorithms.base import TestStats
from fljax.experiment import default_model

from conftest import assert_trees_close

ALGOS = {"fedavg": dict(lr=0.05, cohort_size=6, local_steps=4, batch_size=8),
         "fedprox": dict(lr=0.05, cohort_size=6, local_steps=4, batch_size=8, mu=0.1)}


def _run(data, name, executor, rounds=3, **kw):
    algo = make_algorithm(name, **{**ALGOS[name], **kw})
    sim = Simulation(algo, data, default_model(data), executor=executor, chunk_size=4, seed=1)
    state = sim.init()
    state, metrics = sim.run_rounds(state, rounds)
    summary, _ = sim.evaluate(state)
    return state, metrics, summary


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
@pytest.mark.parametrize("executor", ["vmap", "chunked"])
def test_executors_agree_with_loop(synth20, name, executor):
    ref_state, ref_metrics, ref_summary = _run(synth20, name, "loop")
    state, metrics, summary = _run(synth20, name, executor)
    assert_trees_close(state.server["params"], ref_state.server["params"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["train_loss"], ref_metrics["train_loss"], rtol=1e-5)
    for k in ref_summary:
        np.testing.assert_allclose(summary[k], ref_summary[k], rtol=1e-5, atol=1e-6)


def test_sharded_executor_agrees_with_loop_on_8_devices(tmp_path):
    script = textwrap.dedent("""
        import jax, numpy as np
        assert jax.device_count() == 8, jax.devices()
        import fljax.data as D
        from fljax.algorithms import make_algorithm
        from fljax.engine import Simulation
        from fljax.experiment import default_model
        data = D.make_federated("synthetic", 20, seed=0, max_samples=120)
        for name, kw in [("fedavg", {}), ("fedprox", {"mu": 0.1})]:
            out = {}
            for ex in ("loop", "sharded"):
                algo = make_algorithm(name, lr=0.05, cohort_size=10, local_steps=4, batch_size=8, **kw)
                sim = Simulation(algo, data, default_model(data), executor=ex, seed=1)
                state, m = sim.run_rounds(sim.init(), 3)
                out[ex] = (state.server["params"], m["train_loss"], sim.evaluate(state)[0])
            for a, b in zip(jax.tree.leaves(out["loop"]), jax.tree.leaves(out["sharded"])):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
            assert "sharded(8 devices)" == sim.executor.describe()
        print("SHARDED-OK")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "SHARDED-OK" in out.stdout, out.stderr[-3000:]


def _one_client_data(n=37, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int32)
    arr = D.pad_clients([x], [y])
    return D.FederatedData(train=arr, test=arr, num_classes=3, input_shape=(5,), name="one")


def test_fedavg_one_client_full_batch_is_gradient_descent():
    data = _one_client_data()
    lr, k, rounds = 0.3, 3, 4
    algo = make_algorithm("fedavg", lr=lr, cohort_size=None, batch_size=None, local_steps=k)
    sim = Simulation(algo, data, default_model(data), executor="vmap", seed=0)
    state = sim.init()
    w = state.server["params"]
    state, _ = sim.run_rounds(state, rounds)
    model = sim.model
    batch = D.Batch(x=data.train.x[0], y=data.train.y[0], mask=data.train.mask[0])
    for _ in range(rounds * k):
        w = tree.axpy(-lr, jax.grad(model.loss)(w, batch), w)
    assert_trees_close(state.server["params"], w, rtol=1e-5, atol=1e-6)


def test_fedprox_mu_zero_equals_fedavg(synth20):
    a, ma, _ = _run(synth20, "fedavg", "vmap")
    b, mb, _ = _run(synth20, "fedprox", "vmap", mu=0.0)
    assert_trees_close(a.server["params"], b.server["params"], rtol=1e-6, atol=1e-7)
    c, _, _ = _run(synth20, "fedprox", "vmap", mu=1.0)
    assert not np.allclose(jax.tree.leaves(a.server["params"])[0], jax.tree.leaves(c.server["params"])[0])


def test_same_seed_same_metrics_bit_for_bit(synth20):
    algo = make_algorithm("fedavg", lr=0.05, cohort_size=5, local_steps=3, batch_size=8)
    model = default_model(synth20)
    runs = [Simulation(algo, synth20, model, executor="vmap", seed=s).run(4, eval_every=2, progress=False).history
            for s in (7, 7, 8)]
    strip = lambda h: [{k: v for k, v in r.items() if k != "run_seconds"} for r in h]
    assert strip(runs[0]) == strip(runs[1])
    assert strip(runs[0]) != strip(runs[2])


def test_cohort_sampling():
    key = jax.random.PRNGKey(0)
    c = np.asarray(sample_cohort(key, 50, 10))
    assert len(np.unique(c)) == 10 and c.min() >= 0 and c.max() < 50 and (np.diff(c) > 0).all()
    assert not np.array_equal(c, np.asarray(sample_cohort(jax.random.PRNGKey(1), 50, 10)))
    np.testing.assert_array_equal(sample_cohort(key, 50, None), np.arange(50))
    counts = np.bincount(np.concatenate([np.asarray(sample_cohort(jax.random.PRNGKey(i), 20, 5))
                                         for i in range(400)]), minlength=20)
    assert counts.min() > 60 and counts.max() < 140  # uniform: 100 expected each


def test_local_leaves_unsampled_clients_untouched(synth20):
    algo = make_algorithm("local", lr=0.05, cohort_size=3, local_steps=2, batch_size=8)
    sim = Simulation(algo, synth20, default_model(synth20), executor="vmap", seed=0)
    s0 = sim.init()
    s1, _ = sim.round(s0)
    before, after = s0.clients["params"]["Dense_0"]["kernel"], s1.clients["params"]["Dense_0"]["kernel"]
    changed = np.array([not np.array_equal(before[i], after[i]) for i in range(20)])
    assert changed.sum() == 3
    from fljax.engine.context import SAMPLE
    from fljax.engine.driver import _round_key
    cohort = sample_cohort(jax.random.fold_in(_round_key(s0.key, 0), SAMPLE), 20, 3)
    np.testing.assert_array_equal(np.flatnonzero(changed), np.asarray(cohort))


def test_summaries_match_numpy():
    correct = jnp.array([3., 0., 5., 9., 1.])
    count = jnp.array([4, 0, 10, 10, 2])
    loss = jnp.array([0.5, 9., 1., 0.2, 2.])
    s = summarize(TestStats(correct, count, loss), "x")
    acc = np.array([0.75, 0.5, 0.9, 0.5])
    np.testing.assert_allclose(s["x_acc"], acc.mean(), rtol=1e-6)
    np.testing.assert_allclose(s["x_acc_weighted"], 18 / 26, rtol=1e-6)
    np.testing.assert_allclose(s["x_acc_p10"], np.percentile(acc, 10), rtol=1e-6)
    np.testing.assert_allclose(s["x_loss"], np.mean([0.5, 1., 0.2, 2.]), rtol=1e-6)


def test_fedavg_ft_personalizes(digits10):
    base = dict(lr=0.1, cohort_size=5, local_steps=3, batch_size=10)
    model = default_model(digits10)
    r0 = Simulation(make_algorithm("fedavg_ft", finetune_steps=0, **base), digits10, model, seed=0).run(3,
                                                                                                     progress=False)
    assert r0.final["personal_acc"] == r0.final["global_acc"]
    r5 = Simulation(make_algorithm("fedavg_ft", finetune_steps=5, **base), digits10, model, seed=0).run(3,
                                                                                                     progress=False)
    assert r5.final["global_acc"] == r0.final["global_acc"]
    assert r5.final["personal_acc"] != r5.final["global_acc"]


@pytest.mark.parametrize("kw,msg", [({"cohort_size": 50}, r"cohort_size must be between 1 and num_clients=20 .*, got 50"),
                                    ({"lr": -1.0}, "lr must be > 0"),
                                    ({"weighting": "foo"}, "weighting must be")])
def test_impossible_hyperparameters_are_refused(synth20, kw, msg):
    with pytest.raises(ValueError, match=msg):
        Simulation(make_algorithm("fedavg", **kw), synth20, default_model(synth20))


def test_unknown_algorithm_and_hyperparameter_suggest():
    with pytest.raises(ValueError, match="Did you mean 'fedavg'"):
        make_algorithm("fedavgg")
    with pytest.raises(ValueError, match="mu is not a valid key for algorithm 'fedavg'"):  # an OptionError
        make_algorithm("fedavg", mu=1.0)


def test_nonfinite_training_stops_with_round(synth20):
    from fljax.engine import NonFiniteError
    bad = synth20.replace(train=synth20.train.replace(x=synth20.train.x.at[:, 0, 0].set(jnp.inf)))
    algo = make_algorithm("fedavg", cohort_size=None, local_epochs=1, batch_size=8)
    with pytest.raises(NonFiniteError, match="round 1 produced NaN/Inf"):
        Simulation(algo, bad, default_model(bad)).run(3, eval_every=1, progress=False)


def test_auto_executor_rule():
    from fljax.engine.executors import (CPU_CHUNK_BYTES, ChunkedExecutor, LoopExecutor, ShardedExecutor,
                                        VmapExecutor, choose_executor)

    cpu = dict(backend="cpu", device_count=1, has_conv=False)
    assert isinstance(choose_executor(**{**cpu, "device_count": 8}, cohort=64, per_client_bytes=1e3), ShardedExecutor)
    assert isinstance(choose_executor(**{**cpu, "has_conv": True}, cohort=64, per_client_bytes=1e3), LoopExecutor)
    assert isinstance(choose_executor(**cpu, cohort=10, per_client_bytes=1e3), VmapExecutor)  # fits one chunk
    ex = choose_executor(**cpu, cohort=1000, per_client_bytes=CPU_CHUNK_BYTES / 250)
    assert isinstance(ex, ChunkedExecutor) and ex.chunk_size == 250
    assert choose_executor(**cpu, cohort=1000, per_client_bytes=1e3, chunk_size=7).chunk_size == 7
    assert choose_executor(**cpu, cohort=64, per_client_bytes=1e9).chunk_size == 1  # huge clients: one at a time
    gpu = dict(backend="gpu", device_count=1, has_conv=True)
    # accelerators: vmap whatever the size (each program's memory plan chunks what does not fit the device)
    assert isinstance(choose_executor(**gpu, cohort=1000, per_client_bytes=1e9), VmapExecutor)
    assert choose_executor(**gpu, cohort=1000, per_client_bytes=1e7, chunk_size=400).chunk_size == 400


def test_compiled_programs_are_exposed_with_xla_cost_analysis(synth20):
    """``Simulation.executable`` gives the block program the benchmarks read FLOP and byte counts from."""
    sim = Simulation(make_algorithm("fedavg", cohort_size=None, local_steps=2, batch_size=5), synth20,
                     default_model(synth20), executor="vmap")
    assert sim.executable("block", (2,)) is None  # not compiled yet
    sim.run_rounds(sim.init(), 2)
    cost = sim.executable("block", (2,)).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["flops"] > 0 and cost["bytes accessed"] > 0
    assert sim.executable("block", (3,)) is None


# ------------------------------------------------------------------------------------------ against written-out loops
def _three_clients(seed=0, sizes=(7, 11, 16)):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, 3, n).astype(np.int32) for n in sizes]
    arr = D.pad_clients(xs, ys)
    return D.FederatedData(train=arr, test=arr, num_classes=3, input_shape=(5,), name="three"), xs, ys


def test_fedprox_rounds_equal_the_proximal_gradient_loop_of_eq_2():
    """FedProx (Li et al. 2020, Eq. 2), full batch, full participation, μ > 0: every client runs K steps of
    w ← w − η(∇f_i(w) + μ(w − w_t)) from the round's w_t, and w_{t+1} = Σ_i n_i w_i / Σ_i n_i. Written out here with
    each client's unpadded rows, the proximal gradient by hand."""
    from fljax.models import make_model
    from reference import gd

    data, xs, ys = _three_clients()
    model = make_model("mlp", (5,), 3, hidden=[8])
    lr, mu, k, rounds = 0.2, 0.7, 3, 2
    algo = make_algorithm("fedprox", lr=lr, mu=mu, local_steps=k, cohort_size=None, batch_size=None)
    sim = Simulation(algo, data, model, executor="vmap", seed=0)
    s0 = sim.init()
    got, _ = sim.run_rounds(s0, rounds)
    w = s0.server["params"]
    n = np.array([len(y) for y in ys], np.float64)
    for _ in range(rounds):
        anchor = w
        local = [gd(model, w, x, y, lr, k, extra=lambda p, a=anchor: jax.tree.map(lambda u, v: mu * (u - v), p, a))
                 for x, y in zip(xs, ys)]
        w = jax.tree.map(lambda *leaves: sum(ni * leaf for ni, leaf in zip(n, leaves)) / n.sum(), *local)
    assert_trees_close(got.server["params"], w, rtol=2e-5, atol=1e-6)
    plain = Simulation(make_algorithm("fedavg", lr=lr, local_steps=k, cohort_size=None, batch_size=None), data,
                       model, executor="vmap", seed=0)
    assert not np.allclose(jax.tree.leaves(plain.run_rounds(plain.init(), rounds)[0].server["params"])[0],
                           jax.tree.leaves(w)[0], atol=1e-4)  # μ matters at this size


def test_fedavg_ft_personal_model_is_the_global_model_after_k_local_steps(digits10):
    """FedAvg-FT (AugFL spec §7-§8): client i is scored with the global model after ``finetune_steps`` SGD steps at
    ``finetune_lr`` (default: the client lr) on its own train split, here full batch; the global model is scored
    as it is. Per-client accuracies and the loss summaries are recomputed in NumPy from each client's rows."""
    from fljax.models import make_model
    from reference import gd, rows, scores, summary

    model = make_model("mlp", digits10.input_shape, digits10.num_classes, hidden=[16])
    lr, k = 0.1, 4
    base = dict(lr=lr, finetune_steps=k, cohort_size=5, local_steps=3, batch_size=None)
    sim = Simulation(make_algorithm("fedavg_ft", **base), digits10, model, executor="vmap", seed=0)
    state, _ = sim.run_rounds(sim.init(), 2)
    w = state.server["params"]
    glob = [scores(model, w, *rows(digits10.test, i)) for i in range(digits10.num_clients)]
    for finetune_lr in (None, 0.05):
        algo = make_algorithm("fedavg_ft", **base, finetune_lr=finetune_lr)
        got, per_client = Simulation(algo, digits10, model, executor="vmap", seed=0).evaluate(state)
        personal = [scores(model, gd(model, w, *rows(digits10.train, i), finetune_lr or lr, k),
                           *rows(digits10.test, i)) for i in range(digits10.num_clients)]
        np.testing.assert_allclose(per_client["personal_acc"], [c / n for c, n, _ in personal], atol=1e-6)
        np.testing.assert_allclose(per_client["global_acc"], [c / n for c, n, _ in glob], atol=1e-6)
        for key, value in {**summary(personal, "personal"), **summary(glob, "global")}.items():
            np.testing.assert_allclose(float(got[key]), value, rtol=1e-4, atol=1e-6, err_msg=f"{key} {finetune_lr}")


def test_zero_full_batch_steps_leave_the_model_unchanged(digits10):
    """(bug: BatchPlan(batch_size=None, steps=0) planned None steps, so FedAvg-FT with finetune_steps=0 and a full
    batch failed to trace.) Zero fine-tuning steps score the global model itself."""
    from fljax.data import BatchPlan

    assert BatchPlan(batch_size=None, steps=0).num_steps(7) == 0
    assert BatchPlan(batch_size=None, epochs=0).num_steps(7) == 0
    from fljax.models import make_model

    algo = make_algorithm("fedavg_ft", finetune_steps=0, batch_size=None, local_steps=1, cohort_size=None)
    model = make_model("mlp", digits10.input_shape, digits10.num_classes, hidden=[16])
    sim = Simulation(algo, digits10, model, executor="vmap", seed=0)
    state, _ = sim.run_rounds(sim.init(), 1)
    summary, per_client = sim.evaluate(state)
    np.testing.assert_array_equal(per_client["personal_acc"], per_client["global_acc"])


class _StatedOnly:
    """An algorithm seen through :class:`FederatedAlgorithm`: reading anything the Protocol does not state raises."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        from fljax.engine import FederatedAlgorithm

        stated = set(FederatedAlgorithm.__annotations__) | {n for n in vars(FederatedAlgorithm) if n[0] != "_"}
        if name not in stated:
            raise AttributeError(f"the engine read {name!r}, which FederatedAlgorithm does not state")
        return getattr(self._inner, name)


def test_the_engine_reads_only_what_the_protocol_states(synth20):
    """Every registered algorithm implements the Protocol; the engine runs one (rounds, evaluation, lanes, a
    population of groups) seeing only the Protocol's members: it probes nothing else."""
    from fljax.algorithms import ALGORITHMS
    from fljax.engine import FederatedAlgorithm, Lanes
    from fljax.engine.population import ClientGroup
    from fljax.models import make_model

    assert all(isinstance(make_algorithm(name), FederatedAlgorithm) for name in ALGORITHMS)
    algo = make_algorithm("fedavg", lr=0.05, cohort_size=4, local_steps=2, batch_size=8)
    model = default_model(synth20)
    plain = Simulation(algo, synth20, model, executor="vmap", seed=0).run(2, eval_every=1, progress=False)
    stated = Simulation(_StatedOnly(algo), synth20, model, executor="vmap", seed=0)
    assert stated.run(2, eval_every=1, progress=False).history[-1]["global_acc"] == plain.final["global_acc"]
    Lanes(stated, [0, 1]).run(2, 1, progress=False)
    groups = [ClientGroup("a", 8), ClientGroup("b", 12, make_model("mlp", synth20.input_shape, synth20.num_classes))]
    local = make_algorithm("local", lr=0.05, cohort_size=4, local_steps=2, batch_size=8)
    Simulation(_StatedOnly(local), synth20, model, executor="vmap", groups=groups).run(1, progress=False)


def test_classification_data_needs_a_model_and_the_composition_root_picks_the_default(synth20, digits10):
    """The engine runs the model it is given (no engine → models choice); ``model.name: auto``'s pick lives in
    fljax.experiment."""
    with pytest.raises(ValueError, match="Simulation needs the model its clients run for classification data"):
        Simulation(make_algorithm("fedavg"), synth20)
    assert default_model(synth20).name == "logreg" and default_model(digits10).name == "cnn1"


# ------------------------------------------------------------------------------- one block program, paced progress
def _same(a, b) -> bool:
    """Every leaf of ``a`` and ``b`` equal bit for bit."""
    a, b = jax.device_get((a, b))
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_one_block_program_runs_every_length_up_to_its_capacity_bit_for_bit(synth20):
    """``run_rounds(state, n, capacity=c)`` runs n ≤ c rounds with the one program of capacity c (the rounds an
    argument): n rounds in one call, in several calls of it, or under another capacity give the same state and
    per-round metrics bit for bit (:meth:`Simulation.block_fn`), and one program is compiled for every length."""
    algo = make_algorithm("fedavg", lr=0.05, cohort_size=5, local_steps=3, batch_size=8)
    sim = Simulation(algo, synth20, default_model(synth20), executor="vmap", seed=3)
    start = sim.init()
    whole, metrics = sim.run_rounds(start, 5)
    assert metrics["train_loss"].shape == (5,)
    for capacity, parts in ((5, (2, 3)), (8, (1, 1, 3)), (8, (5,))):
        state, got = start, []
        for n in parts:
            state, m = sim.run_rounds(state, n, capacity=capacity)
            got.append(jax.tree.map(lambda x: np.asarray(x)[:n], m))
        assert _same(state, whole), (capacity, parts)
        assert _same(jax.tree.map(lambda *xs: np.concatenate(xs), *got), metrics), (capacity, parts)
    assert {static for name, static in sim._executables if name == "block"} == {(5,), (8,)}
    with pytest.raises(ValueError, match="between 1 and capacity = 8"):
        sim.run_rounds(start, 9, capacity=8)


def test_the_progress_bar_moves_inside_a_block_and_changes_no_result(synth20, capsys):
    """With a bar, a block of rounds between evaluations runs as several calls of its program, paced to move the bar
    every HEARTBEAT_SECONDS (the first call: one round) with the last round's training loss; the history and state
    are the quiet run's bit for bit."""
    algo = make_algorithm("fedavg", lr=0.05, cohort_size=5, local_steps=3, batch_size=8)
    model = default_model(synth20)
    quiet = Simulation(algo, synth20, model, executor="vmap", seed=7)
    shown = Simulation(algo, synth20, model, executor="vmap", seed=7)
    calls = []
    run_rounds = shown.run_rounds
    shown.run_rounds = lambda state, n, **kw: calls.append(n) or run_rounds(state, n, **kw)
    a = quiet.run(6, eval_every=6, progress=False)
    b = shown.run(6, eval_every=6, progress="bar")
    assert len(calls) >= 2 and calls[0] == 1 and sum(calls) == 6  # the bar moved after the first round
    assert _same(a.state, b.state)
    strip = lambda h: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in h]  # noqa: E731
    assert strip(a.history) == strip(b.history)
    err = capsys.readouterr().err
    assert "bar: 100%" in err and "loss=" in err


def test_a_line_says_which_programs_compile_while_they_do(capsys):
    """``wait_compiling`` shows '<run>: compiling <programs> … N s' while a simulation's programs compile in the
    background, names them as messages do (fljax.engine.driver.PROGRAMS), and leaves nothing behind once they are
    ready; nothing at all when none is compiling."""
    from fljax.engine.loop import wait_compiling

    class Compiling:
        def __init__(self, reports):
            self.reports = reports

        def wait(self, report):
            for names, seconds in self.reports:
                report(names, seconds)

    wait_compiling(Compiling([(["block", "evaluate"], 0.2), (["evaluate"], 3.4)]), "fedavg")
    err = capsys.readouterr().err
    assert "fedavg: compiling rounds, evaluation … 0 s" in err and "fedavg: compiling evaluation … 3 s" in err
    wait_compiling(Compiling([]), "fedavg")
    assert capsys.readouterr().err == ""
