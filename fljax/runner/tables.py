"""The one module that renders every reproduction's report: tables (Markdown) and plots (PNG) declared in the
study file, the claims' verdicts and the time spent.

A table (``tables:`` in the study file)::

    - title: "Table 1 (reduced): personal accuracy"
      study: table                      # the study whose cells fill it
      rows: method                      # one row per value of this axis (or a list of axes: one row per combination)
      where: {split: [pat2, dir0.3]}    # restrict the cells
      columns:
        - {axis: split, value: personal_acc, scale: 100}          # one column per value of the axis
        - {title: MB, where: {split: dir0.1}, value: (bytes_up + bytes_down) / 1e6, scale: 1, digits: 1}
        - {title: "paper", paper: {FedAvg: 83.87, DFedAlt: 86.21}}  # the paper's numbers, by row
        - {title: "DFedAlt − method", value: personal_acc, minus: {method: DFedAlt}, scale: 100}  # paired
        - {title: "seeds DFedAlt ahead", value: personal_acc, wins: {method: DFedAlt}}
        - {title: "reported model", tag: reported}                   # a tag of the row's cell
        - {title: "time to 80% (s)", value: virtual_time, first: {metric: global_acc, at_least: 0.8}}

A cell is the mean ± std over seeds (:func:`fljax.runner.report.mean_std`: the sample std, ddof 1) of ``value`` (a
metric name or an expression of names, see :func:`fljax.runner.study.evaluate`; ``{tag}`` is replaced by the row's
tag, e.g. ``"{reported}_acc"``) at the final evaluation, or at round ``at``, or at the first evaluation where
``first``'s metric reaches its ``at_least`` (time to a target: the seeds that never reach it are counted beside the
mean, "(2 of 3 seeds)", and the cell is "not reached" when none does); ``format: mean`` drops the std,
``format: g`` prints 3 significant digits.

A plot (``plots:``, written as PNG and PDF in the style of :mod:`fljax.runner.plots`):
``kind: curves`` (value vs round, or vs the recorded quantity ``x`` — ``x: virtual_time``, the participation's
clock —, one line per value of ``lines``, one panel per value of ``panels``) or
``kind: final`` (the final value against the numeric axis ``x``, one line per combination of ``lines``; with
``x_value``, a metric or expression, x is that measured value's mean over seeds with its std as a horizontal error bar
— accuracy against ε or against MB sent — and ``x`` may then be left out: one point per combination of ``lines``);
``value`` may be a list (one panel per metric); the panels of one metric (``panels``) share one y range; ``logy``,
``logx`` for log scales (at least three labelled ticks, :func:`fljax.runner.plots.log_axis`); ``xlabel``,
``ylabel``; a line of a numeric value is named with its key (``z = 0.5``: ``symbols: {privacy.noise_multiplier:
z}``, else the key's last part);
``reference: {study, value, where, label}`` draws another cell's mean final value as a dashed level. ``study`` may
be a list: the lines of every study listed, in one figure (e.g. methods that are studies of their own).
``kind: heatmap`` (the final value of every combination of the axes ``rows`` and ``columns``, a panel per value of
``panels``, one colour scale labelled ``label``; an attack × defence table: :func:`_heatmap`).
"""
from __future__ import annotations

import importlib
import itertools
import os

import numpy as np

from fljax.runner.report import markdown_table, mean_std, sample_std

__all__ = ["render_report", "render_plots", "table", "value_text", "claims_of"]


def value_text(values: np.ndarray, scale: float = 100.0, digits: int = 2, form: str = "mean_std") -> str:
    """A report cell: :func:`~fljax.runner.report.mean_std` of the seeds' ``values`` that exist (a missing metric
    is NaN: left out), in percent to 2 decimals by default."""
    values = np.asarray(values, float)
    return mean_std(values[~np.isnan(values)], digits, scale=scale, form=form)


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _axis_values(results, study: str, axis: str, where: dict) -> list:
    """The values of ``axis`` among the study's cells (in cell order), restricted by ``where``."""
    seen = []
    for c in results.cells:
        if c.study != study or axis not in c.labels:
            continue
        if any(c.labels.get(k) not in _as_list(v) for k, v in where.items()):
            continue
        if c.labels[axis] not in seen:
            seen.append(c.labels[axis])
    return seen


