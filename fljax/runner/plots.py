"""The figures of runs, comparisons, sweeps and studies, in one style (matplotlib's Agg canvas: no display, no
global backend change).

**Lines.** Line *i* has colour ``i mod 7`` of the Okabe–Ito palette (built to stay distinct for colour-blind
readers; its yellow is left out, too light on white), line style ``⌊i/7⌋ mod 4`` and marker ``i mod 11``: the first
308 lines all differ, neighbours differ in colour and marker, the first 7 are solid (:func:`style`). A comparison of
more than :data:`MAX_LINES` algorithms is drawn as small multiples, one row of panels per family
(:mod:`fljax.algorithms.families`), each row with its own styles; a sweep's points are grouped by the value of its
first grid key. Legends sit outside the data. With several seeds a curve is the mean over seeds and the shaded band
± 1 sample standard deviation (ddof 1, the tables' convention); the figure's title says so. Every axis names its
quantity and unit (:func:`metric_label`); rounds are ticked in whole numbers (:func:`integer_axis`) and a log axis
labels at least three values whatever it spans (:func:`log_axis`). A logged quantity that is constant throughout (zero, or a fixed parameter
count) is not drawn; the figure's title lists it with its value.

**Figures.** A run: ``accuracy_vs_round``, ``accuracy_vs_bytes`` (communication up + down so far, log scale; not
drawn when nothing was communicated), ``accuracy_vs_virtual_time`` (the participation's virtual clock,
:mod:`fljax.participation`; drawn when the run kept one), ``client_accuracy`` (histogram of the clients' personalized accuracies at the
last evaluation) and ``metrics`` (one panel per other logged quantity: training loss, FedSLR's ranks and sparsity,
DFedAlt's consensus distance, …). A comparison or sweep (:func:`plot_compare`): personalized accuracy against rounds
and against communicated MB, the global model's accuracy where an algorithm's global model differs from its
personalized one, and personalized accuracy against virtual time where runs kept a clock; ``*_metrics`` with the other logged quantities. A sweep over two grid keys (:func:`plot_heatmap`):
the final personalized accuracy of every grid point as a heatmap. Every curve starts at round 0 (the initial model);
markers show every evaluation when there are at most :data:`MARK_ALL` of them.

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
from fljax.runner.report import sample_std

__all__ = ["plot_run", "plot_compare", "plot_heatmap", "setting", "style", "extras", "constants", "metric_label",
           "use", "current", "rc", "legend_outside", "heatmap", "integer_axis", "log_axis", "FORMATS", "STYLES",
           "PALETTE", "MAX_LINES"]

FORMATS = ("png", "pdf")
# Okabe & Ito (2008), "Color Universal Design": blue, orange, bluish green, vermillion, reddish purple, sky blue,
# black (yellow #F0E442 left out: too light for a line on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")  # 11: coprime to 7 colours × 4 line styles
MAX_LINES = 8  # more lines than this in one panel: small multiples
MARK_ALL = 25
# record keys that are not extra quantities: the accuracy/loss summaries, communication, time
_STANDARD = ("round", "bytes_up", "bytes_down", "run_seconds", "virtual_time")
_SUMMARY_SUFFIXES = ("_acc", "_acc_p10", "_acc_weighted", "_loss", "_loss_weighted")
ROUND = "communication round"
MB = "communicated MB (up + down, cumulative; log scale)"
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
              "_loss_weighted": "test loss\n(cross-entropy, nats, sample-weighted)"}
COUNTS = ("rank", "gkr_params", "mixed_params")  # whole numbers: integer ticks


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
        handles, labels = _handles([target] if not isinstance(target, Figure) else target.axes)
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


def heatmap(ax, values, rows: list, columns: list, label: str, fmt: str = "{:.3f}", cmap: str = "viridis"):
    """``values [len(rows), len(columns)]`` as an image with a colour bar labelled ``label``, every cell written
    in it (NaN: blank), rows and columns ticked by their values."""
    values = np.asarray(values, float)
    image = ax.imshow(values, cmap=cmap, aspect="auto", interpolation="nearest")
    ax.grid(False)  # no grid lines across the cells
    ax.figure.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(columns)), [str(c) for c in columns])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    finite = values[np.isfinite(values)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (r, c), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(c, r, fmt.format(v), ha="center", va="center", fontsize="small",
                    color="white" if v < middle else "black")
    return image


# ---------------------------------------------------------------------------------------------------- internals


@contextlib.contextmanager
def _rc():
    import matplotlib

    with matplotlib.rc_context(rc()):
        yield


def _figure(panels: int, extra_width: float = 0.0, rows: int | None = None, cols: int | None = None):
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


def _handles(axes) -> tuple[list, list[str]]:
    """Every labelled line of the axes, once per label (for a legend)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


