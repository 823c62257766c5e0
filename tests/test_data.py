import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fljax.data as D
from fljax.data import partitioners as P


def _labels(n=600, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


@pytest.mark.parametrize("name,kw", [("iid", {}), ("dirichlet", {"alpha": 0.3}), ("pathological", {"classes_per_client": 2}),
                                     ("power_law", {"sigma": 1.5})])
def test_partitioners_use_every_sample_once_and_are_reproducible(name, kw):
    y = _labels()
    parts = P.partition(name, y, 12, seed=3, **kw)
    allidx = np.concatenate(parts)
    assert len(parts) == 12 and all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(len(y)))
    again = P.partition(name, y, 12, seed=3, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = P.partition(name, y, 12, seed=4, **kw)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(20, 400), clients=st.integers(1, 20), seed=st.integers(0, 1000))
def test_iid_and_power_law_property(n, clients, seed):
    y = _labels(n, 5, seed)
    for parts in (P.iid(y, clients, seed), P.power_law(y, clients, seed)):
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
        assert min(len(p) for p in parts) >= 1


def test_pathological_gives_exactly_c_classes():
    y = _labels(1000)
    for c in (1, 2, 5):
        parts = P.pathological(y, 20, c, seed=0)
        assert all(len(np.unique(y[p])) == c for p in parts)


def test_partitioners_refuse_empty_clients_with_a_clear_message():
    y = _labels(10)
    with pytest.raises(P.PartitionError, match="cannot give each of 50 clients"):
        P.iid(y, 50)
    with pytest.raises(P.PartitionError, match="alpha must be > 0"):
        P.dirichlet(y, 2, 0.0)
    with pytest.raises(P.PartitionError, match="left a client with fewer than"):
        P.dirichlet(_labels(40), 30, 0.001, max_tries=3)
    with pytest.raises(P.PartitionError, match="classes_per_client must be in"):
        P.pathological(y, 2, 11)
    with pytest.raises(P.PartitionError, match="unknown partition 'dirichet'"):
        P.partition("dirichet", y, 2, 0)


def test_per_client_test_split_follows_train_labels():
    fd = D.make_federated("digits", 10, "pathological", seed=1, classes_per_client=2, test_per_client=20)
    tr, te = fd.train_label_counts(), D.label_histogram(fd.test, 10)
    assert np.array_equal(tr > 0, te > 0)
    assert (te.sum(1) == 20).all()


def test_holdout_split_is_stratified_and_keeps_train():
    labels = [np.array([0, 0, 0, 0, 1, 1, 1, 1, 2]), np.array([3])]
    tr, te = D.holdout_split(labels, 0.25, seed=0)
    assert sorted(np.concatenate([tr[0], te[0]]).tolist()) == list(range(9))
    assert set(labels[0][te[0]]) == {0, 1} and len(tr[1]) == 1 and len(te[1]) == 0


def test_padded_layout(synth20):
    tr = synth20.train
    counts = np.asarray(tr.count)
    mask = np.asarray(tr.mask)
    assert (mask.sum(1) == counts).all() and (mask == (np.arange(tr.n_max) < counts[:, None])).all()
    assert tr.n_min == counts.min() and tr.n_max == counts.max()
    assert (np.asarray(tr.x)[~mask] == 0).all()


def test_synthetic_definition():
    nat = D.synthetic(5, 0.0, 0.0, seed=0, max_samples=None)
    assert len(nat.xs) == 5 and nat.xs[0].shape[1] == 60
    assert all(len(x) >= 50 for x in nat.xs)
    capped = D.synthetic(50, 1, 1, seed=0, max_samples=80)
    assert max(len(x) for x in capped.xs) <= 80
    assert all(y.max() < 10 for y in capped.ys)


def test_qot_source_checks():
    a, b = D.qot_arrays()
    assert a.shape == (8992, 1024) and (b == 1).sum() == 741


def test_unknown_dataset_suggests():
    with pytest.raises(D.DataError, match="Did you mean 'digits'"):
        D.load_source("digit", num_clients=2, seed=0)


