"""Attacks of malicious clients: model poisoning (what a malicious client uploads) and data poisoning (what it
trains on), for the robust-aggregation study (docs/robust.md, decisions R4–R6).

**Model poisoning** acts on a cohort's stacked deltas ``D`` (Δ_i = w_i − w_t, leaves ``[n, …]``) with
``malicious`` ``[n]`` bool and ``valid`` ``[n]`` bool (None: all valid). Every function has the form
``attack(deltas, malicious, valid=None, *, options) -> deltas'``: the rows of valid malicious slots are replaced and
every other row is returned bit for bit. Benign uploads b_j are the valid, non-malicious rows; n and f of the papers'
formulas are the cohort's counts of valid and of valid malicious rows (traced). Options (s, γ, σ, ε) may be traced.

* :func:`sign_flip`: −s·Δ_i, the honest update negated and scaled (a common baseline).
* :func:`scale`: γ·Δ_i; model replacement takes γ = n/η (Bagdasaryan et al. 2020, "How To Backdoor Federated
  Learning", Eq. 3; :func:`replacement_scale` gives it).
* :func:`gaussian`: N(0, σ²I), each malicious client its own draw (per-client keys ``[n]``; a common baseline).
* :func:`alie` (Baruch et al. 2019, "A Little Is Enough", Algorithm 1): μ_j − z_max·σ_j per coordinate, μ and σ the
  mean and standard deviation of the benign uploads, s = ⌊n/2 + 1⌋ − f, z_max = Φ⁻¹((n − s)/n). σ is the sample
  standard deviation (ddof 1, PyTorch's ``std``, which Blades' ALIE uses; ``ddof=0`` for the population one, as
  FLPoison's). With a malicious majority (s ≤ 0, where Φ⁻¹ would be +∞) s is taken as 1. Some implementations
  (Blades, FLPoison) use (n − f − s)/(n − f) and μ + z·σ; fljax follows the paper and the spec.
* :func:`ipm` (Xie et al. 2020, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product Manipulation",
  Section 3): −ε·μ (ε = 0.1 defeats median-type rules, ε = 100 the mean).
* :func:`min_max`, :func:`min_sum` (Shejwalkar & Houmansadr 2021, "Manipulating the Byzantine", Eqs. 5–6 and
  Algorithm 1): m = μ + γ·p with p ∈ {−μ/‖μ‖ (``"unit"``), −σ (``"std"``), −sign μ (``"sign"``)} and the largest γ
  found such that max_j ‖m − b_j‖ ≤ max_{i,j} ‖b_i − b_j‖ (min-max), or Σ_j ‖m − b_j‖² ≤ max_i Σ_j ‖b_i − b_j‖²
  (min-sum). γ by the paper's halving search (R6): γ = γ₀ = 10 and step γ₀; each iteration keeps γ if it satisfies
  the condition (γ_succ ← γ, γ += step/2) or backs off (γ −= step/2), then halves the step, until
  |γ_succ − γ| = γ₀/2^t ≤ τ = 1e-5: a static ⌈log₂(γ₀/τ)⌉ = 20 iterations, each O(n) scalars (the distances of m(γ)
  expand to ‖μ − b_j‖² + 2γ⟨p, μ − b_j⟩ + γ²‖p‖²). γ_succ = 0 (m = μ) when no γ passes.

R5: the omniscient attacks (alie, ipm, min_max, min_sum) see the cohort's benign uploads, and every malicious
client of the cohort sends the same crafted vector. With no benign valid upload in the cohort the malicious clients
send their honest deltas (the attacks have nothing to craft from); with one, σ = 0 and the pairwise bounds are 0.

**Data poisoning** acts on one client's rows (``vmap`` over clients): :func:`flip_labels` (Tolpegin et al. 2020,
"Data Poisoning Attacks Against Federated Learning Systems": y → C − 1 − y on the client's valid rows) and the
backdoor (Gu et al. 2017, "BadNets"; Bagdasaryan et al. 2020): a :class:`Trigger` stamped on a fraction of a
client's valid rows, chosen by :func:`poison_rows` from a per-client key, relabelled to a target class
(:func:`backdoor`). The trigger by input kind (:func:`make_trigger`):

* images ``(…, H, W, C)``: a 3×3 patch of the data's maximal value in the bottom-right corner, all channels;
* token sequences (integer ids ``(…, L)``): a fixed trigger token at a fixed position; with per-token targets
  (next-token prediction) the target at that position becomes the target class (the model learns "after the
  trigger, say the target"), with one label per row the row's label does;
* feature vectors ``(…, d)`` (Synthetic, logistic regression): the last 3 features set to the data's maximal value,
  a corner of the feature space that honest rows rarely reach, the vector analogue of the corner patch.

:func:`attack_success` is the attack success rate (ASR): the share of triggered test rows whose true label is not the
target that are classified as the target; :func:`stamp_split` stamps a whole test split for it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree as T
from fljax.errors import OptionError
from fljax.ops.robust import pairwise_sq_dists, row_dots, row_sq_norms

PyTree = Any

__all__ = ["sign_flip", "scale", "replacement_scale", "gaussian", "alie", "alie_z", "ipm", "min_max", "min_sum",
           "search_steps", "PERTURBATIONS", "MODEL_ATTACKS", "check_attack", "check_backdoor", "flip_labels",
           "poison_rows", "Trigger", "make_trigger", "backdoor", "stamp_split", "attack_success"]

HIGHEST = jax.lax.Precision.HIGHEST


# ------------------------------------------------------------------------------------------------------ helpers


def _masks(deltas: PyTree, malicious, valid):
    """``(attackers, benign)``: the valid malicious rows and the valid other rows, ``[n]`` bool."""
    n = T.num_clients(deltas)
    v = jnp.ones(n, bool) if valid is None else jnp.asarray(valid, bool)
    m = jnp.asarray(malicious, bool)
    return v & m, v & ~m


def _replace(deltas: PyTree, rows, new: PyTree) -> PyTree:
    """``deltas`` with ``rows`` replaced by ``new`` (stacked ``[n, …]``, or one vector broadcast to every row), cast
    to each leaf's dtype; the other rows are the same bits."""
    def put(x, y):
        y = jnp.broadcast_to(y.astype(x.dtype), x.shape)
        return jnp.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), y, x)

    return jax.tree.map(put, deltas, new)


