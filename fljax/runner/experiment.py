"""The one path every experiment takes: points × seeds → runs → compiled programs → run directories.

:func:`run_points` runs any set of points (resolved :class:`~fljax.experiment.Experiment` s with labels), each for
its seeds: ``fljax run`` and
:func:`fljax.run` (one point), ``fljax sweep`` and :func:`fljax.sweep` (a grid), ``fljax compare`` (one point per
algorithm) and the paper reproductions (:mod:`fljax.runner.study`) all come here. Runs that can share a compiled
program do (:mod:`fljax.runner.plan`: seeds, trials and grid points as lanes of one vmapped program); each run writes
its own directory (:mod:`fljax.runner.results`), checkpoints itself (:mod:`fljax.runner.checkpoint`) and stops alone
when a guard fires (NaN/Inf, divergence), while its lanes' neighbours go on.

Safety (:func:`run_points` lists the guarantees): every directory is locked while a run owns it
(:mod:`fljax.runner.lock`); everything is checked before anything is written; resuming (``resume=True``) refuses a
config that changes the simulation (:mod:`fljax.runner.resume`), restores every run's newest readable checkpoint and
cuts its metrics file back to the checkpoint's records; blocks of rounds end where the uninterrupted run's end, so
the continued run gives the same metrics and parameters bit for bit. A run whose ``summary.json`` says it completed
is reused as it is. Ctrl-C and SIGTERM checkpoint the runs and mark them 'interrupted'
(:mod:`fljax.runner.interrupt`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import re
import time
from typing import Any

import jax
import numpy as np

from fljax import tree
from fljax.config import RUNS_MAX, ConfigError, ExperimentConfig, to_dict
from fljax.engine import DivergenceGuard, Lanes, NonFiniteError, NonFiniteGuard, RunLog, RunResult, Simulation
from fljax.engine.lanes import can_batch
from fljax.engine.loop import drive
from fljax.engine.processes import agree, lead_only
from fljax.errors import OptionError
from fljax.experiment import Experiment, build, compare_points, privacy_of
from fljax.privacy import weighting_note
from fljax.runner import files, identity, interrupt, lock, stores
from fljax.runner.checkpoint import Checkpointer, CheckpointTimer
from fljax.runner.memory import check_fits
from fljax.runner.plan import Program, group_runs, traceable
from fljax.runner.plots import FORMATS, plot_compare, plot_heatmap, plot_run, setting
from fljax.runner.report import Output, distinct_table, summary_row
from fljax.runner.results import RunDir, aggregate_summaries, environment, evaluated, make_summary, sample_note
from fljax.runner.resume import check_resume
from fljax.runner.sweep import DataCache, grid_columns, grid_points, point_experiment, point_label, seed_list

__all__ = ["ExperimentResult", "Run", "run_points", "run_experiment", "compare_experiments", "sweep_experiments",
           "sweep_points", "dir_name",
           "saved_config", "saved_algorithms", "LANE_MODES"]

LANE_MODES = ("vmap", "map", "off")


@dataclasses.dataclass
class Run:
    """One lane: a point's experiment with one seed (``exp.seed``; ``seeds`` = 1), its directory and progress."""

    label: str | None
    exp: Experiment
    directory: RunDir
    data: Any = None
    state: Any = None
    log: RunLog = dataclasses.field(default_factory=RunLog)
    start: int = 0
    checkpointer: Checkpointer | None = None
    status: str = "pending"  # running | completed | stopped (a guard) | interrupted (a signal) | reused
    message: str | None = None
    result: RunResult | None = None
    summary: dict | None = None
    steps_per_round: int = 0
    facts: dict = dataclasses.field(default_factory=dict)  # model, num_params, executor (for summary.json)
    vectorised: bool = False  # ran as a lane of a program with others
    setup_seconds: float = 0.0  # building its data and simulation (in this process)
    environment: dict = dataclasses.field(default_factory=dict)  # results.environment of its simulation
    privacy: Any = None  # its fljax.privacy.Privacy on its data (None: none): ε after every evaluation

    def make_summary(self, status: str = "completed", message: str | None = None) -> dict:
        summary = make_summary(self.cfg, self.seed, self.log, self.steps_per_round, status, message, self.facts,
                               setup_seconds=self.setup_seconds, env=self.environment)
        summary["dataset"] = getattr(self.data, "name", None) or summary["dataset"]  # the user's own data's name
        if self.privacy is not None:
            summary["privacy"] = self.privacy.describe()
        return summary

    def account(self, record: dict) -> None:
        """Add ε after the record's round (``epsilon``, at the privacy's δ; dp-accounting on the host) to an
        evaluation record of a private run."""
        if self.privacy is not None and self.privacy.plan is not None:
            record["epsilon"] = self.privacy.epsilon(record["round"])

    @property
    def cfg(self) -> ExperimentConfig:
        return self.exp.config

    @property
    def seed(self) -> int:
        return self.exp.seed


