"""Ragged client storage (fljax.data.ragged): the layout, the vectorised Synthetic generator and hold-out, and runs
that equal the padded path's for the same seed."""
import jax
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.experiment import default_model


@pytest.fixture(scope="module")
def both():
    """The same 24 Synthetic clients stored padded and ragged."""
    return {s: D.make_federated("synthetic", 24, seed=0, max_samples=60, storage=s) for s in ("padded", "ragged")}


def _leaves_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_ragged_layout_is_the_padded_one_without_padding(both):
    padded, ragged = both["padded"], both["ragged"]
    for split in ("train", "test"):
        p, r = getattr(padded, split), getattr(ragged, split)
        _leaves_equal(r.to_padded(), p)
        assert (r.n_min, r.n_max) == (p.n_min, p.n_max)
        assert r.x.shape[0] == int(np.asarray(p.count).sum()) + p.n_max  # samples + one window of zero rows
        for i in (0, 5, 23):  # one client's window equals its padded rows
            _leaves_equal(r.client_view(r.offset[i], r.count[i]), p.client(i))
    np.testing.assert_array_equal(ragged.train_label_counts(), padded.train_label_counts())


def test_pooled_partitions_store_ragged_too():
    p = D.make_federated("digits", 12, partition="dirichlet", seed=1, alpha=0.3, storage="padded")
    r = D.make_federated("digits", 12, partition="dirichlet", seed=1, alpha=0.3, storage="ragged")
    _leaves_equal(r.train.to_padded(), p.train)
    _leaves_equal(r.test.to_padded(), p.test)


def _synthetic_by_definition(num_clients, alpha, beta, seed, max_samples, dim=60, classes=10):
    """FedProx's Synthetic(α, β) as a loop over clients, one numpy draw after another (LEAF's generator)."""
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.lognormal(4, 2, num_clients).astype(int) + 50, max_samples)
    cov = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    rng.normal(0, 1, (classes, dim)), rng.normal(0, 1, classes)  # the IID setting's shared model
    xs, ys = [], []
    for k in range(num_clients):
        u, big_b = rng.normal(0, alpha), rng.normal(0, beta)
        w, b, v = rng.normal(u, 1, (classes, dim)), rng.normal(u, 1, classes), rng.normal(big_b, 1, dim)
        x = rng.normal(v, np.sqrt(cov), (sizes[k], dim))
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w.T + b, axis=1))
    return xs, ys


@pytest.mark.parametrize("alpha,beta,seed", [(1.0, 1.0, 0), (0.5, 0.0, 3)])
def test_vectorised_synthetic_equals_the_per_client_definition(alpha, beta, seed):
    xs, ys = _synthetic_by_definition(40, alpha, beta, seed, 150)
    nat = D.synthetic(40, alpha, beta, seed, max_samples=150)
    np.testing.assert_array_equal(nat.counts, [len(y) for y in ys])
    np.testing.assert_array_equal(nat.x, np.concatenate(xs))
    np.testing.assert_array_equal(nat.y, np.concatenate(ys))


def test_synthetic_size_options_set_the_power_law():
    nat = D.synthetic(2000, seed=1, max_samples=64, min_samples=11, size_log_mean=1.0, size_log_std=1.0)
    assert nat.counts.min() == 11 and nat.counts.max() == 64 and 13 < nat.counts.mean() < 18


def test_holdout_mask_is_a_stratified_holdout():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 40, 50)
    labels = rng.integers(0, 4, counts.sum())
    test = D.holdout_mask(labels, counts, 0.3, seed=2)
    owner = np.repeat(np.arange(50), counts)
    for i in range(50):
        for c in range(4):
            n = ((owner == i) & (labels == c)).sum()
            want = max(1, int(round(0.3 * n))) if n >= 2 else 0
            assert (test & (owner == i) & (labels == c)).sum() == want
        assert (~test & (owner == i)).any()  # the train split is never empty
    assert not np.array_equal(test, D.holdout_mask(labels, counts, 0.3, seed=3))


def test_ragged_storage_lifts_the_synthetic_client_cap():
    with pytest.raises(OptionError, match="num_clients must be at most 100000"):
        D.DataConfig.from_dict({"dataset": "synthetic", "num_clients": 200_000})
    assert D.DataConfig.from_dict({"dataset": "synthetic", "num_clients": 200_000, "storage": "ragged"}).storage == \
        "ragged"
    with pytest.raises(OptionError, match="storage must be one of"):
        D.DataConfig.from_dict({"dataset": "synthetic", "storage": "flat"})


