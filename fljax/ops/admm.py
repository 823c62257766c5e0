"""ADMM building blocks for consensus problems min Σ_i f_i(x_i) s.t. x_i = x (FedGiA (6)–(17), AugFL (4)–(13)).

Client quantities carry a leading client axis when the operator is applied to a whole cohort; the per-client
operators (:func:`dual_ascent`, :func:`linearized_primal`, :func:`z_form`, :func:`linearised_prox`, :func:`gd_branch`)
are elementwise, so they work on one client's tree or, with the server tree broadcast, under ``vmap``.

FedGiA round (paper scaling, σ = t·r/m, ḡ_i = ∇f_i(x)/m)::

    x   = consensus_from_z(z)                               # (11)
    x_i = linearized_primal(x, g_bar_i, pi_i, S_i)          # (12), S_i = H_i/m + σI
    pi  = dual_ascent(pi_i, x_i, x, sigma)                  # (13)
    z_i = z_form(x_i, pi, sigma)                            # (14);  unselected: gd_branch(x, g_bar_i, sigma)  (15)–(17)

AugFL round: ``θ_i = linearised_prox(θ, y_i, ĝ_i, w_i, ρ_i)`` (11), ``y_i = dual_ascent(y_i, θ_i, θ, ρ_i)`` (12),
``θ⁺ = admm_consensus(θ_i, y_i, ρ_i, G, λ)`` (13).

Inexact (SGD) local solves add :func:`augmented_lagrangian_grad` to the loss gradient and close the step with
:func:`dual_ascent`; both take the penalty as a multiplier ``sigma`` (σ·v) or a divisor ``eta`` (v/η), because the
two round differently and each caller keeps the form of its paper's code (FedSLR, FedDyn, pFedMe: σ·v; FedPD: v/η).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import jax.scipy.sparse.linalg
from flax import struct

from fljax.tree import mean_clients, ravel, weighted_mean_clients

PyTree = Any
HIGHEST = jax.lax.Precision.HIGHEST

__all__ = [
    "dual_ascent", "augmented_lagrangian_grad", "linearized_primal", "z_form", "gd_branch", "consensus_from_z",
    "augmented_lagrangian", "linearised_prox", "consensus_terms", "admm_consensus", "CholeskySolver", "WoodburySolver",
    "InverseSolver", "WoodburyInverseSolver", "CGSolver", "cholesky_solver", "woodbury_solver", "inverse_solver",
    "woodbury_inverse_solver", "cg_solver",
]


def _bcast(a, x):
    """Broadcast a per-client array a [C] (or a scalar) against a [C, ...] leaf."""
    a = jnp.asarray(a, x.dtype)
    return a.reshape(a.shape + (1,) * (x.ndim - a.ndim))


def _penalty_scale(sigma, eta) -> Callable:
    """v ↦ σ·v (``sigma``) or v ↦ v/η (``eta``), exactly one given. The two differ in the last bit on some
    entries: IEEE division rounds once, (1/η)·v twice (XLA:CPU evaluates v/η as v·fl(1/fl(η)), in the leaf's
    precision, which still differs from σ·v where σ = 1/η was rounded from double), so each caller keeps the form of
    its code to stay bit-identical on every backend."""
    if (sigma is None) == (eta is None):
        raise ValueError(f"give exactly one of sigma (σ·v) and eta (v/η), got sigma={sigma!r}, eta={eta!r}")
    return (lambda v: sigma * v) if eta is None else (lambda v: v / eta)


def dual_ascent(pi: PyTree, x_i: PyTree, x: PyTree, sigma=None, *, eta=None) -> PyTree:
    """π ← π + σ(x_i − x), evaluated leaf by leaf as ``π + σ·(x_i − x)``, or as ``π + (x_i − x)/η`` with ``eta``
    (σ = 1/η). FedGiA (13); AugFL (12) (with y, ρ_i). The negated-dual updates are the same step with the sign in
    σ or in the order of x_i, x (a − b = −(b − a) and σ·(−v) = −(σ·v) exactly, so both spellings agree bit for bit):

    * FedSLR Eq. (5), γ_i ← γ_i + (w_t − w_i)/η_g: ``dual_ascent(gamma, w_t, w_i, 1/η_g)``;
    * FedDyn (Acar et al. 2021, Alg. 1), g_i ← g_i − α(θ_i − θ): ``dual_ascent(g, theta_i, theta, -α)``;
    * pFedMe's outer step (Dinh et al. 2020, Alg. 1), w ← w − ηλ(w − θ): ``dual_ascent(w, w, theta, -η·λ)``;
    * FedPD (Zhang et al., oracle I, option I), λ_i ← λ_i + (x_i − x0_i)/η: ``dual_ascent(lam, x_i, x0_i, eta=η)``.
    """
    scale = _penalty_scale(sigma, eta)
    return jax.tree.map(lambda p, a, b: (p + scale(a - b)).astype(p.dtype), pi, x_i, x)


def augmented_lagrangian_grad(x_i: PyTree, x: PyTree, pi: PyTree | None = None, *, sigma=None, eta=None,
                              dual_sign: int = 1) -> PyTree:
    """∇_{x_i} of the coupling term s·⟨π, x_i − x⟩ + (σ/2)‖x_i − x‖² of :func:`augmented_lagrangian`:
    σ(x_i − x) + s·π, the extra gradient of an inexact (SGD) local solve, ``extra_grad`` of local training.

    Evaluated leaf by leaf as ``σ·(x_i − x) ± π`` or, with ``eta`` (the penalty ‖x_i − x‖²/(2η)),
    ``(x_i − x)/η ± π``; ``dual_sign`` s = −1 subtracts π (papers that write the dual term as −⟨π, x_i⟩), and
    ``pi=None`` leaves the penalty alone:

    * FedSLR Phase I, Eq. (4), −⟨γ_i, w⟩ + ‖w − w_t‖²/(2η_g):
      ``augmented_lagrangian_grad(w, w_t, gamma, sigma=1/η_g, dual_sign=-1)`` = (1/η_g)·(w − w_t) − γ_i;
    * FedDyn (Acar et al. 2021, Alg. 1), −⟨g_i, θ⟩ + (α/2)‖θ − θ^{t−1}‖²:
      ``augmented_lagrangian_grad(theta, theta_prev, g, sigma=α, dual_sign=-1)`` = α·(θ − θ^{t−1}) − g_i;
    * FedPD (Zhang et al., oracle I, option I), ⟨λ_i, y − x0_i⟩ + ‖y − x0_i‖²/(2η):
      ``augmented_lagrangian_grad(y, x0_i, lam, eta=η)`` = (y − x0_i)/η + λ_i (= λ_i + (y − x0_i)/η bit for bit;
      the sum ∇f_i(y) + λ_i + (y − x0_i)/η then associates as ∇f_i + (λ_i + …), which may differ from the
      left-to-right (∇f_i + λ_i) + … in the last bit);
    * pFedMe's inner problem (Dinh et al. 2020, Alg. 1), (λ/2)‖θ − w‖²: ``augmented_lagrangian_grad(theta, w,
      sigma=λ)`` = λ·(θ − w).
    """
    if dual_sign not in (1, -1):
        raise ValueError(f"dual_sign must be 1 or -1, got {dual_sign!r}")
    scale = _penalty_scale(sigma, eta)
    if pi is None:
        return jax.tree.map(lambda a, b: scale(a - b).astype(a.dtype), x_i, x)
    combine = jnp.add if dual_sign == 1 else jnp.subtract
    return jax.tree.map(lambda a, b, p: combine(scale(a - b).astype(a.dtype), p).astype(a.dtype), x_i, x, pi)


def linearized_primal(x: PyTree, g: PyTree, pi: PyTree, curvature) -> PyTree:
    """x_i = x − S⁻¹(g + π): the exact minimiser of the linearised local Lagrangian
    ⟨g + π, x_i − x⟩ + ½‖x_i − x‖²_S (FedGiA (12), (18)–(19)).

    ``curvature`` S is a scalar (S = s·I), a pytree like ``x`` (diagonal S, elementwise), or a callable solve
    v ↦ S⁻¹v on pytrees, e.g. :func:`cholesky_solver` / :func:`woodbury_solver` for FedGiA_G's
    S = H_i/m + σI = c1·B_i + c0·I with c1 = 1/(κ d_i m), c0 = σ (+ μ/(d_i m)).
    """
    d = jax.tree.map(jnp.add, g, pi)
    if callable(curvature):
        step = curvature(d)
    elif jax.tree.structure(curvature) == jax.tree.structure(x) and jax.tree.leaves(curvature):
        step = jax.tree.map(jnp.divide, d, curvature)
    else:
        step = jax.tree.map(lambda v: v / curvature, d)
    return jax.tree.map(lambda a, s: (a - s).astype(a.dtype), x, step)


def z_form(x_i: PyTree, pi: PyTree, sigma) -> PyTree:
    """z_i = x_i + π_i/σ. FedGiA (14); the server's x = mean_i z_i minimises the augmented Lagrangian in x."""
    return jax.tree.map(lambda a, p: (a + p / sigma).astype(a.dtype), x_i, pi)