@dataclasses.dataclass
class ExperimentResult:
    """One point (all its seeds): ``runs`` per seed, ``summary`` (summary.json at the point's top), ``vectorised``
    (every run was a lane of a program with other runs: its seeds, or other points of a grid), ``warnings`` (the
    algorithm's caveats about the models it trained: ``Algorithm.model_warning``)."""

    cfg: ExperimentConfig
    directory: RunDir
    runs: list[Run]
    summary: dict
    vectorised: bool
    warnings: tuple[str, ...] = ()

    @property
    def histories(self) -> list[list[dict]]:
        return [run.log.history for run in self.runs]

    @property
    def history(self) -> list[dict]:
        """The first seed's evaluation records."""
        return self.runs[0].log.history

    @property
    def final(self) -> dict:
        """The last evaluation record (one seed), or every final metric's mean over seeds (several)."""
        if len(self.runs) == 1:
            return self.history[-1] if self.history else {}
        return {k: v["mean"] for k, v in self.summary.get("final", {}).items()}

    @property
    def state(self):
        """The first seed's final state."""
        return self.runs[0].result.state if self.runs[0].result else None

    @property
    def stopped(self) -> list[Run]:
        return [run for run in self.runs if run.status == "stopped"]

    def to_frame(self):
        """Every seed's history as one pandas DataFrame: columns ``seed``, ``round`` and the metrics."""
        from fljax.frames import concat, history_frame

        return concat([history_frame(run.log.history, seed=run.seed) for run in self.runs])

    def __repr__(self) -> str:
        from fljax.frames import headline

        seeds = len(self.runs)
        where = f", directory={self.directory.path!r}" if self.directory.path else ""
        dataset = getattr(self.runs[0].data, "name", None) or self.cfg.data.dataset
        return (f"ExperimentResult({self.cfg.run_name} on {dataset}, {seeds} seed"
                f"{'s' if seeds > 1 else ''}: {headline(self.final)}{where})")

    def row(self, label: str | None = None) -> dict:
        row = summary_row(label or self.cfg.run_name, [run.summary for run in self.runs])
        row["client-steps/s"] = f"{self.summary['client_steps_per_second']:,.0f}"
        return row


DIR_NAME_MAX = 120  # characters of a run directory's name (file systems allow 255 bytes; this one is ASCII)


def dir_name(label: str) -> str:
    """A file-system friendly directory name for a run label such as ``fedprox(mu=0.1)``; a label longer than
    :data:`DIR_NAME_MAX` keeps its start and a hash of the whole (distinct labels stay distinct)."""
    name = re.sub(r"[^A-Za-z0-9_.=+,-]+", "_", label).strip("_.")
    if len(name) > DIR_NAME_MAX:
        digest = hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        name = f"{name[:DIR_NAME_MAX - 13]}-{digest}"
    return name or "run"


# ---------------------------------------------------------------------------------------------------- planning


def _point_dirs(points: list[tuple[str | None, Experiment]], root: RunDir, subdirs: bool) -> list[RunDir]:
    if not subdirs:
        return [root]
    names = [dir_name(label or exp.name) for label, exp in points]
    if len(set(names)) < len(names):
        raise ConfigError(f"two points would share a run directory ({sorted(n for n in names if names.count(n) > 1)[0]});"
                          f" give them distinct names.")
    return [root.child(n) for n in names]


def _runs_of(label, exp: Experiment, point_dir: RunDir) -> list[Run]:
    seeds = seed_list(exp.config)
    one = len(seeds) == 1
    return [Run(label, exp.with_seed(s), point_dir if one else point_dir.seed_dir(s)) for s in seeds]


class _Sims:
    """Simulations by program: runs with equal configs but for the seed (and traced keys) and the same data object
    share one, hence its compiled programs; it runs the first such run's algorithm object
    (:func:`fljax.experiment.build`). ``module``: the user's own Flax module (None: the experiment's model)."""

    def __init__(self, module=None):
        self._sims: dict = {}
        self.module = module

    def __call__(self, run: Run, traced: tuple = ()) -> Simulation:
        from fljax.runner.plan import _key

        key = (_key(run.cfg, set(traced)), id(run.data))
        if key not in self._sims:
            self._sims[key] = build(run.exp, run.data, self.module)
        return self._sims[key]


def _batchable(sims: _Sims):
    def check(runs: list[Run]) -> bool:
        datas = [r.data for r in runs]
        shared = all(d is datas[0] for d in datas)
        private = {None if r.privacy is None else r.privacy.program() for r in runs}  # equal but traced values
        return len(private) == 1 and can_batch(sims(runs[0]), None if shared else datas)

    return check


def _guards(cfg: ExperimentConfig) -> tuple:
    return (NonFiniteGuard(),) + ((DivergenceGuard(cfg.diverge_factor),) if cfg.diverge_factor else ())


# ---------------------------------------------------------------------------------------------------- running