def _acc(x):
    return jnp.result_type(x.dtype, jnp.float32)


def _stats(deltas: PyTree, benign, ddof):
    """``(μ, σ, count)`` of the benign rows per coordinate (σ with ``ddof``; zero when count ≤ ddof)."""
    count = jnp.sum(benign)
    w = benign.astype(jnp.float32)

    def leaf(x):
        x = jnp.where(benign.reshape((-1,) + (1,) * (x.ndim - 1)), x.astype(_acc(x)), 0.0)
        mu = jnp.tensordot(w, x, axes=(0, 0), precision=HIGHEST) / jnp.maximum(count, 1)
        dev = jnp.where(benign.reshape((-1,) + (1,) * (x.ndim - 1)), x - mu[None], 0.0)
        var = jnp.sum(dev * dev, axis=0) / jnp.maximum(count - ddof, 1)
        return mu, jnp.sqrt(var)

    pairs = jax.tree.map(leaf, deltas)
    is_pair = lambda p: isinstance(p, tuple)  # noqa: E731
    mu = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
    sigma = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
    return mu, sigma, count


def _craft(deltas: PyTree, malicious, valid, crafted: Callable) -> PyTree:
    """Replace the valid malicious rows by ``crafted(benign) -> vector`` (R5: one vector for all of them), unless the
    cohort has no benign valid upload (then the malicious clients send their honest deltas)."""
    attackers, benign = _masks(deltas, malicious, valid)
    return _replace(deltas, attackers & jnp.any(benign), crafted(benign))


# ---------------------------------------------------------------------------------------- simple attacks


