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
from fljax.options import Options, Registry, between, option

__all__ = ["RULES", "ATTACKS", "Rule", "Mean", "Attack", "Aggregator", "AggregatorState", "ServerState", "Keys",
           "WithAggregator",
           "malicious_mask", "check_combination", "traced", "attack_count"]

RULES = Registry("aggregator")  # name -> Rule class: `aggregator: {name: median}`
ATTACKS = Registry("attack")  # name -> Attack class: `attack: {name: sign_flip, fraction: 0.2}`


# ---------------------------------------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True)
class Rule(Options):
    """A reduction of the cohort's valid uploads to one aggregate: a frozen dataclass of its options with a
    ``name``. Robust rules (every rule but ``mean``) reduce the deltas Δ_i = u_i − w_t, unweighted over the valid
    uploads (R2); invalid slots never enter a median, a distance or a count (R1).

    ``uses_f``: the rule's option ``f`` (the number of malicious uploads it tolerates) defaults to ⌈fraction·n⌉ of
    the ``attack:`` section (R3)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    uses_f: ClassVar[bool] = False

    def init(self, delta_like) -> Any:
        """The rule's server state (``delta_like``: one upload's pytree; default: none, ``()``)."""
        return ()

    def reduce(self, deltas, weights, valid, state, key) -> tuple[Any, Any, jax.Array]:
        """``(aggregate delta, new state, selected)`` of the stacked ``deltas`` ``[n, …]`` (``weights`` [n],
        ``valid`` [n] or None); ``selected`` [n]: each upload's share of the output (which the engine compares with
        the malicious mask)."""
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

    def reduce(self, deltas, weights, valid, state, key):
        selected = weights / jnp.maximum(jnp.sum(weights), jnp.finfo(weights.dtype).tiny)
        return tree.weighted_mean_clients(deltas, weights), state, selected.astype(jnp.float32)


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
    None: every client is honest). Python values: static in a compiled program but for the traced ones
    (:meth:`traced`)."""

    rule: Rule = Mean()
    uploads: Any = None
    attack: Attack | None = None

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
              num_clients: int):
        """``(aggregate, new state, metrics)`` of the cohort's stacked ``uploads`` ``[n, …]`` with ``weights`` [n]
        (zero on invalid slots), ``valid`` [n] (None: all valid), the slots' client ``ids`` [n] (``num_clients`` on
        an empty slot), the aggregator ``state`` (None when it has none), the broadcast model ``reference`` w_t and
        the round's :class:`Keys` (None for the default mean, which draws nothing).

        Metrics: the encoder's (``clip_norm``, ``unclipped_fraction``), and under an attack ``malicious_uploads``
        (the malicious valid uploads of the round) and ``malicious_share`` (their share of the rule's output:
        how often a selecting rule picked a malicious upload)."""
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
            residuals = tree.take_clients(state.clients, safe)
            contributions, residuals = enc.encode_cohort(uploads, residuals, enc_state, keys.clients, reference, valid)
            clients = jax.tree.map(lambda x, r: x.at[ids].set(r.astype(x.dtype), mode="drop"), state.clients,
                                   residuals)
            if isinstance(self.rule, Mean):  # the encoder's (private) sum over its fixed denominator
                aggregate, enc_state, enc_metrics = enc.aggregate(contributions, weights, enc_state, keys.server,
                                                                  reference, valid)
                metrics.update(enc_metrics)
                selected = weights / jnp.maximum(jnp.sum(weights), 1e-30)
            else:  # compressed uploads (no privacy: check_combination), reduced by the robust rule
                aggregate, rule_state, selected = self._robust(contributions.value, weights, valid, rule_state,
                                                               reference, keys.server)
            new_state = AggregatorState(ServerState(enc_state, rule_state), clients)
        elif isinstance(self.rule, Mean):
            aggregate = tree.weighted_mean_clients(uploads, weights)
            selected = weights / jnp.maximum(jnp.sum(weights), 1e-30)
            new_state = state
        else:
            rule_state = None if server_state is None else server_state.rule
            aggregate, rule_state, selected = self._robust(uploads, weights, valid, rule_state, reference,
                                                           keys.server)
            new_state = None if state is None else AggregatorState(server_state.replace(rule=rule_state),
                                                                   state.clients)
        if mal is not None:
            m = mal.astype(jnp.float32)
            s = jnp.asarray(selected, jnp.float32)
            metrics.update(malicious_uploads=jnp.sum(m),
                           malicious_share=jnp.sum(s * m) / jnp.maximum(jnp.sum(s), 1e-30))
        return aggregate, new_state, metrics

    def _robust(self, uploads, weights, valid, state, reference, key):
        """A robust rule on the deltas relative to ``reference``: ``(reference + rule(Δ), state, selected)``."""
        n = tree.num_clients(uploads)
        deltas = tree.sub(uploads, tree.broadcast_clients(reference, n))
        delta, state, selected = self.rule.reduce(deltas, weights, valid, state, key)
        return tree.add(reference, delta), state, selected

    # ------------------------------------------------------------------------------------------------ lanes
    def at(self, hp: dict | None) -> "Aggregator":
        """This aggregator with the traced values of ``hp`` (a lane's: ``attack.fraction``, ``aggregator.beta``, …)
        in place; the encoder's noise multiplier is the privacy's (:meth:`fljax.privacy.Privacy.at`)."""
        out = self
        for section, field in (("attack", "attack"), ("aggregator", "rule")):
            own = {k.split(".", 1)[1]: v for k, v in (hp or {}).items() if k.startswith(section + ".")}
            if own and getattr(out, field) is not None:
                out = dataclasses.replace(out, **{field: dataclasses.replace(getattr(out, field), **own)})
        return out


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
        what = ("an attack" if aggregator.attack is not None and isinstance(aggregator.rule, Mean)
                else f"aggregator {aggregator.rule.name!r}")
        raise OptionError("aggregator" if what.startswith("aggregator") else "attack",
                          f"{what} needs a server that reads the uploads only through their aggregate; "
                          f"{algorithm.name}'s server reads them otherwise ({algorithm.aggregate_note()}), so the "
                          f"rule cannot replace its mean. Use an algorithm that averages models (e.g. fedavg, "
                          f"fedprox, ditto, fedrep).")
    if private and not isinstance(aggregator.rule, Mean):
        raise OptionError("aggregator.name", f"{aggregator.rule.name!r} under client-level privacy is refused: the "
                                             f"Gaussian mechanism is calibrated to the sensitivity C/W of a clipped "
                                             f"weighted sum, and a {aggregator.rule.name} has another sensitivity "
                                             f"(it would need its own private mechanism, e.g. a noised median); use "
                                             f"aggregator.name: mean with privacy.")


def attack_count(fraction: float, num_clients: int) -> int:
    """⌈fraction·N⌉, as :func:`malicious_mask` draws it (host side)."""
    return int(math.ceil(fraction * num_clients - 1e-6))
