"""The aggregation seam: what a centralized server makes of its cohort's uploads.

A round's cohort sends uploads u_1 … u_n (stacked ``[n, …]``, weights p_i, a validity mask for the slots of clients
that were not sampled). An :class:`Aggregator` is a value the centralized template owns
(:class:`fljax.algorithms.base.CohortTemplate`), pure and ``vmap``-able, built like an optax transformation from
small parts (robust spec; issue 35)::

    u_i ← attack(u_i)                       the malicious clients' uploads (an :class:`Attack`; R4, R5)
    c_i ← encode(u_i, e_i)                  clip, compress with error feedback e_i (fljax.privacy.UploadTransform)
    A_t ← rule({c_i : i valid}, p, s_t)     the reduction with its own state s_t and key (a :class:`Rule`)

The rule is ``mean`` by default, Σ p_i u_i / Σ p_i, the weighted mean every server computed before this seam, bit for
bit; with client-level privacy the encoder's private sum (Σ min(p_i/ŵ, 1)·c_i + noise)/W replaces it (McMahan et
al. 2018; :class:`fljax.privacy.UploadTransform`). A robust rule reduces the deltas Δ_i = c_i − w_t relative to the
broadcast model w_t (what the template sends: the uploads are models trained from it), A_t = w_t + rule(Δ).

An algorithm whose server reads its uploads only through their aggregate
(:class:`fljax.algorithms.base.Aggregating`) gets every aggregator with no code of its own; the template hands its
``server_step`` the aggregate. The config sections are ``aggregator:`` (``name`` and the rule's options) and
``attack:`` (``name``, ``fraction`` and the attack's options); rules and attacks register themselves where they are
defined (:data:`RULES`, :data:`ATTACKS`). What cannot be combined is refused in one line by :func:`check_combination`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
from fljax.errors import OptionError
from fljax.ops import attacks as A
from fljax.ops import robust as R
from fljax.options import Options, Registry, at_least, between, greater_than, interval, one_of, option

__all__ = ["RULES", "ATTACKS", "Rule", "Mean", "Attack", "Aggregator", "AggregatorState", "ServerState", "Keys",
           "WithAggregator",
           "malicious_mask", "check_combination", "traced", "CLIENT_WEIGHTS"]

CLIENT_WEIGHTS = "aggregation.weights"  # the traced per-client multipliers of the aggregation weights (hypergradients)
RULES = Registry("aggregator")  # name -> Rule class: `aggregator: {name: median}`
ATTACKS = Registry("attack")  # name -> Attack class: `attack: {name: sign_flip, fraction: 0.2}`


# ---------------------------------------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True)
class Rule(Options):
    """A reduction of the cohort's valid uploads to one aggregate: a frozen dataclass of its options with a
    ``name``. Robust rules (every rule but ``mean``) reduce the deltas Δ_i = u_i − w_t, unweighted over the valid
    uploads (R2); invalid slots never enter a median, a distance or a count (R1).

    ``selects``: the rule picks or weighs whole uploads (Krum, Multi-Krum, Bulyan, the geometric median), so the
    share of its output taken by malicious uploads (``malicious_share``) says how often it picked one; coordinate-wise
    and clipping rules mix every valid upload."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    selects: ClassVar[bool] = False
    needs_root: ClassVar[bool] = False  # it reads the server's own update on its root data (FLTrust)

    def init(self, delta_like) -> Any:
        """The rule's server state (``delta_like``: one upload's pytree; default: none, ``()``)."""
        return ()

    def reduce(self, deltas, weights, valid, state, key, root=None) -> tuple[Any, Any, jax.Array]:
        """``(aggregate delta, new state, selected)`` of the stacked ``deltas`` ``[n, …]`` (``weights`` [n],
        ``valid`` [n] or None; ``root``: the server's own delta on its root data, for a rule that
        :attr:`needs_root`); ``selected`` [n]: each upload's share of the output (which the engine compares with the
        malicious mask)."""
        raise NotImplementedError

    def with_cohort(self, cohort: int, malicious: float | None) -> "Rule":
        """This rule with the options that default from the cohort filled in (``cohort`` n slots; ``malicious``:
        the expected malicious share of a cohort, the attack's fraction, or None without an attack), checked."""
        return self

    def to_dict(self) -> dict:
        return {"name": self.name, **super().to_dict()}


@RULES.register
@dataclasses.dataclass(frozen=True)
class Mean(Rule):
    """Σ p_i u_i / Σ p_i over the valid uploads with the run's weights (McMahan et al. 2017): the default, the
    weighted mean of :func:`fljax.tree.weighted_mean_clients` bit for bit."""

    name = "mean"
    summary = "the weighted mean of the uploads (McMahan et al. 2017; the default)"

    def reduce(self, deltas, weights, valid, state, key, root=None):
        selected = weights / jnp.maximum(jnp.sum(weights), jnp.finfo(weights.dtype).tiny)
        return tree.weighted_mean_clients(deltas, weights), state, selected.astype(jnp.float32)


def _f_for(rule: str, f, cohort: int, malicious: float | None) -> int:
    """R3: the f a rule is told: the given one, else ⌈fraction·n⌉ of the attack section, else refused."""
    if f is not None:
        return f
    if malicious is None:
        raise OptionError("f", f"{rule} needs f, the number of malicious uploads it tolerates: set aggregator.f, or "
                               f"an attack: section whose fraction gives it (R3: f = ⌈fraction·n⌉).")
    return int(math.ceil(malicious * cohort - 1e-9))


@dataclasses.dataclass(frozen=True)
class Robust(Rule):
    """A robust rule of :mod:`fljax.ops.robust` (``name`` is its key there): :meth:`reduce` calls it with the rule's
    options, :meth:`with_cohort` checks them for the cohort (``check_<name>``)."""

    def options(self, state) -> dict:
        """The keyword options the op takes (its fields; run-time values from ``state``)."""
        return {k: v for k, v in self.to_dict().items() if k != "name"}

    def reduce(self, deltas, weights, valid, state, key, root=None):
        delta, selected = R.RULES[self.name](deltas, valid, weights, **self.options(state))
        return delta, state, selected

    def with_cohort(self, cohort, malicious):
        rule = self
        if "f" in self.to_dict():
            rule = dataclasses.replace(self, f=_f_for(self.name, self.f, cohort, malicious))
        R.check_rule(self.name, cohort, **rule.options(()))
        return rule


@RULES.register
@dataclasses.dataclass(frozen=True)
class Median(Robust):
    """Coordinate-wise median of the valid deltas (mean of the two middle values for an even count; Yin et al.
    2018)."""

    name = "median"
    summary = "coordinate-wise median (Yin et al. 2018)"


@RULES.register
@dataclasses.dataclass(frozen=True)
class TrimmedMean(Robust):
    """Per coordinate, the mean of the valid values left after dropping the ⌊βk⌋ largest and ⌊βk⌋ smallest (Yin et
    al. 2018, Definition 2)."""

    name = "trimmed_mean"
    summary = "coordinate-wise trimmed mean: drop the ⌊βk⌋ largest and smallest (Yin et al. 2018)"
    beta: float = option(0.1, "β: the share trimmed from each end, in [0, 0.5)", interval(0, 0.5, "[)"))


@RULES.register
@dataclasses.dataclass(frozen=True)
class Krum(Robust):
    """The delta of least Krum score, score(i) = Σ of its squared distances to its k − f − 2 nearest other valid
    deltas (Blanchard et al. 2017); needs n ≥ 2f + 3."""

    name = "krum"
    selects = True
    summary = "Krum: the upload closest to its n − f − 2 nearest others (Blanchard et al. 2017)"
    f: int | None = option(None, "malicious uploads tolerated (null: ⌈attack.fraction·n⌉, R3)", at_least(0))


@RULES.register
@dataclasses.dataclass(frozen=True)
class MultiKrum(Robust):
    """The mean of the m deltas of least Krum score (Blanchard et al. 2017; m = n − f by default)."""

    name = "multi_krum"
    selects = True
    summary = "Multi-Krum: the mean of the m uploads of least Krum score (Blanchard et al. 2017)"
    f: int | None = option(None, "malicious uploads tolerated (null: ⌈attack.fraction·n⌉, R3)", at_least(0))
    m: int | None = option(None, "uploads averaged (null: n − f)", at_least(1))


@RULES.register
@dataclasses.dataclass(frozen=True)
class Bulyan(Robust):
    """θ = n − 2f deltas picked by recursive Krum, then per coordinate the mean of the β = θ − 2f picked values
    closest to their median (El Mhamdi et al. 2018); needs n ≥ 4f + 3."""

    name = "bulyan"
    selects = True
    summary = "Bulyan: recursive Krum, then a trimmed mean around the median (El Mhamdi et al. 2018)"
    f: int | None = option(None, "malicious uploads tolerated (null: ⌈attack.fraction·n⌉, R3)", at_least(0))


@RULES.register
@dataclasses.dataclass(frozen=True)
class GeometricMedian(Robust):
    """RFA's smoothed Weiszfeld (Pillutla et al. 2022, Algorithm 2): T iterations of v ← Σ α_i u_i / Σ α_i,
    α_i = p_i / max(ν, ‖v − u_i‖), from the weighted mean."""

    name = "geometric_median"
    selects = True
    summary = "geometric median by RFA's smoothed Weiszfeld iterations (Pillutla et al. 2022)"
    iters: int = option(3, "T: Weiszfeld iterations", at_least(1))
    nu: float = option(1e-6, "ν: the smoothing of the weights α_i = p_i / max(ν, ‖v − u_i‖)", greater_than(0))


@RULES.register
@dataclasses.dataclass(frozen=True)
class CenteredClip(Robust):
    """Centered clipping (Karimireddy et al. 2021, Eq. 2): L times v ← v + (1/k) Σ (u_i − v)·min(1, τ/‖u_i − v‖),
    v starting from the previous round's aggregate delta (the rule's state; zero at the start)."""

    name = "centered_clip"
    summary = "centered clipping around the previous aggregate (Karimireddy et al. 2021)"
    tau: float = option(1.0, "τ: the clipping radius around the previous aggregate", greater_than(0))
    iters: int = option(1, "L: clipping iterations per round", at_least(1))

    def init(self, delta_like):
        return tree.zeros_like(delta_like)

    def options(self, state):
        return {"tau": self.tau, "iters": self.iters, "v0": state}

    def reduce(self, deltas, weights, valid, state, key, root=None):
        delta, selected = R.centered_clip(deltas, valid, weights, **self.options(state))
        return delta, delta, selected

    def with_cohort(self, cohort, malicious):
        R.check_centered_clip(cohort, self.tau, self.iters)
        return self


@RULES.register
@dataclasses.dataclass(frozen=True)
class NormBound(Robust):
    """Norm bounding (Sun et al. 2019): every delta clipped to L2 norm M, then the weighted mean."""

    name = "norm_bound"
    summary = "norm bounding: clip every update to norm M, then the weighted mean (Sun et al. 2019)"
    bound: float = option(1.0, "M: the L2 norm every update is clipped to", greater_than(0))


@RULES.register
@dataclasses.dataclass(frozen=True)
class FLTrust(Robust):
    """FLTrust (Cao et al. 2021, Eqs. 2–4): the server trains its own update g₀ from w_t on a small root set (the
    data's server set, else ``root_size`` training rows drawn once, uniformly, from all clients' — the paper's
    setting), TS_i = ReLU(cos(Δ_i, g₀)), Δ̄_i = Δ_i‖g₀‖/‖Δ_i‖, and the output Σ TS_i Δ̄_i / Σ TS_i (g₀ when every
    TS_i is 0)."""

    name = "fltrust"
    summary = "FLTrust: uploads weighted by their cosine with the server's own update on root data (Cao et al. 2021)"
    selects = True
    needs_root = True
    root_size: int = option(100, "rows of the server's root set when the data has no server set of its own",
                            at_least(1))

    def options(self, state):
        return {}

    def reduce(self, deltas, weights, valid, state, key, root=None):
        delta, selected = R.fltrust(deltas, valid, weights, g0=root)
        return delta, state, selected

    def with_cohort(self, cohort, malicious):
        return self


# --------------------------------------------------------------------------------------------------------- attacks


def malicious_mask(key, num_clients: int, fraction):
    """R4: the malicious clients of a run, ⌈fraction·N⌉ of the N clients drawn once from ``key`` (the run's, the
    same in every round, as a Byzantine device is: ``fold_in(run key, ATTACK)``, :class:`Keys`): client i is
    malicious when its rank in a seeded permutation is below ⌈fraction·N⌉. ``fraction`` may be traced (a lane of a
    sweep). Returns a ``[N]`` boolean mask."""
    order = jax.random.permutation(key, num_clients)
    rank = jnp.zeros(num_clients, jnp.int32).at[order].set(jnp.arange(num_clients, dtype=jnp.int32))
    count = jnp.ceil(jnp.asarray(fraction, jnp.float32) * num_clients - 1e-6).astype(jnp.int32)
    return rank < count


@dataclasses.dataclass(frozen=True)
class Attack(Options):
    """The behaviour of a malicious share of the population (R4): a frozen dataclass of its options with a
    ``name``. Data poisoning changes what a malicious client trains on (:meth:`poison`); model poisoning changes
    what it uploads (:meth:`craft`, on the cohort's stacked deltas: an omniscient attack reads the round's benign
    uploads, R5)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    plants_trigger: ClassVar[bool] = False  # a backdoor: evaluation reports its attack success rate (triggered)
    fraction: float = option(0.2, "the share of the population that is malicious, drawn once per run (R4)",
                             between(0, 1))

    def triggered(self, test):
        """A backdoor's view of one client's test split (:attr:`plants_trigger`): every row stamped with the trigger
        and labelled with the target, the mask keeping the rows whose true label is not the target; its accuracy is
        the attack success rate."""
        raise NotImplementedError

    def poison(self, train, malicious, key):
        """One client's train split as it trains on it (``malicious``: a traced bool; default: unchanged)."""
        return train

    def craft(self, deltas, malicious, valid, keys, key):
        """The cohort's stacked deltas with the malicious valid rows replaced (``keys`` [n]: each slot's client's
        key this round, ``key`` the round's; default: unchanged)."""
        return deltas

    @property
    def crafts(self) -> bool:
        """It changes uploads (model poisoning)."""
        return type(self).craft is not Attack.craft

    @property
    def poisons(self) -> bool:
        """It changes training data (data poisoning)."""
        return type(self).poison is not Attack.poison

    def to_dict(self) -> dict:
        return {"name": self.name, **super().to_dict()}

    def with_data(self, data) -> "Attack":
        """This attack with what it needs of the run's data (its classes, a trigger's value), checked."""
        return self

    def with_cohort(self, cohort: int, server_lr: float) -> "Attack":
        """This attack with the options that default from the cohort (``cohort`` n) and the server learning rate
        η filled in."""
        return self


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class NoAttack(Attack):
    """Every client honest: the no-attack reference of an attack table (``attack.name=none`` beside the attacks of a
    sweep). Its ``fraction`` still marks ⌈fraction·N⌉ clients (R4's draw, the very clients an attack with that
    fraction and seed would corrupt), who train and upload honestly; the clean accuracy leaves them out as an
    attack's does, and a rule's f defaults from the fraction (R3), so every attacked run has a reference that differs
    from it in the attack alone."""

    name = "none"
    summary = "no attack: the fraction's clients are marked (their accuracy left out, R3's f) but behave honestly"


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class LabelFlip(Attack):
    """Each malicious client trains honestly on flipped labels y → C − 1 − y (Tolpegin et al. 2020)."""

    name = "label_flip"
    summary = "malicious clients train on labels y → C − 1 − y (Tolpegin et al. 2020)"
    num_classes: int = dataclasses.field(default=0, init=False)  # the data's classes C (with_data)

    def with_data(self, data) -> "LabelFlip":
        return _bound(self, num_classes=data.num_classes)

    def poison(self, train, malicious, key):
        y = A.flip_labels(train.y, self.num_classes, train.mask)
        return train.replace(y=jnp.where(malicious, y, train.y))


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class Backdoor(Attack):
    """BadNets (Gu et al. 2017; Bagdasaryan et al. 2020): each malicious client stamps a trigger on a share of its
    training rows and relabels them to the target class; the trigger is a 3×3 patch of the data's maximum in the
    bottom-right corner of images, the last 3 features of feature vectors (:func:`fljax.ops.attacks.make_trigger`).
    Evaluation reports the attack success rate (``global_asr``, ``personal_asr``)."""

    name = "backdoor"
    summary = "malicious clients plant a trigger relabelled to a target class (BadNets; ASR reported)"
    plants_trigger = True
    target: int = option(0, "the class triggered rows are relabelled to", at_least(0))
    poison_fraction: float = option(0.5, "the share of a malicious client's training rows it stamps",
                                    between(0, 1))
    trigger: Any = dataclasses.field(default=None, init=False)  # the data's Trigger (with_data)

    def with_data(self, data) -> "Backdoor":
        A.check_backdoor(data.num_classes, self.target, self.poison_fraction)
        if data.train.x.dtype.kind in "iu":
            raise OptionError("attack.name", "'backdoor' on token sequences is not supported (its ASR would need the "
                                             "trigger position's next-token prediction); use images or feature "
                                             "vectors.")
        return _bound(self, trigger=A.make_trigger(data.train.x, data.input_shape))

    def poison(self, train, malicious, key):
        x, y, rows = A.backdoor(key, train.x, train.y, train.mask, self.trigger, self.target, self.poison_fraction)
        return train.replace(x=jnp.where(malicious, x, train.x), y=jnp.where(malicious, y, train.y))

    def triggered(self, test):
        return test.replace(x=self.trigger.stamp(test.x, test.mask), y=jnp.full_like(test.y, self.target),
                            mask=test.mask & (test.y != self.target))


