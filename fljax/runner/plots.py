"""Plots of a run and of a comparison, each written as PNG and PDF (matplotlib's Agg canvas: no display, no global
backend change).

A run: ``accuracy_vs_round``, ``accuracy_vs_bytes`` (communication up + down so far, log scale; not drawn when
nothing was communicated), ``client_accuracy`` (histogram of the clients' personalized accuracies at the last
evaluation) and ``metrics`` (one panel per other logged quantity: train loss, FedSLR's ranks and sparsity,
DFedAlt's consensus distance, …; a quantity that is zero throughout is left out). With several seeds a curve is
the mean over seeds with a ±1 std band. A comparison or sweep: one figure (accuracy against rounds and against
communicated MB) with a colour and marker per run, distinct for any number of runs, and ``*_metrics`` with the
other logged quantities. Every curve starts at round 0 (the initial model); markers show every evaluation when
there are at most :data:`MARK_ALL` of them.
"""
from __future__ import annotations

import math

import numpy as np

from fljax.runner.files import write_figure
from fljax.runner.report import sample_std

__all__ = ["plot_run", "plot_compare", "setting", "style", "extras", "FORMATS"]

FORMATS = ("png", "pdf")
CURVES = (("personal_acc", "personalized", "-"), ("global_acc", "global", "--"))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")  # 11: coprime to the 10 colours below
MARK_ALL = 25
# record keys that are not extra quantities: the accuracy/loss summaries, communication, time
_STANDARD = ("round", "bytes_up", "bytes_down", "run_seconds")
_SUMMARY_SUFFIXES = ("_acc", "_acc_p10", "_acc_weighted", "_loss", "_loss_weighted")


def style(i: int) -> dict:
    """Colour and marker of the i-th run: 10 colours × 11 markers, so the first 110 runs all differ (and
    neighbours differ in both)."""
    from matplotlib import colormaps

    return {"color": colormaps["tab10"](i % 10), "marker": MARKERS[i % len(MARKERS)]}


def _figure(**options):
    """A matplotlib figure on the Agg canvas. matplotlib is imported here, on the first plot, not with this module:
    its second of imports then never delays the start of a run."""
    from matplotlib.figure import Figure

    return Figure(**options)


def setting(cfg, federated=None) -> str:
    """'digits, 50 clients, dirichlet(alpha=0.3)': the data behind a plot, for its title (``federated``: the
    data the runs used, when it is the user's own rather than the config's)."""
    from fljax.data import PARTITIONERS

    if federated is not None and federated.name != cfg.data.dataset:
        return f"{federated.name}, {federated.num_clients} clients"
    data = cfg.data
    values = data.to_dict()
    partition = data.partition or ("natural" if data.source.natural else "dirichlet")
    owned = PARTITIONERS[partition].options if partition in PARTITIONERS else None
    keys = [k for k in (owned.__dataclass_fields__ if owned else ()) if values.get(k) is not None]
    options = f"({', '.join(f'{k}={values[k]}' for k in keys)})" if keys else ""
    return f"{data.dataset}, {data.num_clients} clients, {partition}{options}"


def extras(histories: list[list[dict]]) -> list[str]:
    """The logged quantities beyond accuracy, loss summaries, communication and time (the training loss first,
    then in first-seen order), without those that are zero (or missing) at every evaluation."""
    keys: dict[str, None] = {}
    for h in histories:
        for record in h:
            for k in record:
                if k not in _STANDARD and (k == "train_loss" or not k.endswith(_SUMMARY_SUFFIXES)):
                    keys.setdefault(k)
    nonzero = [k for k in keys if any(r.get(k) not in (None, 0, 0.0) for h in histories for r in h)]
    return sorted(nonzero, key=lambda k: k != "train_loss")  # the training loss first


def _series(histories: list[list[dict]], key: str):
    """(x rounds, mean, std, mean MB) over seeds at the evaluations that have ``key``, truncated to the
    evaluations every seed has."""
    n = min(len(h) for h in histories)
    rows = [i for i in range(n) if all(key in h[i] for h in histories)]
    if not rows:
        return None
    values = np.array([[h[i][key] for i in rows] for h in histories], dtype=float)
    mb = np.array([[(h[i]["bytes_up"] + h[i]["bytes_down"]) / 1e6 for i in rows] for h in histories]).mean(0)
    return np.array([histories[0][i]["round"] for i in rows]), values.mean(0), sample_std(values, axis=0), mb


