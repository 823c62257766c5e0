"""An attack × defence × fraction × seed table three ways: fljax's sweep, its cells one at a time, a PyTorch loop.

The sweep compiles few programs (fractions and seeds as lanes); the same cells run one at a time through fljax; a
per-client PyTorch loop runs them the way Blades and FLPoison do.

The table: 6 attacks (sign_flip, gaussian, alie, ipm, min_max, min_sum) × 6 defences (mean, median, trimmed_mean,
krum, multi_krum, centered_clip) × 3 malicious fractions (0.1, 0.2, 0.3) × 2 seeds = 216 runs of FedAvg on digits
(20 clients with Dirichlet(0.3) label skew, all of them every round, MLP 64, 10 local SGD steps of batch 10 at
lr 0.1, ``--rounds`` rounds, evaluated once at the end). Each way runs in a fresh process with an empty persistent
compile cache:

* ``table``: ``fljax sweep WORKLOAD --grid attack.name=… --grid aggregator.name=… --grid attack.fraction=…
  --seeds 2``, the command a user types: the fractions and seeds of an (attack, defence) pair are lanes of one
  compiled program, so the table compiles at most 36 programs. Timed: the command's wall seconds.
* ``cells``: the same cells one at a time, ``fljax.run`` per (attack, defence, fraction, seed) in one process (a
  loop over configs; the compile cache on, as by default, so a cell's second seed loads its first seed's program).
  ``--sample`` pairs (default 6: a diagonal, every attack and every defence once) × 3 fractions × 2 seeds are run and
  the mean seconds per run is extrapolated to the 216 runs.
* ``torch``: :mod:`benchmarks.robust_torch` under ``--torch-python`` (an interpreter with ``torch``), the diagonal's
  pairs at fraction 0.2 and seed 0, extrapolated likewise; its attacks and defences are checked against
  fljax.ops on one random cohort first (the largest difference is reported).

Writes ``benchmarks/results/robust_speed.{json,md}``; ``--parts`` runs some ways only (the others' results in the
JSON are kept).

    python benchmarks/robust.py --rounds 200 --torch-python /tmp/torchvenv/bin/python
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ATTACKS = ["sign_flip", "gaussian", "alie", "ipm", "min_max", "min_sum"]
DEFENCES = ["mean", "median", "trimmed_mean", "krum", "multi_krum", "centered_clip"]
FRACTIONS = [0.1, 0.2, 0.3]
SEEDS = 2
OPTIONS = {"trimmed_mean": {"beta": 0.2}, "centered_clip": {"tau": 0.3}}  # as the robust study (fljax reproduce robust)
CONFIG = {"algorithm": "fedavg", "data": {"dataset": "digits", "num_clients": 20, "partition": "dirichlet",
                                          "alpha": 0.3, "seed": 0},
          "model": {"name": "mlp", "options": {"hidden": [64]}},
          "algo": {"cohort_size": None, "local_steps": 10, "batch_size": 10, "lr": 0.1},
          "checkpoint_every": 0}


def config(rounds: int) -> dict:
    return {**CONFIG, "rounds": rounds, "eval_every": rounds}


def client_steps(rounds: int) -> int:
    """Client steps of one run: rounds × clients × local steps."""
    return rounds * CONFIG["data"]["num_clients"] * CONFIG["algo"]["local_steps"]


def _env(cache: str) -> dict:
    return {**os.environ, "FLJAX_COMPILE_CACHE": cache, "PYTHONPATH": ROOT + os.pathsep
            + os.environ.get("PYTHONPATH", "")}


def sweep_command(workload: str, out: str, attacks: list[str], defences: list[str]) -> list[str]:
    """``fljax sweep`` of the whole table (the rule options as ``--set``: each applies to the rules that have it)."""
    sets = [f"aggregator.{k}={v}" for d, opts in OPTIONS.items() if d in defences for k, v in opts.items()]
    return [sys.executable, "-m", "fljax", "sweep", workload,
            "--grid", "attack.name=" + ",".join(attacks), "--grid", "aggregator.name=" + ",".join(defences),
            "--grid", "attack.fraction=" + ",".join(map(str, FRACTIONS)), "--seeds", str(SEEDS),
            *[a for s in sets for a in ("--set", s)], "--out", out, "--quiet"]


def part_table(rounds: int, attacks: list[str] = ATTACKS, defences: list[str] = DEFENCES) -> dict:
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        workload = os.path.join(tmp, "workload.yaml")
        with open(workload, "w") as f:
            yaml.safe_dump(config(rounds), f)
        out = os.path.join(tmp, "table")
        cmd = sweep_command(workload, out, attacks, defences)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=_env(os.path.join(tmp, "cache")), check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        summary = json.load(open(os.path.join(out, "summary.json")))
    points = summary["results"]
    programs = summary["programs"]
    compiles = {}  # one program per (attack, defence): its compile seconds (every point of it records the same)
    for label, point in points.items():
        pair = tuple(p.split("=", 1)[1] for p in label.split(",")[:2])
        compiles.setdefault(pair, point["compile_seconds"])
    shown = ["fljax sweep WORKLOAD"] + [a if " " not in a else repr(a) for a in cmd[5:-3]]
    return {"seconds": seconds, "runs": sum(len(p["seeds"]) for p in points.values()),
            "programs": programs.get("compiled", len(compiles)), "vectorised_runs": programs["vectorised_runs"],
            "compile_seconds": sum(compiles.values()), "run_seconds": sum(p["run_seconds"] for p in points.values()),
            "command": " ".join(shown),
            "finals": {label: p["final"].get("honest_global_acc", {}).get("mean") for label, p in points.items()}}


CELLS_WORKER = """
import json, os, sys, time
t0 = time.perf_counter()
import fljax
cells, config, options, out = json.loads(sys.argv[1])
start = time.perf_counter() - t0
times = []
for attack, defence, fraction, seed in cells:
    cfg = {**config, "attack": {"name": attack, "fraction": fraction},
           "aggregator": {"name": defence, **options.get(defence, {})}}
    t = time.perf_counter()
    try:
        r = fljax.run(cfg, seed=seed, out=os.path.join(out, f"{attack}-{defence}-{fraction}-{seed}"), progress=False)
        done = {"compile_seconds": r.summary.get("compile_seconds"),
                "honest_global_acc": r.final.get("honest_global_acc")}
    except fljax.engine.loop.NonFiniteError:  # the attack broke the rule: the run stops early (less work than a lane)
        done = {"compile_seconds": None, "honest_global_acc": None, "diverged": True}
    times.append({"cell": [attack, defence, fraction, seed], "seconds": time.perf_counter() - t, **done})
