"""Run directories read back as pandas DataFrames (:mod:`fljax.frames`).

* :func:`load_run` — one run directory (``fljax run``, :func:`fljax.run` with ``out=``): one row per evaluation and
  seed, columns ``seed``, ``round`` and the metrics of ``metrics.jsonl``;
* :func:`load_compare` — a comparison or a sweep directory: the same with a ``run`` column in front (the
  algorithm's or grid point's label), then for a comparison an ``algorithm`` column (the registered name), for a
  sweep one column per grid key (``algo.lr`` → ``lr``, :func:`fljax.runner.sweep.grid_columns`) holding the point's
  value;
* :func:`load_sweep` — a sweep directory only (the frame of :func:`load_compare`).

The frame's ``attrs`` hold the directory's ``config`` (config.yaml as a dict), ``resolved`` (resolved.yaml) and
``summary`` (summary.json).
"""
from __future__ import annotations

import os
import re

from fljax.errors import ConfigError
from fljax.frames import concat, history_frame
from fljax.runner import files
from fljax.runner.results import RunDir

__all__ = ["load_run", "load_compare", "load_sweep"]

_SEED_DIR = re.compile(r"seed_\d+")


def _seed_dirs(root: RunDir) -> list[tuple[int, RunDir]]:
    """(seed, directory) of the runs in a run directory: itself when it holds metrics.jsonl, else its seed_<s>/."""
    if os.path.exists(root.file("metrics.jsonl")):
        return [(_read_yaml(root).get("seed", 0), root)]
    names = [n for n in os.listdir(root.path) if _SEED_DIR.fullmatch(n)]
    return [(int(n[5:]), root.child(n)) for n in sorted(names, key=lambda n: int(n[5:]))
            if os.path.exists(root.child(n).file("metrics.jsonl"))]


def _read_yaml(d: RunDir, name: str = "config.yaml") -> dict:
    path = d.file(name)
    if not os.path.exists(path):
        return {}
    return files.read_yaml(path)


def _summary(d: RunDir) -> dict:
    return d.read_summary() if d.holds_summary() else {}


def _directory(path) -> RunDir:
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ConfigError(f"{path!r} is not a directory; pass the --out of a run, comparison or sweep.")
    return RunDir(path)


def _runs(root: RunDir) -> list[tuple[str, str]]:
    """(label, subdirectory) of a comparison's or sweep's runs in their order (summary.json), else of its
    subdirectories with a config.yaml."""
    from fljax.runner.directories import dir_name

    summary = _summary(root)
    if "algorithms" in summary:
        listing = summary["algorithms"]
        if not isinstance(listing, list) or not all(isinstance(a, dict) and isinstance(a.get("label"), str)
                                                    for a in listing):
            raise files.DamagedFile(root.file("summary.json"), "its 'algorithms' is not a list of {label, ...}")
        labels = [a["label"] for a in listing]
    elif "results" in summary:
        if not isinstance(summary["results"], dict):
            raise files.DamagedFile(root.file("summary.json"), "its 'results' is not a mapping of labels")
        labels = list(summary["results"])
    else:
        labels = sorted(n for n in os.listdir(root.path) if not _SEED_DIR.fullmatch(n)
                        and os.path.exists(os.path.join(root.path, n, "config.yaml")))
    return [(label, dir_name(label)) for label in labels if os.path.isdir(root.file(dir_name(label)))]


def _frame(root: RunDir, **labels):
    frame = concat([history_frame(d.read_metrics(), **labels, seed=seed) for seed, d in _seed_dirs(root)])
    frame.attrs.update(config=_read_yaml(root), resolved=_read_yaml(root, "resolved.yaml"), summary=_summary(root))
    return frame


def load_run(directory):
    """The history of the run in ``directory`` (every seed) as a DataFrame: columns ``seed``, ``round``, then
    the metrics; ``attrs['config']``, ``attrs['resolved']`` and ``attrs['summary']`` hold its config.yaml,
    resolved.yaml and summary.json."""
    root = _directory(directory)
    if not _seed_dirs(root):
        what = (("a sweep: use fljax.load_sweep (or fljax.load_compare)" if "grid" in _summary(root) else
                 "a comparison: use fljax.load_compare") if _runs(root) else
                "not a run directory (no metrics.jsonl, nor seed_<s>/metrics.jsonl)")
        raise ConfigError(f"{root.path!r} is {what}.")
    return _frame(root)


def load_compare(directory):
    """Every run of the comparison or sweep in ``directory`` as one DataFrame: columns ``run`` (the label), then
    ``algorithm`` (a comparison) or one column per grid key (a sweep: ``lr`` for ``algo.lr``), ``seed``,
    ``round``, then the metrics (a metric an algorithm does not report is NaN in its rows);
    ``attrs['config']`` (the shared config), ``attrs['summary']`` and ``attrs['runs']`` (label → that run's
    config and summary)."""
    root = _directory(directory)
    runs = _runs(root)
    if not runs:
        raise ConfigError(f"{root.path!r} holds no comparison or sweep (no run subdirectories); use "
                          f"fljax.load_run for a single run.")
    frames = [_frame(root.child(name), run=label, **_columns(root, label)) for label, name in runs]
    frame = concat(frames)
    frame.attrs.update(config=_read_yaml(root), summary=_summary(root),
                       runs={label: dict(f.attrs) for (label, _), f in zip(runs, frames)})
    return frame


def load_sweep(directory):
    """Every point of the sweep in ``directory`` as one DataFrame (see :func:`load_compare`): columns ``run`` (the
    point's label), one per grid key with the point's value (``fljax sweep --grid algo.lr=... --grid algo.mu=...``
    gives ``lr`` and ``mu``), ``seed``, ``round``, then the metrics; ``attrs['grid']`` holds the grid."""
    root = _directory(directory)
    grid = _summary(root).get("grid")
    if grid is None:
        raise ConfigError(f"{root.path!r} holds no sweep (no grid in its summary.json); use "
                          f"{'fljax.load_compare' if _runs(root) else 'fljax.load_run'} for it.")
    frame = load_compare(directory)
    frame.attrs["grid"] = grid
    return frame


def _columns(root: RunDir, label: str) -> dict:
    """The columns that say what a collection's run is: its algorithm (a comparison) or its grid values (a
    sweep)."""
    from fljax.runner.sweep import grid_columns, grid_points, point_label

    summary = _summary(root)
    if "grid" in summary:
        names = grid_columns(summary["grid"])
        point = next((p for p in grid_points(summary["grid"]) if point_label(p) == label), {})
        return {names[k]: v for k, v in point.items()}
    entry = next((a for a in summary.get("algorithms", []) if a.get("label") == label), None)
    return {"algorithm": entry["algorithm"]} if entry else {}
