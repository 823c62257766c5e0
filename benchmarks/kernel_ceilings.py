"""How fast XLA:CPU runs, each alone, the products and convolutions one client-step of the throughput workloads is
made of: the ceiling the engine's rounds can reach, as a fraction of this machine's float32 matmul peak.

A client-step (batch B = 20) of a dense layer with input width k and output width n is three products: the forward
``x·W`` (B×k by k×n), the input gradient ``δ·Wᵀ`` (B×n by n×k; not needed for the first layer) and the weight
gradient ``xᵀ·δ`` (k×B by B×n), whose inner dimension is the batch. Convolutions likewise: forward, and the kernel
gradient (the input's patches contracted with the output gradient over batch and space). Each kernel runs
``--iters`` times inside one compiled loop on cache-resident operands (its result added to an accumulator, as
SGD adds a gradient to the weights; the input is perturbed by the loop index so that nothing is hoisted), for as
many clients side by side as the workload's executor runs at once (``vmap``: all; ``auto``'s chunks: 3 for the MLP;
the CNN runs one client at a time). Medians of ``--repeats``. Writes
``benchmarks/results/kernel_ceilings.{json,md}``.

    python benchmarks/kernel_ceilings.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import matmul_peak, median_seconds  # noqa: E402  (benchmarks/machine.py)

B = 20
# (workload, kernel, clients side by side, (m, k, n)) for products; convolutions as (input NHWC, kernel HWIO, padding)
PRODUCTS = [
    ("logistic regression 60→10, 1,000 clients", "forward x·W", 1000, (B, 60, 10)),
    ("logistic regression 60→10, 1,000 clients", "weight gradient xᵀ·δ", 1000, (60, B, 10)),
    ("MLP 784-200-200-10, chunks of 3", "layer 1 forward", 3, (B, 784, 200)),
    ("MLP 784-200-200-10, chunks of 3", "layer 1 weight gradient", 3, (784, B, 200)),
    ("MLP 784-200-200-10, chunks of 3", "layer 2 forward / input gradient", 3, (B, 200, 200)),
    ("MLP 784-200-200-10, chunks of 3", "layer 2 weight gradient", 3, (200, B, 200)),
]
CONVS = [
    ("CNN1 (5×5, 1→6, 6→16), one client", "conv 1 forward", (B, 28, 28, 1), (5, 5, 1, 6), "SAME"),
    ("CNN1 (5×5, 1→6, 6→16), one client", "conv 2 forward", (B, 14, 14, 6), (5, 5, 6, 16), "VALID"),
    ("CNN1 (5×5, 1→6, 6→16), one client", "conv 2 input gradient", (B, 14, 14, 6), (5, 5, 6, 16), "VALID"),
    ("CNN1 (5×5, 1→6, 6→16), one client", "conv 2 kernel gradient", (B, 14, 14, 6), (5, 5, 6, 16), "VALID"),
    ("CNN 5×5 16-32 SAME (the issue's), one client", "conv 1 forward", (B, 28, 28, 1), (5, 5, 1, 16), "SAME"),
    ("CNN 5×5 16-32 SAME (the issue's), one client", "conv 2 forward", (B, 14, 14, 16), (5, 5, 16, 32), "SAME"),
    ("CNN 5×5 16-32 SAME (the issue's), one client", "conv 2 kernel gradient", (B, 14, 14, 16), (5, 5, 16, 32),
     "SAME"),
]


def product_rate(clients: int, m: int, k: int, n: int, iters: int, repeats: int) -> float:
    """FLOP/s of ``clients`` side-by-side (m×k)·(k×n) products."""
    a = jax.random.normal(jax.random.PRNGKey(0), (clients, m, k))
    b = jax.random.normal(jax.random.PRNGKey(1), (clients, k, n))
    f = jax.jit(lambda a, b: jax.lax.fori_loop(
        0, iters, lambda i, acc: acc + jnp.matmul(a * (1 + i * 1e-9), b), jnp.zeros((clients, m, n))))
    return 2 * clients * m * k * n * iters / median_seconds(lambda: f(a, b), repeats)


def conv_rate(kernel: str, x_shape, w_shape, padding: str, iters: int, repeats: int) -> float:
    """FLOP/s of one client's convolution: forward, input gradient or kernel gradient (each the forward's FLOPs)."""
    x = jax.random.normal(jax.random.PRNGKey(0), x_shape)
    w = jax.random.normal(jax.random.PRNGKey(1), w_shape)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))

    y = conv(x, w)
    flops = 2 * np.prod(y.shape) * np.prod(w_shape[:3])
    g = jax.random.normal(jax.random.PRNGKey(2), y.shape)
    if kernel.endswith("kernel gradient"):
        grad_w = jax.grad(lambda w, x: jnp.vdot(conv(x, w), g))
        f = jax.jit(lambda x, w: jax.lax.fori_loop(0, iters, lambda i, acc: acc + grad_w(w, x * (1 + i * 1e-9)),
                                                   jnp.zeros(w_shape)))
    elif kernel.endswith("input gradient"):
        grad_x = jax.grad(lambda x, w: jnp.vdot(conv(x, w), g))
        f = jax.jit(lambda x, w: jax.lax.fori_loop(0, iters, lambda i, acc: acc + grad_x(x, w * (1 + i * 1e-9)),
                                                   jnp.zeros(x_shape)))
    else:
        f = jax.jit(lambda x, w: jax.lax.fori_loop(0, iters, lambda i, acc: acc + conv(x * (1 + i * 1e-9), w),
                                                   jnp.zeros(y.shape)))
    return flops * iters / median_seconds(lambda: f(x, w), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    from fljax.runner.files import write_json, write_text

    peak = matmul_peak()
    rows = []
    for workload, kernel, clients, (m, k, n) in PRODUCTS:
        rate = product_rate(clients, m, k, n, args.iters, args.repeats)
        rows.append({"workload": workload, "kernel": kernel, "shape": f"{clients} × ({m}×{k})·({k}×{n})",
                     "flops_per_s": rate})
    for workload, kernel, x_shape, w_shape, padding in CONVS:
        rate = conv_rate(kernel, x_shape, w_shape, padding, args.iters, args.repeats)
        rows.append({"workload": workload, "kernel": kernel,
                     "shape": f"input {'×'.join(map(str, x_shape))}, kernel {'×'.join(map(str, w_shape))} {padding}",
                     "flops_per_s": rate})
    command = " ".join(["python benchmarks/kernel_ceilings.py"] + sys.argv[1:])
    lines = [f"Each kernel alone, {args.iters} iterations in one compiled loop, median of {args.repeats}; jax "
             f"{jax.__version__}, {os.cpu_count()} cores, matmul peak (2048² product) {peak / 1e9:.1f} GFLOP/s "
             f"measured in this run. Command: `{command}`.", "",
             "| workload | kernel | shape | GFLOP/s | % of peak |", "|---|---|---|---|---|"]
    for r in rows:
        r["peak_fraction"] = r["flops_per_s"] / peak
        lines.append(f"| {r['workload']} | {r['kernel']} | {r['shape']} | {r['flops_per_s'] / 1e9:.1f} | "
                     f"{100 * r['peak_fraction']:.0f} |")
    md = "\n".join(lines) + "\n"
    write_json(os.path.join(args.out, "kernel_ceilings.json"),
               {"command": command, "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
                "matmul_peak_flops": peak, "rows": rows})
    write_text(os.path.join(args.out, "kernel_ceilings.md"), md)
    print(md)


if __name__ == "__main__":
    main()
