"""Differential privacy and compressed uploads for centralized algorithms: the ``privacy:`` and ``compression:``
config sections, the privacy accounting (by Google's ``dp-accounting``, never by our own formulas) and the upload
pipeline a server runs between its clients' results and its update.

**Accounting.** One round (client level) or one local step (example level) is a subsampled Gaussian mechanism of
noise multiplier z (:mod:`fljax.ops.privacy`: noise std z·C on a sum of contributions of norm ≤ C). ε after T of them
at δ is dp-accounting's, for the sampling that was run (:func:`dp_event`, :func:`epsilon`):

* ``poisson`` (each record independently with probability q = expected size / N; add-or-remove-one adjacency,
  sensitivity C): ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, RDP or PLD accountant. Drawn into a buffer of
  ``capacity`` < N slots (:func:`fljax.ops.privacy.poisson_cohort`), the truncated mechanism is accounted exactly by
  ``TruncatedSubsampledGaussianDpEvent(N, q, capacity, z)``, which only the PLD accountant models.
* ``fixed`` (m of N without replacement, the engine's cohorts): replace-one adjacency (N public; a neighbouring
  population swaps one record's data), under which the sum's sensitivity is 2C, so the event is
  ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z/2))`` (Wang, Balle & Kasiviswanathan 2019, Thm 27),
  which only the RDP accountant models. Replace-one is a different (and with the doubled sensitivity, for the same z a
  much larger) ε than add-or-remove; Poisson sampling is the sampling of DP-FedAvg (McMahan et al. 2018, Alg. 1) and of
  DP-SGD (Abadi et al. 2016), hence the default.

:func:`calibrate_noise_multiplier` inverts ε(z) with dp-accounting's own ``calibrate_dp_mechanism`` (Brent's method
on the accountant's ε; the returned z meets the target). What cannot be accounted is refused in one line
(:func:`check_accountable`, :func:`resolve_privacy`): a sampling the chosen accountant has no event for, δ ≥ 1/N,
noise without clipping, adaptive clipping whose count query would use the whole budget.

**Why not jax-privacy 2.0.** It was read (v2.0.0) for the parts it could do better. Its accounting
(``jax_privacy.accounting``: ``DpsgdTrainingAccountant``, ``calibrate_noise_multiplier``) is a layer over the same
dp-accounting events with a brentq search, and it models fixed-size batches by Poisson sampling at twice the
sensitivity, a reduction it asserts rather than an event dp-accounting analyses; dp-accounting's
``SampledWithoutReplacementDpEvent`` and ``calibrate_dp_mechanism`` do both jobs directly. Its batch selection
(``CyclicPoissonSampling``) is a host-side NumPy iterator, not the static-shape draw a jitted round needs, and its
``clipped_grad`` is the per-example ``vmap``-and-clip that :func:`fljax.ops.privacy.private_value_and_grad` is in a
few lines, with the sample masks fljax batches carry. It also requires Python ≥ 3.11 (fljax supports 3.10) and
pydantic. So fljax depends on dp-accounting alone.

**Uploads.** :class:`UploadTransform` composes clipping, compression with error feedback, the Gaussian mechanism and
adaptive clipping in the order clip → compress → (clip) → aggregate → noise, pure and ``vmap``-able: per client
:meth:`UploadTransform.encode` (its residual is the client's state), on the server :meth:`UploadTransform.aggregate`
(its :class:`UploadState` is the server's), or both at once on a stacked cohort with :meth:`UploadTransform.apply`.
Why this order: the Gaussian mechanism's sensitivity is the largest norm of what enters the sum, so the last step
before the sum is a projection onto the C-ball (a no-op for top-k and scaled sign of a clipped update, needed after
random-k's d/k scaling, QSGD and any error-feedback residual); compression before the server's noise then costs no
privacy. The other order, noise → compress, puts the noise before the compression, i.e. on each client: compression is
then post-processing and never weakens the guarantee, but each client's noise must carry the whole guarantee (local
DP, std z·C per client instead of per sum) unless a secure aggregation adds it in a distributed way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree as T
from fljax.errors import OptionError
from fljax.ops import privacy as P
from fljax.ops.compress import COMPRESSOR_OPTION, Compressor, Identity, error_feedback, make_compressor
from fljax.options import Options, at_least, between, greater_than, option

PyTree = Any

__all__ = ["ACCOUNTANTS", "SAMPLINGS", "MIN_NOISE", "Sampling", "dp_event", "make_accountant", "epsilon",
           "calibrate_noise_multiplier", "check_accountable", "check_delta", "default_delta", "delta_warning",
           "DELTA_WARN", "poisson_capacity",
           "PrivacyOptions", "CompressionOptions", "PrivacyPlan", "resolve_privacy", "AdaptiveClipping",
           "UploadState", "Contribution", "UploadResult", "UploadTransform", "upload_transform", "ExamplePrivacy",
           "Privacy", "LocalSteps", "weighting_note", "resolve_run", "TRACED_NOISE"]

ACCOUNTANTS = ("pld", "rdp")
SAMPLINGS = ("poisson", "fixed")
OVERFLOW = 1e-9  # poisson_capacity's default probability that a round draws more clients than the buffer holds
CALIBRATION_TOL = 1e-4  # |z − z*| of a calibrated noise multiplier (z* the smallest that meets the target ε)
# The smallest noise multiplier accounted with PLD and the floor of calibration: the PLD's discretised privacy loss
# grows as 1/z² (measured: 1.4 GB and 30 s at z = 0.1 with q = 1; dp-accounting asks 38 GiB at z = 0.001), while
# z = 0.1 already gives ε in the thousands after 100 full-participation rounds, no guarantee at all.
MIN_NOISE = 0.1


# ---------------------------------------------------------------------------------------------------- sampling


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the records of one mechanism step are drawn: ``kind`` 'poisson' (each of the ``population`` N records
    with probability ``size``/N, into a buffer of ``capacity`` slots, None: N) or 'fixed' (``size`` m of N without
    replacement). Records are clients (client level) or a client's examples (example level)."""

    kind: str
    population: int
    size: float
    capacity: int | None = None

    @property
    def rate(self) -> float:
        return self.size / self.population

    @property
    def truncated(self) -> bool:
        return self.kind == "poisson" and self.capacity is not None and self.capacity < self.population


