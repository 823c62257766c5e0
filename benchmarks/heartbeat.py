"""What the progress bar's heartbeat costs: a block of rounds between evaluations run as paced calls of its one
program so that the bar moves every ``HEARTBEAT_SECONDS`` with the last round's training loss
(:class:`fljax.engine.loop.Pace`), against the same rounds in one call (``--quiet``, no bar).

Workload: the quick start's FedAvg (digits, 50 clients, the MLP, cohort 10, 2 local epochs), ``--rounds`` rounds
evaluated once at the end. Rows (one process, the two alternated ``--repeats`` times so that both see the same
load): the rounds' seconds (``run_seconds``, compilation apart), the calls of the block program, and the heartbeat's
cost as a share of the quiet run's round time (issue 40's goal: at most 2 %), from the medians and from the minima
(the minimum is the least disturbed by other work on a shared machine). On a loaded machine these differ by more
than the heartbeat costs, so the overhead of one call is also measured directly: ``--calls`` rounds as that many
calls of one round against one call of them all (minima over the repeats), the difference per extra call; the bar
adds one call per ``HEARTBEAT_SECONDS`` (or per round when a round is slower), so its cost is that overhead over
``HEARTBEAT_SECONDS`` (or over the round time). Writes
``benchmarks/results/heartbeat.json``.

    python benchmarks/heartbeat.py [--rounds 400] [--repeats 7] [--calls 20]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time

import jax

import fljax
from fljax.engine.loop import HEARTBEAT_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    sim = fljax.build({"algorithm": "fedavg", "data": {"dataset": "digits", "num_clients": 50},
                       "model": {"name": "mlp", "options": {"hidden": [64]}},
                       "algo": {"cohort_size": 10, "lr": 0.1, "batch_size": 10, "local_epochs": 2}})
    calls = []
    run_rounds = sim.run_rounds
    sim.run_rounds = lambda state, n, **kw: calls.append(n) or run_rounds(state, n, **kw)
    sim.run(args.rounds, eval_every=args.rounds, progress=False)  # compiled once, outside the timings
    seconds, count = {"quiet": [], "bar": []}, {}
    for _ in range(args.repeats):
        for mode in ("quiet", "bar"):
            calls.clear()
            with contextlib.redirect_stderr(io.StringIO()):  # the bar's lines
                result = sim.run(args.rounds, eval_every=args.rounds, progress="bar" if mode == "bar" else False)
            seconds[mode].append(result.run_seconds)
            count[mode] = len(calls)
    split, whole = [], []  # the overhead of a call: --calls rounds one call each, against one call of all of them
    state = sim.init()
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        s = state
        for _ in range(args.calls):
            s, m = run_rounds(s, 1, capacity=args.calls)
        jax.block_until_ready((s, m))
        split.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        jax.block_until_ready(run_rounds(state, args.calls, capacity=args.calls))
        whole.append(time.perf_counter() - t0)
    per_call = (min(split) - min(whole)) / (args.calls - 1)
    quiet, bar = statistics.median(seconds["quiet"]), statistics.median(seconds["bar"])
    fastest = {mode: min(values) for mode, values in seconds.items()}
    result = {"benchmark": f"python benchmarks/heartbeat.py --rounds {args.rounds} --repeats {args.repeats} "
                           f"--calls {args.calls}",
              "workload": "fedavg, digits, 50 clients, mlp [64], cohort 10, 2 local epochs (the quick start)",
              "heartbeat_seconds": HEARTBEAT_SECONDS, "rounds": args.rounds, "cpus": os.cpu_count(),
              "load_average": round(os.getloadavg()[0], 2), "quiet_seconds": seconds["quiet"],
              "bar_seconds": seconds["bar"], "quiet_calls": count["quiet"], "bar_calls": count["bar"],
              "median_ms_per_round": {"quiet": round(1e3 * quiet / args.rounds, 3),
                                      "bar": round(1e3 * bar / args.rounds, 3)},
              "per_call_overhead_ms": round(1e3 * per_call, 3),
              "cost_percent_at_heartbeat": round(100 * per_call / HEARTBEAT_SECONDS, 3),
              "cost_percent_of_medians": round(100 * (bar - quiet) / quiet, 2),
              "cost_percent_of_minima": round(100 * (fastest["bar"] - fastest["quiet"]) / fastest["quiet"], 2)}
    print(json.dumps(result, indent=2))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "heartbeat.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
