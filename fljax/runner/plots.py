"""The style of every fljax figure — runs, comparisons, sweeps (:mod:`fljax.runner.run_plots`) and studies
(:mod:`fljax.runner.tables`) — and the pieces they are drawn with (matplotlib's Agg canvas: no display, no global
backend change).

**Lines.** Line *i* has colour ``i mod 7`` of the Okabe–Ito palette (built to stay distinct for colour-blind
readers; its yellow is left out, too light on white), line style ``⌊i/7⌋ mod 4`` and marker ``i mod 11``: the first
308 lines all differ, neighbours differ in colour and marker, the first 7 are solid (:func:`style`). Legends sit
outside the data (:func:`legend_outside`). Every axis names its quantity and unit (:func:`metric_label`); rounds
are ticked in whole numbers (:func:`integer_axis`) and a log axis labels at least three values whatever it spans
(:func:`log_axis`).

**Styles.** ``screen`` (the default: PNG to look at, and PDF) or ``paper`` (single-column width of 3.3 in, serif
fonts at 8 pt, panels stacked with the legend below the x label, vector PDF with embedded TrueType fonts, and a PNG
preview): ``fljax run|compare|sweep|reproduce --style paper``, or ``with fljax.runner.plots.use("paper"):`` around any call
that writes figures. Notebooks take the same look with ``plt.rcParams.update(plots.rc())``.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import numpy as np

from fljax.runner.files import write_figure

__all__ = ["style", "metric_label", "use", "current", "rc", "rc_context", "figure", "save", "handles_of",
           "legend_outside", "heatmap", "integer_axis", "log_axis", "suptitle", "plot_heatmap", "FORMATS", "STYLES",
           "PALETTE", "ROUND"]

FORMATS = ("png", "pdf")
# Okabe & Ito (2008), "Color Universal Design": blue, orange, bluish green, vermillion, reddish purple, sky blue,
# black (yellow #F0E442 left out: too light for a line on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")  # 11: coprime to 7 colours × 4 line styles
ROUND = "communication round"
VIRTUAL = "virtual time (s, cumulative)"  # the participation's clock (fljax.participation)
# what a logged quantity is, with its unit (the y label of its panel); a key 'a/b' is looked up as 'a'; the
# accuracy and loss summaries (personal_acc, global_acc_p10, target_personal_loss_weighted, ...) are composed from
# _MODELS and _SUMMARIES
LABELS = {
    "train_loss": "training loss (cross-entropy, nats)",
    "consensus": "consensus distance after gossip\n(1/m) Σ‖u_i − ū‖²",
    "consensus_local": "consensus distance before gossip\n(1/m) Σ‖z_i − z̄‖²",
    "gkr_params": "global low-rank part (parameters)",
    "gkr_rank_density": "rank density Σ r / Σ min(m, n)\n(fraction)",
    "rank": "rank of the weight matrix",
    "sparse_nnz_frac": "non-zero fraction of the\nsparse personal part",
    "mixed_params": "mixed model (parameters,\nmean over clients)",
    "mixed_params_std": "mixed model (parameters,\nstd over clients)",
    "bits_per_param": "bits per parameter",
    "model_mb": "personal model size (MB)",
    "teacher_max_prob": "teacher confidence\n(mean max probability)",
    "meta_loss": "meta-objective (cross-entropy, nats)",
    "kt_loss": "knowledge-transfer loss",
    "epsilon": "privacy loss ε\n(at the run's δ)",
    "clip_norm": "clip norm C (L2)",
    "unclipped_fraction": "unclipped fraction b̄ of the\ncohort's updates (noised estimate)",
    "clients_reported": "clients whose update counted\n(per round, mean over rounds)",
    "skipped_rounds": "rounds in which nobody\nreported (cumulative)",
    "staleness": "staleness of the server step's\nupdates (versions, mean)",
}
_MODELS = {"personal": "personalized", "global": "global-model", "target_personal": "target-client",
           "post_gossip": "post-gossip"}
_SUMMARIES = {"_acc": "test accuracy\n(fraction correct, mean over clients)",
              "_acc_weighted": "test accuracy\n(fraction correct, sample-weighted)",
              "_acc_p10": "test accuracy\n(fraction correct, 10th-percentile client)",
              "_loss": "test loss\n(cross-entropy, nats, mean over clients)",
              "_loss_weighted": "test loss\n(cross-entropy, nats, sample-weighted)",
              "_perplexity": "test perplexity\n(exp of the token-weighted mean cross-entropy)",  # text workloads
              "_acc_with_specials": "test token accuracy\n(fraction correct, specials included, mean over clients)"}


@dataclasses.dataclass(frozen=True)
class FigureStyle:
    """How figures look: ``panel`` (width, height) in inches of one panel; ``stacked``: panels in one column with
    the legend below (a paper's single column) instead of side by side with the legend on the right; ``rc``:
    matplotlib settings; ``formats`` every figure is written as (beside those the caller asks for); ``dpi`` of a
    PNG."""

    name: str
    panel: tuple[float, float]
    stacked: bool
    rc: dict
    formats: tuple[str, ...]
    dpi: int


STYLES = {
    "screen": FigureStyle("screen", (4.4, 3.3), False, {"font.size": 9.0, "legend.fontsize": 8.0,
                                                         "lines.markersize": 4.0}, (), 110),
    "paper": FigureStyle("paper", (3.3, 2.1), True, {
        "font.family": "serif", "font.serif": ["Times New Roman", "Times", "Nimbus Roman", "DejaVu Serif"],
        "mathtext.fontset": "dejavuserif", "font.size": 8.0, "axes.titlesize": 8.0, "axes.labelsize": 8.0,
        "legend.fontsize": 7.0, "xtick.labelsize": 7.0, "ytick.labelsize": 7.0, "lines.linewidth": 1.0,
        "lines.markersize": 3.0, "axes.linewidth": 0.6, "pdf.fonttype": 42}, ("pdf",), 300),
}
_CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("fljax_figure_style", default="screen")


@contextlib.contextmanager
def use(name: str):
    """Write the figures made inside in style ``name`` (see :data:`STYLES`)."""
    if name not in STYLES:
        from fljax.errors import ConfigError

        raise ConfigError(f"--style must be one of {sorted(STYLES)}, got {name!r}.")
    token = _CURRENT.set(name)
    try:
        yield STYLES[name]
    finally:
        _CURRENT.reset(token)


def current() -> FigureStyle:
    """The style figures are written in now (``screen`` unless inside :func:`use`)."""
    return STYLES[_CURRENT.get()]


def style(i: int) -> dict:
    """Colour, line style and marker of the i-th line (see the module docstring)."""
    return {"color": PALETTE[i % len(PALETTE)], "linestyle": LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)]}


def rc(name: str | None = None) -> dict:
    """matplotlib settings of style ``name`` (default: the current one) with the line cycle of :func:`style`:
    ``plt.rcParams.update(rc())`` gives a notebook's plots the look of fljax's figures."""
    from cycler import cycler

    n = len(PALETTE) * len(LINESTYLES) * len(MARKERS)
    lines = [style(i) for i in range(n)]
    cycle = cycler(color=[s["color"] for s in lines], linestyle=[s["linestyle"] for s in lines],
                   marker=[s["marker"] for s in lines])
    return {**(STYLES[name] if name else current()).rc, "axes.prop_cycle": cycle, "axes.grid": True,
            "grid.alpha": 0.3, "image.cmap": "viridis"}


def metric_label(key: str, scale: float = 1.0) -> str:
    """The axis label of a logged quantity: what it is and its unit (the key itself when unknown); ``scale=100``:
    fractions in percent. In the paper style (short panels) the second line gives the unit only."""
    label = LABELS.get(key, LABELS.get(key.split("/")[0]))
    for suffix, what in sorted(_SUMMARIES.items(), key=lambda kv: -len(kv[0])):
        if label is None and key.endswith(suffix) and key[:-len(suffix)] in _MODELS:
            label = f"{_MODELS[key[:-len(suffix)]]} {what}"
    label = label or key
    first, *rest = label.split("\n")
    if current().stacked and rest and rest[0].startswith("(") and rest[0].endswith(")"):  # short panels: the unit only
        label = f"{first}\n{rest[0].split(',')[0].rstrip(')')})"
    return label.replace("fraction correct", "% correct").replace("(fraction)", "(%)") if scale == 100 else label


def legend_outside(target, handles=None, labels=None, **kwargs):
    """A legend outside the data: right of an axes or a figure (below it in the stacked paper style)."""
    from matplotlib.figure import Figure

    if handles is None:
        handles, labels = handles_of([target] if not isinstance(target, Figure) else target.axes)
    if not handles:
        return None
    stacked = current().stacked
    if isinstance(target, Figure):
        loc = "outside lower center" if stacked else "outside right center"
        return target.legend(handles, labels, loc=loc, ncols=2 if stacked else 1 + len(handles) // 26, **kwargs)
    if stacked:  # below the x axis's tick labels and label, however many lines they take
        from matplotlib.transforms import ScaledTranslation

        fig = target.figure
        renderer = fig.canvas.get_renderer()
        drop = (target.get_window_extent(renderer).y0 - target.xaxis.get_tightbbox(renderer).y0) / fig.dpi
        below = target.transAxes + ScaledTranslation(0, -drop - 0.03, fig.dpi_scale_trans)
        return target.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below,
                             ncols=2, **kwargs)
    return target.legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5), **kwargs)


def suptitle(fig, title: str, *notes: str) -> None:
    """The figure's title, with the ``notes`` it does not already say on lines below it."""
    notes = [n for n in notes if n and n not in title]  # e.g. "1 seed" that the title already says
    fig.suptitle("\n".join([title, *notes]), fontsize="medium")


def integer_axis(axis) -> None:
    """Whole-number ticks on ``axis`` (``ax.xaxis``, ``ax.yaxis``): rounds, counts of clients, ranks (a short run
    gets no round 0.5, 1.5, …)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def log_axis(ax, which: str = "x") -> None:
    """Log scale on axis ``which`` ('x' or 'y') of ``ax`` with at least three labelled ticks over whatever it
    spans (:func:`_log_ticks`: a span of less than two decades gets 1-2-5 or 1…9 ticks, not one lone 10⁰), written
    as plain numbers (``0.5``, ``2``, ``100``), or all as powers 10ᵏ when the ticks are decades over three or
    more."""
    from matplotlib.ticker import Formatter, Locator, LogLocator, NullFormatter

    class LogTicks(Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin, vmax):
            return _log_ticks(vmin, vmax)

    class LogLabels(Formatter):
        ticks: list = []

        def set_locs(self, locs):  # the axis hands over its ticks before it asks for their labels
            self.ticks = list(locs)

        def __call__(self, value, pos=None):
            locs = [v for v in self.ticks if v > 0]
            decades = len(locs) >= 3 and max(locs) / min(locs) >= 1e3 and all(
                math.isclose(math.log10(v), round(math.log10(v)), abs_tol=1e-9) for v in locs)
            return "" if value <= 0 else f"$10^{{{round(math.log10(value))}}}$" if decades else f"{value:g}"

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogTicks())
    axis.set_major_formatter(LogLabels())
    axis.set_minor_locator(LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis over [lo, hi]: the decades when at least three fall inside (every n-th of many, at most
    8), else 1-2-5 per decade, else 1…9 per decade (the roundest first: 1, then 2 and 5, 3, 4, 6 and 8, 7 and 9,
    each kept unless closer than a seventh of the span to one kept), else four evenly spaced round values."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = sorted((lo, hi))
    if not (hi > 0 and math.isfinite(hi)):
        return []
    lo = lo if lo > 0 else hi / 10
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    inside = lambda ticks: [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]  # noqa: E731
    decades = inside([float(f"1e{k}") for k in range(k0, k1 + 1)])
    if len(decades) >= 3:
        return decades[::math.ceil(len(decades) / 8)]
    onetwofive = inside([float(f"{s}e{k}") for k in range(k0, k1 + 1) for s in (1, 2, 5)])
    if len(onetwofive) >= 3:
        return onetwofive
    gap = math.log10(hi / lo) / 7  # labels closer than this on the axis would crowd
    chosen: list[float] = []
    for subs in ((1,), (2, 5), (3,), (4, 6, 8), (7, 9)):  # the roundest values first
        for t in inside([float(f"{s}e{k}") for k in range(k0, k1 + 1) for s in subs]):
            if all(abs(math.log10(t / c)) >= gap for c in chosen):
                chosen.append(t)
    if len(chosen) >= 3:
        return sorted(chosen)
    return [float(f"{t:.12g}") for t in MaxNLocator(4, steps=[1, 2, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]


def heatmap(ax, values, rows: list, columns: list, label: str, fmt: str = "{:.3f}", cmap: str = "viridis",
            texts: list[list[str]] | None = None, vmin: float | None = None, vmax: float | None = None,
            colorbar: bool = True):
    """``values [len(rows), len(columns)]`` as an image with a colour bar labelled ``label`` (``colorbar=False``:
    none, e.g. one shared by several panels), every cell written in it (``fmt`` of its value, or ``texts[r][c]``;
    NaN: blank), rows and columns ticked by their values; ``vmin``/``vmax``: the colour scale's ends (panels that
    share one)."""
    values = np.asarray(values, float)
    image = ax.imshow(values, cmap=cmap, aspect="auto", interpolation="nearest", vmin=vmin, vmax=vmax)
    ax.grid(False)  # no grid lines across the cells
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(columns)), [str(c) for c in columns])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    finite = values[np.isfinite(values)]
    lo = vmin if vmin is not None else finite.min() if finite.size else 0.0
    hi = vmax if vmax is not None else finite.max() if finite.size else 0.0
    for (r, c), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(c, r, fmt.format(v) if texts is None else texts[r][c], ha="center", va="center",
                    fontsize="small", color="white" if v < (lo + hi) / 2 else "black")
    return image

# ---------------------------------------------------------------------------------------------------- figures


@contextlib.contextmanager
def rc_context():
    """matplotlib's settings of the current style (:func:`rc`) for the figures made inside."""
    import matplotlib

    with matplotlib.rc_context(rc()):
        yield


def figure(panels: int, extra_width: float = 0.0, rows: int | None = None, cols: int | None = None):
    """A figure of ``panels`` axes (side by side, or stacked in the paper style; or ``rows`` × ``cols``) on the Agg
    canvas. matplotlib is imported here, on the first plot, not with this module: its second of imports then never
    delays the start of a run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = current()
    if rows is None:
        rows, cols = (panels, 1) if s.stacked else (1, panels)
    width, height = s.panel
    fig = Figure(figsize=(width * cols + extra_width, height * rows), layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure text with (legend_outside), and the canvas that writes the files
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, list(axes[:panels])


def handles_of(axes) -> tuple[list, list[str]]:
    """Every labelled line of the axes, once per label (for a legend)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


def save(fig, path_png: str, formats: tuple[str, ...] = FORMATS) -> list[str]:
    """Write ``fig`` as ``path_png`` in ``formats`` and those of the current style (``x.png`` → ``x.pdf``, …);
    returns the paths written."""
    s = current()
    stem = path_png[: -len(".png")] if path_png.endswith(".png") else path_png
    paths = [f"{stem}.{fmt}" for fmt in dict.fromkeys((*formats, *s.formats))]
    for path in paths:
        write_figure(path, fig, dpi=s.dpi)
    return paths


