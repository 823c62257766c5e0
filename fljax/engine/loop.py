"""The run loop shared by one run and by lanes (seeds, trials, grid points run as one program).

Rounds run in blocks (:func:`block_schedule`) between evaluations and checkpoints. After each block every *guard*
inspects every live lane: a lane whose block produced NaN/Inf (:class:`NonFiniteGuard`) or whose training loss blew
up (:class:`DivergenceGuard`) stops, before anything of the bad block is recorded or checkpointed, while the other
lanes go on (a diverging learning rate in a grid does not end its neighbours). A :class:`RunLog` per lane holds what
it has measured; it is part of a checkpoint, so a resumed run continues it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

__all__ = ["RunLog", "NonFiniteError", "NonFiniteGuard", "DivergenceGuard", "block_schedule", "drive",
           "DEFAULT_DIVERGE_FACTOR"]

DEFAULT_DIVERGE_FACTOR = 1e3
# per-round metrics an evaluation record reports as of its last round (a state, not a mean over the block): the upload
# pipeline's clip norm C_t of that round and the fraction of its updates within C_t (fljax.privacy)
LAST_ROUND = ("clip_norm", "unclipped_fraction")
# per-round metrics an evaluation record reports as their mean over the block's rounds, as the training loss: the
# clients whose update counted (fljax.participation's systems), the mean staleness of an asynchronous server step, and
# under an attack the malicious uploads of a round and their share of the aggregate (fljax.aggregation)
BLOCK_MEAN = ("train_loss", "clients_reported", "staleness", "malicious_uploads", "malicious_share")
# per-round metrics summed up to each record, as the bytes are: the virtual clock's round durations (seconds) and the
# rounds in which nobody reported (fljax.participation); a record has them only when the rounds report them
CUMULATIVE = {"round_time": "virtual_time", "round_skipped": "skipped_rounds"}


class NonFiniteError(FloatingPointError):
    """Training produced NaN or Inf, or diverged."""


@dataclasses.dataclass
class RunLog:
    """What a run has measured so far: one record per evaluation (the first at round 0, the initial model), the
    cumulative communication, the initial model's loss (the divergence guard's reference) and its seconds:
    ``run_seconds`` running rounds and evaluations (compilation apart), ``compile_seconds`` tracing and compiling,
    ``loop_seconds`` the whole run loop (those two, plus checkpoints, result files, host transfers, progress)."""

    history: list = dataclasses.field(default_factory=list)
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    run_seconds: float = 0.0
    compile_seconds: float = 0.0
    initial_loss: float | None = None
    loop_seconds: float = 0.0
    totals: dict = dataclasses.field(default_factory=dict)  # the CUMULATIVE record keys so far

    def add_block(self, metrics: dict, seconds: float, compile_seconds: float):
        """Account one block of rounds (``metrics``: per-round arrays on the host)."""
        self.bytes_up += float(np.sum(metrics.get("bytes_up", 0.0)))
        self.bytes_down += float(np.sum(metrics.get("bytes_down", 0.0)))
        for key, total in CUMULATIVE.items():
            if key in metrics:
                if total not in self.totals:  # the records so far (the initial model's) had none yet
                    for record in self.history:
                        record.setdefault(total, 0.0)
                self.totals[total] = self.totals.get(total, 0.0) + float(np.sum(metrics[key], dtype=np.float64))
        self.run_seconds += seconds
        self.compile_seconds += compile_seconds

    def add_initial(self, summary: dict, seconds: float, compile_seconds: float) -> dict:
        """The round-0 record: the initial model's evaluation (no training, nothing communicated yet)."""
        losses = [float(summary[k]) for k in ("personal_loss", "global_loss") if k in summary]
        self.initial_loss = losses[0] if losses else None
        self.run_seconds += seconds
        self.compile_seconds += compile_seconds
        return self.add_record(0, {}, summary)

    def add_record(self, round_: int, metrics: dict, summary: dict) -> dict:
        """The evaluation record after round ``round_`` (``metrics``: the last block's per-round arrays): the
        evaluation, the block's means of :data:`BLOCK_MEAN` (the training loss), the :data:`LAST_ROUND` metrics of
        its last round, the cumulative bytes, :data:`CUMULATIVE` totals (virtual time) and seconds."""
        order = sorted(summary, key=lambda k: (not k.startswith("personal"), k))  # personalized first
        record = {"round": round_, **{k: float(summary[k]) for k in order}}
        record.update({k: float(np.mean(metrics[k])) for k in BLOCK_MEAN if metrics.get(k) is not None})
        record.update({k: float(np.ravel(metrics[k])[-1]) for k in LAST_ROUND if k in metrics})
        record.update(bytes_up=self.bytes_up, bytes_down=self.bytes_down, **self.totals, run_seconds=self.run_seconds)
        self.history.append(record)
        return record

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict) -> "RunLog":
        return cls(**values)


