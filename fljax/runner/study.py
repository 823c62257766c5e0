"""Paper reproductions as data: the study file (YAML), its cells, and the results of its runs.

A study file (``fljax/reproduce/<name>.yaml``) holds

* ``title``, ``command`` (how to run it), ``out`` (the committed report's folder, which ``fljax reproduce
  --update-report`` writes), ``seeds`` (default number of seeds);
* ``base``: an experiment config (the keys of ``fljax run`` configs) shared by every cell;
* ``presets``: named sets of config overrides that axis values build on (``use: [train, cfl]``);
* ``axes``: named choices, each value a set of config overrides (nested dicts), optionally with ``tags`` (labels the
  tables use, e.g. which model a method reports) — e.g. ``split: {pat2: {data: {...}}}``, ``method: {FedAvg: {...}}``;
* ``rules``: overrides applied to the cells whose axis values match ``when`` (e.g. DFedAlt's head epochs on the
  pathological splits);
* ``studies``: each a product of axis values (``cells: {split: all, method: [FedAvg, DFedAlt]}``), optional extra
  overrides (``set``), a ``grid`` of dotted keys (an axis each) and its own ``seeds`` (a count, or a list such as a
  tuning seed ``[99]`` that ``--seeds`` leaves alone); a value ``$rounds`` anywhere
  in a cell's config is replaced by the cell's number of rounds;
* ``tables`` and ``plots``: rendered by :mod:`fljax.runner.tables`, with the paper's numbers beside ours;
* ``claims``: ``module:function`` computing the paper's claims (verdicts) from the results;
* ``lanes``: how runs sharing a program run by default (``vmap``, or ``map`` to keep every run bit-identical to a
  run of its own, as the published tables of a file that sets it were made).

:class:`StudyResults` holds every cell's runs (history and summary per seed) for the tables, plots and claims;
:func:`evaluate` reads a table value (a metric name or an arithmetic expression of names) off a record. Running a
study and writing its report: :mod:`fljax.runner.study_run`.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
from importlib import resources

import numpy as np

from fljax import yaml_io
from fljax.config import ConfigError
from fljax.options import suggest
from fljax.runner.report import sample_std

__all__ = ["Study", "Cell", "StudyResults", "load_study", "study_names", "evaluate"]


# ---------------------------------------------------------------------------------------------------- the file


def study_names() -> list[str]:
    """The reproductions shipped with fljax (``fljax/reproduce/<name>.yaml``)."""
    folder = resources.files("fljax").joinpath("reproduce")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


@dataclasses.dataclass
class Cell:
    """One cell of a study: its axis values (``labels``), its config (without seed) and its seeds."""

    study: str
    labels: dict
    config: dict
    seeds: list[int]
    tags: dict

    def key(self, seed: int) -> str:
        """The identity of the run (config, seed) behind this cell's ``seed``: equal cells share it."""
        return json.dumps({"config": self.config, "seed": seed}, sort_keys=True, default=str)


