"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and FedAvg with local fine-tuning.

FedAvg, one round t:
    S_t ← cohort;  every i ∈ S_t: w_i ← LocalSGD(f_i, from w_t)
    Δ_t = w_t − Σ_{i∈S_t} p_i w_i  (p_i ∝ n_i or uniform);   w_{t+1} = ServerOpt(w_t, Δ_t)
With the default server optimizer (SGD, server_lr = 1) w_{t+1} is the weighted mean of the w_i; ``server_optimizer``
adagrad, yogi or adam makes it FedAdagrad, FedYogi or FedAdam (Reddi et al. 2021, Algorithm 2; :class:`ServerOptimizer`).

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
import numpy as np
import optax

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.local_training import EVERY, local_options
from fljax.algorithms.model_state import BatchStatsOption
from fljax.data.batching import BatchPlan
from fljax.errors import ConfigError, OptionError
from fljax.ops import prox
from fljax.ops.fedopt import fedopt
from fljax.options import Options, at_least, greater_than, interval, one_of, option, type_hints, with_default

__all__ = ["ModelAveraging", "ServerOptimizer", "ServerOpt", "SERVER_OPTIONS", "FedAvgBase", "FedAvg", "FedProx", "FedAvgFT", "FedLP"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelAveraging(Aggregating):
    """The FedAvg server, for the algorithms that average one global model: w_{t+1} = ServerOpt(w_t, Δ_t) with the
    pseudo-gradient Δ_t = w_t − A_t, A_t the aggregate of the uploads (by default the weighted mean
    Σ_{i∈S_t} p_i w_i; the run's aggregator, :class:`~fljax.algorithms.base.Aggregating`). Here the server optimizer
    is SGD with step 1, so w_{t+1} = A_t; :class:`ServerOpt` makes it the user's (:class:`ServerOptimizer`)."""

    def server_transform(self) -> optax.GradientTransformation:
        """The server optimizer, an optax transformation of the pseudo-gradient."""
        return optax.sgd(1.0)

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        return {"params": params, "opt_state": self.server_transform().init(params)}, {}

    def server_step(self, ctx, server, aggregate):
        pseudo_grad = tree.sub(server["params"], aggregate)
        updates, opt_state = self.server_transform().update(pseudo_grad, server["opt_state"], server["params"])
        return {"params": optax.apply_updates(server["params"], updates), "opt_state": opt_state}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared


_ADAPTIVE = ("server_beta1", "server_beta2", "server_eps", "server_initial_accumulator")


@dataclasses.dataclass(frozen=True)
class ServerOptimizer(Options):
    """The server optimizer on the pseudo-gradient, as one value (FedOpt: Reddi et al. 2021, Algorithm 2):

    * ``sgd``: w ← w − η·Δ_t with ``server_momentum`` μ (optax.sgd: b ← μ·b + Δ_t, w ← w − η·b); η = 1, μ = 0 is
      FedAvg's weighted mean;
    * ``adagrad``, ``yogi``, ``adam``: FedAdagrad, FedYogi, FedAdam (:mod:`fljax.ops.fedopt`): m_t = β₁m + (1 − β₁)Δ_t;
      v_t from Δ_t² by each rule; w ← w − η·m_t/(√v_t + τ), v_{−1} = ``server_initial_accumulator``.

    The adaptive options left null take Algorithm 2's defaults (β₁ = 0.9, β₂ = 0.99, τ = 10⁻³, v_{−1} = τ²); an
    option the chosen optimizer does not use is refused."""

    server_optimizer: Literal["sgd", "adagrad", "yogi", "adam"] = option(
        "sgd", "server optimizer on the pseudo-gradient: sgd (FedAvg, FedAvgM), or adagrad, yogi, adam (FedAdagrad, "
               "FedYogi, FedAdam: Reddi et al. 2021, Algorithm 2)")
    server_lr: float = option(1.0, "server learning rate η of w ← w − η·(step) (sgd with 1: the weighted mean)",
                              greater_than(0))
    server_momentum: float = option(0.0, "sgd: server momentum on the pseudo-gradient (0: none)", at_least(0))
    server_beta1: float | None = option(None, "adagrad/yogi/adam: β₁ of the first moment m_t (null: 0.9)",
                                        interval(0, 1, "[)"))
    server_beta2: float | None = option(None, "yogi/adam: β₂ of the second moment v_t (null: 0.99)",
                                        interval(0, 1, "[)"))
    server_eps: float | None = option(None, "adagrad/yogi/adam: τ in w ← w − η·m_t/(√v_t + τ) (null: 1e-3)",
                                      greater_than(0))
    server_initial_accumulator: float | None = option(None, "adagrad/yogi/adam: v_{-1}, the second moment's start "
                                                            "(null: τ²)", at_least(0))
    server_bias_correction: bool = option(False, "yogi/adam: divide m_t by 1 − β₁^t and v_t by 1 − β₂^t (Adam's "
                                                 "correction, as optax and Keras do; Algorithm 2 has none)")

    def check(self) -> None:
        kind = self.server_optimizer
        if kind == "sgd":
            unused = [n for n in _ADAPTIVE if getattr(self, n) is not None]
            if unused or self.server_bias_correction:
                raise OptionError((unused or ["server_bias_correction"])[0],
                                  "is an option of the adaptive server optimizers (adagrad, yogi, adam), not of "
                                  "server_optimizer 'sgd'; remove it or choose one of them.")
            return
        if self.server_momentum:
            raise OptionError("server_momentum", f"is sgd's; server_optimizer {kind!r} takes server_beta1 for its "
                                                 f"momentum.")
        if kind == "adagrad" and (self.server_beta2 is not None or self.server_bias_correction):
            raise OptionError("server_beta2" if self.server_beta2 is not None else "server_bias_correction",
                              "is not used by server_optimizer 'adagrad' (v_t sums every Δ_t²); remove it.")

    def transform(self) -> optax.GradientTransformation:
        """The optax transformation of the pseudo-gradient."""
        if self.server_optimizer == "sgd":
            return optax.sgd(self.server_lr, momentum=self.server_momentum or None)
        pick = lambda value, default: default if value is None else value  # noqa: E731
        return fedopt(self.server_optimizer, self.server_lr, pick(self.server_beta1, 0.9),
                      pick(self.server_beta2, 0.99), pick(self.server_eps, 1e-3), self.server_initial_accumulator,
                      self.server_bias_correction)


SERVER_OPTIONS = tuple(f.name for f in dataclasses.fields(ServerOptimizer))


def _server_options() -> type:
    """A :class:`ModelAveraging` base declaring the options of :class:`ServerOptimizer` (their declarations there)."""
    hints = type_hints(ServerOptimizer)
    fields = [(f.name, hints[f.name], with_default(ServerOptimizer, f.name, f.default))
              for f in dataclasses.fields(ServerOptimizer)]
    return dataclasses.make_dataclass("ServerOptions", fields, bases=(ModelAveraging,), frozen=True, kw_only=True,
                                      namespace={"__module__": __name__})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerOpt(_server_options()):
    """:class:`ModelAveraging` with the user's server optimizer: the options of :class:`ServerOptimizer`, flat
    (``algo.server_optimizer``, ``algo.server_lr``, …), and :attr:`fedopt`, the value built from them."""

    @property
    def fedopt(self) -> ServerOptimizer:
        return ServerOptimizer(**{name: getattr(self, name) for name in SERVER_OPTIONS})

    def check(self) -> None:
        super().check()
        self.fedopt  # noqa: B018 (builds the value: the checks across the server options)

    def server_transform(self) -> optax.GradientTransformation:
        return self.fedopt.transform()


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgBase(BatchStatsOption, ServerOpt, local_options(*EVERY)):
    """FedAvg's round: every client of the cohort runs its local training (:class:`~fljax.algorithms.
    local_training.LocalTraining`) from w_t on its ``local_data``; the server steps on the pseudo-gradient
    (:class:`ServerOpt`) of the mean weighted by ``weighting``: n_i samples (McMahan et al.; FedJAX), the client's
    target tokens (TFF and Reddi et al. on Stack Overflow: :meth:`fljax.data.ClientArrays.tokens`) or uniform. What a client is scored with is the subclass's."""

    local_data: Literal["all", "support"] = option(
        "all", "'all' trains on the client's whole train split, 'support' on its support set only")
    weighting: str = option("samples", "aggregation weights: 'samples' (n_i), 'tokens' (the client's non-padding "
                                       "train targets: TFF's and Reddi et al.'s weighting of next-token data) or "
                                       "'uniform'", one_of(("samples", "tokens", "uniform")))
    private_steps = True  # its clients train only through LocalTraining.train: DP-SGD applies

    def client_weights(self, train) -> list[float]:
        """Every client's aggregation weight p_k: n_k, its target tokens (``weighting='tokens'``) or 1."""
        if self.weighting == "tokens":
            return [float(t) for t in np.asarray(train.tokens())]
        return super().client_weights(train)

    def local_loss(self, model, params, batch, variables, key, anchor):
        """The local objective f_i on ``batch`` in the model's training mode, with the model's ``variables`` and
        dropout ``key``: (loss, the updated variables) (:meth:`fljax.models.Model.train_loss`; FedProx overrides
        it)."""
        return model.train_loss(params, batch, variables, key)

    def stored(self, params, inp: ClientInput):
        """The client's state after its local training gave ``params`` (default: unchanged)."""
        return inp.state

    def client_update(self, inp: ClientInput) -> ClientResult:
        loss_fn = functools.partial(self.local_loss, inp.model, anchor=inp.down)
        params, variables, loss = self.local.train_with_state(
            loss_fn, inp.down, inp.replace(train=inp.train.support_view()) if self.local_data == "support" else inp)
        weight = inp.train.tokens() if self.weighting == "tokens" else inp.train.count
        return ClientResult(state=self.stored(params, inp), upload=params, weight=weight,
                            metrics={"train_loss": loss}, variables=variables)


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

    def local_loss(self, model, params, batch, variables, key, anchor):
        loss, variables = model.train_loss(params, batch, variables, key)
        return loss + prox.proximal_penalty(params, anchor, self.mu), variables


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

    def personal_model(self, inp: ClientInput):
        """The global model after ``finetune_steps`` steps at ``finetune_lr`` (default: the round-0 client lr) on
        the client's support set (its whole train split when the data declares none), with the model variables
        those steps trained (a BatchNorm model's statistics, from the client's ``inp.variables``)."""
        local = self.local
        plan = BatchPlan(batch_size=local.batch_size, steps=self.finetune_steps)
        lr = local.lr_at(0) if self.finetune_lr is None else self.finetune_lr
        params, variables, _ = local.train_with_state(inp.model.train_loss, inp.down,
                                                      inp.replace(train=inp.train.support_view()), plan=plan, lr=lr)
        return params, (inp.variables if variables is None else variables)

    def personal_params(self, inp: ClientInput):
        return self.personal_model(inp)[0]


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
        return {**server, "params": pm, "opt_state": self.server_transform().init(pm)}, clients
