"""The one path every experiment takes: points × seeds → runs → compiled programs → run directories.

:func:`run_points` runs any set of points (resolved :class:`~fljax.experiment.Experiment` s with labels), each for
its seeds: ``fljax run`` and :func:`fljax.run` (one point, :func:`run_experiment`), ``fljax sweep`` and
``fljax compare`` (:mod:`fljax.runner.collection`) and the paper reproductions (:mod:`fljax.runner.study_run`) all
come here. The call is made of named parts:

* the directories (:mod:`fljax.runner.directories`): where each run is written, checked before anything is written;
* the set-up (:func:`set_up`): each run's data (built once per data set) and privacy on it, into an immutable
  :class:`~fljax.runner.runs.Run`;
* scheduling (:mod:`fljax.runner.schedule`): runs that can share a compiled program do (seeds, trials and grid
  points as lanes of one vmapped program, :mod:`fljax.runner.plan`), each program run by one simulation, built
  and checked to fit in memory before anything is written;
* resume (:mod:`fljax.runner.resume`): completed runs reused, the others restored from their checkpoints;
* execution (:mod:`fljax.runner.execute`): each program driven by its stopping rule, its evaluations, checkpoints
  and stops recorded by the callbacks of :mod:`fljax.runner.callbacks`; a guard (NaN/Inf, divergence) stops one
  run while its lanes' neighbours go on.

Safety (:func:`run_points` lists the guarantees): every directory is locked while a run owns it
(:mod:`fljax.runner.lock`); everything is checked before anything is written; resuming restores every run's newest
readable checkpoint and cuts its metrics file back to the checkpoint's records; blocks of rounds end where the
uninterrupted run's end, so the continued run gives the same metrics and parameters bit for bit. Ctrl-C and SIGTERM
checkpoint the runs and mark them 'interrupted' (:mod:`fljax.runner.interrupt`).
"""
from __future__ import annotations

import contextlib
import functools
import time

import jax

from fljax.config import ConfigError, ExperimentConfig
from fljax.engine import NonFiniteError
from fljax.engine.processes import lead_only
from fljax.experiment import Experiment, privacy_of
from fljax.privacy import delta_warning, weighting_note
from fljax.runner import identity, interrupt, lock, stores
from fljax.runner.callbacks import Checkpoints
from fljax.runner.checkpoint import Checkpointer
from fljax.runner.directories import Layout
from fljax.runner.plots import FORMATS
from fljax.runner.report import Output
from fljax.runner.results import RunDir, aggregate_summaries, sample_note
from fljax.runner.resume import restore_all
from fljax.runner.partition_plot import partition_counts
from fljax.runner.run_plots import plot_run, setting, shared_delta
from fljax.runner.runs import Built, ExperimentResult, Run
from fljax.runner.schedule import Schedule, Simulations
from fljax.runner.sweep import DataCache

__all__ = ["run_points", "run_experiment", "set_up", "LANE_MODES"]

LANE_MODES = ("vmap", "map", "off")


def _x64(run):
    """``run`` in float64 when every point asks for it (:attr:`fljax.experiment.RunSettings.x64`)."""
    def wrapped(points, *args, **kwargs):
        asked = {exp.settings.x64 for _, exp in points}
        if len(asked) > 1:
            raise ConfigError("x64: the points of one command must all run in float64 or all not.")
        with jax.enable_x64(True) if asked == {True} else contextlib.nullcontext():  # else as the user set jax
            return run(points, *args, **kwargs)

    return functools.wraps(run)(wrapped)


