"""Running a study (:mod:`fljax.runner.study`) and writing its report.

:func:`run_study` turns the chosen studies into runs — one per distinct (config, seed), shared by every cell that
needs it — and runs them through :func:`fljax.runner.points.run_points`, the path of ``fljax run``: run directories
under ``<out>/runs/``, checkpoints and resume, seeds and grid points as lanes of one program where shapes allow,
runs finished before an interruption reused, ``jobs`` worker processes. Then the report (``README.md``), the plots
and ``results.json.gz`` (every run's history) are written into ``out`` (:func:`render_study`, with the one renderer
:mod:`fljax.runner.tables`); :func:`results_from_file` reads them back (``--render``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

from fljax import yaml_io
from fljax.config import RUNS_MAX, ConfigError, ExperimentConfig, from_dict, to_dict
from fljax.experiment import Experiment, RunSettings, resolve
from fljax.runner import files, identity
from fljax.runner.directories import dir_name
from fljax.runner.plan import family_key
from fljax.runner.points import run_points
from fljax.runner.report import Output
from fljax.runner.results import RunDir
from fljax.runner.resume import completed
from fljax.runner.study import Cell, Study, StudyResults
from fljax.runner.tables import render_plots, render_report

__all__ = ["run_study", "render_study", "results_from_file", "check_out"]


def _run_dir_names(cells: list[Cell]) -> dict[str, str]:
    """A readable, unique directory name per run key: the first cell that needs it, and the seed."""
    names, used = {}, set()
    for c in cells:
        for s in c.seeds:
            key = c.key(s)
            if key in names:
                continue
            base = ".".join([c.study] + [str(v) for v in c.labels.values()]) + f".s{s}"
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


def _families(keys: list[str], experiments: dict[str, Experiment], grid_lanes: bool = False) -> list[list[str]]:
    """Runs grouped by config without seed (those that may share a compiled program); with ``grid_lanes`` (the study
    file's ``grid_lanes: true``) by what their program is made of but for the values it may trace
    (:func:`fljax.runner.plan.family_key`: algorithm hyperparameters, a rule's or an attack's numeric options), so
    that grid points and cells differing only there run as lanes of one program, as a sweep's do."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        if grid_lanes:
            groups.setdefault(family_key(experiments[key]), []).append(key)
            continue
        values = to_dict(experiments[key].config)
        values.pop("seed")
        groups.setdefault(json.dumps(values, sort_keys=True, default=str), []).append(key)
    return list(groups.values())


def _run_some(root: str, items: list[tuple[str, Experiment]], lanes: str, progress: bool) -> float:
    """Run these (dir name, experiment) in ``root``; returns the wall seconds (a worker's job: experiments are
    plain frozen values, sent to a worker process as they are)."""
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
            if key not in recorded and not _completed(os.path.join(root, names[key]), experiments[key].settings)]
    output.note(f"{study.title}: {len(cells)} cells, {len(names)} runs ({len(names) - len(todo)} already done), "
                f"{jobs} job(s); results in {out}")
    t0 = time.perf_counter()
    identity.write(out, "study", study=study.name)
    families = _families(todo, experiments, bool(study.spec.get("grid_lanes")))
    work = [[(names[k], experiments[k]) for k in fam] for fam in families]
    if jobs <= 1 or len(work) <= 1:  # one call (per float width): its programs compile side by side, ahead of
        for x64 in sorted({exp.settings.x64 for items in work for _, exp in items}, key=str):  # the runs
            _run_some(root, [item for items in work for item in items if item[1].settings.x64 == x64], lanes,
                      output.progress)
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


def _results_from_runs(study: Study, out: str, only: list[str] | None, path: str) -> StudyResults:
    cells = study.cells(only)
    experiments, names = _experiments(cells), _run_dir_names(cells)
    runs = {}
    for key, name in names.items():
        d = RunDir(os.path.join(out, "runs", name))
        saved = d.file("config.yaml")
        if (os.path.exists(saved) and _same_settings(yaml_io.load(open(saved, "rb")), experiments[key].config)
                and _completed(d.path, experiments[key].settings)):  # a run of other settings is not this cell's
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


def _completed(path: str, settings: RunSettings) -> bool:
    d = RunDir(path)
    return d.holds_summary() and _finished(d.read_summary(), settings)


def _finished(summary: dict, settings: RunSettings) -> bool:
    """Completed (its rounds, or until its stopping rule fired) or stopped by a guard."""
    return summary.get("status") == "stopped" or completed(summary, settings)


def _recorded_runs(out: str, experiments: dict[str, Experiment]) -> dict[str, dict]:
    """The finished runs that ``out/results.json.gz`` records (history and summary) for these run keys: a committed
    report keeps its runs when its run directories (not committed) are gone, so adding cells reruns nothing."""
    path = os.path.join(out, "results.json.gz")
    if not os.path.exists(path):
        return {}
    saved = _results_file(path)["runs"]
    return {key: run for key, run in saved.items()
            if key in experiments and _finished(run["summary"], experiments[key].settings)}


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
    text = render_report(results)
    files.write_text(os.path.join(out, "README.md"), text)
    render_plots(results, out)
    files.write_json(os.path.join(out, "results.json.gz"),
                     {"meta": results.meta, "cells": [dataclasses.asdict(c) for c in results.cells],
                      "runs": results.runs}, indent=None)
    return text


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
