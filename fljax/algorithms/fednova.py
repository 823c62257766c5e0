"""FedNova (Wang et al., NeurIPS 2020): normalized averaging, which removes FedAvg's objective inconsistency when
clients do different amounts of local work.

Round t, every client i of the cohort from w_t (heterogeneity spec, "FedNova"):
    τ_i local steps (its plan's active steps, or fewer: a straggler's budget) of SGD with momentum ρ:
        Δ_i = w_i − w_t,   ‖a_i‖₁ = τ_i (ρ = 0), [τ_i − ρ(1 − ρ^{τ_i})/(1 − ρ)]/(1 − ρ)   (fljax.ops.heterogeneity)
    upload (d_i = Δ_i/‖a_i‖₁, τ_i)
Server, with p_i the aggregation weights normalised over the cohort (n_i, or uniform):
    w_{t+1} = w_t + η_g · τ_eff · Σ_i p_i d_i,   τ_eff = Σ_i p_i τ_i
With equal τ_i and ρ = 0 this is FedAvg (w_t + Σ p_i Δ_i at η_g = 1). On quadratics f_i(x) = ½‖x − e_i‖² with local
GD of step η, Δ_i = c_i (e_i − x), c_i = 1 − (1 − η)^{τ_i}: FedAvg's fixed point is Σ p_i c_i e_i / Σ p_i c_i, biased
toward the clients that do more steps; FedNova's is Σ p_i (c_i/τ_i) e_i / Σ p_i (c_i/τ_i), with c_i/τ_i = η + O(η²τ_i)
nearly equal over clients, so it sits close to the optimum Σ p_i e_i.

Local training takes no weight decay and no Adam (‖a_i‖₁ is that of momentum SGD); clipping changes the gradients,
not a_i.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.families import GLOBAL_MODEL
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.ops.heterogeneity import local_steps_norm
from fljax.options import greater_than, option

__all__ = ["FedNova"]


@register("fednova", family=GLOBAL_MODEL, example="configs/fednova.yaml",
          summary="FedNova: normalized averaging of heterogeneous local work (Wang et al. 2020)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedNova(Centralized):
    """The server reads each client's normalised update and its step count (not only an aggregate of models):
    robust aggregators, client-level privacy and compression do not apply; example-level DP-SGD does."""

    private_steps = True
    local: LocalTraining = local_training("lr", "lr_decay", "momentum", "clip_norm", "batch_size", "local_epochs",
                                          "local_steps", "sampling")
    server_lr: float = option(1.0, "global step size η_g: w ← w + η_g·τ_eff·Σ p_i Δ_i/‖a_i‖₁", greater_than(0))

    def init(self, ctx):
        return {"params": ctx.model.init(self.init_key(ctx))}, {}

    def client_update(self, inp: ClientInput) -> ClientResult:
        local = self.local
        params, loss = local.train(inp.model.loss, inp.down, inp)
        steps = local.steps_taken(inp)
        norm = local_steps_norm(steps, local.momentum)
        direction = tree.scale(1.0 / jnp.maximum(norm, 1.0), tree.sub(params, inp.down))  # τ_i = 0: Δ_i = 0
        return ClientResult(state=inp.state, upload=(direction, steps.astype(norm.dtype)), weight=inp.train.count,
                            metrics={"train_loss": loss, "local_steps": steps.astype(norm.dtype)})

    def server_update(self, ctx, server, clients, cohort, result):
        direction, steps = result.upload
        weights = self.aggregation_weights(result)
        tau_eff = tree.weighted_mean_clients(steps, weights)
        step = tree.weighted_mean_clients(direction, weights)
        return {"params": tree.axpy(self.server_lr * tau_eff, step, server["params"])}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared
