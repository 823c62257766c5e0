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

from fljax.errors import ConfigError, OptionError  # noqa: F401 (re-exported)

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "ExperimentConfig", "from_dict", "to_dict", "load_config",
           "check_compare_algo",
           "apply_overrides", "parse_override", "hyperparameters", "algorithm_config"]


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
    seeds: int = 1  # run seeds seed, seed+1, ..., seed+seeds-1 (vectorised when shapes allow)
    checkpoint_every: int | None = None  # rounds between checkpoints; None: timed (see fljax.runner); 0: never

    def validate(self, check_algo: bool = True) -> "ExperimentConfig":
        """Refuse impossible values (types are checked by :func:`from_dict`). ``check_algo=False`` leaves ``algo``
        to be checked per algorithm (``fljax compare``: see :func:`check_compare_algo`)."""
        _positive(self, "rounds", "eval_every", "seeds")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}.")
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
        from fljax.models.model import MODELS, check_model_options

        _choice("algorithm", self.algorithm, ALGORITHMS)
        _choice("data.dataset", self.data.dataset, SOURCES)
        if self.data.partition is not None:
            _choice("data.partition", self.data.partition, PARTITIONERS)
        _choice("executor", self.executor, EXECUTORS)
        if self.model.name != "auto":
            _choice("model.name", self.model.name, MODELS)
            try:
                check_model_options(self.model.name, self.model.options)
            except ValueError as e:
                raise ConfigError(f"model.options: {e}") from None
        _choice("model.conv_impl", self.model.conv_impl, {"auto": 0, "native": 0, "patches": 0})
        if not check_algo:
            return self
        self.algo = hyperparameters(self.algorithm, self.algo)
        try:
            make_algorithm(self.algorithm, **self.algo).validate(self.data.num_clients)
        except OptionError as e:  # names its key: "lr must be > 0, ..." -> "algo.lr must be > 0, ..."
            raise e.within("algo") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"algo: {e}") from None
        return self

    @property
    def run_name(self) -> str:
        return self.name or self.algorithm


def hyperparameters(algorithm: str, values: dict) -> dict:
    """``values`` checked against the algorithm's hyperparameter fields: unknown names are refused with the
    closest valid one, values are checked against the field types (and lists become tuples where a tuple is
    expected, so the algorithm stays hashable)."""
    from fljax.algorithms.registry import get_algorithm, hyperparameter_fields

    cls = get_algorithm(algorithm)
    fields = hyperparameter_fields(cls)
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown key 'algo.{key}' for algorithm {algorithm!r}.{_suggest(key, fields)} "
                              f"Valid keys: {sorted(fields)}.")
        out[key] = _check_type(f"algo.{key}", value, hints.get(key, typing.Any))
    return out


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
    """Coerce/verify ``value`` against a field annotation; one-line error otherwise. Lists become tuples where a
    tuple is expected; annotations this function does not know (custom classes) accept any value."""
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
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(f"{key}: unknown value {value!r}; choose one of {list(choices)}."
                              f"{_suggest(str(value), [str(c) for c in choices])}")
        return value
    if (origin or annotation) in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}.")
        args = typing.get_args(annotation)
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, float]: one type per position
            if len(args) != len(value):
                raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}.")
            items = [_check_type(f"{key}[{i}]", v, a) for i, (a, v) in enumerate(zip(args, value))]
        else:
            item = args[0] if args else typing.Any
            items = [_check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
        return tuple(items) if (origin or annotation) is tuple else items
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation in (bool, str, dict) and isinstance(value, annotation):
        return value
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        return from_dict(annotation, value, prefix=f"{key}.")
    if annotation in (float, int, bool, str, dict) or dataclasses.is_dataclass(annotation):
        raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {value!r}.")
    return value


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
            raise ConfigError(f"unknown key {prefix + key!r}.{_suggest(key, fields)} Valid keys: {sorted(fields)}.")
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


def load_config(path: str | None = None, overrides: list[str] | None = None, base: dict | None = None,
                check_algo: bool = True) -> ExperimentConfig:
    """Read a YAML file (optional), apply overrides, type-check and validate (``check_algo``: see
    :meth:`ExperimentConfig.validate`)."""
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
    return from_dict(ExperimentConfig, values).validate(check_algo)


def check_compare_algo(cfg: ExperimentConfig, names: list[str]) -> None:
    """In a comparison ``cfg.algo`` applies to every algorithm that accepts its keys: refuse a key that none of
    ``names`` accepts, suggesting the closest valid one."""
    from fljax.algorithms import ALGORITHMS
    from fljax.algorithms.registry import hyperparameter_fields

    fields = set().union(*(hyperparameter_fields(ALGORITHMS[n]) for n in names if n in ALGORITHMS))
    for key in cfg.algo:
        if key not in fields:
            raise ConfigError(f"unknown key 'algo.{key}': none of the compared algorithms ({', '.join(names)}) has "
                              f"it.{_suggest(key, fields)}")


def algorithm_config(cfg: ExperimentConfig, name: str, hyper: dict | None = None) -> ExperimentConfig:
    """``cfg`` for algorithm ``name`` (as ``fljax compare`` runs it): the keys of ``cfg.algo`` that ``name``
    accepts, then ``hyper``; validated."""
    from fljax.algorithms.registry import get_algorithm, hyperparameter_fields

    accepted = hyperparameter_fields(get_algorithm(name))
    algo = {**{k: v for k, v in cfg.algo.items() if k in accepted}, **(hyper or {})}
    return dataclasses.replace(cfg, algorithm=name, algo=algo).validate()
