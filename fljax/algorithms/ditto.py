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
from typing import Literal

import jax

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_REGULARISED
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.algorithms.server_optimizer import ServerOptimizer, server_optimizer
from fljax.data.batching import BatchPlan
from fljax.ops import admm
from fljax.options import at_least, option

__all__ = ["Ditto"]


@register("ditto", family=PERSONAL_REGULARISED, example="configs/ditto.yaml",
          summary="Ditto: FedAvg global model + personal models regularised towards it (Li et al. 2021)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Ditto(Aggregating):
    """The global model is FedAvg's (its server optimizer, ``server``); both models train with the client's local
    training (``local``). Two models per client: Ditto does not train BatchNorm statistics (one set could not
    serve both)."""

    private_steps = True  # both models train through LocalTraining (the upload: w_i, with the plan's steps)
    local: LocalTraining = local_training()
    server: ServerOptimizer = server_optimizer()
    lam: float = option(0.1, "λ of the pull (λ/2)‖v − w_t‖² of the personal model towards the global one",
                        at_least(0))
    personal_epochs: int = option(1, "epochs of SGD on the personal model v_i per round", at_least(0))
    prox_mode: Literal["gradient", "decoupled"] = option(
        "gradient", "'gradient' (λ(v − w_t) in every gradient, Algorithm 1) or 'decoupled' (SGD step, then the pull)")

    def init(self, ctx):
        server = self.server.init(ctx.model.init(self.init_key(ctx)))
        return server, {"v": tree.broadcast_clients(server["params"], ctx.num_clients)}

    def server_step(self, ctx, server, aggregate):
        return self.server.step(server, aggregate)

    def steps_per_round(self, n_max: int) -> int:
        return super().steps_per_round(n_max) + BatchPlan(batch_size=self.local.batch_size,
                                                          epochs=self.personal_epochs).num_steps(n_max)

    def personal_update(self, v, anchor, inp: ClientInput, key):
        """``personal_epochs`` of SGD on f_i(v) + (λ/2)‖v − w_t‖² (gradient or decoupled proximal step)."""
        if self.prox_mode == "gradient":
            return self.local.personal_phase(
                inp.model.loss, v, inp, key, epochs=self.personal_epochs,
                extra_grad=lambda p: admm.augmented_lagrangian_grad(p, anchor, sigma=self.lam))
        return self.local.personal_phase(inp.model.loss, v, inp, key, epochs=self.personal_epochs,
                                         prox=lambda p, lr: tree.lerp(lr * self.lam, p, anchor))

    def client_update(self, inp: ClientInput) -> ClientResult:
        k_global, k_personal = jax.random.split(inp.key)
        w, loss = self.local.train(inp.model.loss, inp.down, inp, key=k_global)
        v, personal_loss = self.personal_update(inp.state["v"], inp.down, inp, k_personal)
        return ClientResult(state={"v": v}, upload=w, weight=inp.train.count,
                            metrics={"train_loss": loss, "personal_loss": personal_loss})

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        return inp.state["v"]