@dataclasses.dataclass(frozen=True)
class ModelPoisoning(Attack):
    """An attack of :mod:`fljax.ops.attacks` on the uploads (``name`` is its key there), called with its options."""

    def craft(self, deltas, malicious, valid, keys, key):
        return A.MODEL_ATTACKS[self.name](deltas, malicious, valid, **self.crafting(keys))

    def crafting(self, keys) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in ("name", "fraction")}


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class SignFlip(ModelPoisoning):
    """−s·Δ_i: its honest update negated and scaled."""

    name = "sign_flip"
    summary = "send −s times the honest update"
    s: float = option(4.0, "s: the scale of the negated update (4: at a 30 % share the mean steps against the honest "
                           "update, 0.7 − 0.3·4 < 0; 1 only slows it)", at_least(0))


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class Scale(ModelPoisoning):
    """γ·Δ_i; γ = n/η is model replacement (Bagdasaryan et al. 2020, Eq. 3)."""

    name = "scale"
    summary = "send γ times the honest update (γ = n/η: model replacement, Bagdasaryan et al. 2020)"
    gamma: float | None = option(None, "γ (null: n/η, the cohort over the server learning rate: model replacement)",
                                 at_least(0))

    def with_cohort(self, cohort: int, server_lr: float) -> "Scale":
        return self if self.gamma is not None else dataclasses.replace(
            self, gamma=A.replacement_scale(cohort, server_lr))


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class Gaussian(ModelPoisoning):
    """N(0, σ²I), each malicious client its own draw."""

    name = "gaussian"
    summary = "send Gaussian noise N(0, σ²I)"
    sigma: float = option(1.0, "σ: the noise's standard deviation", at_least(0))

    def crafting(self, keys):
        return {"sigma": self.sigma, "keys": keys}


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class ALIE(ModelPoisoning):
    """A Little Is Enough (Baruch et al. 2019): μ − z_max·σ per coordinate over the cohort's benign uploads,
    z_max = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f (R5: omniscient, one crafted vector)."""

    name = "alie"
    summary = "A Little Is Enough: μ − z_max·σ of the benign uploads (Baruch et al. 2019)"


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class IPM(ModelPoisoning):
    """Inner product manipulation (Xie et al. 2020): −ε·μ of the benign uploads."""

    name = "ipm"
    summary = "inner product manipulation: −ε times the benign mean (Xie et al. 2020)"
    eps: float = option(0.1, "ε (0.1 defeats median-type rules, 100 the mean)", at_least(0))


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class MinMax(ModelPoisoning):
    """Min-Max (Shejwalkar & Houmansadr 2021): μ + γp with the largest γ (halving search, R6) whose maximal distance
    to a benign upload stays within the benign uploads' largest pairwise distance."""

    name = "min_max"
    summary = "Min-Max: the farthest μ + γp within the benign uploads' spread (Shejwalkar & Houmansadr 2021)"
    perturbation: str = option("unit", "p: 'unit' (−μ/‖μ‖), 'std' (−σ) or 'sign' (−sign μ)",
                               one_of(A.PERTURBATIONS))


