"""A vectorised hyperparameter grid against the same runs one after another.

A 16-point grid (FedProx ``algo.lr`` × ``algo.mu``, 4 × 4) × 3 seeds on digits (20 clients, MLP 64-32-10, 10 rounds)
run two ways, each in a fresh process with an empty persistent compile cache:

* ``grid``: ``fljax.sweep`` — the 48 runs are lanes of one compiled program (the traced lr and μ vmapped with the
  seeds);
* ``sequential``: 48 calls of ``fljax.run``, one per (point, seed), as a loop over configs would do (each lr/μ is a
  constant of its own program, so each point compiles again).

Prints the median wall time of ``--repeats`` repetitions of each, their ratio, and the largest difference of final
accuracy between the two ways; writes ``benchmarks/results/grid.{json,md}``.

    python benchmarks/grid.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

GRID = {"algo.lr": [0.03, 0.05, 0.1, 0.2], "algo.mu": [0.0, 0.001, 0.01, 0.1]}
SEEDS = 3
CONFIG = dict(algorithm="fedprox", algo={"cohort_size": 10, "batch_size": 10, "local_steps": 5},
              data={"dataset": "digits", "num_clients": 20, "partition": "dirichlet", "alpha": 0.5},
              model={"name": "mlp", "options": {"hidden": [32]}}, rounds=10, eval_every=5, checkpoint_every=0,
              executor="vmap")

WORKER = """
import itertools, json, sys, time
t0 = time.perf_counter()
import fljax
grid, seeds, config, mode = json.loads(sys.argv[1])
finals = {}
if mode == "grid":
    results = fljax.sweep(grid, config, seeds=seeds, progress=False)
    for res in results.values():
        point = ",".join(str(res.cfg.algo[k.split(".", 1)[1]]) for k in grid)
        for s, run in enumerate(res.runs):
            finals[f"{point}|{s}"] = run.progress.log.history[-1]["personal_acc"]
else:
    keys = list(grid)
    for values in itertools.product(*grid.values()):
        point = dict(zip(keys, values))
        algo = {**config["algo"], **{k.split(".", 1)[1]: v for k, v in point.items()}}
        label = ",".join(str(v) for v in values)
        for s in range(seeds):
            run = fljax.run(config={**config, "algo": algo}, seed=s, progress=False)
            finals[f"{label}|{s}"] = run.history[-1]["personal_acc"]
print(json.dumps({"seconds": time.perf_counter() - t0, "finals": finals}))
"""


def one(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "FLJAX_COMPILE_CACHE": cache}
        out = subprocess.run([sys.executable, "-c", WORKER, json.dumps([GRID, SEEDS, CONFIG, mode])], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    times = {"grid": [], "sequential": []}
    finals = {}
    for _ in range(args.repeats):
        for mode in times:
            r = one(mode)
            times[mode].append(r["seconds"])
            finals[mode] = r["finals"]
            print(f"{mode}: {r['seconds']:.1f} s", flush=True)
    med = {m: float(np.median(t)) for m, t in times.items()}
    diff = max(abs(finals["grid"][k] - finals["sequential"][k]) for k in finals["grid"])
    runs = len(finals["grid"])
    rows = [f"| {m} | {runs} | {med[m]:.1f} | {', '.join(f'{t:.1f}' for t in times[m])} |" for m in times]
    text = "\n".join([
        f"{runs // SEEDS}-point grid (FedProx lr × mu) × {SEEDS} seeds, digits, 20 clients, MLP 64-32-10, "
        f"{CONFIG['rounds']} "
        f"rounds; wall seconds of a fresh process with an empty compile cache (median of {args.repeats}).", "",
        "| way | runs | median s | all runs s |", "|---|---|---|---|", *rows, "",
        f"grid / sequential speed-up: {med['sequential'] / med['grid']:.1f}×; largest |final accuracy difference| "
        f"between the two ways: {diff:.2g}", "", "command: python benchmarks/grid.py --repeats " + str(args.repeats)])
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "grid.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "grid.json"), "w") as f:
        json.dump({"times": times, "median": med, "max_final_diff": diff, "grid": GRID, "seeds": SEEDS,
                   "config": CONFIG}, f, indent=1)


if __name__ == "__main__":
    main()
