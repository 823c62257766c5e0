"""Differential privacy operators: update clipping, the Gaussian mechanism on the aggregate, adaptive clipping,
per-example clipping inside a local step (DP-SGD) and Poisson client sampling with static shapes.

**Client-level DP (DP-FedAvg, McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models",
Alg. 1 with the fixed-denominator estimator f̃_f).** Client i's update Δ_i is clipped to L2 norm C,
π_C(Δ) = Δ·min(1, C/‖Δ‖) (:func:`clip_by_norm`; per layer: leaf l to C_l with Σ_l C_l² = C², :func:`clip_per_layer`),
weighted by w_i ∈ [0, 1] and summed; the server adds Gaussian noise of standard deviation z·C to the *sum* and divides
by the *expected* total weight W of a round (:func:`private_mean`)::

    Δ̃ = (Σ_{i ∈ cohort} w_i·π_C(Δ_i) + N(0, z²C²·I)) / W                          (noise std z·C/W on the mean)

Adding or removing one client moves the sum by at most C (w_i ≤ 1), so this is the subsampled Gaussian mechanism with
noise multiplier z that :mod:`fljax.privacy` accounts. Why noise on the sum and a fixed W (McMahan et al.'s f̃_f rather
than a mean over the realised cohort): the sensitivity C/W does not depend on the data or on who was sampled, also
under Poisson sampling where the realised Σ_i w_i is random; the estimator is unbiased; and for a fixed-size cohort of m
clients with uniform weights W = m = Σ_i w_i, so it *is* the cohort mean plus noise of std z·C/m.

**Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping", Alg. 1).** Each
client also reports b_i = 1[‖Δ_i‖ ≤ C]; the server releases the noised fraction
b̄ = (Σ_i (b_i − ½) + N(0, σ_b²))/m + ½ (m the expected cohort size; centring makes the count's sensitivity ½) and
moves the clip geometrically toward the γ-quantile of the update norms, C ← C·exp(−η_C(b̄ − γ))
(:func:`noised_fraction`, :func:`geometric_clip_update`). The two Gaussian queries of a round compose to one of noise
multiplier z when the updates get z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (:func:`adaptive_noise_multiplier`), so the
accounting is unchanged.

**Example-level DP (DP-SGD, Abadi et al. 2016, "Deep Learning with Differential Privacy", Alg. 1).**
:func:`private_value_and_grad` turns ``loss_fn(params, batch)`` into a step's gradient: per-example gradients by a
``vmap`` over the batch (inside the ``vmap`` over clients), each clipped to C, padded examples masked out, summed,
noised with std z·C and divided by the batch size B (the lot size L of Abadi et al.; fixed, like W above).

**Sampling.** Fixed-size cohorts are the engine's (:func:`fljax.engine.sampling.sample_cohort`); :func:`poisson_cohort`
draws each client independently with probability q into a fixed buffer with a validity mask (static shapes).

Every operator is pure and works on one client's pytree (``vmap`` adds the client axis) or on client-stacked trees
``[K, …]`` where it says so. Clipping leaves an update whose norm is within the bound exactly as it is (bit for bit),
so a clip above every norm with z = 0 reproduces plain weighted averaging. Float32 rounding of the norm can leave a
clipped update's norm above C by a few units in the last place (relative 1e-7); the noise is calibrated to C.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree as T

PyTree = Any

__all__ = ["clip_by_norm", "layer_clip_norms", "clip_per_layer", "clip_scales", "scale_leaves", "private_mean",
           "adaptive_noise_multiplier", "noised_fraction", "geometric_clip_update", "per_example_value_and_grad",
           "private_value_and_grad", "poisson_cohort"]


# ---------------------------------------------------------------------------------------------------- clipping


def layer_clip_norms(x: PyTree, clip_norm: float) -> PyTree:
    """Per-leaf bounds C_l = C·√(d_l/d) (d_l the leaf's entries, d the total; Σ_l C_l² = C², so a tree clipped
    layer by layer has global norm ≤ C): a Python float per leaf. The layer rule of TensorFlow Federated's
    per-vector clipping (``build_dp_query(per_vector_clipping=True)``)."""
    sizes = jax.tree.map(lambda a: int(np.prod(np.shape(a))), x)
    total = sum(jax.tree.leaves(sizes))
    return jax.tree.map(lambda d: float(clip_norm) * math.sqrt(d / total), sizes)


def clip_scales(x: PyTree, clip_norm, per_layer: bool = False) -> tuple[PyTree, jax.Array]:
    """``(scales, ‖x‖)``: the factor min(1, C/‖x‖) of every leaf (flat: one global factor; ``per_layer``:
    min(1, C_l/‖x_l‖) with C_l from :func:`layer_clip_norms`) and the global norm before clipping. A factor is
    exactly 1 for a leaf that is not clipped."""
    norm = T.norm(x)
    if per_layer:
        bounds = layer_clip_norms(x, 1.0)
        return jax.tree.map(lambda a, b: _scale(T.norm(a), clip_norm * b), x, bounds), norm
    s = _scale(norm, clip_norm)
    return jax.tree.map(lambda _: s, x), norm


def _scale(norm, bound):
    return jnp.where(norm > bound, bound / jnp.where(norm > 0, norm, 1.0), 1.0).astype(jnp.float32)


def scale_leaves(x: PyTree, scales: PyTree) -> PyTree:
    """x_l·s_l where s_l < 1; the leaf itself (the same bits) where s_l = 1."""
    return jax.tree.map(lambda a, s: jnp.where(s < 1, (a * s).astype(a.dtype), a), x, scales)


def clip_by_norm(x: PyTree, clip_norm) -> tuple[PyTree, jax.Array]:
    """``(π_C(x), ‖x‖)`` with π_C(x) = x·min(1, C/‖x‖₂) over the whole tree (McMahan et al. 2018, Alg. 1 FlatClip;
    Abadi et al. 2016, Alg. 1 "clip gradient"). ``clip_norm`` may be traced (adaptive clipping)."""
    scales, norm = clip_scales(x, clip_norm)
    return scale_leaves(x, scales), norm


def clip_per_layer(x: PyTree, clip_norm) -> tuple[PyTree, jax.Array]:
    """``(clipped, ‖x‖)``: every leaf l clipped to its own C_l = C·√(d_l/d) (:func:`layer_clip_norms`), so
    ‖clipped‖ ≤ √(Σ_l C_l²) = C and the same noise z·C applies (McMahan et al. 2018, PerLayerClip)."""
    scales, norm = clip_scales(x, clip_norm, per_layer=True)
    return scale_leaves(x, scales), norm


# ------------------------------------------------------------------------------------------- Gaussian mechanism


def private_mean(values: PyTree, weights, denominator, noise_stddev, key=None, reference: PyTree | None = None):
    """The noised weighted sum over the leading client axis, divided by a fixed denominator W::

        (Σ_i w_i·v_i + N(0, s²·I)) / W                   (s = ``noise_stddev`` = z·C, the std on the sum)

    ``values`` ``[K, …]`` are the clipped contributions (rows of unsampled slots carry weight 0), ``weights`` ``[K]``.
    With ``reference`` r (the broadcast model) the values are uploads r + π_C(Δ_i) and the estimate is
    r + (Σ_i w_i·(v_i − r) + N(0, s²I))/W, evaluated as Σ_i (w_i/W)·v_i + (1 − Σ_i w_i/W)·r + (s/W)·N(0, I) with the
    r-term dropped where its coefficient is exactly 0: with W = Σ_i w_i and a Python ``noise_stddev`` of 0 the result
    is :func:`fljax.tree.weighted_mean_clients` bit for bit. ``key`` is needed unless ``noise_stddev`` is a Python 0."""
    weights = jnp.asarray(weights, jnp.float32)
    denominator = jnp.asarray(denominator, jnp.float32)
    share = weights / denominator
    mean = jax.tree.map(lambda v: jnp.tensordot(share.astype(v.dtype), v, axes=(0, 0)), values)
    if reference is not None:
        coef = 1.0 - jnp.sum(weights) / denominator
        mean = jax.tree.map(lambda m, r: jnp.where(coef == 0, m, m + (coef * r).astype(m.dtype)), mean, reference)
    if isinstance(noise_stddev, (int, float)) and noise_stddev == 0:
        return mean
    noise = T.random_normal_like(key, mean)
    per_mean = noise_stddev / denominator
    return jax.tree.map(lambda m, n: m + (per_mean * n).astype(m.dtype), mean, noise)


# -------------------------------------------------------------------------------------------- adaptive clipping


def adaptive_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the updates' noise multiplier when the clipped-count query takes std σ_b
    (sensitivity ½), so that the round is one Gaussian mechanism of multiplier z (Andrew et al. 2021, Section 3.1).
    Needs 2σ_b > z; z = 0 (no noise) gives 0. Host-side (Python floats)."""
    if noise_multiplier == 0:
        return 0.0
    if not 2 * count_stddev > noise_multiplier:
        raise ValueError(f"adaptive clipping needs a count noise std σ_b > z/2 = {noise_multiplier / 2:g} (the count "
                         f"query would spend the whole budget), got σ_b = {count_stddev:g}.")
    return (noise_multiplier ** -2 - (2 * count_stddev) ** -2) ** -0.5


