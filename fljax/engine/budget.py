"""Memory planning: every compiled program is sized against the device's memory before it is compiled.

A compiled program holds its arguments (the data, the state), its outputs and its *temporaries*: everything it
computes on the way. Mapping a function over C clients at once (``vmap``) multiplies that function's temporaries by
C: evaluating all 3,400 clients of FedJAX's EMNIST workload through a CNN in one ``vmap`` asked XLA for 105 GiB. So
each program is traced inside a :func:`scope` that states its budget for temporaries, and every client map an
executor runs inside it (:meth:`fljax.engine.executors.Executor.map_clients`) asks :func:`clients_that_fit` how many
clients may run side by side:

    c = ⌊ budget / b ⌋,   b = peak bytes of ONE client's temporaries (:func:`per_client_bytes`)

where b is read from the client function's traced program (its jaxpr, for one client's shapes) by a liveness count
(:func:`peak_bytes`: the largest sum of the intermediate values alive at once, loop bodies counted once, chains of
elementwise operations taken as fused as XLA fuses them; fusions into products and reductions and in-place updates
are not). It is an estimate, not a bound: for the evaluation of FedJAX's EMNIST-shaped CNN it was 4.4× XLA:CPU's
count, and 0.495× XLA:GPU's on an H200 (jax 0.11.2; the GPU's program holds what the jaxpr does not show, such as
convolution workspaces; docs/performance.md). A map over more than c clients runs as ``lax.map`` over chunks of c (vmapped inside), whatever
the executor: the cohort's executor choice stays the cohort's, and evaluation or initialisation over the whole
population (:meth:`fljax.engine.context.RoundContext.map_init`) is another program, chunked on its own. When not
even one client fits (c = 0) the run stops with one line naming the knob, before anything is compiled
(:class:`MemoryPlanError`).

The estimate is then checked against XLA's own count, which is what catches an estimate that is too low:
:class:`~fljax.engine.Simulation` compiles the program, reads ``compiled.memory_analysis().temp_size_in_bytes`` and,
when that exceeds the budget, traces the program again with the budget scaled by budget / XLA's count (chunks about
that much smaller: half as large at the H200's 0.495×) and compiles it once more (``Simulation.memory_plans`` records
both counts per program). Once: temporaries outside the client map, which do not shrink with its chunk, can leave
the second count above the budget too, and a budget scaled below one client's estimate is refused
(:class:`MemoryPlanError`).

On the CPU the budget bounds what the process holds, not only XLA's count: XLA:CPU's runtime keeps buffers of its
own beside the temporaries its buffer assignment counts (the dots' and convolutions' operands packed by its kernel
libraries, scratch). Measured for the EMNIST-shaped evaluation of ``cnn1_s`` (``benchmarks/host_memory.py``, this
2-core CPU, jax 0.10.2), each client run side by side added 2.0–2.4× its estimate to the resident memory in both
convolution forms (33.1–39.4 MiB against an estimate of 16.2 MiB with ``patches``, while XLA counted 3.6 MiB): with
the 4 GiB cap, 252 clients side by side held 11.8 GB. So on the CPU a client counts :data:`CPU_RESIDENT` (2.5) times its
estimate, and the resident memory of a program's client maps stays within its budget.

The budget (:func:`default_budget`): a fraction of the device's memory (:func:`device_memory`) after the program's
arguments and outputs, ``FRACTION`` of it on accelerators and ``CPU_FRACTION`` on the CPU (the host's memory is
shared with everything else), and at most ``CAP`` bytes; or the user's ``memory_budget`` (GiB). Programs vmapped over
L lanes get 1/L of it.

Why a cap: chunks of a few thousand samples already keep an accelerator busy, so a larger chunk is not faster, while
the estimate's error grows with it and XLA needs room of its own (convolution workspaces, layouts). Measured on one
NVIDIA H200 (jax 0.11.2, ``bash benchmarks/gpu.sh``, 2026-11-27): with 75 % of the card as the budget, evaluating the
EMNIST-shaped population asked XLA for 106.8 GiB, more than the allocator's limit, and the run stalled
(benchmarks/results/gpu.md, part 1).
"""
from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np