def _line(ax, histories, key: str, x_bytes: bool, fmt: dict, label: str | None):
    """One quantity's curve (mean over seeds, ±1 std band); against MB only where MB > 0 (log axis)."""
    s = _series(histories, key)
    if s is None:
        return
    rounds, mean, std, mb = s
    x = mb if x_bytes else rounds
    keep = mb > 0 if x_bytes else np.ones_like(mean, bool)
    if not keep.any():
        return
    x, mean, std = x[keep], mean[keep], std[keep]
    ax.plot(x, mean, label=label, markevery=None if len(x) <= MARK_ALL else max(1, len(x) // MARK_ALL),
            markersize=4, **fmt)
    if len(histories) > 1:
        ax.fill_between(x, mean - std, mean + std, color=fmt.get("color"), alpha=0.2, linewidth=0)


def _communicates(histories) -> bool:
    return any(r.get("bytes_up", 0) + r.get("bytes_down", 0) > 0 for h in histories for r in h)


def _accuracy(ax, runs: dict[str, list[list[dict]]], x_bytes: bool, labelled: bool) -> None:
    for i, (label, histories) in enumerate(runs.items()):
        for j, (key, name, linestyle) in enumerate(CURVES):
            fmt = {**style(i), "linestyle": linestyle} if labelled else {**style(j), "linestyle": linestyle}
            text = (label if j == 0 else None) if labelled else name
            _line(ax, histories, key, x_bytes, fmt, text)
    if x_bytes:
        ax.set_xscale("log")
    ax.set_xlabel("communicated MB (up + down), log scale" if x_bytes else "round")
    ax.set_ylabel("test accuracy (mean over clients)")
    ax.grid(alpha=0.3, which="both" if x_bytes else "major")


def _handles(axes) -> tuple[list, list[str]]:
    """Every labelled line of the axes, once per label (for a figure legend)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


def _save(fig, path_png: str, formats: tuple[str, ...] = FORMATS) -> list[str]:
    stem = path_png[: -len(".png")] if path_png.endswith(".png") else path_png
    paths = [f"{stem}.{fmt}" for fmt in formats]
    for path in paths:
        write_figure(path, fig)
    return paths


def _metrics_figure(runs: dict[str, list[list[dict]]], title: str, labelled: bool):
    """One panel per extra quantity (see :func:`extras`), ``rank/<layer>`` keys of one run sharing a panel."""
    keys = extras([h for histories in runs.values() for h in histories])
    panels: dict[str, list[str]] = {}
    for k in keys:
        panels.setdefault(k.split("/")[0] + ("/*" if "/" in k else ""), []).append(k)
    if not panels:
        return None
    cols = min(3, len(panels))
    fig = _figure(figsize=(4.2 * cols, 3.2 * math.ceil(len(panels) / cols)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(math.ceil(len(panels) / cols), cols)).ravel()
    for ax, (panel, members) in zip(axes, panels.items()):
        for i, (label, histories) in enumerate(runs.items()):
            for j, key in enumerate(members):
                fmt = style(i) if labelled else style(j)
                name = (label if j == 0 else None) if labelled else (key if len(members) > 1 else None)
                _line(ax, histories, key, False, {**fmt, "linestyle": "-" if labelled or j < 10 else "--"}, name)
        ax.set_title(panel, fontsize="medium")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        if any(line.get_label() and not line.get_label().startswith("_") for line in ax.get_lines()) and not labelled:
            ax.legend(fontsize="x-small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if labelled:
        fig.legend(*_handles(axes), fontsize="small", loc="outside right center")
    fig.suptitle(title)
    return fig


def plot_run(directory: str, histories: list[list[dict]], per_client: list[dict], title: str,
             formats: tuple[str, ...] = FORMATS) -> list[str]:
    """The plots of one run (``histories``/``per_client``: one per seed) in ``formats``; returns the paths written."""
    paths = []
    runs = {"run": histories}
    for name, x_bytes in (("accuracy_vs_round", False), ("accuracy_vs_bytes", True)):
        if x_bytes and not _communicates(histories):
            continue  # nothing communicated (Local): no bytes plot
        fig = _figure(figsize=(5.5, 4))
        ax = fig.add_subplot()
        _accuracy(ax, runs, x_bytes, labelled=False)
        ax.set_title(title, fontsize="medium")
        ax.legend()
        paths += _save(fig, f"{directory}/{name}.png", formats)
    accs = [np.asarray(p[k]) for p in per_client for k in ("personal_acc",) if k in p]
    if accs:
        fig = _figure(figsize=(5.5, 4))
        ax = fig.add_subplot()
        ax.hist(np.concatenate(accs), bins=np.linspace(0, 1, 21), edgecolor="white")
        ax.set_xlabel("personalized test accuracy of a client")
        ax.set_ylabel("clients" + (f" (all {len(accs)} seeds)" if len(accs) > 1 else ""))
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}: clients at the last evaluation", fontsize="medium")
        paths += _save(fig, f"{directory}/client_accuracy.png", formats)
    fig = _metrics_figure(runs, title, labelled=False)
    if fig is not None:
        paths += _save(fig, f"{directory}/metrics.png", formats)
    return paths


def plot_compare(path: str, runs: dict[str, list[list[dict]]], title: str) -> list[str]:
    """``path`` (.png, with a .pdf beside it): accuracy against rounds and against communicated MB, one colour and
    marker per run label; ``<stem>_metrics`` with the other logged quantities. Returns the paths written."""
    fig = _figure(figsize=(12, 4.4), layout="constrained")
    axes = fig.subplots(1, 2)
    _accuracy(axes[0], runs, False, labelled=True)
    _accuracy(axes[1], runs, True, labelled=True)
    silent = [k for k, h in runs.items() if not _communicates(h)]
    if silent:
        axes[1].set_title(f"not shown (nothing communicated): {', '.join(silent)}", fontsize="small")
    fig.legend(*_handles(axes), fontsize="small", loc="outside right center", ncols=1 + len(runs) // 25)
    fig.suptitle(f"{title}\nsolid: personalized, dashed: global model")
    paths = _save(fig, path)
    metrics = _metrics_figure(runs, title, labelled=True)
    if metrics is not None:
        stem = path[: -len(".png")] if path.endswith(".png") else path
        paths += _save(metrics, f"{stem}_metrics.png")
    return paths