def poisson_capacity(population: int, rate: float, overflow: float = OVERFLOW) -> int:
    """The smallest buffer b with P(Binomial(N, q) > b) ≤ ``overflow``: a round of Poisson sampling then draws more
    clients than the buffer holds (and is truncated) with probability at most ``overflow`` (host-side, SciPy)."""
    from scipy import stats

    b = int(stats.binom.isf(overflow, population, rate))
    while b < population and stats.binom.sf(b, population, rate) > overflow:
        b += 1
    return max(1, min(population, b))


# -------------------------------------------------------------------------------------------------- accounting


@contextlib.contextmanager
def _quiet_absl():
    """dp-accounting logs through absl a warning for every RDP order whose series does not converge (the order is
    then left out of the minimum, which stays a valid bound); calibration probes many noise levels."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_kind(kind: str, accountant: str, capacity: int | None) -> None:
    if accountant not in ACCOUNTANTS:
        raise OptionError("accountant", f"must be one of {list(ACCOUNTANTS)}, got {accountant!r}.")
    if kind not in SAMPLINGS:
        raise OptionError("sampling", f"must be one of {list(SAMPLINGS)}, got {kind!r}.")
    if kind == "fixed" and accountant == "pld":
        raise OptionError("accountant", "'pld' cannot account fixed-size sampling without replacement (dp-accounting "
                                        "has no PLD for it; the run's participation is uniform); use accountant: rdp, "
                                        "or participation.name: poisson.")
    if kind == "fixed" and capacity is not None:
        raise OptionError("capacity", "is the buffer of Poisson sampling; fixed-size sampling has none.")


def check_accountable(sampling: Sampling, accountant: str) -> None:
    """Refuse, in one line naming the key, a sampling the accountant has no dp-accounting event for."""
    _check_kind(sampling.kind, accountant, sampling.capacity)
    if not 0 < sampling.size <= sampling.population:
        raise OptionError("sampling", f"size must be in (0, {sampling.population}] (the population), got "
                                      f"{sampling.size}.")
    if sampling.capacity is not None and not 1 <= sampling.capacity <= sampling.population:
        raise OptionError("participation.capacity", f"must be between 1 and the population {sampling.population}, got "
                                      f"{sampling.capacity}.")
    if sampling.truncated and accountant == "rdp":
        raise OptionError("participation.capacity", f"{sampling.capacity} < {sampling.population} truncates Poisson sampling, which "
                                      f"only the PLD accountant models; use accountant: pld, or participation.capacity: "
                                      f"null (the "
                                      f"whole population, never truncated).")


def check_delta(delta: float, num_records: int) -> None:
    """Refuse δ ≥ 1/N (a mechanism that publishes one record in the clear is (0, 1/N)-DP)."""
    if not 0 < delta < 1 / num_records:
        raise OptionError("delta", f"must be in (0, 1/N) = (0, {1 / num_records:.3g}) for N = {num_records} protected "
                                   f"records (δ ≥ 1/N allows publishing a record), got {delta:g}.")


def default_delta(num_records: int) -> float:
    """δ = N^−1.1, below 1/N by a factor N^0.1."""
    return float(num_records) ** -1.1


DELTA_WARN = 1e-5  # δ above it: a weak guarantee, said in one line (docs/privacy.md, "Choosing δ")


def delta_warning(plan: "PrivacyPlan | None") -> str | None:
    """The one-line warning of a plan whose δ exceeds :data:`DELTA_WARN` (None otherwise). (ε, δ)-DP bounds the
    privacy loss except with probability δ per record, and does not exclude a mechanism that publishes each record
    whole with probability δ: δ·N of the N records in expectation. 1e-5 is deep learning's classic δ (Abadi et al.
    2016, N = 60,000); the default N^−1.1 meets it from N ≈ 35,000 records, and below that it is within N^0.1
    (less than 3×) of 1/N, where publishing one record at random qualifies: 8 % for 10 clients."""
    if plan is None or not plan.delta > DELTA_WARN or plan.records is None:
        return None
    n = plan.records
    source = "the default N^-1.1" if plan.options.delta is None else "privacy.delta"
    what, each = ("examples", "each example") if plan.options.level == "example" else ("clients", "each client's data")
    return (f"privacy: δ = {plan.delta:.3g} ({source} for N = {n:,} {what}) is above {DELTA_WARN:g}, a weak "
            f"guarantee: (ε, δ)-DP still allows publishing {each} whole with probability δ ({plan.delta * n:.2g} of "
            f"the {n:,} {what} expected); set privacy.delta to {DELTA_WARN:g} or less (docs/privacy.md)")


def _check_noise(noise_multiplier: float, accountant: str) -> None:
    if accountant == "pld" and 0 < noise_multiplier < MIN_NOISE:
        raise OptionError("noise_multiplier", f"{noise_multiplier:g} is below {MIN_NOISE}, where the PLD accountant "
                                              f"needs gigabytes and ε is in the thousands; use accountant: rdp, or "
                                              f"more noise.")


def dp_event(noise_multiplier: float, sampling: Sampling, steps: int = 1):
    """The dp-accounting event of ``steps`` rounds (or steps) of the subsampled Gaussian mechanism with noise
    multiplier z = ``noise_multiplier`` (noise std z·C on a sum of contributions of norm ≤ C; see the module
    docstring for the events)."""
    import dp_accounting as dpa

    if sampling.kind == "fixed":
        one = dpa.SampledWithoutReplacementDpEvent(sampling.population, int(sampling.size),
                                                   dpa.GaussianDpEvent(noise_multiplier / 2))
    elif sampling.truncated:
        one = dpa.TruncatedSubsampledGaussianDpEvent(sampling.population, sampling.rate, sampling.capacity,
                                                     noise_multiplier)
    else:
        one = dpa.PoissonSampledDpEvent(sampling.rate, dpa.GaussianDpEvent(noise_multiplier))
    return dpa.SelfComposedDpEvent(one, steps)


def make_accountant(accountant: str, sampling: Sampling):
    """A fresh dp-accounting accountant ('rdp' or 'pld', library defaults) with the sampling's neighbouring
    relation: replace-one for fixed-size sampling, add-or-remove-one for Poisson."""
    import dp_accounting as dpa

    relation = (dpa.NeighboringRelation.REPLACE_ONE if sampling.kind == "fixed"
                else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if accountant == "rdp":
        return dpa.rdp.RdpAccountant(neighboring_relation=relation)
    return dpa.pld.PLDAccountant(neighboring_relation=relation)


def epsilon(noise_multiplier: float, steps: int, delta: float, sampling: Sampling, accountant: str = "pld") -> float:
    """ε of ``steps`` rounds (steps) at δ, by dp-accounting (∞ for z = 0: no noise, no privacy; 0 for no step).
    The PLD accountant refuses 0 < z < :data:`MIN_NOISE`."""
    check_accountable(sampling, accountant)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    _check_noise(noise_multiplier, accountant)
    acc = make_accountant(accountant, sampling)
    with _quiet_absl():
        acc.compose(dp_event(noise_multiplier, sampling, steps))
        return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(target_epsilon: float, steps: int, delta: float, sampling: Sampling,
                               accountant: str = "pld", tol: float = CALIBRATION_TOL) -> float:
    """The smallest noise multiplier z (within ``tol``) whose ε after ``steps`` at δ is at most ``target_epsilon``:
    dp-accounting's ``calibrate_dp_mechanism`` over the same events as :func:`epsilon`, in a bracket found by
    doubling or halving z from 1 that never goes below :data:`MIN_NOISE` (a target met with less noise is refused)."""
    import dp_accounting as dpa

    check_accountable(sampling, accountant)

    def eps(z):
        return epsilon(z, steps, delta, sampling, accountant)

    lo, hi = 1.0, 1.0
    if eps(hi) > target_epsilon:
        while eps(hi) > target_epsilon:
            lo, hi = hi, 2 * hi
    else:
        while lo > MIN_NOISE and eps(lo) <= target_epsilon:
            hi, lo = lo, max(lo / 2, MIN_NOISE)
        if eps(lo) <= target_epsilon:
            raise OptionError("target_epsilon", f"{target_epsilon:g} is met with less noise than z = {MIN_NOISE}, "
                                                f"where the guarantee is vacuous; set a smaller target_epsilon, or "
                                                f"noise_multiplier directly.")
    with _quiet_absl():
        z = dpa.calibrate_dp_mechanism(lambda: make_accountant(accountant, sampling),
                                       lambda z: dp_event(z, sampling, steps), target_epsilon, delta,
                                       dpa.ExplicitBracketInterval(lo, hi), tol=tol)
    return float(z)


# calibration and ε take seconds (PLD): a run asks for the same ones again (resolution, then every seed's simulation;
# ε at every evaluation, for every lane of a grid): cached by their (hashable) arguments
_calibrated = functools.lru_cache(maxsize=256)(calibrate_noise_multiplier)
_epsilon = functools.lru_cache(maxsize=4096)(epsilon)


# ------------------------------------------------------------------------------------------------------ options


def _fraction(v):
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}."


@dataclasses.dataclass
class PrivacyOptions(Options):
    """The ``privacy:`` section: differential privacy of each client (``level: client``, DP-FedAvg) or of each
    training example (``level: example``, DP-SGD inside local training), accounted by dp-accounting."""

    noise_multiplier: float | None = option(None, "z: the Gaussian noise std on the clipped sum is z·clip_norm "
                                                  "(null: calibrated from target_epsilon)", at_least(0))
    target_epsilon: float | None = option(None, "ε to reach at the end of the run; the noise multiplier is "
                                                "calibrated to it before the run (null: use noise_multiplier)",
                                          greater_than(0))
    clip_norm: float | None = option(None, "C: L2 bound of each client's update (level client) or each example's "
                                           "gradient (level example); the initial C under adaptive clipping",
                                     greater_than(0))
    delta: float | None = option(None, "δ of the reported (ε, δ); must be < 1/N for N protected records (null: "
                                       "N^-1.1)", between(0, 1, open_=True))
    accountant: Literal["pld", "rdp"] = option("pld", "dp-accounting's accountant: 'pld' (privacy loss "
                                                      "distributions, tight) or 'rdp' (Rényi DP)")
    level: Literal["client", "example"] = option("client", "whose privacy: a client's whole data (DP-FedAvg) or one "
                                                           "training example (DP-SGD in local training)")
    weight_cap: float = option(1.0, "ŵ: client i's aggregation weight is min(n_i/ŵ, 1) (1: uniform weights)",
                               greater_than(0))
    clipping: Literal["flat", "per_layer"] = option("flat", "'flat': one L2 norm over the whole update; "
                                                            "'per_layer': leaf l to C·sqrt(d_l/d)")
    adaptive: bool = option(False, "adaptive clipping (Andrew et al. 2021): move C toward the target_quantile of "
                                   "the update norms, with its own noised count")
    target_quantile: float = option(0.5, "γ: the quantile of update norms adaptive clipping tracks",
                                    between(0, 1, open_=True))
    clip_lr: float = option(0.2, "η_C: the geometric step C ← C·exp(−η_C(b̄ − γ)) of adaptive clipping",
                            greater_than(0))
    count_stddev: float | None = option(None, "σ_b: noise std of adaptive clipping's count of unclipped clients "
                                              "(null: expected cohort / 20)", greater_than(0))

    def check(self) -> None:
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise OptionError("noise_multiplier", "or target_epsilon must be set (the noise multiplier z, or the ε "
                                                  "it is calibrated to).")
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise OptionError("target_epsilon", "and noise_multiplier are both set; keep one (the noise multiplier "
                                                "is calibrated from target_epsilon).")
        if self.clip_norm is None:
            raise OptionError("clip_norm", "must be set: the noise is calibrated to the clip norm, and noise without "
                                           "clipping bounds nothing (set e.g. privacy.clip_norm=1.0).")
        if self.adaptive and self.clipping == "per_layer":
            raise OptionError("adaptive", "clipping tracks one norm; use clipping: flat with it.")
        if self.adaptive and self.level == "example":
            raise OptionError("adaptive", "clipping is for client updates (level: client); DP-SGD clips examples "
                                          "to a fixed clip_norm.")


@dataclasses.dataclass
class CompressionOptions(Options):
    """The ``compression:`` section: how each client's upload is compressed (:mod:`fljax.ops.compress`)."""

    kind: Literal["none", "top_k", "random_k", "qsgd", "sign"] = option(
        "none", "the compressor: none, top_k, random_k (unbiased), qsgd (unbiased) or sign (scaled sign)")
    fraction: float | None = option(None, "top_k / random_k: fraction of each leaf's entries sent, in (0, 1]",
                                    _fraction)
    bits: int | None = option(None, "qsgd: bits per entry for the 2^bits − 1 levels (plus a sign bit), 1-16",
                              between(1, 16))
    error_feedback: bool = option(False, "keep each client's residual e ← e + x − C(e + x) and add it to its next "
                                         "upload")
    ef_scaling: Literal["contractive", "none"] = option(
        "contractive", "error feedback with an unbiased compressor (random_k, qsgd): contractive sends C(e + x)/(1 + ω), "
        "ω its per-leaf variance bound (random_k: the kept entries unscaled), which keeps the residual bounded; none "
        "sends C(e + x) (diverges: docs/privacy.md)")

    def check(self) -> None:
        needs = COMPRESSOR_OPTION.get(self.kind)
        for key in ("fraction", "bits"):
            value = getattr(self, key)
            if key == needs and value is None:
                raise OptionError(key, f"must be set for kind {self.kind!r}.")
            if key != needs and value is not None:
                raise OptionError(key, f"is not an option of kind {self.kind!r}"
                                       f"{f' (it takes {needs})' if needs else ''}; remove it.")
        if self.error_feedback and self.kind == "none":
            raise OptionError("error_feedback", "needs a compressor (kind: top_k, random_k, qsgd or sign).")
        if self.ef_scaling == "none" and not self.error_feedback:
            raise OptionError("ef_scaling", "applies to error feedback only; set error_feedback: true or remove it.")

    def compressor(self) -> Compressor:
        """The compressor of the uploads: with error feedback and ``ef_scaling: contractive``, an unbiased one scaled
        to a contraction (:meth:`fljax.ops.compress.Compressor.contractive`)."""
        c = make_compressor(self.kind, self.fraction, self.bits)
        return c.contractive() if self.error_feedback and self.ef_scaling == "contractive" else c


