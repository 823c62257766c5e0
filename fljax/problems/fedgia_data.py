"""Data of FedGiA's experiments (spec §5, §10.2): the Example V.1 generator, qot with the paper's preprocessing and
random contiguous splits, and the packing of many trials' clients into padded size classes.

Every instance is a list of m ``(A_i, b_i)`` float64 NumPy pairs, drawn from ``numpy.random.default_rng(seed)``.

Padding (spec §10.2): clients' rows are padded with zero rows up to a common row count. qot's client sizes are
very unequal (mean 70, largest several hundred), so :func:`pack_trials` can split the client axis into a few *size
classes* (blocks), each padded to its own row count: with ``blocks > 1`` the clients of every trial are ordered by
size and block k holds the same ranks in every trial, so all trials share one set of shapes (and can be vmapped).
Client labels carry no meaning in FedGiA or its baselines (selection is uniform and aggregation an unweighted
mean), so this reordering changes nothing but the order of floating-point sums; ``order`` records it.
"""
from __future__ import annotations

import functools
import time

import flax.struct
import numpy as np
import threadpoolctl

from fljax import tree
from fljax.data.bundled import qot_arrays
from fljax.problems.regression import ClientData, lambda_max_host

__all__ = ["v1_instance", "v1_sizes", "qot_instance", "qot_sizes", "sct_standin_instance", "ClientBlocks", "SizeClass",
           "size_blocks", "pack_trials"]


def v1_instance(seed: int, m: int = 128, n: int = 100, d_range: tuple[int, int] = (50, 150),
                generator: str = "code", block_len: str = "loop") -> list[tuple[np.ndarray, np.ndarray]]:
    """Example V.1: linear regression data from N(0,1), Student-t(5) and U[−5,5] mixed, split into m clients.

    ``generator="code"`` (default, decision D5) follows the first published reference code (spec §5.1):

    1. d_i ~ UniformInt{lo..hi} (``d_range``, D6); client i owns rows [start_i, start_i + d_i) of the stack.
    2. A ~ N(0,1)^{d×n}, b ~ N(0,1)^d (b is pure noise).
    3. A random permutation P of the clients; q1 = ⌈m/3⌉, q2 = ⌈2m/3⌉ − q1.
    4. For j = 1..q1 the rows [start_{P_j}, start_{P_j} + d_j) of A and b are redrawn iid Student-t(5),
    5. for j = 1..q2 the rows [start_{P_{q1+j}}, start_{P_{q1+j}} + d_j) iid U[−5, 5]. The block length is d_j of the
       loop counter j (``block_len="loop"``; ``"own"`` uses the chosen client's d_{P_j}), so blocks may spill into
       the next client's rows; later writes overwrite earlier ones; rows past d are dropped.
    6. All rows are shuffled jointly and client i receives rows [start_i, start_i + d_i).

    ``generator="paper_text"``: the first ⌈d/3⌉ rows Student-t(5), the next ⌈2d/3⌉ − ⌈d/3⌉ rows U[−5, 5], the rest
    N(0, 1), then the shuffle of step 6.
    """
    if generator not in ("code", "paper_text"):
        raise ValueError(f"v1 generator must be 'code' or 'paper_text', got {generator!r}.")
    if block_len not in ("loop", "own"):
        raise ValueError(f"v1 block_len must be 'loop' or 'own', got {block_len!r}.")
    lo, hi = d_range
    if not 1 <= lo <= hi:
        raise ValueError(f"d_range must satisfy 1 <= lo <= hi, got {d_range}.")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lo, hi + 1, size=m)                                   # v1_sizes draws exactly this
    d = int(sizes.sum())
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    a = rng.standard_normal((d, n))
    b = rng.standard_normal(d)

    def redraw(begin: int, length: int, draw):
        end = min(begin + length, d)
        a[begin:end] = draw((end - begin, n))
        b[begin:end] = draw((end - begin,))

    student = lambda shape: rng.standard_t(5, size=shape)
    uniform = lambda shape: rng.uniform(-5.0, 5.0, size=shape)
    if generator == "code":
        perm = rng.permutation(m)
        q1 = -(-m // 3)
        q2 = -(-2 * m // 3) - q1
        for j in range(q1):
            redraw(start[perm[j]], sizes[j] if block_len == "loop" else sizes[perm[j]], student)
        for j in range(q2):
            redraw(start[perm[q1 + j]], sizes[j] if block_len == "loop" else sizes[perm[q1 + j]], uniform)
    else:
        r1 = -(-d // 3)
        redraw(0, r1, student)
        redraw(r1, -(-2 * d // 3) - r1, uniform)
    shuffle = rng.permutation(d)
    a, b = a[shuffle], b[shuffle]
    return [(a[s:s + k], b[s:s + k]) for s, k in zip(start, sizes)]


def v1_sizes(seed: int, m: int = 128, d_range: tuple[int, int] = (50, 150)) -> np.ndarray:
    """The client sizes d_i of :func:`v1_instance` with the same arguments, without drawing the rows."""
    return np.random.default_rng(seed).integers(d_range[0], d_range[1] + 1, size=m)


@functools.lru_cache(maxsize=1)
def _qot_scaled() -> tuple[np.ndarray, np.ndarray]:
    """qot with every column scaled to unit ℓ2 norm and labels −1 → 0 (spec §5.2 step 1), read-only."""
    a, y = qot_arrays()
    norms = np.linalg.norm(a, axis=0)
    a = a / np.where(norms > 0, norms, 1.0)
    b = (y > 0).astype(np.float64)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


def _contiguous_split(rng, a, b, m: int, min_client_frac: float):
    """Shuffle the rows (one permutation for A and b) and cut them into m contiguous blocks (:func:`_split`)."""
    perm, edges = _split(rng, a.shape[0], m, min_client_frac)
    a, b = a[perm], b[perm]
    return [(a[lo:hi], b[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]


def _split(rng, d: int, m: int, min_client_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """(a permutation of the d rows, the m + 1 client edges): m − 1 distinct uniform cut points of {2, …, d − 1},
    redrawn until min_i d_i > ``min_client_frac``·d/m (spec §5.2 steps 2–4, D8)."""
    if not 1 <= m <= d // 2:
        raise ValueError(f"the data has {d} rows; m must be between 1 and {d // 2}, got {m}.")
    perm = rng.permutation(d)
    for _ in range(10_000):
        cuts = np.sort(rng.choice(np.arange(2, d), m - 1, replace=False))
        sizes = np.diff(np.concatenate([[0], cuts, [d]]))
        if sizes.min() > min_client_frac * d / m:
            break
    else:
        raise ValueError(f"no split into {m} clients with every d_i > {min_client_frac}·d/m was found; "
                         f"lower min_client_frac.")
    return perm, np.concatenate([[0], cuts, [d]])


def qot_instance(seed: int, m: int = 128, min_client_frac: float = 0.025) -> list[tuple[np.ndarray, np.ndarray]]:
    """qot (8992×1024) split into m clients (spec §5.2): unit-norm columns, labels in {0, 1}; rows shuffled and cut
    into random contiguous blocks (:func:`_contiguous_split`)."""
    a, b = _qot_scaled()
    return _contiguous_split(np.random.default_rng(seed), a, b, m, min_client_frac)


def qot_sizes(seed: int, m: int = 128, min_client_frac: float = 0.025) -> np.ndarray:
    """The client sizes d_i of :func:`qot_instance` with the same arguments, without copying the rows."""
    return np.diff(_split(np.random.default_rng(seed), _qot_scaled()[0].shape[0], m, min_client_frac)[1])


def sct_standin_instance(seed: int, m: int = 128, d: int = 200_000, n: int = 200, positives: float = 0.1,
                         min_client_frac: float = 0.025) -> list[tuple[np.ndarray, np.ndarray]]:
    """A synthetic *stand-in* for sct (decision D21; the Santander data is not available): A ~ N(0, 1)^{d×n};
    b = 1 for the top ``positives`` fraction of ⟨a_j, w⟩ + logistic noise (w ~ N(0, I/n)); unit-norm columns;
    split like qot. Never to be compared with the paper's sct numbers."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((d, n))
    score = a @ (rng.standard_normal(n) / np.sqrt(n)) + rng.logistic(size=d)
    b = (score > np.quantile(score, 1.0 - positives)).astype(np.float64)
    a /= np.linalg.norm(a, axis=0)
    return _contiguous_split(rng, a, b, m, min_client_frac)


def _client_nbytes(data) -> int:
    """Bytes of one client's rows: an equal share of all."""
    return tree.nbytes(data) // max(data.num_clients, 1)


@flax.struct.dataclass
class SizeClass:
    """The clients of one size class: ``train``, their rows padded to one count (a stacked :class:`ClientData`); no
    test split. What a group's :class:`~fljax.engine.context.RoundContext` holds as ``data``."""

    train: ClientData
    test = None
    # what the engine reads of client data (fljax.engine.protocol.SimulationData) beyond num_clients: every client
    # trains, no server data, no groups of its own, rows (padded to one count) rather than labelled examples
    server = None
    group_sizes = None
    stacked = True
    labelled = False

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def num_train_clients(self) -> int:
        return self.num_clients

    def client_nbytes(self) -> int:
        return _client_nbytes(self)


@flax.struct.dataclass
class ClientBlocks:
    """Clients in size classes: ``blocks`` is a tuple of :class:`ClientData`, in client order; ``order [m]`` gives
    the instance's client index at every position; ``lam_seconds`` the host time spent on the exact λ_max(B_i)
    (FedGiA adds it to its precomputation time); ``name`` the data set's (:mod:`fljax.problems.sources`). Built by
    :func:`pack_trials` with a leading trial axis on every leaf; :meth:`trials` gives one trial each (the data an
    algorithm of :mod:`fljax.algorithms.regression` runs on).

    One trial is client data in groups of their own shapes (:class:`fljax.engine.protocol.SimulationData`): each size
    class is a group of the simulation's population (:attr:`group_sizes`), whose context holds :meth:`group` (a
    :class:`SizeClass`)."""

    blocks: tuple
    order: np.ndarray
    lam_seconds: np.ndarray
    name: str | None = flax.struct.field(pytree_node=False, default=None)  # the data set (a config's data.dataset)

    # what the engine reads of client data (fljax.engine.protocol.SimulationData) beyond num_clients and group_sizes:
    # every client trains, no server data, rows in size classes of their own shapes rather than labelled examples
    server = None
    stacked = False
    labelled = False

    @property
    def num_clients(self) -> int:
        return sum(blk.num_clients for blk in self.blocks)

    @property
    def num_train_clients(self) -> int:
        return self.num_clients

    def client_nbytes(self) -> int:
        return _client_nbytes(self)

    @property
    def dim(self) -> int:
        return self.blocks[0].dim

    @property
    def num_trials(self) -> int:
        return self.order.shape[0]

    @property
    def group_sizes(self) -> tuple[tuple[str, int], ...]:
        """One client group per size class (consecutive clients, named by their padded row count)."""
        return tuple((f"class {k} ({blk.rows} rows)", blk.num_clients) for k, blk in enumerate(self.blocks))

    def group(self, g: int) -> SizeClass:
        return SizeClass(train=self.blocks[g])

    def summary(self) -> str:
        """One line: clients, features, rows and size classes (one trial)."""
        rows = int(sum(np.sum(np.asarray(blk.d)) for blk in self.blocks))
        classes = ", ".join(f"{blk.num_clients}×{blk.rows}" for blk in self.blocks)
        return (f"{self.num_clients} clients, n = {self.dim} features, d = {rows} rows, padded per size class "
                f"(clients×rows: {classes})")

    def facts(self) -> dict:
        """What a run's summary records about its data: the host seconds of the exact λ_max (one trial)."""
        return {"lambda_seconds": float(np.sum(self.lam_seconds))}

    def trial(self, t) -> "ClientBlocks":
        """Trials ``t`` (an int keeps the trial axis with length 1; a slice or index array selects several)."""
        import jax

        idx = slice(t, t + 1) if isinstance(t, (int, np.integer)) else t
        return jax.tree.map(lambda x: x[idx], self)

    def trials(self) -> list["ClientBlocks"]:
        """Every trial on its own, the trial axis removed: the data of one run (``Simulation``), or of the lanes of
        :class:`fljax.engine.Lanes` (``datas=``)."""
        import jax

        return [jax.tree.map(lambda x: x[t], self) for t in range(self.num_trials)]


def size_blocks(sizes: np.ndarray, blocks: int = 1, row_multiple: int = 8) -> list[tuple[int, int, int]]:
    """Split the client axis into at most ``blocks`` size classes: ``[(lo, hi, rows), ...]``.

    ``sizes [T, m]`` are every trial's client sizes. With one block, rows = the largest size over all trials
    rounded up to ``row_multiple``. With several, clients are ranked by size within each trial and contiguous rank
    ranges [lo, hi) form the blocks; the boundaries minimise the total padded rows Σ (hi − lo)·rows, with rows the
    rounded-up largest size in that rank range over all trials (dynamic programming over the sorted ranks).
    """
    sizes = np.atleast_2d(np.asarray(sizes))
    m = sizes.shape[1]
    up = lambda v: int(-(-int(v) // row_multiple) * row_multiple)
    if blocks <= 1:
        return [(0, m, up(sizes.max()))]
    peak = np.sort(sizes, axis=1).max(axis=0)          # largest size at every rank over the trials
    rows = np.array([up(v) for v in peak])
    blocks = min(blocks, m)
    cost = np.full((blocks + 1, m + 1), np.inf)
    cost[0, 0] = 0.0
    cut = np.zeros((blocks + 1, m + 1), dtype=int)
    for k in range(1, blocks + 1):
        for hi in range(1, m + 1):
            options = [cost[k - 1, lo] + (hi - lo) * rows[hi - 1] for lo in range(hi)]
            cut[k, hi] = int(np.argmin(options))
            cost[k, hi] = options[cut[k, hi]]
    k = int(np.argmin(cost[1:, m])) + 1
    bounds, hi = [], m
    while k > 0:
        lo = cut[k, hi]
        bounds.append((int(lo), int(hi), int(rows[hi - 1])))
        hi, k = lo, k - 1
    return bounds[::-1]


def pack_trials(instances: list[list[tuple[np.ndarray, np.ndarray]]], blocks: int = 1,
                row_multiple: int = 8, layout: list[tuple[int, int, int]] | None = None,
                gram: bool = False) -> ClientBlocks:
    """Stack trials' instances (each a list of m ``(A_i, b_i)``) into padded NumPy float64 blocks with a leading
    trial axis. ``blocks > 1`` orders each trial's clients by size (stable) and uses :func:`size_blocks`; a
    ``layout`` computed beforehand by :func:`size_blocks` (from more trials' sizes) gives several packs the same
    shapes. ``gram=True`` adds the least-squares statistics B_i, A_iᵀb_i, ‖b_i‖² (worth it when rows > n)."""
    if not instances:
        raise ValueError("pack_trials needs at least one instance.")
    m, n = len(instances[0]), instances[0][0][0].shape[1]
    for inst in instances:
        if len(inst) != m or any(a.shape[1] != n or a.shape[0] != len(b) for a, b in inst):
            raise ValueError(f"every instance must have {m} clients with (d_i × {n}) rows and d_i labels.")
    sizes = np.array([[len(b) for _, b in inst] for inst in instances])
    if sizes.min() < 1:
        raise ValueError("every client needs at least one row.")
    layout = size_blocks(sizes, blocks, row_multiple) if layout is None else layout
    order = (np.argsort(sizes, axis=1, kind="stable") if len(layout) > 1
             else np.broadcast_to(np.arange(m), sizes.shape).copy())
    ranked = np.take_along_axis(sizes, order, axis=1)
    if layout[0][0] != 0 or layout[-1][1] != m or any(ranked[:, lo:hi].max() > rows for lo, hi, rows in layout):
        raise ValueError(f"the block layout {layout} does not fit these instances' client sizes.")
    lam = np.zeros(sizes.shape)
    seconds = np.zeros(len(instances))
    # one BLAS thread: these small eigenproblems run up to 60× slower with OpenBLAS's thread pool on a busy machine
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        for t, inst in enumerate(instances):
            start = time.perf_counter()
            lam[t] = [lambda_max_host(a) for a, _ in inst]
            seconds[t] = time.perf_counter() - start
    out = []
    for lo, hi, rows in layout:
        t_count, c_count = len(instances), hi - lo
        a = np.zeros((t_count, c_count, rows, n))
        b = np.zeros((t_count, c_count, rows))
        mask = np.zeros((t_count, c_count, rows))
        d = np.zeros((t_count, c_count))
        for t, inst in enumerate(instances):
            for j, i in enumerate(order[t, lo:hi]):
                ai, bi = inst[i]
                a[t, j, :len(bi)], b[t, j, :len(bi)], mask[t, j, :len(bi)], d[t, j] = ai, bi, 1.0, len(bi)
        stats = dict(gram=np.einsum("tcrn,tcrk->tcnk", a, a), atb=np.einsum("tcrn,tcr->tcn", a, b),
                     btb=np.einsum("tcr,tcr->tc", b, b)) if gram else {}
        out.append(ClientData(A=a, b=b, mask=mask, d=d, lam=np.take_along_axis(lam, order[:, lo:hi], axis=1),
                              **stats))
    return ClientBlocks(blocks=tuple(out), order=order, lam_seconds=seconds)
