"""Resuming: what ``--resume`` may change in a run directory's config, and where each run goes on from.

A resumed run continues the simulation its checkpoints hold, so everything that decides what is simulated must
stay as the directory's ``config.yaml`` says: the data (data set, clients, partition and its options, data seed,
test split), the model, the algorithm and every hyperparameter, the seed and the number of seeds. Only the keys of
:data:`MAY_CHANGE` may differ: how long the run goes (``rounds``), how often it evaluates and checkpoints, when
the divergence guard stops it, how the client axis is executed and the run's name. (Changing the evaluation or
checkpoint cadence, or the executor, keeps the results correct but may change their last bits.)

:func:`check_resume` compares every key, the algorithm's declared defaults filled in, and refuses the first that
differs, in one line naming it, before anything is written. :func:`restore_all` then, under the directories'
locks, reuses the runs that completed and restores every other one from its newest readable checkpoint.
"""
from __future__ import annotations

import os

from fljax.algorithms import ALGORITHMS
from fljax.algorithms.registry import defaults
from fljax.config import ExperimentConfig, load_config, nullable_sections, to_dict
from fljax.engine import RunLog
from fljax.errors import ConfigError, OptionError
from fljax.options import show
from fljax.runner.checkpoint import Checkpointer

__all__ = ["MAY_CHANGE", "check_resume", "flat", "restore_all", "completed"]

MAY_CHANGE = ("rounds", "eval_every", "checkpoint_every", "diverge_factor", "executor", "chunk_size", "name",
              "model.conv_impl")


def flat(cfg: ExperimentConfig) -> dict:
    """Every key of ``cfg`` as a dotted name → value, with the algorithm's declared defaults for the
    hyperparameters it does not set (so that ``lr`` left at its default equals ``lr`` given as that default)."""
    values = to_dict(cfg)
    algo = values.pop("algo")
    if cfg.algorithm in ALGORITHMS:
        algo = {**to_dict(defaults(ALGORITHMS[cfg.algorithm])), **algo}
    return {**_flatten(values), **{f"algo.{k}": v for k, v in algo.items()}}


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and key in ("data", "model", "privacy", "compression"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resume(directory: str, cfg: ExperimentConfig) -> None:
    """Refuse ``cfg`` for resuming the run in ``directory`` when it changes a key outside :data:`MAY_CHANGE`
    (no ``config.yaml`` there: nothing to compare, nothing refused)."""
    path = os.path.join(directory, "config.yaml")
    if not os.path.exists(path):
        return
    before = load_config(path)
    saved, new = flat(before), flat(cfg)
    if saved.get("privacy.target_epsilon") is not None and saved.get("rounds") != new.get("rounds"):
        raise ConfigError(f"--resume cannot change rounds ({saved.get('rounds')} in {path}, {new.get('rounds')} now) "
                          f"of a run whose noise is calibrated to privacy.target_epsilon over its rounds: the rounds "
                          f"already run used that noise; start a new run (another --out) for another length.")
    for key in sorted(nullable_sections()):  # a section added or removed: named as a whole, not by a key of it
        was, now = getattr(before, key), getattr(cfg, key)
        if (was is None) != (now is None):
            raise ConfigError(f"--resume cannot {'add' if was is None else 'remove'} {key} ("
                              f"{'null' if was is None else 'set'} in {path}, {'set' if was is None else 'null'} "
                              f"now): it changes the simulation the checkpoints hold; start a new run (another "
                              f"--out) {'with' if was is None else 'without'} {key}.")
    for key in sorted(saved.keys() | new.keys(), key=_order):
        if key not in MAY_CHANGE and saved.get(key) != new.get(key):
            raise ConfigError(f"--resume cannot change {key} ({_shown(saved, key)} in {path}, {_shown(new, key)} "
                              f"now): it changes the simulation the checkpoints hold. A resume may change only "
                              f"{', '.join(MAY_CHANGE)}; start a new run (another --out) to change {key}.")


def _order(key: str) -> tuple:
    """Report the most telling key first: the algorithm before its hyperparameters, data and model before the
    rest."""
    first = ("algorithm", "seeds", "seed")
    return (first.index(key) if key in first else len(first), key)


def _shown(values: dict, key: str) -> str:
    return show(values[key]) if key in values else "unset"


def completed(summary: dict, settings) -> bool:
    """Whether a run's summary says it completed: its ``rounds``, or (a ``stop:`` run) until its rule or cap fired
    (``settings``: the run's :class:`~fljax.experiment.RunSettings`)."""
    return summary.get("status") == "completed" and (summary.get("rounds") == settings.rounds or
                                                     (settings.stop is not None and "stop" in summary))


def restore_all(runs: list, state_shapes, warn) -> None:
    """Reuse the completed runs (:class:`~fljax.runner.runs.Run`); every other run continues from the newest round
    that all of them have a readable checkpoint of (none: round 0), so that they form the programs (lanes) of the
    uninterrupted call: a kill during a checkpoint write leaves some lanes one checkpoint behind the others, and
    lanes batched otherwise may differ in the last bits. Checkpoints after that round are deleted (the run writes
    them again). ``state_shapes(run)``: the structure to restore its state into; ``warn``: says what was moved
    aside."""
    todo = [run for run in runs if not _reuse(run)]
    bound = None
    while len({_restore(run, state_shapes, warn, bound) for run in todo}) > 1:
        bound = min(run.progress.start for run in todo)
    for run in todo:
        if run.directory.has_checkpoint():
            with Checkpointer(run.directory.checkpoints) as ck:
                ck.delete_after(run.progress.start)


def _reuse(run) -> bool:
    """A run whose summary says it completed is kept as it is."""
    d = run.directory
    if d.holds_summary():
        summary = d.read_summary()
        if completed(summary, run.settings):
            run.progress.status, run.progress.summary = "reused", summary
            run.progress.log = RunLog(history=d.read_metrics())
            return True
    return False


def _restore(run, state_shapes, warn, at_most: int | None = None) -> int:
    """Load the run's newest readable checkpoint of a round <= ``at_most`` (None: any round) into its progress;
    without one it starts at round 0. Returns the start round. Reads only, except that a damaged checkpoint is moved
    aside."""
    d, progress = run.directory, run.progress
    progress.state, progress.log, progress.start = None, RunLog(), 0
    if not d.has_checkpoint():
        return 0
    with Checkpointer(d.checkpoints) as ck:
        restored = ck.restore_newest(state_shapes(run), warn, at_most)
    if restored is None and at_most is None:
        raise ConfigError(f"--resume: no checkpoint in {d.checkpoints!r} can be read; move that directory away to "
                          f"start the run afresh.")
    if restored is None:
        return 0
    progress.state, progress.log = restored
    progress.start = int(progress.state.round)
    if progress.start > run.settings.rounds:
        raise OptionError("rounds", f"must be at least {progress.start} to resume {d.path!r} (its checkpoint is of "
                                    f"round {progress.start}), got {run.settings.rounds}.")
    return progress.start