# ------------------------------------------------------------------------------------------------- resolution


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """A ``privacy:`` section resolved for one run: the noise multiplier z (given or calibrated), the updates' z_Δ
    (z, or split with adaptive clipping's count), δ, the sampling and the accountant; :meth:`epsilon` is ε after
    ``steps`` rounds (client level) or local steps (example level)."""

    options: PrivacyOptions
    noise_multiplier: float
    update_noise_multiplier: float
    delta: float
    sampling: Sampling
    steps: int
    count_stddev: float | None = None
    records: int | None = None  # the N that δ is below 1/N of (clients, or examples at example level)

    def epsilon(self, steps: int | None = None) -> float:
        return epsilon(self.noise_multiplier, self.steps if steps is None else steps, self.delta, self.sampling,
                       self.options.accountant)


def resolve_privacy(options: PrivacyOptions, *, sampling: Sampling, steps: int,
                    num_records: int | None = None) -> PrivacyPlan:
    """Resolve ``options`` before anything runs: ``sampling`` how the records of one step are drawn (clients, by the
    run's participation, :meth:`fljax.participation.Participation.sampling`; at example level a client's examples,
    Poisson with the smallest client's rate for the worst case), ``steps`` the mechanism's steps in the whole run,
    ``num_records`` the records δ must be below 1/N of (default: the sampling's population). Refuses in one line
    what cannot be accounted; calibrates z from a target ε."""
    check_accountable(sampling, options.accountant)
    size = sampling.size
    records = sampling.population if num_records is None else num_records
    delta = default_delta(records) if options.delta is None else options.delta
    check_delta(delta, records)
    if options.noise_multiplier is not None:
        z = options.noise_multiplier
        _check_noise(z, options.accountant)
    else:
        z = _calibrated(options.target_epsilon, steps, delta, sampling, options.accountant)
    z_update, count_stddev = z, None
    if options.adaptive:
        count_stddev = options.count_stddev if options.count_stddev is not None else size / 20
        if z > 0 and not 2 * count_stddev > z:
            raise OptionError("count_stddev", f"σ_b = {count_stddev:g} must exceed z/2 = {z / 2:g}, or the count "
                                              f"query spends the whole privacy budget (Andrew et al. 2021, Section 3.1); "
                                              f"raise it, or the cohort (the default is cohort/20).")
        z_update = P.adaptive_noise_multiplier(z, count_stddev)
    return PrivacyPlan(options, z, z_update, delta, sampling, steps, count_stddev, records)


