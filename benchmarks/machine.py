"""This machine's limits, measured in the process that reports against them: the float32 matmul peak (FLOP/s) and
the memory bandwidth (bytes/s). Shared by the benchmark scripts."""
from __future__ import annotations

import time

import numpy as np


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median wall seconds of each zero-argument callable (its result waited for), after one warm-up call of each
    (compiles). The callables are timed in turn within every repeat, so load changes on a shared machine hit them
    alike."""
    import jax

    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def median_seconds(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    return interleaved_medians({"fn": fn}, repeats)["fn"]


def time_rounds(sim, state, rounds: int, repeats: int):
    """A simulation's blocks of ``rounds`` rounds timed: one warm-up block (it compiles), then ``repeats`` blocks.
    Returns ``(state, warm-up seconds, median seconds per round)``."""
    import jax

    t0 = time.perf_counter()
    state, _ = sim.run_rounds(state, rounds)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, _ = sim.run_rounds(state, rounds)
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t0) / rounds)
    return state, first, float(np.median(times))


def matmul_peak(n: int = 2048, repeats: int = 7) -> float:
    """Measured float32 matmul FLOP/s of this machine: an n×n by n×n product (median of ``repeats``)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return 2 * n ** 3 / median_seconds(lambda: f(a), repeats)


def memory_bandwidth(mbytes: int = 512, repeats: int = 7) -> float:
    """Measured main-memory bandwidth in bytes/s: a jitted ``y = 2·x`` over ``mbytes`` MB of float32, far larger
    than the caches, counted as one read and one write of the array (median of ``repeats``)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((mbytes * 2 ** 20 // 4,), jnp.float32)
    f = jax.jit(lambda v: 2 * v)
    return 2 * x.nbytes / median_seconds(lambda: f(x), repeats)