def _label(results, axis: str, value) -> str:
    display = ((results.study.spec.get("axes", {}).get(axis) or {}).get(value) or {}) if isinstance(value, str) \
        else {}
    return str((display.get("tags") or {}).get("title", value)) if isinstance(display, dict) else str(value)


def _values(results, study: str, spec: dict, labels: dict) -> np.ndarray:
    cell = results.cell(study, **labels)
    if cell is None:
        return np.array([])
    value = spec["value"].format(**cell.tags) if "{" in spec["value"] else spec["value"]
    if "at" in spec:
        return results.at_round(study, value, spec["at"], **labels)
    return results.final(study, value, **labels)


def table(results, spec: dict) -> str:
    """One table of the study file, as Markdown."""
    study = spec["study"]
    where = spec.get("where", {})
    row_axes = _as_list(spec["rows"])
    row_values = [_axis_values(results, study, a, where) for a in row_axes]
    header = [a.split(".")[-1] for a in row_axes]
    columns = []  # (title, column spec, extra labels)
    for col in spec["columns"]:
        if "axis" in col:
            for v in _axis_values(results, study, col["axis"], {**where, **col.get("where", {})}):
                columns.append((col.get("title", "{}").format(_label(results, col["axis"], v)), col,
                                {col["axis"]: v}))
        else:
            columns.append((col["title"], col, {}))
    header += [t for t, _, _ in columns]
    rows = []
    for combo in itertools.product(*row_values):
        labels = dict(zip(row_axes, combo))
        row = [_label(results, a, v) for a, v in labels.items()]
        for _, col, extra in columns:
            row.append(_column_cell(results, study, col, {**_fixed(where), **labels, **extra,
                                                          **_fixed(col.get("where", {}))}))
        if any(x != "-" for x in row[len(row_axes):]):
            rows.append(row)
    return markdown_table(rows, header)


def _fixed(where: dict) -> dict:
    return {k: v for k, v in where.items() if not isinstance(v, list)}


def _column_cell(results, study: str, col: dict, labels: dict) -> str:
    scale, digits, form = col.get("scale", 100.0), col.get("digits", 2), col.get("format", "mean_std")
    if "tag" in col:
        cell = results.cell(study, **labels)
        return "-" if cell is None else str(cell.tags.get(col["tag"], "-"))
    if "paper" in col:
        key = next(iter(labels.values())) if len(labels) == 1 else "/".join(str(v) for v in labels.values())
        value = col["paper"].get(key, col["paper"].get(str(key)))
        return "-" if value is None else str(value)
    if "first" in col:  # time to a target: the value at the first evaluation that reaches it
        target = col["first"]
        values = results.first(study, col["value"], target["metric"], target["at_least"], **labels)
        if not values.size:
            return "-"
        reached = ~np.isnan(values)
        if not reached.any():
            return "not reached"
        text = value_text(values, scale, digits, form)
        return text if reached.all() else f"{text} ({reached.sum()} of {values.size} seeds)"
    values = _values(results, study, col, labels)
    reference = col.get("minus") or col.get("wins")
    if reference is None:
        return value_text(values, scale, digits, form)
    other = _values(results, study, col, {**labels, **reference})
    if labels == {**labels, **reference} or not values.size or other.size != values.size:
        return "-"
    if "wins" in col:
        return f"{int(np.sum(other > values))}/{values.size}"
    return value_text(other - values, scale, digits, form)


