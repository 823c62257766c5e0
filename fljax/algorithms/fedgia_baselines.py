"""The baselines of FedGiA's Table IV on regression problems (spec §6): FedAvg with full-gradient local steps,
FedProx and FedPD (oracle choice I, option I).

Shared settings: x_i⁰ = 0; every client works at every local step; an unweighted mean aggregates after every k0
local steps; metrics, tolerance and CR as for FedGiA (:mod:`regression_driver`), measured at the aggregate; at most
``max_rounds`` = 1000 rounds. Step size γ_k(a) = a/log₂(k + 2) with k the 0-based global local-step counter
(decision D17), shared by the inner GD iterations of a step.

* FedAvg: local step x_i ← x_i − γ_k ∇f_i(x_i); aggregation x = mean_i x_i, x_i ← x.
* FedProx: local step = ``iters`` GD iterations y ← y − γ_k[∇f_i(y) + μ(y − x)] from y = x_i, then x_i ← y;
  aggregation as FedAvg.
* FedPD: local step = ``iters`` GD iterations y ← y − γ_k[∇f_i(y) + λ_i + (y − x0_i)/η] from y = x_i, then x_i ← y,
  λ_i ← λ_i + (x_i − x0_i)/η, x0_i ← x_i + ηλ_i; aggregation x0 = mean_i x0_i, x0_i ← x0.

Paper settings (None → these): FedAvg a = 0.01 (V.1), FedProx a = 0.001 (V.1), FedPD a = 0.05 and η = 1 (V.1);
a = 0.5d/m and η = max{400, d/50} for the logistic examples. Where the paper is silent the project's choices are
D16–D19; every alternative is an option: ``local_scale`` ("1" or "1/m": the local objective f_i or f_i/m),
``agg`` ("mean" or "data_weighted"), ``lr_index`` ("global", "inner": restart per local step, "round"),
``iters`` (inner GD iterations), FedPD's ``agg_prob`` (None: aggregate every k0 steps; p: FedPD's random
aggregation, a Geometric(p) number of local steps per round).
"""
from __future__ import annotations

from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.algorithms.regression_driver import Method
from fljax.problems.regression import LeastSquares, map_blocks

__all__ = ["FedAvgGD", "FedProxGD", "FedPD", "BASELINES", "step_size"]


def step_size(a, k):
    """γ_k(a) = a/log₂(k + 2) (§V-D)."""
    return a / jnp.log2(k + 2.0)


def _total_rows(data):
    return sum(jnp.sum(blk.d) for blk in data.blocks)


