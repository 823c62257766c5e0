"""The public entry points: build a simulation from a config; run one experiment, a grid, or a comparison (all
through :mod:`fljax.runner`, the path the command line takes).

    import fljax
    result = fljax.run(algorithm="fedprox", algo={"mu": 0.01}, data={"dataset": "digits", "alpha": 0.1},
                       rounds=50)
    print(result.final["personal_acc"])
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fljax.algorithms import make_algorithm
from fljax.algorithms.registry import check_model_support
from fljax.config import ExperimentConfig, ModelConfig, from_dict, group_configs, hyperparameters, to_dict
from fljax.data import FederatedData, load_federated
from fljax.engine import Simulation, default_model
from fljax.engine.population import ClientGroup
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.models.model import own_model
from fljax.options import parse

__all__ = ["make_config", "load_data", "build", "run", "compare", "sweep", "load_run", "load_compare"]

if TYPE_CHECKING:
    import pandas

    from fljax.runner import ExperimentResult


def make_config(config: ExperimentConfig | dict | None = None, **overrides) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from a config object or nested dict, with keyword overrides of top-level keys
    (sections given as dicts are merged key by key), validated."""
    return _config(config, overrides, check_algo=True)


def _config(config, overrides: dict, check_algo: bool) -> ExperimentConfig:
    values = to_dict(config) if isinstance(config, ExperimentConfig) else dict(config or {})
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict) and key != "algo":
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return from_dict(ExperimentConfig, values).validate(check_algo)


def load_data(cfg: ExperimentConfig) -> FederatedData:
    """The federated data set of ``cfg.data`` (drawn with the run seed unless ``data.seed`` is set), with the
    server's pretrained model of ``cfg.server`` attached (trained once, then restored from its cache)."""
    try:
        data = load_federated(cfg.data, cfg.seed)
    except OptionError as e:
        raise e.within("data") from None
    server = cfg.server
    if server.pretrained is None:
        return data
    from fljax.runner.pretrained import attach_pretrained

    if server.pretrained == "same":  # the run's architecture, with a head for the server's labels
        pm = _model(cfg.model, data.replace(num_classes=data.server_classes))
    else:
        pm = make_model(server.pretrained, data.input_shape, data.server_classes, **server.pretrained_options)
    related = None
    if server.pretrain_data is not None:
        from fljax.runner.pretrained import related_set

        related = related_set(server.pretrain_data, data.input_shape, data.server_classes, server.seed,
                              **server.pretrain_data_options)
    return attach_pretrained(data, pm, epochs=server.epochs, lr=server.lr, batch_size=server.batch_size,
                             seed=server.seed, cache_dir=server.cache_dir, pretrain_data=related)


def build(cfg: ExperimentConfig, data: FederatedData | None = None, module=None) -> Simulation:
    """The :class:`Simulation` a config describes (``data`` may be passed to share it between runs; ``module``: a
    Flax module of your own, used instead of the config's model)."""
    data = data if data is not None else load_data(cfg)
    model = own_model(module, data.input_shape, data.num_classes) if module is not None else _model(cfg.model, data)
    algo = make_algorithm(cfg.algorithm, **cfg.algo)
    groups = [ClientGroup(g.name, g.size, _model(parse(ModelConfig, g.model), data) if g.model else None,
                          hyperparameters(cfg.algorithm, g.algo)) for g in group_configs(cfg)] or None
    check_model_support(cfg.algorithm, model, groups=groups is not None)
    return Simulation(algo, data, model, executor=cfg.executor, chunk_size=cfg.chunk_size, seed=cfg.seed,
                      conv_impl=cfg.model.conv_impl, groups=groups, precision=cfg.precision,
                      memory_budget=cfg.memory_budget)


def _model(mc, data: FederatedData):
    """The model a ``model:`` section names (auto: the data's default model, with the options given)."""
    if mc.name == "auto":
        return default_model(data) if not mc.options else make_model(
            default_model(data).name, data.input_shape, data.num_classes, **mc.options)
    return make_model(mc.name, data.input_shape, data.num_classes, **mc.options)


