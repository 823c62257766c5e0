"""PNG plots of a run and of a comparison (matplotlib's Agg canvas: no display, no global backend change).

A run: ``accuracy_vs_round.png``, ``accuracy_vs_bytes.png`` (communication up + down so far) and
``client_accuracy.png`` (histogram of the clients' personalized accuracies at the last evaluation). With several
seeds a curve is the mean over seeds with a ±1 std band. A comparison: ``compare.png``, one curve per algorithm
(personalized accuracy solid, global dashed) against rounds and against communicated bytes.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fljax.runner.files import write_png

__all__ = ["plot_run", "plot_compare"]

CURVES = (("personal_acc", "personalized", "-"), ("global_acc", "global", "--"))


def _series(histories: list[list[dict]], key: str):
    """(x rounds, mean, std, mean MB) over seeds, truncated to the evaluations every seed has."""
    n = min(len(h) for h in histories)
    if n == 0 or key not in histories[0][0]:
        return None
    values = np.array([[r[key] for r in h[:n]] for h in histories], dtype=float)
    mb = np.array([[(r["bytes_up"] + r["bytes_down"]) / 1e6 for r in h[:n]] for h in histories]).mean(0)
    return np.array([r["round"] for r in histories[0][:n]]), values.mean(0), values.std(0), mb


def _curves(ax, histories, x_bytes: bool, label: str | None = None, color=None):
    """Personalized (solid) and global (dashed) accuracy; with a run ``label`` only the first curve carries it."""
    for key, name, style in CURVES:
        s = _series(histories, key)
        if s is None:
            continue
        rounds, mean, std, mb = s
        x = mb if x_bytes else rounds
        (line,) = ax.plot(x, mean, style, color=color, label=name if label is None else label)
        label = None if label is None else "_"  # matplotlib leaves labels starting with '_' out of the legend
        color = line.get_color()
        if len(histories) > 1:
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("communicated MB (up + down)" if x_bytes else "round")
    ax.set_ylabel("test accuracy (mean over clients)")
    ax.grid(alpha=0.3)


def plot_run(directory: str, histories: list[list[dict]], per_client: list[dict], title: str) -> list[str]:
    """The three plots of one run (``histories``/``per_client``: one per seed); returns the paths written."""
    paths = []
    for name, x_bytes in (("accuracy_vs_round.png", False), ("accuracy_vs_bytes.png", True)):
        fig = Figure(figsize=(5.5, 4))
        ax = fig.add_subplot()
        _curves(ax, histories, x_bytes)
        ax.set_title(title)
        ax.legend()
        paths.append(f"{directory}/{name}")
        write_png(paths[-1], fig)
    accs = [np.asarray(p[k]) for p in per_client for k in ("personal_acc",) if k in p]
    if accs:
        fig = Figure(figsize=(5.5, 4))
        ax = fig.add_subplot()
        ax.hist(np.concatenate(accs), bins=np.linspace(0, 1, 21), edgecolor="white")
        ax.set_xlabel("personalized test accuracy of a client")
        ax.set_ylabel("clients" + (f" (all {len(accs)} seeds)" if len(accs) > 1 else ""))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}: clients at the last evaluation")
        paths.append(f"{directory}/client_accuracy.png")
        write_png(paths[-1], fig)
    return paths


def plot_compare(path: str, runs: dict[str, list[list[dict]]], title: str) -> str:
    """One figure, two panels (accuracy vs round, vs communicated MB), one color per run label."""
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for x_bytes, ax in zip((False, True), axes):
        for (label, histories), color in zip(runs.items(), colors):
            _curves(ax, histories, x_bytes, label, color)
    axes[1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"{title} (solid: personalized, dashed: global model)")
    write_png(path, fig)
    return path