def noised_fraction(key, unclipped, count_stddev, expected_count, valid=None):
    """b̄ = (Σ_i v_i·(b_i − ½) + N(0, σ_b²))/m + ½: the private estimate of the fraction of the cohort's updates
    with norm ≤ C (Andrew et al. 2021, Alg. 1; ``unclipped`` b_i ``[K]``, ``valid`` v_i ``[K]`` marks the sampled slots,
    None: all; m = ``expected_count``). A Python ``count_stddev`` of 0 adds no noise."""
    b = jnp.asarray(unclipped, jnp.float32) - 0.5
    if valid is not None:
        b = b * jnp.asarray(valid, jnp.float32)
    total = jnp.sum(b)
    if not (isinstance(count_stddev, (int, float)) and count_stddev == 0):
        total = total + count_stddev * jax.random.normal(key, (), jnp.float32)
    return total / expected_count + 0.5


def geometric_clip_update(clip_norm, fraction, target_quantile, lr):
    """C ← C·exp(−η_C·(b̄ − γ)) (Andrew et al. 2021, Alg. 1, geometric update): the clip shrinks while more than a
    fraction γ of the updates is under it."""
    return clip_norm * jnp.exp(-lr * (fraction - target_quantile))


# ------------------------------------------------------------------------------------ per-example clipping