def _seeds_note(seeds: int) -> str:
    return (f"line: mean over {seeds} seeds, band: ± 1 std (sample)" if seeds > 1 else "1 seed")


def _title(fig, title: str, *notes: str) -> None:
    notes = [n for n in notes if n and n not in title]  # e.g. "1 seed" that the title already says
    fig.suptitle("\n".join([title, *notes]), fontsize="medium")


def _save(fig, path_png: str, formats: tuple[str, ...] = FORMATS) -> list[str]:
    s = current()
    stem = path_png[: -len(".png")] if path_png.endswith(".png") else path_png
    paths = [f"{stem}.{fmt}" for fmt in dict.fromkeys((*formats, *s.formats))]
    for path in paths:
        write_figure(path, fig, dpi=s.dpi)
    return paths


def _metrics_figure(runs: dict[str, list[list[dict]]], title: str, labelled: bool, seeds: int,
                    indices: dict[str, int] | None = None):
    """One panel per changing extra quantity (see :func:`extras`), ``rank/<layer>`` keys sharing a panel."""
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
    fig, axes = _figure(len(panels), rows=rows, cols=cols)
    indices = indices or {label: i for i, label in enumerate(runs)}
    for ax, (panel, members) in zip(axes, panels.items()):
        for label, histories in runs.items():
            for j, key in enumerate(members):
                fmt = style(indices[label]) if labelled else style(j)
                name = (label if j == 0 else None) if labelled else (key.split("/", 1)[-1] if len(members) > 1
                                                                      else None)
                _line(ax, histories, key, "round", fmt, name)
        _axes_labels(ax, members[0], "round")
        if len(members) == 1 and "/" in members[0]:
            ax.set_ylabel(f"{metric_label(members[0])}\n{members[0].split('/', 1)[1]}")
        if members[0].split("/")[0] in COUNTS:
            integer_axis(ax.yaxis)
        if len(members) > 1 and not labelled:
            legend_outside(ax, title=panel.split("/")[0] + " of", fontsize="x-small")
    if labelled:
        legend_outside(fig)
    _title(fig, title, _seeds_note(seeds), _constants_note(every))
    return fig


def plot_run(directory: str, histories: list[list[dict]], per_client: list[dict], title: str,
             formats: tuple[str, ...] = FORMATS) -> list[str]:
    """The plots of one run (``histories``/``per_client``: one per seed) in ``formats`` (and those of the
    current style); returns the paths written."""
    paths = []
    seeds = len(histories)
    with _rc():
        for name, x in (("accuracy_vs_round", "round"), ("accuracy_vs_bytes", "bytes"),
                        ("accuracy_vs_virtual_time", "virtual_time")):
            if x == "bytes" and not _communicates(histories) or x == "virtual_time" and not _clocked(histories):
                continue  # nothing communicated (Local): no bytes plot; no clock: no virtual time plot
            fig, (ax,) = _figure(1, extra_width=0.0 if current().stacked else 1.6)
            _line(ax, histories, "personal_acc", x, style(0), "personalized model")
            if _own_global(histories):
                _line(ax, histories, "global_acc", x, style(1), "global model")
            _axes_labels(ax, "personal_acc", x)
            ax.set_ylabel(metric_label("personal_acc").replace("personalized ", ""))
            legend_outside(ax)
            one = "" if _own_global(histories) or not any("global_acc" in r for h in histories for r in h) else \
                "the personalized model is the global model"
            _title(fig, title, _seeds_note(seeds), one)
            paths += _save(fig, f"{directory}/{name}.png", formats)
        accs = [np.asarray(p[k]) for p in per_client for k in ("personal_acc",) if k in p]
        if accs:
            fig, (ax,) = _figure(1)
            ax.hist(np.concatenate(accs), bins=np.linspace(0, 1, 21), color=PALETTE[0], edgecolor="white")
            ax.set_xlabel("personalized test accuracy of a client (fraction correct)")
            ax.set_ylabel("clients (count" + (f", all {len(accs)} seeds)" if len(accs) > 1 else ")"))
            integer_axis(ax.yaxis)
            _title(fig, title, "clients at the last evaluation")
            paths += _save(fig, f"{directory}/client_accuracy.png", formats)
        fig = _metrics_figure({"run": histories}, title, labelled=False, seeds=seeds)
        if fig is not None:
            paths += _save(fig, f"{directory}/metrics.png", formats)
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


