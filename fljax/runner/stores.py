"""A run's client-state store in its run directory (``state_store: host | disk``; :mod:`fljax.engine.store`).

Where: ``<run dir>/store/`` (``store_dir: null``), or ``<store_dir>/<the run directory's name>-<12 hex of its
path>/`` (a folder of the user's, e.g. on a larger disk; every run of a sweep or of several seeds gets its own).
A run that writes nothing (``out=None``) keeps a disk store in a temporary directory.

What is checked before anything is written (:func:`check`), each refused in one line: a disk store that the disk
cannot hold (its bytes estimated from the state's shapes), a folder holding another run's store (another algorithm,
configuration or seed: ``meta.json``'s identity) or files that are not a store, and on ``--resume`` a missing store.
The store is created (its space reserved) when the run starts (:func:`new_store`) and, on ``--resume``, opened and
returned to the checkpoint's round by the checkpointer (:mod:`fljax.runner.checkpoint`: the journals of the blocks
after it applied).
"""
from __future__ import annotations

import hashlib
import json
import os

from fljax.config import ExperimentConfig
from fljax.engine.store import (DiskStore, StoredClients, _check_host_memory, check_meta, check_space,
                                read_meta)
from fljax.errors import ConfigError

__all__ = ["store_dir", "run_identity", "check", "initial_state", "template"]


def store_dir(run) -> str | None:
    """Where ``run``'s disk store lives (None: a temporary directory, for a run that writes nothing)."""
    base = run.cfg.store_dir
    path = run.directory.path
    if base is None:
        return None if path is None else os.path.join(path, "store")
    if path is None:
        return os.path.join(base, f"{run.cfg.run_name}-seed{run.seed}")
    digest = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return os.path.join(base, f"{os.path.basename(os.path.abspath(path))}-{digest}")


def run_identity(cfg: ExperimentConfig) -> str:
    """A hash of everything that decides what a run simulates (the keys ``--resume`` may not change) and its seed:
    what a store records of its run."""
    from fljax.runner.resume import MAY_CHANGE, flat

    keys = {k: v for k, v in flat(cfg).items() if k not in MAY_CHANGE and k != "store_dir"}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _identity(run, sim) -> dict:
    return sim.store_engine.identity(run.seed, run_identity(run.cfg))


def check(run, sim, resume: bool) -> None:
    """Refuse, before anything is written, a store ``run`` cannot use (module docstring)."""
    engine = sim.store_engine
    if engine is None:
        return
    treedef, specs = engine.client_shapes()
    n = sim.data.num_clients
    if engine.kind == "host":
        _check_host_memory(n, specs)
        return
    directory = store_dir(run)
    if directory is None:
        return
    if resume and run.directory.has_checkpoint():
        check_meta(directory, specs, n, _identity(run, sim))
        return
    if read_meta(directory) is not None:  # a run that died before its first checkpoint left its store: replaced
        check_meta(directory, specs, n, _identity(run, sim))
    elif os.path.isdir(directory) and os.listdir(directory):
        raise ConfigError(f"store_dir: {directory!r} holds files that are not a client-state store; choose an empty "
                          f"or new folder.")
    check_space(directory, n, specs)


def initial_state(run, sim):
    """``run``'s initial state: :meth:`Simulation.init <fljax.engine.Simulation.init>`, or with a store the store
    created for it (after :func:`check`) and the server's initial state."""
    engine = sim.store_engine
    if engine is None:
        return sim.init(run.seed)
    return engine.init(run.seed, engine.make_store(run.seed, store_dir(run), run_identity(run.cfg)))


def template(run, sim):
    """The state to restore ``run``'s checkpoint into: its shapes, the clients the run's store (opened: a disk
    store checked to be this run's; a host store new, filled by the checkpoint)."""
    shapes = sim.state_shapes()
    engine = sim.store_engine
    if engine is None:
        return shapes
    if engine.kind == "host":
        store = engine.make_store(run.seed, None, run_identity(run.cfg))
    else:
        directory = store_dir(run)
        if directory is None:
            raise ConfigError("a disk store without a run directory cannot be resumed.")
        treedef, specs = engine.client_shapes()
        store = DiskStore.open(directory, treedef, specs, sim.data.num_clients, _identity(run, sim))
    return shapes.replace(clients=StoredClients(store))
