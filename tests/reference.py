"""Independent references shared by the tests: per-client scores computed in NumPy from a model's logits on the
unpadded rows of each client, and plain-loop SGD steps written out from their definitions. Nothing here calls the
library's training, evaluation or summary code; only a model's forward pass (``model.apply``) and the gradient of
its loss on a client's rows (``jax.grad(model.loss)``, the rows padded with masked ones so that clients of many sizes
share a few compiled shapes), which are the definitions the algorithms build on."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fljax.data import Batch


def rows(arrays, i: int):
    """Client i's unpadded (x, y) of a :class:`~fljax.data.ClientArrays` (a full batch of exactly its rows)."""
    n = int(arrays.count[i])
    return np.asarray(arrays.x[i, :n]), np.asarray(arrays.y[i, :n])


def batch_of(x, y) -> Batch:
    return Batch(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.ones(len(y), bool))


def scores(model, params, x, y) -> tuple[int, int, float]:
    """(correct, count, mean cross-entropy) of ``params`` on the rows (x, y), in float64 NumPy from the logits."""
    if len(y) == 0:
        return 0, 0, 0.0
    z = np.asarray(model.apply(params, jnp.asarray(x)), np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return int(np.sum(np.argmax(z, 1) == y)), len(y), float(-np.mean(logp[np.arange(len(y)), y]))


def summary(stats, prefix: str) -> dict:
    """The papers' summaries of per-client (correct, count, loss): unweighted mean accuracy over the clients with a
    test split, pooled (sample-weighted) accuracy, and the mean and count-weighted loss."""
    stats = [s for s in stats if s[1] > 0]
    correct, count, loss = (np.array([s[k] for s in stats], np.float64) for k in range(3))
    return {f"{prefix}_acc": float(np.mean(correct / count)), f"{prefix}_acc_weighted": correct.sum() / count.sum(),
            f"{prefix}_loss": float(np.mean(loss)), f"{prefix}_loss_weighted": float(np.sum(loss * count) / count.sum())}


_GRADS: dict = {}


def loss_grad(model):
    """``jax.jit(jax.grad(model.loss))``, one per model."""
    if id(model) not in _GRADS:
        _GRADS[id(model)] = (model, jax.jit(jax.grad(model.loss)))
    return _GRADS[id(model)][1]


def padded_batch(x, y, multiple: int = 64) -> Batch:
    """(x, y) as one full batch, padded with masked rows to a multiple of ``multiple`` (so that clients of many
    sizes share a few compiled shapes; the masked rows do not enter the model's loss, a masked mean)."""
    n = len(y)
    pad = -n % multiple
    x = np.concatenate([np.asarray(x), np.zeros((pad,) + np.shape(x)[1:], np.asarray(x).dtype)])
    y = np.concatenate([np.asarray(y), np.zeros(pad, np.asarray(y).dtype)])
    return Batch(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.arange(n + pad) < n)


def gd(model, params, x, y, lr: float, steps: int, extra=None):
    """``steps`` full-batch gradient steps on (x, y): p ← p − lr·(∇f(p) + extra(p))."""
    grad = loss_grad(model)
    b = padded_batch(x, y)
    for _ in range(steps):
        g = grad(params, b)
        if extra is not None:
            g = jax.tree.map(lambda a, e: a + e, g, extra(params))
        params = jax.tree.map(lambda p, a: p - lr * a, params, g)
    return params


def take(tree, i: int):
    """Client i's slice of a client-stacked pytree."""
    return jax.tree.map(lambda a: a[i], tree)
