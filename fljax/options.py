"""Options declared where they are used: typed dataclass fields with a default, a one-line doc and a value check.

A component (a data source, a partitioner) declares its options as a frozen dataclass deriving from
:class:`Options`, each field made with :func:`option`. Constructing one checks every value against its type and its
check and raises :class:`fljax.errors.OptionError` naming the option; :func:`parse` builds one from a plain dict and
also refuses an unknown key, suggesting the closest valid one. :func:`check_value` is the type check alone (the
config layer uses it for its own keys and for algorithms' hyperparameters).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any, Callable, Mapping

from fljax.errors import OptionError

__all__ = ["Options", "NoOptions", "Registry", "option", "with_default", "field_default", "nested", "Declared",
           "declared", "flat_values", "replace_flat", "parse", "check_value", "describe", "suggest", "show",
           "greater_than", "at_least", "between", "interval", "one_of", "each", "seed_check", "type_hints", "INT64",
           "SEED_MAX"]

INT64 = 2 ** 63 - 1  # the largest integer an option may hold (numpy's int64)
FLOAT32_MAX = 3.4028234663852886e38  # the largest magnitude of a float option (the engine computes in float32)
SEED_MAX = 2 ** 32 - 1  # JAX's PRNGKey takes a uint32 seed (larger ones silently wrap around)

Check = Callable[[Any], "str | None"]  # a value -> None when it is fine, else what is wrong ("must be > 0, got -1.")


def option(default, doc: str, check: Check | None = None):
    """A dataclass field: ``default``, a one-line ``doc`` (shown by ``fljax list``) and an optional value ``check``
    (not applied to None)."""
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check})


def field_default(field: dataclasses.Field):
    """A dataclass field's default value (its factory's product for a mutable default)."""
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def nested(kind: type, takes: typing.Sequence[str] | None = None, doc: str = "", **defaults) -> dataclasses.Field:
    """A field holding an options value of class ``kind``, of which its owner takes the options ``takes`` (default:
    every one) as flat options under their own names, with ``defaults`` in place of ``kind``'s (for taken options).
    The field's default is that value (checked here, when the owner is defined); an option not taken keeps ``kind``'s
    default and cannot be changed (construction refuses it)::

        local: LocalTraining = nested(LocalTraining, ("lr", "batch_size", "local_steps"), lr=0.05)

    The flat options of every nested field and the owner's own fields must have distinct names (:func:`declared`)."""
    names = [f.name for f in dataclasses.fields(kind) if f.init]
    takes = tuple(names if takes is None else takes)
    wrong = sorted(set(takes) - set(names)) or sorted(set(defaults) - set(takes))
    if wrong:
        raise TypeError(f"nested({kind.__name__}): {wrong} are not options of {kind.__name__} taken here; "
                        f"{kind.__name__}'s options are {names}.")
    return dataclasses.field(default=kind(**defaults), metadata={"doc": doc, "check": None, "takes": takes})


@dataclasses.dataclass(frozen=True)
class Declared:
    """One flat option of an options class: its ``name``, type, ``default`` (the owner's), one-line ``doc`` and
    value ``check``; ``within``: the :func:`nested` field that holds it (None: a field of the class itself)."""

    name: str
    type: Any
    default: Any
    doc: str
    check: Check | None
    within: str | None = None


@functools.cache
def declared(cls: type) -> dict[str, Declared]:
    """The flat options of options class ``cls`` by name, in field order, a :func:`nested` field's taken options in
    its place. Raises TypeError when two share a name."""
    hints = type_hints(cls)
    out: dict[str, Declared] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if "takes" in f.metadata:
            kind, inner = hints[f.name], {g.name: g for g in dataclasses.fields(hints[f.name])}
            entries = [Declared(n, type_hints(kind)[n], getattr(f.default, n), inner[n].metadata.get("doc", ""),
                                inner[n].metadata.get("check"), f.name) for n in f.metadata["takes"]]
        else:
            entries = [Declared(f.name, hints[f.name], field_default(f), f.metadata.get("doc", ""),
                                f.metadata.get("check"))]
        for d in entries:
            if d.name in out:
                raise TypeError(f"{cls.__name__}: option {d.name!r} is declared twice (by "
                                f"{out[d.name].within or 'the class'} and {d.within or 'the class'}); rename one.")
            out[d.name] = d
    return out


def flat_values(options) -> dict:
    """The flat options of ``options`` (an options value) by name: :func:`declared`'s, with their values."""
    return {name: getattr(options if d.within is None else getattr(options, d.within), name)
            for name, d in declared(type(options)).items()}


def replace_flat(options, **values):
    """``options`` with flat options replaced by name (those of a :func:`nested` value replaced in that value). The
    values may be traced (a copy holding arrays is not checked again, :class:`Options`)."""
    names = declared(type(options))
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise OptionError(unknown[0], f"is not an option of {type(options).__name__}.{suggest(unknown[0], names)}")
    own = {k: v for k, v in values.items() if names[k].within is None}
    for within in {names[k].within for k in values} - {None}:
        own[within] = dataclasses.replace(getattr(options, within),
                                          **{k: v for k, v in values.items() if names[k].within == within})
    return dataclasses.replace(options, **own) if own else options


