"""Central training on arrays the server holds: how the server's pretrained model is made (AugFL spec §4).

:func:`pretrain` minimises the masked mean cross-entropy of a :class:`~fljax.models.Model` on ``(x, y)`` with optax
Adam, ``epochs`` passes of minibatches of ``batch_size`` (reshuffled every epoch, the last batch of an epoch
partial and masked), one jitted step per minibatch. :func:`accuracy` and :func:`features` score and embed arrays in
chunks (bounded memory). Everything is deterministic given the key.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fljax.data.batching import Batch

__all__ = ["pretrain", "accuracy", "features", "logits"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(model, opt, params, opt_state, batch):
    loss, grads = jax.value_and_grad(model.loss)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def pretrain(model, x, y, key, *, epochs: int, lr: float = 1e-3, batch_size: int = 128):
    """Parameters of ``model`` trained from its initialisation (``fold_in(key, 0)``) by Adam(``lr``) on ``(x, y)``
    for ``epochs`` epochs of minibatches of ``batch_size``; returns ``(params, losses)`` (the mean loss of every
    epoch)."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    n = int(y.shape[0])
    b = min(batch_size, n)
    per_epoch = math.ceil(n / b)
    params = model.init(jax.random.fold_in(key, 0))
    opt = optax.adam(lr)
    opt_state = opt.init(params)
    losses = []
    for e in range(epochs):
        order = np.asarray(jax.random.permutation(jax.random.fold_in(key, e + 1), n))
        order = np.concatenate([order, np.zeros(per_epoch * b - n, order.dtype)])
        mask = np.arange(per_epoch * b) < n
        total = 0.0
        for s in range(per_epoch):
            idx, m = order[s * b:(s + 1) * b], mask[s * b:(s + 1) * b]
            params, opt_state, loss = _step(model, opt, params, opt_state, Batch(x[idx], y[idx], jnp.asarray(m)))
            total += float(loss) * m.sum()
        losses.append(total / n)
    return params, losses


@functools.partial(jax.jit, static_argnums=(0, 3))
def _chunk(model, params, x, what: str):
    return model.features(params, x) if what == "features" else model.apply(params, x)


def _map_chunks(model, params, x, what: str, chunk: int = 512):
    return jnp.concatenate([_chunk(model, params, x[i:i + chunk], what) for i in range(0, x.shape[0], chunk)])


def features(model, params, x, chunk: int = 512):
    """The penultimate features (the input of the ``head`` layer) of ``x``, in chunks of ``chunk`` rows."""
    return _map_chunks(model, params, x, "features", chunk)


def logits(model, params, x, chunk: int = 512):
    """The logits of ``x``, in chunks of ``chunk`` rows."""
    return _map_chunks(model, params, x, "logits", chunk)


def accuracy(model, params, x, y, mask=None, chunk: int = 512) -> float:
    """Accuracy of ``model`` on the rows of ``(x, y)`` where ``mask`` holds (all when None); x may carry leading
    axes (e.g. clients × rows)."""
    lead = y.shape
    z = logits(model, params, jnp.reshape(x, (-1,) + tuple(x.shape[len(lead):])), chunk)
    hit = (jnp.argmax(z, -1) == jnp.reshape(y, (-1,)))
    m = jnp.ones_like(hit) if mask is None else jnp.reshape(mask, (-1,))
    return float(jnp.sum(hit & m) / jnp.maximum(jnp.sum(m), 1))
