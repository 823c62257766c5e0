"""The figures of a run, a comparison and a sweep, in the style of :mod:`fljax.runner.plots`.

A run (:func:`plot_run`): ``accuracy_vs_round``, ``accuracy_vs_bytes`` (communication up + down so far, log scale;
not drawn when nothing was communicated), ``accuracy_vs_virtual_time`` (the participation's virtual clock,
:mod:`fljax.participation`; drawn when the run kept one), ``client_accuracy`` (histogram of the clients' personalized accuracies at
the last evaluation), ``metrics`` (one panel per other logged quantity: training loss, FedSLR's ranks and
sparsity, DFedAlt's consensus distance, …) and ``partition`` (:func:`plot_partition`: the clients' train label counts
and sizes, for classification data). A comparison or sweep (:func:`plot_compare`): personalized accuracy
against rounds and against communicated MB, the global model's accuracy where an algorithm's global model
differs from its personalized one, and personalized accuracy against virtual time where runs kept a clock; ``*_metrics`` with the other logged quantities. More than :data:`MAX_LINES` runs
are drawn as small multiples, one row of panels per family (:mod:`fljax.algorithms.families`), each row with its own
styles; a sweep's points are grouped by the value of its first grid key, a colour per value where they fit one
panel. Runs whose curves are identical (:func:`ties`) are one line, its legend entry 'a = b, c'. A sweep over two
grid keys (:func:`plot_heatmap`): the final personalized accuracy of every grid point as a heatmap.

Every curve starts at round 0 (the initial model); markers show every evaluation when there are at most
:data:`MARK_ALL` of them. With several seeds a curve is the mean over seeds and the shaded band ± 1 sample standard
deviation (ddof 1, the tables' convention); the figure's title says so. A logged quantity that is constant
throughout (zero, or a fixed parameter count) is not drawn; the figure's title lists it with its value.
"""
from __future__ import annotations

import math

import numpy as np

from fljax.runner.plots import (FORMATS, LINESTYLES, MARKERS, PALETTE, ROUND, VIRTUAL, current, figure, handles_of,
                                integer_axis, legend_outside, log_axis, metric_label, rc_context, save, style,
                                suptitle)
from fljax.runner.partition_plot import plot_partition
from fljax.runner.report import sample_std

__all__ = ["plot_run", "plot_compare", "ties", "shared_delta",
           "setting", "extras", "constants", "MAX_LINES"]

MAX_LINES = 8  # more lines than this in one panel: small multiples
MARK_ALL = 25
TIE_DECIMALS = 4  # accuracies equal to this many decimals: one line (ties)
# record keys that are not extra quantities: the accuracy/loss summaries, communication, time
_STANDARD = ("round", "bytes_up", "bytes_down", "run_seconds", "virtual_time")
_SUMMARY_SUFFIXES = ("_acc", "_acc_p10", "_acc_weighted", "_loss", "_loss_weighted")
MB = "communicated MB (up + down, cumulative; log scale)"
COUNTS = ("rank", "gkr_params", "mixed_params")  # whole numbers: integer ticks


def setting(cfg, federated=None) -> str:
    """'digits, 50 clients, dirichlet(alpha=0.3)': the data behind a plot, for its title (``federated``: the
    data the runs used, when it is the user's own rather than the config's); '715 clients, 50 evaluated' when the
    evaluations score a fixed sample (``eval_clients``)."""
    from fljax.data import PARTITIONERS

    def clients(n: int) -> str:
        sample = cfg.eval_clients is not None and cfg.eval_clients < n
        return f"{n} clients" + (f", {cfg.eval_clients} evaluated" if sample else "")

    if federated is not None and federated.name != cfg.data.dataset:
        return f"{federated.name}, {clients(federated.num_clients)}"
    data = cfg.data
    values = data.to_dict()
    partition = data.partition or ("natural" if data.source.natural else "dirichlet")
    owned = PARTITIONERS[partition].options if partition in PARTITIONERS else None
    keys = [k for k in (owned.__dataclass_fields__ if owned else ()) if values.get(k) is not None]
    options = f"({', '.join(f'{k}={values[k]}' for k in keys)})" if keys else ""
    return f"{data.dataset}, {clients(data.num_clients)}, {partition}{options}"


