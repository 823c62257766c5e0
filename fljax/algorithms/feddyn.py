"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularisation (Algorithm 1).

Selected client i, round t, from the received θ^{t−1} (FedSLR spec §10):
    θ_i ← argmin_θ L_i(θ) − ⟨g_i, θ⟩ + (α/2)‖θ − θ^{t−1}‖²     (SGD on ∇L_i(θ; ξ) + wd·θ − g_i + α(θ − θ^{t−1}))
    g_i ← g_i − α(θ_i − θ^{t−1})                                (g_i = 0 initially; unchanged when not sampled)
Server:
    h ← h − α·(1/M) Σ_{i∈S_t} (θ_i − θ^{t−1})                    (h = 0 initially)
    θ^t = (1/|S_t|) Σ_{i∈S_t} θ_i − h/α
The penalty is the squared norm (not PFLlib's non-squared one) and the server rule is the paper's (not FL-bench's).
"""
from __future__ import annotations

import dataclasses

from fljax import tree
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.families import GLOBAL_MODEL
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.ops import admm
from fljax.options import greater_than, option, with_default

__all__ = ["FedDyn"]


@register("feddyn", family=GLOBAL_MODEL, example="configs/feddyn.yaml",
          summary="FedDyn: dynamic linear + quadratic regulariser per client, server state h (Acar et al. 2021)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedDyn(Centralized):
    # example-level DP applies; client-level DP does not: the server's h reads the sum of the uploads (not a mean)
    private_steps = True
    local: LocalTraining = local_training()
    alpha: float = option(0.1,
                          "α of the dynamic regulariser −⟨g_i, θ⟩ + (α/2)‖θ − θ^{t−1}‖² and of the server's h/α "
                          "correction", greater_than(0))
    weighting: str = with_default(Centralized, "weighting", "uniform")

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        zeros = tree.zeros_like(params)
        return {"params": params, "h": zeros}, {"g": tree.broadcast_clients(zeros, ctx.num_clients)}

    def client_update(self, inp: ClientInput) -> ClientResult:
        theta, g = inp.down, inp.state["g"]
        dyn = lambda w: admm.augmented_lagrangian_grad(w, theta, g, sigma=self.alpha, dual_sign=-1)  # noqa: E731
        theta_i, loss = self.local.train(inp.model.loss, theta, inp, extra_grad=dyn)
        g = admm.dual_ascent(g, theta_i, theta, -self.alpha)
        return ClientResult(state={"g": g}, upload=theta_i, weight=inp.train.count, metrics={"train_loss": loss})

    def server_update(self, ctx, server, clients, cohort, result):
        theta = server["params"]
        drift = tree.sub(tree.sum_clients(result.upload), tree.scale(cohort.shape[0], theta))
        h = tree.axpy(-self.alpha / ctx.num_clients, drift, server["h"])
        mean = tree.weighted_mean_clients(result.upload, self.aggregation_weights(result))
        return {"params": tree.axpy(-1.0 / self.alpha, h, mean), "h": h}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared
