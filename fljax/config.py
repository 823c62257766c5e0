"""Experiment configuration as data: the typed sections, parsing from nested dicts and YAML, dotted overrides.

This module only *parses*: every key is checked against the section that declares it (its type, range and the
closest valid name for a misspelt one), in one line that names the key. The run settings are declared here, the
``data:`` keys by :class:`fljax.data.DataConfig` (and the data set and partitioner it names), ``model:``,
``server:`` and ``groups:`` by their sections below, ``privacy:`` and ``compression:`` by
:class:`fljax.privacy.PrivacyOptions` and :class:`fljax.privacy.CompressionOptions`, ``aggregator:``, ``attack:``
and ``participation:`` by the rule, attack or participation their ``name`` chooses (:mod:`fljax.aggregation`,
:mod:`fljax.participation`); the ``algo:`` mapping is kept as given. Turning a parsed config
into the objects it describes — the algorithm constructed and checked, the model's options checked against the
model, the population — is :func:`fljax.experiment.resolve`, the one composition root. :func:`load_config` reads
YAML (:mod:`fljax.yaml_io`: numbers as a person writes them, ``1e-3`` is a float); :func:`apply_overrides` applies
``key=value`` strings such as ``data.alpha=0.1``, ``algo.mu=0.01`` or ``rounds=50`` (values parsed the same way).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import unicodedata
from typing import Any, Callable, Collection, Literal, Mapping

import yaml

from fljax import yaml_io
from fljax.data.config import DataConfig
from fljax.errors import ConfigError, OptionError
from fljax.options import SEED_MAX, Options, at_least, between, greater_than, option, parse, seed_check, show
from fljax.aggregation import ATTACKS, RULES, Attack, Rule
from fljax.participation import PARTICIPATIONS, Participation
from fljax.privacy import CompressionOptions, PrivacyOptions

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "GroupConfig", "group_configs", "ServerConfig", "StopConfig",
           "ExperimentConfig", "from_dict", "to_dict", "load_config", "read_yaml", "apply_overrides",
           "parse_override", "nullable_sections"]

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


NAME_MAX_BYTES = 200  # a run name names a directory (with a date after it): file systems allow 255 bytes


@dataclasses.dataclass
class StopConfig(Options):
    """A stopping rule (:func:`fljax.engine.run_until`): stop at the first round s whose ``metric`` (at the state the
    round starts from) is ≤ tol, tol = min(``tol``, ``relative``·metric at round 0) (``relative: null``: tol as
    given), or when ``rounds`` rounds (or ``max_iters`` local iterations) are done. FedGiA's Table IV: ``{tol: 1e-7,
    metric: error}``."""

    tol: float = option(1e-7, "stop when the metric is <= tol (tol = min(tol, relative·its round-0 value))",
                        greater_than(0))
    metric: Literal["error", "grad_norm_sq", "train_loss"] = option(
        "error", "the round metric the rule reads: error (‖∇f(x)‖²/m², FedGiA's code), grad_norm_sq (‖∇f(x)‖², the "
                 "paper's (35)) or train_loss (f(x))")
    relative: float | None = option(0.1, "tol = min(tol, relative·metric at round 0) (null: tol as given)",
                                    greater_than(0))
    strict: bool = option(False, "stop when the metric is < tol instead of <=")
    max_iters: int | None = option(None, "also stop once this many local iterations (Σ k0) are done (null: rounds "
                                         "only)", between(1, INT32_MAX))
    record: list = dataclasses.field(default_factory=lambda: ["train_loss", "error", "grad_norm_sq"])

    RECORDABLE = ("train_loss", "error", "grad_norm_sq")  # the metrics a consensus-regression round reports at x

    def check(self) -> None:
        bad = [k for k in self.record if k not in self.RECORDABLE] if isinstance(self.record, list) else self.record
        if bad:
            raise OptionError("record", f"must be a list of {list(self.RECORDABLE)} (the metrics kept per round), "
                                        f"got {show(self.record)}.")


def _run_name(name: str) -> str | None:
    bad = [c for c in (os.sep, "\0") if c in name]
    if bad:
        return f"must not contain {bad[0]!r} (it names the run directory), got {show(name)}."
    hidden = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if hidden is not None:  # a newline splits the lines that name the run; U+202E reverses the text shown after it
        return (f"must not contain control or formatting characters ({ascii(hidden)}, "
                f"{unicodedata.name(hidden, 'a control character')}: it names the run directory, which listings "
                f"and messages would show split or reordered), got {ascii(name)}.")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > NAME_MAX_BYTES:
        return (f"must be at most {NAME_MAX_BYTES} bytes long (it names the run directory), got {size:,} bytes: "
                f"{show(name)}.")
    return None


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
    eval_clients: int | None = option(None, "evaluate on a fixed sample of this many clients, the same ids at every "
                                            "evaluation, seed and resume (null: every client, the papers' "
                                            "protocol); summaries are then over the sample",
                                      between(1, INT32_MAX))
    seed: int = option(0, "run seed: initialisation, cohorts, batches; also the data seed unless data.seed is set",
                       seed_check)
    executor: str = option("auto", "how the client axis runs: auto, vmap, chunked, sharded, loop")
    chunk_size: int | None = option(None, "clients per group for chunked", between(1, INT32_MAX))
    precision: Literal["fp32", "tf32", "bf16"] = option("tf32", "the model's compute: tf32 (the backend's default "
                                                        "float32 products), fp32 (exact), bf16 (bfloat16, float32 "
                                                        "master weights and aggregation)")
    memory_budget: float | None = option(None, "GiB of temporaries one compiled program may use (null: from the "
                                               "device's memory)", greater_than(0))
    state_store: Literal["device", "host", "disk"] = option(
        "device", "where every client's state is kept between blocks of rounds: device (the whole population's state "
                  "on the device), host (host memory) or disk (files in store_dir); with host or disk the device holds "
                  "only the clients a block samples, the results bit for bit the device's (docs/store.md)")
    store_dir: str | None = option(None, "where a disk store keeps its files (null: <run dir>/store; with a folder, "
                                         "each run's store in a subfolder of it)")
    name: str | None = option(None, "run name (default: the algorithm)", _run_name)
    seeds: int = option(1, "run seeds seed, seed+1, ..., seed+seeds-1 (vectorised when shapes allow)",
                        between(1, RUNS_MAX))
    checkpoint_every: int | None = option(None, "rounds between checkpoints (null: timed, see fljax.runner; "
                                                "0: never)", between(0, INT32_MAX))
    groups: list | None = option(None, "a heterogeneous population: client groups {name, size, model, algo} "
                                       "(null: every client runs the model and algo)")
    stop: StopConfig | None = option(None, "run each seed until a stopping rule fires, at most `rounds` rounds "
                                           "(consensus regression; null: exactly `rounds` rounds)")
    x64: bool | None = option(None, "compute in float64 (jax x64) for the run: null: for consensus-regression "
                                    "problems (FedGiA's data sets, as the paper), not for classification")
    diverge_factor: float | None = option(1e3, "stop a run whose train loss exceeds this many times max(its first "
                                               "round's loss, 1) (null: never)", greater_than(1))
    privacy: PrivacyOptions | None = option(None, "differential privacy of the clients or their examples "
                                                  "(docs/privacy.md; null: none)")
    compression: CompressionOptions | None = option(None, "compression of the clients' uploads (docs/privacy.md; "
                                                          "null: none)")
    aggregator: Rule | None = option(None, "how a centralized server reduces its cohort's uploads: {name: median}, "
                                           "{name: krum, f: 2}, … (docs/robust.md; null: the weighted mean)")
    attack: Attack | None = option(None, "malicious clients: {name: sign_flip, fraction: 0.2}, … (docs/robust.md; "
                                         "null: every client honest)")
    participation: Participation | None = option(None, "who takes part in a round: {name: poisson}, … "
                                                       "(docs/heterogeneity.md; null: uniform cohorts, Poisson ones "
                                                       "under client-level privacy)")

    def check(self) -> None:
        for key, cls in (("data", DataConfig), ("model", ModelConfig), ("server", ServerConfig),
                         ("privacy", PrivacyOptions), ("compression", CompressionOptions), ("aggregator", Rule),
                         ("attack", Attack), ("participation", Participation)):
            if getattr(self, key) is None and key in nullable_sections():
                continue
            if not isinstance(getattr(self, key), cls):
                raise OptionError(key, f"must be a {cls.__name__} (from_dict builds one from a mapping), got "
                                       f"{show(getattr(self, key))}.")
        if self.eval_clients is not None and self.eval_clients > self.data.num_clients:
            raise OptionError("eval_clients", f"must be at most data.num_clients={self.data.num_clients} (the "
                                              f"clients it samples; null: every client), got {self.eval_clients}.")
        if self.seed + self.seeds - 1 > SEED_MAX:
            raise OptionError("seeds", f"must be at most {SEED_MAX - self.seed + 1} from seed {self.seed} (seeds go "
                                       f"up to {SEED_MAX}), got {self.seeds}.")

    @property
    def run_name(self) -> str:
        return self.name or self.algorithm


# ------------------------------------------------------------------------------------------------ dict <-> dataclass


def from_dict(cls, values: Mapping) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` (``cls``) from a nested dict, refusing unknown keys, wrong types and
    impossible values."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {show(values)}.")
    sections = {"data": DataConfig.from_dict, "model": lambda v: parse(ModelConfig, v),
                "server": lambda v: parse(ServerConfig, v), "privacy": _privacy_section,
                "compression": lambda v: parse(CompressionOptions, v), "stop": lambda v: parse(StopConfig, v),
                "aggregator": lambda v: RULES.parse(v, "mean"), "attack": lambda v: ATTACKS.parse(v),
                "participation": lambda v: PARTICIPATIONS.parse(v, "uniform")}
    kwargs = {}
    for key, value in values.items():
        if key in sections and not (value is None and key in nullable_sections()):  # null: none
            if not isinstance(value, Mapping):
                raise OptionError(key, f"must be a mapping of keys to values, got {show(value)}.")
            try:
                value = sections[key](value)
            except OptionError as e:
                raise e.within(key) from None
        kwargs[key] = value
    top = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in kwargs:
        if key not in top and (section := _section_of(str(key))):
            raise OptionError(str(key), f"is not a top-level key; did you mean {section}.{key}? (--set "
                                        f"{section}.{key}=..., or under {section}: in a config file)")
    return parse(cls, kwargs)




def _privacy_section(values: Mapping) -> PrivacyOptions:
    """The ``privacy:`` section; its former ``sampling`` and ``capacity`` keys are refused with where they moved."""
    for key, moved in (("sampling", "participation.name (poisson or uniform)"),
                       ("capacity", "participation.capacity (with participation.name: poisson)")):
        if key in values:
            raise OptionError(key, f"moved to {moved}: the participation draws the cohorts, and the accountant asks "
                                   f"it for its sampling (docs/privacy.md).")
    return parse(PrivacyOptions, values)


# Sections whose keys a registry declares, by name → the names it declares now, for the hint on such a key given at
# the top level (``lr`` → ``algo.lr``). Parsing imports no registry: the layer that holds them fills this in
# (fljax.experiment: "algo", the registered algorithms' hyperparameters, fljax.algorithms.registry.option_names).
KEY_HINTS: dict[str, Callable[[], Collection[str]]] = {}


def _section_of(key: str) -> str | None:
    """The section that has option ``key`` (``lr`` → ``algo``: a hyperparameter of a registered algorithm,
    :data:`KEY_HINTS`; ``num_clients`` → ``data``), for the message on a section key given at the top level."""
    sections = {**{name: keys() for name, keys in KEY_HINTS.items()},
                "data": {f.name for f in dataclasses.fields(DataConfig) if f.init},
                "model": {f.name for f in dataclasses.fields(ModelConfig) if f.init},
                "server": {f.name for f in dataclasses.fields(ServerConfig) if f.init}}
    return next((name for name, keys in sections.items() if key in keys), None)


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


@functools.cache
def nullable_sections() -> frozenset[str]:
    """The top-level keys of :class:`ExperimentConfig` that are sections which may be null (none): the fields typed
    ``<an Options section> | None`` (``privacy``, ``compression``, ``stop``, …). A saved ``config.yaml`` writes such
    a section as ``null``; an override of one of its keys starts it from empty (:func:`apply_overrides`)."""
    import typing

    hints = typing.get_type_hints(ExperimentConfig)
    return frozenset(f.name for f in dataclasses.fields(ExperimentConfig)
                     if type(None) in typing.get_args(hints[f.name])
                     and any(isinstance(a, type) and issubclass(a, Options) for a in typing.get_args(hints[f.name])))


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply dotted ``key=value`` overrides to a nested dict (a copy). A section that may be null
    (:func:`nullable_sections`) and is null is an empty section to an override of one of its keys:
    ``--set privacy.noise_multiplier=1`` over ``privacy: null`` gives ``privacy: {noise_multiplier: 1}``."""
    out = copy.deepcopy(values)
    nullable = nullable_sections()
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for depth, part in enumerate(path[:-1]):
            if depth == 0 and part in nullable and node.get(part) is None:
                node[part] = {}
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {show(text)}: {part!r} is not a section.")
        node[path[-1]] = value
    return out


def read_yaml(path: str) -> dict:
    """The mapping a YAML file holds (an empty file: {}), every problem refused in one line naming the file."""
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


def load_config(path: str | None = None, overrides: list[str] | None = None,
                base: dict | None = None) -> ExperimentConfig:
    """The parsed config of a YAML file (optional) over ``base`` (a nested dict), with ``overrides`` applied
    (``["algo.lr=0.05"]``). Parsing only: :func:`fljax.experiment.resolve` checks it against the registries and
    builds what it describes."""
    return from_dict(ExperimentConfig, config_values(path, overrides, base))


def config_values(path: str | None = None, overrides: list[str] | None = None, base: dict | None = None) -> dict:
    """The values :func:`load_config` parses: the YAML file over ``base`` with ``overrides`` applied."""
    values = dict(base or {})
    if path is not None:
        values.update(read_yaml(path))
    return apply_overrides(values, overrides or [])
