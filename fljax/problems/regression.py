"""Regression losses on clients' padded rows: FedGiA's least squares (2), logistic (3) and the non-convex
logistic loss of Example V.3, with their Lipschitz constants and Table III's curvature terms.

Client i holds A_i ∈ ℝ^{d_i×n} and b_i ∈ ℝ^{d_i}; here its rows are padded to a common D with zero rows and a 0/1
``mask``, and every per-client mean divides by the true d_i::

    f_i(x) = (1/d_i) [ Σ_j mask_j · ℓ(⟨a_j, x⟩, b_j) + R(x) ]

| loss | ℓ(z, b) | R(x) | r_i (Lipschitz constant of ∇f_i) |
|---|---|---|---|
| least squares (2) | ½(z − b)² | 0 | λ_i/d_i |
| logistic (3), b ∈ {0, 1} | ln(1 + eᶻ) − bz | (μ/2)‖x‖² | λ_i/(4d_i) + μ/d_i |
| non-convex logistic (V.3) | ln(1 + eᶻ) − bz | (μ/2) Σ_l x_l²/(1 + x_l²) | λ_i/(4d_i) + μ/d_i |

with λ_i = ‖A_iᵀA_i‖ = λ_max(B_i). The logistic row terms are masked because softplus(0) = ln 2 ≠ 0; the padded
rows of A are zero, so they add nothing to Aᵀ(·) either.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import ClassVar, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ClientData", "Loss", "LeastSquares", "Logistic", "NonconvexLogistic", "LOSSES", "make_loss", "as_loss",
           "lambda_max_host", "lambda_max_power"]


@flax.struct.dataclass
class ClientData:
    """Clients' rows, padded: ``A [C, D, n]``, ``b [C, D]``, ``mask [C, D]`` (1 on the d_i real rows), ``d [C]``
    (the true d_i as floats) and ``lam [C]`` = λ_max(A_iᵀA_i) = ‖B_i‖ (exact, from :func:`lambda_max_host`).
    Optionally the least-squares statistics ``gram`` = B_i ``[C, n, n]``, ``atb`` = A_iᵀb_i ``[C, n]`` and
    ``btb`` = ‖b_i‖² ``[C]``, with which :class:`LeastSquares` reads n×n instead of 2·D×n numbers per gradient.
    One client is the same without the leading axis."""

    A: jax.Array
    b: jax.Array
    mask: jax.Array
    d: jax.Array
    lam: jax.Array
    gram: jax.Array | None = None
    atb: jax.Array | None = None
    btb: jax.Array | None = None

    @property
    def num_clients(self) -> int:
        return self.A.shape[-3]

    @property
    def rows(self) -> int:
        return self.A.shape[-2]

    @property
    def dim(self) -> int:
        return self.A.shape[-1]


@dataclasses.dataclass(frozen=True)
class Loss:
    """f_i(x) = (1/d_i)[Σ_j mask_j ℓ(⟨a_j, x⟩, b_j) + R(x)] on one client (no client axis). ``kappa`` bounds ℓ''
    by 1/κ; ``mu`` weights R."""

    name: ClassVar[str] = "loss"
    kappa: ClassVar[float] = 1.0
    mu: float = 0.0

    def to_config(self):
        """The loss as a config writes it: its name, or ``{name, <option>: value, ...}`` when an option differs from
        its default (:func:`as_loss` reads either back)."""
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default}
        return {"name": self.name, **changed} if changed else self.name

    # ---------------------------------------------------------------- per-row term and regulariser (override)
    def rows(self, z, b):
        raise NotImplementedError

    def rows_grad(self, z, b):
        raise NotImplementedError

    def reg(self, x):
        return jnp.zeros((), x.dtype)

    def reg_grad(self, x):
        return jnp.zeros_like(x)

    # ---------------------------------------------------------------- client objective
    def value(self, x, c: ClientData):
        return (jnp.sum(c.mask * self.rows(c.A @ x, c.b)) + self.reg(x)) / c.d

    def grad(self, x, c: ClientData):
        return (c.A.T @ (c.mask * self.rows_grad(c.A @ x, c.b)) + self.reg_grad(x)) / c.d

    def value_and_grad(self, x, c: ClientData):
        """(f_i(x), ∇f_i(x)) sharing the product A_i x."""
        z = c.A @ x
        value = (jnp.sum(c.mask * self.rows(z, c.b)) + self.reg(x)) / c.d
        return value, (c.A.T @ (c.mask * self.rows_grad(z, c.b)) + self.reg_grad(x)) / c.d

    # ---------------------------------------------------------------- constants of §3 / Table III
    @property
    def reg_lipschitz(self) -> float:
        """A bound on the curvature of R (μ for both logistic regularisers, 0 for least squares)."""
        return self.mu

    def lipschitz(self, lam, d):
        """r_i = λ_i/(κ d_i) + (reg. curvature)/d_i, the Lipschitz constant of ∇f_i (spec §3)."""
        return lam / (self.kappa * d) + self.reg_lipschitz / d

    @property
    def h_shift(self) -> float:
        """s in Table III's H_i = B_i/(κ d_i) + (s/d_i)·I (Gram) or (λ_i/(κ d_i) + s/d_i)·I (diagonal)."""
        return 0.0


