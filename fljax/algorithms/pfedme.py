"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalized models θ_i regularised by Moreau envelopes.

Client i solves min_w F_i(w) = min_θ f_i(θ) + (λ/2)‖θ − w‖². Selected client i, round t (Algorithm 1; QuPeD
spec §10): w_i ← w_t, θ_i ← w_t; for each of the R local iterations (one minibatch D each):
    K steps   θ ← θ − η_p(∇f_i(θ; D) + λ(θ − w_i) + wd·θ)      (θ̃_i(w_i) ≈ argmin_θ f_i(θ; D) + (λ/2)‖θ − w_i‖²)
    w_i ← w_i − η·λ(w_i − θ)
Server: w_{t+1} = (1 − β) w_t + β·mean_{S_t} w_i. Client i is evaluated with its personalized θ_i from its last
participation (w_0 if never sampled; ``eval_mode='stored'``), or (``'refresh'``) with the θ of one local round
run from w_T at evaluation (QuPeD's protocol).

Defaults are the pFedMe paper's MNIST settings: η = ``lr`` = 0.005, η_p = ``personal_lr`` = 0.1, λ = 15, K = 5,
β = 1, B = 20, R = ``local_steps`` = 20. η (not η_p) follows ``lr_decay``.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_REGULARISED
from fljax.algorithms.local_training import LocalTraining, local_training, run_steps
from fljax.algorithms.registry import register
from fljax.ops import admm
from fljax.options import at_least, greater_than, option

__all__ = ["PFedMe"]


@register("pfedme", family=PERSONAL_REGULARISED, example="configs/pfedme.yaml",
          summary="pFedMe: personalized models via Moreau envelopes, K inner prox steps per batch (Dinh et al. 2020)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class PFedMe(Aggregating):
    """Its steps are plain SGD (η on w_i, η_p on θ): pFedMe takes no client optimizer, momentum or clipping."""

    local: LocalTraining = local_training("lr", "lr_decay", "weight_decay", "batch_size", "local_epochs", "local_steps",
                                          "sampling", lr=0.005, local_steps=20)
    lam: float = option(15.0, "λ of the Moreau envelope (λ/2)‖θ − w‖² pulling the personal θ_i towards the local w_i",
                        greater_than(0))
    personal_lr: float = option(0.1, "step size η_p of the K inner steps on the personal θ", greater_than(0))
    inner_steps: int = option(5, "K: inner steps approximating θ̃_i(w_i) per minibatch", at_least(1))
    beta: float = option(1.0, "server mixing β: w_{t+1} = (1 − β) w_t + β·mean w_i (1: plain mean)",
                         greater_than(0))
    eval_mode: Literal["stored", "refresh"] = option(
        "stored", "'stored' (θ_i of the last participation) or 'refresh' (θ of one local round from w_T at "
                  "evaluation)")

    def steps_per_round(self, n_max: int) -> int:
        return super().steps_per_round(n_max) * self.inner_steps

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        return {"params": params}, {"theta": tree.broadcast_clients(params, ctx.num_clients)}

    def local_round(self, w_t, inp: ClientInput, round_):
        """R local iterations from w_i = θ = w_t; returns (w_i, θ, mean loss)."""
        eta = self.local.lr_at(round_)
        model = inp.model

        def inner(theta, w, batch):
            def body(_, th):
                g = jax.grad(model.loss)(th, batch)
                pull = tree.axpy(self.local.weight_decay, th, admm.augmented_lagrangian_grad(th, w, sigma=self.lam))
                return tree.axpy(-self.personal_lr, tree.add(g, pull), th)

            return jax.lax.fori_loop(0, self.inner_steps, body, theta, unroll=inp.unroll > 1)

        def step(carry, batch, k):
            w, theta = carry
            theta = inner(theta, w, batch)
            loss = model.loss(theta, batch)
            return (admm.dual_ascent(w, w, theta, -eta * self.lam), theta), loss

        (w, theta), loss = run_steps(step, (w_t, w_t), inp.train, self.plan(), inp.key, inp.unroll)
        return w, theta, loss

    def client_update(self, inp: ClientInput) -> ClientResult:
        w, theta, loss = self.local_round(inp.down, inp, inp.round)
        return ClientResult(state={"theta": theta}, upload=w, weight=inp.train.count, metrics={"train_loss": loss})

    def server_step(self, ctx, server, aggregate):
        return {"params": tree.lerp(self.beta, server["params"], aggregate)}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        if self.eval_mode == "stored":
            return inp.state["theta"]
        return self.local_round(inp.down, inp, 0)[1]
