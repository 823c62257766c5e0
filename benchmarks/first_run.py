"""A new user's first run, timed: ``fljax run --algorithm fedavg --dataset digits --set rounds=5`` in a fresh
process with an empty compile cache (first run), then once more with the cache it filled (second run); with
``--compare``, the quick-start comparison ``fljax compare`` (every general-purpose algorithm) the same two ways.

    python benchmarks/first_run.py [--repeats 1] [--compare]

Prints and writes ``benchmarks/results/first_run.json`` (``first_compare.json``): per run the process's wall
seconds (start-up and imports included) and summary.json's parts (setup, compile, run, other, wall; for
``compare``, summed over its runs); for ``run``, the 10th-percentile client accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

COMMANDS = {"run": ["run", "--algorithm", "fedavg", "--dataset", "digits", "--set", "rounds=5", "--quiet"],
            "compare": ["compare", "--quiet"]}
PARTS = ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds", "wall_seconds")


def one(command: str, out: str, cache: str) -> dict:
    env = {**os.environ, "FLJAX_COMPILE_CACHE": cache}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fljax.cli", *COMMANDS[command], "--out", out], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    process = time.perf_counter() - t0
    if command == "compare":  # the runs' summaries, summed: where the comparison's time went
        summaries = []
        for name in sorted(os.listdir(out)):
            path = os.path.join(out, name, "summary.json")
            if os.path.exists(path):
                with open(path) as f:
                    summaries.append(json.load(f))
        return {"process_seconds": round(process, 2), "runs": len(summaries),
                **{k: round(sum(s[k] for s in summaries), 2) for k in PARTS}}
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return {"process_seconds": round(process, 2), **{k: round(summary[k], 2) for k in PARTS},
            "personal_acc_p10": summary["final"]["personal_acc_p10"], "executor": summary["executor"],
            "model": summary["model"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="fresh-cache pairs of runs")
    parser.add_argument("--compare", action="store_true", help="time the quick-start `fljax compare` instead")
    args = parser.parse_args()
    command = "compare" if args.compare else "run"
    rows = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "cache")
            rows.append({"first": one(command, os.path.join(tmp, "a"), cache),
                         "second": one(command, os.path.join(tmp, "b"), cache)})
    result = {"command": "fljax " + " ".join(COMMANDS[command]), "cpus": os.cpu_count(),
              "load_average": os.getloadavg()[0], "runs": rows}
    print(json.dumps(result, indent=2))
    name = "first_compare.json" if args.compare else "first_run.json"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
