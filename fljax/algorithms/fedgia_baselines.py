"""The baselines of FedGiA's Table IV on consensus regression (spec §6): FedAvg with full-gradient local steps,
FedProx and FedPD (oracle choice I, option I).

Shared settings: x_i⁰ = 0; every client works at every local step; an unweighted mean aggregates after every k0
local steps; the round's metrics are f, Error and ‖∇f‖² at the aggregate (:mod:`fljax.algorithms.regression`), so
the same stopping rule as FedGiA applies (at most 1000 rounds in Table IV). Step size γ_k(a) = a/log₂(k + 2) with k
the 0-based global local-step counter (decision D17), shared by the inner GD iterations of a step; the server keeps
the uploads and counts k, and broadcasts the aggregate and k (:class:`Broadcast`). One round, every client i::

    FedAvg:  x ← mean_i x_i;  x_i ← x;  k0 times: x_i ← x_i − γ_k ∇f_i(x_i);  upload x_i
    FedProx: x ← mean_i x_i;  x_i ← x;  k0 times: ``iters`` times y ← y − γ_k[∇f_i(y) + μ(y − x)] from y = x_i
    FedPD:   x0 ← mean_i x0_i;  x0_i ← x0;  k0 times (or a Geometric(p) number with ``agg_prob`` = p):
               x_i ← ``iters`` times y ← y − γ_k[∇f_i(y) + λ_i + (y − x0_i)/η] from y = x_i
               λ_i ← λ_i + (x_i − x0_i)/η;  x0_i ← x_i + ηλ_i;  upload x0_i

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
from fljax.algorithms.families import CONSENSUS_REGRESSION
from fljax.algorithms.registry import register
from fljax.algorithms.regression import ConsensusRegression, total_rows
from fljax.engine.context import SAMPLE
from fljax.engine.protocol import ClientInput, ClientResult
from fljax.ops import admm
from fljax.options import at_least, greater_than, interval, option
from fljax.problems.regression import LeastSquares

__all__ = ["FedAvgGD", "FedProxGD", "FedPD", "FedPDClients", "Server", "Broadcast", "BASELINES", "step_size"]


def step_size(a, k):
    """γ_k(a) = a/log₂(k + 2) (§V-D)."""
    return a / jnp.log2(k + 2.0)


@flax.struct.dataclass
class Server:
    """The clients' last uploads (``uploads [m, n]``: x_i, FedPD's x0_i) and the local-step counter ``k``."""

    uploads: jax.Array
    k: jax.Array


@flax.struct.dataclass
class Broadcast:
    """What the server sends every client: the aggregate ``x``, the step-size scale ``a``, the local-step counter
    ``k`` at the round's start, the ``round`` s, the round's number of local ``steps``, FedPD's ``eta`` (None for the
    others) and the number of clients ``m`` (static)."""

    x: jax.Array
    a: jax.Array
    k: jax.Array
    round: jax.Array
    steps: jax.Array
    eta: jax.Array | None = None
    m: int = flax.struct.field(pytree_node=False, default=1)


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

    def aggregate(self, data, server: Server):
        """Unweighted mean of the uploads over the clients, or d_i-weighted (``agg="data_weighted"``, D16)."""
        if self.agg == "mean":
            return tree.mean_clients(server.uploads)
        return tree.weighted_mean_clients(server.uploads, jnp.concatenate([blk.d for blk in data.blocks]))

    def init_server(self, ctx):
        return Server(uploads=self.origin(ctx, ctx.num_clients), k=jnp.zeros((), jnp.int32))          # x_i⁰ = 0

    def round_steps(self, ctx):
        """The round's local steps: k0."""
        return jnp.asarray(self.k0, jnp.int32)

    def broadcast(self, ctx, server: Server) -> Broadcast:
        return Broadcast(x=self.aggregate(ctx.data, server), a=self.scale_a(ctx.data), k=server.k, round=ctx.round,
                         steps=self.round_steps(ctx), m=ctx.num_clients)

    def local_steps(self, down: Broadcast):
        return down.steps

    def server_update(self, server: Server, down: Broadcast, result: ClientResult) -> Server:
        return Server(uploads=result.upload, k=server.k + down.steps)


@register("fedavg_gd", family=CONSENSUS_REGRESSION, example=None,
          summary="FedAvg with full local gradients on consensus regression (FedGiA's Table IV baseline)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedAvgGD(_Baseline):
    """FedAvg with full local gradients: k0 steps x_i ← x_i − γ_k ∇f_i(x_i) per round, from x_i = x."""

    paper_a_v1: ClassVar[float] = 0.01

    def client_update(self, inp: ClientInput) -> ClientResult:
        d, blk = inp.down, inp.train
        f, g = self.loss.value_and_grad(d.x, blk)
        # step k from x_i = x, where ∇f_i(x) = g is already known (it serves the round's metrics)
        y = d.x - self.gamma(d.a, d.k, 0, d.round) * (g if self.local_scale == "1" else g / d.m)
        step = lambda j, y: y - self.gamma(d.a, d.k + j, 0, d.round) * self.local_grad(y, blk, d.m)
        return self.measured(f, g, None, upload=jax.lax.fori_loop(1, self.k0, step, y))


@register("fedprox_gd", family=CONSENSUS_REGRESSION, example=None,
          summary="FedProx with GD on the proximal subproblem, consensus regression (FedGiA's Table IV "
                  "baseline)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProxGD(_Baseline):
    """FedProx with GD on the proximal subproblem: each local step runs ``iters`` iterations
    y ← y − γ_k[∇f_i(y) + μ(y − x)] from the current x_i (warm start, no early exit: D18); x is the last aggregate.
    ``mu`` may be traced."""

    paper_a_v1: ClassVar[float] = 0.001
    mu: float = option(1e-4, "μ of the proximal term (μ/2)‖y − x‖²", at_least(0))

    def client_update(self, inp: ClientInput) -> ClientResult:
        d, blk = inp.down, inp.train
        f, g = self.loss.value_and_grad(d.x, blk)

        def local_step(j, y):
            grad = lambda u: self.local_grad(u, blk, d.m) + admm.augmented_lagrangian_grad(u, d.x, sigma=self.mu)
            inner = lambda i, u: u - self.gamma(d.a, d.k + j, i, d.round) * grad(u)
            return jax.lax.fori_loop(0, self.iters, inner, y)

        x_i = jax.lax.fori_loop(0, self.k0, local_step, d.x)          # x_i = x after the aggregation
        return self.measured(f, g, None, upload=x_i)


@flax.struct.dataclass
class FedPDClients:
    """FedPD's per-client primal x_i and dual λ_i (its local copy x0_i of the global variable is its upload)."""

    x: jax.Array
    lam: jax.Array


@register("fedpd", family=CONSENSUS_REGRESSION, example=None,
          summary="FedPD (oracle I, option I) on consensus regression (FedGiA's Table IV baseline)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedPD(_Baseline):
    """FedPD (Zhang et al., oracle choice I, option I): per local step, ``iters`` GD iterations with learning rate
    η1 = γ_k(a) on f_i(y) + ⟨λ_i, y − x0_i⟩ + ‖y − x0_i‖²/(2η) started at x_i, then λ_i ← λ_i + (x_i − x0_i)/η and
    x0_i ← x_i + ηλ_i. The server averages x0_i every k0 steps (the paper's deterministic variant; D19) or, with
    ``agg_prob`` = p, after a Geometric(p) number of steps (FedPD's random aggregation). Metrics are at x0.
    ``eta`` (None → the paper's) and ``agg_prob`` may be traced."""

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

    def init_client(self, inp: ClientInput) -> FedPDClients:
        zeros = jnp.zeros_like(inp.down)
        return FedPDClients(x=zeros, lam=zeros)                                              # λ_i⁰ = x0_i⁰ = 0

    def round_steps(self, ctx):
        """k0, or with ``agg_prob`` = p a Geometric(p) draw from the round's SAMPLE stream."""
        if self.agg_prob is None:
            return jnp.asarray(self.k0, jnp.int32)
        return jax.random.geometric(ctx.stream(SAMPLE), self.agg_prob).astype(jnp.int32)

    def broadcast(self, ctx, server: Server) -> Broadcast:
        return super().broadcast(ctx, server).replace(eta=self.scale_eta(ctx.data))

    def client_update(self, inp: ClientInput) -> ClientResult:
        d, blk, own = inp.down, inp.train, inp.state
        f, g = self.loss.value_and_grad(d.x, blk)                                          # at x0, the aggregate

        def local_step(j, carry):
            x_i, lam, x0_i = carry
            grad = lambda u: self.local_grad(u, blk, d.m) + admm.augmented_lagrangian_grad(u, x0_i, lam, eta=d.eta)
            inner = lambda i, u: u - self.gamma(d.a, d.k + j, i, d.round) * grad(u)
            x_i = jax.lax.fori_loop(0, self.iters, inner, x_i)
            lam = admm.dual_ascent(lam, x_i, x0_i, eta=d.eta)                       # λ_i ← λ_i + (x_i − x0_i)/η
            return x_i, lam, x_i + d.eta * lam                                        # x0_i ← x_i + ηλ_i

        x_i, lam, x0_i = jax.lax.fori_loop(0, d.steps, local_step, (own.x, own.lam, d.x))   # x0_i ← x0 first
        return self.measured(f, g, FedPDClients(x=x_i, lam=lam), upload=x0_i)


BASELINES = {cls.name: cls for cls in (FedAvgGD, FedProxGD, FedPD)}
