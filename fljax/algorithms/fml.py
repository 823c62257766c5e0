"""Federated Mutual Learning (Shen et al. 2020), as the QuPeD paper runs it (QuPeD spec §10, D29).

Client i keeps a local model x_i (its own architecture: its client group's model) and a meme w_i, a copy of the
global model w (the simulation's model). On each minibatch ξ, from the pre-update logits z_x, z_w of both models::

    x_i ← x_i − η (∇_x[(1 − a) CE(x_i; ξ) + a KL(sg p_w ‖ p_x)] + wd·x_i)
    w_i ← w_i − η (∇_w[(1 − b) CE(w_i; ξ) + b KL(sg p_x ‖ p_w)] + wd·w_i)

i.e. one SGD step on the joint loss (1 − a) CE(x) + a KL(sg z_w ‖ z_x) + (1 − b) CE(w) + b KL(sg z_x ‖ z_w), whose
stop-gradients make each model's gradient exactly its own line above. The server averages the w_i of the cohort
(unweighted, as QuPeD's D12); client i is evaluated with x_i. ``a``, ``b`` weight the KD terms (D29: parity with
λ_p; 0.25 for CNN1, 0.15 for CNN2, per client group). The meme is a KD student that sees labels (forward KL), the
contrast with QuPeD's label-free global model.
"""
from __future__ import annotations

import dataclasses

import jax

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_REGULARISED
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.models.model import masked_cross_entropy
from fljax.ops.distill import kl_divergence
from fljax.options import between, option, with_default

__all__ = ["FML"]


@register("fml", family=PERSONAL_REGULARISED, example="configs/fml.yaml",
          summary="Federated Mutual Learning: local model and global meme distil each other on every batch (Shen et al.)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FML(Aggregating):
    """``a``, ``b``: the KD weights of the local model and of the meme; both models step with the client's local
    training (``lr`` η decayed per round by ``lr_decay``, ``weight_decay`` on both models)."""

    mixed_architectures = True

    local: LocalTraining = local_training()
    a: float = option(0.25, "KD weight a of the local model: (1 − a) CE(x) + a KL(sg p_w ‖ p_x)", between(0, 1))
    b: float = option(0.25, "KD weight b of the meme: (1 − b) CE(w) + b KL(sg p_x ‖ p_w)", between(0, 1))
    cohort_size: int | None = with_default(Aggregating, "cohort_size", None)
    weighting: str = with_default(Aggregating, "weighting", "uniform")

    def init(self, ctx):
        """w⁰ = init(global model); local models start as copies of w⁰ when they share its architecture, else one
        init per architecture from its own key (as QuPeD's D9)."""
        key = self.init_key(ctx)
        w0 = ctx.server_model.init(key)
        same = jax.eval_shape(ctx.model.init, key) == jax.eval_shape(ctx.server_model.init, key)
        x0 = w0 if same else ctx.model.init(jax.random.fold_in(key, 1))
        return {"params": w0}, {"x": tree.broadcast_clients(x0, ctx.num_clients)}

    def joint_loss(self, model, gmodel, params, batch):
        """(1 − a) CE(x) + a KL(sg z_w ‖ z_x) + (1 − b) CE(w) + b KL(sg z_x ‖ z_w) on ``params`` = (x, w)."""
        x, w = params
        zx, zw = model.apply(x, batch.x), gmodel.apply(w, batch.x)
        sg = jax.lax.stop_gradient
        return ((1 - self.a) * masked_cross_entropy(zx, batch.y, batch.mask)
                + self.a * kl_divergence(sg(zw), zx, mask=batch.mask)
                + (1 - self.b) * masked_cross_entropy(zw, batch.y, batch.mask)
                + self.b * kl_divergence(sg(zx), zw, mask=batch.mask))

    def client_update(self, inp: ClientInput) -> ClientResult:
        loss_fn = lambda p, batch: self.joint_loss(inp.model, inp.global_model, p, batch)  # noqa: E731
        (x, w), loss = self.local.train(loss_fn, (inp.state["x"], inp.down), inp)
        return ClientResult(state={"x": x}, upload=w, weight=inp.train.count, metrics={"train_loss": loss})

    def broadcast(self, server):
        return server["params"]

    def server_step(self, ctx, server, aggregate):
        return {"params": aggregate}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        return inp.state["x"]
