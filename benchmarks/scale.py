"""FedAvg throughput and memory against the population's size and the cohort's (ragged client storage).

Logistic regression (60 → 10) on Synthetic(1,1) with power-law client sizes (⌊lognormal(1, 1)⌋ + 11 samples, at most
64: about 15 per client), FedAvg with 10 local SGD steps of batch 20, executor ``auto``. For every population size
(1e3 … 1e6) the data are generated once, stored ragged (one flat array + offsets: ``data.storage: ragged``), and a
cohort of each size (1e3, 1e4, and every client for populations up to 1e5) runs ``--repeats`` timed rounds after a
warm-up round (which compiles); the figure is the median round. One evaluation of every client is timed too. Each
population runs in its own process, so its peak RSS is its own (the process's peak up to that row: data generation,
compiled programs, all cohorts so far). The padded layout (``storage: padded``) is measured beside it up to 1e5
clients, the most it allows. Targets (issue 16): a cohort of 10,000 from a million clients at ≥ 80 % of the
client-steps/s of the same cohort from 10,000; 100,000 clients all participating at ≥ 80 % of 1,000 all
participating.

    python benchmarks/scale.py                 # -> benchmarks/results/scale.{json,md,png}
    python benchmarks/scale.py --quick         # a two-minute smoke run (-> scale_quick.*)
    python benchmarks/scale.py --pair 1000000 10000 10000 10000 --repeats 15   # one target's pair, more rounds
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's fljax, also in the per-population processes
STEPS, BATCH = 10, 20
DATA = dict(max_samples=64, min_samples=11, size_log_mean=1.0, size_log_std=1.0)
FULL = dict(populations=[1_000, 10_000, 100_000, 1_000_000], cohorts=[1_000, 10_000], full_up_to=100_000,
            padded_up_to=100_000, targets=((1_000_000, 10_000, 10_000, 10_000), (100_000, 100_000, 1_000, 1_000)))
QUICK = dict(populations=[200, 2_000], cohorts=[50, 200], full_up_to=2_000, padded_up_to=2_000,
             targets=((2_000, 200, 200, 200), (2_000, 2_000, 200, 200)))


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _simulation(data, population: int, cohort: int):
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.experiment import default_model

    algo = make_algorithm("fedavg", lr=0.01, cohort_size=None if cohort == population else cohort,
                          local_steps=STEPS, batch_size=BATCH)
    return Simulation(algo, data, default_model(data), executor="auto", seed=0)


def _data(population: int, storage: str):
    """(data, generation seconds, bytes)."""
    import jax

    import fljax.data as D

    t0 = time.perf_counter()
    data = D.make_federated("synthetic", population, seed=0, storage=storage, **DATA)
    jax.block_until_ready(data)
    return data, time.perf_counter() - t0, sum(x.nbytes for x in jax.tree.leaves((data.train, data.test)))


def _timed_round(sim, state):
    import jax

    t0 = time.perf_counter()
    state, _ = sim.run_rounds(state, 1)
    jax.block_until_ready(state)
    return state, time.perf_counter() - t0


def _row(population, cohort, storage, sim, times, gen, data_bytes, load, repeats) -> dict:
    per_round = float(np.median(times))
    return {"population": population, "cohort": cohort, "storage": storage, "executor": sim.executor.describe(),
            "round_seconds": per_round, "round_times": times, "client_steps_per_s": cohort * STEPS / per_round,
            "compile_seconds": sim.compile_seconds, "generate_seconds": gen, "data_bytes": data_bytes,
            "peak_rss_bytes": _rss(), "load_before": load, "load_after": os.getloadavg()[0], "repeats": repeats}


def measure(population: int, storage: str, cohorts: list[int], repeats: int) -> list[dict]:
    """Every cohort size over one population, in this process."""
    import jax

    data, gen, data_bytes = _data(population, storage)
    rows, sim, state = [], None, None
    for cohort in cohorts:
        sim = _simulation(data, population, cohort)
        load = os.getloadavg()[0]
        state, _ = _timed_round(sim, sim.init())  # warm-up: compiles
        times = []
        for _ in range(repeats):
            state, t = _timed_round(sim, state)
            times.append(t)
        rows.append(_row(population, cohort, storage, sim, times, gen, data_bytes, load, repeats))
    t0 = time.perf_counter()
    jax.block_until_ready(sim.evaluate(state))  # every client, through the last cohort's executor
    rows[-1]["evaluate_seconds"] = time.perf_counter() - t0  # includes compiling the evaluation
    rows[-1]["peak_rss_bytes"] = _rss()
    return rows


def paired(target: tuple, repeats: int) -> list[dict]:
    """A target's two configurations, (population, cohort) and its baseline, in one process with their timed rounds
    alternating, so that both see the same load (the machine is shared): the fair ratio."""
    pop, cohort, base_pop, base_cohort = target
    runs = []
    for p, c in ((pop, cohort), (base_pop, base_cohort)):
        data, gen, data_bytes = _data(p, "ragged")
        sim = _simulation(data, p, c)
        state, _ = _timed_round(sim, sim.init())  # warm-up: compiles
        runs.append([p, c, sim, state, [], gen, data_bytes])
    load = os.getloadavg()[0]
    for _ in range(repeats):
        for run in runs:
            run[3], t = _timed_round(run[2], run[3])
            run[4].append(t)
    return [{**_row(p, c, "ragged", sim, times, gen, data_bytes, load, repeats), "paired": list(target),
             "sample_seconds": _sampling_seconds(p, c, repeats)} for p, c, sim, _, times, gen, data_bytes in runs]


def _sampling_seconds(population: int, cohort: int, repeats: int) -> float:
    """Median seconds of drawing one cohort (:func:`fljax.engine.sample_cohort`, compiled): the part of a round
    that grows with the population."""
    import jax

    from fljax.engine import sample_cohort

    draw = jax.jit(lambda key: sample_cohort(key, population, None if cohort == population else cohort))
    jax.block_until_ready(draw(jax.random.PRNGKey(0)))
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(draw(jax.random.PRNGKey(i + 1)))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def configurations(spec: dict):
    for population in spec["populations"]:
        cohorts = [c for c in spec["cohorts"] if c < population]
        cohorts += [population] if population <= spec["full_up_to"] else []
        for storage in ("ragged", "padded") if population <= spec["padded_up_to"] else ("ragged",):
            yield population, storage, cohorts


def _find(rows: list[dict], population: int, cohort: int, storage: str = "ragged") -> dict | None:
    """The row of (population, cohort, storage)."""
    return next((r for r in rows if (r["population"], r["cohort"], r["storage"]) == (population, cohort, storage)),
                None)


def targets(rows: list[dict], spec: dict) -> list[dict]:
    """The issue's two ratios: (population, cohort) against (population, cohort), ragged storage, from the paired
    rows (:func:`paired`) where there are some."""
    out = []
    for target in spec["targets"]:
        pop, cohort, base_pop, base_cohort = target
        pair = [r for r in rows if r.get("paired") == list(target)] or [r for r in rows if not r.get("paired")]
        a, b = _find(pair, pop, cohort), _find(pair, base_pop, base_cohort)
        if a and b:
            out.append({"what": f"{pop:,} clients, cohort {cohort:,} vs {base_pop:,} clients, cohort {base_cohort:,}",
                        "ratio": a["client_steps_per_s"] / b["client_steps_per_s"], "target": 0.8})
    return out


def markdown(meta: dict, rows: list[dict], ratios: list[dict]) -> str:
    lines = [f"FedAvg, logistic regression on Synthetic(1,1) (client sizes ⌊lognormal(1, 1)⌋ + 11, at most 64), "
             f"{meta['local_steps']} local steps of batch {meta['batch_size']}, executor auto; median of "
             f"{meta['repeats']} timed rounds. {meta['cpu_count']} cores, {meta['backend']}, jax {meta['jax']}. "
             f"Command: `{meta['command']}`.", "",
             "| population | cohort | storage | executor | client-steps/s | round s | compile s | data GB | "
             "generate s | evaluate s | sampling s | peak RSS GB | load |", "|" + "---|" * 13]
    for r in rows:
        ev = f"{r['evaluate_seconds']:.1f}" if "evaluate_seconds" in r else ""
        draw = f"{r['sample_seconds']:.3f}" if "sample_seconds" in r else ""
        storage = r["storage"] + (" (paired)" if r.get("paired") else "")
        lines.append(f"| {r['population']:,} | {r['cohort']:,} | {storage} | {r['executor']} | "
                     f"{r['client_steps_per_s']:,.0f} | {r['round_seconds']:.3f} | {r['compile_seconds']:.1f} | "
                     f"{r['data_bytes'] / 1e9:.2f} | {r['generate_seconds']:.1f} | {ev} | {draw} | "
                     f"{r['peak_rss_bytes'] / 1e9:.2f} | {r['load_before']:.1f}–{r['load_after']:.1f} |")
    lines += ["", "Paired rows: a target's two configurations in one process, their timed rounds alternating (the same "
              "load for both); the targets' ratios come from them:", ""]
    lines += [f"* {t['what']}: {100 * t['ratio']:.0f} % (target ≥ {100 * t['target']:.0f} %)" for t in ratios]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    from matplotlib.figure import Figure

    from fljax.runner.files import write_png

    fig = Figure(figsize=(10, 4))
    speed, memory = fig.subplots(1, 2)
    for storage, style in (("ragged", "-o"), ("padded", "--s")):
        mine = [r for r in rows if r["storage"] == storage and not r.get("paired")]
        for label, pick in (("cohort 1e3", lambda r: r["cohort"] == min(x["cohort"] for x in rows)),
                            ("cohort 1e4", lambda r: r["cohort"] == sorted({x["cohort"] for x in rows})[1]
                             and r["cohort"] < r["population"]),
                            ("every client", lambda r: r["cohort"] == r["population"])):
            pts = sorted((r["population"], r["client_steps_per_s"]) for r in mine if pick(r))
            if pts:
                speed.plot(*zip(*pts), style, label=f"{label}, {storage}")
        peak = {}
        for r in mine:
            peak[r["population"]] = max(peak.get(r["population"], 0), r["peak_rss_bytes"] / 1e9)
        if peak:
            memory.plot(*zip(*sorted(peak.items())), style, label=storage)
    speed.set(xscale="log", xlabel="population (clients)", ylabel="client-steps/s", title="throughput")
    memory.set(xscale="log", xlabel="population (clients)", ylabel="peak RSS (GB)", title="memory")
    speed.legend(fontsize=7)
    memory.legend(fontsize=7)
    fig.tight_layout()
    write_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="populations of 200 and 2,000, 2 repeats (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--one", nargs=3, metavar=("POPULATION", "STORAGE", "COHORTS"), help=argparse.SUPPRESS)
    ap.add_argument("--pair", nargs=4, type=int, metavar=("POPULATION", "COHORT", "BASE_POPULATION", "BASE_COHORT"),
                    help="only one target's two configurations, rounds alternating in one process (prints JSON)")
    args = ap.parse_args(argv)
    if args.one:
        pop, storage, cohorts = int(args.one[0]), args.one[1], [int(c) for c in args.one[2].split(",")]
        print(json.dumps(measure(pop, storage, cohorts, args.repeats)))
        return 0
    if args.pair:
        print(json.dumps(paired(tuple(args.pair), args.repeats)))
        return 0
    spec = QUICK if args.quick else FULL
    repeats = 2 if args.quick else args.repeats
    import jax

    from fljax.runner.files import write_json, write_text

    rows = []
    jobs = [["--one", str(pop), storage, ",".join(map(str, cohorts))] for pop, storage, cohorts in configurations(spec)]
    jobs += [["--pair", *map(str, target)] for target in spec["targets"]]
    for job in jobs:
        cmd = [sys.executable, os.path.abspath(__file__), *job, "--repeats", str(repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAILED {' '.join(job)}: {out.stderr.strip()[-2000:]}", file=sys.stderr)
            return 1
        for row in json.loads(out.stdout.strip().splitlines()[-1]):
            rows.append(row)
            print(f"{row['population']:>9,} clients  cohort {row['cohort']:>7,}  {row['storage']:<6} "
                  f"{'paired ' if row.get('paired') else ''}"
                  f"{row['client_steps_per_s']:>10,.0f} client-steps/s  peak RSS {row['peak_rss_bytes'] / 1e9:.2f} GB",
                  file=sys.stderr)
    meta = {"command": " ".join(["python benchmarks/scale.py"] + (argv if argv is not None else sys.argv[1:])),
            "jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "local_steps": STEPS, "batch_size": BATCH, "repeats": repeats,
            "data": DATA, "date": time.strftime("%Y-%m-%d")}
    ratios = targets(rows, spec)
    name = "scale_quick" if args.quick else "scale"
    md = markdown(meta, rows, ratios)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, name + ".json"), {"meta": meta, "rows": rows, "targets": ratios})
    write_text(os.path.join(args.out, name + ".md"), md)
    plot(rows, os.path.join(args.out, name + ".png"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
