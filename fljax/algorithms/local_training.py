"""Local training: the minibatch loop every client runs, and the client-training settings as one value.

:func:`run_steps` scans a step function over one client's batch schedule (a :class:`fljax.data.BatchPlan`);
inactive steps (past a small client's data in ``epochs`` mode) leave the carry unchanged.

Settings are composed, not inherited. :class:`LocalTraining` is a frozen value holding the client optimizer
(``lr``, ``lr_decay``, ``optimizer``, ``momentum``, ``weight_decay``, ``clip_norm``) and a round's local work
(``batch_size``, ``local_epochs`` or ``local_steps``, ``sampling``); each option is declared once, here, with its
default, one-line doc and check. The value does the training: :meth:`LocalTraining.train` (a round's local SGD;
:meth:`LocalTraining.train_with_state` for a model with BatchNorm or Dropout, whose variables it carries),
:meth:`LocalTraining.personal_phase` (the personal phase of partial-personalization methods),
:meth:`LocalTraining.plan`, :meth:`LocalTraining.lr_at`, :meth:`LocalTraining.client_optimizer`.

An algorithm holds its local training as a value, a field declared with :func:`local_training` (``local:
LocalTraining = local_training(...)``), and takes exactly the options it honours as flat hyperparameters under their
own names (``algo.lr`` in a config, ``make_algorithm("fedprox", lr=0.1, mu=0.01, local_steps=10)``); an option it
does not take keeps :class:`LocalTraining`'s default there (e.g. APFL's coupled steps are plain SGD: it takes no
``optimizer``, ``momentum`` or ``clip_norm``, so it cannot be given one). Algorithms whose clients run a loop of
their own with other semantics (QuPeD's epoch clock, Per-FedAvg's meta-steps) declare their own options instead.

This follows the settings-as-values designs of pfl-research (``NNTrainHyperParams`` handed to an algorithm), FedJAX
(a ``client_optimizer`` argument) and optax (an optimizer built as a chain of transformations), keeping fljax's flat
keys.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.data.batching import BatchPlan, gather_batch
from fljax.errors import OptionError
from fljax.ops.sam import sam_value_and_grad
from fljax.options import Options, at_least, greater_than, interval, nested, option

__all__ = ["run_steps", "scanned_steps", "train_steps", "train_steps_with_state", "sgd_step", "LocalTraining",
           "local_training"]


def run_steps(step: Callable, carry, train, plan: BatchPlan, key, unroll: int = 1, budget=None):
    """Run ``carry, loss = step(carry, batch, key)`` over the batch schedule of one client.

    ``train`` is one client's :class:`fljax.data.ClientArrays` slice (no client axis). Returns the final carry and
    the mean loss over active steps. ``budget`` (a traced int, None: no limit): only the first ``budget`` active
    steps run, the rest leave the carry unchanged (a straggler's partial work, :class:`fljax.participation.Cohort`).

    When every client runs every scheduled step (``steps`` mode, full batches, or ``epochs`` over clients whose
    sizes give the same number of batches, :meth:`~fljax.data.BatchPlan.every_step_active`) the steps are one
    ``lax.scan``. Otherwise (``epochs`` over clients of different sizes) the schedule is sized by the population's
    largest client, and the steps run as a ``lax.while_loop`` over this client's own active steps, in schedule
    order: n_i = E·⌈n_i/B⌉ steps, each with the batch and key it has in the schedule. Under ``vmap`` a batched while
    loop runs until its last member is done, so a cohort runs as many steps as its largest member needs (not the
    population's largest), the members already done keeping their carry; one client at a time (the ``loop``
    executor, or chunks of one) runs exactly its own. ``unroll`` > 1 runs that many steps per trip, the ones past
    n_i leaving the carry unchanged. Inside :func:`scanned_steps` every schedule runs as the scan (reverse-mode
    differentiation cannot go through the while loop).
    """
    k_sched, k_steps = jax.random.split(key)
    idx, mask, active = plan.schedule(k_sched, train.count, train.n_min, train.n_max)
    if budget is not None:
        active = active & (jnp.cumsum(active.astype(jnp.int32)) <= budget)
    k = idx.shape[0]
    keys = jax.random.split(k_steps, k)
    unroll = max(1, min(int(unroll), k)) if k else 1
    if k == 0 or plan.every_step_active(train.n_min, train.n_max) or _SCANNED.get():
        def body(c, inputs):
            i, m, a, kk = inputs
            new_c, loss = step(c, gather_batch(train.x, train.y, i, m), kk)
            return tree.where(a, new_c, c), (loss, a)

        carry, (losses, act) = jax.lax.scan(body, carry, (idx, mask, active, keys), unroll=unroll)
        act = act.astype(jnp.float32)
        return carry, jnp.sum(losses * act) / jnp.maximum(jnp.sum(act), 1.0)
    return _bounded_steps(step, carry, train, idx, mask, active, keys, unroll)


_SCANNED = contextvars.ContextVar("fljax_scanned_steps", default=False)


@contextlib.contextmanager
def scanned_steps():
    """Trace :func:`run_steps` inside as the scan over the whole schedule also where clients of different sizes
    would run a while loop over their own active steps (``epochs`` mode): the same steps in the same order, the
    inactive ones leaving the carry unchanged, so the same values, but differentiable in reverse mode (JAX cannot
    transpose a while loop whose trip count is a traced value). :mod:`fljax.hypergrad` traces its programs here."""
    token = _SCANNED.set(True)
    try:
        yield
    finally:
        _SCANNED.reset(token)


def _f32_loss(out):
    carry, loss = out
    return carry, jnp.asarray(loss, jnp.float32)


def _bounded_steps(step: Callable, carry, train, idx, mask, active, keys, unroll: int):
    """:func:`run_steps` over the active steps only: a while loop of ⌈n_i/unroll⌉ trips of ``unroll`` steps; trip t
    runs the active steps t·unroll … t·unroll + unroll − 1 (those past n_i leave the carry unchanged). Step losses are
    kept at their schedule positions, so the mean loss is the scan's expression."""
    k = idx.shape[0]
    n_active = jnp.sum(active.astype(jnp.int32))
    order = jnp.argsort(~active, stable=True)  # the active steps first, in schedule order
    losses0 = jnp.zeros((k,), jnp.float32)

    def trip(state):
        t, c, losses = state
        for r in range(unroll):
            j = t * unroll + r
            s = order[jnp.minimum(j, k - 1)]
            batch = gather_batch(train.x, train.y, idx[s], mask[s])
            if unroll == 1:  # the trip count already stops at n_i
                c, loss = step(c, batch, keys[s])
            else:  # one client at a time, a step past n_i is skipped; under vmap it is computed and discarded
                c, loss = jax.lax.cond(j < n_active, lambda c_, b_, k_: _f32_loss(step(c_, b_, k_)),
                                       lambda c_, b_, k_: (c_, jnp.float32(0)), c, batch, keys[s])
            losses = losses.at[s].set(jnp.where(j < n_active, jnp.asarray(loss, jnp.float32), losses[s]))
        return t + 1, c, losses

    trips = (n_active + unroll - 1) // unroll
    _, carry, losses = jax.lax.while_loop(lambda state: state[0] < trips, trip, (jnp.int32(0), carry, losses0))
    act = active.astype(jnp.float32)
    return carry, jnp.sum(losses * act) / jnp.maximum(jnp.sum(act), 1.0)


@dataclasses.dataclass(frozen=True)
class LocalTraining(Options):
    """A client's local training in one round: the optimizer (fresh every round) and the local work. The client
    learning rate at round t is lr · lr_decay^t; a step is [clip to ``clip_norm``] → [+ ``weight_decay``·w] →
    SGD with ``momentum`` (PyTorch semantics) or Adam."""

    lr: float = option(0.1, "client learning rate η (at round t: lr · lr_decay^t)", greater_than(0))
    lr_decay: float = option(1.0, "per-round decay factor of the client learning rate, in (0, 1] (1: constant)",
                             interval(0, 1, "(]"))
    optimizer: Literal["sgd", "adam"] = option("sgd", "client optimizer: 'sgd' (with momentum) or 'adam'")
    momentum: float = option(0.0, "SGD momentum, in [0, 1) (PyTorch semantics; the buffer starts at zero every "
                                  "round)", interval(0, 1, "[)"))
    weight_decay: float = option(0.0, "coupled L2 weight decay wd: wd·w is added to every local gradient",
                                 at_least(0))
    clip_norm: float | None = option(None, "clip every local gradient to this global L2 norm, before weight decay "
                                           "(null: no clipping)", greater_than(0))
    batch_size: int | None = option(20, "samples per local minibatch (null: the client's whole train split)",
                                    at_least(1))
    local_epochs: int | None = option(None, "local passes over the client's train split per round (null: "
                                            "local_steps)", at_least(0))
    local_steps: int | None = option(10, "local minibatch steps per round when local_epochs is null",
                                     at_least(0))
    sampling: Literal["shuffle", "replacement", "poisson"] = option(
        "shuffle", "minibatches from a shuffle of the client's data ('shuffle'), drawn with 'replacement', or "
                   "'poisson' (each sample in a step with probability batch_size/n_i: DP-SGD's batches)")

    def check(self) -> None:
        if self.local_epochs is None and self.local_steps is None:
            raise OptionError("local_steps", "or local_epochs must be set (local_epochs wins when both are set).")
        if self.sampling == "poisson" and (self.local_epochs is not None or self.batch_size is None):
            raise OptionError("sampling", "'poisson' draws local_steps batches of expected size batch_size: set "
                                          "local_epochs: null and a batch_size.")

    def plan(self) -> BatchPlan:
        epochs = self.local_epochs
        return BatchPlan(batch_size=self.batch_size, epochs=epochs, steps=None if epochs is not None else self.local_steps,
                         replacement=self.sampling == "replacement", poisson=self.sampling == "poisson")

    def steps_taken(self, inp):
        """The local steps client ``inp`` takes in a round of :meth:`train`: its plan's active steps, capped by its
        budget ``inp.steps`` (a straggler's partial work)."""
        steps = jnp.asarray(self.plan().active_steps(inp.train.count, inp.train.n_max), jnp.int32)
        return steps if inp.steps is None else jnp.minimum(steps, inp.steps)

    def lr_at(self, round_):
        """The client learning rate of round ``round_`` (may be traced): lr · lr_decay^t."""
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
        round's ``lr_at(inp.round)``), ``plan`` (default: :meth:`plan`, the round's local work, of which the client
        completes its budget ``inp.steps``) and ``key`` (default: ``inp.key``); returns (new params, mean loss)."""
        opt = self.client_optimizer(self.lr_at(inp.round) if lr is None else lr)
        return train_steps(loss_fn, params, inp, plan or self.plan(), opt, key=key, extra_grad=extra_grad,
                           sam_rho=sam_rho, budget=inp.steps if plan is None else None)

    def train_with_state(self, loss_fn: Callable, params, inp, *, key=None, plan: BatchPlan | None = None,
                         lr=None, extra_grad: Callable | None = None, sam_rho: float = 0.0):
        """:meth:`train` for a loss of the model-state form ``loss_fn(params, batch, variables, key) -> (loss,
        variables)`` (:func:`train_steps_with_state`: a model with BatchNorm or Dropout trains from
        ``inp.variables``); returns (new params, trained variables, mean loss)."""
        opt = self.client_optimizer(self.lr_at(inp.round) if lr is None else lr)
        return train_steps_with_state(loss_fn, params, inp, plan or self.plan(), opt, key=key,
                                      extra_grad=extra_grad, sam_rho=sam_rho,
                                      budget=inp.steps if plan is None else None)

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


def local_training(*takes: str, **defaults) -> dataclasses.Field:
    """The declaration of an algorithm's local training, a field holding its :class:`LocalTraining` value::

        local: LocalTraining = local_training()                        # every option, LocalTraining's defaults
        local: LocalTraining = local_training(lr=0.1, momentum=0.9)    # every option, these defaults
        local: LocalTraining = local_training("lr", "batch_size", "local_epochs", "local_steps", lr=0.005)

    The algorithm takes the options ``takes`` (none named: all ten) as flat hyperparameters under their own names
    (``algo.lr``, ``make_algorithm("apfl", lr=0.05)``), with ``defaults`` in place of :class:`LocalTraining`'s; an
    option it does not take keeps :class:`LocalTraining`'s default, and giving it is refused in one line naming the
    key (:func:`fljax.options.nested`)."""
    return nested(LocalTraining, takes or None, "the client's local training (LocalTraining)", **defaults)


def sgd_step(loss_fn: Callable, opt: optax.GradientTransformation, extra_grad: Callable | None = None,
             sam_rho: float = 0.0, post: Callable | None = None, model=None, private=None):
    """A step function for :func:`run_steps` on carry ``(params, opt_state)``: ``g = ∇loss_fn(params, batch)``
    (+ ``extra_grad(params)``), the optax update, then ``post(params)`` if given (a proximal step). ``sam_rho`` > 0
    takes the gradient at the SAM point params + ρ·g/‖g‖ on the same batch
    (:func:`fljax.ops.sam.sam_value_and_grad`; the logged loss is the unperturbed one, and weight decay applies at
    the unperturbed params); 0 is the plain gradient.

    ``model`` with BatchNorm or Dropout (:attr:`fljax.models.Model.has_mode`): ``loss_fn`` has the model-state
    form ``loss_fn(params, batch, variables, key) -> (loss, variables)`` (:meth:`fljax.models.Model.train_loss`),
    the carry is ``(params, opt_state, variables)``, and a step evaluates ``loss_fn`` with the carried variables
    and the dropout key ``fold_in(k, 0)`` of its key k, carrying on the variables of the (unperturbed) forward
    pass: never differentiated (the aux output of ``value_and_grad``) nor seen by ``extra_grad`` or ``post``.

    ``private`` (a :class:`fljax.privacy.ExamplePrivacy`: example-level DP): g is DP-SGD's gradient of ``loss_fn``
    (Abadi et al. 2016, Alg. 1), the per-example gradients clipped, summed, noised with the step's key and divided
    by the expected batch size; ``extra_grad`` (a data-independent term: SCAFFOLD's correction, FedDyn's
    regulariser) is added after. Not with SAM (its ascent direction is the batch gradient) nor a model with BatchNorm
    or Dropout (statistics and masks across examples)."""
    if private is not None:
        if sam_rho or (model is not None and model.has_mode):
            raise ValueError("DP-SGD steps take neither SAM nor a model with BatchNorm or Dropout.")
        private_grad = private.value_and_grad(loss_fn)

        def private_step(carry, batch, key):
            params, opt_state = carry
            loss, g = private_grad(params, batch, key)
            if extra_grad is not None:
                g = tree.add(g, extra_grad(params))
            updates, opt_state = opt.update(g, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params if post is None else post(params), opt_state), loss

        return private_step
    stateful = model is not None and model.has_mode
    value_and_grad = sam_value_and_grad(jax.value_and_grad(loss_fn, has_aux=stateful), sam_rho)

    def step(carry, batch, key):
        params, opt_state, *variables = carry
        if stateful:
            (loss, new_variables), g = value_and_grad(params, batch, variables[0], jax.random.fold_in(key, 0))
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
                extra_grad: Callable | None = None, post: Callable | None = None, sam_rho: float = 0.0,
                budget=None):
    """The one local-training loop: :func:`sgd_step` scanned over ``plan``'s batches of client ``inp``'s train split
    (key ``key``, default ``inp.key``); returns (params, mean loss over active steps). The optimizer state is fresh.
    ``loss_fn(params, batch)`` applies a model without BatchNorm or Dropout (one with them trains through
    :func:`train_steps_with_state`). Under example-level privacy (``inp.privacy``) every step is a DP-SGD step
    (:func:`sgd_step`). ``budget``: the active steps the client completes (:func:`run_steps`; None: all)."""
    step = sgd_step(loss_fn, opt, extra_grad, sam_rho, post, None, inp.privacy)
    (params, _), loss = run_steps(step, (params, opt.init(params)), inp.train, plan,
                                  inp.key if key is None else key, inp.unroll, budget)
    return params, loss


def train_steps_with_state(loss_fn: Callable, params, inp, plan: BatchPlan, opt: optax.GradientTransformation, *,
                           key=None, extra_grad: Callable | None = None, post: Callable | None = None,
                           sam_rho: float = 0.0, budget=None):
    """:func:`train_steps` for a loss of the model-state form ``loss_fn(params, batch, variables, key) -> (loss,
    variables)`` (e.g. :meth:`fljax.models.Model.train_loss`). With a model that has BatchNorm or Dropout the loop
    carries its variables, from ``inp.variables`` (the client's ``batch_stats``), beside the parameters, with a
    dropout key per step (split from ``key``), as Flax's ImageNet example carries ``batch_stats`` in its train
    state; with any other model the loss is evaluated as ``loss_fn(params, batch, None, None)[0]``. Returns
    (params, the trained variables (None without BatchNorm or Dropout), mean loss)."""
    if inp.model is None or not inp.model.has_mode:
        params, loss = train_steps(lambda p, b: loss_fn(p, b, None, None)[0], params, inp, plan, opt, key=key,
                                   extra_grad=extra_grad, post=post, sam_rho=sam_rho, budget=budget)
        return params, None, loss
    step = sgd_step(loss_fn, opt, extra_grad, sam_rho, post, inp.model)
    (params, _, variables), loss = run_steps(step, (params, opt.init(params), inp.variables), inp.train, plan,
                                             inp.key if key is None else key, inp.unroll, budget)
    return params, variables, loss
