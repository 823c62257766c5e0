"""Distillation losses: logit KL (QuPeD §2 KD, FML), feature L2 and contrastive representation losses (AugFL §3).

Sample axis first; ``mask`` [B] marks valid (non-padding) samples, and masked means divide by max(Σ mask, 1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn

__all__ = ["kl_divergence", "feature_l2", "info_nce", "ProjectionHead", "crd_critic", "crd_loss"]


def _masked_mean(v, mask):
    if mask is None:
        return jnp.mean(v)
    mask = jnp.asarray(mask, v.dtype)
    return jnp.sum(mask * v) / jnp.maximum(jnp.sum(mask), 1)


def kl_divergence(teacher_logits, student_logits, temperature=1.0, mask=None, scale_t2: bool = False,
                  student_temperature=None):
    """KL(p_t ‖ p_s) = mean over (masked) samples of Σ_y p_t(y)(log p_t(y) − log p_s(y)), with p_t = softmax(z_t/T)
    and p_s = softmax(z_s/T_s), T_s = ``student_temperature`` (default T).

    QuPeD §2: f_KD(x, w) = D_KL(s(w) ‖ s(x)), teacher first, T = 1 (D4); D4's options: T > 1 on both logits with
    ``scale_t2``, or teacher-only softening (``student_temperature=1``, the authors' hook). ``scale_t2`` multiplies by
    T² (Hinton's scaling; AugFL's ``kd`` option with T = 4) so gradient magnitudes do not shrink with T."""
    ts = temperature if student_temperature is None else student_temperature
    log_pt = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
    log_ps = jax.nn.log_softmax(student_logits / ts, axis=-1)
    p_t = jnp.exp(log_pt)
    kl = jnp.sum(jnp.where(p_t > 0, p_t * (log_pt - log_ps), 0), axis=-1)  # 0·log 0 = 0 for −inf teacher logits
    out = _masked_mean(kl, mask)
    return out * temperature ** 2 if scale_t2 else out


def _normalize(v, eps=1e-12):
    return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), eps)


def feature_l2(f_student, f_teacher, mask=None, normalize: bool = False):
    """mean_j ‖f_s,j − f_t,j‖² over (masked) samples; ``normalize=True`` L2-normalises both features first
    (AugFL's ``feat_l2`` option: ‖normalise(A s_j) − normalise(c_j)‖², with A applied by the caller)."""
    if normalize:
        f_student, f_teacher = _normalize(f_student), _normalize(f_teacher)
    return _masked_mean(jnp.sum(jnp.square(f_student - f_teacher), axis=-1), mask)


def info_nce(z_a, z_b, temperature):
    """In-batch InfoNCE: mean_j −log softmax_k(⟨z_a,j, z_b,k⟩/τ)[j]; pair j is the positive, the other samples of
    the batch the negatives (AugFL ``crd_inbatch``). Pass L2-normalised embeddings (:class:`ProjectionHead`)."""
    logits = jnp.einsum("id,jd->ij", z_a, z_b, precision=jax.lax.Precision.HIGHEST) / temperature
    return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))


class ProjectionHead(nn.Module):
    """f^s / f^c of CRD: Dense(hidden) → ReLU → Dense(out) → L2-normalise. ``hidden=0`` is a single Dense → normalise
    (the authors' AugFL code's linear embedding)."""

    out: int = 128
    hidden: int = 0

    @nn.compact
    def __call__(self, h):
        if self.hidden:
            h = nn.relu(nn.Dense(self.hidden)(h))
        return _normalize(nn.Dense(self.out)(h))


def crd_critic(c, s, n_neg, data_size, tau, z=1.0):
    """AugFL §3: h(c, s) = e/(e + N/D) with e = exp(⟨c, s⟩/τ)/Z on embedded features (last axis); N negatives per
    positive, D = |𝒟_s|; Z = 1 in the paper, the code's fixed normaliser otherwise."""
    e = jnp.exp(jnp.sum(c * s, axis=-1) / tau) / z
    return e / (e + n_neg / data_size)


def crd_loss(c_pos, s_pos, c_neg, data_size, tau, z=1.0):
    """R_h = −E_pos[log h(c_j, s_j)] − N·E_neg[log(1 − h(c_n, s_j))] (AugFL §3), i.e.
    mean_j[−log h_j − Σ_k log(1 − h_jk)].

    ``c_pos``, ``s_pos`` [B, d]: positive pairs; ``c_neg`` [B, N, d]: N negatives for each anchor s_j. Computed in
    log space: log h = σ' − logaddexp(σ', log q), log(1 − h) = log q − logaddexp(σ', log q), σ' = ⟨c,s⟩/τ − log Z,
    q = N/D."""
    n = c_neg.shape[1]
    log_q = jnp.log(n / data_size)
    pos = jnp.sum(c_pos * s_pos, axis=-1) / tau - jnp.log(z)
    neg = jnp.einsum("bnd,bd->bn", c_neg, s_pos, precision=jax.lax.Precision.HIGHEST) / tau - jnp.log(z)
    log_h_pos = pos - jnp.logaddexp(pos, log_q)
    log_1mh_neg = log_q - jnp.logaddexp(neg, log_q)
    return jnp.mean(-log_h_pos - jnp.sum(log_1mh_neg, axis=-1))
