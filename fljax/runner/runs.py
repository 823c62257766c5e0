"""The run records: a run as its set-up made it (:class:`Run`, immutable), how far it has got (:class:`Progress`,
the one record that changes) and a point's runs as the caller gets them back (:class:`ExperimentResult`).

A run is one lane of the run layer: a point's resolved experiment for one seed, its directory, and what its set-up
built once — the data and the privacy on that data (:func:`fljax.runner.points.set_up`). The simulation that runs
it is its program's (:class:`Built`, one per compiled program). Scheduling, execution and resume read runs and write
only their :class:`Progress`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from fljax.config import ExperimentConfig
from fljax.engine import RunLog, RunResult
from fljax.experiment import Experiment, RunSettings
from fljax.runner.report import summary_row
from fljax.runner.results import RunDir, make_summary

__all__ = ["Run", "Progress", "Built", "ExperimentResult"]


@dataclasses.dataclass
class Progress:
    """How far a run has got. ``state``, ``log``, ``start``: where it goes on from (a restored checkpoint's state,
    log and round; else None, an empty log and round 0); ``status``: pending | running | completed | stopped (a
    guard: NaN/Inf, divergence) | interrupted (a signal) | reused (completed earlier, found on disk), ``message``
    why; ``result`` and ``summary`` once it has ended; ``vectorised``: it ran as a lane of a program with other
    runs; ``program``: which of its call's programs ran it (0, 1, …; None: not run in this call)."""

    state: Any = None
    log: RunLog = dataclasses.field(default_factory=RunLog)
    start: int = 0
    status: str = "pending"
    message: str | None = None
    result: RunResult | None = None
    summary: dict | None = None
    vectorised: bool = False
    program: int | None = None


@dataclasses.dataclass(frozen=True)
class Built:
    """A program's simulation (:class:`~fljax.engine.Simulation`, built once by
    :class:`fljax.runner.schedule.Simulations`) and what the summaries of its runs report of it: ``facts`` (model,
    parameter count, executor, the clients evaluated), ``environment`` (:func:`~fljax.runner.results.environment`),
    ``steps_per_round`` (client-steps of local training per round) and ``seconds`` (building and checking it)."""

    sim: Any
    facts: dict
    environment: dict
    steps_per_round: int
    seconds: float


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """One run: the experiment ``exp`` of point ``label`` for one seed (``exp.seed``; ``seeds`` = 1) in
    ``directory``, one of its point's ``point_seeds`` seeds, with what its set-up built: ``data`` and its own
    ``data_facts`` (e.g. FedGiA's λ_max seconds); ``privacy``, its :class:`fljax.privacy.Privacy` on that data
    (None: none; ε is reported after every evaluation); ``setup_seconds``, loading its data in this process.
    Compared by identity; its ``progress`` is the only part that changes."""

    label: str | None
    exp: Experiment
    directory: RunDir
    point_seeds: int
    data: Any
    privacy: Any = None
    data_facts: dict = dataclasses.field(default_factory=dict)
    setup_seconds: float = 0.0
    progress: Progress = dataclasses.field(default_factory=Progress)

    @property
    def cfg(self) -> ExperimentConfig:
        return self.exp.config

    @property
    def settings(self) -> RunSettings:
        return self.exp.settings

    @property
    def seed(self) -> int:
        return self.exp.seed

    @property
    def name(self) -> str:
        """How events and progress bars name it: its point's label, else the run name."""
        return self.label or self.cfg.run_name

    def make_summary(self, built: Built, lanes: int, status: str = "completed", message: str | None = None) -> dict:
        """``summary.json`` of the run as its progress stands (:func:`~fljax.runner.results.make_summary`), run by
        ``built`` as one of ``lanes`` lanes (which share its set-up seconds)."""
        summary = make_summary(self.cfg, self.seed, self.progress.log, built.steps_per_round, status, message,
                               {**built.facts, **self.data_facts}, env=built.environment,
                               setup_seconds=self.setup_seconds + built.seconds / lanes)
        summary["dataset"] = getattr(self.data, "name", None) or summary["dataset"]  # the user's own data's name
        if self.privacy is not None:
            summary["privacy"] = self.privacy.describe()
        return summary

    def account(self, record: dict) -> None:
        """Add ε after the record's round (``epsilon``, at the privacy's δ; dp-accounting on the host) to an
        evaluation record of a private run."""
        if self.privacy is not None and self.privacy.plan is not None:
            record["epsilon"] = self.privacy.epsilon(record["round"])


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
        return [run.progress.log.history for run in self.runs]

    @property
    def history(self) -> list[dict]:
        """The first seed's evaluation records."""
        return self.runs[0].progress.log.history

    @property
    def final(self) -> dict:
        """The last evaluation record (one seed), or every final metric's mean over seeds (several)."""
        if len(self.runs) == 1:
            return self.history[-1] if self.history else {}
        return {k: v["mean"] for k, v in self.summary.get("final", {}).items()}

    @property
    def state(self):
        """The first seed's final state."""
        result = self.runs[0].progress.result
        return result.state if result else None

    @property
    def stopped(self) -> list[Run]:
        return [run for run in self.runs if run.progress.status == "stopped"]

    @property
    def status(self) -> str:
        """A collection's status column: 'completed', or 'stopped: <why>' when a guard stopped a seed (NaN/Inf,
        divergence: its numbers are those of the last good evaluation)."""
        return "stopped: " + self.stopped[0].progress.message if self.stopped else "completed"

    def to_frame(self):
        """Every seed's history as one pandas DataFrame: columns ``seed``, ``round`` and the metrics."""
        from fljax.frames import concat, history_frame

        return concat([history_frame(run.progress.log.history, seed=run.seed) for run in self.runs])

    def __repr__(self) -> str:
        from fljax.frames import headline

        seeds = len(self.runs)
        where = f", directory={self.directory.path!r}" if self.directory.path else ""
        dataset = getattr(self.runs[0].data, "name", None) or self.cfg.data.dataset
        return (f"ExperimentResult({self.cfg.run_name} on {dataset}, {seeds} seed"
                f"{'s' if seeds > 1 else ''}: {headline(self.final)}{where})")

    def row(self, label: str | None = None) -> dict:
        row = summary_row(label or self.cfg.run_name, [run.progress.summary for run in self.runs])
        row["client-steps/s"] = f"{self.summary['client_steps_per_second']:,.0f}"
        return row
