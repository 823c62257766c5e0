"""Points and seeds: what a run, a sweep or a comparison is made of, and the data each needs.

A *point* is one resolved experiment (:class:`fljax.experiment.Experiment`: an algorithm with its hyperparameters,
data, model, run settings) with a label; it runs for ``seeds`` seeds ``seed, seed+1, …``. ``fljax run`` is one point, ``fljax sweep`` the points of
a grid of overrides (:func:`grid_points`), ``fljax compare`` one point per algorithm, a paper reproduction the
points of its studies. The data seed is ``data.seed`` when set (every run seed then shares one data set and
partition) and otherwise follows the run seed (each seed draws its own partition).
"""
from __future__ import annotations

import itertools
import json

from fljax.config import ConfigError, ExperimentConfig, apply_overrides, from_dict, parse_override, to_dict
from fljax.data import FederatedData
from fljax.experiment import Experiment, load_data, resolve
from fljax.runner.pretrained import with_server_model

__all__ = ["seed_list", "DataCache", "data_seed", "parse_grid", "grid_points", "grid_columns", "point_label",
           "point_experiment", "SWEPT", "swept_sections", "check_swept_options"]

SWEPT = ("aggregator", "attack")  # sections a grid may choose by name, their options declared by the chosen one


def seed_list(settings) -> list[int]:
    """The run seeds ``seed`` … ``seed + seeds − 1`` of a config or its :class:`~fljax.experiment.RunSettings`."""
    return [settings.seed + i for i in range(settings.seeds)]


def data_seed(cfg: ExperimentConfig, seed: int) -> int:
    return seed if cfg.data.seed is None else cfg.data.seed


class DataCache:
    """Federated data sets by (data and server sections, data seed), built once and shared between seeds, points
    and algorithms; the server's pretrained model attached (:func:`~fljax.runner.pretrained.with_server_model`)."""

    def __init__(self):
        self._cache: dict = {}
        self._fixed: FederatedData | None = None

    @classmethod
    def fixed(cls, data: FederatedData) -> "DataCache":
        """A cache that gives ``data`` (the user's own) to every run."""
        cache = cls()
        cache._fixed = data
        return cache

    @property
    def own(self) -> FederatedData | None:
        """The user's own data every run gets (:meth:`fixed`), else None."""
        return self._fixed

    def __call__(self, exp: Experiment, seed: int) -> FederatedData:
        if self._fixed is not None:
            return self._fixed
        cfg = exp.config
        same = to_dict(exp.model) if cfg.server.pretrained == "same" else None  # the PM has the run's architecture
        key = (json.dumps([to_dict(cfg.data), to_dict(cfg.server), same], sort_keys=True, default=str),
               data_seed(cfg, seed))
        if key not in self._cache:
            self._cache[key] = with_server_model(exp, load_data(exp, seed))
        return self._cache[key]


def parse_grid(specs: list[str]) -> dict[str, list]:
    """``["algo.lr=0.01,0.03", "algo.mu=0,0.01"]`` → ``{"algo.lr": [0.01, 0.03], "algo.mu": [0, 0.01]}``; values are
    read as in ``--set`` (``1e-3`` is a float). A value list in YAML brackets (``algo.hidden=[[16],[32]]``) is
    taken as the list of values."""
    grid: dict[str, list] = {}
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"--grid {spec!r} must look like key=v1,v2,... (for example algo.lr=0.01,0.1).")
        key, raw = spec.split("=", 1)
        key = key.strip()
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice; list all its values in one --grid.")
        stripped = raw.strip()
        if stripped.startswith("["):
            values = parse_override(f"{key}={stripped}")[1]
            if not isinstance(values, list):
                raise ConfigError(f"--grid {key}: {raw!r} is not a list of values.")
        else:
            values = [parse_override(f"{key}={v}")[1] for v in stripped.split(",")]
        if not values or any(v is None and r.strip() == "" for v, r in zip(values, stripped.split(","))):
            raise ConfigError(f"--grid {key} needs at least one value, e.g. {key}=0.01,0.1.")
        grid[key] = values
    return grid


