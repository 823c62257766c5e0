"""Fed-RoD (Chen & Chao 2022): one body, a generic head trained with the balanced softmax, a personal head.

Model: body h = u(x) (the input of the model's ``head`` layer), generic head g (the model's ``head``), and a personal
linear head p_i of the same shape, which never leaves client i (DFedAlt spec D23: no hypernetwork; p_i starts at
zero, so the personal model starts as the generic one). π_i = client i's train class counts.

Selected client i, round t, from the received (u_t, g_t), for every minibatch (x, y) of ``local_epochs`` epochs:

    (u, g) ← optimizer step on  BSM:  CE(g(h) + log π_i, y)             (balanced softmax; log 0 = −∞ is masked)
    p_i    ← optimizer step on  CE(sg[g(h)] + p_i(sg[h]), y)             (sg: stop-gradient; same h and batch)

The server averages (u, g) as FedAvg does. Client i is scored with logits g(h) + p_i(h) of its stored (u_i, g_i)
after its latest local training (``eval_body='stored'``, D19) or of the current server model (``'server'``); the
global model is (u, g) with logits g(h).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_SPLIT
from fljax.algorithms.local_training import LocalTraining, local_training, run_steps
from fljax.algorithms.registry import register
from fljax.algorithms.server_optimizer import ServerOptimizer, server_optimizer
from fljax.errors import OptionError
from fljax.models.model import masked_cross_entropy
from fljax.options import option

__all__ = ["FedRoD"]

# log π for a class the client does not hold: −∞ in the paper; a large finite value keeps the masked padding rows
# (whose label may be such a class) at loss 0·finite instead of 0·∞ = NaN, with the same softmax.
LOG_ZERO = -1e9


def linear(head, h):
    """A Dense layer's output h·kernel (+ bias)."""
    out = h @ head["kernel"]
    return out + head["bias"] if "bias" in head else out


@register("fedrod", family=PERSONAL_SPLIT, example="configs/fedrod.yaml",
          summary="Fed-RoD: balanced-softmax generic head + personal head on a shared body (Chen & Chao 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedRoD(Aggregating):
    """The server averages (u, g) as FedAvg does (its server optimizer, ``server``); both heads step with the
    client's optimizer (``local``). Two models per client: Fed-RoD does not train BatchNorm statistics."""

    local: LocalTraining = local_training()
    server: ServerOptimizer = server_optimizer()
    eval_body: Literal["stored", "server"] = option(
        "stored", "'stored' (the client's body and generic head after its latest training) or 'server' (the "
                  "server's)")

    def init(self, ctx):
        server = self.server.init(ctx.model.init(self.init_key(ctx)))
        params = server["params"]
        if "head" not in params:
            raise OptionError("model", f"must have a last layer named 'head' for fedrod; {ctx.model.name} has none.")
        m = ctx.num_clients
        return server, {"params": tree.broadcast_clients(params, m),
                        "p": tree.broadcast_clients(tree.zeros_like(params["head"]), m)}

    def client_update(self, inp: ClientInput) -> ClientResult:
        params, state, train, model = inp.down, inp.state, inp.train, inp.model
        counts = jnp.zeros(model.num_classes).at[train.y].add(train.mask.astype(jnp.float32))
        log_prior = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0) / jnp.sum(counts)), LOG_ZERO)
        local = self.local
        opt = local.client_optimizer(local.lr_at(inp.round))

        def generic_loss(w, batch):
            h = model.features(w, batch.x)
            logits = linear(w["head"], h)
            return masked_cross_entropy(logits + log_prior, batch.y, batch.mask), (h, logits)

        def personal_loss(p, h, generic_logits, batch):
            return masked_cross_entropy(generic_logits + linear(p, h), batch.y, batch.mask)

        def step(carry, batch, k):
            (w, p), (w_state, p_state) = carry
            (loss, (h, logits)), gw = jax.value_and_grad(generic_loss, has_aux=True)(w, batch)
            gp = jax.grad(personal_loss)(p, jax.lax.stop_gradient(h), jax.lax.stop_gradient(logits), batch)
            uw, w_state = opt.update(gw, w_state, w)
            up, p_state = opt.update(gp, p_state, p)
            return ((tree.add(w, uw), tree.add(p, up)), (w_state, p_state)), loss

        carry = ((params, state["p"]), (opt.init(params), opt.init(state["p"])))
        ((w, p), _), loss = run_steps(step, carry, train, local.plan(), inp.key, inp.unroll)
        return ClientResult(state={"params": w, "p": p}, upload=w, weight=train.count, metrics={"train_loss": loss})

    def server_step(self, ctx, server, aggregate):
        return self.server.step(server, aggregate)

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        return (inp.state["params"] if self.eval_body == "stored" else inp.down), inp.state["p"]

    def logits(self, model, params, x, variables=None):
        if isinstance(params, tuple):  # personal model: generic + personal head on the same features
            w, p = params
            h = model.features(w, x)
            return linear(w["head"], h) + linear(p, h)
        return model.apply(params, x, variables=variables)
