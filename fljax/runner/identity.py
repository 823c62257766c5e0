"""What a run directory is and what made it: ``directory.json``, written with its ``config.yaml``.

Every directory fljax writes a config into says

* its ``kind``: ``run`` (one experiment, any number of seeds; also each point of a sweep or comparison and each run
  of a study), ``sweep``, ``comparison`` or ``study`` (a paper reproduction's output folder);
* its ``origin``: ``config`` when ``config.yaml`` rebuilds everything the run used, or what it cannot rebuild — the
  user's own data (``data``: its name, clients and a fingerprint of its arrays) and own Flax module (``model``: its
  class and a fingerprint of its fields), passed to :func:`fljax.run` and friends from Python;
* for a sweep its ``grid``, for a comparison its ``algorithms``, for a study its ``study`` name (what ``--resume``
  continues);
* ``part_of``, for a directory that is a part of the one above it: ``run`` (a seed of a run with several),
  ``sweep`` (a point) or ``comparison`` (an algorithm). A part is continued through the whole only: extended on its
  own, it would leave the whole's table and summary out of date. (Directories written before ``part_of`` existed
  do not have it, and stay usable as they were.)

With it, ``--resume`` refuses the wrong kind of directory (``fljax run --resume`` on a sweep would train a run into
the sweep's root) and a run it cannot rebuild (own data or model from the command line, or other data from Python),
in one line saying what to pass instead, before anything is written (:func:`check_kind`, :func:`check_origin`). A
directory written by an fljax without this file is read as its ``summary.json`` suggests (:func:`read`).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from fljax.errors import ConfigError
from fljax.runner import files

__all__ = ["FILE", "KINDS", "COMMANDS", "read", "write", "kind_of", "check_kind", "origin", "check_origin",
           "fingerprint"]

FILE = "directory.json"
KINDS = ("run", "sweep", "comparison", "study")
COMMANDS = {"run": "run", "sweep": "sweep", "comparison": "compare"}  # the command that makes (and resumes) each
CONFIG = {"kind": "run", "origin": "config"}


def read(path: str) -> dict | None:
    """The directory's ``directory.json`` (None when it holds no run of any kind: no config.yaml, no
    directory.json); for a directory made before the file existed, what its ``summary.json`` says (a ``grid``: a
    sweep; ``algorithms``: a comparison; else a run made from a config)."""
    saved = os.path.join(path, FILE)
    if os.path.exists(saved):
        value = files.read_json(saved, expect=dict)
        if value.get("kind") not in KINDS:
            raise files.DamagedFile(saved, f"its kind is {value.get('kind')!r}, not one of {list(KINDS)}")
        return value
    if not os.path.exists(os.path.join(path, "config.yaml")):
        return None
    summary_path = os.path.join(path, "summary.json")
    summary = files.read_json(summary_path, expect=dict) if os.path.exists(summary_path) else {}
    if "grid" in summary:
        return {"kind": "sweep", "origin": "config", "grid": summary["grid"]}
    if "algorithms" in summary:
        return {"kind": "comparison", "origin": "config", "algorithms": summary["algorithms"]}
    return dict(CONFIG)


def write(path: str | None, kind: str, made: dict | str = "config", part_of: str | None = None, **extra) -> None:
    """Write ``directory.json`` into ``path`` (None: nowhere) — ``kind``, ``origin`` (``made``, :func:`origin`),
    ``part_of`` (the kind of the directory above that this one is a part of; None: none) and ``extra`` (a sweep's
    ``grid``, a comparison's ``algorithms``, a study's ``study``)."""
    assert kind in KINDS and part_of in (None, *KINDS), (kind, part_of)
    if path is not None:
        files.write_json(os.path.join(path, FILE), {"kind": kind, "origin": made,
                                                    **({"part_of": part_of} if part_of else {}), **extra})


def kind_of(path: str) -> str | None:
    saved = read(path)
    return None if saved is None else saved["kind"]


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def check_kind(path: str, kind: str, doing: str = "--resume", part_of: str | None = None) -> dict | None:
    """Refuse ``path`` when it holds a directory of another kind than ``kind``, or a part of another directory
    where this call writes it on its own (``part_of`` None; else the kind of the whole this call writes it in): one
    line, what it holds and the command that continues it. Returns what it holds (None: nothing yet)."""
    saved = read(path)
    whole = _whole(path) if saved is not None and saved.get("part_of") and part_of is None else None
    if whole is not None:
        whole, held = whole
        raise ConfigError(f"{doing}: {path!r} is part of the {held} in {whole!r}, which would be left out of date; "
                          f"continue the {held} with `fljax {COMMANDS[held]} --resume --out {whole}`, or choose "
                          f"another --out.")
    if saved is None or saved["kind"] == kind:
        return saved
    held = saved["kind"]
    if held == "study":
        how = f"fljax reproduce {saved.get('study', 'NAME')} --out {path}"
    else:
        how = f"fljax {COMMANDS[held]} --resume --out {path}"
    raise ConfigError(f"{doing}: {path!r} holds {_article(held)} {held}, not {_article(kind)} {kind}; continue it with "
                      f"`{how}`, or choose another --out.")


def _whole(path: str) -> tuple[str, str] | None:
    """The outermost directory that ``path`` is a part of (``part_of``, up the parents) and its kind; None when the
    directory above is not the whole it records (a part copied elsewhere is a directory of its own)."""
    path, whole = os.path.normpath(path), None
    saved = read(path)
    while saved is not None and saved.get("part_of") in COMMANDS:
        parent = os.path.dirname(path)
        above = read(parent) if parent else None
        if above is None or above["kind"] != saved["part_of"]:
            break
        path, saved = parent, above
        whole = (path, saved["kind"])
    return whole


def fingerprint(values) -> str:
    """A short hash of arrays and static values (a data set's arrays, a module's repr)."""
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(values):
        array = np.asarray(leaf)
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def origin(data=None, module=None) -> dict | str:
    """What made a run: ``'config'``, or the user's own ``data`` (a :class:`~fljax.data.FederatedData`) and
    ``module`` (a Flax module) that its config.yaml does not describe."""
    if data is None and module is None:
        return "config"
    made: dict = {}
    if data is not None:
        made["data"] = {"name": data.name, "clients": int(data.num_clients),
                        "fingerprint": fingerprint([data.train, data.test, data.server, str(data.num_classes),
                                                    str(tuple(data.input_shape)), str(data.num_target)])}
    if module is not None:
        made["model"] = {"class": type(module).__name__,
                         "fingerprint": hashlib.sha256(repr(module).encode()).hexdigest()[:16]}
    return made


def _call(saved_kind: str) -> str:
    return {"run": "fljax.run(config", "sweep": "fljax.sweep(grid, config",
            "comparison": "fljax.compare(algorithms, config"}.get(saved_kind, "fljax.run(config")


def check_origin(path: str, made: dict | str) -> None:
    """Refuse to continue the run in ``path`` with ``made`` (:func:`origin` of this call) when it was made with
    data or a model this call does not have: the user's own that the command line cannot rebuild, other arrays, or
    the config's where own ones are passed now."""
    saved = read(path)
    if saved is None:
        return
    was = saved.get("origin", "config")
    was = {} if was == "config" else was
    now = {} if made == "config" else made
    call = _call(saved["kind"])
    for part, what, arg in (("data", "data", "data="), ("model", "model", "model=")):
        before, after = was.get(part), now.get(part)
        if before is None and after is None:
            continue
        if before is None:
            raise ConfigError(f"--resume: {path!r} was run on the config's {what} (config.yaml); continue it without "
                              f"{arg}, or start a new run (another out) with your own {what}.")
        shown = (f"your own data {before.get('name')!r} ({before.get('clients')} clients)" if part == "data"
                 else f"your own model {before.get('class')}")
        if after is None:
            raise ConfigError(f"--resume: {path!r} was run from Python with {shown}, which config.yaml does not "
                              f"describe and fljax cannot rebuild; continue it from Python with the same {what}: "
                              f"{call}, {arg}<the same {what}>, out={path!r}, resume=True).")
        if before.get("fingerprint") != after.get("fingerprint"):
            raise ConfigError(f"--resume: the {what} passed differs from {shown} that {path!r} was run with "
                              f"(fingerprint {after.get('fingerprint')} now, {before.get('fingerprint')} then); pass "
                              f"the same {what}, or start a new run (another out).")


def listing(saved: dict, key: str, path: str):
    """A sweep's ``grid`` or a comparison's ``algorithms`` as :func:`read` returns them, checked."""
    value = saved.get(key)
    kind = dict if key == "grid" else list
    if not isinstance(value, kind):
        where = os.path.join(path, FILE if os.path.exists(os.path.join(path, FILE)) else "summary.json")
        raise files.DamagedFile(where, f"its {key!r} is not a {'mapping' if kind is dict else 'list'}")
    return json.loads(json.dumps(value))
