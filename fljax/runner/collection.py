"""The collections: a comparison (one point per algorithm) and a sweep (one point per grid point), each run
through :func:`fljax.runner.points.run_points` into ``out/<label>/``, with its own table, figures and summary at
``out``.

A collection's root keeps the base config (``config.yaml``), a ``directory.json`` naming its kind and what it
lists (the algorithms, the grid: what ``--resume`` continues, :mod:`fljax.runner.directories`) and a
``summary.json`` whose status is 'running', 'interrupted' (a signal stopped it) or 'completed'.
"""
from __future__ import annotations

import math

from fljax.config import RUNS_MAX, ConfigError, ExperimentConfig, to_dict
from fljax.engine.processes import lead_only
from fljax.experiment import Experiment, compare_points
from fljax.runner import interrupt, lock
from fljax.runner.points import run_points
from fljax.runner.attack_table import attack_markdown, attack_rows, is_attack_grid, plot_attacks
from fljax.runner.report import Output, distinct_table
from fljax.runner.results import RunDir
from fljax.runner.plots import plot_heatmap
from fljax.runner.run_plots import plot_compare, setting, shared_delta
from fljax.runner.runs import ExperimentResult
from fljax.runner.sweep import (DataCache, check_swept_options, grid_columns, grid_points, point_experiment,
                                point_label)

__all__ = ["compare_experiments", "sweep_experiments", "sweep_points"]


def compare_experiments(cfg: ExperimentConfig, algorithms: list[str | tuple[str, dict]], out: str | None, *,
                        resume: bool = False, output: Output | None = None, plots: bool = True,
                        data_cache: DataCache | None = None, model=None
                        ) -> tuple[str, dict[str, ExperimentResult]]:
    """Run every algorithm (a name, or (name, its own hyperparameters)) on the data, partition and seeds of the
    parsed config ``cfg`` into ``out/<label>/``; write the table (``compare.md``), ``compare.png`` and
    ``summary.json`` into ``out``. Every algorithm's experiment is resolved before anything runs
    (:func:`fljax.experiment.compare_points`: ``cfg.algo`` applies to the algorithms that declare its keys).
    Returns the table as ``compare.md`` holds it (Markdown, with its notes:
    :func:`~fljax.runner.report.distinct_table`) and the results by label."""
    out = lead_only(out)
    output = output or Output()
    resolved = compare_points(cfg, algorithms)
    points = [(lbl, exp) for lbl, exp, _, _ in resolved]
    listing = [{"label": lbl, "algorithm": name, "hyperparameters": hyper} for lbl, _, name, hyper in resolved]
    with lock.hold([out]):
        results = _run_collection(points, cfg, {"algorithms": listing}, out, "comparison", resume=resume,
                                  output=output, plots=plots, data_cache=data_cache, model=model)
        return _compare_table(cfg, points, results, listing, RunDir(out), plots)


def _compare_table(cfg, points, results, listing, root: RunDir, plots: bool):
    """The comparison's table (with its notes: :func:`~fljax.runner.report.distinct_table`), plot and summary."""
    from fljax.algorithms.families import family, untuned

    by_label = {lbl: r for (lbl, _), r in zip(points, results)}
    rows = [{**r.row(lbl), "status": r.status} for lbl, r in by_label.items()]
    title = (f"{setting(cfg, results[0].runs[0].data)}, {cfg.rounds} rounds, "
             f"{cfg.seeds} seed{'s' if cfg.seeds > 1 else ''}")
    hints = {lbl: text for lbl, exp in points if (text := untuned(exp.algorithm, cfg.rounds))}
    caveats = {lbl: f"{lbl}: {' '.join(r.warnings)}" for lbl, r in by_label.items() if r.warnings}
    table = distinct_table(rows, hints, caveats=caveats)
    root.write_text("compare.md", f"# {title}\n\n{table}\n")
    if plots and root.path is not None:
        plot_compare(root.file("compare.png"), {lbl: r.histories for lbl, r in by_label.items()}, title,
                     groups={a["label"]: family(a["algorithm"]) for a in listing},
                     delta=shared_delta([run for r in by_label.values() for run in r.runs]))
    root.write_summary({**_collection_status(by_label), "algorithms": listing,
                        "results": {lbl: r.summary for lbl, r in by_label.items()}})
    return table, by_label


def sweep_experiments(cfg: ExperimentConfig, grid: dict[str, list], out: str | None, *, resume: bool = False,
                      output: Output | None = None, plots: bool = True, lanes: str = "vmap",
                      data_cache: DataCache | None = None, model=None
                      ) -> tuple[str, dict[str, ExperimentResult]]:
    """Run every point of ``grid`` (dotted keys → values, :func:`~fljax.runner.sweep.grid_points`) on the parsed
    config ``cfg`` for its seeds into ``out/<point>/`` (every point resolved before anything runs); points that
    differ only in numeric hyperparameters are lanes of one program with the seeds. Writes ``sweep.md`` (the table:
    mean ± std over seeds; a column per grid key), ``sweep.png``, ``sweep_heatmap.png`` (two grid keys) and
    ``summary.json`` (with ``programs``: runs, vectorised runs, compiled programs). Returns the table as ``sweep.md``
    holds it (Markdown, with its notes) and the results by point label; a point a guard stopped is marked 'stopped'
    in the table. A grid of attacks, rules or malicious fractions (:mod:`fljax.runner.attack_table`) writes
    ``attacks.md`` and ``attacks.png`` instead of the figures, and returns ``attacks.md``."""
    out = lead_only(out)
    output = output or Output()
    own = [k for k in grid if k.split(".", 1)[0] in ("data", "server")] if data_cache and data_cache.own else []
    if own:
        raise ConfigError(f"--grid {own[0]}: the sweep runs on your own data ({data_cache.own.name!r}, "
                          f"{data_cache.own.num_clients} clients), which {own[0]} does not change (every point would "
                          f"run on the same data); sweep other keys, or build one data set per value and run each.")
    points = sweep_points(cfg, grid)
    trace = tuple(k.split(".", 1)[1] for k in grid if k.startswith("algo."))
    with lock.hold([out]):  # an attack table's points have no figures of their own: attacks.png shows them all
        results = _run_collection(points, cfg, {"grid": grid}, out, "sweep", resume=resume, output=output,
                                  plots=plots and not is_attack_grid(grid), lanes=lanes, trace=trace,
                                  data_cache=data_cache, model=model)
        return _sweep_table(cfg, grid, points, results, RunDir(out), plots)


