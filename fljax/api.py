"""The public entry points: build a simulation from a config, run one experiment, compare algorithms.

    import fljax
    result = fljax.run(algorithm="fedprox", algo={"mu": 0.01}, data={"dataset": "digits", "alpha": 0.1},
                       rounds=50)
    print(result.final["personal_acc"])
"""
from __future__ import annotations

from typing import Callable

from fljax.algorithms import make_algorithm
from fljax.config import ExperimentConfig, algorithm_config, check_compare_algo, from_dict, to_dict
from fljax.data import FederatedData, load_federated
from fljax.engine import RunResult, Simulation, default_model
from fljax.errors import OptionError
from fljax.models import make_model

__all__ = ["make_config", "load_data", "build", "run", "compare"]


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
    """The federated data set of ``cfg.data`` (drawn with the run seed unless ``data.seed`` is set)."""
    try:
        return load_federated(cfg.data, cfg.seed)
    except OptionError as e:
        raise e.within("data") from None


def build(cfg: ExperimentConfig, data: FederatedData | None = None) -> Simulation:
    """The :class:`Simulation` a config describes (``data`` may be passed to share it between runs)."""
    data = data if data is not None else load_data(cfg)
    if cfg.model.name == "auto":
        model = default_model(data) if not cfg.model.options else make_model(
            default_model(data).name, data.input_shape, data.num_classes, **cfg.model.options)
    else:
        model = make_model(cfg.model.name, data.input_shape, data.num_classes, **cfg.model.options)
    algo = make_algorithm(cfg.algorithm, **cfg.algo)
    return Simulation(algo, data, model, executor=cfg.executor, chunk_size=cfg.chunk_size, seed=cfg.seed,
                      conv_impl=cfg.model.conv_impl)


def run(config: ExperimentConfig | dict | None = None, *, progress: bool = True,
        callback: Callable | None = None, data: FederatedData | None = None, **overrides) -> RunResult:
    """Run one experiment; ``overrides`` are top-level config keys (``algorithm=``, ``algo=``, ``data=``, ...)."""
    cfg = make_config(config, **overrides)
    sim = build(cfg, data)
    return sim.run(cfg.rounds, cfg.eval_every, progress=progress, callback=callback)


def compare(algorithms: list[str | tuple[str, dict]], config: ExperimentConfig | dict | None = None, *,
            progress: bool = True, data: FederatedData | None = None, **overrides) -> dict[str, RunResult]:
    """Run several algorithms on the same data, partition and seed. Each entry is a name or (name, hyperparameters);
    the config's ``algo`` dict applies to every algorithm that accepts its keys."""
    cfg = _config(config, overrides, check_algo=False)
    check_compare_algo(cfg, [e if isinstance(e, str) else e[0] for e in algorithms])
    data = data if data is not None else load_data(cfg)
    results = {}
    for entry in algorithms:
        name, hp = (entry, {}) if isinstance(entry, str) else entry
        one = algorithm_config(cfg, name, hp)
        results[label(name, hp)] = build(one, data).run(cfg.rounds, cfg.eval_every, progress=progress)
    return results


def label(name: str, hyper: dict | None = None) -> str:
    """``fedprox(mu=0.1)``: an algorithm with its non-default hyperparameters, as tables and plots name it."""
    return name if not hyper else f"{name}({', '.join(f'{k}={v}' for k, v in hyper.items())})"