def _example(batch):
    """One example of a batch as a batch of one (a leading axis of size 1 on every leaf)."""
    return jax.tree.map(lambda a: a[None], batch)


def per_example_value_and_grad(loss_fn: Callable, params: PyTree, batch) -> tuple[jax.Array, PyTree]:
    """``(losses [B], grads [B, …])``: ``jax.value_and_grad(loss_fn)(params, example_j)`` of every example j, each
    example a batch of one (its leaves' slices ``[j:j+1]``), by a ``vmap`` over the batch."""
    vg = jax.value_and_grad(loss_fn)
    return jax.vmap(lambda ex: vg(params, _example(ex)))(batch)


def private_value_and_grad(loss_fn: Callable, clip_norm: float, noise_multiplier: float,
                           batch_size: int | None = None, per_layer: bool = False) -> Callable:
    """DP-SGD's gradient (Abadi et al. 2016, Alg. 1): ``fn(params, batch, key) -> (loss, g̃)`` with::

        g̃ = (Σ_j m_j·π_C(∇ℓ(θ; x_j)) + N(0, z²C²·I)) / B

    per-example gradients from :func:`per_example_value_and_grad`, each clipped to C (``per_layer``: each leaf to
    C_l, :func:`clip_per_layer`), m_j the batch's ``mask`` (padded examples contribute nothing; all ones when the batch
    has no ``mask``), and B = ``batch_size`` (default: the batch's static length), a fixed denominator like W in
    :func:`private_mean`. ``loss`` is the masked mean of the per-example losses (the batch loss one logs, not
    privatised). ``loss_fn(params, batch)`` is any loss of a batch whose leaves have a leading example axis, e.g.
    :meth:`fljax.models.Model.loss`; a model with BatchNorm (statistics across examples) cannot be clipped per example.
    A Python ``noise_multiplier`` of 0 adds no noise (``key`` may then be None)."""
    clip = clip_per_layer if per_layer else clip_by_norm

    def value_and_grad(params, batch, key):
        losses, grads = per_example_value_and_grad(loss_fn, params, batch)
        n = losses.shape[0]
        mask = getattr(batch, "mask", None)
        mask = jnp.ones(n, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
        clipped = jax.vmap(lambda g: clip(g, clip_norm)[0])(grads)
        b = n if batch_size is None else batch_size
        g = private_mean(clipped, mask, b, noise_multiplier * clip_norm, key)
        loss = jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return loss, g

    return value_and_grad


# ------------------------------------------------------------------------------------------------- sampling


def poisson_cohort(key, num_clients: int, rate: float, capacity: int | None = None):
    """Poisson sampling with static shapes: ``(ids [capacity] int32, valid [capacity] bool)``.

    Every client is drawn independently with probability q = ``rate``: client i is in iff its uniform 32-bit key u_i
    is below ⌊q·2³²⌋ (so the realised probability is ⌊q·2³²⌋/2³² ≤ q, never more than accounted). The sampled ids
    fill the buffer in ascending order, ``valid`` marks them, and empty slots hold ``num_clients`` (out of range, as
    :mod:`fljax.engine.cohort`'s buffers). ``capacity`` (default: ``num_clients``, never truncated) is the buffer size;
    when more than ``capacity`` clients are drawn, the ``capacity`` of smallest key are kept, a uniformly random subset
    of the drawn ones (truncated Poisson sampling, which :mod:`fljax.privacy` accounts with dp-accounting's
    ``TruncatedSubsampledGaussianDpEvent``). An empty cohort is possible (then the round's aggregate is noise alone)."""
    if not 0 <= rate <= 1:
        raise ValueError(f"Poisson sampling rate must be in [0, 1], got {rate}.")
    capacity = num_clients if capacity is None else capacity
    if not 1 <= capacity <= num_clients:
        raise ValueError(f"Poisson buffer capacity must be between 1 and num_clients={num_clients}, got {capacity}.")
    keys = jax.random.bits(key, (num_clients,), jnp.uint32)
    drawn = jnp.ones(num_clients, bool) if rate >= 1 else keys < jnp.uint32(math.floor(rate * 2 ** 32))
    if capacity == num_clients:
        pos = jnp.nonzero(drawn, size=capacity, fill_value=num_clients)[0]
    else:
        smallest = jnp.zeros(num_clients, bool).at[jax.lax.top_k(~keys, capacity)[1]].set(True)
        pos = jnp.nonzero(drawn & smallest, size=capacity, fill_value=num_clients)[0]
    return pos.astype(jnp.int32), pos < num_clients