@_x64
def run_points(points: list[tuple[str | None, Experiment]], out: str | None, *, resume: bool = False,
               output: Output | None = None, data_cache: DataCache | None = None, plots: bool = True,
               missing_ok: bool = False, lanes: str = "vmap", subdirs: bool | None = None,
               trace: tuple[str, ...] = (), root_config: ExperimentConfig | None = None,
               root_summary: dict | None = None, model=None, plot_formats: tuple[str, ...] = FORMATS,
               kind: str = "run", listing: dict | None = None) -> list[ExperimentResult]:
    """Run every point for its seeds into ``out`` (one point: ``out`` is its directory; several, or ``subdirs``:
    ``out/<label>/``; ``out=None``: nothing is written). ``root_config`` and ``root_summary``: what a collection (a
    sweep, a comparison) keeps at ``out`` itself, checked and written with the runs' files. ``lanes``: how runs that
    can share a program run — 'vmap' (vectorised lanes), 'map' (one after another inside the program: bit-identical
    to separate runs of the traced program) or 'off' (separate programs); ``trace``: algorithm keys passed as
    traced values even when all runs agree on them (a sweep's grid keys). Runs a guard stops are reported in their
    summaries (status 'stopped' and the message); the caller decides what that means. ``plot_formats``: the files
    each run's plots are written as (a collection writes PNG only: a PDF costs twice a PNG's time, and a
    comparison's own figures are the ones kept as PDF). ``kind`` and ``listing``: what the collection's root is
    (``sweep`` with its ``grid``, ``comparison`` with its ``algorithms``; :mod:`fljax.runner.identity`), recorded
    in its ``directory.json`` as every point's and seed's directory records ``run``.

    What is guaranteed:

    * everything is checked before anything is written: the experiments (resolved, hence checked, by the caller),
      the data, and the directories' state (a refusal is a :class:`~fljax.config.ConfigError` and leaves the
      directories as they were);
    * every directory a ``config.yaml`` is written into is locked for the whole call (:mod:`fljax.runner.lock`):
      one owner at a time (a root that only holds the run directories, as a study's, is not: its workers share it);
    * every directory records its kind and origin (``directory.json``, :mod:`fljax.runner.identity`), and what it
      is part of (a seed of a run, a point of a sweep or comparison): one that holds another kind (a sweep where a
      run is asked for) is refused, and so is a part written on its own (a comparison's algorithm as a run: the
      comparison would be out of date), and, with ``resume``, one made with data or a model this call does not
      have (the user's own, which config.yaml does not describe);
    * without ``resume``, a directory holding results (a checkpoint, a completed or stopped run) is refused; one
      without (a run that died before its first checkpoint) is started afresh;
    * with ``resume``, a config that changes the simulation is refused (:mod:`fljax.runner.resume`); a completed
      run is reused as it is; the other runs continue from the newest round they all have a readable checkpoint of
      (a damaged newer one is moved aside with a warning; later ones are deleted), their metrics cut back to the
      checkpoint's, or from round 0 when there is none (:func:`~fljax.runner.resume.restore_all`); a directory
      holding no run at all is refused unless ``missing_ok``;
    * a run's summary says 'completed' only once the final checkpoints of all the lanes it ran with are on disk;
    * SIGINT/SIGTERM (:mod:`fljax.runner.interrupt`): the runs finish their block of rounds, are checkpointed
      there, their summaries say 'interrupted', and :class:`~fljax.runner.interrupt.Interrupted` is raised.
    """
    if lanes not in LANE_MODES:
        raise ConfigError(f"lanes must be one of {list(LANE_MODES)}, got {lanes!r}.")
    output = output or Output()
    layout = Layout.of(points, out, len(points) > 1 if subdirs is None else subdirs,
                       kind if root_config is not None else None, root_config)
    cache = data_cache or DataCache()
    made = identity.origin(cache.own, model)
    layout.check(resume, made)
    privacies: dict = {}  # resolved once per data set (and what else the accountant is given)
    runs_by_point = [[set_up(label, exp, d, len(seeds), cache, privacies) for exp, d in seeds]
                     for (label, _), seeds in zip(points, map(layout.seeds, range(len(points))))]
    runs = [run for point_runs in runs_by_point for run in point_runs]
    schedule = Schedule(Simulations(model), lanes, trace, output)
    schedule.plan(runs)  # every program's simulation built and checked to fit, before anything is written
    for run in runs:  # and every run's client-state store (fljax.runner.stores)
        stores.check(run, schedule.of(run).sim, resume)
    with lock.hold(layout.paths):
        layout.check_results(resume, missing_ok)
        if resume:
            restore_all(runs, lambda run: stores.template(run, schedule.of(run).sim), output.warn)
            if runs and all(run.progress.status == "reused" for run in runs):
                output.note(f"nothing to run: every run in {out} had completed; its results again:")
        if root_summary is not None:
            layout.root.write_summary(root_summary)
        layout.write(made, listing, model)
        for run in runs:
            if run.progress.status != "reused":
                run.directory.write_metrics(run.progress.log.history)  # resumed: cut back to the checkpoint's
        warnings = [sorted({w for run in point_runs for w in schedule.of(run).sim.model_warnings})
                    for point_runs in runs_by_point]
        _notes(points, runs, schedule.of(runs[0]) if runs else None, warnings, layout.root, output,
               warn_models=kind != "comparison")
        with interrupt.graceful(output.warn) as stop, Checkpoints(runs) as checkpoints:
            schedule.run(runs, output, checkpoints, stop)
        return [_finish(label, exp.config, d, point_runs, output, plot_formats if plots else (), w)
                for (label, exp), d, point_runs, w in zip(points, layout.dirs, runs_by_point, warnings)]


def set_up(label: str | None, exp: Experiment, directory: RunDir, point_seeds: int, cache: DataCache,
           privacies: dict) -> Run:
    """The :class:`~fljax.runner.runs.Run` of ``exp`` (one of its point's ``point_seeds`` seeds) in ``directory``:
    its data (``cache``: built once
    per data set) and its privacy on that data (``privacies``: resolved once per data set,
    :func:`fljax.experiment.privacy_of`). Refuses a bad split, or privacy the data cannot give, before anything is
    written."""
    t0 = time.perf_counter()
    data = cache(exp, exp.seed)
    privacy = privacy_of(exp, data, privacies)
    facts = getattr(data, "facts", None)  # data that report their own preparation (FedGiA's λ_max time)
    return Run(label, exp, directory, point_seeds, data, privacy, facts() if callable(facts) else {},
               time.perf_counter() - t0)


