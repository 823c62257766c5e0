"""Executors: the single place that decides how the client axis runs.

``executor.map_clients(fn, shared, per_client)`` computes ``fn(shared, per_client[i])`` for every client i and stacks
the results along a new leading axis. ``shared`` is broadcast (the global model, the round index); every leaf of
``per_client`` has the client axis first. All executors give the same numbers to floating-point tolerance.

* :class:`VmapExecutor` — ``jax.vmap``: the whole cohort at once (fastest when it fits in memory).
* :class:`ChunkedExecutor` — ``lax.map`` over groups of ``chunk_size`` clients, vmapped inside a group: memory
  bounded by one group's activations.
* :class:`ShardedExecutor` — a ``Mesh`` with a ``clients`` axis over all devices and ``shard_map`` with vmap inside
  each shard; the client axis is padded to a multiple of the device count.
* :class:`LoopExecutor` — the reference: a Python loop dispatching one jitted per-client call at a time (a client's
  whole local training per call; FedJAX dispatches every local step). Rounds using it are not jitted as a whole.

Memory: inside a compiled program of :class:`~fljax.engine.Simulation` the vmap, chunked and sharded (per device,
against its share) executors run at most as many clients side by side as the program's memory budget holds
(:func:`fljax.engine.budget.clients_that_fit`): a map over more runs as ``lax.map`` over chunks that fit, so
evaluating a population of thousands of clients fits the device whichever executor the cohort uses. An
initialisation's per-client draws run as that planned vmap (:func:`planned_vmap`) whatever the executor
(:meth:`fljax.engine.context.RoundContext.map_init`).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from fljax import tree
from fljax.engine import budget

__all__ = ["Executor", "planned_vmap", "VmapExecutor", "ChunkedExecutor", "ShardedExecutor", "LoopExecutor",
           "EXECUTORS", "make_executor", "choose_executor"]


class Executor:
    name: str = "executor"
    jittable: bool = True  # False: the round runs eagerly and map_clients dispatches per client
    vectorised: bool = True  # True: clients run batched inside one program (patches convs are the fast choice)

    def map_clients(self, fn, shared, per_client):
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def planned_vmap(fn, shared, per_client):
    """``jax.vmap(fn, in_axes=(None, 0))(shared, per_client)`` when the current program's memory plan holds every
    client side by side (and outside a planned program), else ``lax.map`` over chunks of the clients that fit
    (:func:`fljax.engine.budget.clients_that_fit`), vmapped inside."""
    n = tree.num_clients(per_client)
    fit = budget.clients_that_fit(fn, shared, per_client, n)
    if fit is None or fit >= n:
        return jax.vmap(fn, in_axes=(None, 0))(shared, per_client)
    return jax.lax.map(lambda pc: fn(shared, pc), per_client, batch_size=fit)  # planned: chunks that fit


@dataclasses.dataclass(frozen=True)
class VmapExecutor(Executor):
    name = "vmap"

    def map_clients(self, fn, shared, per_client):
        return planned_vmap(fn, shared, per_client)


@dataclasses.dataclass(frozen=True)
class ChunkedExecutor(Executor):
    chunk_size: int = 64
    name = "chunked"

    def __post_init__(self):
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}.")

    def map_clients(self, fn, shared, per_client):
        n = tree.num_clients(per_client)
        fit = budget.clients_that_fit(fn, shared, per_client, n)
        chunk = self.chunk_size if fit is None else min(self.chunk_size, fit)
        if n <= chunk:
            return jax.vmap(fn, in_axes=(None, 0))(shared, per_client)
        return jax.lax.map(lambda pc: fn(shared, pc), per_client, batch_size=chunk)

    def describe(self) -> str:
        return f"chunked({self.chunk_size})"


@dataclasses.dataclass(frozen=True)
class ShardedExecutor(Executor):
    """Clients sharded over ``devices`` (default: all) along a mesh axis named ``clients``."""

    devices: tuple | None = None
    name = "sharded"

    def mesh(self) -> Mesh:
        devs = self.devices if self.devices is not None else tuple(jax.devices())
        return Mesh(np.array(devs), ("clients",))

    def map_clients(self, fn, shared, per_client):
        mesh = self.mesh()
        n, d = tree.num_clients(per_client), mesh.size
        pad = (-n) % d
        if pad:  # pad with copies of the first client; their outputs are dropped below
            per_client = jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]), per_client)
        # check_vma=False: with it on, jax 0.10 gave silently wrong results for a scan whose carry starts from a
        # replicated value inside vmap (seen on local SGD; the sharded-vs-loop test catches it).
        # each device maps its shard of the clients, planned against its share of the memory budget
        mapped = jax.shard_map(lambda s, pc: planned_vmap(fn, s, pc), mesh=mesh,
                               in_specs=(P(), P("clients")), out_specs=P("clients"), check_vma=False)
        with budget.divided(d, f"per device of {d}"):
            out = mapped(shared, per_client)
        return jax.tree.map(lambda x: x[:n], out) if pad else out

    def describe(self) -> str:
        return f"sharded({self.mesh().size} devices)"


@functools.lru_cache(maxsize=512)
def _client_call(fn):
    """``fn`` on client ``i`` of the stacked arguments, jitted once for every i (the index is a traced scalar, so
    the per-client slicing happens inside the compiled call and never compiles per index)."""
    return jax.jit(lambda shared, per_client, i: fn(shared, jax.tree.map(lambda x: x[i], per_client)))


@dataclasses.dataclass(frozen=True)
class LoopExecutor(Executor):
    """Reference executor: one jitted call per client from Python. ``fn`` should be hashable (a bound method of a
    frozen algorithm is) so that its compilation is reused across rounds."""

    name = "loop"
    jittable = False
    vectorised = False

    def map_clients(self, fn, shared, per_client):
        try:
            call = _client_call(fn)
        except TypeError:  # unhashable callable: compile it afresh
            call = _client_call.__wrapped__(fn)
        return tree.stack([call(shared, per_client, i) for i in range(tree.num_clients(per_client))])


EXECUTORS = {
    "auto": "measured rule: sharded on several devices; on CPU a per-client loop for conv models and cache-sized "
            "chunks for the others; on accelerators vmap (chunked by the memory plan beyond the device's memory; "
            "see choose_executor)",
    "vmap": "jax.vmap over the whole cohort: one batched program",
    "chunked": "lax.map over groups of chunk_size clients, vmap inside: bounded memory",
    "sharded": "shard_map over a Mesh with a 'clients' axis spanning all devices, vmap inside each shard",
    "loop": "reference: a Python loop of per-client jitted calls (one call runs a client's whole local training)",
}

# On CPU, chunks of clients whose working set (parameters, gradients, updates, local data) stays near this many
# bytes beat one whole-cohort vmap (benchmarks/results/throughput.md: MLP-28x28 with 3 clients of ~3.8 MB per chunk,
# logistic regression with 244 clients of ~50 kB). Chosen from a few chunk sizes tried by hand, not a tuned optimum.
CPU_CHUNK_BYTES = 12e6


def choose_executor(*, backend: str, device_count: int, has_conv: bool, cohort: int, per_client_bytes: float,
                    chunk_size: int | None = None) -> Executor:
    """The ``auto`` rule, from benchmarks/throughput.py (see the README's performance section).

    * several devices → :class:`ShardedExecutor`;
    * CPU and a convolutional model → :class:`LoopExecutor`: XLA:CPU runs batched (vmapped) convolutions over many
      clients' weights several times slower than one client at a time (CNN1: 756 client-steps/s one at a time
      against 43–224 vmapped or chunked, benchmarks/results/throughput.md);
    * CPU otherwise → :class:`ChunkedExecutor` with ``CPU_CHUNK_BYTES / per_client_bytes`` clients per chunk
      (:class:`VmapExecutor` when that holds the whole cohort);
    * accelerators → :class:`VmapExecutor` (:class:`ChunkedExecutor` with the user's ``chunk_size``); each
      program's memory plan (:mod:`fljax.engine.budget`) chunks any client map that would not fit the device.

    ``chunk_size`` (the user's) overrides the computed chunk.
    """
    if device_count > 1:
        return ShardedExecutor()
    if backend == "cpu" and has_conv:
        return LoopExecutor()
    if backend != "cpu":
        return ChunkedExecutor(chunk_size) if chunk_size and chunk_size < cohort else VmapExecutor()
    chunk = chunk_size or max(1, int(CPU_CHUNK_BYTES // max(per_client_bytes, 1.0)))
    return ChunkedExecutor(chunk) if chunk < cohort else VmapExecutor()


def make_executor(name: str = "vmap", *, chunk_size: int | None = None) -> Executor:
    """Build an executor by an explicit name ('auto' is resolved by the simulation, which knows the workload)."""
    if name == "vmap":
        return VmapExecutor()
    if name == "chunked":
        return ChunkedExecutor(chunk_size or 64)
    if name == "sharded":
        return ShardedExecutor()
    if name == "loop":
        return LoopExecutor()
    close = difflib.get_close_matches(name, EXECUTORS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown executor {name!r}; choose one of {sorted(EXECUTORS)}.{hint}")
