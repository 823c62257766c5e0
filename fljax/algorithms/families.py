"""The algorithms grouped by what they share with the client, for people: the quick-start comparison takes its
representatives from here, a comparison of more than :data:`fljax.runner.run_plots.MAX_LINES` algorithms is drawn as
small multiples, one panel per family, and a comparison's table says under an algorithm's row when one of its
defaults (its paper's value) is the likely reason the row lags (:data:`UNTUNED`).

Every classification algorithm of the registry belongs to exactly one family (a test checks it); the consensus-
regression algorithms (FedGiA's) run only in their own study and belong to none.
"""
from __future__ import annotations

import dataclasses

__all__ = ["FAMILIES", "QUICKSTART", "QUICKSTART_WHY", "UNTUNED", "family", "untuned"]

FAMILIES: dict[str, tuple[str, ...]] = {
    "one global model": ("fedavg", "fedprox", "scaffold", "feddyn", "fedavg_ft", "fednova"),
    "asynchronous (buffered, staleness-weighted)": ("fedbuff", "fedasync"),
    "personal models, regularised or meta-learned": ("ditto", "apfl", "pfedme", "perfedavg", "fml"),
    "personal models, split or decomposed": ("fedrep", "fedper", "lg_fedavg", "fedbabu", "fedrod", "fedslr"),
    "decentralized (gossip, no server)": ("dfedalt", "dfedsalt", "dfedavg", "dfedavgm", "dfedsam", "dispfl"),
    "quantized personal models": ("quped", "qupel"),
    "a server-side pretrained model": ("augfl", "fedlp"),
    "no communication": ("local", "quped_local"),
}

# What `fljax compare` runs without --algorithms, and why (its help and the README say this).
QUICKSTART: tuple[str, ...] = ("fedavg", "fedprox", "scaffold", "ditto", "fedrep", "fedslr", "dfedalt", "local")
QUICKSTART_WHY = ("Why these: the three baselines every FL paper reports (FedAvg; FedProx, its proximal term; "
                  "SCAFFOLD, drift correction), one personalization method of each kind (Ditto: a personal model "
                  "regularised towards the global one; FedRep: a personal head on a shared body; FedSLR: a low-rank "
                  "global part plus a sparse personal one), one decentralized method (DFedAlt: gossip, no server) "
                  "and Local training (no communication), the reference any personalization must beat. The quantized "
                  "family needs its own schedule and models (configs/quped.yaml), the pretrained-model family its "
                  "own split (configs/augfl.yaml).")

def family(name: str) -> str:
    """The family of algorithm ``name`` ('other' for one that no family lists)."""
    return next((f for f, names in FAMILIES.items() if name in names), "other")


# Defaults (the papers' values) that do not suit small problems like the quick start's (digits, an MLP, 100 rounds),
# with the setting to try: a comparison's table says so under the row of an algorithm left at that default when the
# row lags the best by LAG or more, or repeats another row (fljax.runner.report.distinct_table). Measured at the quick start: Per-FedAvg 0.185 ->
# 0.929 with beta = 0.1; DFedSalt 0.846 -> 0.957 with rho = 0.01; FedProx 0.944 (= FedAvg) -> 0.941 (mu = 0.1),
# 0.938 (mu = 1).
UNTUNED: dict[str, tuple[str, str]] = {
    "perfedavg": ("beta", "its outer step β = {value} (the paper's) moves the model little in {rounds} rounds; "
                          "try algo.beta=0.1 (fljax run --algorithm perfedavg --set algo.beta=0.1)"),
    "dfedsalt": ("rho", "its SAM radius ρ = {value} (the paper's, for CNNs on CIFAR) is too large for a small model; "
                        "try algo.rho=0.01 (fljax run --algorithm dfedsalt --set algo.rho=0.01)"),
    "fedprox": ("mu", "its μ = {value} adds almost nothing to FedAvg's local objective here; see what μ does with "
                      "fljax sweep --algorithm fedprox --grid algo.mu=0,0.01,0.1,1"),
}


def untuned(algorithm, rounds: int) -> str | None:
    """The note on ``algorithm`` (an algorithm object) when it runs at a default of :data:`UNTUNED`, else None."""
    from fljax.options import field_default

    entry = UNTUNED.get(algorithm.name)
    if entry is None:
        return None
    key, text = entry
    default = field_default(next(f for f in dataclasses.fields(algorithm) if f.name == key))
    value = algorithm.hyperparameters()[key]
    return f"{algorithm.name}: {text.format(value=value, rounds=rounds)}" if value == default else None
