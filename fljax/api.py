"""The public entry points, a facade over :mod:`fljax.experiment` and :mod:`fljax.runner`: a config (an object or a
nested dict, with keyword overrides; none: the quick-start preset, as the command line without ``--config``) is
parsed (:mod:`fljax.config`), resolved once into an :class:`~fljax.experiment.Experiment` and handed to the runner,
the path the command line takes.

    import fljax
    result = fljax.run(algorithm="fedprox", algo={"mu": 0.01}, data={"dataset": "digits", "alpha": 0.1},
                       rounds=50)
    print(result.final["personal_acc"])
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fljax.config import ExperimentConfig, from_dict, to_dict
from fljax.data import FederatedData
from fljax.engine import Simulation
from fljax.experiment import Experiment, quickstart, resolve

__all__ = ["make_config", "load_data", "build", "run", "compare", "sweep", "hypergradient", "tune", "load_run",
           "load_compare", "load_sweep"]

if TYPE_CHECKING:
    import pandas

    from fljax.hypergrad import Hypergradient, TuneResult
    from fljax.runner import ExperimentResult


def make_config(config: ExperimentConfig | dict | None = None, **overrides) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from a config object or nested dict (None: the quick-start preset, as the
    command line without ``--config``), with keyword overrides of top-level keys (sections given as dicts are
    merged key by key), checked through :func:`fljax.experiment.resolve` (its ``algo`` values as the algorithm
    holds them)."""
    return resolve(_parse(config, overrides)).config


def _parse(config, overrides: dict, algorithm_keys: bool = True, grid: dict | None = None) -> ExperimentConfig:
    """``config`` with ``overrides`` over it; no config: the quick-start preset for the experiment the overrides
    describe (:func:`fljax.experiment.quickstart`; a comparison keeps every preset ``algo`` key, not
    ``algorithm_keys``), as ``fljax run|compare|sweep`` without ``--config`` start from it."""
    return from_dict(ExperimentConfig, _values(config, overrides, algorithm_keys, grid))