def plot_heatmap(path: str, grid: dict[str, list], finals: dict[tuple[int, int], list[float]], title: str,
                 key: str = "personal_acc") -> list[str]:
    """A sweep over two grid keys: the final ``key`` of every point (mean over seeds; ``finals``: (index of the
    first key's value, index of the second's) → the seeds' values) as a heatmap, the first key down, the second
    across. Returns the paths written."""
    from fljax.runner.sweep import grid_columns

    (k1, v1), (k2, v2) = list(grid.items())
    names = grid_columns(grid)
    values = np.array([[np.mean(finals[i, j]) if finals.get((i, j)) else np.nan for j in range(len(v2))]
                       for i in range(len(v1))])
    seeds = max((len(v) for v in finals.values()), default=1)
    with rc_context():
        s = current()
        fig, (ax,) = figure(1)
        fig.set_size_inches(s.panel[0] * (1.0 if s.stacked else 1.4), s.panel[1] * (1.2 if s.stacked else 1.3))
        heatmap(ax, values, v1, v2, "final " + metric_label(key))
        ax.set_xlabel(f"{names[k2]} ({k2})")
        ax.set_ylabel(f"{names[k1]} ({k1})")
        suptitle(fig, title, "final evaluation" + (f", mean over {seeds} seeds" if seeds > 1 else ""))
        return save(fig, path)