def grid_points(grid: dict[str, list]) -> list[dict[str, object]]:
    """The Cartesian product of a grid, as flat ``{dotted key: value}`` dicts, in the grid's order."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def grid_columns(grid: dict[str, list]) -> dict[str, str]:
    """The column a table or DataFrame gives each grid key: its last part (``algo.lr`` → ``lr``, as
    :func:`point_label` names it), the whole dotted key where two keys share a last part or the part names another
    column (``data.seed``), ``grid.seed`` for the top-level ``seed``."""
    last = [k.rsplit(".", 1)[-1] for k in grid]
    names = {k: name if last.count(name) == 1 and name not in _RESERVED else k for k, name in zip(grid, last)}
    return {k: f"grid.{name}" if name in _RESERVED else name for k, name in names.items()}


_RESERVED = ("run", "algorithm", "seed", "round")  # the other label columns of a DataFrame


def point_label(point: dict[str, object]) -> str:
    """``{"algo.lr": 0.1, "algo.mu": 0}`` → ``"lr=0.1,mu=0"`` (the last part of each key; the whole key where two
    keys share it: ``attack.name=alie,aggregator.name=krum``)."""
    last = [k.rsplit(".", 1)[-1] for k in point]
    return ",".join(f"{name if last.count(name) == 1 else k}={v}"
                    for (k, v), name in zip(point.items(), last)) or "base"


def swept_sections(values: dict, grid: dict[str, list]) -> tuple[dict, dict[str, list]]:
    """A sweep whose grid chooses a rule or an attack by name (``aggregator.name``, ``attack.name``): the options the
    base config gives that section (a file's, ``--set aggregator.tau=0.3``) become one-value grid keys, and the
    section leaves the base, so that each applies to the chosen ones that declare it (:func:`point_experiment`), as
    the grid's own keys do. Returns ``(values, grid)``, new dicts."""
    values, grid = dict(values), dict(grid)
    for section in SWEPT:
        if f"{section}.name" not in grid or not isinstance(values.get(section), dict):
            continue
        for key, value in values.pop(section).items():
            dotted = f"{section}.{key}"
            if key == "name":
                continue
            if dotted in grid:
                raise ConfigError(f"--grid {dotted} is also given by the config (or --set); give it once.")
            grid[dotted] = [value]
    return values, grid


def _declares(section: str, name, key: str) -> bool:
    """Whether the rule or attack ``name`` of ``section`` has option ``key`` (an unknown name: True, refused by
    name when its point is resolved)."""
    import dataclasses

    from fljax.aggregation import ATTACKS, RULES

    registry = RULES if section == "aggregator" else ATTACKS
    if name not in registry:
        return True
    return key in {f.name for f in dataclasses.fields(registry[name]) if f.init}


def check_swept_options(grid: dict[str, list]) -> None:
    """Refuse, in one line, an option of a section whose name the grid chooses that none of the chosen declares."""
    for section in SWEPT:
        names = grid.get(f"{section}.name")
        if names is None:
            continue
        for key in grid:
            option = key.split(".", 1)[1] if key.startswith(section + ".") else None
            if option not in (None, "name") and not any(_declares(section, n, option) for n in names):
                raise ConfigError(f"--grid {key}: none of the {section} names swept ({', '.join(map(str, names))}) "
                                  f"has the option {option!r}; `fljax list` shows each one's options.")


def point_experiment(base: dict, point: dict[str, object], name: str | None = None) -> Experiment:
    """The resolved experiment of one grid point: ``base`` (a nested dict) with the point's dotted overrides
    (``name``: the run name); where the point chooses a rule or an attack by name, only the options of that section
    the chosen one declares (:func:`swept_sections`)."""
    values = apply_overrides(base, [])
    for key, value in point.items():
        section, _, option = key.partition(".")
        if section in SWEPT and option != "name" and f"{section}.name" in point \
                and not _declares(section, point[f"{section}.name"], option):
            continue  # an option of the swept rules or attacks that this point's does not have
        node = values
        parts = key.split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--grid {key}: {part!r} is not a section.")
        node[parts[-1]] = value
    if name is not None:
        values["name"] = name
    return resolve(from_dict(ExperimentConfig, values))