def render_report(results) -> str:
    """The reproduction's README.md: provenance, every table of the study file, the claims, the time spent."""
    spec, meta = results.study.spec, results.meta
    wall = meta.get("wall_seconds", 0.0)
    made = (f"{meta.get('computed')} computed in this invocation, {meta.get('jobs')} job(s), {wall / 60:.1f} min of "
            f"wall time in the invocations that computed them" if wall is not None else
            f"{meta.get('computed')} finished, read from the run directories; the invocations' wall time was not "
            f"recorded")
    parts = [f"# {results.study.title}", "",
             f"Command: `{_command(results)}`  ",
             f"Runs: {meta.get('runs')} ({made}). "
             + spec.get("values_note", "Values: final evaluation, unweighted mean over clients, mean ± std over seeds "
                                       "(sample std, ddof 1).")]
    missing = [c for c in results.cells if any(c.key(seed) not in results.runs for seed in c.seeds)]
    if missing:  # a report rendered before every run finished says which rows it lacks
        count = len({c.key(s) for c in missing for s in c.seeds if c.key(s) not in results.runs})
        parts += ["", f"**Not run**: {count} run{'s' * (count != 1)} of {len(missing)} "
                      f"cell{'s' * (len(missing) != 1)}, whose rows are missing or hold fewer seeds: "
                  + "; ".join(f"{c.study} " + ", ".join(f"{k} = {v}" for k, v in c.labels.items()) for c in missing)
                  + "."]
    for t in spec.get("tables", []):
        if results.cell(t["study"]) is None:
            continue
        body = table(results, t)
        if body:
            parts += ["", f"## {t['title']}", ""] + ([t["note"], ""] if t.get("note") else []) + [body]
    claims = claims_of(results)
    if claims:
        parts += ["", f"## {spec.get('claims_title', 'Claims')}", "",
                  markdown_table([list(c) for c in claims], ["claim", "measured", "verdict"])]
    for title, body in _sections(results):
        parts += ["", f"## {title}", "", body]
    parts += ["", "## Time per run (this machine)", "", _timing(results)]
    return "\n".join(parts) + "\n"


def claims_of(results) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) rows from the study's ``claims: module:function`` applied to ``results``."""
    return _hook(results, "claims")


def _hook(results, key: str) -> list:
    """What the study file's ``key: module:function`` (``claims``, ``sections``) computes from ``results``."""
    target = results.study.spec.get(key)
    if not target:
        return []
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(results)


def _command(results) -> str:
    meta = results.meta
    argv = [f"fljax reproduce {results.study.name}"]
    if meta.get("only") and meta["only"] != results.study.studies:
        argv.append("--only " + ",".join(meta["only"]))
    for key in ("seeds", "rounds"):
        if meta.get(key):
            argv.append(f"--{key} {meta[key]}")
    if meta.get("jobs", 1) > 1:
        argv.append(f"--jobs {meta['jobs']}")
    if meta.get("lanes") and meta["lanes"] != results.study.spec.get("lanes", "vmap"):
        argv.append(f"--lanes {meta['lanes']}")
    return " ".join(argv)


def _sections(results) -> list[tuple[str, str]]:
    """Extra sections from the study's ``sections: module:function`` (checks that are not runs)."""
    return _hook(results, "sections")


def _timing(results) -> str:
    by_algo: dict[str, list] = {}
    for run in results.runs.values():
        s = run["summary"]
        by_algo.setdefault(s.get("algorithm", "?"), []).append(s)
    rows = [[a, str(len(r)), f"{np.mean([x.get('run_seconds', 0) for x in r]):.1f}",
             f"{np.mean([x.get('compile_seconds', 0) for x in r]):.1f}"] for a, r in sorted(by_algo.items())]
    return markdown_table(rows, ["algorithm", "runs", "run s (mean)", "compile s (mean)"])


# ---------------------------------------------------------------------------------------------------- plots


def render_plots(results, out: str) -> list[str]:
    """Every plot of the study file whose study has results, in the current figure style
    (:func:`fljax.runner.plots.use`); returns the files written."""
    from fljax.runner import plots

    written = []
    for spec in results.study.spec.get("plots", []):
        if all(results.cell(study) is None for study in _as_list(spec["study"])):
            continue
        with plots.rc_context():
            fig = _plot(results, spec)
            if fig is not None:  # PNG to show, PDF to print, like every other fljax plot
                written += plots.save(fig, os.path.join(out, spec["file"]))
    return written