@ATTACKS.register
@dataclasses.dataclass(frozen=True)
class MinSum(ModelPoisoning):
    """Min-Sum (Shejwalkar & Houmansadr 2021): as Min-Max with the sum of squared distances to the benign uploads
    bounded by the largest such sum of a benign upload."""

    name = "min_sum"
    summary = "Min-Sum: μ + γp within the benign uploads' largest sum of squared distances (Shejwalkar & Houmansadr)"
    perturbation: str = option("unit", "p: 'unit' (−μ/‖μ‖), 'std' (−σ) or 'sign' (−sign μ)",
                               one_of(A.PERTURBATIONS))


def _bound(attack: Attack, **facts) -> Attack:
    """A copy of ``attack`` with its data facts (``init=False`` fields) set."""
    import copy

    out = copy.copy(attack)
    for k, v in facts.items():
        object.__setattr__(out, k, v)
    return out


# --------------------------------------------------------------------------------------------------- the value


@flax.struct.dataclass
class Keys:
    """The keys of one round's aggregation, derived by the template from the round's streams so that nothing depends
    on a client's slot: ``server`` (the rule's and the privacy noise's), ``clients`` [n] (each slot's client's key to
    encode its upload: random-k's subset, QSGD's rounding), ``attack`` (the round's) and ``attack_clients`` [n]
    (each malicious client's own draws), ``malicious`` (the run's draw of the malicious clients, the same every
    round)."""

    server: jax.Array
    clients: jax.Array
    attack: jax.Array
    attack_clients: jax.Array
    malicious: jax.Array


@flax.struct.dataclass
class ServerState:
    """The aggregator's server state: the ``encoder``'s :class:`fljax.privacy.UploadState` (the clip norm C_t;
    ``()`` without an encoder) and the ``rule``'s (``()`` for a rule without memory)."""

    encoder: Any
    rule: Any


@flax.struct.dataclass
class AggregatorState:
    """The aggregator's state: ``server`` (a :class:`ServerState`) and ``clients`` (every client's error-feedback
    residual, leading client axis; ``()`` without)."""

    server: ServerState
    clients: Any