def plot_compare(path: str, runs: dict[str, list[list[dict]]], title: str,
                 groups: dict[str, str] | None = None) -> list[str]:
    """``path`` (.png, with a .pdf beside it): personalized accuracy against rounds and against communicated MB,
    one style per run label (:func:`style`), and the global model's accuracy for the runs whose global model
    differs from their personalized one; more than :data:`MAX_LINES` runs as small multiples, one row per group
    (``groups``: label → group name, e.g. the algorithm's family; default: runs in order, :data:`MAX_LINES` a
    row). ``<stem>_metrics`` with the other logged quantities. Returns the paths written."""
    seeds = max(len(h) for h in runs.values())
    indices = {label: i for i, label in enumerate(runs)}
    silent = [k for k, h in runs.items() if not _communicates(h)]
    with _rc():
        if len(runs) <= MAX_LINES:
            fig = _compare_panels(runs, indices, silent)
        else:
            fig = _compare_small_multiples(runs, _groups(runs, groups), silent)
        _title(fig, title, _seeds_note(seeds))
        paths = _save(fig, path)
        metrics = _metrics_figure(runs, title, labelled=True, seeds=seeds, indices=indices)
        if metrics is not None:
            stem = path[: -len(".png")] if path.endswith(".png") else path
            paths += _save(metrics, f"{stem}_metrics.png")
    return paths


def _compare_panels(runs, indices, silent):
    """Up to MAX_LINES runs: personalized accuracy vs round and vs MB, global accuracy where it differs, and
    personalized accuracy against virtual time when runs kept a clock."""
    own_global = [k for k, h in runs.items() if _own_global(h)]
    clocked = [k for k, h in runs.items() if _clocked(h)]
    fig, axes = _figure(2 + bool(own_global) + bool(clocked))
    for label, histories in runs.items():
        _line(axes[0], histories, "personal_acc", "round", style(indices[label]), label)
        _line(axes[1], histories, "personal_acc", "bytes", style(indices[label]), label)
        if label in own_global:
            _line(axes[2], histories, "global_acc", "round", style(indices[label]), label)
        if label in clocked:
            _line(axes[-1], histories, "personal_acc", "virtual_time", style(indices[label]), label)
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
    legend_outside(fig, *_handles(axes))
    return fig


def _compare_small_multiples(runs, groups: dict[str, list[str]], silent):
    """More than MAX_LINES runs: a row per group, personalized accuracy against rounds and against MB (one column
    in the paper style), each row with its own styles and legend; every panel on one accuracy scale."""
    s = current()
    cols = 1 if s.stacked else 2
    fig, axes = _figure(len(groups) * cols, extra_width=0.0 if s.stacked else 2.0, rows=len(groups), cols=cols)
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
        legend_outside(row_axes[-1], *_handles(row_axes))
    return fig


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
    with _rc():
        s = current()
        fig, (ax,) = _figure(1)
        fig.set_size_inches(s.panel[0] * (1.0 if s.stacked else 1.4), s.panel[1] * (1.2 if s.stacked else 1.3))
        heatmap(ax, values, v1, v2, "final " + metric_label(key))
        ax.set_xlabel(f"{names[k2]} ({k2})")
        ax.set_ylabel(f"{names[k1]} ({k1})")
        _title(fig, title, "final evaluation" + (f", mean over {seeds} seeds" if seeds > 1 else ""))
        return _save(fig, path)
