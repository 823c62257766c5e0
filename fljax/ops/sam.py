"""Sharpness-aware minimisation (SAM, Foret et al. 2021) as a value-and-gradient wrapper (DFedAlt §3, §10, D10).

Given ``vg(θ, *args) -> (value, g)``, SAM returns the gradient at the first-order worst-case perturbation:
``e = ρ·g_M/(‖g_M‖₂ + ε)`` with g_M the gradient restricted to the masked leaves (one global norm over them, zero on
the others), and the SAM gradient is the gradient of ``vg(θ + e, *args)`` on the *same* args (batch).
DFedSalt-U/-V/-UV wrap the u-phase, the v-phase or both; DFedSAM wraps the full model with ρ = 0.01 (through
:class:`fljax.algorithms.local_training.LocalTraining`). Weight decay and clipping come after. A wrapper (not an optax
transform) because it needs a second gradient at another point.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fljax.ops.partition import as_leaf_mask

PyTree = Any

__all__ = ["sam_perturbation", "sam_value_and_grad"]


def sam_perturbation(grads: PyTree, rho, mask=None, eps: float = 1e-12) -> PyTree:
    """e = ρ·g/(‖g_M‖₂ + ε) on the leaves selected by ``mask`` (leaf mask, path regex or predicate; ``None`` = all),
    exactly zero elsewhere; so ‖e‖ = ρ up to ε."""
    mask = as_leaf_mask(grads, mask)
    sel = [g for m, g in zip(jax.tree.leaves(mask), jax.tree.leaves(grads)) if m]
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in sel)) if sel else jnp.zeros(())
    scale = rho / (norm + eps)
    return jax.tree.map(lambda m, g: (scale * g).astype(g.dtype) if m else jnp.zeros_like(g), mask, grads)


def _perturb(params, e):
    return jax.tree.map(lambda p, d: (p + d).astype(p.dtype), params, e)


def sam_value_and_grad(vg_fn: Callable, rho, mask=None, eps: float = 1e-12) -> Callable:
    """SAM for ``vg_fn(params, *args) -> (value, grads)`` (e.g. ``jax.value_and_grad(loss, has_aux=...)``).

    Returns ``(value at the unperturbed params, SAM grads)``: the value is the ordinary loss of the current model
    (what one logs), computed by the first call at no extra cost; the gradient is taken at params + e, with e =
    :func:`sam_perturbation` of the first call's gradient (``mask``: the leaves perturbed). ``rho == 0`` as a Python
    number returns ``vg_fn`` itself (no second gradient); a traced ρ is always wrapped."""
    if isinstance(rho, (int, float)) and rho == 0:
        return vg_fn

    def wrapped(params, *args, **kw):
        value, g = vg_fn(params, *args, **kw)
        e = sam_perturbation(g, rho, mask, eps)
        return value, vg_fn(_perturb(params, e), *args, **kw)[1]

    return wrapped
