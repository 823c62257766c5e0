"""Where the time of a vectorised logistic-regression round goes: the engine against bare vmapped loops.

Workload: FedAvg, 1,000 Synthetic(1,1) clients (60 features, 10 classes), every client, 10 local SGD steps of batch
20, lr 0.01, executor ``vmap``. Rows (client-steps/s; medians of ``--repeats`` timed calls, all in one process, the
rows called in turn so that every row sees the same load):

* ``bare, pre-drawn batches``: the smallest hand-written equivalent — 10 vmapped SGD steps on batches drawn before
  the timing, autodiff through optax's softmax cross-entropy; no sampling, masks, aggregation or metrics.
* ``bare, closed-form loss gradient``: the same with the loss as one fused operation whose backward pass is written
  out, ∂ℓ/∂z = softmax(z) − onehot(y) (a ``jax.custom_vjp``; its gradient equals autodiff's).
* ``engine, sampling: replacement``: the engine's round with minibatches drawn uniformly with replacement (one random
  index per sample, as cheap as sampling gets), so its difference to the first row is the engine's own overhead.
* ``engine, default (shuffle)``: the default without-replacement sampling: each client's rows in a fresh random order
  per epoch, which sorts random keys of every epoch a round can reach for every client (:mod:`fljax.data.batching`).
* ``the shuffle alone``: that schedule for every client, timed by itself.

For each it reports the FLOP/s as a fraction of this machine's float32 matmul peak and the traffic of one client-step
(the bytes XLA counts for one SGD step compiled alone, ``throughput.step_cost``) times client-steps/s as a fraction
of the measured memory bandwidth (both measured in the same run, ``benchmarks/machine.py``). Writes
``benchmarks/results/engine_overhead.{json,md}``.

    python benchmarks/engine_overhead.py
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import interleaved_medians, matmul_peak, memory_bandwidth  # noqa: E402  (benchmarks/machine.py)
from throughput import step_cost  # noqa: E402

import fljax.data as D  # noqa: E402
from fljax.algorithms import make_algorithm  # noqa: E402
from fljax.data.batching import BatchPlan  # noqa: E402
from fljax.engine import Simulation  # noqa: E402
from fljax.models import make_model  # noqa: E402

CLIENTS, STEPS, BATCH, LR = 1000, 10, 20, 0.01
ROUNDS = 5  # rounds per timed engine call


@jax.custom_vjp
def closed_form_ce(logits, labels):
    """Per-sample softmax cross-entropy logsumexp(z) − z_y; backward pass softmax(z) − onehot(y)."""
    return jax.nn.logsumexp(logits, -1) - jnp.sum(jnp.where(_onehot(logits, labels), logits, 0), -1)


def _onehot(logits, labels):
    return jnp.arange(logits.shape[-1]) == labels[..., None]


def _ce_fwd(logits, labels):
    top = jnp.max(logits, -1, keepdims=True)
    e = jnp.exp(logits - top)
    s = jnp.sum(e, -1, keepdims=True)
    loss = jnp.log(s[..., 0]) + top[..., 0] - jnp.sum(jnp.where(_onehot(logits, labels), logits, 0), -1)
    return loss, (e / s, labels)


def _ce_bwd(res, g):
    p, labels = res
    return (p - _onehot(p, labels)) * g[..., None], None


closed_form_ce.defvjp(_ce_fwd, _ce_bwd)


def bare_loop(ce):
    """``run(params, x, y)``: vmapped over clients, a scan of SGD steps of mean ``ce`` over pre-drawn batches."""
    def loss(p, xb, yb):
        return jnp.mean(ce(xb @ p[0] + p[1], yb))

    def client(p, xs, ys):
        def step(p, batch):
            return jax.tree.map(lambda a, g: a - LR * g, p, jax.grad(loss)(p, *batch)), None

        return jax.lax.scan(step, p, (xs, ys))[0]

    return jax.jit(jax.vmap(client))


def measure(repeats: int) -> tuple[list[dict], float]:
    """The rows (seconds per round of 1,000 clients, client-steps/s, FLOP/s and bytes/s) and the bytes one
    client-step moves."""
    data = D.make_federated("synthetic", CLIENTS, seed=0, max_samples=200)
    model = make_model("logreg", data.input_shape, data.num_classes)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((CLIENTS, STEPS, BATCH, 60), np.float32))
    y = jnp.asarray(rng.integers(0, 10, (CLIENTS, STEPS, BATCH)))
    params = (jnp.zeros((CLIENTS, 60, 10)), jnp.zeros((CLIENTS, 10)))
    calls = []  # (row, fn, client-steps per call)
    for name, ce in [("bare, pre-drawn batches", optax.softmax_cross_entropy_with_integer_labels),
                     ("bare, closed-form loss gradient", closed_form_ce)]:
        calls.append((name, functools.partial(bare_loop(ce), params, x, y), CLIENTS * STEPS))
    for name, sampling in [("engine, sampling: replacement", "replacement"), ("engine, default (shuffle)", "shuffle")]:
        sim = Simulation(make_algorithm("fedavg", lr=LR, cohort_size=None, local_steps=STEPS, batch_size=BATCH,
                                        sampling=sampling), data, model, executor="vmap", seed=0)
        calls.append((name, functools.partial(sim.run_rounds, sim.init(), ROUNDS), ROUNDS * CLIENTS * STEPS))
    plan, tr = BatchPlan(batch_size=BATCH, steps=STEPS), data.train
    schedule = jax.jit(jax.vmap(lambda k, c: plan.schedule(k, c, tr.n_min, tr.n_max)))
    keys = jax.random.split(jax.random.PRNGKey(0), CLIENTS)
    calls.append(("the shuffle alone (every client's schedule)", functools.partial(schedule, keys, tr.count),
                  CLIENTS * STEPS))
    seconds = interleaved_medians({name: fn for name, fn, _ in calls}, repeats)
    rows = [{"row": name, "seconds": seconds[name] * CLIENTS * STEPS / steps} for name, _, steps in calls]
    flops, moved = step_cost(model, data)
    for r in rows:
        r["client_steps_per_s"] = CLIENTS * STEPS / r["seconds"]
        if "shuffle alone" not in r["row"]:
            r["flops_per_s"], r["bytes_per_s"] = flops * r["client_steps_per_s"], moved * r["client_steps_per_s"]
    return rows, moved


def markdown(rows: list[dict], moved: float, peak: float, bandwidth: float, command: str) -> str:
    base = rows[0]["seconds"]
    lines = [f"FedAvg on logistic regression, {CLIENTS:,} Synthetic(1,1) clients, {STEPS} local steps of batch "
             f"{BATCH}, `vmap`. jax {jax.__version__}, {os.cpu_count()} cores, matmul peak {peak / 1e9:.1f} GFLOP/s, "
             f"memory bandwidth {bandwidth / 1e9:.1f} GB/s (both measured in this run). One client-step (forward, "
             f"backward and update on a batch) moves {moved:,.0f} bytes by XLA's count of its operations' inputs and "
             f"outputs. Command: `{command}`.", "",
             "| row | client-steps/s | ms per round | vs bare (time) | % of matmul peak | % of memory bandwidth |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        f, b = r.get("flops_per_s"), r.get("bytes_per_s")
        peak_pct = "-" if f is None else f"{100 * f / peak:.1f}"
        bw_pct = "-" if b is None else f"{100 * b / bandwidth:.0f}"
        lines.append(f"| {r['row']} | {r['client_steps_per_s']:,.0f} | {1e3 * r['seconds']:.1f} | "
                     f"{100 * (r['seconds'] / base - 1):+.0f} % | {peak_pct} | {bw_pct} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    from fljax.runner.files import write_json, write_text

    peak, bandwidth = matmul_peak(), memory_bandwidth()
    rows, moved = measure(args.repeats)
    command = " ".join(["python benchmarks/engine_overhead.py"] + sys.argv[1:])
    md = markdown(rows, moved, peak, bandwidth, command)
    write_json(os.path.join(args.out, "engine_overhead.json"),
               {"command": command, "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
                "matmul_peak_flops": peak, "memory_bandwidth_bytes": bandwidth, "bytes_per_client_step": moved,
                "rows": rows})
    write_text(os.path.join(args.out, "engine_overhead.md"), md)
    print(md)


if __name__ == "__main__":
    main()
