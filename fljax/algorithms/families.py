"""The algorithms grouped by what they share with the client, for people: the quick-start comparison takes its
representatives from here, a comparison of more than :data:`fljax.runner.run_plots.MAX_LINES` algorithms is drawn as
small multiples, one panel per family, and a comparison's table says under an algorithm's row when one of its
defaults (its paper's value) is the likely reason the row lags (:func:`untuned`).

An algorithm's family is part of its registration (:func:`fljax.algorithms.registry.register`); the names of the
built-in families are below, and :func:`families` derives each family's members from the registry. Every
classification algorithm belongs to exactly one family; the consensus-regression algorithms (FedGiA's) run only in
their own study and are in theirs.

This module imports no algorithm (the command line reads :data:`QUICKSTART` without loading them).
"""
from __future__ import annotations

__all__ = ["GLOBAL_MODEL", "ASYNCHRONOUS", "PERSONAL_REGULARISED", "PERSONAL_SPLIT", "DECENTRALIZED", "QUANTIZED",
           "PRETRAINED", "NO_COMMUNICATION", "CONSENSUS_REGRESSION", "QUICKSTART", "QUICKSTART_WHY", "families",
           "family", "untuned"]

GLOBAL_MODEL = "one global model"
ASYNCHRONOUS = "asynchronous (buffered, staleness-weighted)"
PERSONAL_REGULARISED = "personal models, regularised or meta-learned"
PERSONAL_SPLIT = "personal models, split or decomposed"
DECENTRALIZED = "decentralized (gossip, no server)"
QUANTIZED = "quantized personal models"
PRETRAINED = "a server-side pretrained model"
NO_COMMUNICATION = "no communication"
CONSENSUS_REGRESSION = "consensus regression (FedGiA's study)"

# What `fljax compare` runs without --algorithms, and why (its help and the README say this).
QUICKSTART: tuple[str, ...] = ("fedavg", "fedprox", "scaffold", "ditto", "fedrep", "fedslr", "dfedalt", "local")
QUICKSTART_WHY = ("Why these: the three baselines every FL paper reports (FedAvg; FedProx, its proximal term; "
                  "SCAFFOLD, drift correction), one personalization method of each kind (Ditto: a personal model "
                  "regularised towards the global one; FedRep: a personal head on a shared body; FedSLR: a low-rank "
                  "global part plus a sparse personal one), one decentralized method (DFedAlt: gossip, no server) "
                  "and Local training (no communication), the reference any personalization must beat. The quantized "
                  "family needs its own schedule and models (configs/quped.yaml), the pretrained-model family its "
                  "own split (configs/augfl.yaml).")


def families() -> dict[str, tuple[str, ...]]:
    """Every family's registered algorithms, in registration order (families in the order of their first member)."""
    from fljax.algorithms import ALGORITHMS

    out: dict[str, list[str]] = {}
    for name, cls in ALGORITHMS.items():
        out.setdefault(cls.family, []).append(name)
    return {f: tuple(names) for f, names in out.items()}


def family(name: str) -> str:
    """The family of algorithm ``name`` ('other' for a name that is not registered)."""
    from fljax.algorithms import ALGORITHMS

    return ALGORITHMS[name].family if name in ALGORITHMS else "other"


def untuned(algorithm, rounds: int) -> str | None:
    """The note of ``algorithm``'s registration (an algorithm object; its ``untuned``: a default, the paper's, that
    may not suit small problems like the quick start's) when it runs at that default, else None."""
    from fljax.algorithms.registry import defaults

    if type(algorithm).untuned is None:
        return None
    key, text = type(algorithm).untuned
    value = algorithm.hyperparameters()[key]
    return f"{algorithm.name}: {text.format(value=value, rounds=rounds)}" if value == defaults(type(algorithm))[key] \
        else None
