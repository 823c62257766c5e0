"""Scheduling: the runs of a call, program by program, each program run by its :class:`~fljax.engine.Simulation`.

:func:`run_programs` groups the runs that are still to run into compiled programs (:func:`fljax.runner.plan.
group_runs`: seeds, trials and grid points as lanes of one program), splits a program whose traced key reached
Python control flow into one program per value, and hands each program to the execution
(:func:`fljax.runner.execute.execute`). :class:`Simulations` holds the simulations, one per compiled program.
Between programs it honours a stop request (SIGINT/SIGTERM, agreed on by every process of a group:
:meth:`fljax.runner.interrupt.StopRequest.agreed`).
"""
from __future__ import annotations

from fljax.engine import Simulation
from fljax.engine.lanes import can_batch
from fljax.experiment import Experiment, build
from fljax.runner.execute import execute
from fljax.runner.plan import _key, group_runs, lane_data, traceable
from fljax.runner.report import Output
from fljax.runner.runs import Run

__all__ = ["Simulations", "batchable", "run_programs"]


class Simulations:
    """Simulations by program: runs with equal configs but for the seed (and traced keys) and the same data object
    share one, hence its compiled programs; it runs the first such run's algorithm object
    (:func:`fljax.experiment.build`). ``module``: the user's own Flax module (None: the experiment's model)."""

    def __init__(self, module=None):
        self._sims: dict = {}
        self.module = module

    def __call__(self, exp: Experiment, data, traced: tuple = ()) -> Simulation:
        """The simulation of ``exp`` on ``data`` with the algorithm keys ``traced`` passed as traced values."""
        key = (_key(exp.config, set(traced)), id(data))
        if key not in self._sims:
            self._sims[key] = build(exp, data, self.module)
        return self._sims[key]

    def of(self, run: Run, traced: tuple = ()) -> Simulation:
        """The simulation that runs ``run`` (in a program that traces ``traced``)."""
        return self(run.exp, run.data, traced)


def batchable(sims: Simulations):
    """Whether runs can be lanes of one program: one privacy program (equal but for traced values) and a
    simulation whose executor batches their data (:func:`fljax.engine.lanes.can_batch`)."""
    def check(runs: list[Run]) -> bool:
        private = {None if r.privacy is None else r.privacy.program() for r in runs}  # equal but traced values
        return len(private) == 1 and can_batch(sims.of(runs[0]), lane_data(runs))

    return check


def run_programs(runs: list[Run], sims: Simulations, output: Output, lanes: str, trace: tuple, checkpoints,
                 stop) -> None:
    """Run every run that is not reused, program by program (:func:`~fljax.runner.plan.group_runs`). A stop request
    (``stop``: SIGINT/SIGTERM) raises :class:`~fljax.runner.interrupt.Interrupted` once the program it arrived in has
    ended — also when that program was the last one and its runs completed: the signal is never dropped."""
    todo = [r for r in runs if r.progress.status != "reused"]
    split: set[str] = set()
    while todo:
        if stop.agreed():
            stop.check()
        program = group_runs(todo, batchable=batchable(sims), lanes=lanes, split=split, trace=set(trace))[0]
        if program.traced:
            sim, hp = sims.of(program.runs[0], program.traced), program.hps()[0]
            if traceable(sim, hp):  # a key reached Python control flow: its values become separate programs
                bad = [k for k in program.traced if traceable(sim, {k: hp[k]})] or list(program.traced)
                split |= set(bad)
                output.note(f"  {', '.join(bad)}: not a traceable value (Python branches on it or it sets a "
                            f"shape); one program per value")
                continue
        execute(program, sims.of(program.runs[0], program.traced), output, lanes, checkpoints, stop)
        if any(r.progress.status == "interrupted" for r in program.runs):
            stop.check()
        todo = [r for r in todo if all(r is not done for done in program.runs)]
    if stop.agreed():  # a signal during the last block: the runs completed, and the caller (a study's next family)
        stop.check()  # stops
