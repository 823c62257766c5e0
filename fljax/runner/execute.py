"""Execution: one program's runs driven to their end, their summaries written.

The program's runs are its lanes: one run alone is a plain run of the simulation, several (or a traced grid) one
:class:`~fljax.engine.Lanes` (:func:`lanes_of`, the one place lanes are set up). How far they go is the experiment's
stopping rule, a strategy chosen by :func:`strategy`:

* :class:`FixedRounds` — ``rounds`` rounds in blocks between evaluations and checkpoints
  (:func:`fljax.engine.loop.drive`): guards stop a lane alone, a stop request ends every lane at a block end, the
  callbacks of :mod:`fljax.runner.callbacks` record evaluations, checkpoints and stops;
* :class:`UntilStopped` — a ``stop:`` rule (consensus regression): one compiled loop until the rule fires or the cap
  (:func:`fljax.engine.run_until`), no checkpoints.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from fljax import tree
from fljax.experiment import RunSettings
from fljax.engine import DivergenceGuard, Lanes, NonFiniteGuard, RunResult, Simulation
from fljax.engine.loop import block_capacity, drive, wait_compiling
from fljax.runner.callbacks import Checkpoints, RecordEvaluation, RecordStop, SaveCheckpoint
from fljax.runner import stores
from fljax.runner.checkpoint import CheckpointTimer
from fljax.runner.plan import Program, lane_data
from fljax.runner.report import Output
from fljax.runner.runs import Built, Run

__all__ = ["execute", "prepare", "strategy", "FixedRounds", "UntilStopped", "lanes_of", "bar_name"]


def execute(program: Program, built: Built, output: Output, lanes_mode: str, checkpoints: Checkpoints,
            stop, lanes: Lanes | None = None) -> None:
    """Run the program's runs with its simulation (``built``) to the end their experiment's stopping rule sets
    (:func:`strategy`), or until ``stop`` (a :class:`~fljax.runner.interrupt.StopRequest`) is set, and write their
    summaries. ``lanes``: the program's lanes that :func:`prepare` made (None: made here, when it has lanes)."""
    for run in program.runs:
        run.progress.status = "running"
    lanes = lanes or lanes_of(program, built.sim, lanes_mode)
    strategy(program.runs[0].settings).run(program, built, lanes, output, checkpoints, stop)


def prepare(program: Program, built: Built, lanes_mode: str) -> Lanes | None:
    """Ask for the compilation of the program's initialisation, blocks of rounds and evaluation (traced now,
    compiled in the background: :meth:`fljax.engine.Simulation.request`), so that they compile while earlier
    programs run; returns its lanes (None: a plain run of the simulation). A program run until a stopping rule
    fires compiles its own loop when it runs."""
    lanes = lanes_of(program, built.sim, lanes_mode)
    settings = program.runs[0].settings
    if settings.stop is None and program.runs[0].progress.start < settings.rounds:
        (lanes or built.sim).prepare(block_capacity(settings.rounds, settings.eval_every,
                                                    settings.checkpoint_every or 0))
    return lanes


def strategy(settings: RunSettings):
    """How far a program's runs go: :class:`UntilStopped` with a ``stop:`` rule, else :class:`FixedRounds`."""
    return FixedRounds() if settings.stop is None else UntilStopped()


def lanes_of(program: Program, sim: Simulation, mode: str) -> Lanes | None:
    """The program's runs as lanes of ``sim`` (their seeds, their data unless they share it, the traced values;
    ``mode``: 'vmap' or 'map'), or None for one run without traced values (a plain run of ``sim``)."""
    runs = program.runs
    if len(runs) == 1 and not program.traced:
        return None
    return Lanes(sim, [r.seed for r in runs], lane_data(runs), program.hps(), mode=mode)