def with_default(owner: type, name: str, default):
    """The declaration of option ``name`` of dataclass ``owner`` (its doc and check) with another default, for a
    class that takes the option with a default of its own (``momentum: float = with_default(LocalTraining,
    "momentum", 0.9)``)."""
    field = {f.name: f for f in dataclasses.fields(owner)}[name]
    return dataclasses.field(default=default, metadata=field.metadata)


class Options:
    """Base of an options dataclass: construction type-checks every field (ints become floats where a float is
    expected, lists become tuples where a tuple is), applies each field's check, then :meth:`check`. A
    :func:`nested` field must hold a value of its type whose options the owner does not take are the declared
    default's (the owner cannot be given an option it does not honour).

    A copy holding arrays (a traced value inside a compiled program: an algorithm's hyperparameter swept as a lane
    of one program), in a field of its own or of a nested value, is not checked again: the values it was made from
    were, when their config was resolved."""

    def __post_init__(self):
        if _traced(self):
            return
        hints = type_hints(type(self))
        for f in dataclasses.fields(self):
            value = check_value(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            if "takes" in f.metadata:
                _check_nested(self, f, value, hints[f.name])
                continue
            check = f.metadata.get("check")
            problem = check(value) if check is not None and value is not None else None
            if problem:
                raise OptionError(f.name, problem)
        self.check()

    def check(self) -> None:
        """Checks across fields (override; raise :class:`OptionError`)."""

    def to_dict(self) -> dict:
        """The options by name, flat (a :func:`nested` value's taken options under their own names; fields declared
        ``init=False`` are derived values, not options: left out)."""
        return {name: _plain(value) for name, value in flat_values(self).items()}


def _is_array(value) -> bool:
    """A numpy or JAX array or scalar, or a tracer (anything with a shape and a dtype)."""
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _traced(options) -> bool:
    """``options`` holds an array in one of its fields, or in a field of a nested options value."""
    return any(_is_array(v) or isinstance(v, Options) and _traced(v)
               for v in (getattr(options, f.name) for f in dataclasses.fields(options)))


def _check_nested(owner, field: dataclasses.Field, value, kind: type) -> None:
    """A :func:`nested` field's value: of its type, and at the declared default in every option the owner does not
    take."""
    if not isinstance(value, kind):
        raise OptionError(field.name, f"must be a {kind.__name__} value, got {show(value)}.")
    for f in dataclasses.fields(kind):
        if f.init and f.name not in field.metadata["takes"] and getattr(value, f.name) != getattr(field.default, f.name):
            raise OptionError(f.name, f"is not an option of {type(owner).__name__}, whose {field.name} takes only "
                                      f"{list(field.metadata['takes'])}; leave it at {show(getattr(field.default, f.name))}.")


@functools.cache
def type_hints(cls: type) -> dict:
    """``typing.get_type_hints(cls)``, computed once per class (options classes are constructed often: an
    algorithm's traced copies inside every compiled program)."""
    return typing.get_type_hints(cls)


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
    """A component without options."""


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def parse(cls: type, values: Mapping, where: str = ""):
    """``cls`` made from its flat options ``values`` (:func:`declared`: a :func:`nested` value's taken options by
    their own names), refusing a key that is not one of them (``where``: e.g. " for partition 'iid'")."""
    names = declared(cls)
    for key in values:
        if key not in names:
            raise OptionError(str(key), f"is not a valid key{where}.{suggest(str(key), names)} Valid keys: "
                                        f"{sorted(names)}.")
    own = {k: v for k, v in values.items() if names[k].within is None}
    for f in dataclasses.fields(cls):
        given = {k: v for k, v in values.items() if names[k].within == f.name}
        if given:
            own[f.name] = dataclasses.replace(f.default, **given)
    return cls(**own)


class Registry(dict):
    """Components of one kind by name (``aggregator``, ``attack``, ``participation``): each is an :class:`Options`
    dataclass with a ``name`` class attribute that registers itself where it is defined (``@REGISTRY.register``). A
    config section names one and gives its options flat (``{name: krum, f: 2}``), parsed by :meth:`parse`."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, cls: type) -> type:
        """Class decorator: make ``cls`` available as ``<kind>.name: cls.name``."""
        if cls.name in self:
            raise ValueError(f"{self.kind} {cls.name!r} is registered twice.")
        self[cls.name] = cls
        return cls

    def parse(self, values: Mapping, default: str | None = None):
        """The component a section names (``name``, else ``default``) built from the section's other keys, every
        problem refused in one line naming the key."""
        values = dict(values)
        name = values.pop("name", default)
        if name not in self:
            raise OptionError("name", f"must be one of {sorted(self)}, got {show(name)}.{suggest(str(name), self)}")
        return parse(self[name], values, f" of {self.kind} {name!r}")


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, doc) of every flat option of ``cls``."""
    return [(d.name, _plain(d.default), d.doc) for d in declared(cls).values()]


def suggest(key: str, choices) -> str:
    """' Did you mean X?' for the choice closest to ``key``: the one that equals it but for case first (``FP32`` →
    ``fp32``, not the nearer spelling ``tf32``), else difflib's closest (empty when none is close)."""
    names = [str(c) for c in choices]
    same = [c for c in names if c.casefold() == str(key).casefold()]
    close = same or difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def show(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (messages stay one short line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------------- checks


def greater_than(low) -> Check:
    return lambda v: None if v > low else f"must be > {low}, got {show(v)}."


def at_least(low) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {show(v)}."


def between(low, high, open_: bool = False) -> Check:
    """``low <= v <= high`` (``open_``: ``low < v < high``)."""
    if open_:
        return lambda v: None if low < v < high else f"must be in ({low}, {high}), got {show(v)}."
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}, got {show(v)}."


def interval(low, high, bounds: str = "[]") -> Check:
    """``low <= v <= high`` with either end open (``bounds``: '[]', '[)', '(]' or '()'), said as an interval."""
    above = (lambda v: v >= low) if bounds[0] == "[" else (lambda v: v > low)
    below = (lambda v: v <= high) if bounds[1] == "]" else (lambda v: v < high)
    text = f"{bounds[0]}{low}, {high}{bounds[1]}"
    return lambda v: None if above(v) and below(v) else f"must be in {text}, got {show(v)}."


def one_of(choices) -> Check:
    """The value is one of ``choices`` (a registry's names), suggesting the closest."""
    def check(v):
        return None if v in choices else f"must be one of {sorted(choices)}, got {show(v)}.{suggest(str(v), choices)}"

    return check


def seed_check(seed: int) -> str | None:
    return None if 0 <= seed <= SEED_MAX else f"must be between 0 and {SEED_MAX} (a uint32 PRNG seed), got {seed}."


def each(check: Check) -> Check:
    """``check`` applied to every element of a list (the message names the first bad element)."""

    def check_all(values):
        for i, v in enumerate(values):
            problem = check(v)
            if problem:
                return f"element {i} {problem}"
        return None

    return check_all


# --------------------------------------------------------------------------------------------------- type check


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_value(key: str, value, annotation):
    """``value`` checked against a type annotation; returns it (ints as floats where a float is expected, lists as
    tuples where a tuple is). Raises :class:`OptionError` for a wrong type, a non-finite float, a float beyond
    float32's range or an integer beyond int64. Annotations other than int, float, bool, str, dict, lists, tuples,
    sequences, unions and literals accept any value."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return check_value(key, value, a)
                except OptionError:
                    if a in (int, float) and _is_number(value) and (a is float or isinstance(value, int)):
                        raise  # the right kind of number, out of range: say so
        raise OptionError(key, f"must be {_type_name(annotation)}, got {show(value)}.")
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        if value not in choices or isinstance(value, bool) != any(isinstance(c, bool) for c in choices):
            raise OptionError(key, f"must be one of {list(choices)}, got {show(value)}.{suggest(str(value), choices)}")
        return value
    if (origin or annotation) in (tuple, list, collections.abc.Sequence):
        return _check_items(key, value, annotation)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError(key, f"must be a number, got {show(value)}.")
        if isinstance(value, int) and abs(value) > INT64 or not math.isfinite(value):
            raise OptionError(key, f"must be a finite number, got {show(value)}.")
        if abs(value) > FLOAT32_MAX:
            raise OptionError(key, f"must be at most {FLOAT32_MAX:.4g} in magnitude (computations are float32, "
                                   f"where it would be infinite), got {show(float(value))}.")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionError(key, f"must be an integer, got {show(value)}.")
        if abs(value) > INT64:
            raise OptionError(key, f"must be an integer of at most {INT64}, got {show(value)}.")
        return value
    if annotation in (bool, str, dict):
        if not isinstance(value, annotation):
            raise OptionError(key, f"must be {_type_name(annotation)}, got {show(value)}.")
        return value
    return value


def _check_items(key: str, value, annotation):
    origin = typing.get_origin(annotation) or annotation
    if not isinstance(value, (list, tuple)):
        raise OptionError(key, f"must be a list, got {show(value)}.")
    args = typing.get_args(annotation)
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, float]: one type per position
        if len(args) != len(value):
            raise OptionError(key, f"must be a list of {len(args)} values, got {len(value)}.")
        items = [check_value(f"{key}[{i}]", v, a) for i, (a, v) in enumerate(zip(args, value))]
    else:
        item = args[0] if args else Any
        items = [check_value(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    return items if origin is list else tuple(items)


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
             type(None): "null"}
    if annotation in names:
        return names[annotation]
    if (typing.get_origin(annotation) or annotation) in (tuple, list, collections.abc.Sequence):
        return "a list"
    if typing.get_origin(annotation) is typing.Literal:
        return f"one of {list(typing.get_args(annotation))}"
    return getattr(annotation, "__name__", str(annotation))
