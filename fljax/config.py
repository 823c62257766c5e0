"""Typed experiment configuration: dataclasses, parsing from nested dicts/YAML, dotted overrides, validation.

Every wrong input is refused before anything runs, in one line that names the key and, for a misspelt key,
suggests the closest valid name. The keys are declared where they are used: the run settings here, the ``data:``
keys by :class:`fljax.data.DataConfig` and the data sets and partitioners it names, ``model.options`` by the model's
module, ``algo`` by the algorithm's dataclass; each raises :class:`fljax.errors.OptionError` naming its key, and
this module adds the section (``data.``, ``model.options.``, ``algo.``). :func:`load_config` reads YAML
(:mod:`fljax.yaml_io`: numbers as a person writes them, ``1e-3`` is a float); :func:`apply_overrides` applies
``key=value`` strings such as ``data.alpha=0.1``, ``algo.mu=0.01`` or ``rounds=50`` (values parsed the same way).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
import typing
from typing import Any, Literal, Mapping

import yaml

from fljax import yaml_io
from fljax.data.config import DataConfig
from fljax.errors import ConfigError, OptionError
from fljax.options import (SEED_MAX, Options, at_least, between, check_value, greater_than, option, parse,
                           seed_check, show, suggest)

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "GroupConfig", "group_configs", "ServerConfig",
           "ExperimentConfig", "from_dict", "to_dict", "load_config",
           "check_compare_algo", "apply_overrides", "parse_override", "hyperparameters", "algorithm_config",
           "resolved", "preset"]

INT32_MAX = 2 ** 31 - 1  # the engine counts rounds in int32
RUNS_MAX = 10_000  # the most runs (seeds × points) one command starts: each has its own directory and open lock


@dataclasses.dataclass
class ModelConfig(Options):
    """``name``: 'auto' (logreg for vectors, cnn1 for images) or a name from ``fljax list``; ``options`` go to the
    module (e.g. ``{hidden: [128, 128]}`` for mlp, ``{groups: 32, head_bias: true}`` for resnet18_gn)."""

    name: str = option("auto", "a model from `fljax list` (auto: logreg for vectors, cnn1 for images)")
    options: dict = dataclasses.field(default_factory=dict)
    conv_impl: Literal["auto", "native", "patches", "shifts"] = option("auto", "how convolutions run")


@dataclasses.dataclass
class GroupConfig(Options):
    """One client group of a heterogeneous population (:mod:`fljax.engine.population`): ``size`` consecutive
    clients that run ``model`` (``{name, options}``; empty: the experiment's model) with the algorithm's
    hyperparameters overridden by ``algo`` (e.g. ``{bits: null, lam_p: 0.15}``)."""

    name: str = option("group", "the group's name (distinct within the population)")
    size: int = option(1, "clients in the group (the groups' sizes add up to data.num_clients)", at_least(1))
    model: dict = dataclasses.field(default_factory=dict)
    algo: dict = dataclasses.field(default_factory=dict)


def group_configs(cfg: "ExperimentConfig") -> list[GroupConfig]:
    """The parsed ``groups`` of a config (empty when it has none)."""
    out = []
    for i, g in enumerate(cfg.groups or ()):
        if not isinstance(g, Mapping):
            raise OptionError(f"groups[{i}]", f"must be a mapping (name, size, model, algo), got {show(g)}.")
        try:
            out.append(parse(GroupConfig, g))
        except OptionError as e:
            raise e.within(f"groups[{i}]") from None
    return out


@dataclasses.dataclass
class ServerConfig(Options):
    """What the server holds besides the data split's server set: a pretrained model made by the project itself
    (``pretrained``: a model name, or 'same' for the run's own architecture; trained centrally with Adam on the
    server set, cached and reused, :mod:`fljax.runner.pretrained`)."""

    pretrained: str | None = option(None, "the server's pretrained model: a model from `fljax list`, 'same' (the "
                                          "run's model), or null (none); needs a split with a server set")
    pretrained_options: dict = dataclasses.field(default_factory=dict)
    epochs: int = option(60, "pretraining epochs over the server set", at_least(1))
    lr: float = option(1e-3, "pretraining Adam learning rate", greater_than(0))
    batch_size: int = option(128, "pretraining minibatch size", at_least(1))
    seed: int = option(0, "pretraining seed (initialisation and shuffling)", seed_check)
    cache_dir: str | None = option(None, "where pretrained models are kept (null: $FLJAX_CACHE, else "
                                         "~/.cache/fljax)")
    pretrain_data: str | None = option(None, "pretrain on this pooled image data set instead of the server's set "
                                             "(its classes must be the server's; resized to the clients' input "
                                             "shape), e.g. mnist5k for digits clients; null: the server's set")
    pretrain_data_options: dict = dataclasses.field(default_factory=dict)


def _run_name(name: str) -> str | None:
    bad = [c for c in (os.sep, "\0") if c in name]
    return f"must not contain {bad[0]!r} (it names the run directory), got {show(name)}." if bad else None


@dataclasses.dataclass
class ExperimentConfig(Options):
    """One experiment: an algorithm with its hyperparameters (``algo``), data, model and run settings."""

    algorithm: str = option("fedavg", "an algorithm from `fljax list`")
    algo: dict = dataclasses.field(default_factory=dict)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    rounds: int = option(100, "communication rounds", between(1, INT32_MAX))
    eval_every: int = option(10, "evaluate every k rounds (and after the last one)", between(1, INT32_MAX))
    seed: int = option(0, "run seed: initialisation, cohorts, batches; also the data seed unless data.seed is set",
                       seed_check)
    executor: str = option("auto", "how the client axis runs: auto, vmap, chunked, sharded, loop")
    chunk_size: int | None = option(None, "clients per group for chunked", between(1, INT32_MAX))
    precision: Literal["fp32", "tf32", "bf16"] = option("tf32", "the model's compute: tf32 (the backend's default "
                                                        "float32 products), fp32 (exact), bf16 (bfloat16, float32 "
                                                        "master weights and aggregation)")
    memory_budget: float | None = option(None, "GiB of temporaries one compiled program may use (null: from the "
                                               "device's memory)", greater_than(0))
    name: str | None = option(None, "run name (default: the algorithm)", _run_name)
    seeds: int = option(1, "run seeds seed, seed+1, ..., seed+seeds-1 (vectorised when shapes allow)",
                        between(1, RUNS_MAX))
    checkpoint_every: int | None = option(None, "rounds between checkpoints (null: timed, see fljax.runner; "
                                                "0: never)", between(0, INT32_MAX))
    groups: list | None = option(None, "a heterogeneous population: client groups {name, size, model, algo} "
                                       "(null: every client runs the model and algo)")
    diverge_factor: float | None = option(1e3, "stop a run whose train loss exceeds this many times max(its first "
                                               "round's loss, 1) (null: never)", greater_than(1))

    def check(self) -> None:
        for key, cls in (("data", DataConfig), ("model", ModelConfig), ("server", ServerConfig)):
            if not isinstance(getattr(self, key), cls):
                raise OptionError(key, f"must be a {cls.__name__} (from_dict builds one from a mapping), got "
                                       f"{show(getattr(self, key))}.")
        if self.seed + self.seeds - 1 > SEED_MAX:
            raise OptionError("seeds", f"must be at most {SEED_MAX - self.seed + 1} from seed {self.seed} (seeds go "
                                       f"up to {SEED_MAX}), got {self.seeds}.")

    def validate(self, check_algo: bool = True) -> "ExperimentConfig":
        """Check the names against the registries, the model options against the model and, with ``check_algo``,
        the hyperparameters against the algorithm (``False`` leaves ``algo`` to be checked per algorithm, as
        ``fljax compare`` does: see :func:`check_compare_algo`). Types and ranges are checked on construction."""
        from fljax.algorithms import ALGORITHMS, make_algorithm
        from fljax.engine.executors import EXECUTORS

        _choice("algorithm", self.algorithm, ALGORITHMS)
        _check_problem(self.algorithm, ALGORITHMS[self.algorithm])
        _choice("executor", self.executor, EXECUTORS)
        _check_model(self.model, self.data.source.input_shape)
        _check_server(self.server, self.data.source.input_shape)
        if not check_algo:
            return self
        self.algo = hyperparameters(self.algorithm, self.algo)
        try:
            make_algorithm(self.algorithm, **self.algo).validate(self.data.num_clients)
        except OptionError as e:  # names its key: "lr must be > 0, ..." -> "algo.lr must be > 0, ..."
            raise e.within("algo") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"algo: {e}") from None
        self._check_groups()
        return self

    def _check_groups(self) -> None:
        from fljax.algorithms import make_algorithm

        groups = group_configs(self)
        if not groups:
            return
        total = sum(g.size for g in groups)
        if total != self.data.num_clients:
            raise OptionError("groups", f"sizes must add up to data.num_clients={self.data.num_clients}, got {total}.")
        names = [g.name for g in groups]
        if len(set(names)) < len(names):
            raise OptionError("groups", f"names must be distinct, got {names}.")
        for i, g in enumerate(groups):
            if g.model:
                try:
                    _check_model(parse(ModelConfig, g.model), self.data.source.input_shape)
                except OptionError as e:  # already names model.…
                    raise e.within(f"groups[{i}]") from None
            try:
                hp = hyperparameters(self.algorithm, g.algo)
            except OptionError as e:
                raise e.within(f"groups[{i}]") from None
            try:
                make_algorithm(self.algorithm, **{**self.algo, **hp}).validate(self.data.num_clients)
            except OptionError as e:
                raise e.within(f"groups[{i}].algo") from None

    @property
    def run_name(self) -> str:
        return self.name or self.algorithm


def _check_problem(name: str, cls) -> None:
    """Refuse an algorithm that solves another kind of problem than the classification an experiment describes."""
    if cls.problem != "classification":
        raise ConfigError(f"algorithm {name!r} solves {cls.problem} problems, which an experiment config cannot "
                          f"describe yet; run it with `fljax reproduce fedgia` or from Python (docs/fedgia.md).")


def _check_model(model: ModelConfig, input_shape: tuple) -> None:
    from fljax.models.model import MODELS, auto_model, check_model_input, check_model_options

    if model.name != "auto":
        _choice("model.name", model.name, MODELS)
    name = auto_model(input_shape) if model.name == "auto" else model.name
    try:
        check_model_options(name, model.options, " (picked by model.name: auto; set model.name to choose another)"
                            if model.name == "auto" else "")
    except OptionError as e:
        raise e.within("model.options") from None
    try:
        check_model_input(name, input_shape)
    except OptionError as e:
        raise e.within("model") from None


def _check_server(server: ServerConfig, input_shape: tuple) -> None:
    from fljax.models.model import MODELS, check_model_input, check_model_options

    if server.pretrained is None:
        for key in ("pretrained_options", "pretrain_data"):
            if getattr(server, key):
                raise OptionError(f"server.{key}", "needs server.pretrained (a model name or 'same').")
        return
    if server.pretrain_data_options and server.pretrain_data is None:
        raise OptionError("server.pretrain_data_options", "needs server.pretrain_data (a data set name).")
    if server.pretrain_data is not None:
        from fljax.data.sources import SOURCES

        _choice("server.pretrain_data", server.pretrain_data, [n for n, s in SOURCES.items()
                                                               if not s.natural and len(s.input_shape) == 3])
    if server.pretrained == "same":
        if server.pretrained_options:
            raise OptionError("server.pretrained_options", "must be empty with pretrained: same (the run's model "
                                                           "options apply).")
        return
    _choice("server.pretrained", server.pretrained, [*MODELS, "same"])
    try:
        check_model_options(server.pretrained, server.pretrained_options)
        check_model_input(server.pretrained, input_shape)
    except OptionError as e:
        raise e.within("server.pretrained_options") from None


def hyperparameters(algorithm: str, values: dict) -> dict:
    """``values`` checked against the algorithm's hyperparameter fields: unknown names are refused with the
    closest valid one, values are checked against the field types (and lists become tuples where a tuple is
    expected, so the algorithm stays hashable)."""
    from fljax.algorithms.registry import get_algorithm, hyperparameter_fields

    cls = get_algorithm(algorithm)
    fields = hyperparameter_fields(cls)
    hints = typing.get_type_hints(cls)
    try:
        for key in values:
            if key not in fields:
                raise OptionError(str(key), f"is not a valid key for algorithm {algorithm!r}."
                                            f"{suggest(str(key), fields)} Valid keys: {sorted(fields)}.")
        return {key: check_value(key, value, hints.get(key, Any)) for key, value in values.items()}
    except OptionError as e:
        raise e.within("algo") from None


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {sorted(choices)}, got {show(value)}.{suggest(str(value), choices)}")


# ------------------------------------------------------------------------------------------------ dict <-> dataclass


def from_dict(cls, values: Mapping) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` (``cls``) from a nested dict, refusing unknown keys, wrong types and
    impossible values."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {show(values)}.")
    sections = {"data": DataConfig.from_dict, "model": lambda v: parse(ModelConfig, v),
                "server": lambda v: parse(ServerConfig, v)}
    kwargs = {}
    for key, value in values.items():
        if key in sections:
            if not isinstance(value, Mapping):
                raise OptionError(key, f"must be a mapping of keys to values, got {show(value)}.")
            try:
                value = sections[key](value)
            except OptionError as e:
                raise e.within(key) from None
        kwargs[key] = value
    return parse(cls, kwargs)


def to_dict(cfg) -> dict:
    """The plain nested dict of a config (or of its ``data`` section), as ``config.yaml`` holds it."""
    if isinstance(cfg, Options):
        return {k: to_dict(v) for k, v in cfg.to_dict().items()}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return copy.deepcopy(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'data.alpha=0.1'`` → (['data', 'alpha'], 0.1); the value is parsed as YAML (text that is not valid YAML
    is taken as a string)."""
    if "=" not in text:
        raise ConfigError(f"override {show(text)} must look like key=value (for example data.alpha=0.1).")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {show(text)}: {show(key.strip())} is not a dotted key name (for example "
                          f"data.alpha=0.1).")
    try:
        value = yaml_io.load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except ConfigError as e:
        raise ConfigError(f"override {show(text)}: {e}") from None
    return path, value


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply dotted ``key=value`` overrides to a nested dict (a copy)."""
    out = copy.deepcopy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {show(text)}: {part!r} is not a section.")
        node[path[-1]] = value
    return out


def _read_yaml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            loaded = yaml_io.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist.") from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e.strerror or e}.") from None
    except ConfigError as e:
        raise ConfigError(f"config file {path!r}: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {path!r} is not valid YAML: {problem}{line}.") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values, got {show(loaded)}.")
    return loaded


def load_config(path: str | None = None, overrides: list[str] | None = None, base: dict | None = None,
                check_algo: bool = True) -> ExperimentConfig:
    """Read a YAML file (optional), apply overrides, type-check and validate (``check_algo``: see
    :meth:`ExperimentConfig.validate`)."""
    values = dict(base or {})
    if path is not None:
        values.update(_read_yaml(path))
    values = apply_overrides(values, overrides or [])
    return from_dict(ExperimentConfig, values).validate(check_algo)


def preset(path: str, overrides: list[str] | None = None, algorithm_keys: bool = True) -> dict:
    """The values of preset file ``path`` (like ``fljax compare``'s quick start) for the experiment that
    ``overrides`` describe. A preset key yields to the user's choice of the component that owns it: another
    ``data.dataset`` keeps only the preset's ``num_clients`` of its data section, another ``data.partition``
    drops the preset partitioner's options, another ``model.name`` the preset's model options, an
    ``algo.local_steps`` the preset's ``local_epochs`` (which would win over it); with
    ``algorithm_keys`` the ``algo`` keys the chosen algorithm does not take are left out. Pass the result to
    :func:`load_config` as ``base``."""
    from fljax.algorithms import ALGORITHMS
    from fljax.algorithms.registry import hyperparameter_fields
    from fljax.data import PARTITIONERS

    values = _read_yaml(path)
    user = apply_overrides({}, overrides or [])
    changed = lambda section, key: (isinstance(user.get(section), dict) and key in user[section]  # noqa: E731
                                    and user[section][key] != values.get(section, {}).get(key))
    data, model = values.get("data", {}), values.get("model", {})
    if changed("data", "dataset"):
        values["data"] = {k: v for k, v in data.items() if k == "num_clients"}
    elif changed("data", "partition") and data.get("partition") in PARTITIONERS:
        owned = {f.name for f in dataclasses.fields(PARTITIONERS[data["partition"]].options)}
        values["data"] = {k: v for k, v in data.items() if k not in owned}
    if changed("model", "name"):
        values["model"] = {k: v for k, v in model.items() if k != "options"}
    if changed("algo", "local_steps") and isinstance(values.get("algo"), dict):  # local_epochs would win over it
        values["algo"] = {k: v for k, v in values["algo"].items() if k != "local_epochs"}
    name = {**values, **user}.get("algorithm", ExperimentConfig.algorithm)
    if algorithm_keys and isinstance(name, str) and name in ALGORITHMS and isinstance(values.get("algo"), dict):
        accepted = hyperparameter_fields(ALGORITHMS[name])
        values["algo"] = {k: v for k, v in values["algo"].items() if k in accepted}
        while values["algo"]:  # a preset key the algorithm refuses (QuPeD counts local_steps) yields too
            try:
                ALGORITHMS[name](**values["algo"]).validate(values.get("data", {}).get("num_clients", 100))
                break
            except OptionError as e:  # the preset keys the refusal names
                named = [k for k in values["algo"] if k == e.key or k in str(e)]
                if not named:
                    break
                values["algo"] = {k: v for k, v in values["algo"].items() if k not in named}
            except (TypeError, ValueError):
                break
    return values


def check_compare_algo(cfg: ExperimentConfig, names: list[str]) -> None:
    """In a comparison ``cfg.algo`` applies to every algorithm that accepts its keys: refuse an empty list of
    algorithms, and a key that none of ``names`` accepts, suggesting the closest valid one."""
    from fljax.algorithms import ALGORITHMS
    from fljax.algorithms.registry import hyperparameter_fields

    if not names:
        raise ConfigError("no algorithm to compare; name at least one (e.g. fljax compare --algorithms "
                          "fedavg,fedprox).")
    fields = set().union(*(hyperparameter_fields(ALGORITHMS[n]) for n in names if n in ALGORITHMS))
    for key in cfg.algo:
        if key not in fields:
            raise ConfigError(f"algo.{key} is not a valid key for any of the compared algorithms "
                              f"({', '.join(names)}).{suggest(str(key), fields)}")


def algorithm_config(cfg: ExperimentConfig, name: str, hyper: dict | None = None) -> ExperimentConfig:
    """``cfg`` for algorithm ``name`` (as ``fljax compare`` runs it): the keys of ``cfg.algo`` that ``name``
    accepts, then ``hyper``; validated. A shared key the algorithm refuses in combination (QuPeD counts
    ``local_steps`` and refuses the shared ``local_epochs``) yields to the algorithm's own default, like a key it
    does not have; ``hyper`` (the algorithm's own settings) is never dropped."""
    from fljax.algorithms.registry import get_algorithm, hyperparameter_fields

    accepted = hyperparameter_fields(get_algorithm(name))
    shared = {k: v for k, v in cfg.algo.items() if k in accepted and k not in (hyper or {})}
    while True:
        try:
            return dataclasses.replace(cfg, algorithm=name, algo={**shared, **(hyper or {})}).validate()
        except OptionError as e:
            named = [k for k in shared if e.key in (k, f"algo.{k}") or re.search(rf"\b{k}\b", str(e))]
            if not named:
                raise
            shared = {k: v for k, v in shared.items() if k not in named}


def resolved(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with every default made explicit, as a run directory's ``config.yaml`` records it: all of the
    algorithm's hyperparameters (its defaults filled in), ``model.name: auto`` replaced by the model it picks and
    the model's options completed with their defaults. Loading it back runs the same experiment."""
    from fljax.algorithms import make_algorithm
    from fljax.models.model import auto_model, model_options

    algorithm = make_algorithm(cfg.algorithm, **cfg.algo)
    algo = {f.name: getattr(algorithm, f.name) for f in dataclasses.fields(algorithm)}
    name = auto_model(cfg.data.source.input_shape) if cfg.model.name == "auto" else cfg.model.name
    options = {f.name: cfg.model.options.get(f.name, _default(f)) for f in model_options(name)}
    model = dataclasses.replace(cfg.model, name=name, options=options)
    return dataclasses.replace(cfg, algo=algo, model=model)


def _default(field: dataclasses.Field):
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