from fljax.data.memory import host_memory, size_text, sizes_apart
from fljax.errors import ConfigError

__all__ = ["MemoryPlanError", "scope", "divided", "current", "clients_that_fit", "per_client_bytes", "peak_bytes",
           "device_memory", "default_budget", "out_of_memory", "FRACTION", "CPU_FRACTION", "CAP"]

FRACTION = 0.75  # of an accelerator's memory left after the program's arguments and outputs
CPU_FRACTION = 0.5  # of the host's memory (shared with the OS and other processes)
CAP = 4 * 2 ** 30  # bytes of temporaries a program gets by default at most (module docstring: why)
CPU_RESIDENT = 2.5  # resident bytes per estimated byte of a client run side by side on the CPU (module docstring)


class MemoryPlanError(ConfigError):
    """A program cannot fit its memory budget even one client at a time."""


class _Scope(threading.local):
    def __init__(self):
        self.stack: list[tuple] = []


_SCOPE = _Scope()


@contextlib.contextmanager
def scope(budget_bytes: float | None, program: str = "program", source: str = "memory_budget"):
    """Plan the client maps traced inside against ``budget_bytes`` of temporaries (None: no planning) for the
    program called ``program``; ``source`` says where the budget came from (for the error message). Yields the
    list of the maps' plans (clients, per-client bytes, clients side by side), filled while tracing."""
    maps: list[dict] = []
    _SCOPE.stack.append((budget_bytes, program, source, maps))
    try:
        yield maps
    finally:
        _SCOPE.stack.pop()


@contextlib.contextmanager
def divided(k: int, why: str):
    """The current scope's budget divided by ``k`` inside (e.g. per device of a sharded map); no-op outside one."""
    plan = current()
    if plan is None or k <= 1:
        yield
        return
    _SCOPE.stack.append((plan[0] / k, plan[1], f"{plan[2]}, {why}", plan[3]))
    try:
        yield
    finally:
        _SCOPE.stack.pop()


def current():
    """(budget bytes, program, source, maps) of the innermost :func:`scope`, or None outside one (or with no budget)."""
    if not _SCOPE.stack or _SCOPE.stack[-1][0] is None:
        return None
    return _SCOPE.stack[-1]


# ---------------------------------------------------------------------------------------------- the estimate
def _nbytes(aval) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    dtype = aval.dtype
    itemsize = 8 if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) else np.dtype(dtype).itemsize
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def _subjaxprs(eqn):
    """The jaxprs inside an equation's parameters (loop bodies, branches, called functions)."""
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


# primitives that call one jaxpr once (their equations are inlined into the caller's for the count)
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "remat": "jaxpr", "checkpoint": "jaxpr"}


def _flat(jaxpr, env: dict) -> list[tuple]:
    """The equations of ``jaxpr`` with called functions inlined: (primitive name, input vars, output vars, nested
    jaxprs) with variables renamed through ``env`` (a called jaxpr's variables to its caller's)."""
    Var = jax.extend.core.Var
    name = lambda v: env.get(v, v) if isinstance(v, Var) else None  # noqa: E731
    out = []
    for eqn in jaxpr.eqns:
        ins = [name(v) for v in eqn.invars]
        sub = eqn.params.get(CALLS.get(eqn.primitive.name, ""), None)
        sub = getattr(sub, "jaxpr", sub)
        if isinstance(sub, jax.extend.core.Jaxpr) and len(sub.invars) == len(ins):
            inner = dict(zip(sub.invars, ins))
            inner.update({v: None for v in sub.constvars})
            for iv, ov in zip(sub.outvars, eqn.outvars):
                if isinstance(iv, Var) and iv in inner:  # an input passed through: the caller's name for it
                    env[ov] = inner[iv]
                elif isinstance(iv, Var):
                    inner[iv] = ov
            out += _flat(sub, inner)
        else:
            out.append((eqn.primitive.name, ins, [name(v) for v in eqn.outvars], list(_subjaxprs(eqn))))
    return out


