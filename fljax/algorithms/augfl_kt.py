"""AugFL's knowledge-transfer regulariser R_h and its gradient G_t ≈ ∇_θ R_h(θ^t, θ_p), computed by the server alone
on its own set 𝒟_s with its frozen pretrained model (AugFL spec §3).

``kt='crd'`` (default, the authors' code): projection heads ψ = (f^s, f^c) (Linear → d_e → L2-normalise) and memory
banks B_s, B_t ∈ ℝ^{D_s×d_e} persist on the server. Every round 𝒟_s is shuffled into ⌊D_s/B⌋ minibatches; sample j
gets N negatives drawn uniformly (with replacement) from server samples of other classes; with v_s = f^s(g^θ(x_j))
and v_t = f^c(c_j) (c_j the PM's penultimate feature, computed once)

    student anchor  e_jk = exp(⟨B_t[K_j[k]], v_s⟩/τ)/Z_s,   teacher anchor  e′_jk = exp(⟨B_s[K_j[k]], v_t⟩/τ)/Z_t,
    ℓ(e_j) = −log(e_j0/(e_j0 + q)) − Σ_{k≥1} log(q/(e_jk + q)),   q = N/D_s        (:func:`fljax.ops.distill.crd_loss`)
    L_KT = γ_CE·CE(logits_θ(x), y) + β·mean_j[ℓ(e_j) + ℓ(e′_j)]

Z_s, Z_t are fixed at the first batch ever to D_s·mean(raw scores). The θ-gradients of L_KT at fixed θ^t are
averaged over the batches (G_t); between batches ψ takes an SGD step (lr 0.002, momentum 0.9, weight decay 5e-4,
optimiser state fresh every round) and the banks move: B[j] ← normalise(m·B[j] + (1 − m)·v(x_j)).
``kt_augment='crop_flip'`` (spec D18's alternative, the authors' code): every batch of server images is randomly
cropped (zero padding ``kt_crop_pad``) and mirrored (:mod:`fljax.data.augment`) before both models see it, so the
PM's features and logits are computed on the augmented batch instead of once.
``kt_batch_size=None`` (spec D12's alternative) makes the whole of 𝒟_s one batch: G_t = ∇_θ L_KT(θ^t; 𝒟_s) is one
full-batch gradient at the heads (and banks) as they are, which then take their one step of the round.

Alternatives (all keep the γ_CE·CE term except ``param_l2``): ``crd_inbatch`` (in-batch InfoNCE between v_s and
v_t, no banks), ``kd`` (β·T²·KL(softmax(z_p/T) ‖ softmax(z_θ/T)), T = ``kd_temperature``), ``feat_l2``
(β·mean ‖normalise(A s_j) − normalise(c_j)‖², A a linear map trained like ψ), ``param_l2`` (R_h = ‖θ − θ_p‖²,
G_t = 2(θ − θ_p); the PM must share the meta-model's architecture).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.data.augment import random_crop_flip
from fljax.models.model import masked_cross_entropy
from fljax.ops import distill

__all__ = ["KT_KINDS", "KT_AUGMENTS", "kt_init", "kt_grad", "negatives_table"]

KT_KINDS = ("crd", "crd_inbatch", "kd", "feat_l2", "param_l2")
KT_AUGMENTS = ("none", "crop_flip")
_HEADS = {"crd": True, "crd_inbatch": True, "feat_l2": True, "kd": False, "param_l2": False}


def _normalize(v):
    return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def _heads(algo, feat_dim: int):
    """The trained server-side maps: (f^s, f^c) for CRD, A for feat_l2."""
    if algo.kt == "feat_l2":
        return {"a": nn.Dense(feat_dim)}
    head = distill.ProjectionHead(out=algo.kt_dim)
    return {"s": head, "t": head}


def kt_init(algo, key, model, server) -> dict:
    """The server's persistent knowledge-transfer state: head parameters (and, for ``crd``, the memory banks and the
    normalisers Z, negative while unset)."""
    if not _HEADS[algo.kt]:
        return {}
    d_s = jax.eval_shape(model.features, jax.eval_shape(model.init, key), server.x[:1]).shape[-1]
    d_t = server.pm_features.shape[-1]
    heads = _heads(algo, d_t)
    k_s, k_t, k_bs, k_bt = jax.random.split(key, 4)
    if algo.kt == "feat_l2":
        return {"heads": {"a": heads["a"].init(k_s, jnp.zeros((1, d_s)))["params"]}}
    state = {"heads": {"s": heads["s"].init(k_s, jnp.zeros((1, d_s)))["params"],
                       "t": heads["t"].init(k_t, jnp.zeros((1, d_t)))["params"]}}
    if algo.kt == "crd":
        bound = 1.0 / jnp.sqrt(algo.kt_dim / 3.0)
        shape = (server.size, algo.kt_dim)
        state["bank_s"] = jax.random.uniform(k_bs, shape, minval=-bound, maxval=bound)
        state["bank_t"] = jax.random.uniform(k_bt, shape, minval=-bound, maxval=bound)
        state["z"] = -jnp.ones((2,), jnp.float32)
    return state


def negatives_table(y, num_classes: int):
    """``(table [C, D], n_other [C])``: row c lists (first) the indices of the samples whose label is not c."""
    other = y[None, :] != jnp.arange(num_classes)[:, None]
    return jnp.argsort(~other, axis=1, stable=True), jnp.sum(other, axis=1)


def _head_optimizer(algo):
    return optax.chain(optax.add_decayed_weights(algo.kt_head_wd), optax.sgd(algo.kt_head_lr,
                                                                            momentum=algo.kt_head_momentum))


def num_negatives(algo, server_size: int) -> int:
    return algo.kt_negatives if algo.kt_negatives is not None else min(16384, server_size // 2)


def _teacher(algo, server, idx, x):
    """The PM's (features, logits) on the batch: precomputed, or recomputed on the augmented images."""
    if algo.kt_augment == "none":
        return server.pm_features[idx], server.pm_logits[idx]
    return jax.lax.stop_gradient(server.pm_model.features_and_logits(server.pm_params, x))


