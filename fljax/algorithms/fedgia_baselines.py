"""The baselines of FedGiA's Table IV on consensus regression (spec §6): FedAvg with full-gradient local steps,
FedProx and FedPD (oracle choice I, option I).

Shared settings: x_i⁰ = 0; every client works at every local step; an unweighted mean aggregates after every k0
local steps; the round's metrics are f, Error and ‖∇f‖² at the aggregate (:mod:`fljax.algorithms.regression`), so
the same stopping rule as FedGiA applies (at most 1000 rounds in Table IV). Step size γ_k(a) = a/log₂(k + 2) with k
the 0-based global local-step counter (decision D17), shared by the inner GD iterations of a step; the server
state counts k. One round, every client i::

    FedAvg:  x ← mean_i x_i;  x_i ← x;  k0 times: x_i ← x_i − γ_k ∇f_i(x_i)
    FedProx: x ← mean_i x_i;  x_i ← x;  k0 times: ``iters`` times y ← y − γ_k[∇f_i(y) + μ(y − x)] from y = x_i
    FedPD:   x0 ← mean_i x0_i;  x0_i ← x0;  k0 times (or a Geometric(p) number with ``agg_prob`` = p):
               x_i ← ``iters`` times y ← y − γ_k[∇f_i(y) + λ_i + (y − x0_i)/η] from y = x_i
               λ_i ← λ_i + (x_i − x0_i)/η;  x0_i ← x_i + ηλ_i

FedProx's μ(y − x) is :func:`fljax.ops.admm.augmented_lagrangian_grad` without a dual; FedPD's λ_i + (y − x0_i)/η is
:func:`fljax.ops.admm.augmented_lagrangian_grad` and its dual step :func:`fljax.ops.admm.dual_ascent`.

Paper settings (None → these): FedAvg a = 0.01 (V.1), FedProx a = 0.001 (V.1), FedPD a = 0.05 and η = 1 (V.1);
a = 0.5d/m and η = max{400, d/50} for the logistic examples. Where the paper is silent the project's choices are
D16–D19; every alternative is an option: ``local_scale`` ("1" or "1/m": the local objective f_i or f_i/m),
``agg`` ("mean" or "data_weighted"), ``lr_index`` ("global", "inner": restart per local step, "round"),
``iters`` (inner GD iterations), FedPD's ``agg_prob`` (None: aggregate every k0 steps; p: FedPD's random
aggregation, a Geometric(p) number of local steps per round, drawn from the round's SAMPLE stream).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.regression import ConsensusRegression, total_rows
from fljax.engine.context import SAMPLE
from fljax.ops import admm
from fljax.options import at_least, greater_than, interval, option
from fljax.problems.regression import LeastSquares

__all__ = ["FedAvgGD", "FedProxGD", "FedPD", "FedPDClients", "BASELINES", "step_size"]


def step_size(a, k):
    """γ_k(a) = a/log₂(k + 2) (§V-D)."""
    return a / jnp.log2(k + 2.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Baseline(ConsensusRegression):
    """Shared fields: ``a`` (None → the paper's value; may be traced), ``iters`` (inner GD iterations of FedProx
    and FedPD) and the static options of the module docstring. The server state is the local-step counter k."""

    a: float | None = option(None, "a of the step size γ_k = a/log₂(k + 2) (null: the paper's)", greater_than(0))
    iters: int = option(5, "inner GD iterations per local step (FedProx, FedPD)", at_least(1))
    local_scale: Literal["1", "1/m"] = option("1", "local objective: '1' (f_i) or '1/m' (f_i/m)")
    agg: Literal["mean", "data_weighted"] = option("mean", "aggregation: 'mean' (unweighted) or 'data_weighted'")
    lr_index: Literal["global", "inner", "round"] = option(
        "global", "k of γ_k: 'global' step counter, 'inner' (restart every local step) or 'round'")

    paper_a_v1: ClassVar[float] = 0.01

    # ------------------------------------------------------------------ settings
    def scale_a(self, data):
        """a of γ_k(a): the field, else the paper's (the V.1 value for least squares, 0.5·d/m otherwise)."""
        if self.a is not None:
            return self.a
        if isinstance(self.loss, LeastSquares):
            return self.paper_a_v1
        return 0.5 * total_rows(data) / data.num_clients

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

    def init(self, ctx):
        zeros = jnp.zeros((ctx.num_clients, ctx.data.dim), ctx.data.blocks[0].A.dtype)          # x_i⁰ = 0
        return {"k": jnp.zeros((), jnp.int32)}, self.init_clients(zeros)

    def init_clients(self, zeros):
        return zeros

    def aggregate(self, data, server, clients):
        return self.mean(data, clients)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgGD(_Baseline):
    """FedAvg with full local gradients: k0 steps x_i ← x_i − γ_k ∇f_i(x_i) per round, from x_i = x."""

    name: ClassVar[str] = "fedavg_gd"
    summary: ClassVar[str] = "FedAvg with full local gradients on consensus regression (FedGiA's Table IV baseline)"
    paper_a_v1: ClassVar[float] = 0.01

    def client_update(self, shared, per_client):
        x, a, k_start, s, m = shared
        blk, g, _ = per_client
        # step k_start starts from x_i = x, where ∇f_i(x) = g is already known (it served the round's metrics)
        y = x - self.gamma(a, k_start, 0, s) * (g if self.local_scale == "1" else g / m)
        step = lambda j, y: y - self.gamma(a, k_start + j, 0, s) * self.local_grad(y, blk, m)
        return jax.lax.fori_loop(1, self.k0, step, y)

    def round(self, ctx, server, clients):
        m = ctx.num_clients
        x = self.aggregate(ctx.data, server, clients)
        f, g = self.measure(ctx, x)
        shared = (x, self.scale_a(ctx.data), server["k"], ctx.round, m)
        x_i = ctx.map_groups(self.client_update, shared, ctx.data.blocks, g)
        return {"k": server["k"] + self.k0}, x_i, self.round_metrics(f, g, m, self.k0, up=x_i, down=x)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProxGD(_Baseline):
    """FedProx with GD on the proximal subproblem: each local step runs ``iters`` iterations
    y ← y − γ_k[∇f_i(y) + μ(y − x)] from the current x_i (warm start, no early exit: D18); x is the last aggregate.
    ``mu`` may be traced."""

    name: ClassVar[str] = "fedprox_gd"
    summary: ClassVar[str] = ("FedProx with GD on the proximal subproblem, consensus regression (FedGiA's Table IV "
                              "baseline)")
    paper_a_v1: ClassVar[float] = 0.001
    mu: float = option(1e-4, "μ of the proximal term (μ/2)‖y − x‖²", at_least(0))

    def client_update(self, shared, per_client):
        x, a, k_start, s, m = shared
        blk, _, _ = per_client

        def local_step(j, y):
            grad = lambda u: self.local_grad(u, blk, m) + admm.augmented_lagrangian_grad(u, x, sigma=self.mu)
            inner = lambda i, u: u - self.gamma(a, k_start + j, i, s) * grad(u)
            return jax.lax.fori_loop(0, self.iters, inner, y)

        return jax.lax.fori_loop(0, self.k0, local_step, x)          # x_i = x after the aggregation

    def round(self, ctx, server, clients):
        m = ctx.num_clients
        x = self.aggregate(ctx.data, server, clients)
        f, g = self.measure(ctx, x)
        x_i = ctx.map_groups(self.client_update, (x, self.scale_a(ctx.data), server["k"], ctx.round, m),
                             ctx.data.blocks)
        return {"k": server["k"] + self.k0}, x_i, self.round_metrics(f, g, m, self.k0, up=x_i, down=x)


