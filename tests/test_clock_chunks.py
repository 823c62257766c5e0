"""QuPeD §8's ragged batching (``ClockPlan(chunks=K)``, QuPeD's ``chunks_per_epoch``) against its definition: each
epoch permutes a client's n_i valid rows and cuts them into K contiguous chunks of ⌊n_i/K⌋ or ⌈n_i/K⌉ rows, padded
to ⌈N_max/K⌉ with a sample mask."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.data.batching import ClockPlan, chunk_rows
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.models import make_model

from conftest import assert_trees_close

K, N_MAX = 7, 40


def _epochs(count, key, epochs=3):
    """The schedule of ``epochs`` whole epochs (K iterations each) for a client with ``count`` rows."""
    plan = ClockPlan(None, epochs * K, 0, chunks=K)
    idx, mask, active = plan.schedule(key, jnp.int32(count), K, N_MAX)
    assert idx.shape == mask.shape == (epochs * K, plan.width(N_MAX)) and plan.width(N_MAX) == -(-N_MAX // K)
    assert bool(jnp.all(active)) and plan.iters_per_epoch(N_MAX) == K
    return np.asarray(idx).reshape(epochs, K, -1), np.asarray(mask).reshape(epochs, K, -1)


@pytest.mark.parametrize("count", [K, 20, 33, N_MAX])
def test_chunks_partition_each_epoch_into_floor_or_ceil_sizes(count):
    """Sizes ⌊n/K⌋ or ⌈n/K⌉ summing to n; every valid row exactly once per epoch, no padded row; the mask is a
    prefix of each chunk (its size); chunk p is the contiguous slice [⌊pn/K⌋, ⌊(p+1)n/K⌋) of one permutation."""
    idx, mask = _epochs(count, jax.random.PRNGKey(1))
    sizes = mask.sum(-1)
    assert set(np.unique(sizes)) <= {count // K, -(-count // K)} and np.all(sizes.sum(-1) == count)
    np.testing.assert_array_equal(mask, np.arange(mask.shape[-1]) < sizes[..., None])
    for e in range(idx.shape[0]):
        rows = idx[e][mask[e]]  # chunk by chunk, in order: the epoch's permutation
        np.testing.assert_array_equal(np.sort(rows), np.arange(count))
        bounds = np.arange(K + 1) * count // K
        np.testing.assert_array_equal(np.diff(bounds), sizes[e])


def test_epochs_are_new_permutations_reproducible_by_key():
    key = jax.random.PRNGKey(2)
    idx, mask = _epochs(33, key)
    orders = [idx[e][mask[e]] for e in range(3)]
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    np.testing.assert_array_equal(_epochs(33, key)[0], idx)
    assert not np.array_equal(_epochs(33, jax.random.PRNGKey(3))[0], idx)


def test_clock_straddles_rounds():
    """A round starting at iteration t0 takes the same chunks as the whole-run schedule at t0 … t0 + τ − 1."""
    key = jax.random.PRNGKey(4)
    full = ClockPlan(None, 3 * K, 0, chunks=K).schedule(key, jnp.int32(25), K, N_MAX)
    part = ClockPlan(None, 5, jnp.int32(K - 2), chunks=K).schedule(key, jnp.int32(25), K, N_MAX)
    for a, b in zip(part, full):
        np.testing.assert_array_equal(a, b[K - 2:K + 3])


def test_chunk_rows_slices_an_order():
    order = jnp.arange(10)[::-1]
    idx, mask = chunk_rows(order, 9, 2, 4, 3)  # n = 9, K = 4: bounds 0, 2, 4, 6, 9 -> chunk 2 = [4, 6)
    np.testing.assert_array_equal(idx, [5, 4, 0])
    np.testing.assert_array_equal(mask, [True, True, False])


@pytest.fixture(scope="module")
def ragged():
    data = D.make_federated("digits", 4, "dirichlet", seed=0, alpha=0.5, test_per_class=10)
    counts = np.asarray(data.train.count)
    assert counts.min() < counts.max()  # ragged
    return data


def test_quped_chunks_vmap_equals_loop(ragged):
    """QuPeD with chunks_per_epoch runs the same under vmap and the loop executor (mixed client sizes)."""
    model = make_model("mlp", ragged.input_shape, ragged.num_classes, hidden=[16, 12])
    algo = make_algorithm("quped", batch_size=None, chunks_per_epoch=4, local_steps=3, epochs=3, finetune_epochs=1,
                          lr=0.1, lr_gamma=0.9)
    assert algo.iters_per_epoch(int(ragged.train.n_max)) == 4
    runs = {}
    for ex in ("vmap", "loop"):
        sim = Simulation(algo, ragged, model, executor=ex, seed=3)
        runs[ex] = sim.run_rounds(sim.init(), 3)[0]
    assert_trees_close(runs["vmap"].clients, runs["loop"].clients, rtol=1e-5, atol=1e-6)
    assert_trees_close(runs["vmap"].server, runs["loop"].server, rtol=1e-5, atol=1e-6)
    too_many = make_algorithm("quped", batch_size=None, chunks_per_epoch=int(ragged.train.n_min) + 1,
                              local_steps=3, epochs=3, finetune_epochs=1)
    with pytest.raises(OptionError, match="^chunks_per_epoch must be <= the smallest client's train size"):
        sim = Simulation(too_many, ragged, model, executor="vmap", seed=3)
        sim.run_rounds(sim.init(), 1)


@pytest.mark.parametrize("kw,key", [(dict(chunks_per_epoch=6), "chunks_per_epoch"),
                                    (dict(batch_size=None), "chunks_per_epoch"),
                                    (dict(batch_size=None, chunks_per_epoch=0), "chunks_per_epoch"),
                                    (dict(batch_size=None, chunks_per_epoch=6, minibatches="fresh"), "minibatches")])
def test_bad_chunk_options_are_one_line_errors(kw, key):
    with pytest.raises(OptionError, match=f"^{key} "):
        make_algorithm("quped", **kw).validate(5)


def test_quped_losses_are_masked_means():
    """CE and the KD term see only a chunk's masked-in rows: padding the batch with masked rows changes nothing."""
    from fljax.data.batching import Batch

    model = make_model("mlp", (8, 8, 1), 10, hidden=[16])
    algo = make_algorithm("quped", batch_size=None, chunks_per_epoch=4)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(5), 3)
    params, teacher = model.init(k1), model.init(k2)
    x, y = jax.random.normal(k3, (6, 8, 8, 1)), jnp.arange(6)
    full = Batch(x=x, y=y, mask=jnp.arange(6) < 4)
    valid = Batch(x=x[:4], y=y[:4], mask=jnp.ones(4, bool))
    loss = [algo.personal_loss(model, params, model.apply(teacher, b.x), b, 0.25) for b in (full, valid)]
    np.testing.assert_allclose(loss[0], loss[1], rtol=1e-6)
    kd = [algo.kd(model.apply(teacher, b.x), model.apply(params, b.x), b.mask) for b in (full, valid)]
    np.testing.assert_allclose(kd[0], kd[1], rtol=1e-6)


def test_chunk_rows_equals_python_slicing_for_every_count_and_position():
    """Brute force over n, K and the chunk position: chunk p of ``order[:n]`` is the slice [⌊pn/K⌋, ⌊(p+1)n/K⌋),
    left-aligned in ``width`` slots, the rest masked (index 0); the chunks of one epoch cover order[:n] once."""
    order = jnp.arange(50, 0, -1)
    for n in (1, 2, 7, 13):
        for chunks in range(1, n + 1):
            width = -(-n // chunks)
            seen = []
            for pos in range(chunks):
                idx, mask = (np.asarray(a) for a in chunk_rows(order, n, pos, chunks, width))
                want = np.asarray(order)[pos * n // chunks:(pos + 1) * n // chunks]
                np.testing.assert_array_equal(mask, np.arange(width) < len(want))
                np.testing.assert_array_equal(idx[: len(want)], want)
                np.testing.assert_array_equal(idx[len(want):], 0)
                seen += idx[mask].tolist()
            assert sorted(seen) == sorted(np.asarray(order)[:n].tolist())