def run(config: ExperimentConfig | dict | None = None, *, out: str | None = None, progress: bool = True,
        resume: bool = False, lanes: str = "vmap", tensorboard: str | None = None,
        **overrides) -> "ExperimentResult":
    """Run one experiment (all its ``seeds``) through the same path as ``fljax run``; ``overrides`` are top-level
    config keys (``algorithm=``, ``algo=``, ``data=``, ``seeds=``, ``checkpoint_every=``, …). ``out``: the run
    directory (None: nothing is written); ``tensorboard``: a log directory for TensorBoard scalars. ``data`` may
    also be a :class:`~fljax.data.FederatedData` of your own (e.g. :func:`fljax.data.from_arrays`), ``model`` a
    Flax module of your own (:func:`fljax.models.model.own_model` says which are accepted). Raises :class:`~fljax.engine.NonFiniteError` when training produced NaN/Inf or diverged."""
    from fljax.runner import run_experiment

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    cfg = make_config(config, **overrides)
    with _output(progress, tensorboard) as output:
        return run_experiment(cfg, out, resume=resume, output=output, data_cache=cache, lanes=lanes, model=module)


def compare(algorithms: list[str | tuple[str, dict]], config: ExperimentConfig | dict | None = None, *,
            out: str | None = None, progress: bool = True, tensorboard: str | None = None,
            **overrides) -> dict[str, "ExperimentResult"]:
    """Run several algorithms on the same data, partition and seeds (as ``fljax compare``). Each entry is a name or
    (name, hyperparameters); the config's ``algo`` dict applies to every algorithm that accepts its keys."""
    from fljax.runner import compare_experiments

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    cfg = _config(config, overrides, check_algo=False)
    with _output(progress, tensorboard) as output:
        return compare_experiments(cfg, algorithms, out, output=output, data_cache=cache, model=module)[1]


def sweep(grid: dict[str, list], config: ExperimentConfig | dict | None = None, *, out: str | None = None,
          progress: bool = True, lanes: str = "vmap", tensorboard: str | None = None,
          **overrides) -> dict[str, "ExperimentResult"]:
    """Run every point of ``grid`` (``{"algo.lr": [0.01, 0.1], "algo.mu": [0, 0.01]}``) for the config's seeds, as
    ``fljax sweep``: points that differ only in numeric hyperparameters run with the seeds as lanes of one compiled
    program. Returns the results by point label (``"lr=0.01,mu=0"``)."""
    from fljax.runner import sweep_experiments

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    cfg = make_config(config, **overrides)
    with _output(progress, tensorboard) as output:
        return sweep_experiments(cfg, grid, out, output=output, lanes=lanes, data_cache=cache, model=module)[1]


def load_run(directory) -> "pandas.DataFrame":
    """A run directory's history (every seed) as a pandas DataFrame: see :func:`fljax.runner.load.load_run`."""
    from fljax.runner.load import load_run as load

    return load(directory)


def load_compare(directory) -> "pandas.DataFrame":
    """A comparison's or sweep's histories as one pandas DataFrame with a ``run`` column: see
    :func:`fljax.runner.load.load_compare`."""
    from fljax.runner.load import load_compare as load

    return load(directory)


def _output(progress: bool, tensorboard: str | None = None):
    """Progress and TensorBoard as asked; first joins the process group the environment names, if any
    (:func:`fljax.engine.processes.from_environment`), and on its processes other than 0 stays silent."""
    import io

    from fljax.engine import processes
    from fljax.runner import Output
    from fljax.runner.tensorboard import TensorBoard

    processes.from_environment()
    if not processes.is_lead():
        return Output("quiet", stdout=io.StringIO())
    return Output("bar" if progress else "quiet", tensorboard=TensorBoard(tensorboard) if tensorboard else None)


def _own_data(overrides: dict):
    """A :class:`FederatedData` passed as ``data=``: every run uses it (the config's ``data.num_clients`` is set to
    its number of clients, so that cohort sizes are checked against it)."""
    from fljax.runner.sweep import DataCache

    data = overrides.get("data")
    if not isinstance(data, FederatedData):
        return overrides, None
    rest = {k: v for k, v in overrides.items() if k != "data"}
    return {**rest, "data": {"num_clients": data.num_clients}}, DataCache.fixed(data)


def _own_model(overrides: dict):
    """A Flax module passed as ``model=``: every run uses it (the config's model section stays at its default)."""
    import flax.linen as nn

    module = overrides.get("model")
    if not isinstance(module, nn.Module):
        return overrides, None
    return {k: v for k, v in overrides.items() if k != "model"}, module


def label(name: str, hyper: dict | None = None) -> str:
    """``fedprox(mu=0.1)``: an algorithm with its non-default hyperparameters, as tables and plots name it."""
    return name if not hyper else f"{name}({', '.join(f'{k}={v}' for k, v in hyper.items())})"
