"""The seconds JAX spends turning Python into executables in this thread — tracing to a jaxpr, lowering to MLIR,
XLA compilation — summed from ``jax.monitoring``'s duration events.

:class:`~fljax.engine.Simulation` times its own ahead-of-time compilations directly; runs that are not one
compiled program (the loop executor's per-client jitted calls, compiled on first use, and the eager server step
between them) are timed with this clock, so that every executor reports its compile time. A nested ``jit`` is
traced inside its caller's trace and counted once.
"""
from __future__ import annotations

import threading

from jax import monitoring

__all__ = ["compile_seconds", "EVENTS"]

EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "/jax/core/compile/backend_compile_duration")

_local = threading.local()
_lock = threading.Lock()
_registered = False


def _listener(event: str, seconds: float, **kwargs) -> None:
    if event in EVENTS:
        _local.total = getattr(_local, "total", 0.0) + seconds


def compile_seconds() -> float:
    """The total so far in the calling thread (differences of two readings time a stretch of code)."""
    global _registered
    with _lock:
        if not _registered:
            monitoring.register_event_duration_secs_listener(_listener)
            _registered = True
    return getattr(_local, "total", 0.0)
