"""SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 with control-variate Option II.

Selected client i, round t, receiving (x, c) (FedSLR spec §10, D26):
    y ← x;  K steps  y ← y − η_l(∇f_i(y; ξ) + wd·y − c_i + c)
    c_i⁺ = c_i − c + (x − y)/(K·η_l)        (K = the steps actually taken — a straggler's budget caps them —,
                                            η_l = this round's rate)
    upload (y − x, c_i⁺ − c_i);  c_i ← c_i⁺
Server:
    x ← x + η_g·mean_{S_t}(y_i − x);   c ← c + (1/M) Σ_{i∈S_t} (c_i⁺ − c_i)     (c, c_i start at 0)
Both directions carry two model-sized vectors.
"""
from __future__ import annotations

import dataclasses

from fljax import tree
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.families import GLOBAL_MODEL
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.model_state import BatchStatsOption
from fljax.algorithms.registry import register
from fljax.options import greater_than, option, with_default

__all__ = ["Scaffold"]


@register("scaffold", family=GLOBAL_MODEL, example="configs/scaffold.yaml",
          summary="SCAFFOLD: control variates correct client drift, Option II (Karimireddy et al. 2020)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Scaffold(BatchStatsOption, Centralized):
    """Option II's control variate assumes plain SGD steps: SCAFFOLD takes no client optimizer or momentum."""

    # example-level DP applies (every local step is LocalTraining's); client-level DP and compression do not: the
    # upload (y − x, c_i⁺ − c_i) is two vectors of different scales (the second ~ 1/(K·η_l) times the first) that
    # the server aggregates differently (a mean and a sum over M), not a model it averages
    private_steps = True
    local: LocalTraining = local_training("lr", "lr_decay", "weight_decay", "clip_norm", "batch_size",
                                          "local_epochs", "local_steps", "sampling")
    server_lr: float = option(1.0, "global step size η_g: x ← x + η_g·mean(y_i − x)", greater_than(0))
    weighting: str = with_default(Centralized, "weighting", "uniform")

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        zeros = tree.zeros_like(params)
        return {"params": params, "c": zeros}, {"c": tree.broadcast_clients(zeros, ctx.num_clients)}

    def broadcast(self, server):
        return server["params"], server["c"]

    def client_update(self, inp: ClientInput) -> ClientResult:
        (x, c), c_i = inp.down, inp.state["c"]
        correction = tree.sub(c, c_i)
        local = self.local
        y, variables, loss = local.train_with_state(inp.model.train_loss, x, inp, extra_grad=lambda _: correction)
        k = local.steps_taken(inp)  # a straggler's budget caps them
        c_plus = tree.axpy(1.0 / (k * local.lr_at(inp.round)), tree.sub(x, y), tree.sub(c_i, c))
        upload = (tree.sub(y, x), tree.sub(c_plus, c_i))
        return ClientResult(state={"c": c_plus}, upload=upload, weight=inp.train.count, metrics={"train_loss": loss},
                            variables=variables)

    def server_update(self, ctx, server, clients, cohort, result):
        dy, dc = result.upload
        step = tree.weighted_mean_clients(dy, self.aggregation_weights(result))
        return {"params": tree.axpy(self.server_lr, step, server["params"]),
                "c": tree.axpy(1.0 / ctx.num_clients, tree.sum_clients(dc), server["c"])}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared
