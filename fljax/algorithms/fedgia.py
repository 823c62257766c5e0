"""FedGiA (Zhou & Li, "FedGiA: An Efficient Hybrid Algorithm for Federated Learning"), Algorithm 1 in round form.

Consensus problem (6) with the augmented Lagrangian (7), σ = r0·t·r/m, ḡ_i = ∇f_i(x)/m. ``init`` computes once
per run (spec §2, §10.3): r_i (the Lipschitz constant of ∇f_i), r = max_i r_i, σ and every client's curvature
S_i = H_i/m + σI; x_i = π_i = z_i = 0. Round s::

    x    ← (1/m) Σ_i z_i                                           (11)   aggregate
    ḡ_i  ← ∇f_i(x)/m for every client                                     once per round, reused k0 times
    C    ← ⌈αm⌉ clients, uniform without replacement                      D11 (the round's SAMPLE stream)
    i ∈ C, k0 times:  x_i ← x − S_i⁻¹(ḡ_i + π_i)                   (12)   inexact ADMM
                      π_i ← π_i + σ(x_i − x)                       (13)
                      z_i ← x_i + π_i/σ                            (14)
    i ∉ C, once:      (x_i, π_i, z_i) ← (x, −ḡ_i, x − ḡ_i/σ)       (15)–(17)  gradient descent

H_i (Table III): ``variant="G"`` (Gram) H_i = B_i/(κd_i) + (s/d_i)·I; c1·B_i + c0·I is factored once by Cholesky
(n ≤ rows) or through Woodbury with a rows×rows factor, and applied as explicit inverses
(``gram_solver="inverse"``; ``"cholesky"``: triangular solves every step; ``"cg"``: conjugate gradients; D14);
``variant="D"`` (diagonal) H_i = (λ_i/(κd_i) + s/d_i)·I. κ, s and the Lipschitz constants come from the loss
(:mod:`fljax.problems.regression`). Both branches run for every client and are combined by the selection mask
(no per-client Python branching). The size classes of the data run through :func:`fljax.engine.map_groups`; the
factorisations of successive classes are serialised there (an XLA:CPU workaround).

The round's metrics are f, Error and ‖∇f‖² at x (:mod:`fljax.algorithms.regression`); Table IV's run stops at the
first aggregation with Error ≤ tol or k ≥ max_iters (D15, CR = completed rounds)::

    stop = Stopping(Tolerance(tol0=1e-7, metric="error"), max_rounds=10_000, max_iters=10_000, track=("train_loss",))
    with jax.enable_x64(True):
        res = run_until(Simulation(FedGiA(loss=LeastSquares(), variant="G", k0=5), data, executor="vmap"), stop)
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.regression import ConsensusRegression
from fljax.engine.context import SAMPLE
from fljax.ops import admm
from fljax.errors import OptionError
from fljax.options import between, greater_than, option
from fljax.problems.regression import LeastSquares, Loss, lambda_max_power

__all__ = ["FedGiA", "FedGiAServer", "FedGiAClients", "selection", "paper_t"]


def paper_t(loss: Loss, d, n: int):
    """Table III: t = 0.15 for Example V.1 (least squares); max{0.025, 4 ln(d)/n} for Examples V.2 and V.3."""
    return 0.15 if isinstance(loss, LeastSquares) else jnp.maximum(0.025, 4.0 * jnp.log(d) / n)


def selection(key, m: int, alpha):
    """Boolean mask of ⌈αm⌉ clients drawn uniformly without replacement (D11): the ranks of m uniform draws below
    ⌈αm⌉ (valid for traced α; α = 0 selects nobody, α = 1 everybody)."""
    m0 = jnp.ceil(jnp.asarray(alpha) * m - 1e-9)
    ranks = jnp.argsort(jnp.argsort(jax.random.uniform(key, (m,))))
    return ranks < m0


@flax.struct.dataclass
class FedGiAServer:
    """Computed once by ``init``: σ, r = max_i r_i and one curvature per size class (``[C]`` weights
    w_i = h_i/m + σ for D; stacked solvers for G)."""

    sigma: jax.Array
    r: jax.Array
    curv: tuple


@flax.struct.dataclass
class FedGiAClients:
    """Per-client x_i, π_i, z_i ``[m, n]`` (paper scaling, spec §2)."""

    x: jax.Array
    pi: jax.Array
    z: jax.Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedGiA(ConsensusRegression):
    """FedGiA's hyperparameters. ``k0``, ``alpha``, ``t`` (None → :func:`paper_t`) and ``r0`` may be traced
    (``Simulation.algorithm_at``, ``Lanes`` hps). Static: ``loss``, ``variant`` ("D" or "G"), ``lipschitz``
    ("eigh": the exact λ_max packed with the data | "power": power iteration in the program, D10),
    ``gram_solver`` ("inverse" | "cholesky" | "cg", D14)."""

    name: ClassVar[str] = "fedgia"
    summary: ClassVar[str] = ("FedGiA: inexact ADMM for a random ⌈αm⌉ of the clients, gradient descent for the "
                              "others; consensus regression (Zhou & Li)")
    alpha: float = option(0.5, "fraction of the clients selected for inexact ADMM each round (the others: GD)",
                          between(0, 1))
    t: float | None = option(None, "t of σ = r0·t·r/m (null: Table III's, paper_t)", greater_than(0))
    r0: float = option(1.0, "r0 of σ = r0·t·r/m", greater_than(0))
    variant: Literal["D", "G"] = option("D", "H_i of Table III: 'D' (diagonal) or 'G' (Gram)")
    lipschitz: Literal["eigh", "power"] = option(
        "eigh", "r_i: the exact λ_max packed with the data ('eigh') or power iteration in the program (D10)")
    gram_solver: Literal["inverse", "cholesky", "cg"] = option(
        "inverse", "how variant G applies S_i⁻¹: explicit inverses, Cholesky solves or conjugate gradients (D14)")

    # ------------------------------------------------------------------------------------ precomputation
    def client_lambda(self, _, per_client):
        """λ_i = ‖B_i‖: the exact value packed with the data (``"eigh"``) or power iteration (``"power"``)."""
        blk, _, _ = per_client
        return blk.lam if self.lipschitz == "eigh" else lambda_max_power(blk.A)

    def client_curvature(self, shared, per_client):
        """S_i = H_i/m + σI for one client: the scalar w_i (D) or a solver of c1·B_i + c0·I (G), c1 = 1/(κ d_i m),
        c0 = σ + s/(d_i m) (spec §10.3)."""
        sigma, m = shared
        blk, lam, _ = per_client
        shift = self.loss.h_shift / blk.d
        if self.variant == "D":
            return (lam / (self.loss.kappa * blk.d) + shift) / m + sigma
        c1, c0 = 1.0 / (self.loss.kappa * blk.d * m), sigma + shift / m
        if self.gram_solver == "cg":
            return admm.cg_solver(blk.A, c1, c0)
        explicit = self.gram_solver == "inverse"
        if blk.dim <= blk.rows:
            gram = blk.A.T @ blk.A if blk.gram is None else blk.gram
            return (admm.inverse_solver if explicit else admm.cholesky_solver)(gram, c1, c0)
        return (admm.woodbury_inverse_solver if explicit else admm.woodbury_solver)(blk.A, c1, c0)

    def init(self, ctx):
        data, m, n = ctx.data, ctx.num_clients, ctx.data.dim
        if self.variant == "G" and self.gram_solver == "cholesky" and len(data.blocks) > 1:
            raise OptionError("gram_solver", "='cholesky' with several size classes can deadlock XLA:CPU (batched "
                                             "LAPACK solves of two classes at once); use 'inverse' (the default) "
                                             "or pack the data with blocks=1.")
        lam = ctx.map_groups(self.client_lambda, None, data.blocks)                                 # λ_i = ‖B_i‖
        d = jnp.concatenate([blk.d for blk in data.blocks])
        r = jnp.max(self.loss.lipschitz(lam, d))                                                  # r = max_i r_i
        t = paper_t(self.loss, jnp.sum(d), n) if self.t is None else self.t
        sigma = self.r0 * t * r / m                                                                       # D13
        curv = ctx.map_groups(self.client_curvature, (sigma, m), data.blocks, lam, concat=False, serial=True)
        zeros = jnp.zeros((m, n), data.blocks[0].A.dtype)
        return FedGiAServer(sigma=sigma, r=r, curv=curv), FedGiAClients(x=zeros, pi=zeros, z=zeros)

    # ------------------------------------------------------------------------------------ rounds
    def aggregate(self, data, server: FedGiAServer, clients: FedGiAClients):
        return admm.consensus_from_z(clients.z)                                                           # (11)

    def client_update(self, shared, per_client):
        """One client's round: k0 inexact-ADMM steps (12)–(14) and the GD branch (15)–(17), picked by ``selected``."""
        x, sigma = shared
        _, (g_bar, pi, selected), curv = per_client

        def admm_step(_, carry):
            _, p, _ = carry
            x_i = admm.linearized_primal(x, g_bar, p, curv)                                                # (12)
            p = admm.dual_ascent(p, x_i, x, sigma)                                                         # (13)
            return x_i, p, admm.z_form(x_i, p, sigma)                                                      # (14)

        admm_branch = jax.lax.fori_loop(0, self.k0, admm_step, (x, pi, admm.z_form(x, pi, sigma)))
        return tree.where(selected, admm_branch, admm.gd_branch(x, g_bar, sigma))                     # (15)–(17)

    def round(self, ctx, server: FedGiAServer, clients: FedGiAClients):
        m = ctx.num_clients
        x = self.aggregate(ctx.data, server, clients)                                                     # (11)
        f, g = self.measure(ctx, x)                                                            # f_i(x), ∇f_i(x)
        selected = selection(ctx.stream(SAMPLE), m, self.alpha)                                            # C
        x_i, pi, z = ctx.map_groups(self.client_update, (x, server.sigma), ctx.data.blocks,
                                    (g / m, clients.pi, selected), server.curv)
        return server, FedGiAClients(x=x_i, pi=pi, z=z), self.round_metrics(f, g, m, self.k0, up=z, down=x)