@flax.struct.dataclass
class WithAggregator:
    """An algorithm's own pytree ``state`` (its server's, or its per-client state) with the aggregator's part of
    :class:`AggregatorState` beside it; the centralized template wraps and unwraps it, only when the aggregator has
    a state (the default mean has none: the state is the algorithm's own)."""

    state: Any
    aggregator: Any


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """What a centralized server makes of its cohort's uploads: ``rule`` (the reduction; :class:`Mean` by default),
    ``uploads`` (the encoder of :mod:`fljax.privacy`: clipping, compression, error feedback and, when private, its
    noised sum in place of the mean; None: uploads as they are) and ``attack`` (the malicious clients' behaviour;
    None: every client is honest); ``client_weights``: a traced ``[num_clients]`` vector that multiplies every
    client's aggregation weight (``hp["aggregation.weights"]``: the per-client weights a hypergradient is taken of;
    None: 1). Python values: static in a compiled program but for the traced ones (:meth:`at`)."""

    rule: Rule = Mean()
    uploads: Any = None
    attack: Attack | None = None
    client_weights: Any = None

    @property
    def is_default(self) -> bool:
        """The plain weighted mean: nothing to add to a server that averages."""
        return isinstance(self.rule, Mean) and self.uploads is None and self.attack is None

    @property
    def has_state(self) -> bool:
        """It keeps state between rounds (the encoder's clip norm and residuals, a rule's memory)."""
        return self.uploads is not None or type(self.rule).init is not Rule.init

    # ----------------------------------------------------------------------------------------------- state
    def init(self, upload, num_clients: int) -> AggregatorState:
        """The initial state for uploads shaped like ``upload`` (one upload, no client axis)."""
        enc = self.uploads
        server = ServerState(() if enc is None else enc.init_server(), self.rule.init(upload))
        clients = () if enc is None else tree.broadcast_clients(enc.init_client(upload), num_clients)
        return AggregatorState(server, clients)

    # ----------------------------------------------------------------------------------------------- round
    def apply(self, uploads, weights, valid, ids, state: AggregatorState | None, reference, keys: Keys | None,
              num_clients: int, root=None, rows=None):
        """``(aggregate, new state, metrics)`` of the cohort's stacked ``uploads`` ``[n, …]`` with ``weights`` [n]
        (zero on invalid slots), ``valid`` [n] (None: all valid), the slots' client ``ids`` [n] (``num_clients`` on
        an empty slot), the aggregator ``state`` (None when it has none), the broadcast model ``reference`` w_t and
        the round's :class:`Keys` (None for the default mean, which draws nothing); ``root``: the server's own delta
        on its root data, for a rule that :attr:`~Rule.needs_root` (FLTrust's g₀); ``rows``: the rows of
        ``state.clients`` that hold the slots' residuals (None: their ids; under a client-state store, the rows of
        the block's buffer, :meth:`fljax.engine.context.RoundContext.rows`).

        Metrics: the encoder's (``clip_norm``, ``unclipped_fraction``), and under an attack ``malicious_uploads``
        (the malicious valid uploads of the round) and, for a rule that :attr:`~Rule.selects`, ``malicious_share``
        (their share of the rule's output: how often it picked a malicious upload)."""
        if self.is_default:
            return tree.weighted_mean_clients(uploads, weights), state, {}
        if ids is None:
            raise ValueError("an aggregator other than the plain mean runs on one homogeneous population (the "
                             "uploads' client ids), not on client groups.")
        metrics = {}
        safe = jnp.minimum(ids, num_clients - 1)
        v = jnp.ones(ids.shape, bool) if valid is None else valid
        mal = None
        if self.attack is not None:
            mal = malicious_mask(keys.malicious, num_clients, self.attack.fraction)[safe] & v & (ids < num_clients)
            if self.attack.crafts:
                deltas = tree.sub(uploads, tree.broadcast_clients(reference, ids.shape[0]))
                crafted = self.attack.craft(deltas, mal, v, keys.attack_clients, keys.attack)
                uploads = tree.where(mal, tree.add(crafted, tree.broadcast_clients(reference, ids.shape[0])),
                                     uploads)
        enc = self.uploads
        server_state = None if state is None else state.server
        if enc is not None:
            enc_state, rule_state = server_state.encoder, server_state.rule
            rows = ids if rows is None else rows  # an empty slot's row is past the last one: dropped by the scatter
            residuals = jax.tree.map(lambda x: jnp.take(x, jnp.minimum(rows, x.shape[0] - 1), axis=0), state.clients)
            contributions, residuals = enc.encode_cohort(uploads, residuals, enc_state, keys.clients, reference, valid)
            clients = jax.tree.map(lambda x, r: x.at[rows].set(r.astype(x.dtype), mode="drop"), state.clients,
                                   residuals)
            if isinstance(self.rule, Mean):  # the encoder's (private) sum over its fixed denominator
                aggregate, enc_state, enc_metrics = enc.aggregate(contributions, weights, enc_state, keys.server,
                                                                  reference, valid)
                metrics.update(enc_metrics)
                selected = weights / jnp.maximum(jnp.sum(weights), 1e-30)
            else:  # compressed uploads (no privacy: check_combination), reduced by the robust rule
                aggregate, rule_state, selected = self._robust(contributions.value, weights, valid, rule_state,
                                                               reference, keys.server, root)
            new_state = AggregatorState(ServerState(enc_state, rule_state), clients)
        elif isinstance(self.rule, Mean):
            aggregate = tree.weighted_mean_clients(uploads, weights)
            selected = weights / jnp.maximum(jnp.sum(weights), 1e-30)
            new_state = state
        else:
            rule_state = None if server_state is None else server_state.rule
            aggregate, rule_state, selected = self._robust(uploads, weights, valid, rule_state, reference,
                                                           keys.server, root)
            new_state = None if state is None else AggregatorState(server_state.replace(rule=rule_state),
                                                                   state.clients)
        if mal is not None:
            m = mal.astype(jnp.float32)
            metrics["malicious_uploads"] = jnp.sum(m)
            if self.rule.selects:
                s = jnp.asarray(selected, jnp.float32)
                metrics["malicious_share"] = jnp.sum(s * m) / jnp.maximum(jnp.sum(s), 1e-30)
        return aggregate, new_state, metrics

    def _robust(self, uploads, weights, valid, state, reference, key, root):
        """A robust rule on the deltas relative to ``reference``: ``(reference + rule(Δ), state, selected)``."""
        n = tree.num_clients(uploads)
        deltas = tree.sub(uploads, tree.broadcast_clients(reference, n))
        delta, state, selected = self.rule.reduce(deltas, weights, valid, state, key, root)
        return tree.add(reference, delta), state, selected

    # ------------------------------------------------------------------------------------------------ lanes
    def at(self, hp: dict | None) -> "Aggregator":
        """This aggregator with the traced values of ``hp`` (a lane's: ``attack.fraction``, ``aggregator.beta``,
        ``aggregation.weights``, …) in place; the encoder's noise multiplier is the privacy's
        (:meth:`fljax.privacy.Privacy.at`)."""
        out = self
        if hp and CLIENT_WEIGHTS in hp:
            out = dataclasses.replace(out, client_weights=hp[CLIENT_WEIGHTS])
        for section, field in (("attack", "attack"), ("aggregator", "rule")):
            own = {k.split(".", 1)[1]: v for k, v in (hp or {}).items() if k.startswith(section + ".")}
            if own and getattr(out, field) is not None:
                out = dataclasses.replace(out, **{field: _replaced(getattr(out, field), **own)})
        return out


