"""Local training: the minibatch loop every client runs, and the client-optimizer settings shared by algorithms.

:func:`run_steps` scans a step function over one client's batch schedule (a :class:`fljax.data.BatchPlan`);
inactive steps (past a small client's data in ``epochs`` mode) leave the carry unchanged. :class:`LocalSGD` is a
mixin holding the usual client-side hyperparameters and building the optax optimizer for a round.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.data.batching import BatchPlan, gather_batch

__all__ = ["run_steps", "LocalSGD", "OPTIMIZERS"]

OPTIMIZERS = ("sgd", "adam")


def run_steps(step: Callable, carry, train, plan: BatchPlan, key, unroll: int = 1):
    """Run ``carry, loss = step(carry, batch, key)`` over the batch schedule of one client.

    ``train`` is one client's :class:`fljax.data.ClientArrays` slice (no client axis). Returns the final carry and
    the mean loss over active steps.
    """
    k_sched, k_steps = jax.random.split(key)
    idx, mask, active = plan.schedule(k_sched, train.count, train.n_min, train.n_max)
    keys = jax.random.split(k_steps, idx.shape[0])

    def body(c, inputs):
        i, m, a, k = inputs
        new_c, loss = step(c, gather_batch(train.x, train.y, i, m), k)
        return tree.where(a, new_c, c), (loss, a)

    unroll = max(1, min(int(unroll), idx.shape[0])) if idx.shape[0] else 1
    carry, (losses, act) = jax.lax.scan(body, carry, (idx, mask, active, keys), unroll=unroll)
    act = act.astype(jnp.float32)
    return carry, jnp.sum(losses * act) / jnp.maximum(jnp.sum(act), 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalSGD:
    """Client optimizer settings.

    ``lr`` at round t is ``lr · lr_decay^t``. ``optimizer``: 'sgd' (with ``momentum``, PyTorch semantics) or 'adam'.
    ``weight_decay`` is coupled (added to the gradient). Local work per round: ``local_epochs`` passes over the
    client's data if set, else ``local_steps`` minibatches, of ``batch_size`` samples
    (None = full batch). ``sampling``: 'shuffle' (epochs) or 'replacement'. The optimizer state is fresh every
    round.
    """

    lr: float = 0.1
    lr_decay: float = 1.0
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int | None = 20
    local_epochs: int | None = None
    local_steps: int | None = 10
    sampling: str = "shuffle"

    def validate_local(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}.")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {self.lr_decay}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}.")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}.")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}.")
        if self.sampling not in ("shuffle", "replacement"):
            raise ValueError(f"sampling must be 'shuffle' or 'replacement', got {self.sampling!r}.")
        if self.local_epochs is None and self.local_steps is None:
            raise ValueError("set local_epochs or local_steps (local_epochs wins when both are set).")
        self.plan()

    def plan(self) -> BatchPlan:
        epochs = self.local_epochs
        return BatchPlan(batch_size=self.batch_size, epochs=epochs, steps=None if epochs is not None else self.local_steps,
                         replacement=self.sampling == "replacement")

    def steps_per_round(self, n_max: int) -> int:
        """Local SGD steps a sampled client runs per round (for throughput accounting)."""
        return self.plan().num_steps(n_max)

    def lr_at(self, round_):
        return self.lr * jnp.power(jnp.float32(self.lr_decay), round_)

    def client_optimizer(self, lr) -> optax.GradientTransformation:
        """The optax optimizer for one round (``lr`` may be traced)."""
        parts = [optax.add_decayed_weights(self.weight_decay)] if self.weight_decay else []
        if self.optimizer == "adam":
            parts.append(optax.adam(lr))
        else:
            parts.append(optax.sgd(lr, momentum=self.momentum or None))
        return optax.chain(*parts)

    def sgd_step(self, loss_fn: Callable, opt: optax.GradientTransformation, extra_grad: Callable | None = None):
        """A step function for :func:`run_steps` on carry ``(params, opt_state)``: ``g = ∇loss_fn(params, batch)``
        (+ ``extra_grad(params)``), then the optax update."""

        def step(carry, batch, key):
            params, opt_state = carry
            loss, g = jax.value_and_grad(loss_fn)(params, batch)
            if extra_grad is not None:
                g = tree.add(g, extra_grad(params))
            updates, opt_state = opt.update(g, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        return step

    def train(self, loss_fn: Callable, params, train, key, round_, unroll: int = 1,
              extra_grad: Callable | None = None, plan: BatchPlan | None = None):
        """Local training from ``params`` with this optimizer: returns (new params, mean loss)."""
        opt = self.client_optimizer(self.lr_at(round_))
        step = self.sgd_step(loss_fn, opt, extra_grad)
        (params, _), loss = run_steps(step, (params, opt.init(params)), train, plan or self.plan(), key, unroll)
        return params, loss
