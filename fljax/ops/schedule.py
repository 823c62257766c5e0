"""Step-size and penalty schedules on an epoch clock (QuPeD §1, §6; spec D10).

Local iterations are counted globally, t = 0, 1, …; with I iterations per epoch the epoch is e(t) = 1 + ⌊t/I⌋.
Every function is pure and takes traced values, so a schedule never recompiles; ``dtype`` is the run's floating
dtype (the parameters': float64 in an x64 run with float64 parameters), so that the constants never cap a float64
run's precision at float32's.

* learning rate  η(e) = η₀·γ^(e−1)                                    (QuPeD §6: γ = 0.99 per epoch)
* penalty        λ(e) = κ·e  (``compensated=False``)  or  κ·e/γ^e  (``True``: the 1-bit rule "5e-7·t/0.99^t", whose
                 1/γ^e cancels the decay of η inside the prox threshold λη/2)
* r-rule         κ such that the cumulative pull S = Σ_{t < T_ft} λ(e_t)·η(e_t)/2 equals r·σ₀ (spec §6, rescaling to
                 shorter runs): κ = r·σ₀ / Σ_{e=1}^{E−E_ft} I·ẽ(e)·η(e)/2 with ẽ(e) = e or e/γ^e
* rescaled γ     γ = base^(E_ref/E): the same final learning-rate ratio in E epochs as base over E_ref epochs
* center step    η₂ = η₂,ref·l_ref/l̄ (spec §6: the center gradient and the c-prox count both sum over a leaf's
                 members; l_ref = 20,160, CNN1's mean quantized-leaf size)
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["epoch_of", "epoch_continuous", "exp_decay", "penalty_lambda", "penalty_kappa", "rescaled_gamma",
           "center_lr", "CENTER_LR_REF", "CENTER_LEAF_REF"]

CENTER_LR_REF, CENTER_LEAF_REF = 1e-4, 20_160  # QuPeD §6: η₂ = 1e-4 for CNN1 (mean quantized leaf 60,480 / 3)


def epoch_of(t, iters_per_epoch: int):
    """e(t) = 1 + ⌊t/I⌋ (1-based; constant within an epoch, D10)."""
    return 1 + t // iters_per_epoch


def epoch_continuous(t, iters_per_epoch: int, dtype=jnp.float32):
    """1 + t/I: the iteration clock of D10's option (λ grows every iteration instead of every epoch)."""
    return 1.0 + jnp.asarray(t, dtype) / iters_per_epoch


def exp_decay(base, gamma, e, dtype=jnp.float32):
    """base·γ^(e−1)."""
    return jnp.asarray(base, dtype) * jnp.power(jnp.asarray(gamma, dtype), jnp.asarray(e, dtype) - 1.0)


def penalty_lambda(kappa, e, gamma, compensated: bool, dtype=jnp.float32):
    """λ(e) = κ·e, or κ·e/γ^e when ``compensated``."""
    e = jnp.asarray(e, dtype)
    lam = jnp.asarray(kappa, dtype) * e
    return lam / jnp.power(jnp.asarray(gamma, dtype), e) if compensated else lam


def penalty_kappa(r, sigma0, epochs: int, iters_per_epoch: int, lr0, gamma, compensated: bool, dtype=jnp.float32):
    """The r-rule's κ: Σ_{e=1}^{epochs} I·λ(e)·η(e)/2 = r·σ₀ with λ(e) = κ·ẽ(e), η(e) = lr0·γ^(e−1). ``epochs`` is
    E − E_ft, the epochs before the fine-tuning phase."""
    e = jnp.arange(1, epochs + 1, dtype=dtype)
    pull_per_kappa = jnp.sum(iters_per_epoch * penalty_lambda(1.0, e, gamma, compensated, dtype)
                             * exp_decay(lr0, gamma, e, dtype) / 2)
    return (r * jnp.asarray(sigma0, dtype) / pull_per_kappa).astype(dtype)


def rescaled_gamma(epochs: int, base: float = 0.99, ref_epochs: int = 250) -> float:
    """γ = base^(ref_epochs/epochs) (spec §6: 0.99^(250/E), e.g. 0.99^2.5 for E = 100)."""
    return float(base ** (ref_epochs / epochs))


def center_lr(mean_leaf_size: float, ref: float = CENTER_LR_REF, ref_leaf: float = CENTER_LEAF_REF) -> float:
    """η₂ = ref·ref_leaf/l̄ (spec §6; CNN1: 1e-4, CNN1-S: 8.6e-5, CNN2-S: 6.6e-5)."""
    return float(ref * ref_leaf / mean_leaf_size)