def _replaced(value: Options, **changes) -> Options:
    """``dataclasses.replace`` that keeps the derived (``init=False``) facts ``value`` was bound to (an attack's
    classes or trigger, :meth:`Attack.with_data`), which ``replace`` would reset to their defaults."""
    derived = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if not f.init}
    return _bound(dataclasses.replace(value, **changes), **derived)


def traced(section: str, value: Options | None) -> dict:
    """The numeric options of a component (``section``: 'aggregator', 'attack'; None: none) by dotted key: what runs
    of one grid may trace in one compiled program (:meth:`Aggregator.at` puts a lane's back)."""
    if value is None:
        return {}
    return {f"{section}.{k}": v for k, v in value.to_dict().items()
            if k != "name" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def check_combination(aggregator: Aggregator, algorithm, *, private: bool) -> None:
    """Refuse, in one line saying why, an aggregator the run cannot apply: one that is not the plain mean on an
    algorithm whose server reads its uploads beyond their aggregate, a robust rule under client-level privacy."""
    if aggregator.is_default:
        return
    if not algorithm.reads_aggregate:
        attack_only = aggregator.attack is not None and isinstance(aggregator.rule, Mean)
        key, what = ("attack", "an attack") if attack_only else ("aggregator", f"aggregator {aggregator.rule.name!r}")
        if not algorithm.samples_cohorts:
            raise OptionError(key, f"{what} needs a server; {algorithm.name}'s clients all take part every round and "
                                   f"share their models by gossip (or solve a consensus problem), and robust gossip "
                                   f"is not supported: use a server-based algorithm (e.g. fedavg, fedprox, ditto).")
        raise OptionError(key, f"{what} needs a server that reads the uploads only through their aggregate; "
                               f"{algorithm.name}'s server reads the stacked uploads themselves (sums, control "
                               f"variates), so no rule can replace its mean: use an algorithm that averages models "
                               f"(e.g. fedavg, fedprox, ditto, fedrep).")
    if private and not isinstance(aggregator.rule, Mean):
        raise OptionError("aggregator.name", f"{aggregator.rule.name!r} under client-level privacy is refused: the "
                                             f"Gaussian mechanism is calibrated to the sensitivity C/W of a clipped "
                                             f"weighted sum, and a {aggregator.rule.name} has another sensitivity "
                                             f"(it would need its own private mechanism, e.g. a noised median); use "
                                             f"aggregator.name: mean with privacy.")