# ------------------------------------------------------------------------------------------------ upload pipeline


def _zero(value) -> bool:
    """A Python 0 (not a traced value: a noise multiplier swept as a lane of one program is never skipped)."""
    return isinstance(value, (int, float)) and value == 0


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
    """Andrew et al. 2021's quantile tracking: γ = ``target_quantile``, η_C = ``lr``, σ_b = ``count_stddev`` and
    m = ``expected_count`` (the expected cohort size, the count's denominator)."""

    target_quantile: float
    lr: float
    count_stddev: float
    expected_count: float


@flax.struct.dataclass
class UploadState:
    """The server's state of the upload pipeline: the clip norm C_t of this round (constant without adaptive
    clipping)."""

    clip_norm: jax.Array


@flax.struct.dataclass
class Contribution:
    """What one client sends: ``value`` (the clipped, compressed update, in the upload's space: reference + delta
    when a reference is given), the update's norm before clipping and b_i = 1[‖Δ_i‖ ≤ C]."""

    value: Any
    norm: jax.Array
    unclipped: jax.Array


@flax.struct.dataclass
class UploadResult:
    aggregate: Any
    residuals: Any
    state: UploadState
    metrics: dict


@dataclasses.dataclass(frozen=True)
class UploadTransform:
    """clip → compress (error feedback) → clip → weighted sum → noise → ÷ W, for uploads that are deltas
    Δ_i = w_i − w_t (or uploads with the broadcast model as ``reference``).

    ``clip_norm`` C (None: no privacy, the aggregate is the weighted mean of the decoded uploads), ``noise_multiplier``
    z_Δ of the updates, ``per_layer`` clipping, ``expected_weight`` W (the fixed denominator, required with a clip),
    ``weight_cap`` ŵ (weights min(w_i/ŵ, 1)), ``adaptive`` (:class:`AdaptiveClipping` or None), ``compressor`` and
    ``error_feedback``. A frozen dataclass of Python values (hashable, static under ``jit``)."""

    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    per_layer: bool = False
    expected_weight: float | None = None
    weight_cap: float = 1.0
    adaptive: AdaptiveClipping | None = None
    compressor: Compressor = Identity()
    error_feedback: bool = False

    def __post_init__(self):
        if self.clip_norm is not None and not (self.expected_weight and self.expected_weight > 0):
            raise ValueError("a private upload transform needs expected_weight W > 0 (the fixed denominator).")
        if self.clip_norm is None and (not _zero(self.noise_multiplier) or self.adaptive is not None):
            raise ValueError("noise and adaptive clipping need a clip_norm.")

    @property
    def private(self) -> bool:
        return self.clip_norm is not None

    # ---------------------------------------------------------------------------------------------- state
    def init_server(self) -> UploadState:
        return UploadState(clip_norm=jnp.float32(self.clip_norm if self.private else 0.0))

    def init_client(self, params: PyTree) -> PyTree:
        """One client's state: the error-feedback residual (zeros like the update), or ``()`` without it."""
        return T.zeros_like(params) if self.error_feedback else ()

    # --------------------------------------------------------------------------------------------- client
    def encode(self, upload: PyTree, residual: PyTree, state: UploadState, key, reference: PyTree | None = None):
        """One client's ``(Contribution, new residual)``: Δ = upload − reference, x = π_C(Δ), c = C(e + x) projected
        onto the C-ball (error feedback: e' = e + x − c), sent as reference + c. Without compression and error
        feedback an unclipped upload is sent as it is (the same bits)."""
        delta = upload if reference is None else T.sub(upload, reference)
        if self.private:
            scales, norm = P.clip_scales(delta, state.clip_norm, self.per_layer)
            unclipped = norm <= state.clip_norm
        else:
            scales, norm, unclipped = None, T.norm(delta), jnp.bool_(True)
        plain = isinstance(self.compressor, Identity) and not self.error_feedback
        if plain and scales is None:
            return Contribution(upload, norm, unclipped), residual
        if plain:
            if reference is None:
                value = P.scale_leaves(delta, scales)
            else:
                value = jax.tree.map(lambda u, r, d, s: jnp.where(s < 1, r + (d * s).astype(u.dtype), u),
                                     upload, reference, delta, scales)
            return Contribution(value, norm, unclipped), residual
        x = delta if scales is None else P.scale_leaves(delta, scales)
        post = (lambda c: P.clip_by_norm(c, state.clip_norm)[0]) if self.private else None
        if self.error_feedback:
            c, residual = error_feedback(self.compressor, x, residual, key, post)
        else:
            c = self.compressor(x, key)
            c = c if post is None else post(c)
        value = c if reference is None else T.add(reference, c)
        return Contribution(value, norm, unclipped), residual

    # --------------------------------------------------------------------------------------------- server
    def aggregate(self, contributions: Contribution, weights, state: UploadState, key,
                  reference: PyTree | None = None, valid=None):
        """``(aggregate, new state, metrics)`` from the cohort's stacked contributions ``[K, …]`` and weights ``[K]``
        (zero for unsampled slots; ``valid`` ``[K]`` marks the sampled ones for adaptive clipping's count, None: all).

        Private: (Σ_i min(w_i/ŵ, 1)·c_i + N(0, (z_Δ·C_t)²I))/W (:func:`fljax.ops.privacy.private_mean`), then the
        adaptive update of C. Otherwise the weighted mean Σ_i w_i c_i / Σ_i w_i. With ``reference`` the aggregate is an
        upload (reference + mean delta). Metrics: ``clip_norm`` (C_t) and ``unclipped_fraction`` (the noised b̄ with
        adaptive clipping; otherwise the exact fraction of the cohort, a diagnostic of the simulation, not released by
        the mechanism)."""
        weights = jnp.asarray(weights, jnp.float32)
        if not self.private:
            total = jnp.sum(weights)
            agg = P.private_mean(contributions.value, weights, jnp.where(total > 0, total, 1.0), 0,
                                 reference=reference)
            return agg, state, {}
        k_noise, k_count = jax.random.split(key)
        w = jnp.minimum(weights / self.weight_cap, 1.0)
        stddev = 0 if _zero(self.noise_multiplier) else self.noise_multiplier * state.clip_norm
        agg = P.private_mean(contributions.value, w, self.expected_weight, stddev, k_noise, reference)
        v = jnp.ones_like(weights) if valid is None else jnp.asarray(valid, jnp.float32)
        if self.adaptive is not None:
            a = self.adaptive
            fraction = P.noised_fraction(k_count, contributions.unclipped, a.count_stddev, a.expected_count, v)
            new = UploadState(clip_norm=P.geometric_clip_update(state.clip_norm, fraction, a.target_quantile, a.lr))
        else:
            fraction = jnp.sum(v * contributions.unclipped) / jnp.maximum(jnp.sum(v), 1.0)
            new = state
        return agg, new, {"clip_norm": state.clip_norm, "unclipped_fraction": fraction}

    # -------------------------------------------------------------------------------------------- stacked
    def encode_cohort(self, uploads: PyTree, residuals: PyTree, state: UploadState, client_keys,
                      reference: PyTree | None = None, valid=None) -> tuple[Contribution, PyTree]:
        """:meth:`encode` of every client of a stacked cohort (``vmap``): ``(contributions, residuals)``, client i
        with key ``client_keys[i]`` (the engine derives them from the client ids, so that nothing depends on a
        client's slot). Residuals of unsampled slots (``valid`` False) are returned unchanged."""
        contributions, new_res = jax.vmap(lambda u, e, k: self.encode(u, e, state, k, reference))(uploads, residuals,
                                                                                                 client_keys)
        if valid is not None:
            new_res = T.where(valid, new_res, residuals)
        return contributions, new_res

    def apply(self, uploads: PyTree, weights, residuals: PyTree, state: UploadState, key,
              reference: PyTree | None = None, valid=None, client_keys=None) -> UploadResult:
        """:meth:`encode_cohort` then :meth:`aggregate` (without ``client_keys`` both the clients' keys, by position,
        and the server's are split from ``key``)."""
        if client_keys is None:
            k_clients, key = jax.random.split(key)
            client_keys = jax.random.split(k_clients, T.num_clients(uploads))
        contributions, new_res = self.encode_cohort(uploads, residuals, state, client_keys, reference, valid)
        agg, new_state, metrics = self.aggregate(contributions, weights, state, key, reference, valid)
        return UploadResult(agg, new_res, new_state, metrics)

    def bytes_up(self, params: PyTree) -> int:
        """Bytes one client sends: the compressor's count for ``params``' shapes, plus one byte for adaptive
        clipping's indicator b_i."""
        return self.compressor.bytes(params) + (1 if self.adaptive is not None else 0)