def _run(data, name, executor, **kw):
    algo = make_algorithm(name, lr=0.05, local_steps=3, batch_size=8, **kw)
    sim = Simulation(algo, data, default_model(data), executor=executor, chunk_size=5, seed=1)
    state, metrics = sim.run_rounds(sim.init(), 2)
    return state, metrics, sim.evaluate(state)


RUNS = [("fedavg", {"cohort_size": 7}), ("fedavg", {"cohort_size": None}), ("ditto", {"cohort_size": 7, "lam": 0.1})]


@pytest.mark.parametrize("executor,name,kw", [(ex, *run) for ex in ("vmap", "loop") for run in RUNS]
                         + [("chunked", *RUNS[0])])
def test_ragged_runs_equal_padded_runs_bit_for_bit(both, executor, name, kw):
    padded = _run(both["padded"], name, executor, **kw)
    ragged = _run(both["ragged"], name, executor, **kw)
    _leaves_equal(ragged, padded)


def test_only_stateful_algorithms_keep_per_client_state(both):
    data = both["ragged"]
    fedavg = Simulation(make_algorithm("fedavg", cohort_size=4), data, default_model(data), seed=0).state_shapes()
    assert tree.nbytes(fedavg.clients) == 0  # FedAvg keeps nothing per client
    ditto = Simulation(make_algorithm("ditto", cohort_size=4), data, default_model(data), seed=0).state_shapes()
    assert {x.shape[0] for x in jax.tree.leaves(ditto.clients)} == {data.num_clients}


def test_client_groups_refuse_ragged_storage(both):
    from fljax.engine.population import ClientGroup

    with pytest.raises(ValueError, match=r"groups need padded client arrays \(data.storage: padded\)"):
        Simulation(make_algorithm("fedavg", cohort_size=4), both["ragged"], default_model(both["ragged"]),
                   groups=[ClientGroup("a", 12), ClientGroup("b", 12)])


def _scale_benchmark():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "scale.py")
    spec = importlib.util.spec_from_file_location("scale_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scale_benchmark_measures_a_small_population(tmp_path):
    scale = _scale_benchmark()
    rows = scale.measure(300, "ragged", [30, 300], repeats=1)
    assert [r["cohort"] for r in rows] == [30, 300] and all(r["client_steps_per_s"] > 0 for r in rows)
    assert "evaluate_seconds" in rows[-1]
    spec = {**scale.QUICK, "targets": ((300, 300, 300, 30),)}
    ratios = scale.targets(rows, spec)
    assert len(ratios) == 1 and ratios[0]["ratio"] > 0
    meta = {"local_steps": 10, "batch_size": 20, "repeats": 1, "cpu_count": 2, "backend": "cpu", "jax": "x",
            "command": "python benchmarks/scale.py"}
    assert "| 300 | 30 | ragged |" in scale.markdown(meta, rows, ratios)
    scale.plot(rows, str(tmp_path / "scale.png"))
    assert (tmp_path / "scale.png").stat().st_size > 0


@pytest.mark.slow
def test_scale_benchmark_quick_mode(tmp_path):
    assert _scale_benchmark().main(["--quick", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"scale_quick.json", "scale_quick.md", "scale_quick.png"}


@pytest.mark.parametrize("n,k", [(50, 7), (1000, 10), (70_000, 3)])
def test_smallest_keys_are_the_k_smallest_by_definition(n, k):
    from fljax.engine.sampling import smallest_keys

    for seed in range(5):
        keys = jax.random.bits(jax.random.PRNGKey(seed), (n,), jax.numpy.uint32)
        want = np.sort(np.argsort(np.asarray(keys), kind="stable")[:k])  # ties: the lower index first
        np.testing.assert_array_equal(smallest_keys(keys, k), want)
    ties = jax.numpy.asarray([5, 3, 3, 3, 1, 9, 3], jax.numpy.uint32)
    np.testing.assert_array_equal(smallest_keys(ties, 3), [1, 2, 4])


def test_large_populations_draw_uniform_cohorts_in_linear_time():
    from fljax.engine import sample_cohort
    from fljax.engine.sampling import PERMUTATION_MAX_CLIENTS

    n = PERMUTATION_MAX_CLIENTS + 1
    draw = jax.jit(lambda key: sample_cohort(key, n, 2000))
    cohorts = np.stack([np.asarray(draw(jax.random.PRNGKey(i))) for i in range(50)])
    assert all(len(np.unique(c)) == 2000 and (np.diff(c) > 0).all() for c in cohorts)
    hits = np.bincount(cohorts.ravel() * 10 // n, minlength=10)  # 10,000 expected per tenth of the ids
    assert hits.min() > 9_500 and hits.max() < 10_500
