"""Small cohorts, many rounds (FedJAX's EMNIST regime: 10 clients a round, one local epoch of batch 20): where a
round's time goes when latency, not FLOPs, dominates.

On a FedJAX-EMNIST-shaped population scaled to this machine (``--clients`` clients with log-normal sizes of
``--scale`` × EMNIST's mean of ~200 images of 28×28×1, 62 classes; ragged storage), FedAvg with cohorts of 10 runs
``--rounds`` rounds:

* **blocks of rounds**: ``Simulation.run_rounds(state, n)`` for n = 1 (one dispatch and one host sync per round)
  up to n = ``--rounds`` (one compiled ``lax.scan`` over all of them, nothing leaves the device in between);
* **evaluation only where asked**: ``Simulation.run(rounds, eval_every)`` with eval_every = 1 (every round scores
  all clients) against eval_every = rounds (the initial model and the end);
* **the epoch's scan**: one local epoch is one ``lax.scan`` of ⌈n_max/20⌉ steps; its unroll factor 1 against the
  CPU's ``auto`` (fully unrolled for convolutions).

Each row is the steady time per round (median of ``--repeats`` after a compiling call) of the MLP 784-200-200-62 (every
variant) and the CNN ``cnn1_s`` (blocks of 1 and of all rounds, both cadences, the CPU's unroll). Writes ``results/small_cohorts.{json,md}``.

    python benchmarks/small_cohorts.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def population(clients: int, scale: float = 1.0, seed: int = 0):
    import fljax.data as D
    from fljax.data.build import stack_clients

    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 0.6, clients)
    parts = []
    for mean in (197.5, 22.8):  # EMNIST-62's training and test images per client (671,585 and 77,483 over 3,400)
        sizes = np.maximum(1, np.round(w / w.sum() * mean * scale * clients)).astype(int)
        n = int(sizes.sum())
        parts.append(stack_clients(rng.random((n, 28, 28, 1), np.float32), rng.integers(0, 62, n).astype(np.int32),
                                   sizes, "ragged"))
    return D.FederatedData(train=parts[0], test=parts[1], num_classes=62, input_shape=(28, 28, 1), name="emnist-like")


def timed(fn, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--scale", type=float, default=0.2, help="client sizes as a fraction of EMNIST's")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    import jax

    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model
    from fljax.runner.files import write_json, write_text

    data = population(args.clients, args.scale)
    algo = make_algorithm("fedavg", cohort_size=10, local_epochs=1, local_steps=None, batch_size=20, lr=0.1)
    r = args.rounds
    rows = []
    for name in ("mlp", "cnn1_s"):
        model = make_model(name, data.input_shape, data.num_classes)
        # the CNN: this CPU's own unroll only (time); the MLP's own is 1, so it also runs fully unrolled
        for unroll in ("auto", "steps") if name == "mlp" else ("auto",):
            steps = int(-(-data.train.n_max // 20))
            sim = Simulation(algo, data, model, executor="vmap", unroll=steps if unroll == "steps" else unroll)
            state = sim.init()
            for n in sorted({1, r // 2, r}) if name == "mlp" else (1, r):
                per_round = timed(lambda: _rounds(sim, state, n, r), args.repeats) / r
                rows.append({"model": name, "unroll": sim.unroll, "what": f"run_rounds in blocks of {n}",
                             "seconds_per_round": per_round})
                print(rows[-1], file=sys.stderr)
            if unroll == "auto":
                for every in (1, r):
                    per_round = timed(lambda: sim.run(r, eval_every=every, progress=False, state=state).state,
                                      args.repeats) / r
                    rows.append({"model": name, "unroll": sim.unroll, "seconds_per_round": per_round,
                                 "what": f"run with eval_every={every} (evaluations of {args.clients} clients)"})
                    print(rows[-1], file=sys.stderr)
    meta = {"command": " ".join(["python benchmarks/small_cohorts.py"] + (argv or sys.argv[1:])),
            "jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
            "clients": args.clients, "rounds": r, "steps_per_round": int(-(-data.train.n_max // 20)),
            "load_average": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d")}
    lines = [f"# Small cohorts, many rounds ({meta['backend']}, {meta['cpu_count']} cores, load average "
             f"{meta['load_average']:.1f} at the end, jax {meta['jax']})", "",
             f"FedAvg, 10 clients a round of {args.clients} (EMNIST-like sizes, largest {int(data.train.n_max)}), one "
             f"local epoch of batch 20 = {meta['steps_per_round']} scanned steps per client, {r} rounds; steady "
             f"seconds per round, median of {args.repeats}. Command: `{meta['command']}`.", "",
             "| model | local-step scan unroll | how the rounds run | ms per round |", "|---|---|---|---|"]
    lines += [f"| {x['model']} | {x['unroll']} | {x['what']} | {1e3 * x['seconds_per_round']:.1f} |" for x in rows]
    write_json(os.path.join(args.out, "small_cohorts.json"), {"meta": meta, "rows": rows})
    write_text(os.path.join(args.out, "small_cohorts.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


def _rounds(sim, state, n: int, total: int):
    """``total`` rounds from ``state`` in blocks of ``n``: each block one compiled call whose metrics come back to
    the host, as the run loop does after every block."""
    import jax

    for _ in range(total // n):
        state, metrics = sim.run_rounds(state, n)
        jax.device_get(metrics)
    return state


if __name__ == "__main__":
    main()