# Elementwise and layout operations: XLA fuses a chain of them into the one kernel that consumes it, so their
# results are never stored (counted here when they feed anything else, or several consumers).
FUSIBLE = frozenset("""abs add and broadcast_in_dim cbrt ceil clamp convert_element_type copy copy_p cos cosh div eq erf
    erf_inv exp exp2 expand_dims expm1 floor ge gt imag integer_pow is_finite le log log1p logistic lt max min mul ne
    neg nextafter not or pow real reduce_precision rem reshape round rsqrt select_n shift_left shift_right_arithmetic
    shift_right_logical sign sin sinh sqrt square squeeze stop_gradient sub tan tanh xor""".split())


def peak_bytes(jaxpr) -> int:
    """The largest number of bytes of intermediate values alive at once while ``jaxpr`` runs in order: each
    equation's stored outputs are allocated, and a value is freed after its last use; a loop's or branch's body adds
    its own peak while it runs (counted once: iterations reuse their buffers). The inputs are not counted (they are
    the program's, or the caller's); its outputs are. An elementwise or layout operation (:data:`FUSIBLE`) whose
    result feeds exactly one other such operation is taken as fused into it (not stored), as XLA does; the
    remaining differences from XLA's buffer assignment (fusions into products and reductions, in-place updates)
    make this err high on CPU, 4.4× XLA:CPU's count for a CNN's evaluation (tests/test_engine_memory.py); XLA:GPU's
    count for the EMNIST-shaped evaluation was about twice this estimate (module docstring: the re-plan covers it)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    Var = jax.extend.core.Var
    eqns = _flat(jaxpr, {})
    last: dict = {}
    consumers: dict = {}
    for i, (prim, ins, _, _) in enumerate(eqns):
        for v in set(x for x in ins if isinstance(x, Var)):
            last[v] = i
            consumers.setdefault(v, []).append(prim)
    for v in jaxpr.outvars:
        if isinstance(v, Var):
            last[v] = len(eqns)
            consumers.setdefault(v, []).append("output")
    live = peak = 0
    owned: dict = {}
    for i, (prim, ins, outs, subs) in enumerate(eqns):
        inner = max((peak_bytes(sub) for sub in subs), default=0)
        fused = prim in FUSIBLE
        out = 0
        for v in outs:
            if not isinstance(v, Var) or (fused and len(consumers.get(v, ())) == 1 and consumers[v][0] in FUSIBLE):
                continue
            b = _nbytes(v.aval)
            out += b
            if last.get(v, i) > i:
                owned[v] = b
        peak = max(peak, live + inner + out)
        live += sum(owned.get(v, 0) for v in outs if isinstance(v, Var))
        for v in set(x for x in ins if isinstance(x, Var)):
            if last.get(v) == i and v in owned:
                live -= owned.pop(v)
    return peak


def _abstract(x, drop_leading: bool):
    shape = tuple(x.shape)
    return jax.ShapeDtypeStruct(shape[1:] if drop_leading else shape, x.dtype)


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


_CACHE: dict = {}


def per_client_bytes(fn, shared, per_client) -> int:
    """Peak bytes of the temporaries of ``fn(shared, one client of per_client)`` (:func:`peak_bytes` of its jaxpr
    traced for one client's shapes; nothing runs). Non-array leaves of ``shared`` stay static, as in the map."""
    leaves, treedef = jax.tree.flatten((shared, per_client))
    n_shared = len(jax.tree.leaves(shared))
    arrays = [i for i, x in enumerate(leaves) if _is_array(x)]
    abstract = [_abstract(leaves[i], drop_leading=i >= n_shared) for i in arrays]
    key = (fn, treedef, tuple((a.shape, str(a.dtype)) for a in abstract),
           tuple(x for i, x in enumerate(leaves) if i not in set(arrays)))
    try:
        return _CACHE[key]
    except (KeyError, TypeError):  # TypeError: an unhashable fn or static leaf (not cached)
        pass

    def one(*array_leaves):
        full = list(leaves)
        for i, a in zip(arrays, array_leaves):
            full[i] = a
        s, pc = jax.tree.unflatten(treedef, full)
        return fn(s, pc)

    out = peak_bytes(jax.make_jaxpr(one)(*abstract))
    if len(_CACHE) >= 512:  # bounded: a long session (a sweep) traces many programs
        _CACHE.clear()
    try:
        _CACHE[key] = out
    except TypeError:
        pass
    return out


def clients_that_fit(fn, shared, per_client, n: int) -> int | None:
    """How many of the ``n`` clients ``fn`` may run side by side under the current :func:`scope` (None: no
    planning, all of them): ⌊budget / r⌋, r = one client's estimate (:func:`per_client_bytes`), times
    :data:`CPU_RESIDENT` on the CPU; raises :class:`MemoryPlanError` when not even one fits."""
    plan = current()
    if plan is None or n <= 1:
        return None
    budget, program, source, maps = plan
    b = per_client_bytes(fn, shared, per_client)
    resident = b * (CPU_RESIDENT if jax.default_backend() == "cpu" else 1.0)  # what one client holds (docstring)
    fit = int(budget // max(resident, 1))
    maps.append({"clients": n, "per_client_bytes": b, "resident_bytes": resident, "side_by_side": min(n, fit)})
    if fit < 1:
        need, have = sizes_apart(resident, budget)
        raise MemoryPlanError(
            f"the {program} program needs {need} of temporaries for one client, more than its memory budget of "
            f"{have} ({source}): raise memory_budget, or make one client's work smaller (algo.batch_size, the "
            f"model, or the clients' test split).")
    return fit


# ---------------------------------------------------------------------------------------------- the budget
def device_memory() -> tuple[str, int]:
    """(name, bytes) of the memory a run can use: the accelerators' memory (their allocator's limit), or, for the
    CPU, the host's as this process may use it (:func:`fljax.data.memory.host_memory`: the machine's, or less under
    ``ulimit -v`` or a cgroup's memory limit)."""
    devices = jax.local_devices()
    if devices[0].platform != "cpu":
        stats = [d.memory_stats() or {} for d in devices]
        if all("bytes_limit" in s for s in stats):
            return f"{len(devices)} × {devices[0].device_kind}", sum(s["bytes_limit"] for s in stats)
    return host_memory()


_EXHAUSTED = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "YNNPACK operation failed",
              "failed to allocate", "Failed to allocate")


def out_of_memory(e: BaseException) -> str | None:
    """The one line for a run that ran out of memory although its programs were planned (None for any other error):
    a ``MemoryError``, or a runtime error of XLA that says so (``RESOURCE_EXHAUSTED``, an allocation that failed, a CPU
    kernel library that could not allocate its buffers: 'YNNPACK operation failed' under ``ulimit -v``). It names
    the memory the process may use and the knobs."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    if not isinstance(e, MemoryError) and not (isinstance(e, jax.errors.JaxRuntimeError)
                                               and any(word in str(e) for word in _EXHAUSTED)):
        return None
    where, have = device_memory()
    return (f"out of memory while running ({type(e).__name__}: {text}): {size_text(have)} of {where} can be used; "
            f"lower memory_budget (GiB of temporaries per program) or the data's size, or raise the limit")


def default_budget(args) -> tuple[float, str]:
    """(bytes, description) of the temporaries a program with arguments ``args`` may use by default:
    ``FRACTION`` (accelerators) or ``CPU_FRACTION`` (CPU) of the device's memory left after its arguments and as
    many bytes again for its outputs, and at most ``CAP``."""
    where, have = device_memory()
    fraction = CPU_FRACTION if jax.default_backend() == "cpu" else FRACTION
    resident = 2 * sum(_nbytes(x) for x in jax.tree.leaves(args) if _is_array(x))
    share = max(fraction * (have - resident), 0.0)
    return min(share, CAP), (f"default: {fraction:.0%} of the {size_text(have)} of {where} after "
                             f"{size_text(resident)} of arguments and outputs, at most {size_text(CAP)}")
