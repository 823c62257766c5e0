"""Programs compiled side by side: XLA's compilation of one program while the next is traced, another compiles and
the rounds of an earlier one run.

Compiling a lowered program (``jax.stages.Lowered.compile``) runs in XLA without holding Python's GIL, so programs
compiled in threads run on all cores at once. :class:`~fljax.engine.Simulation` traces and lowers each program in
the thread that asks for it (tracing is Python) and hands the XLA compilation to this pool
(:meth:`~fljax.engine.Simulation.request`); the program's first call waits for it. The run layer asks for a
comparison's, sweep's or study's next programs before it runs the current one (:mod:`fljax.runner.schedule`), so
their compilations overlap with each other and with the rounds.

``FLJAX_COMPILE_WORKERS`` sets the number of compilations at once (default: the machine's cores, at most
:data:`MAX_WORKERS`; 1: one after another, still beside the rounds). Measured in ``benchmarks/first_run.py``
(docs/performance.md, Start-up).
"""
from __future__ import annotations

import concurrent.futures
import os
import threading

__all__ = ["workers", "submit", "MAX_WORKERS"]

MAX_WORKERS = 4  # compilations at once: each holds its program's compiler memory while it runs

_lock = threading.Lock()
_pool: dict = {}


def workers() -> int:
    """Compilations at once: ``FLJAX_COMPILE_WORKERS`` when set to a positive integer, else the cores (at most
    :data:`MAX_WORKERS`)."""
    value = os.environ.get("FLJAX_COMPILE_WORKERS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def submit(fn, *args) -> concurrent.futures.Future:
    """``fn(*args)`` in the pool (started at the first call). A future no longer needed is cancelled by its owner
    (:meth:`~fljax.engine.Simulation.cancel_pending`): at exit the pool finishes the compilations it has begun and
    those still queued."""
    with _lock:
        if "pool" not in _pool:
            _pool["pool"] = concurrent.futures.ThreadPoolExecutor(workers(), thread_name_prefix="fljax-compile")
        return _pool["pool"].submit(fn, *args)
