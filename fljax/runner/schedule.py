"""Scheduling: which runs form which compiled program, one :class:`~fljax.engine.Simulation` per program, and the
programs run one after another.

:class:`Schedule` groups runs into programs (:func:`fljax.runner.plan.group_runs`: seeds, trials and grid points as
lanes of one program) and splits a program whose traced key reaches Python control flow into one program per value
(:func:`fljax.runner.plan.traceable`). It plans the call's runs once before anything is written — so that every
program's simulation is built and checked to fit (:class:`Simulations`) while a refusal can still leave the
directories as they were — and again, after a resume restored them, for the runs still to run
(:meth:`Schedule.run`), handing each program to the execution (:func:`fljax.runner.execute.execute`). Before it
runs a program it asks for the next :data:`AHEAD` programs' compilations (:func:`fljax.runner.execute.prepare`):
they compile side by side in the background (:mod:`fljax.engine.compile_pool`) while the current one compiles and
runs, and a simulation's compiled programs are released once no program left needs them. Between programs it
honours a stop request (SIGINT/SIGTERM, agreed on by every process of a group:
:meth:`fljax.runner.interrupt.StopRequest.agreed`).
"""
from __future__ import annotations

import time

from fljax.engine import compile_pool
from fljax.engine.lanes import can_batch
from fljax.experiment import build
from fljax.runner.execute import execute, prepare
from fljax.runner.memory import check_fits
from fljax.runner.plan import Program, group_runs, lane_data, program_key, traceable
from fljax.runner.report import Output
from fljax.runner.results import environment, evaluated
from fljax.runner.runs import Built, Run

__all__ = ["Simulations", "Schedule", "AHEAD"]


def AHEAD() -> int:  # noqa: N802 - read like a constant
    """Programs whose compilation is asked for before the current one runs: the compile pool's workers, and one
    more so that a worker freed by a finished compilation finds the next waiting."""
    return compile_pool.workers() + 1


class Simulations:
    """The simulations of a call, one per compiled program: a program's runs share their experiment but for the
    seed and the traced keys (:func:`~fljax.runner.plan.program_key`) and their data object (or data of one shape:
    the simulation holds the first run's). Each is built from the first such run's experiment
    (:func:`fljax.experiment.build`: it runs that run's algorithm object), checked to fit in memory
    (:func:`fljax.runner.memory.check_fits`) and described once (:class:`~fljax.runner.runs.Built`). The
    simulation of an experiment serves every program whose first run has that experiment, whatever it traces.
    ``module``: the user's own Flax module (None: the experiment's model)."""

    def __init__(self, module=None):
        self._built: dict = {}
        self.module = module

    def __call__(self, run: Run, traced: tuple = ()) -> Built:
        """The simulation, with its facts, of ``run``'s experiment on its data with its privacy, in a program tracing
        ``traced``."""
        key, alone = (program_key(run.exp, set(traced)), id(run.data)), (program_key(run.exp), id(run.data))
        if key not in self._built:
            if alone not in self._built:  # (a simulation of this very experiment serves it traced too)
                self._built[alone] = self._build(run)
            self._built[key] = self._built[alone]
        return self._built[key]

    def _build(self, run: Run) -> Built:
        t0 = time.perf_counter()
        sim = build(run.exp, run.data, self.module, privacy=run.privacy)
        check_fits(sim)
        facts = {"model": getattr(sim.model, "name", None), "num_params": sim.model.num_params() if sim.model else None,
                 "executor": sim.executor.describe(), **evaluated(sim)}
        return Built(sim, facts, environment(sim), sim.work_per_round()[0], time.perf_counter() - t0)