def _visits(plan, count, n_min, n_max, key=0):
    idx, mask, active = plan.schedule(jax.random.PRNGKey(key), jnp.int32(count), n_min, n_max)
    return np.asarray(idx), np.asarray(mask), np.asarray(active)


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 37), b=st.integers(1, 9), seed=st.integers(0, 99))
def test_an_epoch_visits_every_sample_once(count, b, seed):
    n_max = 40
    idx, mask, active = _visits(D.BatchPlan(batch_size=b, epochs=2), count, 1, n_max, seed)
    per_epoch = -(-n_max // b)
    for e in range(2):
        sel = idx[e * per_epoch:(e + 1) * per_epoch][mask[e * per_epoch:(e + 1) * per_epoch]]
        assert sorted(sel.tolist()) == list(range(count))
    assert active.sum() == 2 * -(-count // b)


def test_epochs_are_reshuffled():
    idx, mask, _ = _visits(D.BatchPlan(batch_size=30, epochs=2), 30, 30, 30)
    assert not np.array_equal(idx[0], idx[1])


def test_stream_steps_cover_epochs_in_order():
    count, b, k = 7, 3, 7  # 21 positions = exactly 3 epochs of 7
    idx, mask, active = _visits(D.BatchPlan(batch_size=b, steps=k), count, 5, 10)
    flat = idx.reshape(-1)
    for e in range(3):
        assert sorted(flat[e * 7:(e + 1) * 7].tolist()) == list(range(7))
    assert mask.all() and active.all()


def test_replacement_sampling_stays_in_range():
    idx, _, _ = _visits(D.BatchPlan(batch_size=50, steps=20, replacement=True), 5, 5, 10)
    assert idx.min() >= 0 and idx.max() <= 4 and len(np.unique(idx)) == 5


def test_tfds_source_with_mock_data(monkeypatch):
    import tensorflow_datasets as tfds

    # mock_data stands in for prepared files; the builder's own check of them (fljax.data.tfds._prepared) is told so
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=60):
        src = D.tfds_source("mnist")
        assert src.x_train.shape == (60, 28, 28, 1) and src.x_train.max() <= 1.0
        fd = D.federate(src, 4, "iid", seed=0, test_per_client=5)
        assert fd.num_clients == 4 and fd.input_shape == (28, 28, 1)
        src = D.tfds_source("cifar10", limit=20)
        assert src.x_train.shape == (20, 32, 32, 3)
        std = D.tfds_source("cifar10", limit=20, standardize=True)      # QuPeD D31: per-channel standardization
        np.testing.assert_allclose(std.x_train.mean(axis=(0, 1, 2)), 0, atol=1e-4)
        np.testing.assert_allclose(std.x_train.std(axis=(0, 1, 2)), 1, atol=1e-4)


@pytest.mark.parametrize("kw", [{"alpha": 0.1}, {"classes_per_client": 2}])
def test_client_centric_sampler_equal_sizes_and_prior(kw):
    y = np.repeat(np.arange(10), 30)  # 30 per class: pools run out, so refills happen
    parts = P.client_centric(y, 20, 25, seed=0, **kw)
    assert all(len(p) == 25 for p in parts)
    if "classes_per_client" in kw:
        assert all(len(np.unique(y[p])) <= 2 for p in parts)
    else:  # Dir(0.1) priors are concentrated: most clients hold few classes
        assert np.median([len(np.unique(y[p])) for p in parts]) <= 4
    again = P.client_centric(y, 20, 25, seed=0, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_client_centric_redraw_avoids_exhausted_classes_until_needed():
    y = np.array([0] * 3 + [1] * 100)
    parts = P.client_centric(y, 1, 50, seed=0, classes_per_client=2, on_exhausted="redraw")
    taken0 = (y[parts[0]] == 0).sum()
    assert taken0 == 3  # class 0 is used up once and then redrawn as class 1, never refilled
    with pytest.raises(P.PartitionError, match="exactly one of alpha"):
        P.client_centric(y, 1, 5, seed=0)


@pytest.mark.parametrize("rounding,expect", [("floor", [6, 3]), ("ceil", [7, 4]), ("largest_remainder", [7, 3])])
def test_test_split_rounding(rounding, expect):
    train = [np.array([0] * 65 + [1] * 35)]
    test_labels = np.repeat([0, 1], 50)
    idx = D.pool_test_split(train, test_labels, 2, per_client=10, seed=0, rounding=rounding)[0]
    assert np.bincount(test_labels[idx], minlength=2).tolist() == expect


def test_epoch_permutations_are_uniform():
    from fljax.data.batching import _epoch_orders

    orders = np.asarray(_epoch_orders(jax.random.PRNGKey(0), jnp.int32(5), 8, 4000))
    assert (np.sort(orders[:, :5], axis=1) == np.arange(5)).all() and (orders[:, 5:] >= 5).all()
    first = np.bincount(orders[:, 0], minlength=5)  # 800 expected per index
    assert first.min() > 700 and first.max() < 900
    pairs = np.bincount(orders[:, 0] * 5 + orders[:, 1], minlength=25).reshape(5, 5)
    off = pairs[~np.eye(5, dtype=bool)]  # 200 expected per ordered pair
    assert off.min() > 140 and off.max() < 260 and np.trace(pairs) == 0


# The data behind the README's and the configs' runs, checked against what their options specify (these replace
# hashes of the arrays, which detected changes but not errors): every sample used once (or at most once with
# samples_per_client), the label distributions the partition names, and per-client test splits that follow each
# client's train labels with the stated rounding.
_SOURCE_KEYS = {"noise", "test_per_class", "max_samples", "synthetic_alpha", "synthetic_beta"}
_CASES = [
    dict(dataset="synthetic", num_clients=20, seed=0, max_samples=120),
    dict(dataset="synthetic", num_clients=12, seed=3, synthetic_alpha=0.5, synthetic_beta=0.0, max_samples=None,
         test_fraction=0.3),
    dict(dataset="digits", num_clients=50, partition="dirichlet", seed=0, alpha=0.3, test_per_client=20),
    dict(dataset="digits", num_clients=10, partition="pathological", seed=1, classes_per_client=2, test_per_client=20),
    dict(dataset="digits", num_clients=15, partition="power_law", seed=2, sigma=1.5, noise=0.5),
    dict(dataset="digits", num_clients=9, partition="iid", seed=4),
    dict(dataset="digits", num_clients=20, partition="client_dirichlet", seed=0, alpha=0.1, samples_per_client=50,
         test_per_client=50, test_rounding="floor"),
    dict(dataset="digits", num_clients=20, partition="client_pathological", seed=5, classes_per_client=2,
         samples_per_client=20, on_exhausted="redraw", noise=0.5, test_per_client=40, test_rounding="ceil"),
    dict(dataset="qot", num_clients=16, partition="iid", seed=0),
    dict(dataset="digits", num_clients=20, partition="client_pathological", seed=0, classes_per_client=2,
         samples_per_client=20, on_exhausted="refill", noise=0.5, test_per_client=40, test_rounding="ceil"),
]
# p·T not a whole number (45 test samples after 50 or 20 train samples): floor, ceil and largest remainder differ
_ROUNDING_CASES = [
    dict(dataset="digits", num_clients=20, partition="client_dirichlet", seed=1, alpha=0.3, samples_per_client=50,
         test_per_client=45, test_rounding="floor"),
    dict(dataset="digits", num_clients=20, partition="client_pathological", seed=2, classes_per_client=2,
         samples_per_client=20, on_exhausted="redraw", test_per_client=45, test_rounding="ceil"),
    dict(dataset="digits", num_clients=20, partition="client_pathological", seed=2, classes_per_client=2,
         samples_per_client=20, on_exhausted="redraw", test_per_client=45),
]
_CASES += _ROUNDING_CASES


def _multiset(x, y):
    """Rows with their labels, as a multiset (Counter) of (bytes, label)."""
    from collections import Counter

    x = np.ascontiguousarray(np.asarray(x, np.float32).reshape(len(y), -1))
    return Counter(zip((r.tobytes() for r in x), np.asarray(y).tolist()))


def _client_sets(arrays):
    """Every client's unpadded (x, y), with padding rows checked to be masked out and counted right."""
    mask, count = np.asarray(arrays.mask), np.asarray(arrays.count)
    np.testing.assert_array_equal(mask.sum(1), count)
    assert all(mask[i, :n].all() for i, n in enumerate(count))  # valid rows first
    return [(np.asarray(arrays.x[i, :n]), np.asarray(arrays.y[i, :n])) for i, n in enumerate(count)]


def _check_test_counts(test_y, train_y, pool_y, classes: int, total: int, rounding: str) -> bool:
    """Per-class test counts ∝ the client's train label histogram (capped at the pool's class sizes), written out:
    ⌊p·T⌋, ⌈p·T⌉, or largest remainder (⌊p·T⌋ or ⌊p·T⌋ + 1, summing to T, the +1s on the largest fractional
    parts; ties may go either way). Returns whether some p·T is not a whole number (the roundings then differ)."""
    train_counts = np.bincount(train_y, minlength=classes)
    raw = train_counts / len(train_y) * total
    cap = np.bincount(pool_y, minlength=classes)
    got = np.bincount(test_y, minlength=classes)
    fractional = bool(np.any(train_counts * total % len(train_y)))  # in integers: p·T = n_c·T/n
    if rounding in ("floor", "ceil"):
        want = np.floor(raw + 1e-9) if rounding == "floor" else np.ceil(raw - 1e-9)
        np.testing.assert_array_equal(got, np.minimum(want.astype(int), cap))
        return fractional
    low = np.floor(raw).astype(int)
    assert np.all(cap >= low + 1) and got.sum() == total  # (never capped in these cases)
    extra = got - low
    assert set(np.unique(extra)) <= {0, 1}, (got, raw)
    frac = raw - low
    if extra.any() and (~extra.astype(bool)).any():
        assert frac[extra == 1].min() >= frac[extra == 0].max() - 1e-9, (got, raw)
    return fractional


@pytest.mark.parametrize("options", _CASES, ids=[f"{o['dataset']}-{o.get('partition')}" for o in _CASES])
def test_federated_splits_are_what_their_options_specify(options):
    data = D.make_federated(**options)
    opts = {k: v for k, v in options.items() if k not in ("dataset", "num_clients", "seed")}
    m = options["num_clients"]
    source = D.load_source(options["dataset"], num_clients=m, seed=options["seed"],
                           **{k: v for k, v in opts.items() if k in _SOURCE_KEYS})
    train, test = _client_sets(data.train), _client_sets(data.test)
    assert len(train) == len(test) == m and all(len(y) > 0 for _, y in train + test)
    if options["dataset"] == "synthetic":  # natural clients: client i's samples, split by a stratified hold-out
        frac = options.get("test_fraction", 0.2)
        for (xs, ys), (xa, ya), (xb, yb) in zip(zip(source.xs, source.ys), train, test):
            assert _multiset(xa, ya) + _multiset(xb, yb) == _multiset(xs, ys)
            n_c = np.bincount(ys, minlength=10)
            want = np.where(n_c >= 2, np.maximum(1, np.round(frac * n_c)), 0)
            np.testing.assert_array_equal(np.bincount(yb, minlength=10), want)
            if options.get("max_samples"):
                assert len(ys) <= options["max_samples"]
        return
    pool_train = _multiset(source.x_train, source.y_train)
    used = sum((_multiset(x, y) for x, y in train), start=type(pool_train)())
    if "samples_per_client" in options:  # equal-size clients; a class's samples are reused only once all are used
        assert all(len(y) == options["samples_per_client"] for _, y in train)
        assert not set(used) - set(pool_train)  # nothing invented
        for c in range(source.num_classes):
            uses = [used[key] // count for key, count in pool_train.items() if key[1] == c]
            assert max(uses) - min(uses) <= 1, (c, sorted(set(uses)))
    else:
        assert used == pool_train  # every sample exactly once
    sizes = np.array([len(y) for _, y in train])
    labels = [np.unique(y) for _, y in train]
    kind = options["partition"]
    if kind == "iid":
        assert sizes.max() - sizes.min() <= 1
    elif kind in ("pathological",):
        assert all(len(u) == options["classes_per_client"] for u in labels)
    elif kind == "client_pathological":
        assert all(1 <= len(u) <= options["classes_per_client"] for u in labels)
        assert np.mean([len(u) == options["classes_per_client"] for u in labels]) >= 0.9
    elif kind in ("dirichlet", "client_dirichlet"):  # label skew: far fewer classes than an iid client of that size
        assert np.median([len(u) for u in labels]) <= 6
    elif kind == "power_law":  # heavy-tailed sizes
        assert sizes.max() >= 4 * np.median(sizes)
    pool_test = _multiset(source.x_test, source.y_test)
    per_client = options.get("test_per_client") or -(-len(source.y_test) // m)
    rounding = options.get("test_rounding", "largest_remainder")
    fractional = []
    for (_, ytr), (xte, yte) in zip(train, test):
        mine = _multiset(xte, yte)
        assert not mine - pool_test  # drawn from the test pool, without replacement within a client
        fractional.append(_check_test_counts(yte, ytr, source.y_test, source.num_classes, per_client, rounding))
    if options in _ROUNDING_CASES:  # most clients' p·T are fractional, so a wrong rounding shows
        assert np.mean(fractional) >= 0.5, fractional


def test_a_config_builds_the_data_of_its_options():
    """A config file's data section builds exactly the data of the same options given to make_federated with the run
    seed (the splits of these configs are checked above: fedavg.yaml is digits-dirichlet, fedslr.yaml
    digits-client_dirichlet, dfedalt.yaml digits-client_pathological with refill)."""
    import os

    from fljax.api import load_data
    from fljax.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("configs/fedavg.yaml", "configs/dfedalt.yaml", "configs/fedslr.yaml"):
        cfg = load_config(os.path.join(root, name))
        values = {k: v for k, v in cfg.data.to_dict().items() if v is not None}
        values.setdefault("seed", cfg.seed)
        built, direct = load_data(cfg), D.make_federated(**values)
        for a, b in zip(jax.tree.leaves((built.train, built.test)), jax.tree.leaves((direct.train, direct.test))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_class_slots_quped_reduced_split():
    """QuPeD spec §12: 10 clients, 4 distinct classes each, every class on 4 clients, 33 train + 10 test per
    (client, class), disjoint slices, reproducible from the seed."""
    kw = dict(noise=0.5, test_per_class=40, classes_per_client=4, train_per_slot=33, test_per_slot=10)
    d = D.make_federated("digits", 10, "class_slots", seed=3, **kw)
    tr, te = d.train_label_counts(), D.label_histogram(d.test, 10)
    assert set(np.unique(tr)) == {0, 33} and ((tr > 0).sum(1) == 4).all() and ((tr > 0).sum(0) == 4).all()
    np.testing.assert_array_equal(te, tr // 33 * 10)
    x = np.asarray(d.train.x).reshape(-1, 64)[np.asarray(d.train.mask).ravel()]
    assert len(np.unique(x, axis=0)) == len(x) == 1320  # disjoint slices (noisy images are all distinct)
    xt = np.asarray(d.test.x).reshape(-1, 64)[np.asarray(d.test.mask).ravel()]
    assert len(np.unique(np.concatenate([x, xt]), axis=0)) == 1320 + 400
    again = D.make_federated("digits", 10, "class_slots", seed=3, **kw)
    np.testing.assert_array_equal(np.asarray(again.train.x), np.asarray(d.train.x))
    other = D.make_federated("digits", 10, "class_slots", seed=4, **kw)
    assert not np.array_equal(other.train_label_counts(), tr)


def test_class_slots_table_for_many_clients_and_errors():
    from fljax.data.partitioners import PartitionError, class_slots

    labels = np.repeat(np.arange(10), 500)
    parts = class_slots(labels, 50, 4, seed=0, per_slot=25)           # CIFAR-10's table: 20 slots per class
    held = np.array([np.bincount(labels[p], minlength=10) for p in parts])
    assert set(np.unique(held)) == {0, 25} and ((held > 0).sum(1) == 4).all() and ((held > 0).sum(0) == 20).all()
    assert len(np.unique(np.concatenate(parts))) == 50 * 4 * 25
    with pytest.raises(PartitionError, match="multiple of the 10 classes"):
        class_slots(labels, 7, 4)
    with pytest.raises(PartitionError, match="lower train_per_slot"):
        class_slots(labels, 50, 4, per_slot=26)


def test_digits_are_scikit_learns_load_digits():
    from sklearn.datasets import load_digits

    from fljax.data.bundled import _digits_table

    ref, table = load_digits(), _digits_table()
    assert np.array_equal(table[:, :64], ref.data) and np.array_equal(table[:, 64], ref.target)
