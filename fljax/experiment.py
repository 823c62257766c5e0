"""The composition root: a parsed config resolved, once, into the :class:`Experiment` it describes.

Data flows one way: :mod:`fljax.config` parses (YAML, overrides, typed sections); :func:`resolve` checks the parsed
config against the registries and builds what it names, once — the algorithm constructed (every hyperparameter
checked by its declaration) and validated against the population, the model's name resolved and its options
checked, the server's section checked, the client groups with their own hyperparameters, the aggregator, attack
and participation, the run settings (:class:`RunSettings`) — into a frozen :class:`Experiment`. The rules a
simulation asks of its arguments (its evaluation sample and its client groups:
:func:`fljax.engine.sampling.check_sample`, :func:`fljax.engine.population.check_groups`) are asked of the config
here, before any data is loaded. Every layer above consumes Experiments and never re-validates or rebuilds them:
the runner (:mod:`fljax.runner`) loads their data (:func:`load_data`), resolves their privacy once per data set
(:func:`privacy_of`) and builds one simulation per compiled program (:func:`build`); the API (:mod:`fljax.api`) and
the command line (:mod:`fljax.cli`) are facades that parse, resolve and hand over to it.

A comparison runs several algorithms on one config: :func:`compare_points` gives each algorithm the config's shared
``algo`` keys that it *declares* (read from its declarations, :func:`fljax.algorithms.registry.declarations`;
no error message is parsed), then its own hyperparameters. The quick-start :func:`preset` yields its keys the same
way.

Privacy and compression (``privacy:``, ``compression:``; docs/privacy.md) are resolved here too: :func:`resolve`
refuses what the config alone shows cannot be done or accounted (an algorithm whose upload is not a model, a batch
plan the accountant cannot model, δ ≥ 1/N, …) and calibrates the noise to a target ε; :func:`privacy_of` completes
it with the data (the clients' counts, at example level the smallest client), before anything is written, into the
:class:`fljax.privacy.Privacy` a simulation applies (:func:`build` takes it) and the runner reports ε from.

Every refusal is one line naming the key (``algo.lr must be > 0, got -0.1.``), raised before anything is loaded,
built or written.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from fljax.algorithms import ALGORITHMS
from fljax.algorithms.base import Algorithm
from fljax.algorithms.registry import check_model_support, declarations, get_algorithm, make_algorithm, option_names
from fljax.config import (KEY_HINTS, ConfigError, ExperimentConfig, GroupConfig, ModelConfig, ServerConfig,
                          StopConfig, group_configs, read_yaml)
from fljax.errors import OptionError
from fljax.options import field_default, parse, show, suggest

if TYPE_CHECKING:
    from fljax.data import FederatedData
    from fljax.engine import Simulation

__all__ = ["Experiment", "Group", "RunSettings", "ProblemKind", "PROBLEM_KINDS", "resolve", "load_data", "build",
           "build_model", "default_model", "privacy_of", "compare_points", "label", "preset", "quickstart"]

KEY_HINTS["algo"] = option_names  # the config layer's hint on lr given at the top level: algo.lr (and a user's keys)


@dataclasses.dataclass(frozen=True)
class Group:
    """One client group of a population: ``size`` consecutive clients running ``model`` (None: the experiment's)
    with the algorithm's hyperparameters overridden by ``hp`` (checked values)."""

    name: str
    size: int
    model: ModelConfig | None
    hp: dict


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How an experiment's runs go, resolved from the config's run keys (configs/README.md): ``rounds``;
    ``eval_every`` (and after the last round); ``eval_clients`` (a fixed evaluation sample; None: every client);
    ``checkpoint_every`` (None: timed; 0: never); ``seed`` and ``seeds`` (the runs seed … seed + seeds − 1);
    ``executor``, ``chunk_size``, ``precision``, ``memory_budget`` and ``conv_impl`` (how a simulation computes);
    ``state_store`` (where the clients' state is kept between blocks of rounds: :mod:`fljax.engine.store`);
    ``diverge_factor`` (the divergence guard; None: none); ``stop`` (a stopping rule: at most ``rounds`` rounds;
    None: exactly ``rounds``); ``x64`` (float64; the config's null resolved: for consensus-regression problems)."""

    rounds: int
    eval_every: int
    eval_clients: int | None
    checkpoint_every: int | None
    seed: int
    seeds: int
    executor: str
    chunk_size: int | None
    precision: str
    memory_budget: float | None
    conv_impl: str
    state_store: str
    diverge_factor: float | None
    stop: StopConfig | None
    x64: bool

    PER_LANE = ("seed", "seeds")  # a run's own, not its program's

    @classmethod
    def of(cls, cfg: ExperimentConfig, problem: str) -> "RunSettings":
        """The settings of config ``cfg`` for an algorithm solving ``problem`` (its kind says whether ``x64: null``
        computes in float64)."""
        return cls(cfg.rounds, cfg.eval_every, cfg.eval_clients, cfg.checkpoint_every, cfg.seed, cfg.seeds,
                   cfg.executor, cfg.chunk_size, cfg.precision, cfg.memory_budget, cfg.model.conv_impl,
                   cfg.state_store, cfg.diverge_factor, cfg.stop,
                   PROBLEM_KINDS[problem].float64 if cfg.x64 is None else cfg.x64)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What one experiment is made of, built once from a config by :func:`resolve`.

    * ``config``: the parsed config (its ``algo`` values as the algorithm holds them), what ``config.yaml`` records;
    * ``settings``: how its runs go (:class:`RunSettings`: rounds, evaluation, seeds, executor, …), resolved;
    * ``algorithm``: the algorithm object, constructed and validated once; every simulation of the experiment runs
      this object (traced hyperparameters of a sweep are its fields replaced inside the compiled program);
    * ``model``: the model section with ``name: auto`` resolved to the model it picks;
    * ``groups``: the client population (empty: every client runs ``model`` with ``algorithm``);
    * ``aggregator``: how a centralized server reduces its uploads (a :class:`fljax.aggregation.Rule`, its
      cohort-dependent options filled in; the weighted mean by default) and ``attack``: the malicious clients' (None:
      every client is honest);
    * ``participation``: who takes part in a round (a :class:`fljax.participation.Participation`: the config's, else
      uniform cohorts, or Poisson ones under client-level privacy).
    """

    config: ExperimentConfig
    settings: RunSettings
    algorithm: Algorithm
    model: ModelConfig
    groups: tuple[Group, ...] = ()
    aggregator: Any = None
    attack: Any = None
    participation: Any = None

    @property
    def name(self) -> str:
        return self.config.run_name

    @property
    def seed(self) -> int:
        return self.settings.seed

    def with_seed(self, seed: int) -> "Experiment":
        """The same experiment for one run seed (``seeds: 1``); nothing is rebuilt."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, seed=seed, seeds=1),
                                   settings=dataclasses.replace(self.settings, seed=seed, seeds=1))

    def resolved(self) -> ExperimentConfig:
        """The config with every default made explicit, as a run directory's ``resolved.yaml`` records it: all of
        the algorithm's hyperparameters and, where the clients run a model, the model that ``auto`` picked with its
        options completed with their defaults. Loading it back resolves to the same experiment."""
        return PROBLEM_KINDS[self.algorithm.problem].resolved(self)


@dataclasses.dataclass(frozen=True)
class ProblemKind:
    """What an experiment is made of, by the kind of problem its algorithm solves (``Algorithm.problem``) and its data
    set poses (``Source.problem``; their data: :data:`fljax.data.registry.DATA_KINDS`): ``resolve(cfg, cls)``
    checks a config of this kind against the registries and builds its :class:`Experiment` with algorithm class
    ``cls``; ``build(exp, data, module, privacy)`` its :class:`~fljax.engine.Simulation`; ``resolved(exp)`` its
    config with every default explicit (:meth:`Experiment.resolved`); ``float64``: its runs compute in float64
    unless the config says ``x64: false``. The kinds are :data:`PROBLEM_KINDS`: classification (clients train a
    model on labelled examples) and consensus regression (FedGiA's: the algorithm fits x to the clients' rows
    itself, no model)."""

    name: str
    resolve: Callable[[ExperimentConfig, type[Algorithm]], Experiment]
    build: Callable[..., "Simulation"]
    resolved: Callable[[Experiment], ExperimentConfig]
    float64: bool = False


# ------------------------------------------------------------------------------------------------------ resolve


def resolve(cfg: ExperimentConfig) -> Experiment:
    """The :class:`Experiment` of a parsed config: the names checked against the registries (algorithm, executor,
    model, server), the model options against the model, the algorithm constructed from ``cfg.algo`` (unknown keys
    refused with the closest valid one, every value by its declaration) and validated for the training clients
    (``data.num_clients`` less a ``meta_pairs`` split's target clients), then the client groups. The algorithm
    and the data set must pose the same problem; its kind (:data:`PROBLEM_KINDS`) checks and builds the rest: an
    algorithm of consensus regression (FedGiA's) on a data set posing that problem (``fedgia_*``) has no model,
    server or groups, and its experiment holds the algorithm alone. Raises :class:`~fljax.errors.ConfigError` (one
    line naming the key)."""
    from fljax.engine.executors import EXECUTORS

    if not isinstance(cfg, ExperimentConfig):
        raise ConfigError(f"resolve takes an ExperimentConfig (fljax.config.load_config or from_dict parse one), got "
                          f"{show(cfg)}.")
    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    cls = ALGORITHMS[cfg.algorithm]
    _choice("executor", cfg.executor, EXECUTORS)
    if cls.problem not in PROBLEM_KINDS:
        raise ConfigError(f"algorithm {cfg.algorithm!r} solves {cls.problem} problems, which a config cannot describe "
                          f"(it describes {' and '.join(sorted(PROBLEM_KINDS))}); run it with fljax.Simulation.")
    if cls.problem != cfg.data.source.problem:
        raise _mismatch(cfg.algorithm, cls.problem, cfg.data.dataset, cfg.data.source.problem)
    return PROBLEM_KINDS[cls.problem].resolve(cfg, cls)


def _resolve_classification(cfg: ExperimentConfig, cls: type[Algorithm]) -> Experiment:
    """A classification experiment: the model resolved for the data's inputs, the server's section checked, the
    algorithm constructed, its client groups, evaluation sample, participation, privacy and aggregation."""
    if cfg.x64:
        raise OptionError("x64", f"is for consensus-regression problems only (float64 runs of FedGiA's data sets); "
                                 f"remove it (or set it to false) for {cfg.algorithm}.")
    if cfg.stop is not None:
        raise OptionError("stop", f"is for consensus-regression problems only (FedGiA's data sets); remove it for "
                                  f"{cfg.algorithm}, which runs `rounds` rounds.")
    input_shape = cfg.data.input_shape
    model = _resolve_model(cfg.model, input_shape)
    _check_server(cfg.server, input_shape)
    algorithm = _construct(cls, cfg.algo, cfg.data.num_train_clients, "algo")
    groups = _groups(cfg, algorithm, input_shape)
    _check_sample(cfg, labelled=True, grouped=bool(groups))
    participation = _participation(cfg, algorithm)
    _check_privacy(cfg, algorithm, participation)
    rule, attack = _aggregation(cfg, algorithm)
    config = dataclasses.replace(cfg, algo=_held(algorithm, cfg.algo))
    return Experiment(config, RunSettings.of(cfg, cls.problem), algorithm, model, groups, rule, attack, participation)


def _resolve_regression(cfg: ExperimentConfig, cls: type[Algorithm]) -> Experiment:
    """A consensus-regression experiment: no model, server or model groups (:func:`_check_regression`), every
    client measured, the algorithm alone (its hyperparameters as a config writes them: a loss by its name)."""
    _check_sample(cfg, labelled=False, grouped=False)
    if cfg.state_store != "device":
        raise OptionError("state_store", f"{cfg.state_store} keeps the clients of classification runs; "
                                         f"{cfg.algorithm} solves a consensus problem over every client every "
                                         f"round: use state_store: device.")
    _check_regression(cfg)
    algorithm = _construct(cls, cfg.algo, cfg.data.num_train_clients, "algo")
    return Experiment(dataclasses.replace(cfg, algo=_written(_held(algorithm, cfg.algo))),
                      RunSettings.of(cfg, cls.problem), algorithm, cfg.model)


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


def _held(algorithm: Algorithm, keys) -> dict:
    """The values of hyperparameters ``keys`` as ``algorithm`` holds them (checked and converted: ``1`` → ``1.0``)."""
    hp = algorithm.hyperparameters()
    return {k: hp[k] for k in keys}


def _groups(cfg: ExperimentConfig, algorithm: Algorithm, input_shape: tuple) -> tuple[Group, ...]:
    from fljax.engine.population import check_groups

    groups: list[GroupConfig] = group_configs(cfg)
    if not groups:
        return ()
    check_groups(algorithm, [g.size for g in groups], cfg.data.num_clients, stacked=cfg.data.storage == "padded")
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
        own = _construct(type(algorithm), hp, cfg.data.num_train_clients, f"groups[{i}].algo")
        out.append(Group(g.name, g.size, model, _held(own, g.algo)))
    return tuple(out)


def _check_sample(cfg: ExperimentConfig, *, labelled: bool, grouped: bool) -> None:
    """The config's evaluation sample (``eval_clients``) checked by the rule a simulation asks of its arguments
    (:func:`fljax.engine.sampling.check_sample`): ``labelled`` data, a ``grouped`` population, target clients."""
    from fljax.engine.sampling import check_sample

    check_sample(cfg.eval_clients, clients=cfg.data.num_clients, train_clients=cfg.data.num_train_clients,
                 labelled=labelled, grouped=grouped)


def _squeezed(cfg: ExperimentConfig) -> bool:
    """The config compresses uploads (a compressor, or error feedback)."""
    c = cfg.compression
    return c is not None and (c.kind != "none" or c.error_feedback)


def _participation(cfg: ExperimentConfig, algorithm: Algorithm):
    """The run's participation (:mod:`fljax.participation`): the config's, checked against the algorithm and the
    population, else the default (uniform, Poisson under client-level privacy)."""
    from fljax.participation import default_participation

    p = cfg.participation
    if p is None:
        return default_participation(cfg.privacy is not None and cfg.privacy.level == "client",
                                     clocked=algorithm.asynchronous)
    if not algorithm.samples_cohorts:
        raise OptionError("participation", f"draws the cohorts of a server-based algorithm; {cfg.algorithm}'s "
                                           f"clients all take part in every round (decentralized gossip or "
                                           f"consensus regression): remove the participation section.")
    if cfg.groups and (p.name != "uniform" or p.system):
        raise OptionError("participation", "other than uniform cohorts of whole work runs on one homogeneous "
                                           "population; remove groups.")
    clients = cfg.data.num_train_clients
    try:
        if algorithm.asynchronous:
            p.validate_asynchronous(cfg.algorithm)
        p.validate(clients, algorithm.participants(clients))
    except OptionError as e:
        raise e.within("participation") from None
    return p


def _aggregation(cfg: ExperimentConfig, algorithm: Algorithm):
    """The run's rule and attack (:mod:`fljax.aggregation`), the rule's cohort-dependent options filled in (R3), and
    the combination checked against the algorithm, privacy and the population (one line, naming the key)."""
    from fljax.aggregation import Aggregator, Mean, check_combination

    rule, attack = cfg.aggregator or Mean(), cfg.attack
    if isinstance(rule, Mean) and attack is None:
        return rule, None
    key = "attack" if attack is not None else "aggregator"
    if cfg.groups:
        raise OptionError(key, "runs on one homogeneous population; remove groups.")
    clients = cfg.data.num_train_clients
    cohort = algorithm.participants(clients)
    try:
        rule = rule.with_cohort(cohort, None if attack is None else attack.fraction)
    except OptionError as e:
        raise e.within("aggregator") from None
    if attack is not None:
        attack = attack.with_cohort(cohort, float(algorithm.hyperparameters().get("server_lr", 1.0)))
    check_combination(Aggregator(rule, attack=attack), algorithm,
                      private=cfg.privacy is not None and cfg.privacy.level == "client")
    return rule, attack


def _check_privacy(cfg: ExperimentConfig, algorithm: Algorithm, participation) -> None:
    """Refuse, in one line naming the key, privacy or compression the algorithm cannot take or the accountant cannot
    model, as far as the config shows (the data's part: :func:`privacy_of`); calibrates a target ε (cached)."""
    p = cfg.privacy
    if p is None and not _squeezed(cfg):
        return
    key = "privacy" if p is not None else "compression"
    if cfg.groups:
        raise OptionError(key, "runs on one homogeneous population; remove groups.")
    uploads = [n for n, c in sorted(ALGORITHMS.items()) if c.reads_aggregate]
    if (p is None or p.level == "client" or _squeezed(cfg)) and not algorithm.reads_aggregate:
        what = "client-level privacy" if p is not None and p.level == "client" else "compressing uploads"
        example = p is not None and algorithm.private_steps and not _squeezed(cfg)
        raise OptionError(key, f"applies to an algorithm whose upload is a model trained from the broadcast one and "
                               f"read by the server only through its aggregate (the delta w_i − w_t is what is "
                               f"clipped, noised or compressed); {cfg.algorithm}'s is not, so {what} is refused. Use "
                               f"one of {uploads}"
                               f"{' (or privacy.level: example)' if example else ''}.")
    if p is not None and p.level == "example":
        steps = [n for n, c in sorted(ALGORITHMS.items()) if c.private_steps]
        if not algorithm.private_steps:
            raise OptionError("privacy.level", f"'example' needs an algorithm whose clients touch their data only "
                                               f"through the local steps of its batch plan (then DP-SGD in every step "
                                               f"covers all it sends: no SAM, no phases of their own); "
                                               f"{cfg.algorithm}'s do not. Use one of {steps}.")
        plan = algorithm.plan()
        if plan is None or not plan.poisson:
            raise OptionError("algo.sampling", f"must be 'poisson' under privacy.level: example (each example in a "
                                               f"step with probability batch_size/n_i, the sampling the accountant "
                                               f"models; shuffled or epoch batches it cannot), got "
                                               f"{show(None if plan is None else plan.sampling)}.")
        return  # the rest needs the clients' sizes: privacy_of
    from fljax.privacy import resolve_run

    clients = cfg.data.num_train_clients
    try:
        resolve_run(p, cfg.compression, clients=clients, cohort_size=algorithm.participants(clients), rounds=cfg.rounds,
                    participation=participation)
    except OptionError as e:
        raise _in_privacy(e) from None


def privacy_of(exp: Experiment, data: "FederatedData", resolved: dict | None = None):
    """The :class:`fljax.privacy.Privacy` of ``exp`` on ``data`` (None without privacy and compression): the
    population is the data's training clients, their counts weigh the fixed denominator, and at example level the
    smallest client sets the sampling rate B/n_min and the total number of examples bounds δ. Refuses in one line
    naming the key (before anything is written: the runner asks for it when it sets up the run). ``resolved``: the
    privacies resolved so far (this function adds to it), by all the accountant is given — the sections, the
    population, cohort, rounds, participation, the clients' weights: the runs of one data set that differ in nothing
    else (the points of a learning-rate sweep) share one resolution."""
    import hashlib

    import numpy as np

    from fljax.privacy import LocalSteps, resolve_run

    cfg, algorithm = exp.config, exp.algorithm
    if cfg.privacy is None and not _squeezed(cfg):
        return None
    clients = data.num_train_clients
    counts = np.asarray(data.train.count)[:clients]
    local = None
    if cfg.privacy is not None and cfg.privacy.level == "example":
        plan, sizes = algorithm.plan(), counts[counts > 0]
        if not sizes.size:
            raise OptionError("privacy.level", "'example': no client has training examples.")
        local = LocalSteps(int(sizes.min()), int(sizes.sum()), plan.batch_size, plan.num_steps(data.train.n_max))
    given = dict(clients=clients, cohort_size=algorithm.participants(clients), rounds=exp.settings.rounds,
                 participation=exp.participation, weights=algorithm.client_weights(data.train)[:clients], local=local)
    key = repr((cfg.privacy, cfg.compression, {**given, "weights": hashlib.sha256(
        np.ascontiguousarray(given["weights"])).hexdigest()}))
    if resolved is not None and key in resolved:
        return resolved[key]
    try:
        privacy = resolve_run(cfg.privacy, cfg.compression, **given)
    except OptionError as e:
        raise _in_privacy(e) from None
    if resolved is not None:
        resolved[key] = privacy
    return privacy


def _in_privacy(e: OptionError) -> OptionError:
    """A privacy resolution's error with its key in the config: ``privacy.…``, but the participation's own keys."""
    return e if e.key.startswith("participation") else e.within("privacy")


def _with_root(exp: Experiment, data: "FederatedData", model) -> "FederatedData":
    """``data`` with the server's root set a rule that needs one reads (FLTrust): the data's own server set, else
    ``root_size`` training rows drawn once, uniformly without replacement, from all clients' (seeded by the run
    seed; Cao et al. 2021 sample the root set from the training data)."""
    import jax.numpy as jnp
    import numpy as np

    from fljax.data.federated import ServerData
    from fljax.data.ragged import RaggedArrays

    rule = exp.aggregator
    if rule is None or not rule.needs_root:
        return data
    if model.has_mode:
        raise OptionError("aggregator.name", f"{rule.name!r} trains the server's own update with the clients' update, "
                                             f"which a model with BatchNorm or Dropout ({model.name}) runs with "
                                             f"per-client statistics and masks; use a model without them.")
    if data.server is not None:
        return data
    train = data.train
    if isinstance(train, RaggedArrays):
        total = int(np.sum(np.asarray(train.count)))
        x, y = np.asarray(train.x)[:total], np.asarray(train.y)[:total]
    else:
        mask = np.asarray(train.mask, bool)
        x, y = np.asarray(train.x)[mask], np.asarray(train.y)[mask]
    if rule.root_size > len(y):
        raise OptionError("aggregator.root_size", f"must be at most the {len(y)} training rows, got {rule.root_size}.")
    rows = np.sort(np.random.default_rng([exp.seed, 0xF17]).choice(len(y), rule.root_size, replace=False))
    return data.replace(server=ServerData(x=jnp.asarray(x[rows]), y=jnp.asarray(y[rows])))


def _attack_on(attack, data):
    """The attack with what it needs of ``data`` (:meth:`fljax.aggregation.Attack.with_data`), its key named."""
    if attack is None:
        return None
    try:
        return attack.with_data(data)
    except OptionError as e:
        raise (e if e.key.startswith("attack") else e.within("attack")) from None


def _check_model_privacy(cfg: ExperimentConfig, model) -> None:
    """Privacy and compression work on models without BatchNorm statistics (they would travel or stay beside the
    parameters unprivatized); example-level DP also on none with Dropout (per-example gradients)."""
    p = cfg.privacy
    if p is None and not _squeezed(cfg):
        return
    key = "privacy" if p is not None else "compression"
    if model.collections:
        raise OptionError(key, f"needs a model without BatchNorm ({model.name} has it: its statistics are not "
                               f"privatized nor compressed); use a GroupNorm model (e.g. resnet18_gn) or an MLP/CNN.")
    if p is not None and p.level == "example" and model.has_mode:
        raise OptionError("privacy.level", f"'example' clips per-example gradients, which a model with Dropout "
                                           f"({model.name}) does not give; use a model without it.")


def _check_regression(cfg: ExperimentConfig) -> None:
    """A consensus-regression experiment has no model, server or model groups (spec §1); its data section's keys
    are the data kind's to check (:mod:`fljax.problems.sources`: no test split, every row trains)."""
    why = f"{cfg.algorithm} has no model (it fits x to the clients' rows)"
    if cfg.model != ModelConfig():
        raise OptionError("model", f"must be left out: {why}; remove the model section.")
    if cfg.server != ServerConfig():
        raise OptionError("server", f"must be left out: {why}; remove the server section.")
    if cfg.groups:
        raise OptionError("groups", f"must be null for {cfg.algorithm}: its data's size classes are its groups "
                                    f"(data.size_classes).")


def _written(hp: dict) -> dict:
    """Hyperparameters as a config writes them (a consensus-regression loss by its name and changed options)."""
    return {k: v.to_config() if hasattr(v, "to_config") else v for k, v in hp.items()}


def _mismatch(algorithm: str, problem: str, dataset: str, posed: str) -> ConfigError:
    """The refusal of an algorithm solving ``problem`` on a data set posing ``posed``, with what would match."""
    from fljax.data import SOURCES

    def few(names: list[str]) -> str:
        return ", ".join(sorted(names)) if len(names) <= 6 else f"{', '.join(sorted(names)[:3])}, … (fljax list)"

    algorithms = few([n for n, c in ALGORITHMS.items() if c.problem == posed])
    datasets = few([n for n, s in SOURCES.items() if s.problem == problem])
    return ConfigError(f"algorithm {algorithm!r} solves {problem} problems and data set {dataset!r} poses {posed} "
                       f"problems; choose an algorithm for {posed} ({algorithms}) or a data set for {problem} "
                       f"({datasets}).")


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
        from fljax.data import SOURCES

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


def default_model(data: "FederatedData"):
    """The model a config's ``model.name: auto`` picks for ``data`` (:func:`fljax.models.model.auto_model`: logreg
    for vectors, cnn1 for images, lstm or lstm_cls for token sequences), with its default options: the choice
    belongs here, at the composition root; :class:`~fljax.engine.Simulation` runs the model it is given."""
    return build_model(_resolve_model(ModelConfig(), data.input_shape), data)


def load_data(exp: Experiment, seed: int | None = None) -> "FederatedData":
    """The clients' federated data set of ``exp`` for run seed ``seed`` (default: the experiment's; ``data.seed``,
    when set, draws the split instead). The server's pretrained model (``server.pretrained``) is a trained and cached
    artifact: the runner attaches it (:func:`fljax.runner.pretrained.with_server_model`)."""
    from fljax.data import load_federated

    try:
        return load_federated(exp.config.data, exp.settings.seed if seed is None else seed)
    except OptionError as e:
        raise e.within("data") from None


def build(exp: Experiment, data: "FederatedData", module=None, *, privacy) -> "Simulation":
    """The :class:`~fljax.engine.Simulation` of ``exp`` on ``data`` with ``privacy``, its privacy on that data
    (:func:`privacy_of`, resolved once by the caller) (``module``: a Flax module of the user's own, used instead of
    the experiment's model), as the kind of its problem builds it (:data:`PROBLEM_KINDS`). The simulation runs
    ``exp.algorithm`` itself, which :func:`resolve` validated: not again unless ``data`` (one of the user's own) has
    another number of training clients."""
    return PROBLEM_KINDS[exp.algorithm.problem].build(exp, data, module, privacy)


def _build_classification(exp: Experiment, data: "FederatedData", module, privacy) -> "Simulation":
    """Clients training the experiment's model (or ``module``) on labelled examples, in its groups, with its
    privacy, aggregation and participation."""
    from fljax.engine import Simulation
    from fljax.engine.population import ClientGroup
    from fljax.models.model import own_model

    cfg, run = exp.config, exp.settings
    model = own_model(module, data.input_shape, data.num_classes, f"data set {data.name!r}") if module is not None \
        else build_model(exp.model, data)
    groups = [ClientGroup(g.name, g.size, build_model(g.model, data) if g.model is not None else None, g.hp)
              for g in exp.groups] or None
    check_model_support(cfg.algorithm, model, groups=groups is not None)
    _check_model_privacy(cfg, model)
    data = _with_root(exp, data, model)
    return Simulation(exp.algorithm, data, model, executor=run.executor, chunk_size=run.chunk_size, seed=run.seed,
                      conv_impl=run.conv_impl, groups=groups, precision=run.precision,
                      memory_budget=run.memory_budget, privacy=privacy,
                      eval_clients=run.eval_clients, validated_for=cfg.data.num_train_clients,
                      aggregator=exp.aggregator, attack=_attack_on(exp.attack, data),
                      participation=exp.participation, state_store=run.state_store)


def _build_regression(exp: Experiment, data, module, privacy) -> "Simulation":
    """The algorithm alone on the clients' rows in size classes (no model: ``module`` and ``privacy`` have nothing
    to apply to, and :func:`resolve` admits neither)."""
    from fljax.engine import Simulation

    run = exp.settings
    return Simulation(exp.algorithm, data, executor=run.executor, chunk_size=run.chunk_size, seed=run.seed,
                      memory_budget=run.memory_budget, validated_for=exp.config.data.num_train_clients)


# ------------------------------------------------------------------------------------------------------ kinds


def _resolved_classification(exp: Experiment) -> ExperimentConfig:
    """Every hyperparameter, and the model ``auto`` picked with its options completed with their defaults."""
    from fljax.models.model import model_options

    options = {f.name: exp.model.options.get(f.name, field_default(f)) for f in model_options(exp.model.name)}
    return dataclasses.replace(exp.config, algo=exp.algorithm.hyperparameters(),
                               model=dataclasses.replace(exp.model, options=options))


def _resolved_regression(exp: Experiment) -> ExperimentConfig:
    """Every hyperparameter as a config writes it (no model)."""
    return dataclasses.replace(exp.config, algo=_written(exp.algorithm.hyperparameters()))


PROBLEM_KINDS: dict[str, ProblemKind] = {kind.name: kind for kind in (
    ProblemKind("classification", _resolve_classification, _build_classification, _resolved_classification),
    ProblemKind("consensus regression", _resolve_regression, _build_regression, _resolved_regression, float64=True),
)}


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
    declared = {name: declarations(get_algorithm(name)) for name, _ in entries}
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


def quickstart(user: dict | None = None, algorithm_keys: bool = True, grid: dict[str, list] | None = None) -> dict:
    """The values of the packaged quick-start preset (``fljax/configs/quickstart.yaml``: digits, 50 clients,
    Dirichlet 0.3, an MLP) for the experiment ``user`` describes (:func:`preset`): where every experiment without a
    config starts, ``fljax run|compare|sweep`` without ``--config`` and ``fljax.run|compare|sweep`` without
    ``config``."""
    from importlib import resources

    return preset(str(resources.files("fljax").joinpath("configs/quickstart.yaml")), user, algorithm_keys, grid)


def preset(path: str, user: dict | None = None, algorithm_keys: bool = True,
           grid: dict[str, list] | None = None) -> dict:
    """The values of preset file ``path`` (like ``fljax compare``'s quick start) for the experiment that the
    user's values ``user`` (a nested dict: ``--set`` overrides as :func:`fljax.config.apply_overrides` makes them,
    or the Python API's keywords) describe. A preset key yields to the user's choice of the component that owns
    it: another ``data.dataset`` keeps only the preset's ``num_clients`` of its data section, another
    ``data.partition`` drops the preset partitioner's options, another ``model.name`` the preset's model options,
    an ``algo.local_steps`` the preset's ``local_epochs`` (which would win over it), another ``data.num_clients``
    or ``data.partition`` the preset's ``algo.cohort_size`` (10 of its 50 clients; the user's population trains
    in full unless they set a cohort); with ``algorithm_keys`` only
    the ``algo`` keys that the chosen algorithm declares are kept. Pass the result to
    :func:`fljax.config.load_config` as ``base``. ``grid``: a sweep's axes (dotted key → values); a key it sweeps
    is the user's choice where any of its values differs from the preset's (so ``--grid model.name=logreg,mlp``
    drops the preset's MLP options), and the ``algo`` keys kept are those every swept algorithm declares."""
    from fljax.data import PARTITIONERS

    values = read_yaml(path)
    user = user or {}
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
    if (changed("data", "num_clients") or changed("data", "partition")) and isinstance(values.get("algo"), dict):
        values["algo"] = {k: v for k, v in values["algo"].items() if k != "cohort_size"}  # its population's 10 of 50
    names: Any = grid.get("algorithm") or [{**values, **user}.get("algorithm", ExperimentConfig.algorithm)]
    if algorithm_keys and all(isinstance(n, str) and n in ALGORITHMS for n in names) \
            and isinstance(values.get("algo"), dict):
        declared = set.intersection(*(set(declarations(ALGORITHMS[n])) for n in names))
        values["algo"] = {k: v for k, v in values["algo"].items() if k in declared}
    return values