def upload_transform(plan: PrivacyPlan | None = None, compression: CompressionOptions | None = None,
                     expected_weight: float | None = None) -> UploadTransform:
    """The :class:`UploadTransform` of a resolved ``privacy:`` plan (client level; None: no privacy) and a
    ``compression:`` section (None: none). ``expected_weight`` W defaults to the expected cohort size, the expected
    total weight when every client's weight is min(n_i/ŵ, 1) = 1 (ŵ = 1, the default); with ŵ > 1 pass
    W = q·Σ_k min(n_k/ŵ, 1) (Poisson) or m·mean_k min(n_k/ŵ, 1) (fixed)."""
    comp = compression.compressor() if compression is not None else Identity()
    ef = bool(compression is not None and compression.error_feedback)
    if plan is None:
        return UploadTransform(compressor=comp, error_feedback=ef)
    o = plan.options
    if o.level != "client":
        raise OptionError("level", "'example' privatises local steps (fljax.ops.privacy.private_value_and_grad), "
                                   "not uploads.")
    adaptive = None
    if o.adaptive:
        adaptive = AdaptiveClipping(o.target_quantile, o.clip_lr, plan.count_stddev, plan.sampling.size)
    return UploadTransform(clip_norm=o.clip_norm, noise_multiplier=plan.update_noise_multiplier,
                           per_layer=o.clipping == "per_layer",
                           expected_weight=plan.sampling.size if expected_weight is None else expected_weight,
                           weight_cap=o.weight_cap, adaptive=adaptive, compressor=comp, error_feedback=ef)


