"""One BLAS thread while the engine's programs run: a workaround for XLA:CPU, applied by the engine.

XLA:CPU's LAPACK kernels (Cholesky, triangular solves, eigensolvers inside a program: FedGiA's curvature
factorisations, FedSLR's SVT) call SciPy's OpenBLAS. With OpenBLAS's own thread pool, concurrent calls from XLA's
threads deadlocked (FedGiA's Woodbury solves of qot's size classes on 2 cores), and on a busy machine a 64×64 SVD took
92 ms instead of 0.28 ms (benchmarks/lapack_threads.py). ``import fljax`` therefore sets OPENBLAS_NUM_THREADS=1
unless the user set it. When the user did set it to something else, :func:`call` limits BLAS to one thread while a
program runs (it then waits for the program's outputs, since dispatch is asynchronous) and restores the user's
setting afterwards; otherwise it calls the program directly.

Cost: entering and leaving the limit (``threadpoolctl`` enumerating the loaded libraries) takes about a millisecond
per call (measured in the README's performance section), once per compiled call, i.e. per block of rounds or per
stopping-rule run.
"""
from __future__ import annotations

import os
from typing import Callable

import jax
import threadpoolctl

__all__ = ["needed", "call"]


def needed() -> bool:
    """Whether OpenBLAS may run more than one thread (the user set OPENBLAS_NUM_THREADS to other than 1)."""
    return os.environ.get("OPENBLAS_NUM_THREADS") != "1"


def call(fn: Callable, *args):
    """``fn(*args)`` with BLAS limited to one thread while it runs, when :func:`needed` (module docstring)."""
    if not needed():
        return fn(*args)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        return jax.block_until_ready(fn(*args))
