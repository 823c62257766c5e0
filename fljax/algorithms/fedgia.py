"""FedGiA (Zhou & Li, "FedGiA: An Efficient Hybrid Algorithm for Federated Learning"), Algorithm 1 in round form.

Consensus problem (6) with the augmented Lagrangian (7), σ = r0·t·r/m, ḡ_i = ∇f_i(x)/m. Round s (spec §2)::

    x    ← (1/m) Σ_i z_i                                           (11)   aggregate
    ḡ_i  ← ∇f_i(x)/m for every client                                     once per round, reused k0 times
    C    ← ⌈αm⌉ clients, uniform without replacement
    i ∈ C, k0 times:  x_i ← x − (H_i/m + σI)⁻¹(ḡ_i + π_i)         (12)   inexact ADMM
                      π_i ← π_i + σ(x_i − x)                       (13)
                      z_i ← x_i + π_i/σ                            (14)
    i ∉ C, once:      (x_i, π_i, z_i) ← (x, −ḡ_i, x − ḡ_i/σ)       (15)–(17)  gradient descent

H_i (Table III): ``variant="G"`` (Gram) H_i = B_i/(κd_i) + (s/d_i)·I; c1·B_i + c0·I is factored once per trial by
Cholesky (n ≤ rows) or through Woodbury with a rows×rows factor, and applied as explicit inverses
(``gram_solver="inverse"``; ``"cholesky"``: triangular solves every step; ``"cg"``: conjugate gradients; D14);
``variant="D"`` (diagonal) H_i = (λ_i/(κd_i) + s/d_i)·I. κ, s and the Lipschitz constants come from the loss
(:mod:`fljax.problems.regression`). Both branches run for every client through the executor and are combined by
the selection mask (no per-client Python branching). Stopping, Error and CR: :mod:`regression_driver`.

    from fljax.algorithms.fedgia import FedGiA, solve
    res = solve(FedGiA(loss=Logistic(), variant="G", k0=5), data)       # data: fljax.problems.pack_trials(...)
"""
from __future__ import annotations

from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.algorithms.regression_driver import Conventions, Method, Result, prepare, solve, trial_keys
from fljax.ops import admm
from fljax.problems.regression import LeastSquares, Loss, lambda_max_power, map_blocks

__all__ = ["FedGiA", "FedGiAConsts", "FedGiAState", "selection", "paper_t", "solve", "prepare", "Result",
           "Conventions", "trial_keys"]


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
class FedGiAConsts:
    """Per-trial constants: σ, r = max_i r_i, λ_i = ‖B_i‖ (client order) and one curvature per size class
    (``[C]`` weights w_i = h_i/m + σ for D; stacked solvers for G)."""

    sigma: jax.Array
    r: jax.Array
    lam: jax.Array
    curv: tuple


@flax.struct.dataclass
class FedGiAState:
    """Per-client x_i, π_i, z_i ``[m, n]`` (paper scaling, spec §2)."""

    x: jax.Array
    pi: jax.Array
    z: jax.Array