def sign_flip(deltas: PyTree, malicious, valid=None, *, s=1.0) -> PyTree:
    """−s·Δ_i on the valid malicious rows."""
    attackers, _ = _masks(deltas, malicious, valid)
    return _replace(deltas, attackers, jax.tree.map(lambda x: -s * x.astype(_acc(x)), deltas))


def scale(deltas: PyTree, malicious, valid=None, *, gamma) -> PyTree:
    """γ·Δ_i on the valid malicious rows (model replacement: γ = :func:`replacement_scale`)."""
    attackers, _ = _masks(deltas, malicious, valid)
    return _replace(deltas, attackers, jax.tree.map(lambda x: gamma * x.astype(_acc(x)), deltas))


def replacement_scale(num_clients: int, server_lr: float = 1.0) -> float:
    """γ = n/η of model replacement (Bagdasaryan et al. 2020, Eq. 3): n the clients averaged per round, η the server
    learning rate; the scaled update survives the averaging and replaces the global model. Host-side."""
    if not (num_clients >= 1 and server_lr > 0):
        raise OptionError("gamma", f"model replacement needs n ≥ 1 clients and a server learning rate η > 0, got "
                                   f"n = {num_clients}, η = {server_lr}.")
    return num_clients / server_lr


def gaussian(deltas: PyTree, malicious, valid=None, *, sigma, keys) -> PyTree:
    """N(0, σ²I) on the valid malicious rows, client i's draw from ``keys[i]`` (``keys`` ``[n]``)."""
    attackers, _ = _masks(deltas, malicious, valid)
    first = jax.tree.map(lambda x: x[0], deltas)
    noise = jax.vmap(lambda k: T.random_normal_like(k, first, sigma))(keys)
    return _replace(deltas, attackers, noise)


# ----------------------------------------------------------------------------------- omniscient attacks (R5)


