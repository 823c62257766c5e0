"""One simulation over several processes, on JAX's own distributed runtime (``jax.distributed``).

JAX runs multi-process programs SPMD: every process runs the same Python program, builds the same data (every
source and partition is seeded, so they agree) and calls the same compiled programs; ``jax.devices()`` then lists
every process's devices, and the :class:`~fljax.engine.executors.ShardedExecutor` (``auto``'s choice on several
devices) splits the client axis over all of them with ``shard_map``. Each process computes its shard of the clients;
the collectives between processes run on CPU through Gloo (``jax_cpu_collectives_implementation='gloo'``, the default
of jax >= 0.4.36) and on accelerators through the platform's own (NCCL on GPUs).

The engine's programs take and return arrays *replicated* on every device (:func:`program_shardings`): every process
holds the whole state and every metric, so each can read its results and feed them back into the next block of
rounds; inside a program the per-client work stays sharded. Only process 0 writes files (:func:`is_lead`).

A process joins a group when :func:`initialize` is called before JAX computes anything, with the coordinator's
``host:port``, the number of processes and its own index — or from the environment: ``FLJAX_COORDINATOR``,
``FLJAX_NUM_PROCESSES``, ``FLJAX_PROCESS_ID`` (:func:`from_environment`).
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fljax.errors import OptionError

__all__ = ["ENV", "initialize", "from_environment", "is_lead", "lead_only", "program_shardings"]

_joined = {"group": None}
ENV = {"coordinator": "FLJAX_COORDINATOR", "num_processes": "FLJAX_NUM_PROCESSES", "process_id": "FLJAX_PROCESS_ID"}


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the group of ``num_processes`` processes whose process 0 serves ``coordinator`` (``host:port``) as
    process ``process_id``; must precede every JAX computation in this process. Joining the same group again does
    nothing."""
    if num_processes < 1:
        raise OptionError("processes", f"must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise OptionError("process_id", f"must be in [0, {num_processes}), got {process_id}")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise OptionError("coordinator", f"must be host:port, got {coordinator!r}")
    group = (coordinator, num_processes, process_id)
    if _joined["group"] is not None:
        if _joined["group"] != group:
            raise OptionError("processes", f"this process is in the group {_joined['group']} already")
        return
    _joined["group"] = group
    if num_processes == 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def from_environment() -> bool:
    """:func:`initialize` from ``FLJAX_COORDINATOR`` / ``FLJAX_NUM_PROCESSES`` / ``FLJAX_PROCESS_ID`` when they
    are set (all three, or none); returns whether they were."""
    values = {k: os.environ.get(v) for k, v in ENV.items()}
    if not any(values.values()):
        return False
    missing = [ENV[k] for k, v in values.items() if not v]
    if missing:
        raise OptionError(missing[0], f"must be set together with {', '.join(v for v in ENV.values() if v not in missing)}")
    for k in ("num_processes", "process_id"):
        if not values[k].isdigit():
            raise OptionError(ENV[k], f"must be a non-negative integer, got {values[k]!r}")
    initialize(values["coordinator"], int(values["num_processes"]), int(values["process_id"]))
    return True


def is_lead() -> bool:
    """Whether this process writes the results (process 0, or the only process)."""
    return jax.process_index() == 0


def lead_only(path: str | None) -> str | None:
    """``path`` on the process that writes the results, None (write nothing) on the others."""
    return path if is_lead() else None


def program_shardings() -> dict:
    """``jax.jit`` keyword arguments for the engine's programs: none on one process; on several, inputs and outputs
    replicated over every process's devices (module docstring)."""
    if jax.process_count() == 1:
        return {}
    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("clients",)), PartitionSpec())
    return {"in_shardings": replicated, "out_shardings": replicated}