def gd_branch(x: PyTree, g: PyTree, sigma) -> tuple[PyTree, PyTree, PyTree]:
    """FedGiA's branch for unselected clients, (15)–(17): ``(x_i, π_i, z_i) = (x, −ḡ_i, x − ḡ_i/σ)``."""
    neg = jax.tree.map(jnp.negative, g)
    return x, neg, z_form(x, neg, sigma)


def consensus_from_z(z_clients: PyTree, mask=None) -> PyTree:
    """x = (1/m) Σ_i z_i over the leading client axis (FedGiA (11); = argmin_x of :func:`augmented_lagrangian`);
    with a [C] ``mask`` the mean runs over the clients where it holds (padded client axes)."""
    # the raw mask as weights keeps the 1/k factor in the leaves' precision (masked_mean_clients rounds it to f32)
    return mean_clients(z_clients) if mask is None else weighted_mean_clients(z_clients, jnp.asarray(mask))


def augmented_lagrangian(f_vals, x: PyTree, X: PyTree, Pi: PyTree, sigma):
    """Σ_i [f_i + ⟨π_i, x_i − x⟩ + (σ_i/2)‖x_i − x‖²] with client-stacked X, Π (FedGiA (7); AugFL (5) without R_h).

    ``f_vals`` [C] are the (already scaled) local objective values: FedGiA passes f_i(x_i)/m, AugFL w_i·L_i.
    ``sigma`` is a scalar or per-client [C] (AugFL's ρ_i).
    """
    m = jnp.shape(f_vals)[0]
    sigma = jnp.broadcast_to(jnp.asarray(sigma), (m,))
    lin = jnp.zeros((m,))
    quad = jnp.zeros((m,))
    for xi, pi, x0 in zip(jax.tree.leaves(X), jax.tree.leaves(Pi), jax.tree.leaves(x)):
        diff = (xi - x0[None]).reshape(m, -1)
        lin = lin + jnp.sum(pi.reshape(m, -1) * diff, axis=1)
        quad = quad + jnp.sum(jnp.square(diff), axis=1)
    return jnp.sum(jnp.asarray(f_vals) + lin + 0.5 * sigma * quad)


