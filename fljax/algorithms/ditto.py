"""Ditto (Li et al. 2021): FedAvg for the global model plus a personal model pulled towards it.

Selected client i, round t, with the received global model w_t:
    w_i ← LocalSGD(f_i, from w_t)                                     (uploaded; the server runs FedAvg)
    v_i ← ``personal_epochs`` of SGD on  f_i(v) + (λ/2)‖v − w_t‖²,  from its own v_i   (never leaves the client)
``prox_mode='gradient'`` puts λ(v − w_t) into every gradient (Ditto's Algorithm 1; FedSLR spec D23);
``prox_mode='decoupled'`` takes the plain SGD step and then v ← v − η·λ(v − w_t) (the DFedAlt spec's D21, as
the authors' code does). v_i starts at w_0; client i is evaluated with v_i.
"""
from __future__ import annotations

import dataclasses

import jax

from fljax import tree
from fljax.algorithms.base import ClientResult
from fljax.algorithms.fedavg import FedAvg
from fljax.algorithms.local_training import run_steps
from fljax.data.batching import BatchPlan
from fljax.ops import prox

__all__ = ["Ditto"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ditto(FedAvg):
    name = "ditto"
    summary = "Ditto: FedAvg global model + personal models regularised towards it (Li et al. 2021)"
    lam: float = 0.1
    personal_epochs: int = 1
    prox_mode: str = "gradient"

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}.")
        if self.personal_epochs < 0:
            raise ValueError(f"personal_epochs must be >= 0, got {self.personal_epochs}.")
        if self.prox_mode not in ("gradient", "decoupled"):
            raise ValueError(f"prox_mode must be 'gradient' or 'decoupled', got {self.prox_mode!r}.")

    def init(self, ctx):
        server, _ = super().init(ctx)
        return server, {"v": tree.broadcast_clients(server["params"], ctx.num_clients)}

    def steps_per_round(self, n_max: int) -> int:
        return super().steps_per_round(n_max) + self.personal_plan().num_steps(n_max)

    def personal_plan(self) -> BatchPlan:
        return BatchPlan(batch_size=self.batch_size, epochs=self.personal_epochs)

    def personal_update(self, v, anchor, train, key, round_):
        """``personal_epochs`` of SGD on f_i(v) + (λ/2)‖v − w_t‖² (gradient or decoupled proximal step)."""
        lr = self.lr_at(round_)
        opt = self.client_optimizer(lr)
        if self.prox_mode == "gradient":
            step = self.sgd_step(self.model.loss, opt, lambda p: prox.proximal_penalty_grad(p, anchor, self.lam))
        else:
            plain = self.sgd_step(self.model.loss, opt)

            def step(carry, batch, k):
                (p, s), loss = plain(carry, batch, k)
                return (tree.lerp(lr * self.lam, p, anchor), s), loss

        (v, _), loss = run_steps(step, (v, opt.init(v)), train, self.personal_plan(), key, self.unroll)
        return v, loss

    def client_update(self, shared, per_client) -> ClientResult:
        anchor, round_ = shared
        state, train, key = per_client
        k_global, k_personal = jax.random.split(key)
        w, loss = self.train(self.model.loss, anchor, train, k_global, round_, self.unroll)
        v, personal_loss = self.personal_update(state["v"], anchor, train, k_personal, round_)
        return ClientResult(state={"v": v}, upload=w, weight=train.count,
                            metrics={"train_loss": loss, "personal_loss": personal_loss})

    def personal_params(self, shared, client_state, train, key):
        return client_state["v"]