@flax.struct.dataclass
class _Baseline(Method):
    """Shared fields: ``a`` (None → the paper's value), ``iters`` (inner GD iterations of FedProx/FedPD) and the
    static options of the module docstring."""

    a: Any = None
    iters: int = flax.struct.field(pytree_node=False, default=5)
    local_scale: str = flax.struct.field(pytree_node=False, default="1")
    agg: str = flax.struct.field(pytree_node=False, default="mean")
    lr_index: str = flax.struct.field(pytree_node=False, default="global")
    max_rounds: int = flax.struct.field(pytree_node=False, default=1000)

    label: ClassVar[str] = "baseline"
    paper_a_v1: ClassVar[float] = 0.01

    def validate(self) -> None:
        super().validate()
        choices = {"local_scale": ("1", "1/m"), "agg": ("mean", "data_weighted"),
                   "lr_index": ("global", "inner", "round")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{self.label} {key} must be one of {allowed}, got {getattr(self, key)!r}.")
        if self.max_rounds < 1 or self.iters < 1:
            raise ValueError(f"{self.label} max_rounds and iters must be positive, got {self.max_rounds}, "
                             f"{self.iters}.")

    # ------------------------------------------------------------------ settings
    def scale_a(self, data):
        """a of γ_k(a): the field, else the paper's (the V.1 value for least squares, 0.5·d/m otherwise)."""
        if self.a is not None:
            return self.a
        if isinstance(self.loss, LeastSquares):
            return self.paper_a_v1
        return 0.5 * _total_rows(data) / data.num_clients

    def gamma(self, a, k, inner, s):
        """γ at local step k, inner iteration ``inner``, round s, indexed per ``lr_index`` (D17)."""
        return step_size(a, {"global": k, "inner": inner, "round": s}[self.lr_index])

    def local_grad(self, x, blk, m):
        """∇ of the local objective: f_i (default) or f_i/m (``local_scale="1/m"``, D16)."""
        g = self.loss.grad(x, blk)
        return g if self.local_scale == "1" else g / m

    def mean(self, data, v):
        """Unweighted mean over clients, or d_i-weighted (``agg="data_weighted"``, D16)."""
        if self.agg == "mean":
            return tree.mean_clients(v)
        return tree.weighted_mean_clients(v, jnp.concatenate([blk.d for blk in data.blocks]))

    def init(self, consts, data):
        return jnp.zeros((data.num_clients, data.dim), data.blocks[0].A.dtype)        # x_i⁰ = 0

    def aggregate(self, consts, data, state):
        return self.mean(data, state)

    def capped(self, s, k):
        return s >= self.max_rounds

    @property
    def history_length(self) -> int:
        return self.max_rounds + 1


@flax.struct.dataclass
class FedAvgGD(_Baseline):
    """FedAvg with full local gradients: k0 steps x_i ← x_i − γ_k ∇f_i(x_i) per round, from x_i = x."""

    name: ClassVar[str] = "fedavg_gd"
    label: ClassVar[str] = "FedAvg"
    paper_a_v1: ClassVar[float] = 0.01

    def client_update(self, shared, per_client):
        x, a, k_start, s, m = shared
        blk, g, _ = per_client
        # step k_start starts from x_i = x, where ∇f_i(x) = g is already known (it served the round's metrics)
        y = x - self.gamma(a, k_start, 0, s) * (g if self.local_scale == "1" else g / m)
        step = lambda j, y: y - self.gamma(a, k_start + j, 0, s) * self.local_grad(y, blk, m)
        return jax.lax.fori_loop(1, self.k0, step, y)

    def local(self, executor, consts, data, state, x, g, key, s, k):
        shared = (x, self.scale_a(data), k, s, data.num_clients)
        return map_blocks(executor, self.client_update, shared, data.blocks, g)


@flax.struct.dataclass
class FedProxGD(_Baseline):
    """FedProx with GD on the proximal subproblem: each local step runs ``iters`` iterations
    y ← y − γ_k[∇f_i(y) + μ(y − x)] from the current x_i (warm start, no early exit: D18); x is the last aggregate."""

    mu: Any = 1e-4

    name: ClassVar[str] = "fedprox_gd"
    label: ClassVar[str] = "FedProx"
    paper_a_v1: ClassVar[float] = 0.001

    def client_update(self, shared, per_client):
        x, a, k_start, s, m = shared
        blk, _, _ = per_client

        def local_step(j, y):
            inner = lambda i, u: u - self.gamma(a, k_start + j, i, s) * (self.local_grad(u, blk, m) + self.mu * (u - x))
            return jax.lax.fori_loop(0, self.iters, inner, y)

        return jax.lax.fori_loop(0, self.k0, local_step, x)          # x_i = x after the aggregation

    def local(self, executor, consts, data, state, x, g, key, s, k):
        shared = (x, self.scale_a(data), k, s, data.num_clients)
        return map_blocks(executor, self.client_update, shared, data.blocks)


@flax.struct.dataclass
class FedPDState:
    """FedPD's per-client primal x_i, dual λ_i and local copy x0_i of the global variable ``[m, n]``; ``steps`` the
    local steps of the last round."""

    x: jax.Array
    lam: jax.Array
    x0: jax.Array
    steps: jax.Array


@flax.struct.dataclass
class FedPD(_Baseline):
    """FedPD (Zhang et al., oracle choice I, option I): per local step, ``iters`` GD iterations with learning rate
    η1 = γ_k(a) on f_i(y) + ⟨λ_i, y − x0_i⟩ + ‖y − x0_i‖²/(2η) started at x_i, then λ_i ← λ_i + (x_i − x0_i)/η and
    x0_i ← x_i + ηλ_i. The server averages x0_i every k0 steps (the paper's deterministic variant; D19) or, with
    ``agg_prob`` = p, after a Geometric(p) number of steps (FedPD's random aggregation). Metrics are at x0."""

    eta: Any = None
    agg_prob: Any = None

    name: ClassVar[str] = "fedpd"
    label: ClassVar[str] = "FedPD"
    paper_a_v1: ClassVar[float] = 0.05

    def validate(self) -> None:
        super().validate()
        if self.agg_prob is not None and np.ndim(self.agg_prob) == 0 and not 0.0 < float(self.agg_prob) <= 1.0:
            raise ValueError(f"FedPD agg_prob must lie in (0, 1], got {self.agg_prob}.")

    def scale_eta(self, data):
        """η: the field, else the paper's (1 for V.1; max{400, d/50} for the logistic examples)."""
        if self.eta is not None:
            return self.eta
        if isinstance(self.loss, LeastSquares):
            return 1.0
        return jnp.maximum(400.0, _total_rows(data) / 50.0)

    def init(self, consts, data):
        zeros = super().init(consts, data)
        return FedPDState(x=zeros, lam=zeros, x0=zeros, steps=jnp.zeros((), jnp.int32))   # λ_i⁰ = x0_i⁰ = 0

    def aggregate(self, consts, data, state: FedPDState):
        return self.mean(data, state.x0)

    def client_update(self, shared, per_client):
        x0, a, eta, k_start, s, steps, m = shared
        blk, (x_i, lam), _ = per_client

        def local_step(j, carry):
            x_i, lam, x0_i = carry
            grad = lambda u: self.local_grad(u, blk, m) + lam + (u - x0_i) / eta
            inner = lambda i, u: u - self.gamma(a, k_start + j, i, s) * grad(u)
            x_i = jax.lax.fori_loop(0, self.iters, inner, x_i)
            lam = lam + (x_i - x0_i) / eta
            return x_i, lam, x_i + eta * lam

        return jax.lax.fori_loop(0, steps, local_step, (x_i, lam, x0))   # x0_i ← x0 after the aggregation

    def local(self, executor, consts, data, state: FedPDState, x, g, key, s, k):
        steps = (jnp.asarray(self.k0, jnp.int32) if self.agg_prob is None
                 else jax.random.geometric(key, self.agg_prob).astype(jnp.int32))
        shared = (x, self.scale_a(data), self.scale_eta(data), k, s, steps,
                  data.num_clients)
        x_i, lam, x0 = map_blocks(executor, self.client_update, shared, data.blocks, (state.x, state.lam))
        return FedPDState(x=x_i, lam=lam, x0=x0, steps=steps)

    def iterations(self, state: FedPDState):
        return state.steps


BASELINES = {cls.name: cls for cls in (FedAvgGD, FedProxGD, FedPD)}
