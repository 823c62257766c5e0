"""The registry: every algorithm registers itself where it is defined, once, and everything else is derived from
that registration — the names (:data:`ALGORITHMS`), the families (:func:`fljax.algorithms.families.families`), the
hyperparameters a config may give (:func:`option_names`, the hint for ``lr`` given at the top level), ``fljax
list`` and the example configs' check.

A registration names the algorithm, its family, one line about it and an example config, above its dataclass::

    from fljax.algorithms import Aggregating, LocalTraining, local_training, register

    @register("partial_step", family="one global model", example="configs/partial_step.yaml",
              summary="FedAvg whose server moves a fraction γ of the way to the clients' mean")
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class PartialStep(Aggregating):
        local: LocalTraining = local_training("lr", "batch_size", "local_steps", lr=0.05)
        gamma: float = option(0.5, "fraction γ of the way from w_t to the clients' mean A_t", interval(0, 1, "(]"))
        ...

Its hyperparameters are its dataclass fields, each declared with :func:`fljax.options.option`, and the options its
values take flat (:func:`~fljax.algorithms.local_training.local_training`,
:func:`~fljax.algorithms.server_optimizer.server_optimizer`): :func:`declarations` lists them, as
:meth:`~fljax.algorithms.base.Algorithm.hyperparameters` holds them and :func:`make_algorithm` takes them. A module
of one's own registers the same way: once it is imported, ``fljax.run``, ``fljax.sweep`` and ``fljax.compare`` take
its name like a built-in's (docs/own-model-data.md).
"""
from __future__ import annotations

import difflib
import typing

from fljax.algorithms.base import Algorithm
from fljax.errors import OptionError
from fljax.options import Declared, declared, parse

__all__ = ["ALGORITHMS", "register", "get_algorithm", "make_algorithm", "declarations", "hyperparameter_docs",
           "defaults", "option_names", "check_model_support"]

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(name: str, *, family: str, summary: str, example: str | None = None,
             untuned: tuple[str, str] | None = None):
    """Class decorator registering an algorithm (a frozen dataclass deriving from
    :class:`~fljax.algorithms.base.Algorithm`; put it above ``@dataclasses.dataclass``) under ``name``:

    * ``family``: what it shares with the client, for people (comparisons of many algorithms are drawn one panel per
      family; :mod:`fljax.algorithms.families` names the built-in ones; any text starts a new one);
    * ``summary``: one line, shown when a run starts and by ``fljax list``;
    * ``example``: a config file that runs it (the built-ins': ``configs/<name>.yaml``, relative to the
      repository), shown by ``fljax list NAME``; None for one that runs only in its study;
    * ``untuned``: ``(key, note)`` when the default of hyperparameter ``key`` (its paper's) may not suit small
      problems; a comparison's table prints ``note`` (``{value}``, ``{rounds}`` filled in) under its row when the row
      lags (:func:`fljax.algorithms.families.untuned`).

    Sets those as the class's attributes and checks the declarations (every hyperparameter declared with
    :func:`fljax.options.option`, no two with one flat name), raising TypeError or ValueError in one line. A name
    is registered once; the same class defined again (its module reloaded, a notebook cell run twice) replaces its
    own registration."""

    def add(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"register({name!r}): {cls!r} is not a subclass of fljax.algorithms.Algorithm.")
        if "__dataclass_fields__" not in cls.__dict__ or not cls.__dataclass_params__.frozen:
            raise TypeError(f"register({name!r}): {cls.__name__} is not a frozen dataclass; put "
                            f"@register(...) above @dataclasses.dataclass(frozen=True, kw_only=True).")
        held = ALGORITHMS.get(name)
        if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"algorithm name {name!r} is already registered by {ALGORITHMS[name].__name__}.")
        if not name or not family or not summary:
            raise ValueError(f"register({name!r}): give a name, a family and a one-line summary.")
        undocumented = [d.name for d in declared(cls).values() if not d.doc]
        if undocumented:
            raise TypeError(f"register({name!r}): {cls.__name__} declares {undocumented} without a doc; declare "
                            f"every hyperparameter with fljax.options.option(default, doc, check).")
        if untuned is not None and untuned[0] not in declared(cls):
            raise ValueError(f"register({name!r}): untuned names {untuned[0]!r}, not a hyperparameter of it.")
        cls.name, cls.family, cls.summary, cls.example, cls.untuned = name, family, summary, example, untuned
        ALGORITHMS[name] = cls
        return cls

    return add


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def get_algorithm(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}.{_suggest(name, ALGORITHMS)}")
    return ALGORITHMS[name]


def declarations(cls: type[Algorithm]) -> dict[str, Declared]:
    """Every hyperparameter of ``cls`` by its flat name, with its type, default (the algorithm's), doc and check:
    its own fields and the options its values take (:func:`fljax.options.declared`)."""
    return declared(cls)


def defaults(cls: type[Algorithm]) -> dict:
    """name → declared default of every hyperparameter of ``cls`` (read from the declarations: nothing is
    constructed)."""
    return {name: d.default for name, d in declarations(cls).items()}


def hyperparameter_docs(cls: type[Algorithm]) -> dict[str, tuple[str, object, str]]:
    """name → (type, default, one line) of every hyperparameter, as its declaration
    (:func:`fljax.options.option`) states them."""
    return {name: (_kind(d.type), d.default, d.doc) for name, d in declarations(cls).items()}


def option_names() -> frozenset[str]:
    """The hyperparameter names of every registered algorithm (the config layer's hint on one given at the top
    level: ``lr`` → ``algo.lr``)."""
    return frozenset(name for cls in ALGORITHMS.values() for name in declarations(cls))


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
    """``make_algorithm("fedprox", mu=0.1, lr=0.05)``: the algorithm constructed from its flat hyperparameters (the
    local training's ``lr`` among them; every value checked by its declaration); a key it does not declare is
    refused with the closest valid one, and an option of the asynchronous algorithms only (``staleness``,
    ``concurrency``, …) on a synchronous one with the algorithms that take it (an :class:`~fljax.errors.OptionError`
    naming the key)."""
    cls = get_algorithm(name)
    declared_here = declarations(cls)
    for key in hyperparameters:
        owners = sorted(n for n, c in ALGORITHMS.items() if key in declarations(c))
        if key not in declared_here and owners and not cls.asynchronous \
                and all(ALGORITHMS[n].asynchronous for n in owners):
            raise OptionError(str(key), f"is an option of the asynchronous algorithms ({', '.join(owners)}); {name} "
                                        f"is synchronous: remove it, or run one of them.")
    return parse(cls, hyperparameters, f" for algorithm {name!r}")
