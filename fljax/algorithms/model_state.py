"""BatchNorm statistics and Dropout in federated training: where a model's non-parameter variables live.

A module with BatchNorm keeps running statistics s (Flax's ``batch_stats``: per-channel mean and variance) beside
its parameters w; one with Dropout draws masks while training. Only w is differentiated, averaged, personalized
and passed through proximal operators, quantizers or thresholds; s travels beside it:

* s is an explicit value, as in Flax's ImageNet example (``apply_fn(variables, x, mutable=["batch_stats"])``, the
  statistics in the train state): :func:`client_fn` hands a client its s as ``ClientInput.variables``; its local
  training (:func:`fljax.algorithms.local_training.train_steps_with_state`) carries s beside the parameters and
  the optimizer state, every step in the model's training mode (:meth:`fljax.models.Model.train_loss`):
  normalise with the batch's statistics and move s toward them (s ← m·s + (1 − m)·batch statistics); Dropout
  masks come from the step's key, split from the client's TRAIN key ``fold_in(fold_in(round key, TRAIN), client
  id)``: no two clients or steps share one; the update returns its trained s in ``ClientResult.variables``;
* evaluation runs in evaluation mode (:meth:`fljax.models.Model.apply` with s): running statistics, no dropout
  (deterministic).

Where s lives is the ``batch_stats`` hyperparameter of the algorithms that offer both (:class:`BatchStatsOption`), and
``local`` for those that communicate no model (Local):

* ``averaged``: the server holds one s_t, broadcast with w_t; client i trains from s_t and uploads its s_i; the
  server sets s_{t+1} = Σ_{i∈S_t} p_i s_i with the parameters' aggregation weights p_i (what averaging a whole
  PyTorch ``state_dict`` does). Every evaluation uses s_t.
* ``local``: client i keeps its own s_i (FedBN, Li et al. ICLR 2021): it trains from and stores back s_i; nothing
  is communicated, and every evaluation on client i (global and personalized models) uses s_i.

In the pytrees the algorithm's own state is wrapped as :class:`WithStats` (``averaged``: the server and what it
broadcasts, and the uploads; ``local``: the per-client state); a Dropout-only model wraps nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Literal

import flax.struct

from fljax import tree
from fljax.options import option

__all__ = ["WithStats", "TrainsModelState", "BatchStatsOption", "unwrap", "init", "attach", "client_fn", "aggregate"]


@flax.struct.dataclass
class WithStats:
    """An algorithm's own pytree ``state`` with the model's ``batch_stats`` beside it."""

    state: Any
    batch_stats: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainsModelState:
    """Base of the algorithms whose clients train a model with BatchNorm or Dropout (their local training through
    :func:`fljax.algorithms.local_training.train_steps_with_state`, returning the trained variables in
    ``ClientResult.variables``). Where a BatchNorm model's statistics live is
    :meth:`stats_policy`: 'local' here (each client keeps its own); :class:`BatchStatsOption` lets the user choose."""

    trains_model_state: ClassVar[bool] = True

    def stats_policy(self) -> str:
        return "local"

    def init_population(self, ctx):
        server, clients = super().init_population(ctx)
        if ctx.model is None or not ctx.model.has_mode:
            return server, clients
        return init(ctx.model, self.stats_policy(), self.init_key(ctx), server, clients, ctx.num_clients)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchStatsOption(TrainsModelState):
    """:class:`TrainsModelState` with the ``batch_stats`` option: 'averaged' (the server averages the clients'
    statistics with the parameters' weights) or 'local' (FedBN)."""

    batch_stats: Literal["averaged", "local"] = option(
        "averaged", "where a BatchNorm model's statistics live: 'averaged' by the server with the parameters' "
                    "weights, or 'local' to each client (FedBN)")

    def stats_policy(self) -> str:
        return self.batch_stats


def unwrap(x):
    """The algorithm's own pytree of ``x`` (``x`` itself unless it is :class:`WithStats`)."""
    return x.state if isinstance(x, WithStats) else x


def init(model, policy: str, key, server, clients, num_clients: int):
    """(server, clients) with the model's initial ``batch_stats`` placed by ``policy``: the server's (averaged) or
    one copy per client (local); unchanged for a model without them."""
    variables = model.init_variables(key)
    if not variables:
        return server, clients
    if policy == "local":
        return server, WithStats(clients, tree.broadcast_clients(variables, num_clients))
    return WithStats(server, variables), clients


def attach(server, down):
    """What the server sends: ``down`` with the server's statistics beside it (averaged), else ``down``."""
    return WithStats(down, server.batch_stats) if isinstance(server, WithStats) else down


def client_fn(model, fn: Callable, train: bool) -> Callable:
    """``fn(inp)`` (a client update or evaluation) given the client's model variables explicitly, as
    ``inp.variables``: from ``inp.down`` (averaged), ``inp.state`` (local) or none (``{}``: a Dropout-only model);
    ``fn`` sees its own pytrees. A training update (``train``) returns the variables it trained in
    ``ClientResult.variables`` (None: unchanged), which are moved into its upload (averaged) or state (local).
    ``fn`` itself for a model without BatchNorm or Dropout."""
    if model is None or not model.has_mode:
        return fn

    def run(inp):
        down, state = inp.down, inp.state
        variables = (down.batch_stats if isinstance(down, WithStats) else
                     state.batch_stats if isinstance(state, WithStats) else {})
        out = fn(inp.replace(down=unwrap(down), state=unwrap(state), variables=variables))
        if not train:
            return out
        trained = variables if out.variables is None else out.variables
        out = out.replace(variables=None)
        if isinstance(state, WithStats):
            return out.replace(state=WithStats(out.state, trained))
        if isinstance(down, WithStats):
            return out.replace(upload=WithStats(out.upload, trained))
        return out

    return run


def aggregate(old, server, result, weights):
    """The algorithm's new ``server`` with, under the averaged policy (``old`` server wrapped), the statistics
    s = Σ_i p_i s_i of the uploads (``weights`` p_i: the parameters' aggregation weights, zero for unsampled
    entries)."""
    if not isinstance(old, WithStats):
        return server
    return WithStats(server, tree.weighted_mean_clients(result.upload.batch_stats, weights))
