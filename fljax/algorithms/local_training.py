"""Local training: the minibatch loop every client runs, and the client-optimizer settings shared by algorithms.

:func:`run_steps` scans a step function over one client's batch schedule (a :class:`fljax.data.BatchPlan`);
inactive steps (past a small client's data in ``epochs`` mode) leave the carry unchanged. :class:`LocalSGD` is a
base of every algorithm whose clients run minibatch SGD: it holds the usual client-side hyperparameters, builds the
optax optimizer for a round, and provides local training (:meth:`LocalSGD.train`) and the personal phase of
partial-personalization methods (:meth:`LocalSGD.personal_phase`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.algorithms.base import Algorithm
from fljax.data.batching import BatchPlan, gather_batch
from fljax.errors import OptionError
from fljax.models.model import current_mode
from fljax.ops.sam import sam_value_and_grad

__all__ = ["run_steps", "train_steps", "sgd_step", "LocalSGD", "OPTIMIZERS"]

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
class LocalSGD(Algorithm):
    """Client optimizer settings.

    The client learning rate at round t is ``lr`` · ``lr_decay``^t. ``optimizer``: 'sgd' (with ``momentum``,
    PyTorch semantics) or 'adam'. ``weight_decay`` is coupled (added to the gradient). ``clip_norm``: clip the
    gradient to this global L2 norm before weight decay and the optimizer (None = no clipping; the DFedAlt spec's
    D17 uses 10). Local work per round: ``local_epochs`` passes over the client's data if set, else
    ``local_steps`` minibatches, of ``batch_size`` samples (None = full batch). ``sampling``: 'shuffle' (epochs) or
    'replacement'. The optimizer state is fresh every round.
    """

    lr: float = 0.1
    lr_decay: float = 1.0
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    batch_size: int | None = 20
    local_epochs: int | None = None
    local_steps: int | None = 10
    sampling: str = "shuffle"

    def validate_local(self):
        if not self.lr > 0:
            raise OptionError("lr", f"must be > 0, got {self.lr}.")
        if not 0 < self.lr_decay <= 1:
            raise OptionError("lr_decay", f"must be in (0, 1], got {self.lr_decay}.")
        if self.optimizer not in OPTIMIZERS:
            raise OptionError("optimizer", f"must be one of {OPTIMIZERS}, got {self.optimizer!r}.")
        if not 0 <= self.momentum < 1:
            raise OptionError("momentum", f"must be in [0, 1), got {self.momentum}.")
        if self.weight_decay < 0:
            raise OptionError("weight_decay", f"must be >= 0, got {self.weight_decay}.")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise OptionError("clip_norm", f"must be > 0 or null (no clipping), got {self.clip_norm}.")
        if self.sampling not in ("shuffle", "replacement"):
            raise OptionError("sampling", f"must be 'shuffle' or 'replacement', got {self.sampling!r}.")
        if self.local_epochs is None and self.local_steps is None:
            raise OptionError("local_steps", "or local_epochs must be set (local_epochs wins when both are set).")
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError("batch_size", f"must be >= 1 or null (full batch), got {self.batch_size}.")
        for key in ("local_epochs", "local_steps"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise OptionError(key, f"must be >= 0, got {getattr(self, key)}.")

    def plan(self) -> BatchPlan:
        epochs = self.local_epochs
        return BatchPlan(batch_size=self.batch_size, epochs=epochs, steps=None if epochs is not None else self.local_steps,
                         replacement=self.sampling == "replacement")

    def lr_at(self, round_):
        return self.lr * jnp.power(jnp.float32(self.lr_decay), round_)

    def client_optimizer(self, lr) -> optax.GradientTransformation:
        """The optax optimizer for one round (``lr`` may be traced): [clip to ``clip_norm``] → [+ weight decay]
        → SGD (momentum) or Adam."""
        parts = [optax.clip_by_global_norm(self.clip_norm)] if self.clip_norm is not None else []
        if self.weight_decay:
            parts.append(optax.add_decayed_weights(self.weight_decay))
        if self.optimizer == "adam":
            parts.append(optax.adam(lr))
        else:
            parts.append(optax.sgd(lr, momentum=self.momentum or None))
        return optax.chain(*parts)

    def sgd_step(self, loss_fn: Callable, opt: optax.GradientTransformation, extra_grad: Callable | None = None,
                 sam_rho: float = 0.0):
        """The step function of :func:`train_steps` (see :func:`sgd_step`)."""
        return sgd_step(loss_fn, opt, extra_grad, sam_rho)

    def train(self, loss_fn: Callable, params, inp, *, key=None, plan: BatchPlan | None = None, lr=None,
              extra_grad: Callable | None = None, sam_rho: float = 0.0):
        """Local training of ``params`` on client ``inp``'s train split with this optimizer at ``lr`` (default: the
        round's ``lr_at(inp.round)``), ``plan`` (default: :meth:`plan`) and ``key`` (default: ``inp.key``);
        returns (new params, mean loss)."""
        opt = self.client_optimizer(self.lr_at(inp.round) if lr is None else lr)
        return train_steps(loss_fn, params, inp, plan or self.plan(), opt, key=key, extra_grad=extra_grad,
                           sam_rho=sam_rho)

    def personal_phase(self, loss_fn: Callable, v, inp, key, *, epochs: int, lr=None, optimizer=None,
                       extra_grad: Callable | None = None, prox: Callable | None = None, sam_rho: float = 0.0):
        """The personal phase of partial-personalization methods — Ditto's v_i, FedSLR's Phase II (Eq. 7),
        DFedAlt's and FedRep's head — as one component: ``epochs`` passes of minibatches of ``batch_size`` over the
        client's data, stepping only the personal variables ``v`` (everything else is frozen inside ``loss_fn``)::

            g = ∇_v loss_fn(v; ξ) [+ extra_grad(v)];   v ← optimizer step;   v ← prox(v, η)

        ``lr`` η is the phase's base rate (default: the client's ``lr``), decayed as ``lr_decay^t``; ``optimizer``
        defaults to the client optimizer at η; ``prox(v, η)`` (e.g. FedSLR's soft threshold, Ditto's decoupled
        pull) follows every step; ``sam_rho`` > 0 takes SAM gradients. Returns (v, mean loss)."""
        rate = self.lr_at(inp.round) if lr is None else lr * jnp.power(jnp.float32(self.lr_decay), inp.round)
        opt = self.client_optimizer(rate) if optimizer is None else optimizer
        plan = BatchPlan(batch_size=self.batch_size, epochs=epochs)
        post = None if prox is None else (lambda p: prox(p, rate))
        return train_steps(loss_fn, v, inp, plan, opt, key=key, extra_grad=extra_grad, post=post, sam_rho=sam_rho)


def sgd_step(loss_fn: Callable, opt: optax.GradientTransformation, extra_grad: Callable | None = None,
             sam_rho: float = 0.0, post: Callable | None = None, model=None):
    """A step function for :func:`run_steps` on carry ``(params, opt_state)``: ``g = ∇loss_fn(params, batch)``
    (+ ``extra_grad(params)``), the optax update, then ``post(params)`` if given (a proximal step). ``sam_rho`` > 0
    takes the gradient at the SAM point params + ρ·g/‖g‖ on the same batch
    (:func:`fljax.ops.sam.sam_value_and_grad`; the logged loss is the unperturbed one, and weight decay applies at
    the unperturbed params); 0 is the plain gradient. ``model`` with BatchNorm or Dropout
    (:attr:`fljax.models.Model.has_mode`): the carry is ``(params, opt_state, variables)`` and ``loss_fn`` runs in
    the model's training mode with the carried variables and the step's key; the variables after the
    (unperturbed) forward pass are carried on, never differentiated nor seen by ``extra_grad`` or ``post``."""
    stateful = model is not None and model.has_mode
    value_and_grad = sam_value_and_grad(
        jax.value_and_grad(model.training(loss_fn) if stateful else loss_fn, has_aux=stateful), sam_rho)

    def step(carry, batch, key):
        params, opt_state, *variables = carry
        if stateful:
            (loss, new_variables), g = value_and_grad(params, batch, variables[0], key)
            variables = [new_variables]
        else:
            loss, g = value_and_grad(params, batch)
        if extra_grad is not None:
            g = tree.add(g, extra_grad(params))
        updates, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params if post is None else post(params), opt_state, *variables), loss

    return step


def train_steps(loss_fn: Callable, params, inp, plan: BatchPlan, opt: optax.GradientTransformation, *, key=None,
                extra_grad: Callable | None = None, post: Callable | None = None, sam_rho: float = 0.0):
    """The one local-training loop: :func:`sgd_step` scanned over ``plan``'s batches of client ``inp``'s train split
    (key ``key``, default ``inp.key``); returns (params, mean loss over active steps). The optimizer state is fresh.
    A model with BatchNorm or Dropout trains from the variables of the :meth:`~fljax.models.Model.mode` it runs in
    (the client's ``batch_stats``) with a dropout key per step (split from ``key``), and leaves the trained
    variables in that mode."""
    mode = current_mode() if inp.model is not None and inp.model.has_mode else None
    step = sgd_step(loss_fn, opt, extra_grad, sam_rho, post, None if mode is None else inp.model)
    carry = (params, opt.init(params)) + (() if mode is None else (mode.variables,))
    (params, _, *variables), loss = run_steps(step, carry, inp.train, plan, inp.key if key is None else key,
                                              inp.unroll)
    if mode is not None:
        mode.variables = variables[0]
    return params, loss