def _x64(run):
    """``run`` in float64 when every point asks for it (:attr:`fljax.experiment.Experiment.x64`)."""
    def wrapped(points, *args, **kwargs):
        asked = {exp.x64 for _, exp in points}
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
      checkpoint's, or from round 0 when there is none (:func:`_restore_all`); a directory holding no run at all
      is refused unless ``missing_ok``;
    * a run's summary says 'completed' only once the final checkpoints of all the lanes it ran with are on disk;
    * SIGINT/SIGTERM (:mod:`fljax.runner.interrupt`): the runs finish their block of rounds, are checkpointed
      there, their summaries say 'interrupted', and :class:`~fljax.runner.interrupt.Interrupted` is raised.
    """
    if lanes not in LANE_MODES:
        raise ConfigError(f"lanes must be one of {list(LANE_MODES)}, got {lanes!r}.")
    output = output or Output()
    root = RunDir(out)
    dirs = _point_dirs(points, root, len(points) > 1 if subdirs is None else subdirs)
    runs_by_point = [_runs_of(label, exp, d) for (label, exp), d in zip(points, dirs)]
    all_runs = [run for runs in runs_by_point for run in runs]
    configs = _configs(root, root_config, points, dirs, runs_by_point)
    cache = data_cache or DataCache()
    made = identity.origin(cache.own, model)
    kinds = {d.path: kind if exp is None else "run" for d, _, exp in configs}
    part_of = _parts(dirs, runs_by_point, kind if root_config is not None else None)
    if out is not None:
        for d, cfg, _ in reversed(configs):  # the root first
            if os.path.isdir(d.path):
                identity.check_kind(d.path, kinds[d.path], "--resume" if resume else "--out", part_of.get(d.path))
                if resume:
                    identity.check_origin(d.path, made)
            if resume:
                check_resume(d.path, cfg)
    sims = _Sims(model)
    for run in all_runs:  # refuse a bad split, a model that does not fit the data or the memory before writing
        t0 = time.perf_counter()
        run.data = cache(run.exp, run.seed)
        sim = sims(run)
        run.privacy = privacy_of(run.exp, run.data)
        check_fits(sim)
        stores.check(run, sim, resume)
        run.steps_per_round = sim.work_per_round()[0]
        data_facts = getattr(run.data, "facts", None)  # data that report their own preparation (FedGiA's λ_max time)
        run.facts = {"model": getattr(sim.model, "name", None), "num_params": sim.model.num_params() if sim.model
                     else None, "executor": sim.executor.describe(), **evaluated(sim),
                     **(data_facts() if callable(data_facts) else {})}
        run.environment = environment(sim)
        run.setup_seconds = time.perf_counter() - t0
    with lock.hold([d.path for d, _, _ in configs]):
        _check_directories(root, [d for d, _, _ in configs], resume, missing_ok)
        if resume:
            _restore_all(all_runs, sims, output)
        if root_summary is not None:
            root.write_summary(root_summary)
        for d, cfg, exp in configs:  # the root's config.yaml last: once it exists, the directory can be resumed
            if exp is not None:
                d.write_resolved(_resolved(exp, model))
            identity.write(d.path, kinds[d.path], made, part_of.get(d.path),
                           **((listing or {}) if exp is None else {}))
            d.write_config(cfg)
        for run in all_runs:
            if run.status != "reused":
                run.directory.write_metrics(run.log.history)  # resumed: cut back to the checkpoint's records
        if points:
            label, exp = points[0]
            output.note(f"{label or exp.name}: {exp.algorithm.summary or exp.config.algorithm}"
                        + (f" (+{len(points) - 1} more points)" if len(points) > 1 else ""))
            output.note(f"  data: {all_runs[0].data.summary()}{sample_note(all_runs[0].facts)}; results in "
                        f"{root.path or '(not written)'}")
        for note in sorted({n for run in all_runs if (n := weighting_note(
                run.cfg.privacy, run.exp.algorithm.hyperparameters().get("weighting")))}):
            output.note(f"  {note}")
        warnings = [sorted({w for run in runs for w in sims(run).model_warnings}) for runs in runs_by_point]
        if kind != "comparison":  # a comparison's table notes them under their rows (distinct_table's caveats)
            for (label, exp), point_warnings in zip(points, warnings):
                for warning in point_warnings:
                    output.warn(f"{label or exp.config.run_name}: {warning}")
        with interrupt.graceful(output.warn) as stop:
            try:
                for run in all_runs:
                    if run.status != "reused" and run.cfg.checkpoint_every != 0 and out is not None:
                        run.checkpointer = Checkpointer(run.directory.checkpoints)
                _run_all(all_runs, sims, output, lanes, trace, stop)
            finally:
                _close_checkpointers(all_runs)
        return [_finish(label, exp.config, d, runs, output, plot_formats if plots else (), w)
                for (label, exp), d, runs, w in zip(points, dirs, runs_by_point, warnings)]


def _close_checkpointers(runs: list[Run]) -> None:
    """Close every run's checkpointer (its pending save finished); the first that failed to write is raised once
    all are closed (:class:`~fljax.runner.checkpoint.CheckpointError`)."""
    failed = None
    for run in runs:
        if run.checkpointer is not None:
            try:
                run.checkpointer.close()
            except OSError as e:
                failed = failed or e
            run.checkpointer = None
    if failed is not None:
        raise failed


def _resolved(exp: Experiment, module) -> dict:
    """What resolved.yaml records: :meth:`~fljax.experiment.Experiment.resolved`; with the user's own module, its
    class and fields instead of the model section (such a file documents the run; running it again needs the
    module)."""
    values = to_dict(exp.resolved())
    if module is not None:
        values["model"] = {"name": f"own: {type(module).__name__}", "module": repr(module)}
    return values


def _configs(root: RunDir, root_config, points, dirs, runs_by_point
             ) -> list[tuple[RunDir, ExperimentConfig, Experiment | None]]:
    """Every (directory, config, its experiment) this call writes a ``config.yaml`` (and but for the root a
    ``resolved.yaml``) for, inner directories first: each seed of a point with several, each point, the
    collection's root (no experiment: its config is the base the points were made from)."""
    configs = []
    for (_, exp), d, runs in zip(points, dirs, runs_by_point):
        configs += [(run.directory, run.cfg, run.exp) for run in runs] if len(runs) > 1 else []
        configs.append((d, exp.config, exp))
    return configs + ([(root, root_config, None)] if root_config is not None else [])


