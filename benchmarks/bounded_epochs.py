"""Local epochs bounded by the cohort's largest client: what a FedAvg round of one local epoch costs on populations
whose client sizes spread widely.

With ``local_epochs`` the batch schedule is sized by the population's largest client (static shapes): K = E·⌈N_max/B⌉
steps. A client of n_i samples needs E·⌈n_i/B⌉ of them; :func:`fljax.algorithms.local_training.run_steps` runs only
those (a cohort under ``vmap`` runs as many as its largest member needs; one client at a time, each its own).
Workloads, each with FedAvg, 10 clients a round, one local epoch, the CPU's ``auto`` executor:

* ``shakespeare``: the Shakespeare stand-in (715 speakers, sequences of 80, the largest speaker 519 training
  sequences: K = 130 steps of batch 4), the character LSTM (8-d embedding, 2 × 256);
* ``emnist``: the EMNIST-shaped population of ``benchmarks/gpu.py`` (3,400 clients, 671,585 training images of
  28×28×1, log-normal sizes up to ~1,050: K = 53 steps of batch 20), ``cnn1_s``.

Each row: the steady seconds per round (median of ``--repeats`` single rounds after a compiling one, the same seeded
cohorts for every code version), the static K, and the steps the drawn cohorts' members need (their mean per round of
the sum, and of the cohort's largest). It measures whatever ``fljax`` is on the path, so the same command measures
the code before the change (``PYTHONPATH=<older checkout> python benchmarks/bounded_epochs.py --label before``);
rows are appended to ``results/bounded_epochs.json`` and the table rewritten to ``results/bounded_epochs.md``.

    python benchmarks/bounded_epochs.py [--workloads shakespeare emnist] [--repeats 3] [--label after]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _workload(name: str):
    """(data, model, algorithm) of a workload."""
    import fljax.data as D
    from fljax.algorithms import make_algorithm
    from fljax.models import make_model

    if name == "shakespeare":
        data = D.make_federated("shakespeare", 715, seed=0, source="standin", seq_len=80)
        model = make_model("lstm", data.input_shape, data.num_classes, embed=8, hidden=[256, 256])
        algo = make_algorithm("fedavg", cohort_size=10, lr=1.0, batch_size=4, local_epochs=1)
    else:
        from gpu import EMNIST, emnist_like

        data = emnist_like(EMNIST)
        model = make_model("cnn1_s", data.input_shape, data.num_classes)
        algo = make_algorithm("fedavg", cohort_size=10, lr=0.1, batch_size=20, local_epochs=1)
    return data, model, algo


def measure(name: str, repeats: int) -> dict:
    import jax

    from fljax.engine import Simulation

    data, model, algo = _workload(name)
    sim = Simulation(algo, data, model, executor="auto", seed=0)
    counts = np.asarray(data.train.count)
    batch = algo.batch_size
    need = -(-counts // batch)  # steps of one epoch, per client
    k = -(-int(data.train.n_max) // batch)
    rng = np.random.default_rng(1)
    cohorts = [rng.choice(len(counts), 10, replace=False) for _ in range(1000)]  # the steps cohorts need (typical)
    state = sim.init()
    t0 = time.perf_counter()
    state, _ = sim.run_rounds(state, 1)  # compiles
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, _ = sim.run_rounds(state, 1)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    return {"workload": name, "executor": sim.executor.describe(), "unroll": sim.unroll, "clients": len(counts),
            "n_max": int(data.train.n_max), "batch": batch, "static_steps": k,
            "cohort_steps_sum": float(np.mean([need[c].sum() for c in cohorts])),
            "cohort_steps_max": float(np.mean([need[c].max() for c in cohorts])),
            "round_seconds": float(np.median(times)), "round_times": times, "first_round_seconds": first,
            "load_average": os.getloadavg()[0]}


def markdown(rows: list[dict]) -> str:
    import jax

    lines = [f"FedAvg, 10 clients a round, one local epoch, `auto` executor; steady seconds per round (median of the "
             f"timed single rounds after a compiling one). Backend {jax.default_backend()}, {os.cpu_count()} cores, "
             f"jax {jax.__version__}. `before`: the code before local epochs were bounded (every member runs the "
             f"population's K steps); `after`: each member runs its own E·⌈n_i/B⌉ (under `vmap`: the cohort's "
             f"largest). Command: `python benchmarks/bounded_epochs.py --label LABEL` (`before` with PYTHONPATH on "
             f"the older checkout).", "",
             "| workload | code | executor | unroll | largest client, K steps | steps a cohort needs: sum / largest | "
             "s per round | load average |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['label']} | {r['executor']} | {r['unroll']} | {r['n_max']} samples, "
                     f"{r['static_steps']} of batch {r['batch']} | {r['cohort_steps_sum']:.0f} / "
                     f"{r['cohort_steps_max']:.1f} | **{r['round_seconds']:.2f}** | {r['load_average']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["shakespeare", "emnist"], choices=["shakespeare", "emnist"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    path = os.path.join(args.out, "bounded_epochs.json")
    rows = json.load(open(path))["rows"] if os.path.exists(path) else []
    for name in args.workloads:
        row = {**measure(name, args.repeats), "label": args.label}
        print(json.dumps(row), file=sys.stderr)
        rows = [r for r in rows if (r["workload"], r["label"]) != (name, args.label)] + [row]
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "bounded_epochs.md"), "w") as f:
            f.write(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
