"""Registry: algorithm names → classes, and construction from a hyperparameter dict with clear errors."""
from __future__ import annotations

import dataclasses
import difflib
import typing

from fljax.algorithms.base import Algorithm
from fljax.errors import OptionError
from fljax.options import field_default, parse, type_hints

__all__ = ["ALGORITHMS", "register", "get_algorithm", "make_algorithm", "hyperparameter_fields", "hyperparameter_docs",
           "defaults", "check_model_support"]

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


def defaults(cls: type[Algorithm]) -> dict:
    """name → declared default of every hyperparameter of ``cls`` (read from the declarations: nothing is
    constructed)."""
    return {name: field_default(f) for name, f in hyperparameter_fields(cls).items()}


def hyperparameter_docs(cls: type[Algorithm]) -> dict[str, tuple[str, object, str]]:
    """name → (type, default, one line) of every hyperparameter, as its declaration
    (:func:`fljax.options.option`) states them."""
    hints = type_hints(cls)
    out = {}
    for name, field in hyperparameter_fields(cls).items():
        out[name] = (_kind(hints[name]), field_default(field), field.metadata["doc"])
    return out


def _kind(hint) -> str:
    """A type as ``fljax list`` shows it: ``float``, ``int | None``; a choice of strings as ``str``."""
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0]).__name__
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_model_support(name: str, model, groups: bool = False) -> None:
    """Refuse in one line a model with BatchNorm or Dropout for algorithm ``name`` unless its clients train it
    (:class:`~fljax.algorithms.model_state.TrainsModelState`, listed in the message), and with client ``groups``."""
    if model is None or not model.has_mode:
        return
    what = "BatchNorm" if model.collections else "Dropout"
    if not get_algorithm(name).trains_model_state:
        able = sorted(n for n, c in ALGORITHMS.items() if c.trains_model_state)
        raise ValueError(f"model {model.name} has {what}, which only these algorithms train: {', '.join(able)}; "
                         f"got {name!r}.")
    if groups:
        raise ValueError(f"model {model.name} has {what}: client groups (population) are not supported with it.")


def make_algorithm(name: str, **hyperparameters) -> Algorithm:
    """``make_algorithm("fedprox", mu=0.1, lr=0.05)``: the algorithm constructed (every value checked by its
    declaration); a key it does not declare is refused with the closest valid one, and an option of the asynchronous
    algorithms only (``staleness``, ``concurrency``, …) on a synchronous one with the algorithms that take it (an
    :class:`~fljax.errors.OptionError` naming the key)."""
    cls = get_algorithm(name)
    declared = hyperparameter_fields(cls)
    for key in hyperparameters:
        owners = sorted(n for n, c in ALGORITHMS.items() if key in hyperparameter_fields(c))
        if key not in declared and owners and not cls.asynchronous and all(ALGORITHMS[n].asynchronous for n in owners):
            raise OptionError(str(key), f"is an option of the asynchronous algorithms ({', '.join(owners)}); {name} "
                                        f"is synchronous: remove it, or run one of them.")
    return parse(cls, hyperparameters, f" for algorithm {name!r}")