def _parts(dirs: list[RunDir], runs_by_point: list[list[Run]], collection: str | None) -> dict[str, str]:
    """The directories this call writes as parts of another, with that one's kind: every seed's of a point with
    several seeds (part of a run), every point's of a ``collection`` (a sweep, a comparison; None: the points are
    not one)."""
    parts = {}
    for d, runs in zip(dirs, runs_by_point):
        if len(runs) > 1:
            parts.update({run.directory.path: "run" for run in runs})
        if collection is not None:
            parts[d.path] = collection
    return parts


def _check_directories(root: RunDir, dirs: list[RunDir], resume: bool, missing_ok: bool) -> None:
    if root.path is None:
        return
    if resume and not missing_ok and not root.holds_config():
        raise ConfigError(f"--resume: {root.path!r} holds no run to continue (no config.yaml); start it without "
                          f"--resume.")
    held = next((d for d in dirs if d.holds_results()), None) if not resume else None
    if held is not None:
        raise ConfigError(f"run directory {held.path!r} already holds results (a checkpoint or a finished run); "
                          f"continue it with --resume or choose another --out.")


def _run_all(all_runs: list[Run], sims: _Sims, output: Output, lanes: str, trace: tuple, stop) -> None:
    """Run every run that is not reused, program by program (:func:`~fljax.runner.plan.group_runs`). A stop request
    (``stop``: SIGINT/SIGTERM) raises :class:`~fljax.runner.interrupt.Interrupted` once the program it arrived in has
    ended — also when that program was the last one and its runs completed: the signal is never dropped."""
    todo = [r for r in all_runs if r.status != "reused"]
    split: set[str] = set()
    while todo:
        if _agreed(stop):
            stop.check()
        programs = group_runs(todo, batchable=_batchable(sims), lanes=lanes, split=split, trace=set(trace))
        program = programs[0]
        if program.traced:
            sim, hp = sims(program.runs[0], program.traced), program.hps()[0]
            if traceable(sim, hp):  # a key reached Python control flow: its values become separate programs
                bad = [k for k in program.traced if traceable(sim, {k: hp[k]})] or list(program.traced)
                split |= set(bad)
                output.note(f"  {', '.join(bad)}: not a traceable value (Python branches on it or it sets a "
                            f"shape); one program per value")
                continue
        _execute(program, sims, output, lanes, stop)
        if any(r.status == "interrupted" for r in program.runs):
            stop.check()
        todo = [r for r in todo if all(r is not done for done in program.runs)]
    if _agreed(stop):  # a signal during the last block: the runs completed, and the caller (a study's next family)
        stop.check()  # stops


def _agreed(stop) -> bool:
    """Whether a stop was requested — in this process, or (on several processes) in any process of the group, which
    then all stop after the same block (:func:`fljax.engine.processes.agree`; the request is recorded here too)."""
    signum = agree(stop.signum or 0)
    if signum and not stop:
        stop.signum = signum
    return bool(signum)


def _restore_all(runs: list[Run], sims: _Sims, output: Output) -> None:
    """Reuse the completed runs; every other run continues from the newest round that all of them have a
    readable checkpoint of (none: round 0), so that they form the programs (lanes) of the uninterrupted call: a
    kill during a checkpoint write leaves some lanes one checkpoint behind the others, and lanes batched otherwise
    may differ in the last bits. Checkpoints after that round are deleted (the run writes them again)."""
    todo = [run for run in runs if not _reuse(run)]
    bound = None
    while len({_restore(run, sims(run), output, bound) for run in todo}) > 1:
        bound = min(run.start for run in todo)
    for run in todo:
        if run.directory.has_checkpoint():
            with Checkpointer(run.directory.checkpoints) as ck:
                ck.delete_after(run.start)


def completed(summary: dict, cfg: ExperimentConfig) -> bool:
    """Whether a run's summary says it completed: its ``rounds``, or (a ``stop:`` run) until its rule or cap fired."""
    return summary.get("status") == "completed" and (summary.get("rounds") == cfg.rounds or
                                                     (cfg.stop is not None and "stop" in summary))


def _reuse(run: Run) -> bool:
    """A run whose summary says it completed is kept as it is."""
    d = run.directory
    if d.holds_summary():
        summary = d.read_summary()
        if completed(summary, run.cfg):
            run.status, run.summary = "reused", summary
            run.log = RunLog(history=d.read_metrics())
            return True
    return False


def _restore(run: Run, sim: Simulation, output: Output, at_most: int | None = None) -> int:
    """Load the run's newest readable checkpoint of a round <= ``at_most`` (None: any round); without one it
    starts at round 0. Returns the start round. Reads only, except that a damaged checkpoint is moved aside."""
    d = run.directory
    run.state, run.log, run.start = None, RunLog(), 0
    if not d.has_checkpoint():
        return 0
    with Checkpointer(d.checkpoints) as ck:
        restored = ck.restore_newest(stores.template(run, sim), output.warn, at_most)
    if restored is None and at_most is None:
        raise ConfigError(f"--resume: no checkpoint in {d.checkpoints!r} can be read; move that directory away to "
                          f"start the run afresh.")
    if restored is None:
        return 0
    run.state, run.log = restored
    run.start = int(run.state.round)
    if run.start > run.cfg.rounds:
        raise OptionError("rounds", f"must be at least {run.start} to resume {d.path!r} (its checkpoint is of round "
                                    f"{run.start}), got {run.cfg.rounds}.")
    return run.start