def _logged(histories: list[list[dict]]) -> list[str]:
    """The logged quantities beyond accuracy, loss summaries, communication and time (the training loss first,
    then in first-seen order)."""
    keys: dict[str, None] = {}
    for h in histories:
        for record in h:
            for k in record:
                if k not in _STANDARD and (k == "train_loss" or not k.endswith(_SUMMARY_SUFFIXES)):
                    keys.setdefault(k)
    return sorted(keys, key=lambda k: k != "train_loss")


def _values(histories, key) -> list:
    return [r[key] for h in histories for r in h if r.get(key) is not None]


def constants(histories: list[list[dict]]) -> dict[str, float]:
    """The logged quantities (see :func:`extras`) that keep one value at every evaluation of every run (zero, a
    fixed parameter count, a rank that never moves), with that value."""
    out = {}
    for k in _logged(histories):
        values = np.asarray(_values(histories, k), float)
        if values.size == 0 or np.allclose(values, values[0], rtol=1e-9, atol=0.0):
            out[k] = float(values[0]) if values.size else 0.0
    return out


def extras(histories: list[list[dict]]) -> list[str]:
    """The logged quantities beyond accuracy, loss summaries, communication and time that change (the training
    loss first, then in first-seen order): those :func:`constants` finds are left out."""
    fixed = constants(histories)
    return [k for k in _logged(histories) if k not in fixed]


def _constants_note(histories) -> str:
    fixed = constants(histories)
    return ("constant, not drawn: " + ", ".join(f"{k} = {v:g}" for k, v in fixed.items())) if fixed else ""


def _series(histories: list[list[dict]], key: str):
    """(x rounds, mean, std, mean MB, mean virtual seconds (NaN without a clock)) over seeds at the evaluations that
    have ``key``, truncated to the evaluations every seed has."""
    n = min(len(h) for h in histories)
    rows = [i for i in range(n) if all(key in h[i] for h in histories)]
    if not rows:
        return None
    values = np.array([[h[i][key] for i in rows] for h in histories], dtype=float)
    mb = np.array([[(h[i]["bytes_up"] + h[i]["bytes_down"]) / 1e6 for i in rows] for h in histories]).mean(0)
    clock = np.array([[h[i].get("virtual_time", np.nan) for i in rows] for h in histories], dtype=float).mean(0)
    return np.array([histories[0][i]["round"] for i in rows]), values.mean(0), sample_std(values, axis=0), mb, clock


