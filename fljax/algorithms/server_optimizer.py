"""The server optimizer of the algorithms that average one global model, as one value (FedOpt: Reddi et al. 2021,
Algorithm 2).

The server holds w_t and the optimizer's state; from the aggregate A_t of the cohort's uploads (the weighted mean
Σ_{i∈S_t} p_i w_i by default, :class:`fljax.algorithms.base.Aggregating`) it steps on the pseudo-gradient:

    Δ_t = w_t − A_t;    w_{t+1} = ServerOpt(w_t, Δ_t)

(:meth:`ServerOptimizer.step`). SGD with step 1 and no momentum is FedAvg's w_{t+1} = A_t. An algorithm holds it as a
field declared with :func:`server_optimizer` (``server: ServerOptimizer = server_optimizer()``) and takes its
options flat (``algo.server_optimizer``, ``algo.server_lr``, …); :data:`AVERAGE` is the plain mean, for an algorithm
whose server takes no step size of its own (APFL).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import optax

from fljax import tree
from fljax.errors import OptionError
from fljax.ops.fedopt import fedopt
from fljax.options import Options, at_least, greater_than, interval, nested, option

__all__ = ["ServerOptimizer", "server_optimizer", "AVERAGE"]

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

    def init(self, params) -> dict:
        """The server pytree holding w_0 = ``params``: ``{"params", "opt_state"}``."""
        return {"params": params, "opt_state": self.transform().init(params)}

    def step(self, server: dict, aggregate) -> dict:
        """w_{t+1} = ServerOpt(w_t, Δ_t) with Δ_t = w_t − A_t, A_t = ``aggregate``: the new server pytree."""
        pseudo_grad = tree.sub(server["params"], aggregate)
        updates, opt_state = self.transform().update(pseudo_grad, server["opt_state"], server["params"])
        return {"params": optax.apply_updates(server["params"], updates), "opt_state": opt_state}


AVERAGE = ServerOptimizer()  # SGD with step 1: w_{t+1} = A_t, the plain (weighted) mean


def server_optimizer(**defaults) -> "dataclasses.Field":
    """The declaration of an algorithm's server optimizer, a field holding its :class:`ServerOptimizer` value
    (``server: ServerOptimizer = server_optimizer()``): the algorithm takes every option flat under its own name
    (``algo.server_optimizer``, ``algo.server_lr``, …), with ``defaults`` in place of :class:`ServerOptimizer`'s."""
    return nested(ServerOptimizer, None, "the server optimizer on the pseudo-gradient (ServerOptimizer)", **defaults)