def _execute(program: Program, sims: _Sims, output: Output, lanes_mode: str, stop) -> None:
    """Run the program's lanes to their config's ``rounds`` (one run: a plain run; several: :class:`Lanes`), or
    until ``stop`` is set (the runs are then 'interrupted')."""
    runs = program.runs
    cfg = runs[0].cfg
    sim = sims(runs[0], program.traced)
    if cfg.stop is not None:
        return _execute_until(program, sim, output, lanes_mode)
    timer = CheckpointTimer() if cfg.checkpoint_every is None else None

    def on_eval(i, record, state):
        run = runs[i]
        run.account(record)
        run.directory.write_metrics(run.log.history)
        output.event("eval", run=run.label or cfg.run_name, seed=run.seed, **record)
        if timer is not None and record["round"] < cfg.rounds and timer.due(record["round"]):
            on_checkpoint(i, state, run.log)  # (the last round is checkpointed below)

    def on_checkpoint(i, state, log):
        if runs[i].checkpointer is not None:
            runs[i].checkpointer.save(state, log)

    def on_stop(i, message):
        run = runs[i]
        run.status, run.message = "stopped", message
        run.summary = run.make_summary("stopped", message)
        run.directory.write_summary(run.summary)

    common = dict(checkpoint_every=cfg.checkpoint_every or 0, callback=on_eval, on_checkpoint=on_checkpoint,
                  on_stop=on_stop, guards=_guards(cfg), progress=output.progress and _bar_name(runs),
                  should_stop=lambda: _agreed(stop))
    for run in runs:
        run.status = "running"
    if len(runs) == 1 and not program.traced:
        run = runs[0]
        state = _initial(runs, sim, lambda: run.state if run.state is not None else stores.initial_state(run, sim))
        state, per_client, _ = drive(sim, state, [run.log], cfg.rounds, cfg.eval_every, lanes=False, **common)
        results = [RunResult(state, run.log.history, jax.device_get(per_client), sim.compile_seconds,
                             run.log.run_seconds)]
    else:
        datas = [r.data for r in runs]
        shared = all(d is datas[0] for d in datas)
        batch = Lanes(sim, [r.seed for r in runs], None if shared else datas, program.hps(), mode=lanes_mode)
        restored = [r.state for r in runs]
        states = _initial(runs, sim, lambda: batch.init() if restored[0] is None else tree.stack(restored))
        results, _ = batch.run(cfg.rounds, cfg.eval_every, states, [r.log for r in runs], **common)
    for run in runs:  # every lane's last checkpoint on disk before any of them says 'completed' (_restore_all)
        if run.checkpointer is not None:
            run.checkpointer.wait()
    for run, res in zip(runs, results):
        run.result, run.vectorised = res, len(runs) > 1
        if run.status == "stopped":
            continue
        reached = int(res.state.round)
        if reached == run.cfg.rounds:
            run.status, run.message = "completed", None
        else:
            run.status, run.message = "interrupted", f"stopped by {stop.name} after round {reached}"
        run.summary = run.make_summary(run.status, run.message)
        run.directory.write_summary(run.summary)


def _execute_until(program: Program, sim: Simulation, output: Output, lanes_mode: str) -> None:
    """Run the program's lanes until the config's stopping rule (``stop``) fires, or ``rounds`` rounds (or
    ``stop.max_iters`` local iterations) are done: :func:`fljax.engine.run_until`, one compiled loop (no
    checkpoints). Each run's metrics file holds the recorded metrics of rounds 0 … s (s: where it stopped, at the
    state its last record describes) and its summary the outcome (``stop``: rounds, iterations, converged,
    diverged) and ``init_seconds``, the compiled initial state's seconds (e.g. FedGiA's precomputation; lanes share
    them evenly, like ``run_seconds``); a run whose metrics became non-finite is 'stopped'."""
    from fljax.engine.stopping import Stopping, Tolerance, run_until

    runs, cfg = program.runs, program.runs[0].cfg
    rule = Tolerance(tol0=cfg.stop.tol, relative=cfg.stop.relative, metric=cfg.stop.metric, strict=cfg.stop.strict)
    sent = ("bytes_up", "bytes_down")  # per round; the records hold them summed up to their round, as drive's do
    stopping = Stopping(rule, max_rounds=cfg.rounds, max_iters=cfg.stop.max_iters,
                        track=(*cfg.stop.record, *sent))
    for run in runs:
        run.status = "running"
    if len(runs) == 1 and not program.traced:
        res, lane = run_until(sim, stopping, seed=runs[0].seed), (lambda value, i: value)
    else:
        datas = [r.data for r in runs]
        shared = all(d is datas[0] for d in datas)
        res = run_until(Lanes(sim, [r.seed for r in runs], None if shared else datas, program.hps(),
                              mode=lanes_mode), stopping)
        lane = lambda value, i: jax.tree.map(lambda x: x[i], value)  # noqa: E731
    for i, run in enumerate(runs):
        s = int(lane(res.rounds, i))
        history = {k: np.asarray(lane(res.history[k], i))[:s + 1] for k in stopping.recorded}
        for k in sent:  # the bytes of rounds 0 … r − 1 at record r
            history[k] = np.concatenate([[0.0], np.cumsum(history[k][:-1], dtype=np.float64)])
        run.log.history = [{"round": r, **{k: float(v[r]) for k, v in history.items()}} for r in range(s + 1)]
        run.log.bytes_up, run.log.bytes_down = (float(history[k][-1]) for k in sent)
        run.log.run_seconds, run.log.compile_seconds = res.seconds / len(runs), res.compile_seconds / len(runs)
        outcome = {"rounds": s, "iters": int(lane(res.iters, i)), "converged": bool(lane(res.converged, i)),
                   "diverged": bool(lane(res.diverged, i))}
        run.result = RunResult(lane(res.state, i), run.log.history, {}, sim.compile_seconds, run.log.run_seconds)
        run.vectorised = len(runs) > 1
        run.directory.write_metrics(run.log.history)
        output.event("eval", run=run.label or cfg.run_name, seed=run.seed, **run.log.history[-1])
        if outcome["diverged"]:
            run.status, run.message = "stopped", f"round {s}: a recorded metric is not finite ({cfg.stop.metric})"
        else:
            run.status = "completed"
            run.message = (f"converged at round {s}: {cfg.stop.metric} <= tol" if outcome["converged"] else
                           f"reached the cap (rounds: {cfg.rounds}, stop.max_iters: {cfg.stop.max_iters}) at round "
                           f"{s} before {cfg.stop.metric} <= tol")
        run.summary = {**run.make_summary(run.status, run.message), "init_seconds": res.init_seconds / len(runs),
                       "stop": outcome}
        run.directory.write_summary(run.summary)


