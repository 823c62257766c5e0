"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and FedAvg with local fine-tuning.

FedAvg, one round t:
    S_t ← cohort;  every i ∈ S_t: w_i ← LocalSGD(f_i, from w_t)
    Δ_t = w_t − Σ_{i∈S_t} p_i w_i  (p_i ∝ n_i or uniform);   w_{t+1} = ServerOpt(w_t, Δ_t)
With the default server optimizer (SGD, server_lr = 1) w_{t+1} is the weighted mean of the w_i.

FedProx adds the proximal term (μ/2)‖w − w_t‖² to every local objective (FedProx Eq. 2).
FedAvg-FT evaluates client i with the global model fine-tuned for ``finetune_steps`` local steps on i's data (its
support set when the data declares support/query sets: AugFL spec §7's one full-batch step of size α).
FedLP ("Where to begin?", Nguyen et al.; AugFL spec §8) is FedAvg-FT started from the server's same-architecture
pretrained model θ_p instead of a random θ^0.

``local_data`` (FedAvg and its variants): 'all' trains on the client's whole train split (with support/query sets:
𝒟_i^s ∪ 𝒟_i^q, AugFL spec D22), 'support' on its support set only (the AugFL authors' code).

``eval_model`` (FedAvg, FedProx; FedAvg-FT always fine-tunes the global model): 'global' scores every client with
the global model; 'stored' scores client i with the model it stored after its latest local training (the initial
model before its first participation), the CFL protocol of the DFedAlt spec (§6, D19: "the local model ... is the
personalized model").
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.local_training import EVERY, local_options
from fljax.algorithms.model_state import BatchStatsOption
from fljax.data.batching import BatchPlan
from fljax.errors import ConfigError
from fljax.ops import prox
from fljax.options import at_least, greater_than, option

__all__ = ["ModelAveraging", "ServerSGD", "FedAvgBase", "FedAvg", "FedProx", "FedAvgFT", "FedLP"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelAveraging(Centralized):
    """The FedAvg server, for the algorithms that average one global model: w_{t+1} = ServerOpt(w_t, Δ_t) with the
    pseudo-gradient Δ_t = w_t − Σ_{i∈S_t} p_i w_i. Here the server optimizer is SGD with step 1, so w_{t+1} is the
    weighted mean; :class:`ServerSGD` makes its step and momentum options. Its upload is a model trained from w_t and
    the server reads the uploads only through their mean: privacy and compression apply (``upload_model``)."""

    upload_model = True

    def server_optimizer(self) -> optax.GradientTransformation:
        return optax.sgd(1.0)

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        return {"params": params, "opt_state": self.server_optimizer().init(params)}, {}

    def server_update(self, ctx, server, clients, cohort, result):
        mean = tree.weighted_mean_clients(result.upload, self.aggregation_weights(result))
        pseudo_grad = tree.sub(server["params"], mean)
        updates, opt_state = self.server_optimizer().update(pseudo_grad, server["opt_state"], server["params"])
        return {"params": optax.apply_updates(server["params"], updates), "opt_state": opt_state}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSGD(ModelAveraging):
    """:class:`ModelAveraging` with a server optimizer of the user's: SGD with ``server_lr`` and
    ``server_momentum`` on the pseudo-gradient."""

    server_lr: float = option(1.0, "server learning rate η_g of w ← w − η_g·Δ_t (1: the weighted mean)",
                              greater_than(0))
    server_momentum: float = option(0.0, "server momentum on the pseudo-gradient Δ_t (0: none)", at_least(0))

    def server_optimizer(self) -> optax.GradientTransformation:
        return optax.sgd(self.server_lr, momentum=self.server_momentum or None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgBase(BatchStatsOption, ServerSGD, local_options(*EVERY)):
    """FedAvg's round: every client of the cohort runs its local training (:class:`~fljax.algorithms.
    local_training.LocalTraining`) from w_t on its ``local_data``; the server steps on the pseudo-gradient
    (:class:`ServerSGD`). What a client is scored with is the subclass's."""

    local_data: Literal["all", "support"] = option(
        "all", "'all' trains on the client's whole train split, 'support' on its support set only")
    private_steps = True  # its clients train only through LocalTraining.train: DP-SGD applies

    def local_loss(self, model, params, batch, anchor):
        """The local objective f_i (FedProx overrides it)."""
        return model.loss(params, batch)

    def stored(self, params, inp: ClientInput):
        """The client's state after its local training gave ``params`` (default: unchanged)."""
        return inp.state

    def client_update(self, inp: ClientInput) -> ClientResult:
        loss_fn = functools.partial(self.local_loss, inp.model, anchor=inp.down)
        params, loss = self.local.train(loss_fn, inp.down, inp.replace(train=inp.train.support_view())
                                        if self.local_data == "support" else inp)
        return ClientResult(state=self.stored(params, inp), upload=params, weight=inp.train.count,
                            metrics={"train_loss": loss})


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvg(FedAvgBase):
    """FedAvg, each client scored with the global model or (``eval_model='stored'``) its own latest model."""

    name = "fedavg"
    summary = "FedAvg: local SGD, weighted model averaging, server learning rate (McMahan et al. 2017)"
    eval_model: Literal["global", "stored"] = option(
        "global", "'global' scores every client with the global model, 'stored' with its own model after its "
                  "latest training")

    def init(self, ctx):
        server, _ = super().init(ctx)
        clients = {"params": tree.broadcast_clients(server["params"], ctx.num_clients)} \
            if self.eval_model == "stored" else {}
        return server, clients

    def stored(self, params, inp: ClientInput):
        return {"params": params} if self.eval_model == "stored" else inp.state

    def personal_params(self, inp: ClientInput):
        return inp.state["params"] if self.eval_model == "stored" else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProx(FedAvg):
    """FedAvg whose local objective is f_i(w) + (μ/2)‖w − w_t‖² (Li et al. 2020, Eq. 2); μ = 0 is FedAvg."""

    name = "fedprox"
    summary = "FedProx: FedAvg with a proximal term (mu/2)||w - w_t||^2 in every local objective (Li et al. 2020)"
    mu: float = option(0.01, "μ of the proximal term (μ/2)‖w − w_t‖² in every local objective (0: FedAvg)",
                       at_least(0))

    def local_loss(self, model, params, batch, anchor):
        return model.loss(params, batch) + prox.proximal_penalty(params, anchor, self.mu)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgFT(FedAvgBase):
    """FedAvg; client i is evaluated with the global model after ``finetune_steps`` local SGD steps on its own
    train split (at the client learning rate of round 0, batch ``batch_size``)."""

    name = "fedavg_ft"
    summary = "FedAvg-FT: FedAvg, then k local fine-tuning steps before personalized evaluation"
    finetune_steps: int = option(5, "local SGD steps fine-tuning the global model before a client is scored",
                                 at_least(0))
    finetune_lr: float | None = option(None, "learning rate of the evaluation's fine-tuning steps (null: the "
                                             "round-0 client lr)", greater_than(0))

    def personal_params(self, inp: ClientInput):
        """The global model after ``finetune_steps`` steps at ``finetune_lr`` (default: the round-0 client lr) on
        the client's support set (its whole train split when the data declares none)."""
        local = self.local
        plan = BatchPlan(batch_size=local.batch_size, steps=self.finetune_steps)
        lr = local.lr_at(0) if self.finetune_lr is None else self.finetune_lr
        params, _ = local.train(inp.model.loss, inp.down, inp.replace(train=inp.train.support_view()), plan=plan,
                                lr=lr)
        return params


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedLP(FedAvgFT):
    """FedAvg-FT from θ^0 = θ_p, the server's pretrained model of the run's own architecture (``server.pretrained:
    same``); AugFL spec §8."""

    name = "fedlp"
    summary = "FedLP: FedAvg-FT started from the server's same-architecture pretrained model (Nguyen et al.)"
    generic = False  # needs a server with a pretrained model

    def init(self, ctx):
        pm = None if ctx.server is None else ctx.server.pm_params
        if pm is None or jax.tree.map(jnp.shape, pm) != jax.tree.map(jnp.shape, ctx.model.init(self.init_key(ctx))):
            raise ConfigError("fedlp starts from the server's pretrained model of the run's own architecture: set "
                              "server.pretrained: same (with a split that gives the server a set, e.g. "
                              "data.partition: meta_pairs).")
        server, clients = super().init(ctx)
        return {**server, "params": pm, "opt_state": self.server_optimizer().init(pm)}, clients