def _line_label(results, spec: dict, axis: str, value) -> str:
    """A line's name for ``axis`` = ``value`` in a plot's legend: the display name of a named value ('DFedAlt'),
    a number with its key (``z = 0.5``: the plot's ``symbols: {privacy.noise_multiplier: z}``, else the key's last
    part, ``k = 5``)."""
    if isinstance(value, str):
        return _label(results, axis, value)
    symbol = spec.get("symbols", {}).get(axis, axis.split(".")[-1])
    return f"{symbol} = {value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else f"{symbol} = {value}"


def _seed_count(results, study: str) -> int:
    return max((len(c.seeds) for c in results.cells if c.study == study), default=1)


def _plot(results, spec: dict):
    """One figure of the study file: a panel per metric or per value of ``panels``; a line per combination of
    ``lines`` in the styles of :mod:`fljax.runner.plots`, with a ± 1 std band (curves) or error bars (final)."""
    from fljax.runner import plots

    if spec.get("kind") == "heatmap":
        return _heatmap(results, spec)
    studies, where = _as_list(spec["study"]), spec.get("where", {})
    metrics = _as_list(spec["value"])
    panel_axis = spec.get("panels")
    values = dict.fromkeys(v for s in studies for v in _axis_values(results, s, panel_axis, where)) if panel_axis \
        else {}
    panels = [(None, m) for m in metrics] if panel_axis is None else [(v, metrics[0]) for v in values]
    if not panels:
        return None
    fig, axes = plots.figure(len(panels), extra_width=0.0 if plots.current().stacked else 2.2)
    line_axes = _as_list(spec.get("lines", []))
    scale = spec.get("scale", 1.0)
    curves = spec.get("kind", "curves") == "curves"
    for ax, (panel_value, metric) in zip(axes, panels):
        sub_where = {**where, **({panel_axis: panel_value} if panel_axis else {})}
        combos = [(study, combo) for study in studies
                  for combo in itertools.product(*[_axis_values(results, study, a, sub_where) for a in line_axes])]
        for i, (study, combo) in enumerate(combos):
            labels = {**_fixed(sub_where), **dict(zip(line_axes, combo))}
            name = " ".join(_line_label(results, spec, a, v) for a, v in zip(line_axes, combo))
            style = plots.style(i)  # the colours, line styles and markers of every fljax plot
            if curves:
                x, mean, std = results.curve(study, metric, spec.get("x", "round"), **labels)
                if spec.get("logx"):  # a log axis has no place for x <= 0 (the initial model at 0 s)
                    x, mean, std = x[x > 0], mean[x > 0], std[x > 0]
                if x.size:
                    ax.plot(x, scale * mean, label=name, markevery=max(1, x.size // 10), **style)
                    if len(results.seeds(study, **labels)) > 1:
                        ax.fill_between(x, scale * (mean - std), scale * (mean + std), color=style["color"],
                                        alpha=0.15, linewidth=0)
            else:
                points = [{**labels, spec["x"]: x} for x in _axis_values(results, study, spec["x"], labels)] \
                    if "x" in spec else [labels]
                ys = [results.final(study, metric, **p) for p in points]
                xs, xerr = [p[spec["x"]] for p in points] if "x" in spec else [np.nan] * len(points), None
                if "x_value" in spec:  # x measured too (e.g. ε or MB sent): its mean over seeds, ± its std
                    xv = [results.final(study, spec["x_value"], **p) for p in points]
                    xs = [np.mean(x) if x.size else np.nan for x in xv]
                    xerr = [sample_std(x) if x.size else np.nan for x in xv]
                ax.errorbar(xs, [scale * np.mean(y) if y.size else np.nan for y in ys],
                            [scale * sample_std(y) if y.size else np.nan for y in ys], xerr,
                            capsize=3, label=name, **style)
        for ref in _as_list(spec.get("reference", [])):  # a dashed level: e.g. the non-private run's accuracy
            y = results.final(ref.get("study", studies[0]), ref.get("value", metric), **ref.get("where", {}))
            if y.size:
                ax.axhline(spec.get("scale", 1.0) * np.mean(y), ls="--", lw=1, color="0.35",
                           label=ref.get("label", "reference"))
        if spec.get("logy"):
            plots.log_axis(ax, "y")
        if spec.get("logx"):
            plots.log_axis(ax, "x")
        elif curves and spec.get("x", "round") == "round" or not curves and "x_value" not in spec and all(
                isinstance(x, int) and not isinstance(x, bool) for x in _axis_values(results, studies[0], spec["x"],
                                                                                     where)):
            plots.integer_axis(ax.xaxis)  # rounds, k neighbours, clients: no 0.5
        along = {"round": plots.ROUND, "virtual_time": plots.VIRTUAL}
        ax.set_xlabel(spec.get("xlabel") or (along.get(spec.get("x", "round"), spec.get("x")) if curves else
                                             spec.get("x_value") or spec["x"].split(".")[-1]))
        ax.set_ylabel(spec.get("ylabel") or plots.metric_label(metric, scale))
        title = spec.get("title", "{value}")
        ax.set_title(title.format(value=metric, panel=_label(results, panel_axis, panel_value) if panel_axis
                                  else metric), fontsize="medium")
        ax.grid(alpha=0.3)
    if panel_axis:  # one metric in every panel: one y range, so that the panels compare at a glance
        for ax in axes[1:]:
            ax.sharey(axes[0])
        axes[0].autoscale_view()  # the union of every panel's data (sharey alone keeps the first panel's range)
    plots.legend_outside(fig, *plots.handles_of(axes))
    seeds = max(_seed_count(results, study) for study in studies)
    fig.suptitle(("line: mean over {n} seeds, band: ± 1 std (sample)" if curves else
                  "mean over {n} seeds, error bar: ± 1 std (sample)").format(n=seeds) if seeds > 1 else "1 seed",
                 fontsize="medium")
    return fig


def _heatmap(results, spec: dict):
    """``kind: heatmap``: the final ``value`` (× ``scale``, mean over seeds; ``{tag}`` from each cell's tags) with the
    values of axis ``rows`` down and of ``columns`` across, one panel per value of ``panels``, one colour scale
    (``label``), every cell written in it."""
    from fljax.runner import plots

    study, where, scale = spec["study"], spec.get("where", {}), spec.get("scale", 1.0)
    panel_axis = spec.get("panels")
    panel_values = _axis_values(results, study, panel_axis, where) if panel_axis else [None]
    rows, cols = (_axis_values(results, study, spec[k], where) for k in ("rows", "columns"))
    grids = []
    for p in panel_values:
        fixed = {**_fixed(where), **({panel_axis: p} if panel_axis else {})}
        values = [[_values(results, study, spec, {**fixed, spec["rows"]: r, spec["columns"]: c}) for c in cols]
                  for r in rows]
        grids.append(np.array([[scale * v.mean() if v.size else np.nan for v in row] for row in values]))
    finite = np.concatenate([g[np.isfinite(g)] for g in grids])
    if not finite.size:
        return None
    fig, axes = plots.figure(len(grids), rows=1, cols=len(grids))
    fig.set_size_inches((0.8 * len(cols) + 1.8) * len(grids) + 1.0, 0.45 * len(rows) + 1.9)
    for ax, p, grid in zip(axes, panel_values, grids):
        image = plots.heatmap(ax, grid, [_label(results, spec["rows"], r) for r in rows],
                              [_label(results, spec["columns"], c) for c in cols], "", spec.get("format", "{:.1f}"),
                              vmin=finite.min(), vmax=finite.max(), colorbar=False)
        ax.tick_params(axis="x", labelrotation=30)
        ax.set_title(spec.get("title", "{panel}").format(panel=_label(results, panel_axis, p) if panel_axis else ""),
                     fontsize="medium")
    axes[0].set_ylabel(spec.get("ylabel", spec["rows"]))
    for ax in axes:
        ax.set_xlabel(spec.get("xlabel", spec["columns"]))
    fig.colorbar(image, ax=axes, label=spec.get("label", plots.metric_label(spec["value"], scale)), shrink=0.9)
    seeds = _seed_count(results, study)
    fig.suptitle(f"cell: mean over {seeds} seeds" if seeds > 1 else "1 seed", fontsize="medium")
    return fig