# ---------------------------------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class ExamplePrivacy:
    """DP-SGD in every local step (``level: example``; Abadi et al. 2016, Alg. 1): the per-example gradients of a
    step's batch clipped to ``clip_norm`` C (each leaf to C_l with ``per_layer``), summed, noised with std z·C
    (z = ``noise_multiplier``) and divided by the expected batch size B = ``batch_size``
    (:func:`fljax.ops.privacy.private_value_and_grad`). Python values: static in a compiled program."""

    clip_norm: float
    noise_multiplier: float
    batch_size: int
    per_layer: bool = False

    def value_and_grad(self, loss_fn):
        """``fn(params, batch, key) -> (loss, g̃)``: DP-SGD's gradient of ``loss_fn(params, batch)``."""
        return P.private_value_and_grad(loss_fn, self.clip_norm, self.noise_multiplier, self.batch_size,
                                        self.per_layer)


TRACED_NOISE = "privacy.noise_multiplier"  # the key a grid of runs traces (one program for every noise level)


@dataclasses.dataclass(frozen=True)
class Privacy:
    """The ``privacy:`` and ``compression:`` sections of one run, resolved (:func:`resolve_run`): what the engine
    applies and what the accountant counts.

    * ``plan``: the resolved privacy (noise multiplier, δ, sampling, accountant; None: no privacy, compression only);
    * ``uploads``: the :class:`UploadTransform` a centralized algorithm's uploads go through between its clients and
      its server's aggregate, the encoder of its :class:`fljax.aggregation.Aggregator` (client-level DP and/or
      compression; None: the uploads are aggregated as they are);
    * ``example``: DP-SGD in every local step (level example; None: plain gradients);
    * ``steps_per_round``: the accountant's steps per round (1 at client level; a round's local steps at example
      level, as if a client took part in every round: the worst case)."""

    plan: PrivacyPlan | None = None
    uploads: UploadTransform | None = None
    example: ExamplePrivacy | None = None
    steps_per_round: int = 1

    def epsilon(self, rounds: int) -> float | None:
        """ε after ``rounds`` rounds at the plan's δ, by dp-accounting (∞ without noise; None without privacy).
        Cached per number of steps: the PLD accountant takes seconds."""
        p = self.plan
        if p is None:
            return None
        return _epsilon(p.noise_multiplier, int(rounds) * self.steps_per_round, p.delta, p.sampling,
                        p.options.accountant)

    def traced(self) -> dict:
        """The values runs of one grid may trace in one compiled program: the updates' noise multiplier z_Δ of
        client-level DP (``{TRACED_NOISE: z_Δ}``; empty otherwise)."""
        if self.uploads is None or not self.uploads.private:
            return {}
        return {TRACED_NOISE: self.uploads.noise_multiplier}

    def at(self, hp: dict | None) -> "Privacy":
        """This privacy with the traced values of ``hp`` (a lane's) in place."""
        if not hp or TRACED_NOISE not in hp:
            return self
        return dataclasses.replace(self, uploads=dataclasses.replace(self.uploads, noise_multiplier=hp[TRACED_NOISE]))

    def program(self) -> tuple:
        """What this privacy makes of a compiled program, traced values apart: runs share a program only if equal."""
        uploads = self.uploads
        if self.traced():
            uploads = dataclasses.replace(uploads, noise_multiplier=0.0)
        return uploads, self.example, self.steps_per_round

    def describe(self) -> dict:
        """What ``summary.json`` records of it (``privacy``): the level, noise multiplier z (given or calibrated), δ,
        clip norm (the initial one under adaptive clipping), clipping (flat or per layer), accountant and sampling;
        at client level the weight cap ŵ, and with adaptive clipping γ, η_C, the count's noise std σ_b and the
        updates' noise multiplier z_Δ (z otherwise); the compressor. The clip norm of each round is in the metrics
        (``clip_norm``)."""
        out = {}
        if self.plan is not None:
            p, o = self.plan, self.plan.options
            out.update(level=o.level, noise_multiplier=p.noise_multiplier, delta=p.delta, clip_norm=o.clip_norm,
                       clipping=o.clipping, accountant=o.accountant, sampling=p.sampling.kind,
                       population=p.sampling.population, expected_size=p.sampling.size,
                       steps_per_round=self.steps_per_round)
            if o.level == "client":
                out.update(weight_cap=o.weight_cap, adaptive=o.adaptive,
                           update_noise_multiplier=p.update_noise_multiplier)
            if o.adaptive:
                out.update(target_quantile=o.target_quantile, clip_lr=o.clip_lr, count_stddev=p.count_stddev)
            if o.target_epsilon is not None:
                out["target_epsilon"] = o.target_epsilon
        if self.uploads is not None and not isinstance(self.uploads.compressor, Identity):
            out["compressor"] = repr(self.uploads.compressor)
            out["error_feedback"] = self.uploads.error_feedback
        return out


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """What example-level accounting needs of the clients' data and local training: the smallest and the total
    number of training examples, the (expected) batch size B and the local steps of a round."""

    smallest: int
    total: int
    batch_size: int
    steps_per_round: int