def block_schedule(start: int, rounds: int, eval_every: int, checkpoint_every: int = 0):
    """The blocks of rounds from ``start`` to ``rounds``: ``(size, evaluate, checkpoint)`` triples. A block ends at
    every multiple of ``eval_every`` (evaluate), of ``checkpoint_every`` (checkpoint; 0: never) and at ``rounds``
    (both). The ends depend only on these numbers, never on ``start``, so a resumed run uses the same blocks."""
    r = start
    while r < rounds:
        ends = [rounds, (r // eval_every + 1) * eval_every]
        if checkpoint_every:
            ends.append((r // checkpoint_every + 1) * checkpoint_every)
        end = min(ends)
        yield end - r, end % eval_every == 0 or end == rounds, bool(
            checkpoint_every and end % checkpoint_every == 0) or end == rounds
        r = end


class NonFiniteGuard:
    """Stops a lane whose block produced NaN/Inf in a per-round metric, the parameters or an evaluation loss."""

    def __call__(self, metrics: dict, summary: dict | None, start: int, log: RunLog) -> str | None:
        finite = np.asarray(metrics["finite"])
        if finite.all():
            bad_eval = [k for k, v in (summary or {}).items() if k.endswith("_loss") and not np.isfinite(v)]
            if not bad_eval:
                return None
            what = ", ".join(f"{k}={float(summary[k])}" for k in bad_eval)
            return f"round {start + finite.size} produced NaN/Inf in the evaluation ({what})"
        i = int(np.argmin(finite))
        names = [f"{k}={float(np.ravel(v)[i]):.4g}" for k, v in sorted(metrics.items())
                 if not k.startswith("finite") and not np.isfinite(np.ravel(v)[i])]
        if not np.ravel(metrics.get("finite_params", finite))[i]:
            names.append("the model parameters")
        return f"round {start + i + 1} produced NaN/Inf in {' and '.join(names)}"


@dataclasses.dataclass(frozen=True)
class DivergenceGuard:
    """Stops a lane whose training loss rises above ``factor`` × max(the initial model's loss, 1): the run diverged
    even where no NaN appeared (a learning rate of 10⁶ gives a finite loss of 10³⁰ and chance accuracy)."""

    factor: float = DEFAULT_DIVERGE_FACTOR

    def __call__(self, metrics: dict, summary: dict | None, start: int, log: RunLog) -> str | None:
        if "train_loss" not in metrics or log.initial_loss is None:
            return None
        losses = np.ravel(metrics["train_loss"])
        limit = self.factor * max(log.initial_loss, 1.0)
        over = np.flatnonzero(losses > limit)
        if not over.size:
            return None
        i = int(over[0])
        return (f"round {start + i + 1} diverged: train_loss={float(losses[i]):.4g} is above {self.factor:g} × "
                f"max(initial loss {log.initial_loss:.4g}, 1) (diverge_factor)")


def drive(sim, state, logs: list[RunLog], rounds: int, eval_every: int, checkpoint_every: int, *, lanes: bool,
          callback: Callable | None = None, on_checkpoint: Callable | None = None, on_stop: Callable | None = None,
          guards: tuple = (NonFiniteGuard(),), progress: bool | str = True,
          should_stop: Callable[[], bool] | None = None):
    """Run ``sim`` (a :class:`~fljax.engine.Simulation` or :class:`~fljax.engine.Lanes`; ``lanes=True``: every leaf
    of ``state`` and of the metrics has a leading lane axis, and ``logs`` holds one :class:`RunLog` per lane) until
    ``rounds``.

    A run that starts at round 0 first evaluates its initial model (the round-0 record). After each block of
    :func:`block_schedule`: evaluate when due; ask every guard about every live lane — the
    first message stops that lane (``on_stop(lane, message)``; nothing of the bad block is recorded); append the
    live lanes' records, call ``callback(lane, record, lane_state)`` and, when due, ``on_checkpoint(lane,
    lane_state, log)``. Stops early when every lane has stopped, and when ``should_stop()`` is true after a block
    (a stop was requested: every live lane is then checkpointed there, a block end of the same schedule, so a
    resumed run repeats the uninterrupted one). Returns (state, the last per-client accuracies, {lane: message} of
    the stopped lanes). ``progress``: a bar of rounds (a string: the bar's name, e.g. the run's).
    """
    pick = (lambda tree_, i: jax.tree.map(lambda x: x[i], tree_)) if lanes else (lambda tree_, i: tree_)
    start = int(np.ravel(jax.device_get(state.round))[0])
    per_client: dict = {}
    stopped: dict[int, str] = {}
    bar = _progress_bar(rounds, start, progress)
    r = start
    mark = time.perf_counter()

    def lap(lanes_: list[int]) -> None:
        """Account the seconds since the last lap to these lanes' ``loop_seconds``."""
        nonlocal mark
        now = time.perf_counter()
        for i in lanes_:
            logs[i].loop_seconds += now - mark
        mark = now

    try:
        if start == 0 and not any(log.history for log in logs):
            t0, c0 = time.perf_counter(), sim.compile_seconds
            summary, per_client = jax.device_get(sim.evaluate(state))
            compile_s = sim.compile_seconds - c0
            seconds = time.perf_counter() - t0 - compile_s
            lap(list(range(len(logs))))
            for i, log in enumerate(logs):
                record = log.add_initial(pick(summary, i), seconds, compile_s)
                if callback is not None:
                    callback(i, record, pick(state, i))
        for n, do_eval, do_checkpoint in block_schedule(start, rounds, eval_every, checkpoint_every):
            t0, c0 = time.perf_counter(), sim.compile_seconds
            state, metrics = sim.run_rounds(state, n)
            jax.block_until_ready(state)
            summary = None
            if do_eval:
                summary, per_client = sim.evaluate(state)
            summary, metrics = jax.device_get((summary, metrics))
            compile_s = sim.compile_seconds - c0
            seconds = time.perf_counter() - t0 - compile_s  # compile time apart
            for i, log in enumerate(logs):
                if i in stopped:
                    continue
                lane_summary = None if summary is None else pick(summary, i)
                message = next((m for g in guards if (m := g(pick(metrics, i), lane_summary, r, log))), None)
                if message:
                    stopped[i] = message
                    if on_stop is not None:
                        on_stop(i, message)
            r += n
            live = [i for i in range(len(logs)) if i not in stopped]
            records = {}
            lap(live)  # (this block's callbacks and checkpoints go to the next lap)
            for i in live:
                logs[i].add_block(pick(metrics, i), seconds, compile_s)
                if do_eval:
                    records[i] = logs[i].add_record(r, pick(metrics, i), pick(summary, i))
            if bar is not None:
                bar.update(n)
                if records:
                    bar.set_postfix(_postfix(list(records.values())))
            for i in live:
                if i in records and callback is not None:
                    callback(i, records[i], pick(state, i))
                if do_checkpoint and on_checkpoint is not None:
                    on_checkpoint(i, pick(state, i), logs[i])
            if not live:
                break
            if should_stop is not None and should_stop():
                if not do_checkpoint and on_checkpoint is not None:
                    for i in live:
                        on_checkpoint(i, pick(state, i), logs[i])
                break
    finally:
        if bar is not None:
            bar.close()
        lap([i for i in range(len(logs)) if i not in stopped])
    return state, per_client, stopped


def _progress_bar(total: int, initial: int, enabled: bool | str):
    """A bar of rounds; ``enabled`` a name: shown in front of it, and the finished bar stays on screen (one line
    per run with its last metrics)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    name = enabled if isinstance(enabled, str) else None
    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True, leave=name is not None, desc=name)


def _postfix(records: list[dict]) -> dict:
    """The latest metrics for the progress bar (the mean over lanes when several run together)."""
    mean = lambda k: float(np.mean([r[k] for r in records]))  # noqa: E731
    out = {"loss": f"{mean('train_loss'):.3f}"} if "train_loss" in records[0] else {}
    if "personal_acc" in records[0]:
        out["pers"] = f"{mean('personal_acc'):.3f}"
    if "global_acc" in records[0]:
        out["glob"] = f"{mean('global_acc'):.3f}"
    return out