def _batch_loss(algo, model, theta, heads, state, server, idx, negs, aug_key=None):
    """L_KT of one batch of server indices ``idx`` [B] (``negs`` [B, N] for crd; ``aug_key`` draws the crops and
    flips of ``kt_augment``); returns (loss, (aux, new Z, v_s, v_t))."""
    x, y = server.x[idx], server.y[idx]
    if algo.kt_augment == "crop_flip":
        x = random_crop_flip(aug_key, x, algo.kt_crop_pad)
    feat, logits = model.features_and_logits(theta, x)
    feat_t, logits_t = _teacher(algo, server, idx, x)
    ce = masked_cross_entropy(logits, y, jnp.ones(y.shape, bool))
    d = server.size
    z = state.get("z")
    if algo.kt == "kd":
        kt = distill.kl_divergence(logits_t, logits, algo.kd_temperature, scale_t2=True)
        return algo.kt_ce_weight * ce + algo.kt_weight * kt, (ce, kt, z, None, None)
    if algo.kt == "feat_l2":
        mapped = nn.Dense(feat_t.shape[-1]).apply({"params": heads["a"]}, feat)
        kt = distill.feature_l2(mapped, feat_t, normalize=True)
        return algo.kt_ce_weight * ce + algo.kt_weight * kt, (ce, kt, z, None, None)
    head = distill.ProjectionHead(out=algo.kt_dim)
    v_s = head.apply({"params": heads["s"]}, feat)
    v_t = head.apply({"params": heads["t"]}, feat_t)
    if algo.kt == "crd_inbatch":
        kt = distill.info_nce(v_s, v_t, algo.kt_tau)
        return algo.kt_ce_weight * ce + algo.kt_weight * kt, (ce, kt, z, v_s, v_t)
    cand = jnp.concatenate([idx[:, None], negs], axis=1)  # [B, N+1]: the positive (j itself), then negatives
    w_t, w_s = state["bank_t"][cand], state["bank_s"][cand]
    raw = lambda w, v: jnp.exp(jnp.einsum("bkd,bd->bk", w, jax.lax.stop_gradient(v),  # noqa: E731
                                          precision=jax.lax.Precision.HIGHEST) / algo.kt_tau)
    z = jnp.where(z < 0, d * jnp.stack([jnp.mean(raw(w_t, v_s)), jnp.mean(raw(w_s, v_t))]), z)
    kt = (distill.crd_loss(w_t[:, 0], v_s, w_t[:, 1:], d, algo.kt_tau, z[0])
          + distill.crd_loss(w_s[:, 0], v_t, w_s[:, 1:], d, algo.kt_tau, z[1]))
    return algo.kt_ce_weight * ce + algo.kt_weight * kt, (ce, kt, z, v_s, v_t)


def kt_grad(algo, model, theta, state: dict, server, key, num_classes: int):
    """(G_t, new state, metrics): the knowledge-transfer gradient at fixed θ^t (see the module docstring)."""
    if algo.kt == "param_l2":
        diff = tree.sub(theta, jax.lax.stop_gradient(server.pm_params))
        return tree.scale(2.0, diff), state, {"kt_loss": tree.sq_norm(diff)}
    d = server.size
    b = d if algo.kt_batch_size is None else min(algo.kt_batch_size, d)
    nb = d // b
    k_perm, k_neg = jax.random.split(key)
    batches = jax.random.permutation(k_perm, d)[: nb * b].reshape(nb, b)
    n_neg = num_negatives(algo, d)
    table, n_other = negatives_table(server.y, num_classes)
    opt = _head_optimizer(algo)
    heads = state.get("heads", {})
    grad_fn = jax.grad(lambda t, h, st, idx, negs, k_aug: _batch_loss(algo, model, t, h, st, server, idx, negs,
                                                                       k_aug), argnums=(0, 1), has_aux=True)

    def body(carry, inputs):
        heads, opt_state, st, g_acc = carry
        idx, k = inputs
        negs = None
        if algo.kt == "crd":
            cls = server.y[idx]
            u = jax.random.uniform(k, (b, n_neg))
            negs = table[cls[:, None], jnp.floor(u * n_other[cls][:, None]).astype(jnp.int32)]
        (g_theta, g_heads), (ce, kt, z, v_s, v_t) = grad_fn(theta, heads, st, idx, negs, jax.random.fold_in(k, 1))
        if algo.kt == "crd":
            m = algo.kt_momentum
            move = lambda bank, v: bank.at[idx].set(_normalize(m * bank[idx] + (1 - m) * v))  # noqa: E731
            st = {**st, "z": z, "bank_s": move(st["bank_s"], v_s), "bank_t": move(st["bank_t"], v_t)}
        if heads:
            updates, opt_state = opt.update(g_heads, opt_state, heads)
            heads = optax.apply_updates(heads, updates)
        return (heads, opt_state, st, tree.add(g_acc, g_theta)), (ce, kt)

    carry = (heads, opt.init(heads), state, tree.zeros_like(theta))
    keys = jax.random.split(k_neg, nb)
    (heads, _, state, g_sum), (ce, kt) = jax.lax.scan(body, carry, (batches, keys), unroll=min(nb, 8))
    if heads:
        state = {**state, "heads": heads}
    return tree.scale(1.0 / nb, g_sum), state, {"kt_loss": jnp.mean(kt), "kt_ce": jnp.mean(ce)}