class FixedRounds:
    """Drive the lanes to their config's ``rounds`` (:func:`fljax.engine.loop.drive`, blocks of rounds between
    evaluations and checkpoints); a run ends 'completed', 'stopped' (a guard) or 'interrupted' (``stop``)."""

    def run(self, program: Program, built: Built, lanes: Lanes | None, output: Output, checkpoints: Checkpoints,
            stop) -> None:
        runs, sim = program.runs, built.sim
        cfg = runs[0].settings
        checkpoint = SaveCheckpoint(runs, checkpoints)
        on_eval = RecordEvaluation(runs, output, checkpoint, CheckpointTimer() if cfg.checkpoint_every is None
                                   else None)
        common = dict(checkpoint_every=cfg.checkpoint_every or 0, callback=on_eval, on_checkpoint=checkpoint,
                      on_stop=RecordStop(runs, built), guards=_guards(cfg), progress=output.progress and bar_name(runs),
                      should_stop=stop.agreed)
        def ready():  # with a progress bar: "compiling …" until the programs prepare() asked for are ready
            if output.progress:
                wait_compiling(lanes or sim, common["progress"])

        if lanes is None:
            run = runs[0]
            state = _initial(runs, sim, lambda: ready() or (run.progress.state if run.progress.state is not None
                                                            else stores.initial_state(run, sim)))
            state, per_client, _ = drive(sim, state, [run.progress.log], cfg.rounds, cfg.eval_every, lanes=False,
                                         **common)
            results = [RunResult(state, run.progress.log.history, jax.device_get(per_client), sim.compile_seconds,
                                 run.progress.log.run_seconds)]
        else:
            restored = [r.progress.state for r in runs]
            states = _initial(runs, sim, lambda: ready() or (lanes.init() if restored[0] is None
                                                             else tree.stack(restored)))
            results, _ = lanes.run(cfg.rounds, cfg.eval_every, states, [r.progress.log for r in runs], **common)
        checkpoints.wait(runs)  # every lane's last checkpoint on disk before any of them says 'completed'
        for run, res in zip(runs, results):
            progress = run.progress
            progress.result, progress.vectorised = res, len(runs) > 1
            if progress.status == "stopped":
                continue
            reached = int(res.state.round)
            if reached == run.settings.rounds:
                progress.status, progress.message = "completed", None
            else:
                progress.status, progress.message = "interrupted", f"stopped by {stop.name} after round {reached}"
            progress.summary = run.make_summary(built, len(runs), progress.status, progress.message)
            run.directory.write_summary(progress.summary)


