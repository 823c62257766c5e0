"""Meta-gradients through one step of adaptation (MAML-style; AugFL §2 Eq. (7)–(10), Per-FedAvg HF).

``loss_fn(params, batch) -> scalar``. The meta-objective of one client is F(θ) = L(θ − α∇L(θ; S); Q) with support S
and query Q; its gradient is ∇F(θ) = (I − α∇²L(θ; S))·r with r = ∇L(θ − α∇L(θ; S); Q). The Hessian-vector product
is exact (forward-over-reverse), a central finite difference (AugFL Eq. (10)), or dropped (first order).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from fljax.tree import axpy, zeros_like

PyTree = Any

__all__ = ["adapt", "hvp", "meta_grad", "meta_value_and_grad", "HVP_MODES"]

HVP_MODES = ("exact", "fd", "none")


def adapt(loss_fn: Callable, params: PyTree, batch, alpha) -> PyTree:
    """φ = θ − α∇L(θ; batch): one gradient step of adaptation (AugFL Eq. (7); Per-FedAvg's inner step; the
    test-time fine-tune)."""
    return axpy(-alpha, jax.grad(loss_fn)(params, batch), params)


def hvp(loss_fn: Callable, params: PyTree, v: PyTree, batch, mode: str = "exact", delta=1e-3) -> PyTree:
    """h ≈ ∇²L(θ; batch)·v.

    ``"exact"``: ``jax.jvp(jax.grad(L), (θ,), (v,))`` (forward-over-reverse). ``"fd"``: the central difference along
    the unnormalised v, [∇L(θ + δv) − ∇L(θ − δv)]/(2δ), O(δ²) error (AugFL Eq. (10), δ_t = 1/(10t + 100)).
    ``"none"``: zeros (first-order MAML / Per-FedAvg FO)."""
    grad = jax.grad(loss_fn)
    if mode == "exact":
        return jax.jvp(lambda p: grad(p, batch), (params,), (v,))[1]
    if mode == "fd":
        plus = grad(axpy(delta, v, params), batch)
        minus = grad(axpy(-delta, v, params), batch)
        return jax.tree.map(lambda a, b: (a - b) / (2 * delta), plus, minus)
    if mode == "none":
        return zeros_like(params)
    raise ValueError(f"unknown hvp mode {mode!r}; valid: {', '.join(HVP_MODES)}")


def meta_value_and_grad(loss_fn: Callable, params: PyTree, support, query, alpha, mode: str = "exact",
                        delta=1e-3):
    """(L(φ; Q), ĝ) with φ = θ − α∇L(θ; S), r = ∇L(φ; Q) and ĝ = r − α·HVP(θ, r; S): the meta-objective
    θ ↦ L(θ − α∇L(θ; S); Q) and its gradient (exact for ``mode="exact"``), AugFL Eq. (7)–(10), the linearisation
    direction of Eq. (9); Per-FedAvg HF (``"fd"``/``"exact"``) and FO (``"none"``). r is a constant of the HVP
    (nothing is differentiated through it)."""
    value, r = jax.value_and_grad(loss_fn)(adapt(loss_fn, params, support, alpha), query)
    h = hvp(loss_fn, params, r, support, mode=mode, delta=delta)
    return value, axpy(-alpha, h, r)


def meta_grad(loss_fn: Callable, params: PyTree, support, query, alpha, mode: str = "exact", delta=1e-3) -> PyTree:
    """ĝ of :func:`meta_value_and_grad` alone."""
    return meta_value_and_grad(loss_fn, params, support, query, alpha, mode, delta)[1]
