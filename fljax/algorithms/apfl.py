"""APFL (Deng, Kamani, Mahdavi 2020): adaptive personalized FL by mixing a local and the global model.

Selected client i, round t, from w ← w_t and its own (v_i, α_i); for every minibatch ξ, from the pre-step (w, v)
(FedSLR spec §10; f_i includes wd/2‖·‖², as every baseline's local objective does):
    v̄ = α_i v + (1 − α_i) w
    w ← w − η_l ∇f_i(w; ξ)
    v ← v − η_l α_i ∇f_i(v̄; ξ)              (∇_v f_i(v̄) with w held constant: α_i applied once)
    adaptive option (D21): α_i ← clip_[0,1](α_i − η_α ⟨v − w, ∇f_i(v̄; ξ)⟩)
The server averages the w_i; client i is evaluated with α_i v_i + (1 − α_i) w_T. v_i starts at w_0, α_i at
``alpha`` (0.5, fixed by default, D21). The personalized model holds two model-sized vectors.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_REGULARISED
from fljax.algorithms.local_training import LocalTraining, local_training, run_steps
from fljax.algorithms.registry import register
from fljax.algorithms.server_optimizer import AVERAGE
from fljax.options import between, greater_than, option

__all__ = ["APFL"]


@register("apfl", family=PERSONAL_REGULARISED, example="configs/apfl.yaml",
          summary="APFL: personal model v_i mixed with the global w as a v + (1 - a) w (Deng et al. 2020)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class APFL(Aggregating):
    """The coupled (w, v) steps are plain SGD at the client learning rate and the server takes the plain mean: APFL
    takes no client optimizer, momentum or clipping and no server step size. Two models per client: it does not
    train BatchNorm statistics (one set could not serve both)."""

    local: LocalTraining = local_training("lr", "lr_decay", "weight_decay", "batch_size", "local_epochs",
                                          "local_steps", "sampling")
    alpha: float = option(0.5, "initial mixing weight α_i of the personal model v_i in α v_i + (1 − α) w (0.5, D21)",
                          between(0, 1))
    adaptive_alpha: bool = option(False,
                                  "learn α_i by gradient steps on the mixture (APFL's adaptive option) instead of "
                                  "keeping it fixed")
    alpha_lr: float = option(0.1, "step size η_α of the adaptive α_i update (with adaptive_alpha)", greater_than(0))

    def init(self, ctx):
        server = AVERAGE.init(ctx.model.init(self.init_key(ctx)))
        n = ctx.num_clients
        return server, {"v": tree.broadcast_clients(server["params"], n), "alpha": jnp.full((n,), self.alpha)}

    def grad(self, model, params, batch):
        """(f_i, ∇f_i) with f_i = CE + (wd/2)‖params‖²."""
        loss, g = jax.value_and_grad(model.loss)(params, batch)
        return loss, tree.axpy(self.local.weight_decay, params, g)

    def client_update(self, inp: ClientInput) -> ClientResult:
        w_t, state = inp.down, inp.state
        lr = self.local.lr_at(inp.round)

        def step(carry, batch, k):
            w, v, a = carry
            v_bar = tree.lerp(a, w, v)  # α v + (1 − α) w
            loss, g_w = self.grad(inp.model, w, batch)
            _, g_bar = self.grad(inp.model, v_bar, batch)
            if self.adaptive_alpha:
                a_new = jnp.clip(a - self.alpha_lr * tree.vdot(tree.sub(v, w), g_bar), 0.0, 1.0)
            else:
                a_new = a
            return (tree.axpy(-lr, g_w, w), tree.axpy(-lr * a, g_bar, v), a_new), loss

        (w, v, a), loss = run_steps(step, (w_t, state["v"], state["alpha"]), inp.train, self.plan(), inp.key,
                                    inp.unroll)
        return ClientResult(state={"v": v, "alpha": a}, upload=w, weight=inp.train.count,
                            metrics={"train_loss": loss})

    def server_step(self, ctx, server, aggregate):
        return AVERAGE.step(server, aggregate)

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        return tree.lerp(inp.state["alpha"], inp.down, inp.state["v"])