@dataclasses.dataclass
class Study:
    name: str
    spec: dict

    @property
    def title(self) -> str:
        return self.spec.get("title", self.name)

    @property
    def studies(self) -> list[str]:
        return list(self.spec.get("studies", {}))

    def chosen(self, only: list[str] | None = None) -> list[str]:
        """The studies ``only`` (``--only``) names, checked: each a study of the file and named once (a study named
        twice would run and count its cells twice); None: every study of the file."""
        if only is None:
            return self.studies
        for study in only:
            if study not in self.studies:
                raise ConfigError(f"--only: {self.name} has no study {study!r}; choose from {self.studies}."
                                  f"{suggest(study, self.studies)}")
        twice = next((study for i, study in enumerate(only) if study in only[:i]), None)
        if twice is not None:
            raise ConfigError(f"--only names {twice!r} twice; name each study once.")
        return list(only)

    def cells(self, only: list[str] | None = None, seeds: int | None = None, rounds: int | None = None) -> list[Cell]:
        """Every cell of the chosen studies (:meth:`chosen`), with the seeds and rounds overrides of the command
        line."""
        return [cell for study in self.chosen(only) for cell in self._cells(study, seeds, rounds)]

    def _cells(self, study: str, seeds: int | None, rounds: int | None) -> list[Cell]:
        spec = self.spec["studies"][study]
        axes = self.spec.get("axes", {})
        names, choices = [], []
        for axis, values in (spec.get("cells") or {}).items():
            if axis not in axes:
                raise ConfigError(f"study {self.name}/{study}: unknown axis {axis!r}; axes: {sorted(axes)}.")
            values = list(axes[axis]) if values == "all" else list(values)
            missing = [v for v in values if v not in axes[axis]]
            if missing:
                raise ConfigError(f"study {self.name}/{study}: axis {axis!r} has no value {missing[0]!r}.")
            names.append(axis)
            choices.append(values)
        grid = spec.get("grid") or {}
        names += list(grid)
        choices += [list(v) for v in grid.values()]
        fixed = spec.get("seeds")
        if isinstance(fixed, list):  # the study's own seeds (e.g. a tuning seed), whatever --seeds says
            if not fixed or not all(isinstance(v, int) and v >= 0 for v in fixed):
                raise ConfigError(f"study {self.name}/{study}: seeds must be a count or a list of seeds >= 0, "
                                  f"got {fixed}.")
            seed_list = list(fixed)
        else:
            n_seeds = max(seeds or fixed or self.spec.get("seeds", 1), spec.get("min_seeds", 0))
            seed_list = list(range(n_seeds))
        cells = []
        for values in itertools.product(*choices):
            labels = dict(zip(names, values))
            config, tags = copy.deepcopy(self.spec.get("base", {})), {}
            for axis, value in labels.items():
                if axis in grid:
                    _set_dotted(config, axis, value)
                    continue
                choice = self._expand(copy.deepcopy(axes[axis][value] or {}))
                tags.update(choice.pop("tags", {}) or {})
                _merge(config, choice)
            for rule in self.spec.get("rules", []):
                if all(labels.get(k) in (v if isinstance(v, list) else [v]) for k, v in rule["when"].items()):
                    _merge(config, copy.deepcopy(rule["set"]))
            _merge(config, copy.deepcopy(spec.get("set") or {}))
            if rounds is not None:
                config["rounds"] = rounds if "rounds_factor" not in spec else rounds * spec["rounds_factor"]
            elif "rounds_factor" in spec:
                config["rounds"] = config.get("rounds", 100) * spec["rounds_factor"]
            config = _substitute(config, {"$rounds": config.get("rounds", 100)})
            cells.append(Cell(study, labels, config, seed_list, tags))
        return cells


    def _expand(self, overrides: dict) -> dict:
        """``use: [name, ...]``: the named ``presets`` merged first (in order), then the value's own keys."""
        out: dict = {}
        for name in overrides.pop("use", []) or []:
            if name not in self.spec.get("presets", {}):
                raise ConfigError(f"study {self.name}: unknown preset {name!r}; presets: "
                                  f"{sorted(self.spec.get('presets', {}))}.")
            _merge(out, self._expand(copy.deepcopy(self.spec["presets"][name])))
        _merge(out, overrides)
        return out


def _merge(into: dict, extra: dict) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _set_dotted(config: dict, key: str, value) -> None:
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _substitute(value, table: dict):
    if isinstance(value, str) and value in table:
        return table[value]
    if isinstance(value, dict):
        return {k: _substitute(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, table) for v in value]
    return value