def _values(config, overrides: dict, algorithm_keys: bool = True, grid: dict | None = None) -> dict:
    """The values :func:`_parse` parses."""
    if config is None:
        values = quickstart(overrides, algorithm_keys=algorithm_keys, grid=grid)
    else:
        values = to_dict(config) if isinstance(config, ExperimentConfig) else dict(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def _experiment(config: Experiment | ExperimentConfig | dict | None) -> Experiment:
    return config if isinstance(config, Experiment) else resolve(_parse(config, {}))


def load_data(config: Experiment | ExperimentConfig | dict) -> FederatedData:
    """The federated data set a config describes (drawn with the run seed unless ``data.seed`` is set), with the
    server's pretrained model of its ``server:`` section attached (trained once, then restored from its cache)."""
    from fljax.runner.sweep import DataCache

    exp = _experiment(config)
    return DataCache()(exp, exp.seed)


def build(config: Experiment | ExperimentConfig | dict, data: FederatedData | None = None, module=None) -> Simulation:
    """The :class:`Simulation` a config describes (``data`` may be passed to share it between runs; ``module``: a
    Flax module of your own, used instead of the config's model)."""
    from fljax.experiment import build as build_experiment
    from fljax.experiment import privacy_of
    from fljax.runner.sweep import DataCache

    exp = _experiment(config)
    data = data if data is not None else DataCache()(exp, exp.seed)
    return build_experiment(exp, data, module, privacy=privacy_of(exp, data))


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
    exp = resolve(_parse(config, overrides))
    with _output(progress, tensorboard) as output:
        return run_experiment(exp, out, resume=resume, output=output, data_cache=cache, lanes=lanes, model=module)


def compare(algorithms: list[str | tuple[str, dict]], config: ExperimentConfig | dict | None = None, *,
            out: str | None = None, progress: bool = True, resume: bool = False, tensorboard: str | None = None,
            **overrides) -> dict[str, "ExperimentResult"]:
    """Run several algorithms on the same data, partition and seeds (as ``fljax compare``). Each entry is a name or
    (name, hyperparameters); the config's ``algo`` dict applies to every algorithm that accepts its keys.
    ``resume``: continue the comparison in ``out`` (the same algorithms, config, and own data or model if it was
    made with them)."""
    from fljax.runner import compare_experiments

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    cfg = _parse(config, overrides, algorithm_keys=False)
    with _output(progress, tensorboard) as output:
        return compare_experiments(cfg, algorithms, out, resume=resume, output=output, data_cache=cache,
                                   model=module)[1]


def sweep(grid: dict[str, list], config: ExperimentConfig | dict | None = None, *, out: str | None = None,
          progress: bool = True, resume: bool = False, lanes: str = "vmap", tensorboard: str | None = None,
          **overrides) -> dict[str, "ExperimentResult"]:
    """Run every point of ``grid`` (``{"algo.lr": [0.01, 0.1], "algo.mu": [0, 0.01]}``) for the config's seeds, as
    ``fljax sweep``: points that differ only in numeric hyperparameters run with the seeds as lanes of one compiled
    program. Returns the results by point label (``"lr=0.01,mu=0"``). With your own ``data=``, a grid over
    ``data.*`` keys is refused (they would not change it). ``resume``: continue the sweep in ``out``."""
    from fljax.runner import sweep_experiments
    from fljax.runner.sweep import swept_sections

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    values, grid = swept_sections(_values(config, overrides, grid=grid), grid)
    cfg = from_dict(ExperimentConfig, values)
    with _output(progress, tensorboard) as output:
        return sweep_experiments(cfg, grid, out, resume=resume, output=output, lanes=lanes, data_cache=cache,
                                 model=module)[1]


def hypergradient(config: ExperimentConfig | dict | None = None, *, hp: list[str], metric: str = "global_loss",
                  split: str = "val", val_fraction: float = 0.2, last: int = 1, mode: str = "reverse",
                  remat: str = "round", **overrides) -> "Hypergradient":
    """The value and the gradient of a run's ``metric`` with respect to the continuous hyperparameters ``hp``
    (config keys: ``["algo.lr", "algo.server_lr"]``) for the run of the config's ``seed``
    (:mod:`fljax.hypergrad`; docs/tuning.md): the run's ``rounds`` rounds on the clients' training rows, the metric
    an evaluation loss (``global_loss``, ``personal_loss``, …) of the validation split (``split='val'``:
    ``val_fraction`` of every client's training rows held out), the test or the training split, averaged over the
    evaluations after each of the ``last`` rounds; ``mode`` 'reverse' (``remat``: 'round', 'block' or 'none') or
    'forward'. Discrete, null or untraceable hyperparameters and accuracies are refused in one line; the result's
    ``zero`` names those whose gradient is exactly zero in this run."""
    objective = _objective(config, hp, overrides, metric=metric, split=split, val_fraction=val_fraction, last=last,
                           remat=remat)
    return objective.value_and_grad(mode=mode)


def tune(config: ExperimentConfig | dict | None = None, *, hp: list[str], steps: int = 10, hyper_lr: float = 0.2,
         keys: str = "redraw", metric: str = "global_loss", split: str = "val", val_fraction: float = 0.2,
         last: int = 1, mode: str = "reverse", remat: str = "round", spaces: dict | None = None,
         **overrides) -> "TuneResult":
    """Hypergradient descent on the hyperparameters ``hp`` (config keys) of the run a config describes, as ``fljax
    tune``: ``steps`` steps of length up to ``hyper_lr`` in log h for positive hyperparameters (logit h in (0, 1),
    ``spaces`` to choose) along the negative hypergradient, each kept only where the run of the same key is better
    (:func:`fljax.hypergrad.tune`), from the config's values, the run's key re-drawn every step (``keys='redraw'``:
    seed, seed + 1, …) or ``'fixed'``; the objective as :func:`hypergradient`. Returns the trajectory
    (:class:`fljax.hypergrad.TuneResult`)."""
    from fljax.hypergrad import tune as descend

    objective = _objective(config, hp, overrides, metric=metric, split=split, val_fraction=val_fraction, last=last,
                           remat=remat)
    return descend(objective, steps, hyper_lr=hyper_lr, keys=keys, seed=objective.sim.seed, spaces=spaces, mode=mode)


def _objective(config, hp, overrides: dict, **options):
    """The :class:`fljax.hypergrad.RunObjective` of a config with keyword overrides (own data or model accepted as
    in :func:`run`)."""
    from fljax.hypergrad import objective_of
    from fljax.runner.sweep import DataCache

    overrides, cache = _own_data(overrides)
    overrides, module = _own_model(overrides)
    exp = resolve(_parse(config, overrides))
    return objective_of(exp, (cache or DataCache())(exp, exp.seed), hp, module=module, **options)


def load_run(directory) -> "pandas.DataFrame":
    """A run directory's history (every seed) as a pandas DataFrame: see :func:`fljax.runner.load.load_run`."""
    from fljax.runner.load import load_run as load

    return load(directory)


def load_compare(directory) -> "pandas.DataFrame":
    """A comparison's or sweep's histories as one pandas DataFrame with a ``run`` column: see
    :func:`fljax.runner.load.load_compare`."""
    from fljax.runner.load import load_compare as load

    return load(directory)


def load_sweep(directory) -> "pandas.DataFrame":
    """A sweep's histories as one pandas DataFrame with a ``run`` column and one column per grid key: see
    :func:`fljax.runner.load.load_sweep`."""
    from fljax.runner.load import load_sweep as load

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
    return Output("bar" if progress else "quiet", tensorboard=TensorBoard(tensorboard) if tensorboard is not None else None)


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