def linearised_prox(theta: PyTree, y: PyTree, g: PyTree, w, rho) -> PyTree:
    """θ_i = θ − (y_i + w_i·ĝ_i)/ρ_i, the minimiser of AugFL's client subproblem linearised at θ
    (AugFL Eq. (9), (11))."""
    return jax.tree.map(lambda t, a, b: (t - (a + w * b) / rho).astype(t.dtype), theta, y, g)


def consensus_terms(theta_i: PyTree, y_i: PyTree, rho_i) -> PyTree:
    """s_i = y_i + ρ_i θ_i per client (leading axis): client i's term of the sum in AugFL Eq. (13)."""
    n = jax.tree.leaves(theta_i)[0].shape[0]
    rho = jnp.broadcast_to(jnp.asarray(rho_i), (n,))
    return jax.tree.map(lambda t, y: y + _bcast(rho, t) * t, theta_i, y_i)


def admm_consensus(theta_i: PyTree, y_i: PyTree, rho_i, extra_grad: PyTree | None = None, lam=0.0) -> PyTree:
    """θ⁺ = [Σ_i (y_i + ρ_i θ_i) − λ·G] / Σ_i ρ_i over the leading client axis (AugFL Eq. (13)); ``rho_i`` is a
    scalar or [C]; ``extra_grad`` G ≈ ∇R_h(θ) (no client axis), omitted when λ = 0."""
    n = jax.tree.leaves(theta_i)[0].shape[0]
    rho = jnp.broadcast_to(jnp.asarray(rho_i), (n,))
    num = jax.tree.map(lambda s: jnp.sum(s, axis=0), consensus_terms(theta_i, y_i, rho))
    if extra_grad is not None:
        num = jax.tree.map(lambda a, gg: a - lam * gg, num, extra_grad)
    return jax.tree.map(lambda a, t: (a / jnp.sum(rho)).astype(t.dtype), num, theta_i)