@dataclasses.dataclass(frozen=True)
class LeastSquares(Loss):
    """Example V.1 / (2): f_i(x) = ‖A_i x − b_i‖²/(2 d_i)."""

    name: ClassVar[str] = "least_squares"
    kappa: ClassVar[float] = 1.0

    def value(self, x, c: ClientData):
        return super().value(x, c) if c.gram is None else self.value_and_grad(x, c)[0]

    def grad(self, x, c: ClientData):
        return super().grad(x, c) if c.gram is None else (c.gram @ x - c.atb) / c.d

    def value_and_grad(self, x, c: ClientData):
        """With the packed statistics: ∇f_i = (B_i x − A_iᵀb_i)/d_i, f_i = (xᵀB_i x − 2⟨A_iᵀb_i, x⟩ + ‖b_i‖²)/(2d_i)."""
        if c.gram is None:
            return super().value_and_grad(x, c)
        bx = c.gram @ x
        return (x @ bx - 2.0 * (c.atb @ x) + c.btb) / (2.0 * c.d), (bx - c.atb) / c.d

    def rows(self, z, b):
        return 0.5 * jnp.square(z - b)

    def rows_grad(self, z, b):
        return z - b

    @property
    def reg_lipschitz(self) -> float:
        return 0.0


@dataclasses.dataclass(frozen=True)
class _LogisticRows(Loss):
    """The logistic data term ℓ(z, b) = ln(1 + eᶻ) − bz = softplus(z) − bz (b ∈ {0, 1}); ℓ'' ≤ 1/4."""

    kappa: ClassVar[float] = 4.0

    def rows(self, z, b):
        return jax.nn.softplus(z) - b * z

    def rows_grad(self, z, b):
        return jax.nn.sigmoid(z) - b


@dataclasses.dataclass(frozen=True)
class Logistic(_LogisticRows):
    """Example V.2 / (3): ℓ = softplus(z) − bz, R(x) = (μ/2)‖x‖², μ = 10⁻³.

    ``h_shift_rule="paper"`` uses Table III's H_i without a μ term; ``"code"`` (decision D9) adds (μ/d_i)·I to both
    variants (then the diagonal H_i = r_i·I), which makes H_i majorise f_i's curvature.
    """

    name: ClassVar[str] = "logistic"
    mu: float = 1e-3
    h_shift_rule: str = "paper"

    def __post_init__(self):
        if self.h_shift_rule not in ("paper", "code"):
            raise ValueError(f"h_shift_rule must be 'paper' or 'code', got {self.h_shift_rule!r}.")

    def reg(self, x):
        return 0.5 * self.mu * jnp.sum(jnp.square(x))

    def reg_grad(self, x):
        return self.mu * x

    @property
    def h_shift(self) -> float:
        return self.mu if self.h_shift_rule == "code" else 0.0


@dataclasses.dataclass(frozen=True)
class NonconvexLogistic(_LogisticRows):
    """Example V.3: the logistic data term with R(x) = (μ/2) Σ_l x_l²/(1 + x_l²), μ = 10⁻²; R'' ∈ [−μ/4, μ] per
    coordinate, hence r_i's +μ/d_i and Table III's (μ/d_i)·I in both variants."""

    name: ClassVar[str] = "nonconvex_logistic"
    mu: float = 1e-2

    def reg(self, x):
        x2 = jnp.square(x)
        return 0.5 * self.mu * jnp.sum(x2 / (1.0 + x2))

    def reg_grad(self, x):
        return self.mu * x / jnp.square(1.0 + jnp.square(x))

    @property
    def h_shift(self) -> float:
        return self.mu


LOSSES = {cls.name: cls for cls in (LeastSquares, Logistic, NonconvexLogistic)}


def make_loss(name: str, **options) -> Loss:
    """A loss by name (``least_squares``, ``logistic``, ``nonconvex_logistic``) with its options (``mu``, ...)."""
    if name not in LOSSES:
        close = difflib.get_close_matches(name, LOSSES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}.{hint}")
    fields = {f.name for f in dataclasses.fields(LOSSES[name])}
    for key in options:
        if key not in fields:
            raise ValueError(f"loss {name!r} has no option {key!r}; valid: {sorted(fields)}.")
    return LOSSES[name](**options)


def as_loss(value) -> Loss:
    """A loss from what a config holds: a :class:`Loss` as it is, a name (``logistic``), or a mapping
    ``{name: logistic, h_shift_rule: code}`` (:meth:`Loss.to_config`)."""
    if isinstance(value, Loss):
        return value
    if isinstance(value, str):
        return make_loss(value)
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):
        return make_loss(value["name"], **{k: v for k, v in value.items() if k != "name"})
    raise ValueError(f"must be a loss name ({', '.join(LOSSES)}) or a mapping {{name: ..., <option>: ...}}, got "
                     f"{value!r}.")


def lambda_max_host(a: np.ndarray) -> float:
    """λ_max(AᵀA) = ‖B‖ of one client's rows, exactly (decision D10): LAPACK's eigvalsh of the smaller Gram matrix
    (AᵀA or AAᵀ) of the non-zero rows, at the client's true size."""
    a = np.asarray(a)
    a = a[np.any(a != 0, axis=1)]
    if a.size == 0:
        return 0.0
    gram = a.T @ a if a.shape[1] <= a.shape[0] else a @ a.T
    return float(np.linalg.eigvalsh(gram)[-1])


def lambda_max_power(a, iters: int = 300):
    """λ_max(AᵀA) inside the program (``lipschitz="power"``, D10): ``iters`` power iterations on the smaller padded
    Gram matrix from the all-ones vector; the Rayleigh quotient is a lower bound that converges to λ_max."""
    rows, n = a.shape
    gram = a.T @ a if n <= rows else a @ a.T

    def step(_, v):
        w = gram @ v
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(w.dtype).tiny)

    v = jax.lax.fori_loop(0, iters, step, jnp.full((gram.shape[0],), gram.shape[0] ** -0.5, a.dtype))
    return v @ (gram @ v)