def weighting_note(privacy: PrivacyOptions | None, weighting: str | None) -> str | None:
    """The note a run prints when client-level privacy replaces the weights its algorithm aggregates with
    (``weighting``, given or the algorithm's default: 'samples' n_i, or 'tokens' t_i, the client's target tokens) by
    McMahan et al. 2018's capped weights min(n_i/ŵ, 1) (t_i for tokens), ŵ = ``privacy.weight_cap`` (the sum's
    sensitivity needs every weight ≤ 1); None otherwise."""
    if privacy is None or privacy.level != "client" or weighting not in ("samples", "tokens"):
        return None
    cap, n = privacy.weight_cap, "n_i" if weighting == "samples" else "t_i"
    uniform = " = 1 for every client with data (uniform weights)" if cap == 1 else ""
    return (f"privacy: the private aggregate weighs client i by min({n}/ŵ, 1){uniform}, not by {n} as algo.weighting: "
            f"{weighting} asks; ŵ is privacy.weight_cap = {cap:g}")


def resolve_run(privacy: PrivacyOptions | None, compression: CompressionOptions | None, *, clients: int,
                cohort_size: int | None, rounds: int, participation=None, weights=None,
                local: LocalSteps | None = None) -> Privacy | None:
    """The :class:`Privacy` of a run (None when it has neither privacy nor compression): ``clients`` N training
    clients, ``cohort_size`` m (expected under Poisson sampling: q = m/N; None: every client), ``rounds`` T,
    ``participation`` how the cohorts are drawn (a :class:`fljax.participation.Participation`, asked for its
    :meth:`~fljax.participation.Participation.sampling`; None: the default of a private run, Poisson), ``weights``
    the clients' aggregation weights p_k (None: all ≥ 1), ``local`` the example-level facts (needed at level
    example).

    Client level: one round is one step of the subsampled Gaussian mechanism over the N clients, drawn by the
    participation (a participation without an amplification result is refused); the fixed
    denominator is W = m·mean_k min(p_k/ŵ, 1), the expected total weight (= m with ŵ = 1). Example level: one local
    step is one step over a client's examples, drawn Poisson with rate B/n_i; the accounted client is the smallest
    (n_min: the largest rate), δ is checked against the total number of examples, and the steps are T × the local
    steps of a round. Refuses, in one line naming the key, what cannot be accounted."""
    squeezed = compression is not None and (compression.kind != "none" or compression.error_feedback)
    if privacy is None:
        return Privacy(uploads=upload_transform(None, compression)) if squeezed else None
    size = clients if cohort_size is None else min(cohort_size, clients)
    if privacy.level == "example":
        if local is None:
            raise ValueError("example-level privacy needs the clients' LocalSteps.")
        batch = min(local.batch_size, local.smallest)
        plan = resolve_privacy(privacy, sampling=Sampling("poisson", local.smallest, batch),
                               steps=rounds * local.steps_per_round, num_records=local.total)
        example = ExamplePrivacy(privacy.clip_norm, plan.noise_multiplier, local.batch_size,
                                 privacy.clipping == "per_layer")
        return Privacy(plan, upload_transform(None, compression) if squeezed else None, example,
                       local.steps_per_round)
    if participation is None:
        from fljax.participation import default_participation

        participation = default_participation(client_privacy=True)
    sampling = participation.sampling(clients, cohort_size)
    if sampling is None:
        raise OptionError("participation.name", f"{participation.name!r} draws cohorts that no dp-accounting event "
                                                f"describes (availability, deadlines, dropouts or dropped stragglers "
                                                f"decide who counts: no amplification-by-sampling result), so "
                                                f"client-level privacy cannot be accounted; use participation.name: "
                                                f"poisson or uniform without them.")
    plan = resolve_privacy(privacy, sampling=sampling, steps=rounds)
    expected = float(size)
    if weights is not None and privacy.weight_cap != 1.0:
        capped = [min(float(w) / privacy.weight_cap, 1.0) for w in weights]
        expected = size * sum(capped) / len(capped)
    if not expected > 0:
        raise OptionError("weight_cap", f"gives every client weight 0 (W = {expected:g}); lower it.")
    return Privacy(plan, upload_transform(plan, compression, expected_weight=expected))