def _notes(points, runs: list[Run], first: Built | None, warnings: list[list[str]], root: RunDir, output: Output,
           warn_models: bool) -> None:
    """What the person sees before the runs start: the first point's algorithm and data (``first``: the simulation
    of the first run, whose evaluation sample it notes), where the results go, the privacy's weighting notes and
    (``warn_models``; a comparison notes them under its table's rows instead) the algorithm's caveats about the
    models it trains."""
    if points:
        label, exp = points[0]
        output.note(f"{label or exp.name}: {exp.algorithm.summary or exp.config.algorithm}"
                    + (f" (+{len(points) - 1} more points)" if len(points) > 1 else ""))
        output.note(f"  data: {runs[0].data.summary()}{sample_note(first.facts)}; results in "
                    f"{root.path or '(not written)'}")
    for note in sorted({n for run in runs if (n := weighting_note(
            run.cfg.privacy, run.exp.algorithm.hyperparameters().get("weighting")))}):
        output.note(f"  {note}")
    for warning in sorted({w for run in runs if run.privacy and (w := delta_warning(run.privacy.plan))}):
        output.warn(warning)
    if warn_models:
        for (label, exp), point_warnings in zip(points, warnings):
            for warning in point_warnings:
                output.warn(f"{label or exp.config.run_name}: {warning}")


def _finish(label, cfg: ExperimentConfig, d: RunDir, runs: list[Run], output: Output, plots: tuple[str, ...],
            warnings: list[str]) -> ExperimentResult:
    """Events, plots (in the formats ``plots`` names; none if empty) and the point's summary once all its runs are
    done; ``warnings``: the algorithm's caveats about the models it trained."""
    for run in runs:
        output.event("summary", run=label or cfg.run_name, **run.progress.summary)
    vectorised = all(r.progress.vectorised for r in runs)
    summaries = [r.progress.summary for r in runs]
    top = summaries[0] if len(runs) == 1 else aggregate_summaries(summaries, vectorised)
    if len(runs) > 1:
        d.write_summary(top)
    histories = [r.progress.log.history for r in runs]
    if plots and d.path is not None and any(histories):
        title = f"{label or cfg.run_name}: {setting(cfg, runs[0].data)}"
        plot_run(d.path, histories, [r.progress.result.per_client if r.progress.result else {} for r in runs],
                 title if len(runs) == 1 else f"{title}, {len(runs)} seeds", plots, partition_counts(runs[0].data),
                 shared_delta(runs))
    return ExperimentResult(cfg, d, runs, top, vectorised, tuple(warnings))


def run_experiment(exp: Experiment, out: str | None, *, resume: bool = False, output: Output | None = None,
                   data_cache: DataCache | None = None, plots: bool = True, missing_ok: bool = False,
                   lanes: str = "vmap", model=None) -> ExperimentResult:
    """Run experiment ``exp`` (all its seeds) into run directory ``out`` (None: write nothing). Raises
    :class:`~fljax.engine.NonFiniteError`, after writing what it has, when a seed produced NaN/Inf or diverged.
    On several processes only process 0 writes (:func:`~fljax.engine.processes.lead_only`), here and in the
    collections (:mod:`fljax.runner.collection`)."""
    out = lead_only(out)
    result = run_points([(None, exp)], out, resume=resume, output=output, data_cache=data_cache, plots=plots,
                        missing_ok=missing_ok, lanes=lanes, model=model)[0]
    stopped = result.stopped
    if stopped:
        run = stopped[0]
        who = f"seed {run.seed}: " if len(result.runs) > 1 else ""
        raise NonFiniteError(f"{who}{run.progress.message}; lower the learning rate (algo.lr) or check the other "
                             f"hyperparameters and the data.{_kept(run) if out else ''}")
    return result


def _kept(run: Run) -> str:
    """What a stopped run left on disk, e.g. ' Kept in runs/a: metrics.jsonl up to round 6 and the last good
    checkpoint (round 6).'"""
    history, kept = run.progress.log.history, _last_checkpoint(run)
    metrics = f"metrics.jsonl up to round {history[-1]['round']}" if history else "no metrics"
    checkpoint = "no checkpoint" if kept is None else f"the last good checkpoint (round {kept})"
    return f" Kept in {run.directory.path}: {metrics} and {checkpoint}."


def _last_checkpoint(run: Run) -> int | None:
    if not run.directory.has_checkpoint():
        return None
    with Checkpointer(run.directory.checkpoints) as ck:
        return ck.latest_round()
