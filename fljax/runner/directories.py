"""Run directories: where every run of a call is written (:class:`Layout`), what is checked there before anything
is written, and what is written when the runs start. Continuing the runs found there: :mod:`fljax.runner.resume`.

One point: ``out`` is its directory; several points (or a collection: a sweep, a comparison): ``out/<label>/``
(:func:`dir_name`), the collection's own files at ``out``. A point with several seeds has a directory
``seed_<s>/`` per seed (:class:`~fljax.runner.results.RunDir`). Every directory records its kind and origin
(``directory.json``, :mod:`fljax.runner.identity`) and what it is part of; a ``config.yaml`` makes it resumable and
is written last.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re

from fljax.config import ConfigError, ExperimentConfig, to_dict
from fljax.experiment import Experiment
from fljax.runner import files, identity
from fljax.runner.results import RunDir
from fljax.runner.resume import check_resume
from fljax.runner.sweep import seed_list

__all__ = ["Layout", "dir_name", "saved_config", "saved_grid", "saved_algorithms", "DIR_NAME_MAX"]

DIR_NAME_MAX = 120  # characters of a run directory's name (file systems allow 255 bytes; this one is ASCII)


def dir_name(label: str) -> str:
    """A file-system friendly directory name for a run label such as ``fedprox(mu=0.1)``; a label longer than
    :data:`DIR_NAME_MAX` keeps its start and a hash of the whole (distinct labels stay distinct)."""
    name = re.sub(r"[^A-Za-z0-9_.=+,-]+", "_", label).strip("_.")
    if len(name) > DIR_NAME_MAX:
        digest = hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        name = f"{name[:DIR_NAME_MAX - 13]}-{digest}"
    return name or "run"


@dataclasses.dataclass(frozen=True)
class Layout:
    """The directories of one call: ``root`` (``out``; a path of None writes nothing), ``points`` (label,
    experiment) and each point's directory ``dirs``. ``collection``: the kind of a collection's root (``sweep``,
    ``comparison``) that keeps ``root_config`` (the base the points were made from), else None."""

    root: RunDir
    points: tuple
    dirs: tuple[RunDir, ...]
    collection: str | None = None
    root_config: ExperimentConfig | None = None

    @classmethod
    def of(cls, points: list[tuple[str | None, Experiment]], out: str | None, subdirs: bool,
           collection: str | None = None, root_config: ExperimentConfig | None = None) -> "Layout":
        """The layout of ``points`` in ``out`` (``subdirs``: a directory per point; else ``out`` is the one
        point's); two points whose labels give one directory name are refused."""
        root = RunDir(out)
        if not subdirs:
            return cls(root, tuple(points), (root,), collection, root_config)
        names = [dir_name(label or exp.name) for label, exp in points]
        if len(set(names)) < len(names):
            raise ConfigError(f"two points would share a run directory ({sorted(n for n in names if names.count(n) > 1)[0]});"
                              f" give them distinct names.")
        return cls(root, tuple(points), tuple(root.child(n) for n in names), collection, root_config)

    def seeds(self, i: int) -> list[tuple[Experiment, RunDir]]:
        """Point ``i``'s runs: its experiment for each seed with that run's directory (the point's own with one
        seed, ``seed_<s>/`` inside it with several)."""
        exp, d = self.points[i][1], self.dirs[i]
        seeds = seed_list(exp.settings)
        return [(exp.with_seed(s), d if len(seeds) == 1 else d.seed_dir(s)) for s in seeds]

    def configs(self) -> list[tuple[RunDir, ExperimentConfig, Experiment | None]]:
        """Every (directory, config, its experiment) that gets a ``config.yaml`` (and but for a collection's root a
        ``resolved.yaml``), inner directories first: each seed of a point with several, each point, a collection's
        root (no experiment: its config is the base the points were made from)."""
        configs = []
        for i, (_, exp) in enumerate(self.points):
            seeds = self.seeds(i)
            configs += [(d, e.config, e) for e, d in seeds] if len(seeds) > 1 else []
            configs.append((self.dirs[i], exp.config, exp))
        return configs + ([(self.root, self.root_config, None)] if self.root_config is not None else [])

    def parts(self) -> dict[str, str]:
        """The directories written as parts of another, with that one's kind: every seed's of a point with several
        seeds (part of a run), every point's of a collection."""
        parts = {}
        for i, d in enumerate(self.dirs):
            seeds = self.seeds(i)
            if len(seeds) > 1:
                parts.update({sd.path: "run" for _, sd in seeds})
            if self.root_config is not None:
                parts[d.path] = self.collection
        return parts

    def check(self, resume: bool, made: dict | str) -> None:
        """Before anything is built or written: every existing directory must hold its kind and, as a part, be
        written with its whole; with ``resume``, have the origin ``made`` (:func:`fljax.runner.identity.origin`)
        and a config that a resume may continue (:func:`fljax.runner.resume.check_resume`)."""
        if self.root.path is None:
            return
        parts = self.parts()
        for d, cfg, exp in reversed(self.configs()):  # the root first
            if os.path.isdir(d.path):
                identity.check_kind(d.path, self._kind(exp), "--resume" if resume else "--out", parts.get(d.path))
                if resume:
                    identity.check_origin(d.path, made)
            if resume:
                check_resume(d.path, cfg)

    def check_results(self, resume: bool, missing_ok: bool) -> None:
        """Under the directories' locks: no directory may lead outside itself (a ``checkpoints`` link, an inner
        directory that is a link: :meth:`~fljax.runner.results.RunDir.check_inside`); without ``resume``, none may hold
        results (a checkpoint, a finished run); with it, the root must hold a run to continue unless ``missing_ok``."""
        if self.root.path is None:
            return
        for d, _, _ in self.configs():
            d.check_inside(inner=d.path != self.root.path)
        if resume and not missing_ok and not self.root.holds_config():
            raise ConfigError(f"--resume: {self.root.path!r} holds no run to continue (no config.yaml); start it "
                              f"without --resume.")
        held = next((d for d, _, _ in self.configs() if d.holds_results()), None) if not resume else None
        if held is not None:
            raise ConfigError(f"run directory {held.path!r} already holds results (a checkpoint or a finished run); "
                              f"continue it with --resume or choose another --out.")

    def write(self, made: dict | str, listing: dict | None, module=None) -> None:
        """Start the directories: each run's and point's ``resolved.yaml``, every ``directory.json`` (a collection's
        with ``listing``) and ``config.yaml`` — the root's last: once it exists, the call can be resumed."""
        parts = self.parts()
        for d, cfg, exp in self.configs():
            if exp is not None:
                d.write_resolved(_resolved(exp, module))
            identity.write(d.path, self._kind(exp), made, parts.get(d.path), **((listing or {}) if exp is None
                                                                               else {}))
            d.write_config(cfg)

    def _kind(self, exp: Experiment | None) -> str:
        return "run" if exp is not None else self.collection

    @property
    def paths(self) -> list[str | None]:
        """Every directory that gets a ``config.yaml`` (those this call locks)."""
        return [d.path for d, _, _ in self.configs()]


def _resolved(exp: Experiment, module) -> dict:
    """What resolved.yaml records: :meth:`~fljax.experiment.Experiment.resolved`; with the user's own module, its
    class and fields instead of the model section (such a file documents the run; running it again needs the
    module)."""
    values = to_dict(exp.resolved())
    if module is not None:
        values["model"] = {"name": f"own: {type(module).__name__}", "module": repr(module)}
    return values


def saved_config(directory: str, kind: str = "run") -> str:
    """The path of the resolved config a run directory was started with (for ``--resume``), after checking that
    the directory holds a ``kind`` (:func:`fljax.runner.identity.check_kind`)."""
    path = RunDir(directory).file("config.yaml")
    if os.path.isdir(directory):
        identity.check_kind(directory, kind)
    if not os.path.exists(path):
        raise ConfigError(f"--resume: {directory!r} is not a run directory (no config.yaml); pass the --out of the "
                          f"run to continue.")
    return path


def saved_grid(directory: str) -> dict[str, list]:
    """The grid of the sweep in ``directory`` (for ``--resume``)."""
    saved = identity.check_kind(directory, "sweep") if os.path.isdir(directory) else None
    if saved is None:
        raise ConfigError(f"--resume: {directory!r} holds no sweep (no config.yaml); pass the --out of the sweep to "
                          f"continue.")
    return identity.listing(saved, "grid", directory)


def saved_algorithms(directory: str) -> list[tuple[str, dict]]:
    """The algorithms (name, hyperparameters) of the comparison in ``directory`` (for ``--resume``)."""
    saved = identity.check_kind(directory, "comparison") if os.path.isdir(directory) else None
    if saved is None:
        raise ConfigError(f"--resume: {directory!r} holds no comparison (no config.yaml); pass the --out of the "
                          f"comparison to continue.")
    entries = identity.listing(saved, "algorithms", directory)
    if not all(isinstance(a, dict) and isinstance(a.get("algorithm"), str) and isinstance(a.get("hyperparameters"),
                                                                                          dict) for a in entries):
        raise files.DamagedFile(os.path.join(directory, identity.FILE), "its algorithms are not {algorithm, "
                                                                        "hyperparameters} entries")
    return [(a["algorithm"], a["hyperparameters"]) for a in entries]
