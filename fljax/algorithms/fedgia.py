"""FedGiA (Zhou & Li, "FedGiA: An Efficient Hybrid Algorithm for Federated Learning"), Algorithm 1 in round form.

Consensus problem (6) with the augmented Lagrangian (7), σ = r0·t·r/m, ḡ_i = ∇f_i(x)/m. ``init`` computes once
per run (spec §2, §10.3): r_i (the Lipschitz constant of ∇f_i), r = max_i r_i, σ and every client's curvature
S_i = H_i/m + σI (the client's state, beside x_i = π_i = 0); the server keeps the uploads z_i = 0. Round s::

    x    ← (1/m) Σ_i z_i                                              (11)   the aggregate of the last uploads
    C    ← ⌈αm⌉ clients, uniform without replacement, broadcast with x and σ    D11 (the round's SAMPLE stream)
    every client i:   ḡ_i ← ∇f_i(x)/m                                        once per round, reused k0 times
      i ∈ C, k0 times:  x_i ← x − S_i⁻¹(ḡ_i + π_i)                   (12)   inexact ADMM
                        π_i ← π_i + σ(x_i − x)                       (13)
                        z_i ← x_i + π_i/σ                            (14)
      i ∉ C, once:      (x_i, π_i, z_i) ← (x, −ḡ_i, x − ḡ_i/σ)       (15)–(17)  gradient descent
      upload z_i

H_i (Table III): ``variant="G"`` (Gram) H_i = B_i/(κd_i) + (s/d_i)·I; c1·B_i + c0·I is factored once by Cholesky
(n ≤ rows) or through Woodbury with a rows×rows factor, and applied as explicit inverses
(``gram_solver="inverse"``; ``"cholesky"``: triangular solves every step; ``"cg"``: conjugate gradients; D14);
``variant="D"`` (diagonal) H_i = (λ_i/(κd_i) + s/d_i)·I. κ, s and the Lipschitz constants come from the loss
(:mod:`fljax.problems.regression`). Both branches run for every client and are combined by the selection the
client reads from the broadcast (no per-client Python branching). Every size class of the data is a group of the
simulation's population (:mod:`fljax.engine.population`); the factorisations of successive classes are serialised
there (``run_all(serial=True)``, an XLA:CPU workaround).

The round's metrics are f, Error and ‖∇f‖² at x (:mod:`fljax.algorithms.regression`); Table IV's run stops at the
first aggregation with Error ≤ tol or k ≥ max_iters (D15, CR = completed rounds)::

    stop = Stopping(Tolerance(tol0=1e-7, metric="error"), max_rounds=10_000, max_iters=10_000, track=("train_loss",))
    with jax.enable_x64(True):
        res = run_until(Simulation(FedGiA(loss=LeastSquares(), variant="G", k0=5), data, executor="vmap"), stop)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.families import CONSENSUS_REGRESSION
from fljax.algorithms.registry import register
from fljax.algorithms.regression import ConsensusRegression
from fljax.engine.cohort import run_all
from fljax.engine.context import INIT, SAMPLE
from fljax.engine.protocol import ClientInput, ClientResult
from fljax.errors import OptionError
from fljax.ops import admm
from fljax.options import between, greater_than, option
from fljax.problems.regression import LeastSquares, Loss, lambda_max_power

__all__ = ["FedGiA", "FedGiAServer", "FedGiAClient", "FedGiADown", "selection", "paper_t"]


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
    """The clients' last uploads z_i (``uploads [m, n]``, averaged by (11)) and, computed once by ``init``, σ and
    r = max_i r_i."""

    uploads: jax.Array
    sigma: jax.Array
    r: jax.Array


@flax.struct.dataclass
class FedGiAClient:
    """One client's x_i and π_i ``[n]`` (paper scaling, spec §2) and its curvature S_i = H_i/m + σI, computed once
    by ``init``: the weight w_i (D) or a solver of c1·B_i + c0·I (G)."""

    x: jax.Array
    pi: jax.Array
    curv: Any


@flax.struct.dataclass
class FedGiADown:
    """What the server broadcasts: the aggregate ``x``, σ, the round's selection C as a mask over the client ids
    (``selected [m]``) and the number of clients ``m`` (static)."""

    x: jax.Array
    sigma: jax.Array
    selected: Any = None
    m: int = flax.struct.field(pytree_node=False, default=1)


@register("fedgia", family=CONSENSUS_REGRESSION, example="configs/fedgia_qot.yaml",
          summary="FedGiA: inexact ADMM for a random ⌈αm⌉ of the clients, gradient descent for the "
                  "others; consensus regression (Zhou & Li)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedGiA(ConsensusRegression):
    """FedGiA's hyperparameters. ``k0``, ``alpha``, ``t`` (None → :func:`paper_t`) and ``r0`` may be traced
    (``Simulation.algorithm_at``, ``Lanes`` hps). Static: ``loss``, ``variant`` ("D" or "G"), ``lipschitz``
    ("eigh": the exact λ_max packed with the data | "power": power iteration in the program, D10),
    ``gram_solver`` ("inverse" | "cholesky" | "cg", D14)."""

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
    def client_lambda(self, inp: ClientInput):
        """λ_i = ‖B_i‖: the exact value packed with the data (``"eigh"``) or power iteration (``"power"``)."""
        return inp.train.lam if self.lipschitz == "eigh" else lambda_max_power(inp.train.A)

    def init_client(self, inp: ClientInput) -> FedGiAClient:
        """x_i = π_i = 0 and S_i = H_i/m + σI for one client: the scalar w_i (D) or a solver of c1·B_i + c0·I
        (G), c1 = 1/(κ d_i m), c0 = σ + s/(d_i m) (spec §10.3); σ and m from ``inp.down``."""
        sigma, m, blk = inp.down.sigma, inp.down.m, inp.train
        lam = self.client_lambda(inp)
        shift = self.loss.h_shift / blk.d
        zeros = jnp.zeros((blk.dim,), blk.A.dtype)
        if self.variant == "D":
            curv = (lam / (self.loss.kappa * blk.d) + shift) / m + sigma
        else:
            c1, c0 = 1.0 / (self.loss.kappa * blk.d * m), sigma + shift / m
            if self.gram_solver == "cg":
                curv = admm.cg_solver(blk.A, c1, c0)
            else:
                explicit = self.gram_solver == "inverse"
                if blk.dim <= blk.rows:
                    gram = blk.A.T @ blk.A if blk.gram is None else blk.gram
                    curv = (admm.inverse_solver if explicit else admm.cholesky_solver)(gram, c1, c0)
                else:
                    curv = (admm.woodbury_inverse_solver if explicit else admm.woodbury_solver)(blk.A, c1, c0)
        return FedGiAClient(x=zeros, pi=zeros, curv=curv)

    def init_population(self, ctx):
        """r = max_i r_i over every client, σ = r0·t·r/m (D13), then each client's state; the size classes'
        factorisations one after another (``serial``, module docstring)."""
        data, m, n = ctx.data, ctx.num_clients, ctx.data.dim
        if self.variant == "G" and self.gram_solver == "cholesky" and len(data.blocks) > 1:
            raise OptionError("gram_solver", "='cholesky' with several size classes can deadlock XLA:CPU (batched "
                                             "LAPACK solves of two classes at once); use 'inverse' (the default) "
                                             "or pack the data with blocks=1.")
        lam = run_all(ctx, lambda g: self.client_lambda, None, None, INIT, test=False)             # λ_i = ‖B_i‖
        d = jnp.concatenate([blk.d for blk in data.blocks])
        r = jnp.max(self.loss.lipschitz(lam, d))                                                  # r = max_i r_i
        t = paper_t(self.loss, jnp.sum(d), n) if self.t is None else self.t
        sigma = self.r0 * t * r / m                                                                       # D13
        clients = run_all(ctx, lambda g: self.init_client, FedGiADown(x=self.origin(ctx), sigma=sigma, m=m), None,
                          INIT, test=False, concat=False, serial=True)
        return FedGiAServer(uploads=self.origin(ctx, m), sigma=sigma, r=r), clients

    # ------------------------------------------------------------------------------------ rounds
    def aggregate(self, data, server: FedGiAServer):
        return admm.consensus_from_z(server.uploads)                                                       # (11)

    def broadcast(self, ctx, server: FedGiAServer) -> FedGiADown:
        m = ctx.num_clients
        return FedGiADown(x=self.aggregate(ctx.data, server), sigma=server.sigma,
                          selected=selection(ctx.stream(SAMPLE), m, self.alpha), m=m)

    def client_update(self, inp: ClientInput) -> ClientResult:
        """One client's round: ḡ_i at the broadcast x, then k0 inexact-ADMM steps (12)–(14) if the broadcast
        selects it, else the GD branch (15)–(17)."""
        down, own = inp.down, inp.state
        x, sigma = down.x, down.sigma
        f, g = self.loss.value_and_grad(x, inp.train)                                         # f_i(x), ∇f_i(x)
        g_bar = g / down.m

        def admm_step(_, carry):
            _, p, _ = carry
            x_i = admm.linearized_primal(x, g_bar, p, own.curv)                                           # (12)
            p = admm.dual_ascent(p, x_i, x, sigma)                                                         # (13)
            return x_i, p, admm.z_form(x_i, p, sigma)                                                      # (14)

        admm_branch = jax.lax.fori_loop(0, self.k0, admm_step, (x, own.pi, admm.z_form(x, own.pi, sigma)))
        x_i, pi, z = tree.where(down.selected[inp.id], admm_branch, admm.gd_branch(x, g_bar, sigma))  # (15)–(17)
        return self.measured(f, g, own.replace(x=x_i, pi=pi), upload=z)
