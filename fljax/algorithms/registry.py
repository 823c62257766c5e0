"""Registry: algorithm names → classes, and construction from a hyperparameter dict with clear errors."""
from __future__ import annotations

import dataclasses
import difflib

from fljax.algorithms.base import Algorithm

__all__ = ["ALGORITHMS", "register", "get_algorithm", "make_algorithm", "hyperparameter_fields"]

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator (or plain call) adding ``cls`` under ``cls.name``."""
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise ValueError(f"algorithm name {cls.name!r} is already registered by {ALGORITHMS[cls.name].__name__}.")
    ALGORITHMS[cls.name] = cls
    return cls


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def get_algorithm(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}.{_suggest(name, ALGORITHMS)}")
    return ALGORITHMS[name]


def hyperparameter_fields(cls: type[Algorithm]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def make_algorithm(name: str, **hyperparameters) -> Algorithm:
    """``make_algorithm("fedprox", mu=0.1, lr=0.05)``; unknown hyperparameters are refused by name."""
    cls = get_algorithm(name)
    fields = hyperparameter_fields(cls)
    for key in hyperparameters:
        if key not in fields:
            raise ValueError(f"algorithm {name!r} has no hyperparameter {key!r}.{_suggest(key, fields)} "
                             f"Valid: {sorted(fields)}.")
    return cls(**hyperparameters)
