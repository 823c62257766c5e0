"""Paper reproductions as data: a study file (YAML) and one runner.

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

:func:`run_study` turns the chosen studies into runs — one per distinct (config, seed), shared by every cell that
needs it — and runs them through :func:`fljax.runner.run_points`, the path of ``fljax run``: run directories under
``<out>/runs/``, checkpoints and resume, seeds and grid points as lanes of one program where shapes allow, runs
finished before an interruption reused, ``jobs`` worker processes. Then the report (``README.md``), the plots and
``results.json`` (every run's history) are written into ``out``.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import itertools
import json
import os
import time
from importlib import resources

import numpy as np

from fljax import yaml_io
from fljax.config import RUNS_MAX, ConfigError, ExperimentConfig, from_dict, to_dict
from fljax.experiment import Experiment, resolve
from fljax.options import suggest
from fljax.runner import files, identity
from fljax.runner.report import Output, sample_std
from fljax.runner.results import RunDir

__all__ = ["Study", "Cell", "StudyResults", "load_study", "study_names", "run_study", "render_study", "check_out"]


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

    def curve(self, study: str, metric: str, **labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rounds, mean, sample std over seeds) of ``metric`` at every evaluation the seeds share."""
        runs = [r["history"] for r in self.seeds(study, **labels) if r["history"]]
        if not runs:
            return np.array([]), np.array([]), np.array([])
        n = min(len(h) for h in runs)
        values = np.array([[evaluate(metric, rec) for rec in h[:n]] for h in runs], float)
        return np.array([rec["round"] for rec in runs[0][:n]]), values.mean(0), sample_std(values, axis=0)


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


# ---------------------------------------------------------------------------------------------------- running


def _run_dir_names(cells: list[Cell]) -> dict[str, str]:
    """A readable, unique directory name per run key: the first cell that needs it, and the seed."""
    names, used = {}, set()
    for c in cells:
        for s in c.seeds:
            key = c.key(s)
            if key in names:
                continue
            base = ".".join([c.study] + [str(v) for v in c.labels.values()]) + f".s{s}"
            from fljax.runner.experiment import dir_name

            name, k = dir_name(base), 2
            while name in used:
                name, k = f"{dir_name(base)}-{k}", k + 1
            used.add(name)
            names[key] = name
    return names


def _experiments(cells: list[Cell]) -> dict[str, Experiment]:
    """The resolved experiment of every run, once per run key (refusing a bad cell before anything runs)."""
    out = {}
    for c in cells:
        for s in c.seeds:
            key = c.key(s)
            if key not in out:
                try:
                    out[key] = resolve(from_dict(ExperimentConfig, {**c.config, "seed": s, "seeds": 1}))
                except ConfigError as e:
                    raise ConfigError(f"study cell {c.study} {c.labels}: {e}") from None
    return out


