"""What the run loop calls back into the run layer (:func:`fljax.engine.loop.drive`): after an evaluation
(:class:`RecordEvaluation`), when a checkpoint is due (:class:`SaveCheckpoint`) and when a guard stops a lane
(:class:`RecordStop`). Each is called with the lane's index into the program's runs; the run's checkpoints are
written by :class:`Checkpoints`, the one owner of the call's checkpointers.
"""
from __future__ import annotations

import dataclasses

from fljax.runner.checkpoint import Checkpointer, CheckpointTimer
from fljax.runner.report import Output
from fljax.runner.runs import Built, Run

__all__ = ["Checkpoints", "RecordEvaluation", "SaveCheckpoint", "RecordStop"]


class Checkpoints:
    """The checkpointers of a call's runs: one per run that is not reused, writes into a directory and checkpoints
    (``checkpoint_every`` not 0). Used as a context: leaving it closes every checkpointer (its pending save
    finished), and the first that failed to write is raised once all are closed
    (:class:`~fljax.runner.checkpoint.CheckpointError`)."""

    def __init__(self, runs: list[Run]):
        self._open = {run: Checkpointer(run.directory.checkpoints) for run in runs
                      if run.progress.status != "reused" and run.settings.checkpoint_every != 0
                      and run.directory.path is not None}

    def save(self, run: Run, state, log) -> None:
        if run in self._open:
            self._open[run].save(state, log)

    def wait(self, runs: list[Run]) -> None:
        """Until the saves of ``runs`` are on disk."""
        for run in runs:
            if run in self._open:
                self._open[run].wait()

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(self, *exc) -> None:
        failed = None
        for checkpointer in self._open.values():
            try:
                checkpointer.close()
            except OSError as e:
                failed = failed or e
        self._open.clear()
        if failed is not None:
            raise failed


@dataclasses.dataclass
class SaveCheckpoint:
    """``(lane, state, log)``: checkpoint the lane's run at the end of a block (every ``checkpoint_every`` rounds,
    after the last round, and where a stop request ends the loop)."""

    runs: list[Run]
    checkpoints: Checkpoints

    def __call__(self, i: int, state, log) -> None:
        self.checkpoints.save(self.runs[i], state, log)


@dataclasses.dataclass
class RecordEvaluation:
    """``(lane, record, state)``: a lane's evaluation record — ε added for a private run, the run's metrics file
    rewritten, an ``eval`` event — and, for runs without ``checkpoint_every`` (a checkpoint when
    :class:`~fljax.runner.checkpoint.CheckpointTimer` says one is due), a checkpoint before the last round (the
    last round is checkpointed by :class:`SaveCheckpoint`)."""

    runs: list[Run]
    output: Output
    checkpoint: SaveCheckpoint
    timer: CheckpointTimer | None = None

    def __call__(self, i: int, record: dict, state) -> None:
        run = self.runs[i]
        run.account(record)
        run.directory.write_metrics(run.progress.log.history)
        self.output.event("eval", run=run.name, seed=run.seed, **record)
        if self.timer is not None and record["round"] < run.settings.rounds and self.timer.due(record["round"]):
            self.checkpoint(i, state, run.progress.log)


@dataclasses.dataclass
class RecordStop:
    """``(lane, message)``: a guard stopped the lane (NaN/Inf, divergence): its status 'stopped' with the message,
    and its summary written (its metrics end at the last good evaluation; ``built``: the program's simulation)."""

    runs: list[Run]
    built: Built

    def __call__(self, i: int, message: str) -> None:
        run = self.runs[i]
        run.progress.status, run.progress.message = "stopped", message
        run.progress.summary = run.make_summary(self.built, len(self.runs), "stopped", message)
        run.directory.write_summary(run.progress.summary)