@flax.struct.dataclass
class FedPDClients:
    """FedPD's per-client primal x_i, dual λ_i and local copy x0_i of the global variable ``[m, n]``."""

    x: jax.Array
    lam: jax.Array
    x0: jax.Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedPD(_Baseline):
    """FedPD (Zhang et al., oracle choice I, option I): per local step, ``iters`` GD iterations with learning rate
    η1 = γ_k(a) on f_i(y) + ⟨λ_i, y − x0_i⟩ + ‖y − x0_i‖²/(2η) started at x_i, then λ_i ← λ_i + (x_i − x0_i)/η and
    x0_i ← x_i + ηλ_i. The server averages x0_i every k0 steps (the paper's deterministic variant; D19) or, with
    ``agg_prob`` = p, after a Geometric(p) number of steps (FedPD's random aggregation). Metrics are at x0.
    ``eta`` (None → the paper's) and ``agg_prob`` may be traced."""

    name: ClassVar[str] = "fedpd"
    summary: ClassVar[str] = "FedPD (oracle I, option I) on consensus regression (FedGiA's Table IV baseline)"
    paper_a_v1: ClassVar[float] = 0.05
    eta: float | None = option(None, "η of the augmented Lagrangian ‖y − x0_i‖²/(2η) (null: the paper's)",
                               greater_than(0))
    agg_prob: float | None = option(None, "p of FedPD's random aggregation after a Geometric(p) number of steps "
                                          "(null: every k0 steps)", interval(0, 1, "(]"))

    def scale_eta(self, data):
        """η: the field, else the paper's (1 for V.1; max{400, d/50} for the logistic examples)."""
        if self.eta is not None:
            return self.eta
        if isinstance(self.loss, LeastSquares):
            return 1.0
        return jnp.maximum(400.0, total_rows(data) / 50.0)

    def init_clients(self, zeros):
        return FedPDClients(x=zeros, lam=zeros, x0=zeros)                                   # λ_i⁰ = x0_i⁰ = 0

    def aggregate(self, data, server, clients: FedPDClients):
        return self.mean(data, clients.x0)

    def client_update(self, shared, per_client):
        x0, a, eta, k_start, s, steps, m = shared
        blk, (x_i, lam), _ = per_client

        def local_step(j, carry):
            x_i, lam, x0_i = carry
            grad = lambda u: self.local_grad(u, blk, m) + admm.augmented_lagrangian_grad(u, x0_i, lam, eta=eta)
            inner = lambda i, u: u - self.gamma(a, k_start + j, i, s) * grad(u)
            x_i = jax.lax.fori_loop(0, self.iters, inner, x_i)
            lam = admm.dual_ascent(lam, x_i, x0_i, eta=eta)                          # λ_i ← λ_i + (x_i − x0_i)/η
            return x_i, lam, x_i + eta * lam                                          # x0_i ← x_i + ηλ_i

        return jax.lax.fori_loop(0, steps, local_step, (x_i, lam, x0))   # x0_i ← x0 after the aggregation

    def round(self, ctx, server, clients: FedPDClients):
        m = ctx.num_clients
        x0 = self.aggregate(ctx.data, server, clients)
        f, g = self.measure(ctx, x0)
        steps = (jnp.asarray(self.k0, jnp.int32) if self.agg_prob is None
                 else jax.random.geometric(ctx.stream(SAMPLE), self.agg_prob).astype(jnp.int32))
        shared = (x0, self.scale_a(ctx.data), self.scale_eta(ctx.data), server["k"], ctx.round, steps, m)
        x_i, lam, x0_i = ctx.map_groups(self.client_update, shared, ctx.data.blocks, (clients.x, clients.lam))
        return ({"k": server["k"] + steps}, FedPDClients(x=x_i, lam=lam, x0=x0_i),
                self.round_metrics(f, g, m, steps, up=x0_i, down=x0))


BASELINES = {cls.name: cls for cls in (FedAvgGD, FedProxGD, FedPD)}