class UntilStopped:
    """Run the lanes until the config's stopping rule (``stop``) fires, or ``rounds`` rounds (or ``stop.max_iters``
    local iterations) are done: :func:`fljax.engine.run_until`, one compiled loop (no checkpoints). Each run's
    metrics file holds the recorded metrics of rounds 0 … s (s: where it stopped, at the state its last record
    describes) and its summary the outcome (``stop``: rounds, iterations, converged, diverged) and
    ``init_seconds``, the compiled initial state's seconds (e.g. FedGiA's precomputation; lanes share them evenly,
    like ``run_seconds``); a run whose metrics became non-finite is 'stopped'."""

    SENT = ("bytes_up", "bytes_down")  # per round; the records hold them summed up to their round, as drive's do

    def run(self, program: Program, built: Built, lanes: Lanes | None, output: Output, checkpoints: Checkpoints,
            stop) -> None:
        from fljax.engine.stopping import Stopping, Tolerance, run_until

        runs, cfg, sim = program.runs, program.runs[0].settings, built.sim
        rule = Tolerance(tol0=cfg.stop.tol, relative=cfg.stop.relative, metric=cfg.stop.metric,
                         strict=cfg.stop.strict)
        stopping = Stopping(rule, max_rounds=cfg.rounds, max_iters=cfg.stop.max_iters,
                            track=(*cfg.stop.record, *self.SENT))
        if lanes is None:
            res, lane = run_until(sim, stopping, seed=runs[0].seed), (lambda value, i: value)
        else:
            res = run_until(lanes, stopping)
            lane = lambda value, i: jax.tree.map(lambda x: x[i], value)  # noqa: E731
        for i, run in enumerate(runs):
            self._record(run, stopping, res, lambda value: lane(value, i), len(runs), built, output)

    def _record(self, run: Run, stopping, res, lane, count: int, built: Built, output: Output) -> None:
        """One lane's history, outcome, status and summary from ``run_until``'s result ``res`` (``lane``: its
        part of a value; ``count`` lanes share the seconds)."""
        cfg, log, progress = run.settings, run.progress.log, run.progress
        s = int(lane(res.rounds))
        history = {k: np.asarray(lane(res.history[k]))[:s + 1] for k in stopping.recorded}
        for k in self.SENT:  # the bytes of rounds 0 … r − 1 at record r
            history[k] = np.concatenate([[0.0], np.cumsum(history[k][:-1], dtype=np.float64)])
        log.history = [{"round": r, **{k: float(v[r]) for k, v in history.items()}} for r in range(s + 1)]
        log.bytes_up, log.bytes_down = (float(history[k][-1]) for k in self.SENT)
        log.run_seconds, log.compile_seconds = res.seconds / count, res.compile_seconds / count
        outcome = {"rounds": s, "iters": int(lane(res.iters)), "converged": bool(lane(res.converged)),
                   "diverged": bool(lane(res.diverged))}
        progress.result = RunResult(lane(res.state), log.history, {}, built.sim.compile_seconds, log.run_seconds)
        progress.vectorised = count > 1
        run.directory.write_metrics(log.history)
        output.event("eval", run=run.name, seed=run.seed, **log.history[-1])
        if outcome["diverged"]:
            progress.status = "stopped"
            progress.message = f"round {s}: a recorded metric is not finite ({cfg.stop.metric})"
        else:
            progress.status = "completed"
            progress.message = (f"converged at round {s}: {cfg.stop.metric} <= tol" if outcome["converged"] else
                                f"reached the cap (rounds: {cfg.rounds}, stop.max_iters: {cfg.stop.max_iters}) at "
                                f"round {s} before {cfg.stop.metric} <= tol")
        progress.summary = {**run.make_summary(built, count, progress.status, progress.message),
                            "init_seconds": res.init_seconds / count, "stop": outcome}
        run.directory.write_summary(progress.summary)


def _guards(settings: RunSettings) -> tuple:
    return (NonFiniteGuard(),) + ((DivergenceGuard(settings.diverge_factor),) if settings.diverge_factor else ())


def _initial(runs: list[Run], sim: Simulation, make):
    """``make()``: the runs' initial (or restored) state, its compile and wall seconds accounted to their logs."""
    t0, c0 = time.perf_counter(), sim.compile_seconds
    state = jax.block_until_ready(make())
    compile_s, wall = sim.compile_seconds - c0, time.perf_counter() - t0
    for run in runs:
        run.progress.log.compile_seconds += compile_s
        run.progress.log.loop_seconds += wall
    return state


def bar_name(runs: list[Run]) -> str:
    """The name in front of a program's progress bar: its first run's label ('fedavg', 'lr=0.1,mu=0') with the
    number of the other points that run as its lanes, and its seeds when the experiment has several or the lanes
    hold several (a study's runs of one cell: each run an experiment of one seed) — 'lr=0.05,mu=0 +3 more, seed 1':
    programs that split a sweep's seeds (each seed its own data) get names of their own."""
    labels = list(dict.fromkeys(run.name for run in runs))
    seeds = list(dict.fromkeys(run.seed for run in runs))
    name = labels[0] + (f" +{len(labels) - 1} more" if len(labels) > 1 else "")
    every = runs[0].point_seeds  # (each run's own experiment has one seed)
    if every == 1 and len(seeds) == 1:
        return name
    return name + (f", seed {seeds[0]}" if len(seeds) == 1 else f", {len(seeds)} seeds" if len(seeds) == every
                   else f", seeds {', '.join(map(str, seeds))}")
