"""Representative operators give the same results under ``jax.vmap`` over a leading client axis as a Python loop
over clients, and the same under ``jax.jit`` as eagerly."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import tree as T
from fljax.ops import admm, distill, gossip, meta, partition, prox, quant, sam

C = 4


def rnd(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def client_params(seed=0):
    return {"conv": {"kernel": rnd(seed, C, 3, 3, 2, 4)}, "dense": {"kernel": rnd(seed + 1, C, 6, 3),
                                                                   "bias": rnd(seed + 2, C, 3)}}


def loss(params, batch):
    x, y = batch
    h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
    return jnp.mean((h - y) ** 2) + 0.01 * jnp.sum(params["conv"]["kernel"] ** 2)


def client_batches(seed=10, n=5):
    return rnd(seed, C, n, 6), rnd(seed + 1, C, n, 3)


def nuclear_l1(p, step):
    return prox.per_leaf([("conv", prox.Nuclear(0.5)), ("dense/kernel", prox.L1(0.3))])(p, step)


def sam_grad(p, b):
    return sam.sam_value_and_grad(jax.value_and_grad(loss), 0.1, mask="dense")(p, b)


def meta_fd(p, s, q):
    return meta.meta_grad(loss, p, s, q, 0.1, mode="fd", delta=1e-3)


def meta_exact(p, s, q):
    return meta.meta_grad(loss, p, s, q, 0.1, mode="exact")


def quant_step(x, c):
    y = quant.prox_x(x, c, 0.05)
    return y, quant.center_update(c, jnp.zeros_like(c), y, 0.1, 0.2)


def rank_traced(x, k):
    return prox.rank_mask(jnp.abs(x), k)


def kl(t, s):
    return distill.kl_divergence(t, s, 2.0)


def cases():
    params = client_params()
    s, q = client_batches(10), client_batches(20)
    theta = jax.tree.map(lambda x: x[0], params)
    centers = jnp.sort(rnd(30, C, 4), axis=-1)
    return {
        "prox": (nuclear_l1, (params, 0.7), (0, None)),
        "sam": (sam_grad, (params, s), (0, 0)),
        "meta_fd": (meta_fd, (params, s, q), (0, 0, 0)),
        "meta_exact": (meta_exact, (params, s, q), (0, 0, 0)),
        "quant": (quant_step, (rnd(31, C, 20), centers), (0, 0)),
        "rank_mask": (rank_traced, (rnd(32, C, 12), jnp.array([0, 3, 5, 12])), (0, 0)),
        "kl": (kl, (rnd(33, C, 5, 3), rnd(34, C, 5, 3)), (0, 0)),
        "linearised_prox": (lambda th, y, g: admm.linearised_prox(th, y, g, 0.3, 0.7), (theta, params, params),
                            (None, 0, 0)),
        "dual_ascent": (lambda y, xi, x: admm.dual_ascent(y, xi, x, 0.7), (params, params, theta), (0, 0, None)),
        "augmented_lagrangian_grad": (lambda w, w_t, g: admm.augmented_lagrangian_grad(w, w_t, g, sigma=0.1,
                                                                                        dual_sign=-1),
                                      (params, theta, params), (0, None, 0)),
        "split_merge": (lambda p: partition.merge(*partition.split(p, partition.mask_from_paths(p, "conv"))),
                        (params,), (0,)),
    }


def loop(fn, args, in_axes):
    outs = [fn(*[a if ax is None else jax.tree.map(lambda v: v[i], a) for a, ax in zip(args, in_axes)])
            for i in range(C)]
    return T.stack(outs)


def assert_close(a, b, tol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


@pytest.mark.parametrize("name", list(cases()))
def test_vmap_equals_loop_and_jit_equals_eager(name):
    fn, args, in_axes = cases()[name]
    looped = loop(fn, args, in_axes)
    vmapped = jax.vmap(fn, in_axes=in_axes)(*args)
    assert_close(vmapped, looped, 2e-5)
    jitted = jax.jit(jax.vmap(fn, in_axes=in_axes))(*args)
    assert_close(jitted, vmapped, 2e-5)


def test_gossip_vmapped_over_trials():
    """Client-axis operators vmap over an outer trial axis (one W per trial)."""
    trials = 3
    keys = jax.random.split(jax.random.PRNGKey(0), trials)
    topo = gossip.RandomK(6, 2)
    xs = rnd(40, trials, 6, 5)

    def one(key, x):
        mix = topo.sample(key)
        return gossip.gossip(mix, x), gossip.gossip_gather(mix.idx, mix.wts, x), gossip.consensus_distance(x)

    out = jax.jit(jax.vmap(one))(keys, xs)
    ref = T.stack([one(k, x) for k, x in zip(keys, xs)])
    assert_close(out, ref, 1e-5)
    assert_close(out[0], out[1], 1e-5)


def test_traced_hyperparameters_do_not_recompile():
    params = jax.tree.map(lambda x: x[0], client_params())
    f = jax.jit(lambda p, step: prox.Nuclear(0.5)(p, step))
    for step in (0.1, 0.2, 0.3):
        f(params, step)
    assert f._cache_size() == 1
