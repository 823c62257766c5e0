"""fljax.tree, the pytree arithmetic every algorithm is written in, against NumPy on the flattened leaves."""
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree


def _pair(seed=0, clients=None):
    rng = np.random.default_rng(seed)
    lead = () if clients is None else (clients,)
    make = lambda: {"w": rng.normal(size=lead + (3, 2)).astype(np.float32),  # noqa: E731
                    "b": [rng.normal(size=lead + (4,)).astype(np.float32), rng.normal(size=lead).astype(np.float32)]}
    return jax.tree.map(jnp.asarray, make()), jax.tree.map(jnp.asarray, make())


def _flat(t):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]


def _close(got, want):
    for g, w in zip(_flat(got), _flat(want) if not isinstance(want, list) else want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_vector_space_operations_are_leafwise():
    a, b = _pair()
    fa, fb = _flat(a), _flat(b)
    _close(tree.add(a, b), [x + y for x, y in zip(fa, fb)])
    _close(tree.sub(a, b), [x - y for x, y in zip(fa, fb)])
    _close(tree.mul(a, b), [x * y for x, y in zip(fa, fb)])
    _close(tree.scale(-0.5, a), [-0.5 * x for x in fa])
    _close(tree.axpy(0.3, a, b), [0.3 * x + y for x, y in zip(fa, fb)])
    _close(tree.lerp(0.25, a, b), [x + 0.25 * (y - x) for x, y in zip(fa, fb)])
    np.testing.assert_allclose(float(tree.vdot(a, b)), sum(np.sum(x * y) for x, y in zip(fa, fb)), rtol=1e-5)
    np.testing.assert_allclose(float(tree.sq_norm(a)), sum(np.sum(x * x) for x in fa), rtol=1e-5)
    np.testing.assert_allclose(float(tree.norm(a)), np.sqrt(sum(np.sum(x * x) for x in fa)), rtol=1e-5)
    assert tree.size(a) == 6 + 4 + 1 and tree.nbytes(a) == 4 * 11
    assert jax.tree.structure(tree.add(a, b)) == jax.tree.structure(a)
    assert bool(tree.all_finite(a)) and not bool(tree.all_finite(tree.scale(jnp.inf, a)))


def test_client_axis_reductions_and_scatter_gather():
    a, _ = _pair(1, clients=5)
    w = np.array([0.0, 2.0, 1.0, 0.0, 3.0])
    fa = _flat(a)
    _close(tree.weighted_mean_clients(a, w), [np.tensordot(w / w.sum(), x, axes=(0, 0)) for x in fa])
    _close(tree.weighted_mean_clients(a, np.zeros(5)), [np.zeros(x.shape[1:]) for x in fa])  # no NaN
    _close(tree.masked_mean_clients(a, w > 0), [x[w > 0].mean(0) for x in fa])
    _close(tree.mean_clients(a), [x.mean(0) for x in fa])
    _close(tree.sum_clients(a), [x.sum(0) for x in fa])
    idx = jnp.array([4, 1])
    _close(tree.take_clients(a, idx), [x[[4, 1]] for x in fa])
    put = tree.put_clients(a, idx, tree.take_clients(tree.scale(10.0, a), idx))
    for got, x in zip(_flat(put), fa):
        want = x.copy()
        want[[4, 1]] *= 10
        np.testing.assert_allclose(got, want, rtol=1e-6)
    one = jax.tree.map(lambda x: x[0], a)
    _close(tree.broadcast_clients(one, 3), [np.broadcast_to(x[0], (3,) + x.shape[1:]) for x in fa])
    _close(tree.stack(tree.unstack(a)), fa)
    assert tree.num_clients(a) == 5


def test_where_paths_and_ravel():
    a, b = _pair(2)
    _close(tree.where(True, a, b), a)
    _close(tree.where(jnp.bool_(False), a, b), b)
    assert tree.paths(a) == ["b/0", "b/1", "w"]
    named = tree.map_with_path(lambda p, x: jnp.full_like(x, len(p)), a)
    _close(named, [np.full(x.shape, len(p)) for p, x in zip(tree.paths(a), _flat(a))])
    vec, unravel = tree.ravel(a)
    np.testing.assert_allclose(np.asarray(vec), np.concatenate([x.ravel() for x in _flat(a)]), rtol=1e-6)
    _close(unravel(vec), a)