# ------------------------------------------------------------------------------------------------------ solvers


def _on_vector(solve: Callable, v):
    """Apply a vector solve to an array or (raveled) pytree."""
    if isinstance(v, jax.Array) and v.ndim == 1:
        return solve(v)
    flat, unravel = ravel(v)
    return unravel(solve(flat))


@struct.dataclass
class CholeskySolver:
    """v ↦ (c1·B + c0·I)⁻¹v with a stored lower Cholesky factor (a pytree: stack it over clients, keep it in state)."""

    chol: Any

    def __call__(self, v):
        return _on_vector(lambda b: jsl.cho_solve((self.chol, True), b), v)


@struct.dataclass
class WoodburySolver:
    """v ↦ (c1·AᵀA + c0·I)⁻¹v = (1/c0)[v − Aᵀ(AAᵀ + (c0/c1)I)⁻¹Av] with a stored d×d Cholesky factor (d rows of A);
    cheaper than n×n when d < n (FedGiA §10.3)."""

    a: Any
    chol: Any
    c0: Any

    def __call__(self, v):
        def solve(b):
            inner = jsl.cho_solve((self.chol, True), jnp.matmul(self.a, b, precision=HIGHEST))
            return (b - jnp.matmul(self.a.T, inner, precision=HIGHEST)) / self.c0

        return _on_vector(solve, v)


@struct.dataclass
class InverseSolver:
    """v ↦ Kv with K = (c1·B + c0·I)⁻¹ formed once from a Cholesky factor, so every solve is a matrix–vector
    product. Batched XLA:CPU programs may run independent LAPACK calls (the triangular solves of
    :class:`CholeskySolver`) concurrently, and jaxlib's batched LAPACK kernels then wait on the thread pool they
    occupy (a deadlock seen on two cores); this form has no LAPACK call per solve. K is well conditioned here
    (c0 > 0 bounds the condition number by 1 + c1‖B‖/c0)."""

    inv: Any

    def __call__(self, v):
        return _on_vector(lambda b: jnp.matmul(self.inv, b, precision=HIGHEST), v)