def _families(keys: list[str], experiments: dict[str, Experiment]) -> list[list[str]]:
    """Runs grouped by config without seed (those that may share a compiled program)."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        values = to_dict(experiments[key].config)
        values.pop("seed")
        groups.setdefault(json.dumps(values, sort_keys=True, default=str), []).append(key)
    return list(groups.values())


def _run_some(root: str, items: list[tuple[str, Experiment]], lanes: str, progress: bool) -> float:
    """Run these (dir name, experiment) in ``root``; returns the wall seconds (a worker's job: experiments are
    plain frozen values, sent to a worker process as they are)."""
    from fljax.runner.experiment import run_points

    t0 = time.perf_counter()
    run_points(items, root, resume=True, missing_ok=True, output=Output("bar" if progress else "quiet"),
               plots=False, subdirs=True, lanes=lanes)
    return time.perf_counter() - t0


def run_study(study: Study, out: str, *, only: list[str] | None = None, seeds: int | None = None,
              rounds: int | None = None, jobs: int = 1, lanes: str | None = None, fresh: bool = False,
              output: Output | None = None) -> StudyResults:
    """Run the chosen studies' cells into ``out`` (finished runs reused, interrupted ones resumed) and write the
    report. ``seeds``/``rounds`` override the file's (a quick look); ``fresh``: ignore earlier runs in ``out``;
    ``lanes`` (None: the file's ``lanes``, default 'vmap') how runs that share a program run (see ``fljax sweep``:
    'map' keeps each run bit-identical to a run of its own)."""
    output = output or Output()
    lanes = lanes or study.spec.get("lanes", "vmap")
    check_out(out)
    if os.path.isdir(out):  # a run, sweep or comparison is not a study's folder (its runs would land beside them)
        identity.check_kind(out, "study", "--out")
    cells = study.cells(only, seeds, rounds)
    count = sum(len(c.seeds) for c in cells)
    if count > RUNS_MAX:  # the cap of `fljax run` and `fljax sweep`
        raise ConfigError(f"--seeds/--only: {study.name}'s {','.join(study.chosen(only))} has {len(cells):,} cells × "
                          f"their seeds = {count:,} runs, more than the {RUNS_MAX:,} one command may start; ask for "
                          f"fewer --seeds, or fewer studies with --only.")
    experiments = _experiments(cells)
    names = _run_dir_names(cells)
    root = os.path.join(out, "runs")
    for key, name in names.items():  # a run directory made with other settings would be resumed wrongly
        saved = RunDir(os.path.join(root, name)).file("config.yaml")
        if not fresh and os.path.exists(saved):
            if not _same_settings(yaml_io.load(open(saved, "rb")), experiments[key].config):
                raise ConfigError(f"{os.path.dirname(saved)} was run with other settings than the study now asks "
                                  f"for; rerun with --fresh (or another --out).")
    dropped = _dropped(out, names)
    if dropped and not fresh:
        raise ConfigError(f"--out {out}: its report records {dropped} that this invocation "
                          f"({_invocation(study, only, seeds, rounds)}) would drop from it; ask for them too, with "
                          f"the same --seeds and --rounds (their recorded runs are reused, not run again), write "
                          f"into another --out, or add --fresh to replace the report.")
    if dropped:
        output.note(f"--fresh: the report in {out} ({dropped}) is replaced by this invocation's")
    if fresh and os.path.isdir(root):
        import shutil

        shutil.rmtree(root)
    recorded = {} if fresh else _recorded_runs(out, experiments)
    todo = [key for key in names
            if key not in recorded and not _completed(os.path.join(root, names[key]), experiments[key].config)]
    output.note(f"{study.title}: {len(cells)} cells, {len(names)} runs ({len(names) - len(todo)} already done), "
                f"{jobs} job(s); results in {out}")
    t0 = time.perf_counter()
    identity.write(out, "study", study=study.name)
    families = _families(todo, experiments)
    work = [[(names[k], experiments[k]) for k in fam] for fam in families]
    if jobs <= 1 or len(work) <= 1:
        for items in work:
            _run_some(root, items, lanes, output.progress)
    else:
        _run_parallel(root, work, jobs, lanes)
    runs = {}
    for key, name in names.items():
        d = RunDir(os.path.join(root, name))
        if d.holds_summary():
            runs[key] = {"history": d.read_metrics(), "summary": d.read_summary()}
        elif key in recorded:
            runs[key] = recorded[key]
    previous = _read_meta(out) if todo != list(names) else {}  # every run computed now: an earlier file is replaced
    earlier = previous.get("wall_seconds", 0.0)  # None: a report rendered from run directories did not time them
    meta = {"study": study.name, "title": study.title, "only": only or study.studies, "seeds": seeds,
            "rounds": rounds, "runs": len(names), "computed": len(todo), "jobs": jobs, "lanes": lanes,
            "wall_seconds": None if earlier is None else time.perf_counter() - t0 + earlier}
    results = StudyResults(study, cells, runs, meta)
    render_study(results, out)
    return results


def check_out(out: str) -> None:
    """Refuse an output folder that a file stands in the way of (``out`` itself or a folder above it), in one
    line."""
    blocked = out
    while blocked and not os.path.isdir(blocked):
        if os.path.lexists(blocked):
            where = f"{out!r} is" if blocked == out else f"{out!r}: {blocked!r} is"
            raise ConfigError(f"--out {where} a file, not a directory; choose another --out.")
        blocked = os.path.dirname(blocked)


def _dropped(out: str, names: dict[str, str]) -> str | None:
    """What the report in ``out`` records that a report of the runs ``names`` (run key → directory) would lose —
    "N runs of studies a, b" — or None (no report there, or one whose runs are all among them): a report is never
    replaced by a smaller one without being asked to (``--fresh``)."""
    path = os.path.join(out, "results.json.gz")
    if not os.path.exists(path):
        return None
    saved = _results_file(path)
    lost = set(saved["runs"]) - set(names)
    if not lost:
        return None
    try:
        studies = sorted({c["study"] for c in saved["cells"] if any(Cell(**c).key(s) in lost for s in c["seeds"])})
    except (TypeError, KeyError):
        raise files.DamagedFile(path, "its 'cells' are not the cells of a study") from None
    return f"{len(lost):,} run{'s' * (len(lost) > 1)} of {', '.join(studies) or 'its studies'}"


def _invocation(study: Study, only: list[str] | None, seeds: int | None, rounds: int | None) -> str:
    """The chosen studies and quick-look settings, as a message names them."""
    parts = [f"--only {','.join(only)}" if only else f"every study of {study.name}"]
    parts += [f"--{k} {v}" for k, v in (("seeds", seeds), ("rounds", rounds)) if v is not None]
    return " ".join(parts)


def _results_from_runs(study: Study, out: str, only: list[str] | None, path: str) -> StudyResults:
    cells = study.cells(only)
    experiments, names = _experiments(cells), _run_dir_names(cells)
    runs = {}
    for key, name in names.items():
        d = RunDir(os.path.join(out, "runs", name))
        saved = d.file("config.yaml")
        if (os.path.exists(saved) and _same_settings(yaml_io.load(open(saved, "rb")), experiments[key].config)
                and _completed(d.path, experiments[key].config)):  # a run of other settings is not this cell's
            runs[key] = {"history": d.read_metrics(), "summary": d.read_summary()}
    if not runs:
        raise ConfigError(f"{path} does not exist and {os.path.join(out, 'runs')} holds no finished run of "
                          f"{','.join(study.chosen(only))}; run the study first (without --render).")
    meta = {"study": study.name, "title": study.title, "only": only or study.studies, "seeds": None,
            "rounds": None, "runs": len(names), "computed": len(runs), "jobs": 1,
            "lanes": study.spec.get("lanes", "vmap"), "wall_seconds": None}  # the runs' own times are in them
    return StudyResults(study, cells, runs, meta)


def _same_settings(saved: dict, cfg: ExperimentConfig) -> bool:
    """Whether a run directory's ``config.yaml`` asks for ``cfg``: read back through the config layer, so a section
    or option added since (at its default) does not count as a change, and one that no longer parses does."""
    try:
        return to_dict(from_dict(ExperimentConfig, saved)) == to_dict(cfg)
    except ConfigError:
        return False


def _completed(path: str, cfg: ExperimentConfig) -> bool:
    d = RunDir(path)
    return d.holds_summary() and _finished(d.read_summary(), cfg)


def _finished(summary: dict, cfg: ExperimentConfig) -> bool:
    """Completed (its rounds, or until its stopping rule fired) or stopped by a guard."""
    from fljax.runner.experiment import completed

    return summary.get("status") == "stopped" or completed(summary, cfg)


def _recorded_runs(out: str, experiments: dict[str, Experiment]) -> dict[str, dict]:
    """The finished runs that ``out/results.json.gz`` records (history and summary) for these run keys: a committed
    report keeps its runs when its run directories (not committed) are gone, so adding cells reruns nothing."""
    path = os.path.join(out, "results.json.gz")
    if not os.path.exists(path):
        return {}
    saved = _results_file(path)["runs"]
    return {key: run for key, run in saved.items()
            if key in experiments and _finished(run["summary"], experiments[key].config)}


TASKS_PER_WORKER = 4  # families a worker process runs before it is replaced (frees its compiled programs)


def _run_parallel(root: str, work: list, jobs: int, lanes: str) -> None:
    """Run the families of ``work`` in ``jobs`` worker processes, the biggest first. Workers are replaced by starting
    a fresh pool for every ``jobs`` × TASKS_PER_WORKER families, not by ``max_tasks_per_child``: on Python 3.11 a
    ProcessPoolExecutor with that option hangs for good once a worker retires (seen here: the workers gone, the
    pool waiting)."""
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    order = sorted(work, key=len, reverse=True)
    per_pool = jobs * TASKS_PER_WORKER
    for start in range(0, len(order), per_pool):
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            for fut in concurrent.futures.as_completed([pool.submit(_run_some, root, items, lanes, False)
                                                        for items in order[start:start + per_pool]]):
                fut.result()


def _read_meta(out: str) -> dict:
    path = os.path.join(out, "results.json.gz")
    if os.path.exists(path):
        return _results_file(path)["meta"]
    return {}


def _results_file(path: str) -> dict:
    """``results.json.gz`` read and checked: ``meta`` and ``runs`` mappings and a ``cells`` list (a damaged file
    is named, :class:`~fljax.runner.files.DamagedFile`)."""
    saved = files.read_json(path, expect=dict)
    if "runs" in saved and "cells" not in saved:
        raise ConfigError(f"{path} was written by an older fljax (results without their study's cells), which "
                          f"this one cannot read: run the study again with --fresh to rebuild its report, or keep "
                          f"the committed one.")
    for key, kind in (("meta", dict), ("runs", dict), ("cells", list)):
        if not isinstance(saved.setdefault(key, kind()), kind):
            raise files.DamagedFile(path, f"its {key!r} is not a {'mapping' if kind is dict else 'list'}")
    if not all(isinstance(r, dict) and isinstance(r.get("summary"), dict) and isinstance(r.get("history"), list)
               for r in saved["runs"].values()):
        raise files.DamagedFile(path, "a run in it has no 'history' list and 'summary' mapping")
    return saved


def render_study(results: StudyResults, out: str) -> str:
    """Write ``README.md`` (tables, claims, time), the plots and ``results.json.gz`` into ``out``; returns the
    report text."""
    from fljax.runner.tables import render_plots, render_report

    text = render_report(results)
    files.write_text(os.path.join(out, "README.md"), text)
    render_plots(results, out)
    files.write_json(os.path.join(out, "results.json.gz"),
                     {"meta": results.meta, "cells": [dataclasses.asdict(c) for c in results.cells],
                      "runs": results.runs}, indent=None)
    return text


def claims_of(study: Study, results: StudyResults) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) from the study's ``claims: module:function``."""
    target = study.spec.get("claims")
    if not target:
        return []
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(results)


def results_from_file(study: Study, out: str, only: list[str] | None = None) -> StudyResults:
    """The results saved in ``out/results.json.gz`` (``--render``); without that file, the chosen studies' runs
    that have finished in ``out/runs/`` (a report of an interrupted study, naming what was not run)."""
    check_out(out)
    path = os.path.join(out, "results.json.gz")
    if not os.path.exists(path):
        return _results_from_runs(study, out, only, path)
    saved = _results_file(path)
    try:
        cells = [Cell(**c) for c in saved["cells"]]
    except TypeError:
        raise files.DamagedFile(path, "its 'cells' are not the cells of a study") from None
    return StudyResults(study, cells, saved["runs"], saved["meta"])