def _bar_name(runs: list[Run]) -> str:
    """The name in front of a program's progress bar: its first run's label ('fedavg', 'lr=0.1,mu=0') with the
    number of the other points that run as its lanes, and its seeds when the experiment has several — 'lr=0.05,mu=0
    +3 more, seed 1': programs that split a sweep's seeds (each seed its own data) get names of their own."""
    labels = list(dict.fromkeys(run.label or run.cfg.run_name for run in runs))
    seeds = list(dict.fromkeys(run.seed for run in runs))
    name = labels[0] + (f" +{len(labels) - 1} more" if len(labels) > 1 else "")
    if runs[0].cfg.seeds == 1:
        return name
    return name + (f", seed {seeds[0]}" if len(seeds) == 1 else f", {len(seeds)} seeds" if len(seeds) ==
                   runs[0].cfg.seeds else f", seeds {', '.join(map(str, seeds))}")


def _initial(runs: list[Run], sim: Simulation, make):
    """``make()``: the runs' initial (or restored) state, its compile and wall seconds accounted to their logs."""
    t0, c0 = time.perf_counter(), sim.compile_seconds
    state = jax.block_until_ready(make())
    compile_s, wall = sim.compile_seconds - c0, time.perf_counter() - t0
    for run in runs:
        run.log.compile_seconds += compile_s
        run.log.loop_seconds += wall
    return state


def _finish(label, cfg: ExperimentConfig, d: RunDir, runs: list[Run], output: Output, plots: tuple[str, ...],
            warnings: list[str]) -> ExperimentResult:
    """Events, plots (in the formats ``plots`` names; none if empty) and the point's summary once all its runs are
    done; ``warnings``: the algorithm's caveats about the models it trained."""
    for run in runs:
        output.event("summary", run=label or cfg.run_name, **run.summary)
    vectorised = all(r.vectorised for r in runs)
    top = runs[0].summary if len(runs) == 1 else aggregate_summaries([r.summary for r in runs], vectorised)
    if len(runs) > 1:
        d.write_summary(top)
    if plots and d.path is not None and any(r.log.history for r in runs):
        title = f"{label or cfg.run_name}: {setting(cfg, runs[0].data)}"
        plot_run(d.path, [r.log.history for r in runs], [r.result.per_client if r.result else {} for r in runs],
                 title if len(runs) == 1 else f"{title}, {len(runs)} seeds", plots)
    return ExperimentResult(cfg, d, runs, top, vectorised, tuple(warnings))


def run_experiment(exp: Experiment, out: str | None, *, resume: bool = False, output: Output | None = None,
                   data_cache: DataCache | None = None, plots: bool = True, missing_ok: bool = False,
                   lanes: str = "vmap", model=None) -> ExperimentResult:
    """Run experiment ``exp`` (all its seeds) into run directory ``out`` (None: write nothing). Raises
    :class:`~fljax.engine.NonFiniteError`, after writing what it has, when a seed produced NaN/Inf or diverged.
    On several processes only process 0 writes (:func:`~fljax.engine.processes.lead_only`), here and in
    :func:`compare_experiments` and :func:`sweep_experiments`."""
    out = lead_only(out)
    result = run_points([(None, exp)], out, resume=resume, output=output, data_cache=data_cache, plots=plots,
                        missing_ok=missing_ok, lanes=lanes, model=model)[0]
    stopped = result.stopped
    if stopped:
        run = stopped[0]
        who = f"seed {run.seed}: " if len(result.runs) > 1 else ""
        raise NonFiniteError(f"{who}{run.message}; lower the learning rate (algo.lr) or check the other "
                             f"hyperparameters and the data.{_kept(run) if out else ''}")
    return result


def _kept(run: Run) -> str:
    """What a stopped run left on disk, e.g. ' Kept in runs/a: metrics.jsonl up to round 6 and the last good
    checkpoint (round 6).'"""
    history, kept = run.log.history, _last_checkpoint(run)
    metrics = f"metrics.jsonl up to round {history[-1]['round']}" if history else "no metrics"
    checkpoint = "no checkpoint" if kept is None else f"the last good checkpoint (round {kept})"
    return f" Kept in {run.directory.path}: {metrics} and {checkpoint}."


