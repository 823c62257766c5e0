"""Typed experiment configuration: dataclasses, parsing from nested dicts/YAML, dotted overrides, validation.

Every wrong input is refused before anything runs, in one line that names the key and, for a misspelt key,
suggests the closest valid name. :func:`load_config` reads YAML; :func:`apply_overrides` applies
``key=value`` strings such as ``data.alpha=0.1``, ``algo.mu=0.01`` or ``rounds=50`` (values parsed as YAML).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

import yaml

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "ExperimentConfig", "from_dict", "to_dict", "load_config",
           "apply_overrides", "parse_override"]


class ConfigError(ValueError):
    """An invalid configuration (the message is one line naming the key)."""


@dataclasses.dataclass
class DataConfig:
    """Which data set, how it is split over clients, and how each client's test split is drawn."""

    dataset: str = "synthetic"
    num_clients: int = 100
    partition: str | None = None  # None: 'natural' for synthetic, 'dirichlet' otherwise
    alpha: float = 0.5  # Dirichlet concentration
    classes_per_client: int = 2  # pathological split
    sigma: float = 1.0  # power-law (lognormal) size spread
    test_per_client: int | None = None  # pooled sources; None: ceil(test pool / num_clients)
    test_fraction: float = 0.2  # natural sources: per-client hold-out
    test_rounding: str = "largest_remainder"  # per-class test counts: largest_remainder | floor | ceil
    samples_per_client: int | None = None  # client_dirichlet / client_pathological; None: pool size / clients
    on_exhausted: str = "refill"  # client_* samplers: refill | redraw an exhausted class pool
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    max_samples: int | None = 1000  # synthetic: cap on a client's size
    noise: float = 0.0  # digits: fixed Gaussian pixel noise
    data_dir: str | None = None  # TFDS
    limit: int | None = None  # TFDS: first `limit` examples per split
    seed: int | None = None  # None: the experiment seed


@dataclasses.dataclass
class ModelConfig:
    """``name``: 'auto' (logreg for vectors, cnn1 for images) or a name from ``fljax list``; ``options`` go to the
    module (e.g. ``{hidden: [128, 128]}`` for mlp, ``{groups: 32, head_bias: true}`` for resnet18_gn)."""

    name: str = "auto"
    options: dict = dataclasses.field(default_factory=dict)
    conv_impl: str = "auto"  # auto | native | patches


@dataclasses.dataclass
class ExperimentConfig:
    """One experiment: an algorithm with its hyperparameters (``algo``), data, model and run settings."""

    algorithm: str = "fedavg"
    algo: dict = dataclasses.field(default_factory=dict)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    rounds: int = 100
    eval_every: int = 10
    seed: int = 0
    executor: str = "auto"
    chunk_size: int | None = None
    name: str | None = None  # run name (default: the algorithm)

    def validate(self) -> "ExperimentConfig":
        """Refuse impossible values (types are checked by :func:`from_dict`)."""
        _positive(self, "rounds", "eval_every")
        _positive(self.data, "num_clients", "classes_per_client")
        if self.chunk_size is not None:
            _positive(self, "chunk_size")
        if not self.data.alpha > 0:
            raise ConfigError(f"data.alpha must be > 0 (Dirichlet concentration), got {self.data.alpha}.")
        if not 0 < self.data.test_fraction < 1:
            raise ConfigError(f"data.test_fraction must be in (0, 1), got {self.data.test_fraction}.")
        if self.data.sigma < 0 or self.data.noise < 0:
            raise ConfigError("data.sigma and data.noise must be >= 0.")
        from fljax.algorithms import ALGORITHMS, make_algorithm
        from fljax.data.partitioners import PARTITIONERS
        from fljax.data.sources import SOURCES
        from fljax.engine.executors import EXECUTORS
        from fljax.models.model import MODELS

        _choice("algorithm", self.algorithm, ALGORITHMS)
        _choice("data.dataset", self.data.dataset, SOURCES)
        if self.data.partition is not None:
            _choice("data.partition", self.data.partition, PARTITIONERS)
        _choice("executor", self.executor, EXECUTORS)
        if self.model.name != "auto":
            _choice("model.name", self.model.name, MODELS)
        _choice("model.conv_impl", self.model.conv_impl, {"auto": 0, "native": 0, "patches": 0})
        try:
            algo = make_algorithm(self.algorithm, **self.algo)
            algo.validate(self.data.num_clients)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"algo: {e}") from None
        return self


def _positive(obj, *names):
    prefix = "data." if isinstance(obj, DataConfig) else ""
    for n in names:
        v = getattr(obj, n)
        if not v > 0:
            raise ConfigError(f"{prefix}{n} must be > 0, got {v}.")


def _suggest(key: str, choices) -> str:
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def _choice(key: str, value, choices):
    if value not in choices:
        raise ConfigError(f"{key}: unknown value {value!r}; choose one of {sorted(choices)}.{_suggest(str(value), choices)}")


# ------------------------------------------------------------------------------------------------ dict <-> dataclass


def _check_type(key: str, value, annotation):
    """Coerce/verify ``value`` against a field annotation; one-line error otherwise."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(key, value, a)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {value!r}.")
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation is str and isinstance(value, str):
        return value
    if annotation is dict and isinstance(value, dict):
        return value
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        return from_dict(annotation, value, prefix=f"{key}.")
    raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {value!r}.")


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def from_dict(cls, values: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a nested dict, refusing unknown keys and wrong types."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {values!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown key {prefix}{key!r}.{_suggest(key, fields)} Valid keys: {sorted(fields)}.")
        kwargs[key] = _check_type(prefix + key, value, hints[key])
    return cls(**kwargs)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'data.alpha=0.1'`` → (['data', 'alpha'], 0.1); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (for example data.alpha=0.1).")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply dotted ``key=value`` overrides to a nested dict (a copy)."""
    import copy

    out = copy.deepcopy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section.")
        node[path[-1]] = value
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None, base: dict | None = None
                ) -> ExperimentConfig:
    """Read a YAML file (optional), apply overrides, type-check and validate."""
    values = dict(base or {})
    if path is not None:
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path!r} does not exist.") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path!r} is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path!r} must hold a mapping of keys to values.")
        values.update(loaded)
    values = apply_overrides(values, overrides or [])
    return from_dict(ExperimentConfig, values).validate()