def load_study(name_or_path: str) -> Study:
    """A shipped study by name, or a study file by path."""
    if os.path.exists(name_or_path):
        path = name_or_path
        name = os.path.splitext(os.path.basename(path))[0]
    else:
        if name_or_path not in study_names():
            import difflib

            close = difflib.get_close_matches(name_or_path, study_names(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown reproduction {name_or_path!r}; available: {study_names()}.{hint}")
        name = name_or_path
        path = str(resources.files("fljax").joinpath(f"reproduce/{name}.yaml"))
    with open(path, "rb") as f:
        spec = yaml_io.load(f)
    if not isinstance(spec, dict) or "studies" not in spec:
        raise ConfigError(f"study file {path!r} must hold a mapping with 'studies'.")
    return Study(name, spec)

# ---------------------------------------------------------------------------------------------------- results


class StudyResults:
    """Every cell's runs (history and summary per seed), read back from the run directories."""

    def __init__(self, study: Study, cells: list[Cell], runs: dict[str, dict], meta: dict):
        self.study, self.cells, self.runs, self.meta = study, cells, runs, meta

    def cell(self, study: str, **labels) -> Cell | None:
        for c in self.cells:
            if c.study == study and all(c.labels.get(k) == v for k, v in labels.items()):
                return c
        return None

    def seeds(self, study: str, **labels) -> list[dict]:
        """The cell's runs ({"history": [...], "summary": {...}}) that exist, in seed order."""
        c = self.cell(study, **labels)
        if c is None:
            return []
        return [self.runs[c.key(s)] for s in c.seeds if c.key(s) in self.runs]

    def final(self, study: str, metric: str, **labels) -> np.ndarray:
        """The final evaluation's ``metric`` (a name or an expression of names, which may also use the run's
        summary numbers such as ``num_params`` and ``run_seconds``) for every seed of the cell."""
        return np.array([evaluate(metric, {**_numbers(r["summary"]), **r["history"][-1]})
                         for r in self.seeds(study, **labels) if r["history"]], float)

    def at_round(self, study: str, metric: str, round_: int, **labels) -> np.ndarray:
        out = []
        for r in self.seeds(study, **labels):
            rec = [h for h in r["history"] if h["round"] == round_]
            out.append(evaluate(metric, rec[0]) if rec else np.nan)
        return np.array(out, float)

    def curve(self, study: str, metric: str, x: str = "round", **labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, mean, sample std over seeds) of ``metric`` at every evaluation the seeds share; x the rounds, or the
        mean over seeds of another recorded quantity (``x='virtual_time'``: the participation's clock)."""
        runs = [r["history"] for r in self.seeds(study, **labels) if r["history"]]
        if not runs:
            return np.array([]), np.array([]), np.array([])
        n = min(len(h) for h in runs)
        values = np.array([[evaluate(metric, rec) for rec in h[:n]] for h in runs], float)
        xs = np.array([[evaluate(x, rec) for rec in h[:n]] for h in runs], float).mean(0)
        return xs, values.mean(0), sample_std(values, axis=0)

    def first(self, study: str, value: str, metric: str, at_least: float, **labels) -> np.ndarray:
        """Per seed, ``value`` (e.g. ``virtual_time``) at the first evaluation whose ``metric`` is at least
        ``at_least`` (time to a target accuracy); NaN for a seed that never reaches it."""
        out = []
        for r in self.seeds(study, **labels):
            hit = [rec for rec in r["history"] if evaluate(metric, rec) >= at_least]
            out.append(evaluate(value, hit[0]) if hit else np.nan)
        return np.array(out, float)


def _numbers(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def evaluate(expression: str, record: dict) -> float:
    """A metric name, or an arithmetic expression of metric names and numbers (``+ - * / **``, ``min``, ``max``,
    ``abs``, ``log10``), on one evaluation record; a missing metric is NaN. Parsed with ``ast``: nothing else runs."""
    import ast
    import math
    import operator

    if expression in record:
        return float(record[expression])
    funcs = {"min": min, "max": max, "abs": abs, "log10": math.log10}

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            return float(record.get(node.id, np.nan))
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
            a, b = walk(node.left), walk(node.right)
            op = type(node.op)
            if op is ast.Div:
                return a / b if b else np.nan
            try:
                return {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}[op](a, b)
            except OverflowError:
                return np.inf
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs:
            return float(funcs[node.func.id](*(walk(a) for a in node.args)))
        raise ConfigError(f"metric expression {expression!r}: only metric names, numbers, + - * / ** and "
                          f"{sorted(funcs)} are allowed.")

    # metric names with '/' (rank/Dense_0/kernel) are looked up directly above; others parse as Python
    return walk(ast.parse(expression, mode="eval"))