def _last_checkpoint(run: Run) -> int | None:
    if not run.directory.has_checkpoint():
        return None
    with Checkpointer(run.directory.checkpoints) as ck:
        return ck.latest_round()


def compare_experiments(cfg: ExperimentConfig, algorithms: list[str | tuple[str, dict]], out: str | None, *,
                        resume: bool = False, output: Output | None = None, plots: bool = True,
                        data_cache: DataCache | None = None, model=None
                        ) -> tuple[list[dict], dict[str, ExperimentResult]]:
    """Run every algorithm (a name, or (name, its own hyperparameters)) on the data, partition and seeds of the
    parsed config ``cfg`` into ``out/<label>/``; write the table (``compare.md``), ``compare.png`` and
    ``summary.json`` into ``out``. Every algorithm's experiment is resolved before anything runs
    (:func:`fljax.experiment.compare_points`: ``cfg.algo`` applies to the algorithms that declare its keys).
    Returns the table as ``compare.md`` holds it (Markdown, with its notes:
    :func:`~fljax.runner.report.distinct_table`) and the results by label."""
    out = lead_only(out)
    output = output or Output()
    root = RunDir(out)
    resolved = compare_points(cfg, algorithms)
    points = [(lbl, exp) for lbl, exp, _, _ in resolved]
    listing = [{"label": lbl, "algorithm": name, "hyperparameters": hyper} for lbl, _, name, hyper in resolved]
    with lock.hold([out]):
        results = _run_collection(points, cfg, {"algorithms": listing}, out, "comparison", resume=resume,
                                  output=output, plots=plots, data_cache=data_cache, model=model)
        return _compare_table(cfg, points, results, listing, root, plots)


def _compare_table(cfg, points, results, listing, root: RunDir, plots: bool):
    """The comparison's table (with its notes: :func:`~fljax.runner.report.distinct_table`), plot and summary."""
    from fljax.algorithms.families import family, untuned

    by_label = {lbl: r for (lbl, _), r in zip(points, results)}
    rows = [{**r.row(lbl), "status": _status(r)} for lbl, r in by_label.items()]
    title = (f"{setting(cfg, results[0].runs[0].data)}, {cfg.rounds} rounds, "
             f"{cfg.seeds} seed{'s' if cfg.seeds > 1 else ''}")
    hints = {lbl: text for lbl, exp in points if (text := untuned(exp.algorithm, cfg.rounds))}
    caveats = {lbl: f"{lbl}: {' '.join(r.warnings)}" for lbl, r in by_label.items() if r.warnings}
    table = distinct_table(rows, hints, caveats=caveats)
    root.write_text("compare.md", f"# {title}\n\n{table}\n")
    if plots and root.path is not None:
        plot_compare(root.file("compare.png"), {lbl: r.histories for lbl, r in by_label.items()}, title,
                     groups={a["label"]: family(a["algorithm"]) for a in listing})
    root.write_summary({"status": "completed", "algorithms": listing,
                        "results": {lbl: r.summary for lbl, r in by_label.items()}})
    return table, by_label


def sweep_experiments(cfg: ExperimentConfig, grid: dict[str, list], out: str | None, *, resume: bool = False,
                      output: Output | None = None, plots: bool = True, lanes: str = "vmap",
                      data_cache: DataCache | None = None, model=None
                      ) -> tuple[list[dict], dict[str, ExperimentResult]]:
    """Run every point of ``grid`` (dotted keys → values, :func:`~fljax.runner.sweep.grid_points`) on the parsed
    config ``cfg`` for its seeds into ``out/<point>/`` (every point resolved before anything runs); points that
    differ only in numeric hyperparameters are lanes of one program with the seeds. Writes ``sweep.md`` (the table:
    mean ± std over seeds; a column per grid key), ``sweep.png``, ``sweep_heatmap.png`` (two grid keys) and
    ``summary.json``. Returns the table as ``sweep.md`` holds it (Markdown, with its notes) and the results by
    point label; a point a guard stopped is marked 'stopped' in the table."""
    out = lead_only(out)
    output = output or Output()
    root = RunDir(out)
    own = [k for k in grid if k.split(".", 1)[0] in ("data", "server")] if data_cache and data_cache.own else []
    if own:
        raise ConfigError(f"--grid {own[0]}: the sweep runs on your own data ({data_cache.own.name!r}, "
                          f"{data_cache.own.num_clients} clients), which {own[0]} does not change (every point would "
                          f"run on the same data); sweep other keys, or build one data set per value and run each.")
    points = sweep_points(cfg, grid)
    trace = tuple(k.split(".", 1)[1] for k in grid if k.startswith("algo."))
    with lock.hold([out]):
        results = _run_collection(points, cfg, {"grid": grid}, out, "sweep", resume=resume, output=output,
                                  plots=plots, lanes=lanes, trace=trace, data_cache=data_cache, model=model)
        return _sweep_table(cfg, grid, points, results, root, plots)


def sweep_points(cfg: ExperimentConfig, grid: dict[str, list]) -> list[tuple[str, Experiment]]:
    """The (label, resolved experiment) of every point of ``grid`` on the parsed config ``cfg``; an empty grid, or
    one that would start more than :data:`~fljax.config.RUNS_MAX` runs with the seeds, is refused."""
    if not grid:
        raise ConfigError("a sweep needs a grid, e.g. --grid algo.lr=0.01,0.1.")
    count = math.prod(len(values) for values in grid.values())
    if count * cfg.seeds > RUNS_MAX:
        raise ConfigError(f"--grid gives {count:,} points × {cfg.seeds} seed(s) = {count * cfg.seeds:,} runs, more "
                          f"than the {RUNS_MAX:,} one command may start; sweep fewer values or seeds at a time.")
    base = to_dict(cfg)
    return [(point_label(values), point_experiment(base, values, name=point_label(values)))
            for values in grid_points(grid)]