def _line(ax, histories, key: str, x: str, fmt: dict, label: str | None) -> bool:
    """One quantity's curve (mean over seeds, ±1 std band) against ``x``: 'round', 'bytes' (MB, only where MB > 0:
    log axis) or 'virtual_time' (the participation's clock, where recorded). Returns whether anything was drawn."""
    s = _series(histories, key)
    if s is None:
        return False
    rounds, mean, std, mb, clock = s
    x, keep = {"round": (rounds, np.ones_like(mean, bool)), "bytes": (mb, mb > 0),
               "virtual_time": (clock, np.isfinite(clock))}[x]
    if not keep.any():
        return False
    x, mean, std = x[keep], mean[keep], std[keep]
    ax.plot(x, mean, label=label, markevery=None if len(x) <= MARK_ALL else max(1, len(x) // MARK_ALL), **fmt)
    if len(histories) > 1:
        ax.fill_between(x, mean - std, mean + std, color=fmt.get("color"), alpha=0.2, linewidth=0)
    return True


def _communicates(histories) -> bool:
    return any(r.get("bytes_up", 0) + r.get("bytes_down", 0) > 0 for h in histories for r in h)


def _clocked(histories) -> bool:
    """Whether the run kept a virtual clock (its participation had device speeds)."""
    return any("virtual_time" in r for h in histories for r in h)


def _own_global(histories) -> bool:
    """Whether the run reports a global model whose accuracy differs from the personalized one somewhere."""
    return any("global_acc" in r and not np.isclose(r["global_acc"], r.get("personal_acc", np.nan))
               for h in histories for r in h)


def _axes_labels(ax, key: str, x: str) -> None:
    if x == "bytes":
        log_axis(ax)
    elif x == "round":
        integer_axis(ax.xaxis)
    ax.set_xlabel({"round": ROUND, "bytes": MB, "virtual_time": VIRTUAL}[x])
    ax.set_ylabel(metric_label(key))
    ax.grid(alpha=0.3, which="both" if x == "bytes" else "major")


def _seeds_note(seeds: int) -> str:
    return (f"line: mean over {seeds} seeds, band: ± 1 std (sample)" if seeds > 1 else "1 seed")


def shared_delta(runs) -> float | None:
    """The δ at which the private ones of ``runs`` (:class:`~fljax.runner.runs.Run`) account ε when they share one,
    else None (no private run, or several δ)."""
    deltas = {r.privacy.plan.delta for r in runs if r.privacy is not None and r.privacy.plan is not None}
    return deltas.pop() if len(deltas) == 1 else None


def _metricsfigure(runs: dict[str, list[list[dict]]], title: str, labelled: bool, seeds: int,
                    styles: dict[str, dict] | None = None, delta: float | None = None):
    """One panel per changing extra quantity (see :func:`extras`), ``rank/<layer>`` keys sharing a panel
    (``styles``: each run's line style, default :func:`style` in order); ε's axis names ``delta``, the δ of every
    run, when given (papers report (ε, δ))."""
    every = [h for histories in runs.values() for h in histories]
    keys = extras(every)
    panels: dict[str, list[str]] = {}
    for k in keys:
        panels.setdefault(k.split("/")[0] + ("/*" if "/" in k else ""), []).append(k)
    if not panels:
        return None
    s = current()
    cols = 1 if s.stacked else min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = figure(len(panels), rows=rows, cols=cols)
    styles = styles or {label: style(i) for i, label in enumerate(runs)}
    for ax, (panel, members) in zip(axes, panels.items()):
        for label, histories in runs.items():
            for j, key in enumerate(members):
                fmt = styles[label] if labelled else style(j)
                name = (label if j == 0 else None) if labelled else (key.split("/", 1)[-1] if len(members) > 1
                                                                      else None)
                _line(ax, histories, key, "round", fmt, name)
        _axes_labels(ax, members[0], "round")
        if len(members) == 1 and "/" in members[0]:
            ax.set_ylabel(f"{metric_label(members[0])}\n{members[0].split('/', 1)[1]}")
        if members == ["epsilon"] and delta is not None:
            ax.set_ylabel(f"privacy loss ε\n(at δ = {delta:.3g})")
        if members[0].split("/")[0] in COUNTS:
            integer_axis(ax.yaxis)
        if len(members) > 1 and not labelled:
            legend_outside(ax, title=panel.split("/")[0] + " of", fontsize="x-small")
    if labelled:
        legend_outside(fig)
    suptitle(fig, title, _seeds_note(seeds), _constants_note(every))
    return fig


def plot_run(directory: str, histories: list[list[dict]], per_client: list[dict], title: str,
             formats: tuple[str, ...] = FORMATS, counts: np.ndarray | None = None,
             delta: float | None = None) -> list[str]:
    """The plots of one run (``histories``/``per_client``: one per seed) in ``formats`` (and those of the
    current style), with the partition figure of ``counts`` (:func:`partition_counts`; None: none) and ε at the
    run's ``delta`` (:func:`shared_delta`); returns the paths written."""
    paths = []
    seeds = len(histories)
    with rc_context():
        for name, x in (("accuracy_vs_round", "round"), ("accuracy_vs_bytes", "bytes"),
                        ("accuracy_vs_virtual_time", "virtual_time")):
            if x == "bytes" and not _communicates(histories) or x == "virtual_time" and not _clocked(histories):
                continue  # nothing communicated (Local): no bytes plot; no clock: no virtual time plot
            fig, (ax,) = figure(1, extra_width=0.0 if current().stacked else 1.6)
            _line(ax, histories, "personal_acc", x, style(0), "personalized model")
            if _own_global(histories):
                _line(ax, histories, "global_acc", x, style(1), "global model")
            _axes_labels(ax, "personal_acc", x)
            ax.set_ylabel(metric_label("personal_acc").replace("personalized ", ""))
            legend_outside(ax)
            one = "" if _own_global(histories) or not any("global_acc" in r for h in histories for r in h) else \
                "the personalized model is the global model"
            suptitle(fig, title, _seeds_note(seeds), one)
            paths += save(fig, f"{directory}/{name}.png", formats)
        accs = [np.asarray(p[k]) for p in per_client for k in ("personal_acc",) if k in p]
        if accs:
            fig, (ax,) = figure(1)
            ax.hist(np.concatenate(accs), bins=np.linspace(0, 1, 21), color=PALETTE[0], edgecolor="white")
            ax.set_xlabel("personalized test accuracy of a client (fraction correct)")
            ax.set_ylabel("clients (count" + (f", all {len(accs)} seeds)" if len(accs) > 1 else ")"))
            integer_axis(ax.yaxis)
            suptitle(fig, title, "clients at the last evaluation")
            paths += save(fig, f"{directory}/client_accuracy.png", formats)
        fig = _metricsfigure({"run": histories}, title, labelled=False, seeds=seeds, delta=delta)
        if fig is not None:
            paths += save(fig, f"{directory}/metrics.png", formats)
        if counts is not None:
            paths += plot_partition(f"{directory}/partition.png", counts,
                                    title if seeds == 1 else f"{title}; the first seed's partition", formats)
    return paths


def _groups(runs: dict, groups: dict[str, str] | None) -> dict[str, list[str]]:
    """Labels by group, in first-seen order: the given ``groups`` (label → group name), else chunks of
    :data:`MAX_LINES` in order."""
    if groups is None:
        labels = list(runs)
        return {f"{i + 1}–{min(i + MAX_LINES, len(labels))} of {len(labels)}": labels[i:i + MAX_LINES]
                for i in range(0, len(labels), MAX_LINES)}
    out: dict[str, list[str]] = {}
    for label in runs:
        out.setdefault(groups.get(label, "other"), []).append(label)
    return out


def ties(runs: dict[str, list[list[dict]]]) -> dict[str, list[str]]:
    """The distinct runs, each with the labels of the runs whose curves equal its own: the same evaluation rounds,
    communication and virtual time, and personalized and global accuracy (mean and std over seeds) to the
    :data:`TIE_DECIMALS` decimals the tables show, far below a pixel. ``{first: [first, identical, …]}`` in
    first-seen order."""
    def curves(histories):
        return tuple(None if s is None else tuple(np.round(np.asarray(a, float), TIE_DECIMALS if i in (1, 2) else 12)
                                                  .tobytes() for i, a in enumerate(s))
                     for s in (_series(histories, k) for k in ("personal_acc", "global_acc")))

    first: dict[tuple, str] = {}
    out: dict[str, list[str]] = {}
    for label, histories in runs.items():
        out.setdefault(first.setdefault(curves(histories), label), []).append(label)
    return out


def _grouped_styles(labels: list[str], groups: dict[str, str]) -> dict[str, dict]:
    """A colour per group (in first-seen order), a line style per run within its group and a marker per run."""
    names = list(dict.fromkeys(groups.get(label, "other") for label in labels))
    within: dict[str, int] = {}
    out = {}
    for i, label in enumerate(labels):
        g = groups.get(label, "other")
        j = within[g] = within.get(g, -1) + 1
        out[label] = {"color": PALETTE[names.index(g) % len(PALETTE)], "linestyle": LINESTYLES[j % len(LINESTYLES)],
                      "marker": MARKERS[i % len(MARKERS)]}
    return out


def plot_compare(path: str, runs: dict[str, list[list[dict]]], title: str,
                 groups: dict[str, str] | None = None, colour_groups: bool = False,
                 delta: float | None = None) -> list[str]:
    """``path`` (.png, with a .pdf beside it): personalized accuracy against rounds and against communicated MB,
    one style per run label (:func:`style`; ``colour_groups``: a colour per group, e.g. a sweep's value of its
    first grid key), and the global model's accuracy for the runs whose global model differs from their
    personalized one; more than :data:`MAX_LINES` lines as small multiples, one row per group (``groups``: label →
    group name, e.g. the algorithm's family; default: runs in order, :data:`MAX_LINES` a row). Runs whose curves
    are identical (:func:`ties`) are one line with one legend entry, 'a = b, c'. ``<stem>_metrics`` with the other
    logged quantities, a line per run (ε at ``delta``, the runs' δ: :func:`shared_delta`). Returns the paths
    written."""
    seeds = max(len(h) for h in runs.values())
    styles = (_grouped_styles(list(runs), groups) if colour_groups and groups
              else {label: style(i) for i, label in enumerate(runs)})
    named = {label: label + (f" = {', '.join(same)}" if (same := others[1:]) else "")
             for label, others in ties(runs).items()}
    lines = {named[label]: runs[label] for label in named}
    silent = [named[k] for k in named if not _communicates(runs[k])]
    with rc_context():
        if len(lines) <= MAX_LINES:
            fig = _compare_panels(lines, {named[k]: styles[k] for k in named}, silent)
        else:
            fig = _compare_small_multiples(lines, _groups(lines, groups and {named[k]: groups.get(k, "other")
                                                                              for k in named}), silent)
        suptitle(fig, title, _seeds_note(seeds))
        paths = save(fig, path)
        metrics = _metricsfigure(runs, title, labelled=True, seeds=seeds, styles=styles, delta=delta)
        if metrics is not None:
            stem = path[: -len(".png")] if path.endswith(".png") else path
            paths += save(metrics, f"{stem}_metrics.png")
    return paths


def _compare_panels(runs, styles, silent):
    """Up to MAX_LINES runs: personalized accuracy vs round and vs MB, global accuracy where it differs, and
    personalized accuracy against virtual time when runs kept a clock."""
    own_global = [k for k, h in runs.items() if _own_global(h)]
    clocked = [k for k, h in runs.items() if _clocked(h)]
    fig, axes = figure(2 + bool(own_global) + bool(clocked))
    for label, histories in runs.items():
        _line(axes[0], histories, "personal_acc", "round", styles[label], label)
        _line(axes[1], histories, "personal_acc", "bytes", styles[label], label)
        if label in own_global:
            _line(axes[2], histories, "global_acc", "round", styles[label], label)
        if label in clocked:
            _line(axes[-1], histories, "personal_acc", "virtual_time", styles[label], label)
    _axes_labels(axes[0], "personal_acc", "round")
    _axes_labels(axes[1], "personal_acc", "bytes")
    axes[0].set_title("(a) personalized model", fontsize="medium")
    axes[1].set_title("(b) the same against communication" + (f"\nnothing communicated: {', '.join(silent)}"
                                                               if silent else ""), fontsize="medium")
    if own_global:
        _axes_labels(axes[2], "global_acc", "round")
        axes[2].set_title("(c) global model, where it differs\nfrom the personalized one", fontsize="medium")
        axes[2].sharey(axes[0])
    if clocked:
        _axes_labels(axes[-1], "personal_acc", "virtual_time")
        axes[-1].set_title(f"({'abcd'[len(axes) - 1]}) against virtual time" + (
            f"\nno clock: {', '.join(k for k in runs if k not in clocked)}" if len(clocked) < len(runs) else ""),
            fontsize="medium")
        axes[-1].sharey(axes[0])
    legend_outside(fig, *handles_of(axes))
    return fig


def _compare_small_multiples(runs, groups: dict[str, list[str]], silent):
    """More than MAX_LINES runs: a row per group, personalized accuracy against rounds and against MB (one column
    in the paper style), each row with its own styles and legend; every panel on one accuracy scale."""
    s = current()
    cols = 1 if s.stacked else 2
    fig, axes = figure(len(groups) * cols, extra_width=0.0 if s.stacked else 2.0, rows=len(groups), cols=cols)
    for row, (name, labels) in enumerate(groups.items()):
        row_axes = axes[row * cols:(row + 1) * cols]
        for i, label in enumerate(labels):
            for ax, x in zip(row_axes, ("round", "bytes")):
                _line(ax, runs[label], "personal_acc", x, style(i), label)
        for ax, x in zip(row_axes, ("round", "bytes")):
            _axes_labels(ax, "personal_acc", x)
            if ax is not axes[0]:
                ax.sharey(axes[0])
        row_axes[0].set_title(name, fontsize="medium", loc="left")
        quiet = [k for k in labels if k in silent]
        if len(row_axes) > 1 and len(quiet) == len(labels):  # nothing to draw against communication
            row_axes[1].axis("off")
            row_axes[1].text(0.0, 0.5, "nothing communicated", transform=row_axes[1].transAxes, va="center")
        elif quiet and len(row_axes) > 1:
            row_axes[1].set_title(f"nothing communicated: {', '.join(quiet)}", fontsize="small")
        legend_outside(row_axes[-1], *handles_of(row_axes))
    return fig
