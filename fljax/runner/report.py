"""How a run talks to its user: output modes, JSON log lines, and the one way fljax writes results: Markdown
tables (:func:`markdown_table`) of mean ± std over seeds (:func:`mean_std`).

Every table — a run's, a sweep's, a comparison's, a study report's — writes a statistic over seeds as
``mean ± std`` with the *sample* standard deviation (ddof 1, what papers report; 0 for a single seed), through
:func:`mean_std`; ``summary.json`` stores the same :func:`sample_std`.

Modes: ``bar`` (a progress bar per run with the latest metrics and the ETA, notes on stderr), ``quiet`` (no bar,
no notes: only the final table on stdout) and ``json`` (stdout carries only JSON objects, one per line: an
``eval`` event per evaluation and a ``summary`` event per finished run; nothing else is printed there). In every
mode the eval events can also go to TensorBoard (``tensorboard=``, :mod:`fljax.runner.tensorboard`).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, TextIO

import numpy as np

__all__ = ["Output", "MODES", "markdown_table", "summary_row", "mean_std", "sample_std", "distinct_table"]

MODES = ("bar", "quiet", "json")


@dataclasses.dataclass
class Output:
    mode: str = "bar"
    stdout: TextIO | None = None
    stderr: TextIO | None = None
    tensorboard: Any = None  # a fljax.runner.tensorboard.TensorBoard: every eval event also goes there

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"output mode must be one of {MODES}, got {self.mode!r}.")

    @property
    def progress(self) -> bool:
        return self.mode == "bar"

    def note(self, text: str) -> None:
        """A line for the person watching (stderr; silent in quiet and JSON modes)."""
        if self.mode == "bar":
            print(text, file=self.stderr or sys.stderr, flush=True)

    def warn(self, text: str) -> None:
        """A line the person must see whatever the mode: ``fljax: warning: ...`` on stderr."""
        print(f"fljax: warning: {text}", file=self.stderr or sys.stderr, flush=True)

    def event(self, kind: str, **fields) -> None:
        """One JSON object on stdout (JSON mode only)."""
        if self.mode == "json":
            print(json.dumps({"event": kind, **fields}), file=self.stdout or sys.stdout, flush=True)
        if kind == "eval" and self.tensorboard is not None:
            record = dict(fields)
            self.tensorboard.write(record.pop("run"), record.pop("seed"), record)

    def close(self) -> None:
        """Close the TensorBoard writers, if any (also on leaving a ``with Output(...)`` block)."""
        if self.tensorboard is not None:
            self.tensorboard.close()

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def result(self, text: str) -> None:
        """The final answer (a table) on stdout, except in JSON mode."""
        if self.mode != "json":
            print(text, file=self.stdout or sys.stdout, flush=True)


def sample_std(values, axis=None):
    """The sample standard deviation (ddof 1) over ``axis``; 0 with fewer than two values."""
    values = np.asarray(values, float)
    n = values.size if axis is None else values.shape[axis]
    return np.std(values, axis=axis, ddof=1) if n > 1 else np.zeros_like(np.mean(values, axis=axis))


def mean_std(values, digits: int = 4, *, scale: float = 1.0, form: str = "mean_std") -> str:
    """``'0.8123 ± 0.0121'``: the mean and sample standard deviation (:func:`sample_std`) of ``values`` × ``scale``
    (None left out); one value alone, ``'-'`` for none. ``form='mean'``: the mean only; ``'g'``: the mean to 3
    significant digits."""
    values = np.array([v for v in values if v is not None], float)
    if values.size == 0:
        return "-"
    mean = scale * values.mean()
    if form == "g":
        return f"{mean:.3g}"
    if form == "mean" or values.size == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * sample_std(values):.{digits}f}"


def summary_row(label: str, summaries: list[dict]) -> dict:
    """One table row from the ``summary.json`` of every seed of a run (with an ``evaluated`` column, '50 of 715
    clients', when its evaluations scored a sample, ``eval_clients``)."""
    finals = [s.get("final", {}) for s in summaries]
    col = lambda key, **kw: mean_std([f.get(key) for f in finals], **kw)
    mb = [(f.get("bytes_up", 0.0) + f.get("bytes_down", 0.0)) / 1e6 for f in finals]
    extra = {}  # columns of some runs only
    if any("epsilon" in f for f in finals):  # papers report (ε, δ): the run's δ (default N^-1.1, fljax.privacy)
        deltas = sorted({s["privacy"]["delta"] for s in summaries if "delta" in s.get("privacy", {})})
        extra["(ε, δ)"] = f"({col('epsilon', form='g')}, {'/'.join(f'{d:.3g}' for d in deltas) or '-'})"
    for model in ("personal", "global"):  # text workloads: exp of the token-weighted mean cross-entropy
        if any(f"{model}_perplexity" in f for f in finals):
            extra[f"{model} perplexity"] = col(f"{model}_perplexity", digits=2)
    if any("virtual_time" in f for f in finals):  # the participation's clock (fljax.participation)
        extra["virtual s"] = col("virtual_time", digits=1)
    sampled = [s for s in summaries if s.get("eval_clients", 0) < s.get("num_clients", 0)]
    sample = {"evaluated": f"{sampled[0]['eval_clients']} of {sampled[0]['num_clients']} clients"} if sampled else {}
    return {"algorithm": label, "seeds": len(summaries), "personal acc": col("personal_acc"),
            "weighted": col("personal_acc_weighted"), "p10 client": col("personal_acc_p10"),
            "global acc": col("global_acc"), **extra, **sample, "rounds": max(f.get("round", 0) for f in finals),
            "MB up+down": f"{np.mean(mb):.1f}",
            "run s": f"{np.mean([s['run_seconds'] for s in summaries]):.1f}",
            "compile s": f"{np.mean([s['compile_seconds'] for s in summaries]):.1f}",
            "client-steps/s": f"{np.mean([s['client_steps_per_second'] for s in summaries]):,.0f}"}


def markdown_table(rows: list, header: list[str] | None = None) -> str:
    """The one Markdown table writer: ``rows`` as dicts (their keys the header) or as lists under ``header``,
    every column padded to its widest cell; '' without rows."""
    if not rows:
        return ""
    if header is None:
        header = list(rows[0])
        rows = [[r[c] for c in header] for r in rows]
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(header)]
    line = lambda vals: "| " + " | ".join(str(v).ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


ACCURACIES = ("personal acc", "p10 client", "global acc")
LAG = 0.05  # a row this far below the best personalized accuracy lags


def _mean(cell) -> float:
    """The mean of a table cell ('0.9440 ± 0.0121' → 0.944; '-' → NaN)."""
    try:
        return float(str(cell).split()[0])
    except (ValueError, IndexError):
        return float("nan")


def distinct_table(rows: list[dict], hints: dict[str, str] | None = None, names: list[str] | None = None,
                   caveats: dict[str, str] | None = None) -> str:
    """A run's, comparison's or sweep's rows (:func:`summary_row`) as a Markdown table in which every column says
    something of its own, with numbered notes under it:

    * the ``weighted`` column (sample-weighted over clients) is left out when it equals ``personal acc`` in every
      row — the clients' test splits then have one size — and a note says so;
    * the ``seeds`` and ``rounds`` columns, and ``status`` when every row completed, are left out when every row
      has the same (a note gives them: "every row: 1 seed, 100 rounds, completed."; one row: "1 seed, 100
      rounds.");
    * a row whose accuracies all equal an earlier row's gets a note naming that row (e.g. FedProx with a μ too
      small to matter);
    * ``hints`` (label → text): a note on that row when it lags the best personalized accuracy by :data:`LAG` or
      more, or repeats another row — e.g. a hyperparameter left at a value that does not suit the setting, with
      the value to try (an algorithm's registration: ``untuned``, :func:`fljax.algorithms.families.untuned`). A row with notes has their numbers after its
      label: ``perfedavg [2,3]``. Neither note is given for a row that did not complete (its ``status`` says
      why: a guard stopped it, and its accuracies are those of its last good evaluation), nor does such a row
      count as the one repeated or as the best;
    * ``caveats`` (label → text): a note on that row whatever its numbers — e.g. a model the algorithm cannot
      train as intended (``Algorithm.model_warning``: QuPeD quantizing no layer of a two-layer MLP trains at full
      precision);
    * the ``evaluated`` column of runs evaluated on a fixed sample of their clients (``eval_clients``) is left out
      when every row has the same sample, and a note says it.

    A row with notes has their numbers after its label: ``perfedavg [2,3]``. ``names``: what the notes call each
    row (default: its first column, the algorithm's label)."""
    if not rows:
        return ""
    key = next(iter(rows[0]))
    names = names or [str(r[key]) for r in rows]
    completed = [r.get("status", "completed") == "completed" for r in rows]
    notes: list[str] = []
    marks: dict[int, list[int]] = {}

    def note(text: str, row: int | None = None) -> None:
        notes.append(text)
        if row is not None:
            marks.setdefault(row, []).append(len(notes))

    every = " in every row" if len(rows) > 1 else ""
    if "weighted" in rows[0] and all(r["weighted"] == r["personal acc"] for r in rows):
        rows = [{k: v for k, v in r.items() if k != "weighted"} for r in rows]
        note(f"the sample-weighted personalized accuracy equals the unweighted mean over clients{every} (every "
             f"client's test split has the same size): its column is left out.")
    same = [c for c in ("seeds", "rounds", "status") if c in rows[0] and len({str(r[c]) for r in rows}) == 1
            and (c != "status" or rows[0][c] == "completed")]  # a stop keeps its column, in every row
    if same:
        note(("every row: " if every else "") + ", ".join(str(rows[0][c]) if c == "status" else
                                       f"{rows[0][c]} {c[:-1] if str(rows[0][c]) == '1' else c}" for c in same)
             + ".")
        rows = [{k: v for k, v in r.items() if k not in same} for r in rows]
    if "evaluated" in rows[0] and len({str(r.get("evaluated")) for r in rows}) == 1:
        note(f"every row is evaluated on the same fixed sample of {rows[0]['evaluated']} (eval_clients), not on "
             f"every client.")
        rows = [{k: v for k, v in r.items() if k != "evaluated"} for r in rows]
    seen: dict[tuple, int] = {}
    best = max((v for r, done in zip(rows, completed) if done and (v := _mean(r.get("personal acc"))) == v),
               default=float("nan"))
    for i, r in enumerate(rows):
        if not completed[i]:
            continue
        accuracies = tuple(r.get(c) for c in ACCURACIES)
        repeats = any(a not in (None, "-") for a in accuracies) and accuracies in seen
        if repeats:
            note(f"{names[i]} ends with the same accuracies as {names[seen[accuracies]]} (to the digits shown).", i)
        seen.setdefault(accuracies, i)
        if hints and names[i] in hints and (repeats or not _mean(r.get("personal acc")) > best - LAG):
            note(hints[names[i]], i)
        if caveats and names[i] in caveats:
            note(caveats[names[i]], i)
    rows = [{**r, key: f"{r[key]} [{','.join(map(str, marks[i]))}]"} if i in marks else r
            for i, r in enumerate(rows)]
    return "\n".join([markdown_table(rows)] + ([""] + [f"[{n}] {t}" for n, t in enumerate(notes, 1)]
                                                 if notes else []))
