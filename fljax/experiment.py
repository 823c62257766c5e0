"""The composition root: a parsed config resolved, once, into the :class:`Experiment` it describes.

Data flows one way: :mod:`fljax.config` parses (YAML, overrides, typed sections); :func:`resolve` checks the parsed
config against the registries and builds what it names, once — the algorithm constructed (every hyperparameter
checked by its declaration) and validated against the population, the model's name resolved and its options
checked, the server's section checked, the client groups with their own hyperparameters — into a frozen
:class:`Experiment`. Every layer above consumes Experiments and never re-validates or rebuilds them: the runner
(:mod:`fljax.runner`) loads their data (:func:`load_data`) and builds their simulations (:func:`build`); the API
(:mod:`fljax.api`) and the command line (:mod:`fljax.cli`) are facades that parse, resolve and hand over to it.

A comparison runs several algorithms on one config: :func:`compare_points` gives each algorithm the config's shared
``algo`` keys that it *declares* (read from its declarations, :func:`fljax.algorithms.registry.hyperparameter_fields`;
no error message is parsed), then its own hyperparameters. The quick-start :func:`preset` yields its keys the same
way.

Every refusal is one line naming the key (``algo.lr must be > 0, got -0.1.``), raised before anything is loaded,
built or written.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fljax.algorithms import ALGORITHMS
from fljax.algorithms.base import Algorithm
from fljax.algorithms.registry import check_model_support, get_algorithm, hyperparameter_fields, make_algorithm
from fljax.config import (ConfigError, ExperimentConfig, GroupConfig, ModelConfig, ServerConfig, apply_overrides,
                          group_configs, read_yaml)
from fljax.errors import OptionError
from fljax.options import field_default, parse, show, suggest

if TYPE_CHECKING:
    from fljax.data import FederatedData
    from fljax.engine import Simulation

__all__ = ["Experiment", "Group", "resolve", "load_data", "build", "build_model", "compare_points", "label",
           "preset"]


@dataclasses.dataclass(frozen=True)
class Group:
    """One client group of a population: ``size`` consecutive clients running ``model`` (None: the experiment's)
    with the algorithm's hyperparameters overridden by ``hp`` (checked values)."""

    name: str
    size: int
    model: ModelConfig | None
    hp: dict


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What one experiment is made of, built once from a config by :func:`resolve`.

    * ``config``: the parsed config (its ``algo`` values as the algorithm holds them); what ``config.yaml``
      records and the run settings (rounds, seeds, evaluation, executor) are read from;
    * ``algorithm``: the algorithm object, constructed and validated once; every simulation of the experiment runs
      this object (traced hyperparameters of a sweep are its fields replaced inside the compiled program);
    * ``model``: the model section with ``name: auto`` resolved to the model it picks;
    * ``groups``: the client population (empty: every client runs ``model`` with ``algorithm``).
    """

    config: ExperimentConfig
    algorithm: Algorithm
    model: ModelConfig
    groups: tuple[Group, ...] = ()

    @property
    def name(self) -> str:
        return self.config.run_name

    @property
    def seed(self) -> int:
        return self.config.seed

    def with_seed(self, seed: int) -> "Experiment":
        """The same experiment for one run seed (``seeds: 1``); nothing is rebuilt."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, seed=seed, seeds=1))

    def resolved(self) -> ExperimentConfig:
        """The config with every default made explicit, as a run directory's ``resolved.yaml`` records it: all of
        the algorithm's hyperparameters, the model that ``auto`` picked with its options completed with their
        defaults. Loading it back resolves to the same experiment."""
        from fljax.models.model import model_options

        options = {f.name: self.model.options.get(f.name, field_default(f))
                   for f in model_options(self.model.name)}
        return dataclasses.replace(self.config, algo=self.algorithm.hyperparameters(),
                                   model=dataclasses.replace(self.model, options=options))


# ------------------------------------------------------------------------------------------------------ resolve


def resolve(cfg: ExperimentConfig) -> Experiment:
    """The :class:`Experiment` of a parsed config: the names checked against the registries (algorithm, executor,
    model, server), the model options against the model, the algorithm constructed from ``cfg.algo`` (unknown keys
    refused with the closest valid one, every value by its declaration) and validated for ``data.num_clients``,
    then the client groups. Raises :class:`~fljax.errors.ConfigError` (one line naming the key)."""
    from fljax.engine.executors import EXECUTORS

    if not isinstance(cfg, ExperimentConfig):
        raise ConfigError(f"resolve takes an ExperimentConfig (fljax.config.load_config or from_dict parse one), got "
                          f"{show(cfg)}.")
    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    cls = ALGORITHMS[cfg.algorithm]
    if cls.problem != "classification":
        raise ConfigError(f"algorithm {cfg.algorithm!r} solves {cls.problem} problems, which an experiment config "
                          f"cannot describe yet; run it with `fljax reproduce fedgia` or from Python "
                          f"(docs/fedgia.md).")
    _choice("executor", cfg.executor, EXECUTORS)
    input_shape = cfg.data.source.input_shape
    model = _resolve_model(cfg.model, input_shape)
    _check_server(cfg.server, input_shape)
    algorithm = _construct(cls, cfg.algo, cfg.data.num_clients, "algo")
    groups = _groups(cfg, algorithm, input_shape)
    config = dataclasses.replace(cfg, algo={k: getattr(algorithm, k) for k in cfg.algo})
    return Experiment(config, algorithm, model, groups)


def _construct(cls: type[Algorithm], values: dict, num_clients: int, section: str) -> Algorithm:
    """``cls(**values)`` validated for ``num_clients``, every error naming ``section.key``."""
    try:
        algorithm = make_algorithm(cls.name, **values)
        algorithm.validate(num_clients)
    except OptionError as e:  # names its key: "lr must be > 0, ..." -> "algo.lr must be > 0, ..."
        raise e.within(section) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{section}: {e}") from None
    return algorithm


def _groups(cfg: ExperimentConfig, algorithm: Algorithm, input_shape: tuple) -> tuple[Group, ...]:
    groups: list[GroupConfig] = group_configs(cfg)
    if not groups:
        return ()
    total = sum(g.size for g in groups)
    if total != cfg.data.num_clients:
        raise OptionError("groups", f"sizes must add up to data.num_clients={cfg.data.num_clients}, got {total}.")
    names = [g.name for g in groups]
    if len(set(names)) < len(names):
        raise OptionError("groups", f"names must be distinct, got {names}.")
    out = []
    for i, g in enumerate(groups):
        model = None
        if g.model:
            try:
                section = parse(ModelConfig, g.model)
            except OptionError as e:  # names the key of the model section: name, options, …
                raise e.within(f"groups[{i}].model") from None
            try:
                model = _resolve_model(section, input_shape)
            except OptionError as e:  # already names model.…
                raise e.within(f"groups[{i}]") from None
        hp = {**cfg.algo, **g.algo}
        own = _construct(type(algorithm), hp, cfg.data.num_clients, f"groups[{i}].algo")
        out.append(Group(g.name, g.size, model, {k: getattr(own, k) for k in g.algo}))
    return tuple(out)


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise OptionError(key, f"must be one of {sorted(choices)}, got {show(value)}.{suggest(str(value), choices)}")


def _resolve_model(model: ModelConfig, input_shape: tuple) -> ModelConfig:
    """The model section checked against the model it names (``auto``: logreg for vectors, cnn1 for images), with
    that name in place of ``auto``; the options stay as given."""
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
    return dataclasses.replace(model, name=name)


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


# ------------------------------------------------------------------------------------------------------ build


def build_model(model: ModelConfig, data: "FederatedData"):
    """The :class:`~fljax.models.Model` a resolved model section names, for ``data``'s inputs and classes."""
    from fljax.models import make_model

    return make_model(model.name, data.input_shape, data.num_classes, **model.options)


def load_data(exp: Experiment, seed: int | None = None) -> "FederatedData":
    """The clients' federated data set of ``exp`` for run seed ``seed`` (default: the experiment's; ``data.seed``,
    when set, draws the split instead). The server's pretrained model (``server.pretrained``) is a trained and cached
    artifact: the runner attaches it (:func:`fljax.runner.pretrained.with_server_model`)."""
    from fljax.data import load_federated

    cfg = exp.config
    try:
        return load_federated(cfg.data, cfg.seed if seed is None else seed)
    except OptionError as e:
        raise e.within("data") from None


def build(exp: Experiment, data: "FederatedData", module=None) -> "Simulation":
    """The :class:`~fljax.engine.Simulation` of ``exp`` on ``data`` (``module``: a Flax module of the user's own,
    used instead of the experiment's model). The simulation runs ``exp.algorithm`` itself."""
    from fljax.engine import Simulation
    from fljax.engine.population import ClientGroup
    from fljax.models.model import own_model

    cfg = exp.config
    model = own_model(module, data.input_shape, data.num_classes) if module is not None else build_model(exp.model,
                                                                                                          data)
    groups = [ClientGroup(g.name, g.size, build_model(g.model, data) if g.model is not None else None, g.hp)
              for g in exp.groups] or None
    check_model_support(cfg.algorithm, model, groups=groups is not None)
    return Simulation(exp.algorithm, data, model, executor=cfg.executor, chunk_size=cfg.chunk_size, seed=cfg.seed,
                      conv_impl=cfg.model.conv_impl, groups=groups, precision=cfg.precision,
                      memory_budget=cfg.memory_budget)


# ------------------------------------------------------------------------------------------------------ compare


def label(name: str, hyper: dict | None = None) -> str:
    """``fedprox(mu=0.1)``: an algorithm with its own hyperparameters, as tables, plots and run directories name
    it."""
    return name if not hyper else f"{name}({', '.join(f'{k}={v}' for k, v in hyper.items())})"


def compare_points(cfg: ExperimentConfig, algorithms: list[str | tuple[str, dict]]
                   ) -> list[tuple[str, Experiment, str, dict]]:
    """The points of a comparison of ``algorithms`` (names, or (name, hyperparameters)) on ``cfg``: for each, its
    label, its experiment, its name and its own hyperparameters. The shared ``cfg.algo`` keys apply to each
    algorithm that declares them, then its own hyperparameters; a shared key that none of the algorithms declares
    is refused (closest valid name suggested), and so is an algorithm's own key that it does not declare."""
    entries = [(e, {}) if isinstance(e, str) else (e[0], dict(e[1])) for e in algorithms]
    if not entries:
        raise ConfigError("no algorithm to compare; name at least one (e.g. fljax compare --algorithms "
                          "fedavg,fedprox).")
    declared = {name: hyperparameter_fields(get_algorithm(name)) for name, _ in entries}
    every = set().union(*declared.values())
    for key in cfg.algo:
        if key not in every:
            raise ConfigError(f"algo.{key} is not a valid key for any of the compared algorithms "
                              f"({', '.join(name for name, _ in entries)}).{suggest(str(key), every)}")
    points = []
    for name, hyper in entries:
        shared = {k: v for k, v in cfg.algo.items() if k in declared[name]}
        lbl = label(name, hyper)
        exp = resolve(dataclasses.replace(cfg, algorithm=name, algo={**shared, **hyper}, name=lbl))
        points.append((lbl, exp, name, hyper))
    return points


def preset(path: str, overrides: list[str] | None = None, algorithm_keys: bool = True,
           grid: dict[str, list] | None = None) -> dict:
    """The values of preset file ``path`` (like ``fljax compare``'s quick start) for the experiment that
    ``overrides`` describe. A preset key yields to the user's choice of the component that owns it: another
    ``data.dataset`` keeps only the preset's ``num_clients`` of its data section, another ``data.partition``
    drops the preset partitioner's options, another ``model.name`` the preset's model options, an
    ``algo.local_steps`` the preset's ``local_epochs`` (which would win over it); with ``algorithm_keys`` only the
    ``algo`` keys that the chosen algorithm declares are kept. Pass the result to
    :func:`fljax.config.load_config` as ``base``. ``grid``: a sweep's axes (dotted key → values); a key it sweeps
    is the user's choice where any of its values differs from the preset's (so ``--grid model.name=logreg,mlp``
    drops the preset's MLP options), and the ``algo`` keys kept are those every swept algorithm declares."""
    from fljax.data import PARTITIONERS

    values = read_yaml(path)
    user = apply_overrides({}, overrides or [])
    grid = grid or {}
    changed = lambda section, key: (isinstance(user.get(section), dict) and key in user[section]  # noqa: E731
                                    and user[section][key] != values.get(section, {}).get(key)
                                    or any(v != values.get(section, {}).get(key)
                                           for v in grid.get(f"{section}.{key}", ())))
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
    names: Any = grid.get("algorithm") or [{**values, **user}.get("algorithm", ExperimentConfig.algorithm)]
    if algorithm_keys and all(isinstance(n, str) and n in ALGORITHMS for n in names) \
            and isinstance(values.get("algo"), dict):
        declared = set.intersection(*(set(hyperparameter_fields(ALGORITHMS[n])) for n in names))
        values["algo"] = {k: v for k, v in values["algo"].items() if k in declared}
    return values
