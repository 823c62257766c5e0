"""The arithmetic of heterogeneous local work and asynchrony (heterogeneity spec; docs/heterogeneity.md).

* :func:`local_steps_norm` — FedNova's ‖a_i‖₁ (Wang et al. 2020): a client's τ local SGD steps with heavy-ball
  momentum ρ (buffer from zero, PyTorch's form b ← ρb + g, w ← w − ηb) move it by Δ = −η Σ_k a_k g_k with
  a_k = (1 − ρ^{τ−k+1})/(1 − ρ), so ‖a‖₁ = [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ); τ when ρ = 0;
* :func:`staleness_weight` — s(τ) of an update τ server versions old: 'constant' 1, 'polynomial' (τ + 1)^(−a)
  (FedAsync, Xie et al. 2019; a = 1/2 is FedBuff's 1/√(1 + τ), Nguyen et al. 2022), 'hinge' 1 for τ ≤ b, else
  1/(a(τ − b) + 1) (FedAsync).

Both are elementwise, jittable and traceable in their parameters (a grid of them is one program).
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["local_steps_norm", "staleness_weight", "STALENESS"]

STALENESS = ("constant", "polynomial", "hinge")


def local_steps_norm(steps, momentum=0.0):
    """‖a‖₁ of ``steps`` τ local steps with momentum ρ = ``momentum`` ∈ [0, 1) (module docstring): τ when ρ = 0."""
    tau = jnp.asarray(steps, jnp.float32)
    rho = jnp.asarray(momentum, jnp.float32)
    return (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)


def staleness_weight(staleness, kind: str = "polynomial", a=0.5, b=0.0):
    """s(τ) for ``staleness`` τ ≥ 0 server versions (module docstring): ``kind`` 'constant', 'polynomial' (exponent
    ``a``) or 'hinge' (slope ``a`` after ``b`` versions)."""
    tau = jnp.asarray(staleness, jnp.float32)
    if kind == "constant":
        return jnp.ones_like(tau)
    if kind == "polynomial":
        return (tau + 1) ** (-jnp.asarray(a, jnp.float32))
    if kind == "hinge":
        return jnp.where(tau <= b, 1.0, 1.0 / (a * (tau - b) + 1.0))
    raise ValueError(f"staleness must be one of {STALENESS}, got {kind!r}.")