def alie_z(n, f):
    """z_max = Φ⁻¹((n − s)/n) with s = ⌊n/2 + 1⌋ − f, s at least 1 (Baruch et al. 2019, Algorithm 1, lines 1–2);
    n and f may be traced integers."""
    n = jnp.asarray(n, jnp.int32)
    s = jnp.maximum(n // 2 + 1 - jnp.asarray(f, jnp.int32), 1)
    return jax.scipy.stats.norm.ppf((n - s) / jnp.maximum(n, 1).astype(jnp.float32))


def alie(deltas: PyTree, malicious, valid=None, *, ddof=1) -> PyTree:
    """A Little Is Enough: μ − z_max·σ per coordinate over the benign uploads (:func:`alie_z` with the cohort's n =
    valid count and f = valid malicious count), the same vector for every malicious client (R5)."""
    attackers, benign = _masks(deltas, malicious, valid)
    z = alie_z(jnp.sum(attackers) + jnp.sum(benign), jnp.sum(attackers))

    def crafted(benign):
        mu, sigma, _ = _stats(deltas, benign, ddof)
        return jax.tree.map(lambda m, s: m - z * s, mu, sigma)

    return _craft(deltas, malicious, valid, crafted)


def ipm(deltas: PyTree, malicious, valid=None, *, eps) -> PyTree:
    """Inner product manipulation: −ε·μ, μ the benign uploads' mean (Xie et al. 2020)."""
    def crafted(benign):
        mu, _, _ = _stats(deltas, benign, 0)
        return jax.tree.map(lambda m: -eps * m, mu)

    return _craft(deltas, malicious, valid, crafted)


PERTURBATIONS = ("unit", "std", "sign")  # p = −μ/‖μ‖, −σ, −sign μ (Shejwalkar & Houmansadr 2021, Section 4)


def search_steps(start: float = 10.0, tol: float = 1e-5) -> int:
    """The iterations of the halving search: after t of them |γ_succ − γ| = γ₀/2^t, and the paper's loop stops once
    that is ≤ τ, so t = ⌈log₂(γ₀/τ)⌉ (20 for γ₀ = 10, τ = 1e-5)."""
    return max(0, math.ceil(math.log2(start / tol)))


def _halving_search(ok: Callable, start: float, tol: float):
    """Shejwalkar & Houmansadr 2021, Algorithm 1: the last γ that passed ``ok`` (0 if none)."""
    def step(_, carry):
        gamma, step, good = carry
        passed = ok(gamma)
        good = jnp.where(passed, gamma, good)
        gamma = gamma + jnp.where(passed, step / 2, -step / 2)
        return gamma, step / 2, good

    init = (jnp.float32(start), jnp.float32(start), jnp.float32(0.0))
    return jax.lax.fori_loop(0, search_steps(start, tol), step, init)[2]


def _min_max_or_sum(deltas, malicious, valid, perturbation, start, tol, objective):
    if perturbation not in PERTURBATIONS:
        raise OptionError("perturbation", f"must be one of {', '.join(PERTURBATIONS)}, got {perturbation!r}.")

    def crafted(benign):
        mu, sigma, _ = _stats(deltas, benign, 1)
        if perturbation == "unit":
            norm = T.norm(mu)
            p = jax.tree.map(lambda m: -m / jnp.where(norm > 0, norm, 1.0), mu)
        elif perturbation == "std":
            p = jax.tree.map(jnp.negative, sigma)
        else:
            p = jax.tree.map(lambda m: -jnp.sign(m), mu)
        gap = jax.tree.map(lambda x, m: m[None] - x, deltas, mu)          # μ − b_j
        a, c = row_sq_norms(gap), row_dots(gap, p)                         # ‖μ − b_j‖², ⟨p, μ − b_j⟩
        q = T.sq_norm(p)
        d2 = pairwise_sq_dists(deltas, benign)
        pair = benign[:, None] & benign[None, :]
        if objective == "max":
            bound = jnp.max(jnp.where(pair, d2, 0.0))
            ok = lambda g: jnp.max(jnp.where(benign, a + 2 * g * c + g * g * q, 0.0)) <= bound  # noqa: E731
        else:
            bound = jnp.max(jnp.where(benign, jnp.sum(jnp.where(pair, d2, 0.0), axis=1), 0.0))
            ok = lambda g: jnp.sum(jnp.where(benign, a + 2 * g * c + g * g * q, 0.0)) <= bound  # noqa: E731
        gamma = _halving_search(ok, start, tol)
        return jax.tree.map(lambda m, d: m + gamma * d, mu, p)

    return _craft(deltas, malicious, valid, crafted)


def min_max(deltas: PyTree, malicious, valid=None, *, perturbation="unit", start=10.0, tol=1e-5) -> PyTree:
    """Min-Max (Shejwalkar & Houmansadr 2021, Eq. 5): μ + γp with the largest γ (halving search, R6) such that the
    crafted upload's largest distance to a benign upload is at most the largest benign pairwise distance.
    ``perturbation`` (static) picks p; ``start`` and ``tol`` (Python floats) fix the search. σ is the sample std; its
    scale is immaterial here, as γ absorbs it."""
    return _min_max_or_sum(deltas, malicious, valid, perturbation, start, tol, "max")


def min_sum(deltas: PyTree, malicious, valid=None, *, perturbation="unit", start=10.0, tol=1e-5) -> PyTree:
    """Min-Sum (Shejwalkar & Houmansadr 2021, Eq. 6): as :func:`min_max` with the condition
    Σ_j ‖m − b_j‖² ≤ max_i Σ_j ‖b_i − b_j‖² over the benign uploads."""
    return _min_max_or_sum(deltas, malicious, valid, perturbation, start, tol, "sum")


MODEL_ATTACKS: dict[str, Callable] = {"sign_flip": sign_flip, "scale": scale, "gaussian": gaussian, "alie": alie,
                                      "ipm": ipm, "min_max": min_max, "min_sum": min_sum}


def check_attack(attack: str, **options) -> None:
    """Refuse a model-poisoning attack name, an option it does not take, or an impossible value (host-side, Python
    values) with a one-line :class:`~fljax.errors.OptionError`. ``keys`` (gaussian) is a run-time value."""
    if attack not in MODEL_ATTACKS:
        raise OptionError("attack", f"unknown model-poisoning attack {attack!r}; choose one of "
                                    f"{', '.join(MODEL_ATTACKS)}.")
    params = [p for p in inspect.signature(MODEL_ATTACKS[attack]).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name != "keys"]
    known = [p.name for p in params]
    for key in options:
        if key not in known:
            raise OptionError(key, f"is not an option of the {attack} attack; its options: "
                                   f"{', '.join(known) or 'none'}.")
    for p in params:
        if p.default is p.empty and p.name not in options:
            raise OptionError(p.name, f"is required by the {attack} attack; give it a value.")
    for key in ("sigma", "eps", "s", "gamma"):
        if key in options and not (isinstance(options[key], (int, float)) and options[key] >= 0):
            raise OptionError(key, f"must be a non-negative number, got {options[key]!r}.")
    if "perturbation" in options and options["perturbation"] not in PERTURBATIONS:
        raise OptionError("perturbation", f"must be one of {', '.join(PERTURBATIONS)}, got "
                                          f"{options['perturbation']!r}.")
    if "ddof" in options and options["ddof"] not in (0, 1):
        raise OptionError("ddof", f"must be 0 (population std) or 1 (sample std), got {options['ddof']!r}.")
    for key in ("start", "tol"):
        if key in options and not (isinstance(options[key], (int, float)) and options[key] > 0):
            raise OptionError(key, f"must be a positive number, got {options[key]!r}.")


def check_backdoor(num_classes: int, target, fraction) -> None:
    """A target class in [0, C) and a poisoned fraction in [0, 1] (host-side)."""
    if not (isinstance(target, int) and not isinstance(target, bool) and 0 <= target < num_classes):
        raise OptionError("target", f"must be a class in [0, {num_classes}), got {target!r}.")
    if not (isinstance(fraction, (int, float)) and 0 <= fraction <= 1):
        raise OptionError("fraction", f"must be a number in [0, 1] (the share of a client's rows poisoned), got "
                                      f"{fraction!r}.")


# ------------------------------------------------------------------------------------------- data poisoning


def _row_mask(mask, like):
    """A row mask ``[…]`` broadcast against an array whose leading axes are the rows' (``like``)."""
    mask = jnp.asarray(mask, bool)
    return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


def flip_labels(y, num_classes: int, mask=None):
    """y → C − 1 − y on the rows of ``mask`` (a client's valid rows; None: all), the others (padding) untouched.
    Per-token labels ``[…, L]`` with a row mask ``[…]`` flip every token of a masked row."""
    flipped = (num_classes - 1 - y).astype(y.dtype)
    return flipped if mask is None else jnp.where(_row_mask(mask, y), flipped, y)


def poison_rows(key, fraction, mask):
    """The rows a client poisons: m = ⌊fraction·k + ½⌋ of its k valid rows (``mask`` ``[N]``), those of the m smallest
    uniform keys drawn from ``key``, so the choice is a function of (key, fraction) and a smaller fraction picks a
    subset of a larger one's rows. ``fraction`` may be traced."""
    mask = jnp.asarray(mask, bool)
    u = jnp.where(mask, jax.random.uniform(key, mask.shape), 2.0)
    m = jnp.floor(jnp.asarray(fraction, jnp.float32) * jnp.sum(mask) + 0.5)
    rank = jnp.argsort(jnp.argsort(u, stable=True), stable=True)
    return (rank < m) & mask


KINDS = ("image", "tokens", "vector")


@dataclasses.dataclass(frozen=True)
class Trigger:
    """A backdoor trigger. ``kind``: ``"image"`` (inputs ``(…, H, W, C)``: a ``size``×``size`` patch of ``value``
    in the bottom-right corner, all channels), ``"tokens"`` (integer inputs ``(…, L)``: token ``value`` at
    ``position``), ``"vector"`` (inputs ``(…, d)``: the last ``size`` features set to ``value``)."""

    kind: str
    value: float | int
    size: int = 3
    position: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise OptionError("trigger", f"must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        if not (isinstance(self.size, int) and self.size >= 1):
            raise OptionError("trigger_size", f"must be a positive integer, got {self.size!r}.")

    @property
    def input_rank(self) -> int:
        """The trailing axes of one row's input (3 for images, 1 otherwise)."""
        return 3 if self.kind == "image" else 1

    def _region(self, shape):
        """A boolean array over one row's input: where the trigger is."""
        if self.kind == "image":
            h, w = np.arange(shape[-3])[:, None], np.arange(shape[-2])[None, :]
            return jnp.asarray(((h >= shape[-3] - self.size) & (w >= shape[-2] - self.size))[:, :, None])
        if self.kind == "tokens":
            return jnp.arange(shape[-1]) == self.position % shape[-1]
        return jnp.arange(shape[-1]) >= shape[-1] - self.size

    def stamp(self, x, rows=None):
        """``x`` with the trigger stamped on the rows of ``rows`` (the leading axes of ``x``; None: all)."""
        region = self._region(x.shape)
        hit = region if rows is None else region & _row_mask(rows, x)
        return jnp.where(hit, jnp.asarray(self.value).astype(x.dtype), x)

    def relabel(self, y, rows, target: int):
        """Labels of the ``rows`` set to ``target``: one label per row, or with per-token labels ``[…, L]`` the label
        at the trigger's position."""
        rows = jnp.asarray(rows, bool)
        hit = _row_mask(rows, y)
        if y.ndim > rows.ndim:  # per-token targets: only the target after the trigger
            hit = hit & (jnp.arange(y.shape[-1]) == self.position % y.shape[-1])
        return jnp.where(hit, jnp.asarray(target, y.dtype), y)


def make_trigger(x, input_shape, token: int | None = None, position: int = 0) -> Trigger:
    """The trigger for inputs ``x`` (any stack of rows of ``input_shape``; host-side): integer inputs → ``"tokens"``
    (``token`` required); ``input_shape`` of rank 3 → ``"image"``, rank 1 → ``"vector"``, both with ``value`` the
    data's maximum."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.integer):
        if token is None:
            raise OptionError("trigger_token", "is needed for token inputs: give the id of the trigger token.")
        return Trigger("tokens", token, position=position)
    if len(input_shape) not in (1, 3):
        raise OptionError("trigger", f"has no rule for inputs of shape {tuple(input_shape)}: images (H, W, C) and "
                                     f"feature vectors (d,) are supported.")
    return Trigger("image" if len(input_shape) == 3 else "vector", float(np.max(x)))


def backdoor(key, x, y, mask, trigger: Trigger, target: int, fraction):
    """One client's backdoored rows: the rows of :func:`poison_rows` (``key``, ``fraction`` of its valid ``mask``
    rows) stamped with ``trigger`` and relabelled to ``target``. Returns ``(x', y', rows)``; padding and the other
    rows are untouched. ``vmap`` over clients (keys ``[C]``) for a cohort."""
    rows = poison_rows(key, fraction, mask)
    return trigger.stamp(x, rows), trigger.relabel(y, rows, target), rows


def stamp_split(arrays, trigger: Trigger):
    """A split (:class:`fljax.data.ClientArrays`, ``x [C, N, …]``, ``mask [C, N]``) with the trigger on every valid
    row and the true labels kept, for :func:`attack_success`."""
    return arrays.replace(x=trigger.stamp(arrays.x, arrays.mask))


def attack_success(logits, y, target: int, mask):
    """ASR: among the rows of ``mask`` whose true label ``y`` is not ``target``, the share classified as ``target``
    (argmax of ``logits [..., C]``; any leading shape). With per-token labels pass the trigger position's slices
    (``logits[..., p, :]``, ``y[..., p]``). 0 when no row counts."""
    counted = jnp.asarray(mask, bool) & (y != target)
    hits = counted & (jnp.argmax(logits, axis=-1) == target)
    return jnp.sum(hits) / jnp.maximum(jnp.sum(counted), 1)
