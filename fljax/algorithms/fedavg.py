"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and FedAvg with local fine-tuning.

FedAvg, one round t:
    S_t ← cohort;  every i ∈ S_t: w_i ← LocalSGD(f_i, from w_t)
    Δ_t = w_t − Σ_{i∈S_t} p_i w_i  (p_i ∝ n_i or uniform);   w_{t+1} = ServerOpt(w_t, Δ_t)
With the default server optimizer (SGD, server_lr = 1) w_{t+1} is the weighted mean of the w_i; ``server_optimizer``
adagrad, yogi or adam makes it FedAdagrad, FedYogi or FedAdam (Reddi et al. 2021, Algorithm 2;
:class:`~fljax.algorithms.server_optimizer.ServerOptimizer`).

FedProx adds the proximal term (μ/2)‖w − w_t‖² to every local objective (FedProx Eq. 2).
FedAvg-FT evaluates client i with the global model fine-tuned for ``finetune_steps`` local steps on i's data (its
support set when the data declares support/query sets: AugFL spec §7's one full-batch step of size α).
FedLP ("Where to begin?", Nguyen et al.; AugFL spec §8) is FedAvg-FT started from the server's same-architecture
pretrained model θ_p instead of a random θ^0.

``local_data`` (FedAvg and its variants): 'all' trains on the client's whole train split (with support/query sets:
𝒟_i^s ∪ 𝒟_i^q, AugFL spec D22), 'support' on its support set only (the AugFL authors' code).

``eval_model``: 'global' scores every client with the global model; 'stored' scores client i with the model it
stored after its latest local training (the initial model before its first participation), the CFL protocol of the
DFedAlt spec (§6, D19: "the local model ... is the personalized model"). FedAvg-FT and FedLP fine-tune that model
before scoring it (:class:`FineTuning`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import GLOBAL_MODEL, PRETRAINED
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.model_state import BatchStatsOption
from fljax.algorithms.registry import register
from fljax.algorithms.server_optimizer import ServerOptimizer, server_optimizer
from fljax.data.batching import BatchPlan
from fljax.errors import ConfigError
from fljax.ops import prox
from fljax.options import at_least, greater_than, one_of, option

__all__ = ["FedAvg", "FedProx", "FineTuning", "FedAvgFT", "FedLP"]


@register("fedavg", family=GLOBAL_MODEL, example="configs/fedavg.yaml",
          summary="FedAvg: local SGD, weighted model averaging, server learning rate (McMahan et al. 2017)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvg(BatchStatsOption, Aggregating):
    """FedAvg's round: every client of the cohort runs its local training (``local``, a
    :class:`~fljax.algorithms.local_training.LocalTraining`) from w_t on its ``local_data``; the server steps on the
    pseudo-gradient with its optimizer (``server``, a :class:`~fljax.algorithms.server_optimizer.ServerOptimizer`)
    from the mean weighted by ``weighting``: n_i samples (McMahan et al.; FedJAX), the client's target tokens (TFF and
    Reddi et al. on Stack Overflow: :meth:`fljax.data.ClientArrays.tokens`) or uniform. Each client is scored with the
    global model or (``eval_model='stored'``) its own latest model."""

    private_steps = True  # its clients train only through LocalTraining.train: DP-SGD applies
    local: LocalTraining = local_training()
    server: ServerOptimizer = server_optimizer()
    local_data: Literal["all", "support"] = option(
        "all", "'all' trains on the client's whole train split, 'support' on its support set only")
    weighting: str = option("samples", "aggregation weights: 'samples' (n_i), 'tokens' (the client's non-padding "
                                       "train targets: TFF's and Reddi et al.'s weighting of next-token data) or "
                                       "'uniform'", one_of(("samples", "tokens", "uniform")))
    eval_model: Literal["global", "stored"] = option(
        "global", "'global' scores every client with the global model, 'stored' with its own model after its "
                  "latest training")

    def client_weights(self, train) -> list[float]:
        """Every client's aggregation weight p_k: n_k, its target tokens (``weighting='tokens'``) or 1."""
        if self.weighting == "tokens":
            return [float(t) for t in np.asarray(train.tokens())]
        return super().client_weights(train)

    def initial_params(self, ctx):
        """w_0: the model's initialisation (FedLP: the server's pretrained model)."""
        return ctx.model.init(self.init_key(ctx))

    def init(self, ctx):
        server = self.server.init(self.initial_params(ctx))
        clients = {"params": tree.broadcast_clients(server["params"], ctx.num_clients)} \
            if self.eval_model == "stored" else {}
        return server, clients

    def server_step(self, ctx, server, aggregate):
        return self.server.step(server, aggregate)

    def local_loss(self, model, params, batch, variables, key, anchor):
        """The local objective f_i on ``batch`` in the model's training mode, with the model's ``variables`` and
        dropout ``key``: (loss, the updated variables) (:meth:`fljax.models.Model.train_loss`; FedProx adds its
        proximal term to it)."""
        return model.train_loss(params, batch, variables, key)

    def client_update(self, inp: ClientInput) -> ClientResult:
        loss_fn = functools.partial(self.local_loss, inp.model, anchor=inp.down)
        params, variables, loss = self.local.train_with_state(
            loss_fn, inp.down, inp.replace(train=inp.train.support_view()) if self.local_data == "support" else inp)
        weight = inp.train.tokens() if self.weighting == "tokens" else inp.train.count
        return ClientResult(state={"params": params} if self.eval_model == "stored" else inp.state, upload=params,
                            weight=weight, metrics={"train_loss": loss}, variables=variables)

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        return inp.state["params"] if self.eval_model == "stored" else None


# Measured at the quick start: FedProx 0.944 (= FedAvg) -> 0.941 (mu = 0.1), 0.938 (mu = 1).
@register("fedprox", family=GLOBAL_MODEL, example="configs/fedprox.yaml",
          summary="FedProx: FedAvg with a proximal term (mu/2)||w - w_t||^2 in every local objective (Li et al. 2020)",
          untuned=("mu", "its μ = {value} adds almost nothing to FedAvg's local objective here; see what μ does with "
                         "fljax sweep --algorithm fedprox --grid algo.mu=0,0.01,0.1,1"))
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProx(FedAvg):
    """FedAvg whose local objective is f_i(w) + (μ/2)‖w − w_t‖² (Li et al. 2020, Eq. 2); μ = 0 is FedAvg."""

    mu: float = option(0.01, "μ of the proximal term (μ/2)‖w − w_t‖² in every local objective (0: FedAvg)",
                       at_least(0))

    def local_loss(self, model, params, batch, variables, key, anchor):
        loss, variables = model.train_loss(params, batch, variables, key)
        return loss + prox.proximal_penalty(params, anchor, self.mu), variables


@dataclasses.dataclass(frozen=True, kw_only=True)
class FineTuning:
    """Personalization by fine-tuning, mixed into FedAvg (FedAvg-FT, FedLP): client i is scored with the model FedAvg
    scores it with (``eval_model``: the global model, or its own stored one) after ``finetune_steps`` local SGD steps
    on its own train split (its support set when the data declares support/query sets: AugFL spec §7's one
    full-batch step of size α), at ``finetune_lr`` (default: the client learning rate of round 0), batch
    ``batch_size``."""

    finetune_steps: int = option(5, "local SGD steps fine-tuning the scored model (eval_model's) before a client is "
                                    "scored", at_least(0))
    finetune_lr: float | None = option(None, "learning rate of the evaluation's fine-tuning steps (null: the "
                                             "round-0 client lr)", greater_than(0))

    def personal_model(self, inp: ClientInput):
        """The scored model after the fine-tuning steps, with the model variables those steps trained (a BatchNorm
        model's statistics, from the client's ``inp.variables``)."""
        start = super().personal_params(inp)
        local = self.local
        plan = BatchPlan(batch_size=local.batch_size, steps=self.finetune_steps)
        lr = local.lr_at(0) if self.finetune_lr is None else self.finetune_lr
        params, variables, _ = local.train_with_state(inp.model.train_loss, inp.down if start is None else start,
                                                      inp.replace(train=inp.train.support_view()), plan=plan, lr=lr)
        return params, (inp.variables if variables is None else variables)

    def personal_params(self, inp: ClientInput):
        return self.personal_model(inp)[0]


@register("fedavg_ft", family=GLOBAL_MODEL, example="configs/fedavg_ft.yaml",
          summary="FedAvg-FT: FedAvg, then k local fine-tuning steps before personalized evaluation")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgFT(FineTuning, FedAvg):
    """FedAvg; client i is evaluated with the global model after ``finetune_steps`` local SGD steps on its own
    train split (:class:`FineTuning`)."""


@register("fedlp", family=PRETRAINED, example="configs/fedlp.yaml",
          summary="FedLP: FedAvg-FT started from the server's same-architecture pretrained model (Nguyen et al.)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedLP(FineTuning, FedAvg):
    """FedAvg-FT from θ^0 = θ_p, the server's pretrained model of the run's own architecture (``server.pretrained:
    same``); AugFL spec §8."""

    generic = False  # needs a server with a pretrained model

    def initial_params(self, ctx):
        pm = None if ctx.server is None else ctx.server.pm_params
        if pm is None or jax.tree.map(jnp.shape, pm) != jax.tree.map(jnp.shape, ctx.model.init(self.init_key(ctx))):
            raise ConfigError("fedlp starts from the server's pretrained model of the run's own architecture: set "
                              "server.pretrained: same (with a split that gives the server a set, e.g. "
                              "data.partition: meta_pairs).")
        return pm