@struct.dataclass
class WoodburyInverseSolver:
    """v ↦ (c1·AᵀA + c0·I)⁻¹v = (1/c0)[v − Aᵀ K A v] with K = (AAᵀ + (c0/c1)I)⁻¹ formed once (d×d, d rows of A):
    :class:`WoodburySolver` without a LAPACK call per solve (see :class:`InverseSolver`)."""

    a: Any
    inner: Any
    c0: Any

    def __call__(self, v):
        def solve(b):
            inner = jnp.matmul(self.inner, jnp.matmul(self.a, b, precision=HIGHEST), precision=HIGHEST)
            return (b - jnp.matmul(self.a.T, inner, precision=HIGHEST)) / self.c0

        return _on_vector(solve, v)


def _spd_inverse(m):
    """The inverse of a symmetric positive definite matrix from its Cholesky factor (symmetrised)."""
    inv = jsl.cho_solve((jnp.linalg.cholesky(m), True), jnp.eye(m.shape[-1], dtype=m.dtype))
    return 0.5 * (inv + inv.T)


@struct.dataclass
class CGSolver:
    """v ↦ (c1·AᵀA + c0·I)⁻¹v by conjugate gradients on the matrix-free operator (FedGiA's option for large
    clients, D14): stops at relative residual ``tol`` or after ``maxiter`` iterations, so the solve is inexact."""

    a: Any
    c1: Any
    c0: Any
    tol: float = struct.field(pytree_node=False, default=1e-8)
    maxiter: int = struct.field(pytree_node=False, default=50)

    def __call__(self, v):
        def solve(b):
            op = lambda u: self.c1 * jnp.matmul(self.a.T, jnp.matmul(self.a, u, precision=HIGHEST),
                                                precision=HIGHEST) + self.c0 * u
            return jax.scipy.sparse.linalg.cg(op, b, tol=self.tol, maxiter=self.maxiter)[0]

        return _on_vector(solve, v)


def cholesky_solver(b, c1, c0) -> CholeskySolver:
    """Factor c1·B + c0·I once (B symmetric PSD, e.g. FedGiA_G's Gram B_i = A_iᵀA_i) for repeated solves."""
    n = b.shape[-1]
    return CholeskySolver(chol=jnp.linalg.cholesky(c1 * b + c0 * jnp.eye(n, dtype=b.dtype)))


def woodbury_solver(a, c1, c0) -> WoodburySolver:
    """Factor AAᵀ + (c0/c1)·I once for solves with c1·AᵀA + c0·I (zero padding rows of A are harmless)."""
    d = a.shape[0]
    gram = jnp.matmul(a, a.T, precision=HIGHEST)
    return WoodburySolver(a=a, chol=jnp.linalg.cholesky(gram + (c0 / c1) * jnp.eye(d, dtype=a.dtype)), c0=c0)


def inverse_solver(b, c1, c0) -> InverseSolver:
    """The explicit inverse of c1·B + c0·I (B symmetric PSD), for repeated solves by matrix–vector products."""
    n = b.shape[-1]
    return InverseSolver(inv=_spd_inverse(c1 * b + c0 * jnp.eye(n, dtype=b.dtype)))


def woodbury_inverse_solver(a, c1, c0) -> WoodburyInverseSolver:
    """Solves with c1·AᵀA + c0·I through the explicit inverse of AAᵀ + (c0/c1)·I (zero padding rows are harmless)."""
    d = a.shape[0]
    gram = jnp.matmul(a, a.T, precision=HIGHEST)
    return WoodburyInverseSolver(a=a, inner=_spd_inverse(gram + (c0 / c1) * jnp.eye(d, dtype=a.dtype)), c0=c0)


def cg_solver(a, c1, c0, tol: float = 1e-8, maxiter: int = 50) -> CGSolver:
    """Conjugate-gradient solves with c1·AᵀA + c0·I (nothing is factored; A's zero padding rows are harmless)."""
    return CGSolver(a=a, c1=c1, c0=c0, tol=tol, maxiter=maxiter)