@flax.struct.dataclass
class FedGiA(Method):
    """FedGiA's hyperparameters. Leaves (traced, no recompilation): ``k0``, ``alpha``, ``t`` (None → :func:`paper_t`),
    ``r0``, ``tol0``. Static: ``loss``, ``variant`` ("D" or "G"), ``lipschitz`` ("eigh" | "power", D10),
    ``gram_solver`` ("inverse" | "cholesky" | "cg", D14), ``max_iters`` (stop at the first aggregation with
    k ≥ max_iters, D15), ``conventions`` (D1–D3)."""

    alpha: Any = 0.5
    t: Any = None
    r0: Any = 1.0
    variant: str = flax.struct.field(pytree_node=False, default="D")
    lipschitz: str = flax.struct.field(pytree_node=False, default="eigh")
    gram_solver: str = flax.struct.field(pytree_node=False, default="inverse")
    max_iters: int = flax.struct.field(pytree_node=False, default=10_000)

    name: ClassVar[str] = "fedgia"

    def validate(self) -> None:
        super().validate()
        choices = {"variant": ("D", "G"), "lipschitz": ("eigh", "power"),
                   "gram_solver": ("inverse", "cholesky", "cg")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"FedGiA {key} must be one of {allowed}, got {getattr(self, key)!r}.")
        if np.ndim(self.alpha) == 0 and not 0.0 <= float(self.alpha) <= 1.0:
            raise ValueError(f"FedGiA alpha must lie in [0, 1] (the fraction of clients selected), got {self.alpha}.")
        if self.max_iters < 1:
            raise ValueError(f"max_iters must be positive, got {self.max_iters}.")

    @property
    def label(self) -> str:
        return f"FedGiA_{self.variant}"

    # ------------------------------------------------------------------------------------ precomputation
    def client_lambda(self, _, per_client):
        """λ_i = ‖B_i‖: the exact value packed with the data (``"eigh"``) or power iteration (``"power"``)."""
        blk, _, _ = per_client
        return blk.lam if self.lipschitz == "eigh" else lambda_max_power(blk.A)

    def host_seconds(self, data) -> np.ndarray:
        return np.asarray(data.lam_seconds) if self.lipschitz == "eigh" else np.zeros(data.num_trials)

    def client_curvature(self, shared, per_client):
        """H_i/m + σI for one client: the scalar w_i (D) or a solver of c1·B_i + c0·I (G), c1 = 1/(κ d_i m),
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

    def prepare(self, executor, data) -> FedGiAConsts:
        m, n = data.num_clients, data.dim
        lam = map_blocks(executor, self.client_lambda, None, data.blocks)
        d = jnp.concatenate([blk.d for blk in data.blocks])
        r = jnp.max(self.loss.lipschitz(lam, d))
        t = paper_t(self.loss, jnp.sum(d), n) if self.t is None else self.t
        sigma = self.r0 * t * r / m                                                     # D13
        if self.variant == "G" and self.gram_solver == "cholesky" and len(data.blocks) > 1:
            raise ValueError("gram_solver='cholesky' with several size classes can deadlock XLA:CPU (concurrent "
                             "batched LAPACK calls); use gram_solver='inverse' (the default) or pack with blocks=1.")
        curv, lo, after = [], 0, jnp.zeros((), sigma.dtype)
        for blk in data.blocks:
            hi = lo + blk.num_clients
            curv.append(executor.map_clients(self.client_curvature, (sigma + after, m), (blk, lam[lo:hi], None)))
            # a true data dependency (σ + 0·c, c finite, read from every leaf incl. the factor) makes the next size
            # class's batched Cholesky wait for this one: XLA:CPU runs independent LAPACK calls concurrently, and
            # jaxlib's batched kernels wait on the thread pool they occupy; two at once deadlocked on two cores
            probe = sum(jnp.ravel(leaf)[0] for leaf in jax.tree.leaves(curv[-1]))
            after = jnp.where(jnp.isfinite(probe), probe, 0.0) * 0.0
            lo = hi
        return FedGiAConsts(sigma=sigma, r=r, lam=lam, curv=tuple(curv))

    # ------------------------------------------------------------------------------------ rounds
    def init(self, consts, data) -> FedGiAState:
        zeros = jnp.zeros((data.num_clients, data.dim), data.blocks[0].A.dtype)
        return FedGiAState(x=zeros, pi=zeros, z=zeros)                      # x_i⁰ = π_i⁰ = 0, so z_i⁰ = 0

    def aggregate(self, consts, data, state: FedGiAState):
        return admm.consensus_from_z(state.z)                                                         # (11)

    def client_update(self, shared, per_client):
        """One client's round: k0 inexact-ADMM steps (12)–(14) and the GD branch (15)–(17), picked by ``selected``."""
        x, sigma = shared
        _, (g_bar, pi, selected), curv = per_client

        def admm_step(_, carry):
            _, p, _ = carry
            x_i = admm.linearized_primal(x, g_bar, p, curv)                                            # (12)
            p = admm.dual_ascent(p, x_i, x, sigma)                                                     # (13)
            return x_i, p, admm.z_form(x_i, p, sigma)                                                  # (14)

        admm_branch = jax.lax.fori_loop(0, self.k0, admm_step, (x, pi, admm.z_form(x, pi, sigma)))
        return tree.where(selected, admm_branch, admm.gd_branch(x, g_bar, sigma))                 # (15)–(17)

    def local(self, executor, consts: FedGiAConsts, data, state: FedGiAState, x, g, key, s, k) -> FedGiAState:
        m = data.num_clients
        selected = selection(key, m, self.alpha)
        x_i, pi, z = map_blocks(executor, self.client_update, (x, consts.sigma), data.blocks,
                                (g / m, state.pi, selected), consts.curv)
        return FedGiAState(x=x_i, pi=pi, z=z)

    def capped(self, s, k):
        return k >= self.max_iters                                                                     # D15

    @property
    def history_length(self) -> int:
        return self.max_iters + 1
