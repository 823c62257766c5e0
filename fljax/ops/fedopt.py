"""Adaptive server optimizers of FedOpt (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2), as optax
transformations of the server's pseudo-gradient.

With the clients' mean change Δ_t = (1/|S|) Σ_i (x_i − x_t) (fljax's pseudo-gradient is g_t = −Δ_t), Algorithm 2
keeps m_{−1} = 0 and v_{−1} ≥ τ² and steps

    m_t = β₁ m_{t−1} + (1 − β₁) Δ_t
    v_t = v_{t−1} + Δ_t²                                  FedAdagrad
    v_t = v_{t−1} − (1 − β₂) Δ_t² sign(v_{t−1} − Δ_t²)    FedYogi
    v_t = β₂ v_{t−1} + (1 − β₂) Δ_t²                      FedAdam
    x_{t+1} = x_t + η m_t / (√v_t + τ)

elementwise. :func:`scale_by_fedopt` is m_t / (√v_t + τ) on g_t (the signs cancel in v and flip in m: the update
is −η m_t(g) / (√v_t + τ)); :func:`fedopt` chains it with the step −η.

Where optax differs from Algorithm 2 (optax 0.2): ``optax.adam`` and ``optax.yogi`` bias-correct both moments
(m̂ = m/(1 − β₁^t), v̂ = v/(1 − β₂^t)), which Algorithm 2 does not; ``optax.adam`` starts v at 0 and ``optax.yogi``
starts both m and v at ``initial_accumulator_value``; ``optax.adagrad`` has no momentum and puts ε inside the root
(g/√(v + ε)). ``bias_correction=True`` adds Adam's correction (Kingma & Ba 2015, Algorithm 1) to FedAdam and FedYogi:
with v_{−1} = 0 that is ``optax.adam(η, β₁, β₂, eps=τ)``, and with m_{−1} = v_{−1} = 0 ``optax.yogi`` (tested).
Keras' Adam, which Reddi et al.'s experiments ran, adds its ε to √v before the correction instead (an effective
τ/√(1 − β₂^t): the same once t ≫ 1/(1 − β₂)).
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["FEDOPT_KINDS", "FedOptState", "scale_by_fedopt", "fedopt"]

FEDOPT_KINDS = ("adagrad", "yogi", "adam")


class FedOptState(NamedTuple):
    count: jax.Array  # steps taken (for the bias correction)
    m: optax.Updates  # first moment m_t
    v: optax.Updates  # second moment v_t


def scale_by_fedopt(kind: Literal["adagrad", "yogi", "adam"], beta1=0.9, beta2=0.99, tau=1e-3,
                    initial_accumulator=None, bias_correction: bool = False) -> optax.GradientTransformation:
    """m_t / (√v_t + τ) of Algorithm 2 (module docstring) for ``kind``; v_{−1} = ``initial_accumulator`` (None: τ²,
    the smallest Algorithm 2 allows). ``beta2`` is unused by adagrad; ``bias_correction`` (adam, yogi) divides m_t
    by 1 − β₁^t and v_t by 1 − β₂^t (t = 1, 2, …) first. The hyperparameters may be traced."""
    if kind not in FEDOPT_KINDS:
        raise ValueError(f"kind must be one of {FEDOPT_KINDS}, got {kind!r}.")
    if bias_correction and kind == "adagrad":
        raise ValueError("bias_correction applies to adam and yogi (adagrad has no decay to correct).")
    v0 = jnp.square(jnp.asarray(tau, jnp.float32)) if initial_accumulator is None else initial_accumulator

    def init(params):
        return FedOptState(count=jnp.zeros((), jnp.int32), m=jax.tree.map(jnp.zeros_like, params),
                           v=jax.tree.map(lambda p: jnp.full_like(p, v0), params))

    def second_moment(v, g):
        g2 = jnp.square(g)
        if kind == "adagrad":
            return v + g2
        if kind == "yogi":
            return v - (1 - beta2) * g2 * jnp.sign(v - g2)
        return beta2 * v + (1 - beta2) * g2

    def update(updates, state, params=None):
        del params
        m = jax.tree.map(lambda m_, g: beta1 * m_ + (1 - beta1) * g, state.m, updates)
        v = jax.tree.map(second_moment, state.v, updates)
        count = state.count + 1
        m_hat, v_hat = m, v
        if bias_correction:
            t = count.astype(jnp.float32)
            m_hat = jax.tree.map(lambda x: x / (1 - jnp.power(beta1, t)), m)
            v_hat = jax.tree.map(lambda x: x / (1 - jnp.power(beta2, t)), v)
        out = jax.tree.map(lambda a, b: a / (jnp.sqrt(b) + tau), m_hat, v_hat)
        return out, FedOptState(count=count, m=m, v=v)

    return optax.GradientTransformation(init, update)


def fedopt(kind: Literal["adagrad", "yogi", "adam"], learning_rate, beta1=0.9, beta2=0.99, tau=1e-3,
           initial_accumulator=None, bias_correction: bool = False) -> optax.GradientTransformation:
    """FedAdagrad, FedYogi or FedAdam on the pseudo-gradient: :func:`scale_by_fedopt`, then the step −η
    (η = ``learning_rate``)."""
    return optax.chain(scale_by_fedopt(kind, beta1, beta2, tau, initial_accumulator, bias_correction),
                       optax.scale(-learning_rate))