def _sweep_table(cfg, grid, points, results, root: RunDir, plots: bool):
    """The sweep's table, plot and summary."""
    by_label = {lbl: r for (lbl, _), r in zip(points, results)}
    columns = grid_columns(grid)
    rows = []
    for (lbl, r), values in zip(by_label.items(), grid_points(grid)):  # a column per grid key, not the label
        row = {columns[k]: v for k, v in values.items()}
        row.update((k, v) for k, v in r.row(lbl).items() if k != "algorithm")
        row["status"] = _status(r)
        rows.append(row)
    title = (f"{cfg.algorithm} on {setting(cfg, results[0].runs[0].data)}, {len(points)} points × {cfg.seeds} "
             f"seed{'s' if cfg.seeds > 1 else ''}, {cfg.rounds} rounds")
    table = distinct_table(rows, names=list(by_label))
    root.write_text("sweep.md", f"# {title}\n\n{table}\n")
    if plots and root.path is not None:
        first = next(iter(columns.values()))
        plot_compare(root.file("sweep.png"), {lbl: r.histories for lbl, r in by_label.items()}, title,
                     groups={lbl: f"{first} = {row[first]}" for lbl, row in zip(by_label, rows)})
        if len(grid) == 2 and all(len(v) > 1 for v in grid.values()):  # a 2-D grid: the final accuracy as a heatmap
            shape = [len(v) for v in grid.values()]
            finals = {divmod(i, shape[1]): [run.log.history[-1]["personal_acc"] for run in r.runs
                                            if run.log.history and "personal_acc" in run.log.history[-1]]
                      for i, r in enumerate(by_label.values())}
            plot_heatmap(root.file("sweep_heatmap.png"), grid, finals, title)
    root.write_summary({"status": "completed", "grid": grid, "programs": _program_count(results),
                        "results": {lbl: r.summary for lbl, r in by_label.items()}})
    return table, by_label


def _status(result: ExperimentResult) -> str:
    """A collection's status column: 'completed', or 'stopped: <why>' when a guard stopped a seed (NaN/Inf,
    divergence: its numbers are those of the last good evaluation)."""
    return "stopped: " + result.stopped[0].message if result.stopped else "completed"


def _run_collection(points, cfg: ExperimentConfig, header: dict, out: str | None, kind: str,
                    **kwargs) -> list[ExperimentResult]:
    """Run a collection's points (a comparison, a sweep: ``kind``) under ``out/``: its root keeps ``cfg``, a
    ``directory.json`` with ``header`` and a summary of ``header`` with the status ('running', 'interrupted' when
    a signal stopped it; the caller writes 'completed')."""
    try:
        return run_points(points, out, subdirs=True, root_config=cfg, root_summary={"status": "running", **header},
                          plot_formats=("png",), kind=kind, listing=header, **kwargs)
    except interrupt.Interrupted:
        RunDir(out).write_summary({"status": "interrupted", **header})
        raise


def _program_count(results: list[ExperimentResult]) -> dict:
    runs = [run for r in results for run in r.runs]
    return {"runs": len(runs), "vectorised_runs": sum(run.vectorised for run in runs)}


def saved_config(directory: str, kind: str = "run") -> str:
    """The path of the resolved config a run directory was started with (for ``--resume``), after checking that
    the directory holds a ``kind`` (:func:`fljax.runner.identity.check_kind`)."""
    path = RunDir(directory).file("config.yaml")
    if os.path.isdir(directory):
        identity.check_kind(directory, kind)
    if not os.path.exists(path):
        raise ConfigError(f"--resume: {directory!r} is not a run directory (no config.yaml); pass the --out of the "
                          f"run to continue.")
    return path


def saved_grid(directory: str) -> dict[str, list]:
    """The grid of the sweep in ``directory`` (for ``--resume``)."""
    saved = identity.check_kind(directory, "sweep") if os.path.isdir(directory) else None
    if saved is None:
        raise ConfigError(f"--resume: {directory!r} holds no sweep (no config.yaml); pass the --out of the sweep to "
                          f"continue.")
    return identity.listing(saved, "grid", directory)


def saved_algorithms(directory: str) -> list[tuple[str, dict]]:
    """The algorithms (name, hyperparameters) of the comparison in ``directory`` (for ``--resume``)."""
    saved = identity.check_kind(directory, "comparison") if os.path.isdir(directory) else None
    if saved is None:
        raise ConfigError(f"--resume: {directory!r} holds no comparison (no config.yaml); pass the --out of the "
                          f"comparison to continue.")
    entries = identity.listing(saved, "algorithms", directory)
    if not all(isinstance(a, dict) and isinstance(a.get("algorithm"), str) and isinstance(a.get("hyperparameters"),
                                                                                          dict) for a in entries):
        raise files.DamagedFile(os.path.join(directory, identity.FILE), "its algorithms are not {algorithm, "
                                                                        "hyperparameters} entries")
    return [(a["algorithm"], a["hyperparameters"]) for a in entries]
