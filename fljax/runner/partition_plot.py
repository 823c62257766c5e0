"""The data partition figure written with every run's plots (``partition.png``): the clients' sizes above their
label counts, clients × classes."""
from __future__ import annotations

import numpy as np

from fljax.runner.plots import FORMATS, PALETTE, current, figure, integer_axis, save, suptitle

MAX_CLIENTS = 100  # more clients than this in the partition figure: an evenly spaced sample in order of size
MAX_CLASSES = 100  # more classes than this (a vocabulary): no partition figure


def partition_counts(data) -> np.ndarray | None:
    """``[C, K]`` label counts of every client's train split (:meth:`~fljax.data.FederatedData.train_label_counts`)
    for data with class labels; None for data without them (per-token text, regression's packed rows, a population
    of other kinds) or with more than :data:`MAX_CLASSES` classes."""
    count = getattr(data, "train_label_counts", None)
    if count is None or getattr(data.input_shape, "per_token", False) or not 0 < data.num_classes <= MAX_CLASSES:
        return None
    return np.asarray(count())


def plot_partition(path: str, counts: np.ndarray, title: str, formats: tuple[str, ...] = FORMATS) -> list[str]:
    """``path``: the data partition, ``counts [C, K]`` (:func:`partition_counts`): the clients' sizes (train samples,
    bars) above their label counts (clients × classes, a heat map sharing the clients' axis). More than
    :data:`MAX_CLIENTS` clients: :data:`MAX_CLIENTS` of them, evenly spaced in the order of size (largest first),
    as the title says. Returns the paths written."""
    counts = np.asarray(counts)
    clients, classes = counts.shape
    sizes = counts.sum(1)
    if clients > MAX_CLIENTS:
        shown = np.argsort(-sizes, kind="stable")[np.linspace(0, clients - 1, MAX_CLIENTS).round().astype(int)]
        which = f"{MAX_CLIENTS} of {clients} clients, evenly spaced in order of size (largest first)"
        axis = "client (sample, in order of size)"
    else:
        shown, which, axis = np.arange(clients), f"all {clients} clients", "client"
    s = current()
    fig, (top, bottom) = figure(2, rows=2, cols=1, extra_width=0.0 if s.stacked else 1.6)
    bottom.sharex(top)
    top.bar(np.arange(len(shown)), sizes[shown], width=0.8, color=PALETTE[0])
    top.set_ylabel("train samples")
    top.tick_params(labelbottom=False)
    image = bottom.imshow(counts[shown].T, aspect="auto", interpolation="nearest", cmap="Blues", origin="lower",
                          extent=(-0.5, len(shown) - 0.5, -0.5, classes - 0.5))
    fig.colorbar(image, ax=[top, bottom], label="train samples of the class", shrink=0.5, anchor=(0.0, 0.0))
    bottom.grid(False)
    bottom.set_xlabel(axis)
    bottom.set_ylabel("class")
    integer_axis(bottom.yaxis)
    if len(shown) <= 30:
        bottom.set_xticks(range(len(shown)), [str(c) for c in shown],
                          rotation=90 if len(shown) > 12 else 0, fontsize="x-small")
    else:
        integer_axis(bottom.xaxis)
    suptitle(fig, title, f"data partition (train split): {which}")
    return save(fig, path, formats)