def sweep_points(cfg: ExperimentConfig, grid: dict[str, list]) -> list[tuple[str, Experiment]]:
    """The (label, resolved experiment) of every point of ``grid`` on the parsed config ``cfg``; an empty grid, or
    one that would start more than :data:`~fljax.config.RUNS_MAX` runs with the seeds, is refused."""
    if not grid:
        raise ConfigError("a sweep needs a grid, e.g. --grid algo.lr=0.01,0.1.")
    check_swept_options(grid)
    count = math.prod(len(values) for values in grid.values())
    if count * cfg.seeds > RUNS_MAX:
        raise ConfigError(f"--grid gives {count:,} points × {cfg.seeds} seed(s) = {count * cfg.seeds:,} runs, more "
                          f"than the {RUNS_MAX:,} one command may start; sweep fewer values or seeds at a time.")
    base = to_dict(cfg)
    return [(point_label(values), point_experiment(base, values, name=point_label(values)))
            for values in grid_points(grid)]


def _sweep_table(cfg, grid, points, results, root: RunDir, plots: bool):
    """The sweep's table, plot and summary."""
    by_label = {lbl: r for (lbl, _), r in zip(points, results)}
    columns = grid_columns(grid)
    rows = []
    for (lbl, r), values in zip(by_label.items(), grid_points(grid)):  # a column per grid key, not the label
        row = {columns[k]: v for k, v in values.items()}
        row.update((k, v) for k, v in r.row(lbl).items() if k != "algorithm")
        row["status"] = r.status
        rows.append(row)
    title = (f"{cfg.algorithm} on {setting(cfg, results[0].runs[0].data)}, {len(points)} points × {cfg.seeds} "
             f"seed{'s' if cfg.seeds > 1 else ''}, {cfg.rounds} rounds")
    table = distinct_table(rows, names=list(by_label))
    root.write_text("sweep.md", f"# {title}\n\n{table}\n")
    if plots and root.path is not None and not is_attack_grid(grid):
        first = next(iter(columns.values()))
        plot_compare(root.file("sweep.png"), {lbl: r.histories for lbl, r in by_label.items()}, title,
                     groups={lbl: f"{first} = {row[first]}" for lbl, row in zip(by_label, rows)},
                     colour_groups=True, delta=shared_delta([run for r in by_label.values() for run in r.runs]))
        if len(grid) == 2 and all(len(v) > 1 for v in grid.values()):  # a 2-D grid: the final accuracy as a heatmap
            shape = [len(v) for v in grid.values()]
            finals = {divmod(i, shape[1]): [h[-1]["personal_acc"] for h in r.histories
                                            if h and "personal_acc" in h[-1]]
                      for i, r in enumerate(by_label.values())}
            plot_heatmap(root.file("sweep_heatmap.png"), grid, finals, title)
    if is_attack_grid(grid):  # an attack × defence table: attacks.md and its heatmap
        rows = attack_rows([(lbl, values, exp) for (lbl, exp), values in zip(points, grid_points(grid))], results)
        attacks = attack_markdown(grid, rows, title)
        root.write_text("attacks.md", attacks)
        if plots and root.path is not None:
            plot_attacks(root.file("attacks.png"), grid, rows, title)
        table = attacks
    runs = [run for r in results for run in r.runs]
    root.write_summary({**_collection_status(by_label), "grid": grid,
                        "programs": {"runs": len(runs), "vectorised_runs": sum(r.progress.vectorised for r in runs),
                                     "compiled": len({r.progress.program for r in runs} - {None})},
                        "results": {lbl: r.summary for lbl, r in by_label.items()}})
    return table, by_label


def _collection_status(by_label: dict) -> dict:
    """A collection's status in its summary.json, as a point's is of its seeds (:func:`~fljax.runner.results.
    aggregate_summaries`): 'completed' when every point completed, else 'stopped', with ``stopped`` listing the
    points a guard stopped (a comparison whose every run diverged said 'completed')."""
    stopped = [lbl for lbl, r in by_label.items() if r.stopped]
    return {"status": "stopped", "stopped": stopped} if stopped else {"status": "completed"}


def _run_collection(points, cfg: ExperimentConfig, header: dict, out: str | None, kind: str,
                    **kwargs) -> list[ExperimentResult]:
    """Run a collection's points (a comparison, a sweep: ``kind``) under ``out/``: its root keeps ``cfg``, a
    ``directory.json`` with ``header`` and a summary of ``header`` with the status ('running', 'interrupted' when
    a signal stopped it; the caller writes 'completed')."""
    try:
        return run_points(points, out, subdirs=True, root_config=cfg, root_summary={"status": "running", **header},
                          plot_formats=("png",), kind=kind, listing=header, **kwargs)
    except interrupt.Interrupted:
        RunDir(out).write_summary({"status": "interrupted", **header})
        raise
