"""A new user's first hour, timed in fresh processes: each case once with an empty compile cache (first) and once
more with the cache it filled (second).

    python benchmarks/first_run.py [--case run|compare|quicklook|startup] [--repeats 1] [--baseline DIR]

Cases (issue 40's targets, cold, on the 2-core machine at low load):

* ``run``: ``fljax run --algorithm fedavg --dataset digits --set rounds=5`` (target ≤ 3 s of summary wall time);
* ``compare``: the quick-start ``fljax compare`` (target ≤ 15 s);
* ``quicklook``: the README's quick look ``fljax reproduce dfedalt --only table --seeds 1 --rounds 20`` (≤ 45 s);
* ``startup``: ``fljax --help``, ``fljax --version`` and ``fljax list`` (target < 2 s each; no compilation, so
  first and second are two repeats).

Prints and writes ``benchmarks/results/first_<case>.json`` (``first_run.json`` for ``run``): per process its wall
and CPU seconds (start-up and imports included), the machine's load average before it, and summary.json's parts (setup,
compile, run, other, wall; summed over the runs of ``compare`` and ``quicklook``); for ``run``, the
10th-percentile client accuracy. A file whose numbers did not change is not rewritten.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

COMMANDS = {"run": ["run", "--algorithm", "fedavg", "--dataset", "digits", "--set", "rounds=5", "--quiet"],
            "compare": ["compare", "--quiet"],
            "quicklook": ["reproduce", "dfedalt", "--only", "table", "--seeds", "1", "--rounds", "20", "--quiet"]}
STARTUP = {"help": ["--help"], "version": ["--version"], "list": ["list"]}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout
PARTS = ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds", "wall_seconds")


def _summaries(out: str) -> list[dict]:
    """Every summary.json under ``out`` (a comparison's runs, a reproduction's runs)."""
    found = []
    for root, _, names in os.walk(out):
        if "summary.json" in names:
            with open(os.path.join(root, "summary.json")) as f:
                summary = json.load(f)
            if all(k in summary for k in PARTS):
                found.append(summary)
    return found


def _process(argv: list[str], env: dict, code: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of ``python -m fljax ARGV`` in a fresh process running the fljax
    of the checkout ``code``; the CPU seconds change little with the machine's load."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "fljax", *argv], check=True, env={**env, "PYTHONPATH": code}, cwd=code,
                   stdout=subprocess.DEVNULL)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(time.perf_counter() - t0, 2), round(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime, 2)


def one(case: str, out: str, cache: str, code: str = ROOT) -> dict:
    env = {**os.environ, "FLJAX_COMPILE_CACHE": cache}
    load = round(os.getloadavg()[0], 2)
    if case == "startup":
        times = {name: _process(argv, env, code) for name, argv in STARTUP.items()}
        return {"load_average": load, **{f"{name}_{part}": t[i] for name, t in times.items()
                                         for i, part in enumerate(("seconds", "cpu_seconds"))}}
    process, cpu = _process([*COMMANDS[case], "--out", out], env, code)
    if case == "run":
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        return {"process_seconds": process, "process_cpu_seconds": cpu, "load_average": load,
                **{k: round(summary[k], 2) for k in PARTS},
                "personal_acc_p10": summary["final"]["personal_acc_p10"], "executor": summary["executor"],
                "model": summary["model"]}
    summaries = _summaries(out)  # where the comparison's or reproduction's time went
    return {"process_seconds": process, "process_cpu_seconds": cpu, "load_average": load, "runs": len(summaries),
            **{k: round(sum(s[k] for s in summaries), 2) for k in PARTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=(*COMMANDS, "startup"), default="run")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-cache pairs of runs")
    parser.add_argument("--baseline", metavar="DIR", help="another checkout (e.g. of the main branch) timed the same "
                        "way in turn with this one, so that both see the same load (rows baseline_first/_second)")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        row = {}
        for prefix, code in (("", ROOT), *((("baseline_", os.path.abspath(args.baseline)),) if args.baseline else ())):
            with tempfile.TemporaryDirectory() as tmp:
                cache = os.path.join(tmp, "cache")
                row[f"{prefix}first"] = one(args.case, os.path.join(tmp, "a"), cache, code)
                row[f"{prefix}second"] = one(args.case, os.path.join(tmp, "b"), cache, code)
        rows.append(row)
    command = (" / ".join("fljax " + " ".join(argv) for argv in STARTUP.values()) if args.case == "startup" else
               "fljax " + " ".join(COMMANDS[args.case]))
    result = {"command": command, "benchmark": f"python benchmarks/first_run.py --case {args.case} --repeats "
              f"{args.repeats}{' --baseline MAIN' if args.baseline else ''}", "cpus": os.cpu_count(), "compile_workers": os.environ.get("FLJAX_COMPILE_WORKERS"),
              "runs": rows}
    text = json.dumps(result, indent=2)
    print(text)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"first_{args.case}.json")
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
