"""How much of a vectorised logistic-regression round is the engine, and how much is XLA:CPU?

Times the engine's FedAvg round (1,000 Synthetic(1,1) clients, 10 local SGD steps of batch 20, ``vmap`` executor)
against the smallest hand-written equivalent: 10 vmapped SGD steps of multinomial logistic regression on
pre-drawn batches, with no data pipeline, masks, aggregation or metrics. Prints client-steps/s for both (medians of
``--repeats`` timed blocks).

    python benchmarks/engine_overhead.py
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.models import make_model

CLIENTS, STEPS, BATCH = 1000, 10, 20


def _median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def engine_round(repeats: int) -> float:
    data = D.make_federated("synthetic", CLIENTS, seed=0, max_samples=200)
    model = make_model("logreg", data.input_shape, data.num_classes)
    sim = Simulation(make_algorithm("fedavg", lr=0.01, cohort_size=None, local_steps=STEPS, batch_size=BATCH),
                     data, model, executor="vmap", seed=0)
    state = sim.init()
    return _median_seconds(lambda: sim.run_rounds(state, 5)[0], repeats) / 5


def hand_written(repeats: int) -> float:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((CLIENTS, STEPS, BATCH, 60), np.float32))
    y = jnp.asarray(rng.integers(0, 10, (CLIENTS, STEPS, BATCH)))
    params = (jnp.zeros((CLIENTS, 60, 10)), jnp.zeros((CLIENTS, 10)))

    def loss(p, xb, yb):
        logp = jax.nn.log_softmax(xb @ p[0] + p[1])
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], 1))

    def client(p, xs, ys):
        def step(p, batch):
            g = jax.grad(loss)(p, *batch)
            return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), None

        return jax.lax.scan(step, p, (xs, ys))[0]

    run = jax.jit(jax.vmap(client))
    return _median_seconds(lambda: run(params, x, y), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    steps = CLIENTS * STEPS
    engine, hand = engine_round(args.repeats), hand_written(args.repeats)
    print(f"engine round (vmap):   {steps / engine:>10,.0f} client-steps/s  ({1e3 * engine:.1f} ms)")
    print(f"hand-written minimum:  {steps / hand:>10,.0f} client-steps/s  ({1e3 * hand:.1f} ms)")
    print(f"engine overhead: {100 * (engine / hand - 1):.0f} % of the hand-written time")


if __name__ == "__main__":
    main()
