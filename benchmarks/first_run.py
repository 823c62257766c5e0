"""A new user's first run, timed: ``fljax run --algorithm fedavg --dataset digits --set rounds=5`` in a fresh
process with an empty compile cache (first run), then once more with the cache it filled (second run).

    python benchmarks/first_run.py [--repeats 1]

Prints and writes ``benchmarks/results/first_run.json``: per run the process's wall seconds (start-up and imports
included), summary.json's parts (setup, compile, run, other, wall) and the 10th-percentile client accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

COMMAND = ["run", "--algorithm", "fedavg", "--dataset", "digits", "--set", "rounds=5", "--quiet"]
PARTS = ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds", "wall_seconds")


def one(out: str, cache: str) -> dict:
    env = {**os.environ, "FLJAX_COMPILE_CACHE": cache}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fljax.cli", *COMMAND, "--out", out], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    process = time.perf_counter() - t0
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return {"process_seconds": round(process, 2), **{k: round(summary[k], 2) for k in PARTS},
            "personal_acc_p10": summary["final"]["personal_acc_p10"], "executor": summary["executor"],
            "model": summary["model"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="fresh-cache pairs of runs")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "cache")
            rows.append({"first": one(os.path.join(tmp, "a"), cache), "second": one(os.path.join(tmp, "b"), cache)})
    result = {"command": "fljax " + " ".join(COMMAND), "cpus": os.cpu_count(), "runs": rows}
    print(json.dumps(result, indent=2))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "first_run.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
