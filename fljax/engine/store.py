"""Client state off the device: a store of every client's state, gathered per block of rounds (issue 38).

Without a store (``state_store: device``, the default) the per-client state is one pytree on the device whose leaves
have a leading axis of every client (:class:`~fljax.engine.State`), so its size is population × model: a million
clients of a 2,282-parameter MLP keeping a personal model is 9 GB, of a 50k-parameter model 200 GB. A store keeps
those rows in host memory (``host``) or in files on disk (``disk``) and the device holds only the clients a block of
rounds samples:

1. **The block's cohorts first.** For a participation that draws from the keys alone (uniform, Poisson) the
   cohorts of rounds t … t + n − 1 are a pure function of the run key and the rounds: one small compiled pass
   (``store_draws``) computes them before the block runs, with the participation's own draw, and the block's rounds
   take them as they are (:attr:`RoundContext.cohort`: at 10⁶ clients a uniform draw is a pass over a million keys,
   paid once, ahead).
2. **Gather.** The union U of the block's cohorts (sorted ids) is read from the store into a buffer of
   ``min(N, n·m)`` rows (m: a round's cohort slots; padding rows copy a real client's), and the block runs on the
   buffer as it runs on the population: the template gathers and scatters a cohort's states through
   :meth:`~fljax.engine.context.RoundContext.rows` (searchsorted in U) while its data, keys and budgets stay indexed
   by client id. Every client computes exactly what it computes with the state on the device, so the results are
   the device's bit for bit (tests/test_store.py, a test per algorithm family).
3. **Scatter.** The buffer's rows go back to the store; no other row is read or written, so an unsampled client's
   state is never touched.
4. **Pipelined.** While block b runs on the device, a worker thread writes block b − 1's rows back (its undo journal
   first, below) and then reads block b + 1's rows that block b does not touch (its cohorts drawn ahead); the rows
   block b does touch come from its own output. A block whose length was not foreseen (the run loop's schedule
   changed) is gathered after the pending writes.

**Initial state, copy-on-write from the algorithm's init.** A store is created empty (its space reserved) with a
``written`` flag per client; the first time a client is gathered its initial state is computed by the algorithm's own
``init_population`` restricted to the clients being gathered (:meth:`RoundContext.restricted`: their data and ids),
which is what the whole population's initialisation gives those rows: an initial state is a broadcast of the server's
model, constants, or draws from the client's id. A check at creation compares two overlapping chunks of clients and
refuses an algorithm whose initial rows depend on the other clients. So creating the population costs the files'
reservation, not a pass over a million clients.

**Evaluation streams.** Every client's evaluation (its test split with its own personalized model) runs in planned
chunks: the chunk's rows are gathered (the next chunk's read while the current one computes), the algorithm's
per-client statistics computed (:meth:`fljax.algorithms.base.Algorithm.evaluation_stats`, each client's from its own
state alone), and once every chunk is in, one program reduces them (``evaluation_summary``) exactly as the
evaluation of the device's state does. What an algorithm summarises over every client's state
(:meth:`~fljax.algorithms.base.Algorithm.eval_metrics`) it reads through per-client values
(:meth:`~fljax.algorithms.base.Algorithm.client_values`), streamed the same way.

**The store (measured: benchmarks/results/store_backends.md).** ``disk``: one raw file per leaf, ``[N, …]`` in
C order, reserved with ``posix_fallocate`` (a write never needs new blocks: a full disk cannot strike inside a memory
map), read and written through NumPy memory maps, and a ``written.bin`` byte per client. NumPy memory maps against
tensorstore (zarr3 with one client per inner chunk of a sharded array, or chunks of 64 clients), 200,000 clients of
9.1 KB, 10,000 random rows: 0.15 s to write against 1.6 s and 8.5 s, 0.35 s to read against 0.76 s and 0.94 s, and
a chunked pass over every row much faster: a block's random rows are what a memory map does best. ``host``: the
same arrays in memory.

**Checkpoints: an undo journal** (``disk``; ``host`` arrays go into the checkpoint whole, as the device's do). Before a
block's rows are written back, their old values — the block's gathered buffer, already in hand — are written to
``undo/<first round>-<end round>.npz`` (written to a temporary name, flushed, renamed: atomic), and only then are the
rows overwritten in place. A checkpoint of round r flushes the store's files (``msync``) and saves the server's
state with orbax (:mod:`fljax.runner.checkpoint`); from then on every block is journaled. Resuming from round r
applies the journals of the blocks after r, newest first (each one idempotent, deleted once applied), which returns
every row to its value at round r. Journals older than the oldest checkpoint kept are deleted. Why a journal and not
copy-on-write chunks: the block's buffer already holds exactly the old values of exactly the rows the block
overwrites, so the journal costs one sequential write of the buffer per block and nothing per checkpoint but a flush,
whatever the population's size, while the store stays one array per leaf that a gather reads in place; copy-on-write
chunks would need an indirection on every read and copy a whole chunk for each changed row (a cohort of 1,000 from
10⁶ touches 1,000 chunks of any size). Kill -9 anywhere (in a block, in a journal write, in a checkpoint) leaves
either a complete journal (applied) or none (the rows untouched), so a resume repeats the uninterrupted run bit for
bit (tests/test_store.py).

What a store refuses, in one line each (:func:`refusal`): algorithms that are not server-based with sampled cohorts,
whose round or evaluation reads clients outside the cohort (:meth:`~fljax.algorithms.base.Algorithm.whole_population`,
e.g. FedSLR's Algorithm 2: use its Algorithm 3), ``cohort_mode: mask``, client groups, target clients, participations
whose draws depend on state, lanes (seeds and grid points then run one after another), several processes.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import time
import weakref
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.engine.state import State
from fljax.errors import ConfigError, OptionError

__all__ = ["STORES", "StoredClients", "ClientStore", "DiskStore", "StoreEngine", "StoreWriteError", "refusal",
           "store_bytes", "client_states"]

STORES = ("device", "host", "disk")
FORMAT = 1  # the on-disk layout's version (meta.json)
META, WRITTEN, UNDO = "meta.json", "written.bin", "undo"
# a streamed evaluation's chunk: at most this many clients (its temporaries grow with them: 110,000 clients of
# Synthetic's logistic regression took the evaluation to the 4 GiB budget cap) and this many bytes of their state
EVAL_CHUNK_CLIENTS, EVAL_CHUNK_BYTES = 16_384, 64 * 2 ** 20
INIT_CHUNK = 1024  # clients whose initial state one compiled call computes (a block's never-written clients)


class StoreWriteError(OSError):
    """A write into the store failed (a full disk, a vanished directory): one line naming the store and the cause;
    the rows of the failed block were not written (its journal comes first) and the last checkpoint is intact."""


@flax.struct.dataclass
class StoredClients:
    """What :attr:`State.clients <fljax.engine.State>` holds when a store keeps the clients: the store, as static
    data (no arrays). The rows themselves: :func:`client_states`."""

    store: Any = flax.struct.field(pytree_node=False)


def _leaf_specs(clients) -> tuple[Any, list[tuple[tuple, np.dtype]]]:
    """(treedef, [(one client's shape, dtype)]) of a per-client pytree with a leading client axis (shapes)."""
    leaves, treedef = jax.tree.flatten(clients)
    return treedef, [(tuple(x.shape[1:]), np.dtype(x.dtype)) for x in leaves]


def _row_bytes(specs) -> int:
    return int(sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in specs))


def store_bytes(num_clients: int, specs) -> int:
    """Bytes of a store of ``num_clients`` clients whose state has leaves ``specs`` ([(shape, dtype)]): the rows and
    one ``written`` byte per client."""
    return num_clients * (_row_bytes(specs) + 1)


# ------------------------------------------------------------------------------------------------------- stores


class ClientStore:
    """Every client's state as rows: ``leaves[j]`` is ``[N, *shape_j]`` (the client pytree's leaves, ``treedef``) and
    ``written[i]`` says whether client i's row holds a state (else it still has its initial state, computed when it
    is first gathered). In host memory (``kind`` 'host'); :class:`DiskStore` keeps the same arrays in files.
    ``identity``: what run the store belongs to (compared when it is opened again)."""

    kind = "host"

    def __init__(self, treedef, specs, num_clients: int, identity: dict):
        self._setup(treedef, specs, num_clients, identity)
        self.leaves = [np.zeros((self.num_clients, *shape), dtype) for shape, dtype in self.specs]
        self.written = np.zeros(self.num_clients, np.uint8)

    def _setup(self, treedef, specs, num_clients, identity) -> None:
        self.treedef, self.specs, self.num_clients, self.identity = treedef, list(specs), int(num_clients), identity
        self.round = 0  # the round whose clients the rows hold (a State of another round cannot run on them)
        self.restores = 0  # how often the rows were returned to a checkpoint (what was read ahead is then stale)
        # one worker thread: the store's writes and the reads behind them, in the order they were submitted
        self.io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fljax-store")
        self._pending: list[concurrent.futures.Future] = []  # the writes not yet waited for
        weakref.finalize(self, self.io.shutdown, wait=True)

    def submit(self, fn, *args, write: bool = False) -> concurrent.futures.Future:
        """Run ``fn(*args)`` on the store's worker, after everything submitted before; a ``write`` is waited for
        by :meth:`drain` (a read's result is its caller's)."""
        future = self.io.submit(fn, *args)
        if write:
            self._pending.append(future)
        return future

    def drain(self) -> None:
        """Wait for everything submitted; a failed write is raised here (:class:`StoreWriteError`)."""
        self.io.submit(lambda: None).result()  # the reads behind the writes too
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def raise_failed(self) -> None:
        """Raise the error of a write that has already failed (the run stops at the next block, not at the end)."""
        for f in self._pending:
            if f.done() and f.exception() is not None:
                self._pending = []
                raise f.exception()
        self._pending = [f for f in self._pending if not f.done()]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_clients:,} clients, {self.row_bytes:,} bytes each)"

    @property
    def row_bytes(self) -> int:
        return _row_bytes(self.specs)

    def read(self, ids: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """(rows of clients ``ids`` [k, …] per leaf, their ``written`` flags [k] bool), copies."""
        return [np.asarray(a[ids]) for a in self.leaves], self.written[ids].astype(bool)

    def write(self, ids: np.ndarray, rows: list[np.ndarray]) -> None:
        """Rows ``rows`` into clients ``ids``, flagged written."""
        for a, r in zip(self.leaves, rows):
            a[ids] = r
        self.written[ids] = 1

    def write_block(self, ids, rows, old, start: int, end: int) -> None:
        """A block's rows (rounds ``start`` … ``end`` − 1) written back; ``old``: their values before the block
        (what :class:`DiskStore` journals)."""
        self.write(ids, rows)

    # checkpoints (fljax.runner.checkpoint): a host store goes into the checkpoint whole
    def commit(self, round_: int) -> None:
        """Make the rows as of round ``round_`` durable (before its checkpoint is saved), the pending writes
        first."""
        self.drain()

    def checkpoint_tree(self):
        """What a checkpoint saves of the store: every row and flag (a host store)."""
        return {"leaves": list(self.leaves), "written": self.written}

    def restore(self, round_: int, saved) -> None:
        """The rows as of the checkpoint of round ``round_`` (``saved``: its :meth:`checkpoint_tree`)."""
        self.drain()
        self.leaves = [np.array(a) for a in saved["leaves"]]
        self.written = np.array(saved["written"])
        self.round, self.restores = round_, self.restores + 1

    def forget_before(self, round_: int) -> None:
        """No checkpoint older than round ``round_`` will be restored (its journals may go)."""

    def close(self) -> None:
        self.drain()


class DiskStore(ClientStore):
    """The rows in files under ``directory``: ``meta.json`` (format, clients, leaves, identity), ``leaf-<j>.bin``
    (raw C-order arrays, space reserved with ``posix_fallocate``), ``written.bin`` and ``undo/`` (the journals of
    the blocks since the oldest checkpoint kept; module docstring). :meth:`create` makes a new one, :meth:`open` an
    existing one (refusing one of another run)."""

    kind = "disk"

    def __init__(self, directory: str, treedef, specs, num_clients: int, identity: dict):
        self._setup(treedef, specs, num_clients, identity)
        self.directory = os.path.abspath(directory)
        self._files = [self._leaf(j) for j in range(len(self.specs))] + [os.path.join(self.directory, WRITTEN)]
        shapes = [((self.num_clients, *shape), dtype) for shape, dtype in self.specs] + \
            [((self.num_clients,), np.dtype(np.uint8))]
        self._maps, arrays = zip(*(_mapped(path, shape, dtype) for path, (shape, dtype) in zip(self._files, shapes)))
        self.leaves, self.written = list(arrays[:-1]), arrays[-1]
        self.journaling = False  # from the first checkpoint on
        self.failed: StoreWriteError | None = None  # a write that failed: every later one refused

    def _leaf(self, j: int) -> str:
        return os.path.join(self.directory, f"leaf-{j:03d}.bin")

    def read(self, ids):
        try:
            return super().read(ids)
        finally:
            self._release()

    def write(self, ids, rows):
        try:
            super().write(ids, rows)
        finally:
            self._release()

    def _release(self) -> None:
        """Unmap the pages a read or write touched (``MADV_DONTNEED``; a written page stays in the page cache, dirty,
        for the kernel to write back): without it the pages of every row ever touched, and the kernel's
        fault-around neighbours, would count as the process's resident memory."""
        for m in self._maps:
            if m is not None:
                m.madvise(mmap.MADV_DONTNEED)

    @classmethod
    def create(cls, directory: str, treedef, specs, num_clients: int, identity: dict) -> "DiskStore":
        """A new store (what was in ``directory`` removed: the caller checked it is this run's or empty), its space
        reserved; refused in one line when the folder's disk cannot hold it (:func:`check_space`)."""
        check_space(directory, num_clients, specs)
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        os.makedirs(os.path.join(directory, UNDO))
        try:
            for j, (shape, dtype) in enumerate(specs):
                _reserve(os.path.join(directory, f"leaf-{j:03d}.bin"),
                         num_clients * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
            _reserve(os.path.join(directory, WRITTEN), num_clients)
            meta = {"format": FORMAT, "num_clients": int(num_clients), "identity": identity,
                    "leaves": [{"shape": list(shape), "dtype": dtype.name} for shape, dtype in specs]}
            _write_atomic(os.path.join(directory, META), json.dumps(meta, indent=1).encode())
        except OSError as e:
            shutil.rmtree(directory, ignore_errors=True)
            raise StoreWriteError(f"could not create the client-state store in {directory}: "
                                  f"{_cause(e)}.") from None
        return cls(directory, treedef, specs, num_clients, identity)

    @classmethod
    def open(cls, directory: str, treedef, specs, num_clients: int, identity: dict) -> "DiskStore":
        """The store in ``directory``, after checking it is this run's (:func:`check_meta`)."""
        check_meta(directory, specs, num_clients, identity)
        undo = os.path.join(directory, UNDO)
        for name in os.listdir(undo):  # a journal whose write was cut short (never renamed: never applied)
            if name.startswith("."):
                os.remove(os.path.join(undo, name))
        return cls(directory, treedef, specs, num_clients, identity)

    # ------------------------------------------------------------------------------------------ journal
    def _segments(self) -> list[tuple[int, int, str]]:
        """(start, end, path) of every complete journal, by start."""
        out = []
        for name in os.listdir(os.path.join(self.directory, UNDO)):
            if name.endswith(".npz") and not name.startswith("."):
                start, end = (int(x) for x in name[:-4].split("-"))
                out.append((start, end, os.path.join(self.directory, UNDO, name)))
        return sorted(out)

    def write_block(self, ids, rows, old, start, end):
        if self.failed is not None:  # after a failed write no later block may land: its journal would be wrong
            raise self.failed
        if self.journaling:  # the old rows first, complete and durable, then the rows in place
            path = os.path.join(self.directory, UNDO, f"{start:010d}-{end:010d}.npz")
            arrays = {"ids": ids, "written": np.asarray(self.written[ids]),
                      **{f"leaf{j}": r for j, r in enumerate(old)}}
            tmp = os.path.join(self.directory, UNDO, f".{start:010d}.tmp")
            try:
                with open(tmp, "wb") as f:
                    np.savez(f, **arrays)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                _fsync(os.path.dirname(path))
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                self.failed = StoreWriteError(f"could not write the store's journal of rounds {start + 1}–{end} into "
                                              f"{self.directory}: {_cause(e)}; the store was not changed, the last "
                                              f"checkpoint is intact: make room and continue with --resume.")
                raise self.failed from None
        self.write(ids, rows)

    def commit(self, round_: int) -> None:
        self.drain()
        try:
            for path in self._files:
                _fsync(path)
            _fsync(os.path.join(self.directory, UNDO))
        except OSError as e:
            raise StoreWriteError(f"could not flush the client-state store in {self.directory} for the checkpoint "
                                  f"of round {round_}: {_cause(e)}.") from None
        self.journaling = True

    def checkpoint_tree(self):
        """The count of clients written so far (for inspection; the rows stay in the store)."""
        return {"clients_written": np.asarray(int(np.count_nonzero(self.written)), np.int64)}

    def restore(self, round_: int, saved) -> None:
        """Undo every block after round ``round_``: their journals applied newest first, each deleted once its rows
        are back (a crash in between applies it again: it writes the same values)."""
        self.drain()
        for start, end, path in reversed(self._segments()):
            if start < round_:
                break
            with np.load(path) as journal:
                self.write(journal["ids"], [journal[f"leaf{j}"] for j in range(len(self.leaves))])
                self.written[journal["ids"]] = journal["written"]
            for file in self._files:
                _fsync(file)
            os.remove(path)
        self._release()
        self.journaling = True
        self.round, self.restores = round_, self.restores + 1

    def forget_before(self, round_: int) -> None:
        for start, end, path in self._segments():
            if end <= round_:
                os.remove(path)

    def close(self) -> None:
        self.drain()
        for m in self._maps:
            if m is not None:
                m.flush()


def _mapped(path: str, shape: tuple, dtype: np.dtype):
    """(the memory map, an array over it) of the raw file ``path`` holding ``shape`` of ``dtype`` (no map for an
    empty array). Random access (``MADV_RANDOM``: no read-ahead of the neighbours of a row)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return None, np.zeros(shape, dtype)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), nbytes)
    m.madvise(mmap.MADV_RANDOM)
    return m, np.ndarray(shape, dtype, buffer=m)


def _fsync(path: str) -> None:
    """Flush a file's or a folder's (its entries') writes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reserve(path: str, nbytes: int) -> None:
    with open(path, "wb") as f:
        if nbytes:
            os.posix_fallocate(f.fileno(), 0, nbytes)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _cause(e: OSError) -> str:
    return os.strerror(e.errno).lower() if e.errno else str(e).splitlines()[0][:160]


def _gb(n: int) -> str:
    return f"{n / 1e9:,.2f} GB"


def check_space(directory: str, num_clients: int, specs) -> None:
    """Refuse, in one line naming the bytes, a disk store that the disk holding ``directory`` cannot hold: its rows
    and flags plus one block's journal (at least 5 % more), against the free bytes there (a store being replaced
    counts as free)."""
    need = store_bytes(num_clients, specs)
    need += need // 20
    probe = directory
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "."
    stat = os.statvfs(probe)
    free = stat.f_bavail * stat.f_frsize
    if os.path.isdir(directory):
        free += sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(directory) for f in fs)
    if need > free:
        raise OptionError("store_dir", f"{directory!r} cannot hold the client-state store: it needs {_gb(need)} "
                                       f"({num_clients:,} clients × {_row_bytes(specs):,} bytes of state, and room for "
                                       f"the journal), and its disk has {_gb(free)} free; choose a store_dir on a "
                                       f"larger disk, or fewer clients (data.num_clients).")


def read_meta(directory: str) -> dict | None:
    """The store's ``meta.json`` in ``directory`` (None: no store there)."""
    path = os.path.join(directory, META)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is damaged ({str(e).splitlines()[0][:120]}); the client-state store in "
                          f"{directory!r} cannot be used: move it away to start the run afresh.") from None


def check_meta(directory: str, specs, num_clients: int, identity: dict) -> None:
    """Refuse, in one line, a store in ``directory`` that is missing or belongs to another run (another
    algorithm, population, state layout, seed or configuration)."""
    meta = read_meta(directory)
    if meta is None:
        raise ConfigError(f"the client-state store {directory!r} is missing (no {META}): a checkpoint of a run with "
                          f"state_store: disk needs its store; restore it, or move the run's checkpoints away to "
                          f"start afresh.")
    mine = {"format": FORMAT, "num_clients": int(num_clients),
            "leaves": [{"shape": list(shape), "dtype": dtype.name} for shape, dtype in specs]}
    theirs = meta.get("identity", {})
    for key, what in (("algorithm", "algorithm"), ("run", "run (configuration and seed)")):
        if theirs.get(key) != identity.get(key):
            raise ConfigError(f"the client-state store in {directory!r} belongs to another {what} "
                              f"({theirs.get(key)!r}, this run: {identity.get(key)!r}); choose another store_dir or "
                              f"move that store away.")
    for key in ("format", "num_clients", "leaves"):
        if meta.get(key) != mine[key]:
            raise ConfigError(f"the client-state store in {directory!r} holds another {key.replace('_', ' ')} "
                              f"({meta.get(key)!r}, this run: {mine[key]!r}); choose another store_dir or move that "
                              f"store away.")


# ------------------------------------------------------------------------------------------------------ refusals


def refusal(sim) -> str | None:
    """Why ``sim`` (a :class:`~fljax.engine.Simulation`) cannot keep its clients in a store, or None."""
    from fljax.data.federated import FederatedData
    from fljax.participation import Poisson, Uniform

    algo = sim.algorithm
    if not isinstance(sim.data, FederatedData):
        return "it stores the clients of classification data"
    if not getattr(algo, "samples_cohorts", False):
        return (f"{algo.name} runs every client every round (gossip or consensus), so every client's state is on "
                f"the device anyway")
    if (why := algo.whole_population()) is not None:
        return f"{algo.name}: {why}"
    if getattr(algo, "cohort_mode", "gather") != "gather":
        return "algo.cohort_mode: mask computes every client every round, a store runs cohort_mode: gather"
    if sim.population is not None:
        return "client groups (groups, or data in groups of its own) run on the device"
    if getattr(sim.data, "num_target", 0):
        return "target clients (data.num_target) are not supported"
    participation = sim.participation
    if type(participation) not in (Uniform, Poisson) or getattr(participation, "system", False):
        return (f"participation {participation.name!r} draws its cohorts from state the rounds carry, so a block's "
                f"cohorts are not known before it runs (participation uniform and poisson draw from the keys alone)")
    if jax.process_count() > 1:
        return "a simulation over several processes (--processes) keeps its clients on the devices"
    return None


def check(sim, kind: str) -> None:
    """Refuse, in one line naming ``state_store``, a store ``kind`` that ``sim`` cannot use."""
    if kind not in STORES:
        raise OptionError("state_store", f"must be one of {list(STORES)}, got {kind!r}.")
    if kind != "device" and (why := refusal(sim)) is not None:
        raise OptionError("state_store", f"{kind} cannot hold this run's clients: {why} (state_store: device keeps "
                                         f"them on the device).")


# ------------------------------------------------------------------------------------------------------ engine


def _round_key(base, round_):
    from fljax.engine.driver import _round_key as key

    return key(base, round_)


@dataclasses.dataclass
class _Prefetch:
    """A block read ahead: the block of ``rounds`` (start, n) has cohorts ``draws`` and clients ``members``;
    ``rows`` hold those not in the previous block (``fresh``), read from the store while the previous block ran."""

    rounds: tuple[int, int]
    draws: Any
    members: np.ndarray
    fresh: np.ndarray
    rows: list[np.ndarray]


class StoreEngine:
    """How a :class:`~fljax.engine.Simulation` runs with its clients in a store (``kind`` 'host' or 'disk'; module
    docstring): :meth:`init`, :meth:`run_rounds` and :meth:`evaluate` take and return the simulation's
    :class:`State` whose ``clients`` is a :class:`StoredClients`. ``directory``: where a disk store is kept (None: a
    temporary directory removed when the engine is)."""

    def __init__(self, sim, kind: str, directory: str | None = None):
        self.sim, self.kind, self.directory = sim, kind, directory
        self._prefetch: concurrent.futures.Future | None = None  # the next block's rows, read ahead
        self._previous: tuple | None = None  # (store, its restores, end round, members, their rows after the block)
        self._temp: str | None = None
        self.separable_checked = False
        self.io_seconds = 0.0  # what the run loop waited for the store (gathers, writes)

    # ----------------------------------------------------------------------------------------- layout
    def client_shapes(self, hp=None):
        """(treedef, leaf specs) of one client's state, from shapes only."""
        sim = self.sim
        clients = jax.eval_shape(lambda k: sim.init_fn(k, hp).clients, jax.random.PRNGKey(0))
        return _leaf_specs(clients)

    def identity(self, seed: int, run: str | None = None) -> dict:
        """What a store records about its run: the algorithm's name and a hash of its hyperparameters, the data's
        clients and the seed (``run``: the runner's hash of the whole configuration, which replaces it)."""
        sim = self.sim
        text = json.dumps({"hp": sim.algorithm.hyperparameters(), "clients": sim.data.num_clients, "seed": seed},
                          sort_keys=True, default=str)
        return {"algorithm": sim.algorithm.name,
                "run": run or hashlib.sha256(text.encode()).hexdigest()[:16] + f"-seed{seed}"}

    def _store_dir(self, directory: str | None) -> str:
        directory = directory or self.directory
        if directory is None:
            if self._temp is None:
                self._temp = tempfile.mkdtemp(prefix="fljax-store-")
                weakref.finalize(self, shutil.rmtree, self._temp, True)
            directory = os.path.join(self._temp, "store")
        return directory

    def make_store(self, seed: int, directory: str | None = None, run: str | None = None, *,
                   resume: bool = False) -> ClientStore:
        """A new store for the run with ``seed`` (a disk store in ``directory``: one of another run there is
        refused, one of this run replaced), or with ``resume`` the existing one (checked to be this run's)."""
        treedef, specs = self.client_shapes()
        identity = self.identity(seed, run)
        n = self.sim.data.num_clients
        if self.kind == "host":
            _check_host_memory(n, specs)
            return ClientStore(treedef, specs, n, identity)
        directory = self._store_dir(directory)
        if resume:
            return DiskStore.open(directory, treedef, specs, n, identity)
        if read_meta(directory) is not None:
            check_meta(directory, specs, n, identity)  # another run's store is never overwritten
        elif os.path.isdir(directory) and os.listdir(directory):
            raise ConfigError(f"store_dir: {directory!r} holds files that are not a client-state store; choose an "
                              f"empty or new folder.")
        return DiskStore.create(directory, treedef, specs, n, identity)

    # ----------------------------------------------------------------------------------------- init
    def init(self, seed: int, store: ClientStore) -> State:
        """The run's initial state: the server's from the initialisation program (the clients' rows are computed
        when first gathered, :meth:`initial_rows`)."""
        sim = self.sim
        key = jax.random.PRNGKey(seed)
        fn = sim.compiled("store_init", lambda k, d: sim.init_fn(k, None, d).server, (key, sim.data)) \
            if sim.executor.jittable else (lambda k, d: sim._eager(lambda: sim.init_fn(k, None, d).server))
        server = fn(key, sim.data)
        self._check_separable(key, store)
        return State(server=server, clients=StoredClients(store), round=jnp.int32(0), key=key)

    def _init_chunk(self, key, ids, data):
        sim = self.sim
        ctx = sim.context(data, jnp.int32(0), jax.random.fold_in(key, 0), key, None).restricted(ids)
        return jax.tree.leaves(sim.algorithm.init_population(ctx)[1])

    def initial_rows(self, key, ids: np.ndarray, size: int = INIT_CHUNK) -> list[np.ndarray]:
        """The initial state of clients ``ids``, as the whole population's initialisation gives their rows
        (computed ``size`` clients at a time, by the algorithm's init restricted to them: one compiled program per
        size)."""
        sim = self.sim
        n = len(ids)
        size = min(size, sim.data.num_clients)
        parts = []
        for lo in range(0, n, size):
            chunk = ids[lo:lo + size]
            padded = np.concatenate([chunk, np.full(size - len(chunk), chunk[-1], chunk.dtype)]).astype(np.int32)
            if sim.executor.jittable:
                fn = sim.compiled("store_init_rows", self._init_chunk, (key, padded, sim.data))
                out = fn(key, padded, sim.data)
            else:
                out = sim._eager(self._init_chunk, key, padded, sim.data)
            parts.append([np.asarray(x)[:len(chunk)] for x in jax.device_get(out)])
        return [np.concatenate(p) for p in zip(*parts)] if parts else []

    def _check_separable(self, key, store: ClientStore) -> None:
        """Refuse an algorithm whose initial client rows depend on which other clients are initialised with them
        (two overlapping chunks must agree on their common clients)."""
        n = self.sim.data.num_clients
        if self.separable_checked or n <= 2:
            return
        size = min(INIT_CHUNK, n)
        a = self.initial_rows(key, np.arange(0, size - 1))
        b = self.initial_rows(key, np.arange(1, size))
        for x, y in zip(a, b):
            if not np.array_equal(x[1:], y[:-1], equal_nan=True):
                raise OptionError("state_store", f"{self.kind} cannot hold {self.sim.algorithm.name}'s clients: their "
                                                 f"initial state depends on which other clients are initialised with "
                                                 f"them; use state_store: device.")
        self.separable_checked = True

    # ----------------------------------------------------------------------------------------- blocks
    def _draws_fn(self, key, start, data, n: int):
        """The :class:`~fljax.participation.Cohort` s of rounds start … start + n − 1, stacked: the participation's
        draw of each round, as the round itself would call it."""
        sim = self.sim
        algo = sim.algorithm

        def one(t):
            ctx = sim.context(data, t, _round_key(key, t), key, None)
            return ctx.participation.draw(ctx, algo.cohort_size)

        return jax.lax.map(one, start + jnp.arange(n, dtype=jnp.int32))

    def cohorts(self, key, start: int, n: int):
        """(the cohorts of rounds ``start`` … ``start + n − 1``, stacked; the sorted ids of the clients they sample,
        their union)."""
        sim = self.sim
        args = (key, jnp.int32(start), sim.data)
        if sim.executor.jittable:
            draws = sim.compiled("store_draws", lambda k, s, d: self._draws_fn(k, s, d, n), args, (n,))(*args)
        else:
            draws = sim._eager(lambda: self._draws_fn(*args, n))
        ids = np.asarray(draws.ids)
        valid = np.ones(ids.shape, bool) if draws.valid is None else np.asarray(draws.valid)
        return draws, np.unique(ids[valid & (ids < sim.data.num_clients)]).astype(np.int32)

    def slots_per_round(self) -> int:
        """m: the cohort slots of one round (the draw's static size)."""
        sim = self.sim
        shapes = jax.eval_shape(lambda k, d: self._draws_fn(k, jnp.int32(0), d, 1), jax.random.PRNGKey(0), sim.data)
        return int(shapes.ids.shape[1])

    def capacity(self, n: int) -> int:
        """Rows of the buffer of a block of ``n`` rounds: min(N, n·m)."""
        return min(self.sim.data.num_clients, n * self.slots_per_round())

    def gather(self, store: ClientStore, key, ids: np.ndarray, size: int = INIT_CHUNK) -> list[np.ndarray]:
        """The current rows of clients ``ids`` (initial states computed for those never written, ``size`` at a
        time)."""
        rows, written = store.read(ids)
        if not written.all():
            fresh = self.initial_rows(key, ids[~written], size)
            for r, f in zip(rows, fresh):
                r[~written] = f
        return rows

    def _read_ahead(self, store, key, rounds, exclude: np.ndarray) -> _Prefetch:
        draws, members = self.cohorts(key, *rounds)
        fresh = members[~np.isin(members, exclude)]
        return _Prefetch(rounds, draws, members, fresh, self.gather(store, key, fresh))

    def _drain(self, store: ClientStore) -> None:
        t0 = time.perf_counter()
        try:
            store.drain()
        finally:
            self.io_seconds += time.perf_counter() - t0

    def _block_rows(self, store, key, start: int, n: int):
        """(cohorts, members, their rows) for the block of rounds start … start + n − 1: from the read-ahead and
        the previous block's output when they were foreseen, else read after the pending writes."""
        ahead, self._prefetch = self._prefetch, None
        previous = self._previous
        if ahead is not None:
            got = ahead.result()
            if got.rounds == (start, n) and previous is not None and previous[:3] == (store, store.restores, start):
                before, before_rows = previous[3:]
                rows = [np.empty((len(got.members), *shape), dtype) for shape, dtype in store.specs]
                fresh = ~np.isin(got.members, before)
                where = np.searchsorted(before, got.members[~fresh])
                for r, f, b in zip(rows, got.rows, before_rows):
                    r[fresh] = f
                    r[~fresh] = b[where]
                return got.draws, got.members, rows
        self._drain(store)
        draws, members = self.cohorts(key, start, n)
        return draws, members, self.gather(store, key, members)

    def run_rounds(self, state: State, n: int):
        """n rounds on the block's buffer (module docstring); returns the state (its clients still the store's
        handle) and the rounds' metrics stacked along axis 0."""
        sim, store = self.sim, state.clients.store
        start = int(state.round)
        store.raise_failed()
        if start != store.round:
            raise ValueError(f"this state is of round {start}, its store holds the clients of round {store.round}: a "
                             f"store keeps its run's latest clients, so only the latest state runs on.")
        t0 = time.perf_counter()
        draws, members, rows = self._block_rows(store, state.key, start, n)
        self.io_seconds += time.perf_counter() - t0
        cap, u = self.capacity(n), len(members)
        slots = np.full(cap, sim.data.num_clients, np.int32)
        slots[:u] = members
        buffer = [_padded(r, cap) for r in rows]
        clients = jax.tree.unflatten(store.treedef, [jnp.asarray(b) for b in buffer])
        inner = State(server=state.server, clients=clients, round=state.round, key=state.key)
        slots_j = jnp.asarray(slots)
        if sim.executor.jittable:
            fn = sim.compiled("store_block", lambda s, d, sl, c: sim.block_fn(s, d, n, None, sl, c),
                              (inner, sim.data, slots_j, draws), (n,))
            out, metrics = fn(inner, sim.data, slots_j, draws)
        else:
            outs = []
            out = inner
            for t in range(n):
                out, m = sim._eager(sim.round_fn, out, sim.data, None, slots_j,
                                    jax.tree.map(lambda a: a[t], draws))
                outs.append(m)
            metrics = tree.stack(outs)
        end = start + n
        # while the block runs: the next block (of the same length) read ahead, behind the previous block's write
        self._prefetch = store.submit(self._read_ahead, store, state.key, (end, n), members)
        new_rows = [np.asarray(x)[:u] for x in jax.device_get(jax.tree.leaves(out.clients))]
        store.submit(store.write_block, members, new_rows, rows, start, end, write=True)
        store.round = end
        self._previous = (store, store.restores, end, members, new_rows)
        return State(server=out.server, clients=state.clients, round=out.round, key=state.key), metrics

    # ----------------------------------------------------------------------------------------- evaluation
    def _eval_chunk(self, server, rows, ids, data, round_, key):
        sim = self.sim
        algo = sim.algorithm
        ctx = sim.context(data, round_, _round_key(key, round_), key, None).restricted(ids)
        own_server, own_rows = algo.own_state(server, rows)
        return algo.evaluation_stats(ctx, own_server, own_rows), algo.population_values(own_rows)

    def _summary(self, server, stats, values, data, round_, key):
        sim = self.sim
        algo = sim.algorithm
        ctx = sim.context(data, round_, _round_key(key, round_), key, None)
        ctx = dataclasses.replace(ctx, eval_ids=sim.eval_ids)
        scored = ctx if sim.eval_ids is None else ctx.restricted(sim.eval_ids)
        own_server, _ = algo.own_state(server, None)
        return algo.evaluation_summary(ctx, scored, own_server, None, stats, values)

    def eval_chunk(self, row_bytes: int) -> int:
        """Clients per streamed evaluation chunk of clients of ``row_bytes`` bytes of state: :data:`EVAL_CHUNK_CLIENTS`,
        and :data:`EVAL_CHUNK_BYTES` of their state, at most."""
        return int(max(1, min(self.sim.data.num_clients, EVAL_CHUNK_CLIENTS, EVAL_CHUNK_BYTES // max(row_bytes, 1))))

    def programs(self, key, data) -> list[tuple[str, Any, tuple]]:
        """``(name, function, arguments)`` of the store's programs from shapes only (``key``, ``data``: shapes), for
        :meth:`Simulation.plan_memory <fljax.engine.Simulation.plan_memory>`: the server's initialisation, one
        round on its buffer of min(N, m) rows and the evaluation of one chunk."""
        sim = self.sim
        treedef, specs = self.client_shapes()

        def clients(n):
            return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct((n, *shape), dtype) for shape, dtype in specs])

        server = jax.eval_shape(lambda k, d: sim.init_fn(k, None, d).server, key, data)
        round_ = jax.ShapeDtypeStruct((), jnp.int32)
        cap, chunk = self.capacity(1), self.eval_chunk(_row_bytes(specs))
        inner = State(server=server, clients=clients(cap), round=round_, key=key)
        draws = jax.eval_shape(lambda k, d: self._draws_fn(k, jnp.int32(0), d, 1), key, data)
        return [("store_init", lambda k, d: sim.init_fn(k, None, d).server, (key, data)),
                ("store_block", lambda s, d, sl, c: sim.block_fn(s, d, 1, None, sl, c),
                 (inner, data, jax.ShapeDtypeStruct((cap,), jnp.int32), draws)),
                ("store_evaluate", self._eval_chunk,
                 (server, clients(chunk), jax.ShapeDtypeStruct((chunk,), jnp.int32), data, round_, key))]

    def evaluate(self, state: State):
        """(summaries, per-client arrays) as :meth:`Simulation.evaluate` gives them for the state on the device:
        every scored client's statistics in chunks of the store, then one reduction."""
        sim, store = self.sim, state.clients.store
        self._drain(store)
        n = sim.data.num_clients
        scored = np.arange(n, dtype=np.int32) if sim.eval_ids is None else np.asarray(sim.eval_ids, np.int32)
        size = self.eval_chunk(store.row_bytes)
        wants_values = self._has_values()
        passes = [(scored, True, wants_values and sim.eval_ids is None)]
        if wants_values and sim.eval_ids is not None:
            passes.append((np.arange(n, dtype=np.int32), False, True))
        stats, values = None, {}
        for ids_all, want_stats, want_values in passes:
            parts_s, parts_v = [], []
            chunks = [ids_all[lo:lo + size] for lo in range(0, len(ids_all), size)]
            ahead = store.submit(self.gather, store, state.key, chunks[0], size) if chunks else None
            for i, chunk in enumerate(chunks):
                t0 = time.perf_counter()
                rows = ahead.result()
                self.io_seconds += time.perf_counter() - t0
                ahead = store.submit(self.gather, store, state.key, chunks[i + 1], size) if i + 1 < len(chunks) \
                    else None
                padded_ids = np.concatenate([chunk, np.full(size - len(chunk), chunk[-1], np.int32)])
                clients = jax.tree.unflatten(store.treedef, [jnp.asarray(_padded(r, size)) for r in rows])
                args = (state.server, clients, jnp.asarray(padded_ids), sim.data, state.round, state.key)
                if sim.executor.jittable:
                    s, v = sim.compiled("store_evaluate", self._eval_chunk, args)(*args)
                else:
                    s, v = sim._eager(self._eval_chunk, *args)
                s, v = jax.device_get((s, v))
                k = len(chunk)
                if want_stats:
                    parts_s.append(jax.tree.map(lambda a: np.asarray(a)[:k], s))
                if want_values:
                    parts_v.append(jax.tree.map(lambda a: np.asarray(a)[:k], v))
            if want_stats:
                stats = jax.tree.map(lambda *a: np.concatenate(a), *parts_s)
            if want_values:
                values = jax.tree.map(lambda *a: np.concatenate(a), *parts_v)
        args = (state.server, stats, values, sim.data, state.round, state.key)
        if sim.executor.jittable:
            return sim.compiled("store_summary", self._summary, args)(*args)
        return sim._eager(self._summary, *args)

    def _has_values(self) -> bool:
        from fljax.algorithms.base import Algorithm

        algo = self.sim.algorithm
        return isinstance(algo, Algorithm) and type(algo).client_values is not Algorithm.client_values

    # ----------------------------------------------------------------------------------------- rows
    def clients(self, state: State, ids=None):
        """The per-client state of clients ``ids`` (None: every client) as host arrays with a leading client axis
        (initial states for clients never trained), after the pending writes."""
        store = state.clients.store
        self._drain(store)
        ids = np.arange(store.num_clients, dtype=np.int32) if ids is None else np.asarray(ids, np.int32)
        return jax.tree.unflatten(store.treedef, self.gather(store, state.key, ids))



def _padded(rows: np.ndarray, size: int) -> np.ndarray:
    """``rows`` [u, …] extended to ``size`` rows with copies of its last (zeros when empty)."""
    u = rows.shape[0]
    if u == size:
        return rows
    if u == 0:
        return np.zeros((size, *rows.shape[1:]), rows.dtype)
    return np.concatenate([rows, np.repeat(rows[-1:], size - u, axis=0)])


def _check_host_memory(num_clients: int, specs) -> None:
    from fljax.engine.budget import device_memory

    need = store_bytes(num_clients, specs)
    _, have = device_memory()
    if need > have // 2:
        raise OptionError("state_store", f"host needs {_gb(need)} of memory for {num_clients:,} clients' state, more "
                                         f"than half of this machine's {_gb(have)}; use state_store: disk.")


def client_states(sim, state: State, ids=None):
    """The per-client state of clients ``ids`` (None: every client) of ``sim``'s run at ``state``, whatever keeps
    it: rows of the device's state, or of its store (host arrays)."""
    if isinstance(state.clients, StoredClients):
        return sim.store_engine.clients(state, ids)
    clients = jax.device_get(state.clients)
    return clients if ids is None else jax.tree.map(lambda a: np.asarray(a)[np.asarray(ids)], clients)