class Schedule:
    """The programs of a call's runs. ``lanes``: how runs that can share a program run ('vmap', 'map', or 'off':
    every run its own program); ``trace``: algorithm keys traced even where every run has the same value (a sweep's
    grid keys); ``split``: the keys found untraceable (each of their values its own program)."""

    def __init__(self, sims: Simulations, lanes: str, trace: tuple[str, ...], output: Output):
        self.sims, self.lanes, self.trace, self.output = sims, lanes, set(trace), output
        self.split: set[str] = set()
        self._of: dict[Run, Built] = {}
        self._untraced: dict = {}  # (simulation, traced keys) -> the keys found untraceable (traced once each)

    def plan(self, runs: list[Run]) -> list[Program]:
        """The programs of ``runs``, every traced key checked traceable (else split and planned again), every
        program's simulation built; :meth:`of` then gives each run's."""
        while True:
            programs = group_runs(runs, batchable=self._batchable, lanes=self.lanes, split=self.split,
                                  trace=self.trace)
            bad = set().union(*(self._untraceable(p) for p in programs))
            if not bad:
                break
            self.split |= bad
            self.output.note(f"  {', '.join(sorted(bad))}: not a traceable value (Python branches on it or it sets "
                             f"a shape); one program per value")
        for program in programs:
            built = self.built(program)
            self._of.update((run, built) for run in program.runs)
        return programs

    def built(self, program: Program) -> Built:
        """The simulation that runs ``program``."""
        return self.sims(program.runs[0], program.traced)

    def of(self, run: Run) -> Built:
        """The simulation of ``run``'s program in the last plan."""
        return self._of[run]

    def _batchable(self, runs: list[Run], traced: tuple) -> bool:
        """Whether ``runs`` can be lanes of one program tracing ``traced``: one privacy program (equal but for traced
        values) and a simulation whose executor batches their data (:func:`fljax.engine.lanes.can_batch`)."""
        private = {None if r.privacy is None else r.privacy.program() for r in runs}
        sim = self.sims(runs[0], traced).sim
        return len(private) == 1 and can_batch(sim, lane_data(runs))

    def _untraceable(self, program: Program) -> set[str]:
        """The traced keys of ``program`` that reach Python control flow (:func:`~fljax.runner.plan.traceable`)."""
        if not program.traced:
            return set()
        sim, hp = self.built(program).sim, program.hps()[0]
        key = (id(sim), program.traced)
        if key not in self._untraced:
            self._untraced[key] = set() if not traceable(sim, hp) else (
                {k for k in program.traced if traceable(sim, {k: hp[k]})} or set(program.traced))
        return self._untraced[key]

    def run(self, runs: list[Run], output: Output, checkpoints, stop) -> None:
        """Run every run that is not reused, program by program, the next :func:`AHEAD` programs compiling in the
        background meanwhile. A stop request (``stop``: SIGINT/SIGTERM) raises
        :class:`~fljax.runner.interrupt.Interrupted` once the program it arrived in has ended — also when that program
        was the last one and its runs completed: the signal is never dropped; programs asked for and not begun are
        then dropped."""
        todo = [r for r in runs if r.progress.status != "reused"]
        count = 0  # the programs begun (a run's progress.program: the sweep summary counts the programs compiled)
        prepared: dict[tuple, tuple] = {}  # a program's runs -> (its lanes or None, the seconds spent asking for it)
        try:
            while todo:
                if stop.agreed():
                    stop.check()
                programs = self.plan(todo)
                for ahead in programs[:AHEAD()]:
                    ident = tuple(map(id, ahead.runs))
                    if ident not in prepared:
                        t0 = time.perf_counter()
                        lanes = prepare(ahead, self.built(ahead), self.lanes)
                        prepared[ident] = (lanes, time.perf_counter() - t0)
                program = programs[0]
                for r in program.runs:
                    r.progress.program = count
                count += 1
                lanes, seconds = prepared.pop(tuple(map(id, program.runs)))
                for run in program.runs:  # tracing it (before it ran) is part of its runs' compile time
                    run.progress.log.compile_seconds += seconds
                    run.progress.log.loop_seconds += seconds
                built = self.built(program)
                execute(program, built, output, self.lanes, checkpoints, stop, lanes)
                if any(r.progress.status == "interrupted" for r in program.runs):
                    stop.check()
                todo = [r for r in todo if all(r is not done for done in program.runs)]
                if all(self._of[r].sim is not built.sim for r in todo):
                    built.sim.release()  # no program left runs it: its compiled programs' memory is freed
            if stop.agreed():  # a signal during the last block: the runs completed, and the caller (a study's next
                stop.check()  # family) stops
        finally:
            for built in {id(b.sim): b for b in self._of.values()}.values():
                built.sim.cancel_pending()
