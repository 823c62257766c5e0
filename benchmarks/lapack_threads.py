"""LAPACK inside XLA:CPU with a single-threaded and a multi-threaded OpenBLAS.

Times a jitted 64×64 SVD with singular vectors (FedSLR's SVT does one per weight matrix) in fresh processes with
``OPENBLAS_NUM_THREADS=1`` (fljax's default) and with as many threads as cores, first on an idle machine, then with
one busy process per core (as when tests or runs share the machine). Median of 50 calls.

    python benchmarks/lapack_threads.py
"""
from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import time, numpy as np, jax, jax.numpy as jnp
f = jax.jit(lambda m: jnp.linalg.svd(m, full_matrices=False))
a = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64), np.float32))
jax.block_until_ready(f(a))
t = []
for _ in range(50):
    t0 = time.perf_counter(); jax.block_until_ready(f(a)); t.append(time.perf_counter() - t0)
print(1e3 * float(np.median(t)))
"""


def measure(threads: str) -> float:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    cores = os.cpu_count() or 1
    for busy in (0, cores):
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            for threads in ("1", str(cores)):
                print(f"{busy} busy process(es), OPENBLAS_NUM_THREADS={threads}: 64x64 SVD {measure(threads):.3f} ms")
        finally:
            for b in burners:
                b.kill()


if __name__ == "__main__":
    main()