print(json.dumps({"start_seconds": start, "runs": times}))
"""


def _table_runs(attacks, defences) -> int:
    return len(attacks) * len(defences) * len(FRACTIONS) * SEEDS


def part_cells(rounds: int, sample: int, attacks: list[str] = ATTACKS, defences: list[str] = DEFENCES) -> dict:
    diagonal = list(zip(attacks, defences))[:sample]
    cells = [[a, d, fr, s] for (a, d), fr, s in itertools.product(diagonal, FRACTIONS, range(SEEDS))]
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", CELLS_WORKER,
                               json.dumps([cells, config(rounds), OPTIONS, os.path.join(tmp, "runs")])],
                              env=_env(os.path.join(tmp, "cache")), check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    per_run = float(np.mean([r["seconds"] for r in result["runs"]]))
    table = _table_runs(attacks, defences)
    return {**result, "sampled_runs": len(cells), "seconds_per_run": per_run,
            "seconds": result["start_seconds"] + per_run * table, "extrapolated": True,
            "programs": len(attacks) * len(defences) * len(FRACTIONS),
            "compile_seconds": float(np.mean([r["compile_seconds"] for r in result["runs"]
                                              if r["compile_seconds"] is not None])) * table}


def _workload_npz(path: str, rounds: int) -> None:
    """The data, the workload's settings and one random cohort with fljax.ops' outputs (the peer's check)."""
    import jax
    import jax.numpy as jnp

    import fljax
    import fljax.ops.attacks as A
    import fljax.ops.robust as R

    cfg = fljax.make_config({**config(rounds), "seed": 0})
    data = fljax.load_data(cfg)
    rng = np.random.default_rng(0)
    n, dim, f = 20, 50, 4
    d = jnp.asarray(rng.normal(size=(n, dim)) * rng.uniform(0.5, 2.0, size=(n, 1)), jnp.float32)
    w = jnp.asarray(rng.integers(20, 100, size=n), jnp.float32)
    mal = jnp.arange(n) < f
    check = {}
    for name in DEFENCES:
        extra = {"f": f} if "krum" in name else {"v0": jnp.zeros(dim)} if name == "centered_clip" else {}
        check[f"check_{name}"] = np.asarray(R.RULES[name](d, None, w, **OPTIONS.get(name, {}), **extra)[0])
    attack_options = {"sign_flip": {"s": 4.0}, "ipm": {"eps": 0.1},
                      "gaussian": {"sigma": 1.0, "keys": jax.random.split(jax.random.PRNGKey(0), n)}}
    for name in ATTACKS:
        check[f"check_{name}"] = np.asarray(A.MODEL_ATTACKS[name](d, mal, None, **attack_options.get(name, {})))
    np.savez(path, train_x=np.asarray(data.train.x, np.float32), train_y=np.asarray(data.train.y, np.int64),
             train_count=np.asarray(data.train.count, np.int64), test_x=np.asarray(data.test.x, np.float32),
             test_y=np.asarray(data.test.y, np.int64), test_count=np.asarray(data.test.count, np.int64),
             classes=data.num_classes, hidden=np.asarray(CONFIG["model"]["options"]["hidden"]),
             local_steps=CONFIG["algo"]["local_steps"], batch_size=CONFIG["algo"]["batch_size"],
             lr=CONFIG["algo"]["lr"], rounds=rounds, options=json.dumps(OPTIONS), check_deltas=np.asarray(d),
             check_weights=np.asarray(w), check_malicious=np.asarray(mal), check_f=f, **check)


def part_torch(rounds: int, python: str, sample: int, threads: int, attacks: list[str] = ATTACKS,
               defences: list[str] = DEFENCES) -> dict:
    cells = [[a, d, 0.2, 0] for a, d in list(zip(attacks, defences))[:sample]]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "workload.npz")
        _workload_npz(path, rounds)
        t0 = time.perf_counter()
        done = subprocess.run([python, os.path.join(HERE, "robust_torch.py"), path, json.dumps(cells),
                               "--threads", str(threads)], check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    result = json.loads(done.stdout.strip().splitlines()[-1])
    per_run = float(np.mean([c["seconds"] for c in result["cells"]]))
    table = _table_runs(attacks, defences)
    start = wall - sum(c["seconds"] for c in result["cells"])  # import, data, check
    return {**result, "sampled_runs": len(cells), "seconds_per_run": per_run, "start_seconds": start,
            "seconds": start + per_run * table, "extrapolated": True, "programs": 0, "compile_seconds": 0.0}


def render(results: dict, heading: str = "#") -> str:
    """The Markdown report of ``results`` (its ``attacks`` and ``defences``, ``rounds`` and the ways measured)."""
    rounds, attacks, defences = results["rounds"], results["attacks"], results["defences"]
    table = _table_runs(attacks, defences)
    steps = table * client_steps(rounds)
    names = {"table": "fljax sweep (lanes)", "cells": "fljax, one cell at a time", "torch": "PyTorch per-client loop"}
    rows = []
    base = results.get("table", {}).get("seconds")
    for part in ("table", "cells", "torch"):
        r = results.get(part)
        if not r:
            continue
        measured = (f"{r['sampled_runs']} runs: {r['seconds_per_run']:.2f} s each" if r.get("extrapolated")
                    else f"{r['runs']} runs: {r['seconds']:.1f} s")
        rows.append(f"| {names[part]} | {measured} | {r['seconds']:,.0f} | {r['programs']} | "
                    f"{r['compile_seconds']:,.0f} | {steps / r['seconds']:,.0f} | "
                    + (f"{r['seconds'] / base:.1f}× |" if base else "- |"))
    lines = [f"{heading} Attack × defence tables: fljax's sweep against cell by cell and a PyTorch loop", "",
             f"{len(attacks)} attacks ({', '.join(attacks)}) × {len(defences)} defences ({', '.join(defences)}) × "
             f"{len(FRACTIONS)} fractions ({', '.join(map(str, FRACTIONS))}) × {SEEDS} seeds = {table} runs of "
             f"FedAvg on digits (20 clients, Dirichlet 0.3, all every round; MLP 64; 10 local steps of batch 10; "
             f"{rounds} rounds; {client_steps(rounds):,} client steps a run, {steps:,} in all), "
             f"{results['machine']}, load average {results['load']}.", "",
             "| way | measured | table s | compiled programs | compile s | client-steps/s | sweep is faster by |",
             "|---|---|---|---|---|---|---|", *rows, ""]
    if "table" in results:
        lines += [f"Sweep command: `{results['table']['command']}`.", ""]
    if "cells" in results:
        c = results["cells"]
        lines += [f"One cell at a time: `fljax.run` per cell in one process (compile cache on; a cell's second "
                  f"seed loads the first seed's program), {c['sampled_runs']} runs sampled (attack i with defence i, "
                  f"× {len(FRACTIONS)} fractions × {SEEDS} seeds), their mean × {table} + the process start "
                  f"({c['start_seconds']:.1f} s).", ""]
    if "torch" in results:
        t = results["torch"]
        worst = max(v for k, v in t["check"].items() if k != "gaussian")
        lines += [f"PyTorch {t['torch']} on {t.get('device', 'cpu')} ({t['threads']} CPU thread"
                  f"{'s' * (t['threads'] != 1)}): {t['sampled_runs']} cells at fraction 0.2, their mean × {table} + "
                  f"the start ({t['start_seconds']:.1f} s: import, data, check); its attacks and defences equal "
                  f"fljax.ops' on a random cohort to {worst:.1e} (largest difference; gaussian's crafted rows have "
                  f"std {1 + t['check']['gaussian']:.3f} for σ = 1). Final accuracy of its cells: "
                  + ", ".join(f"{c['attack']}/{c['defence']} {c['global_acc']:.2f}" for c in t["cells"]) + ".", ""]
    lines += [f"Command: `{results['command']}`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--parts", default="table,cells,torch")
    p.add_argument("--sample", type=int, default=6, help="diagonal pairs run cell by cell (and by PyTorch)")
    p.add_argument("--torch-python", default=None, help="an interpreter with torch (default: skip the PyTorch way)")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    path = os.path.join(args.out, "robust_speed.json")
    results = json.load(open(path)) if os.path.exists(path) else {}
    if results.get("rounds") not in (None, args.rounds):
        results = {}  # another workload: start over
    results.update(rounds=args.rounds, attacks=ATTACKS, defences=DEFENCES, machine=f"{os.cpu_count()}-core CPU",
                   load=f"{os.getloadavg()[0]:.1f}",
                   command="python benchmarks/robust.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        if part == "table":
            results["table"] = part_table(args.rounds)
        elif part == "cells":
            results["cells"] = part_cells(args.rounds, args.sample)
        elif part == "torch":
            if not args.torch_python:
                print("robust.py: no --torch-python: the PyTorch way is skipped", file=sys.stderr)
                continue
            results["torch"] = part_torch(args.rounds, args.torch_python, args.sample, args.torch_threads)
        else:
            raise SystemExit(f"robust.py: unknown part {part!r}; choose among table, cells, torch")
        print(f"{part}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    text = render(results)
    with open(os.path.join(args.out, "robust_speed.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
