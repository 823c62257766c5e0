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

Client state off the device (issue 38, ``--store``): Ditto (a personal model per client, :mod:`fljax.engine.store`)
on the same data with logistic regression and a small MLP (hidden [32]), cohort 1,000, blocks of 5 rounds: 10⁶
clients with their state on disk against 10⁴ clients with their state on the device. Each configuration runs in its
own process (``--store-one``) for its memory: the peak RSS of the run itself (the kernel's high-water mark reset
once the data are loaded: what the run adds to them), the RSS of the data, the store's disk bytes (allocated
blocks) and the time to create the population (the data, then the store and the server's state); the throughput
ratio comes from the two configurations in one process, their blocks alternating (``--store-pair``: the same load
for both). Targets: ≥ 50 % of the device run's client-steps/s; the run's own memory bounded by the cohort (< 4 GB).

    python benchmarks/scale.py --store         # -> benchmarks/results/scale_store.{json,md}
    python benchmarks/scale.py --store --quick # 20,000 against 2,000 clients, cohort 200 (-> scale_store_quick.*)
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


# ------------------------------------------------------------------------------------------ client state off the device

STORE = dict(population=1_000_000, base=10_000, cohort=1_000, block=5, hidden=[32])
STORE_QUICK = dict(population=20_000, base=2_000, cohort=200, block=5, hidden=[32])
STORE_MODELS = ("logreg", "mlp")
TURN = 3  # blocks timed together (the store's pipeline at work), its last writes included


def _vm_rss() -> int:
    """The process's resident bytes now (VmRSS)."""
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024


def _vm_peak() -> int:
    """The process's resident high-water mark (VmHWM) since the last :func:`_reset_peak`."""
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets the peak RSS
        f.write("5")


def _ditto(data, model_name: str, cohort: int, kind: str, spec: dict, store_dir: str | None):
    """(simulation, seconds to create its store and initial state, initial state)."""
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model

    model = make_model(model_name, data.input_shape, data.num_classes,
                       **({"hidden": spec["hidden"]} if model_name == "mlp" else {}))
    algo = make_algorithm("ditto", lr=0.01, cohort_size=cohort, local_steps=STEPS, batch_size=BATCH)
    sim = Simulation(algo, data, model, executor="auto", seed=0, state_store=kind, store_dir=store_dir)
    t0 = time.perf_counter()
    state = sim.init()
    import jax

    jax.block_until_ready(state.server)
    return sim, time.perf_counter() - t0, state


def _steps(sim, cohort: int) -> int:
    """Client-steps of a round: the cohort's local steps (global and personal models)."""
    return cohort * sim.algorithm.steps_per_round(sim.data.train.n_max)


def _turn(sim, state, n: int, count: int):
    """(state, seconds per round) of ``count`` consecutive blocks of ``n`` rounds (the store reads the next block
    while one runs and writes it back behind it), the store's last writes included."""
    import jax

    t0 = time.perf_counter()
    for _ in range(count):
        state, _ = sim.run_rounds(state, n)
    jax.block_until_ready(state.server)
    if sim.store_engine is not None:
        state.clients.store.drain()
    return state, (time.perf_counter() - t0) / (count * n)


def _disk_bytes(path: str | None) -> int:
    if path is None or not os.path.isdir(path):
        return 0
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(path) for f in fs)


def store_one(population: int, kind: str, model_name: str, spec: dict, repeats: int, store_root: str) -> dict:
    """One configuration in this process: creation, throughput, memory, disk, one streamed evaluation."""
    import shutil
    import tempfile

    import jax

    rss0 = _vm_rss()
    data, gen, data_bytes = _data(population, "ragged")
    rss_data = _vm_rss()
    _reset_peak()
    root = tempfile.mkdtemp(prefix="fljax-scale-store-", dir=store_root) if kind == "disk" else None
    try:
        sim, create, state = _ditto(data, model_name, spec["cohort"], kind, spec, root)
        load = os.getloadavg()[0]
        state, _ = _turn(sim, state, spec["block"], 1)  # compiles
        times = []
        for _ in range(repeats):
            state, t = _turn(sim, state, spec["block"], TURN)
            times.append(t)
        train_peak = _vm_peak()
        _reset_peak()
        t0 = time.perf_counter()
        jax.block_until_ready(sim.evaluate(state))
        evaluate = time.perf_counter() - t0
        evaluate_peak = _vm_peak()
        per_round = float(np.median(times))
        row = {"population": population, "state_store": kind, "model": model_name, "cohort": spec["cohort"],
               "block": spec["block"], "round_seconds": per_round, "turn_round_seconds": times,
               "client_steps_per_s": _steps(sim, spec["cohort"]) / per_round, "executor": sim.executor.describe(),
               "compile_seconds": sim.compile_seconds, "generate_seconds": gen, "create_seconds": create,
               "evaluate_seconds": evaluate, "data_bytes": data_bytes, "rss_before_data": rss0,
               "rss_with_data": rss_data, "train_peak_rss": train_peak, "evaluate_peak_rss": evaluate_peak,
               "process_peak_rss": _rss(),
               "state_bytes": int(sim.data.num_clients * (state.clients.store.row_bytes if kind != "device" else
                                                          0)) or int(sum(x.nbytes for x in
                                                                         jax.tree.leaves(state.clients))),
               "disk_bytes": _disk_bytes(root), "load_before": load, "load_after": os.getloadavg()[0],
               "io_wait_seconds": getattr(sim.store_engine, "io_seconds", 0.0), "repeats": repeats}
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return row


def store_pair(model_name: str, spec: dict, repeats: int, store_root: str) -> list[dict]:
    """The disk run of ``spec['population']`` clients and the device run of ``spec['base']`` in one process, their
    timed blocks alternating: the fair throughput ratio."""
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="fljax-scale-store-", dir=store_root)
    try:
        runs = []
        for population, kind in ((spec["population"], "disk"), (spec["base"], "device")):
            data, _, _ = _data(population, "ragged")
            sim, _, state = _ditto(data, model_name, spec["cohort"], kind, spec, root if kind == "disk" else None)
            state, _ = _turn(sim, state, spec["block"], 1)  # compiles
            runs.append([population, kind, sim, state, []])
        load = os.getloadavg()[0]
        for _ in range(repeats):
            for run in runs:
                run[3], t = _turn(run[2], run[3], spec["block"], TURN)
                run[4].append(t)
        out = []
        for population, kind, sim, _, times in runs:
            per_round = float(np.median(times))
            out.append({"population": population, "state_store": kind, "model": model_name, "paired": True,
                        "cohort": spec["cohort"], "block": spec["block"], "round_seconds": per_round,
                        "turn_round_seconds": times, "client_steps_per_s": _steps(sim, spec["cohort"]) / per_round,
                        "executor": sim.executor.describe(), "load_before": load,
                        "load_after": os.getloadavg()[0], "repeats": repeats})
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def store_markdown(meta: dict, rows: list[dict]) -> str:
    spec = meta["spec"]
    lines = [f"Ditto on Synthetic(1,1) (client sizes ⌊lognormal(1, 1)⌋ + 11, at most 64), {STEPS} local steps of batch "
             f"{BATCH} plus one personal epoch, cohort {spec['cohort']:,}, blocks of {spec['block']} rounds, executor "
             f"auto: {spec['population']:,} clients with their state on disk (`state_store: disk`) against "
             f"{spec['base']:,} with their state on the device. {meta['cpu_count']} cores, {meta['backend']}, jax "
             f"{meta['jax']}, {meta['date']}. Command: `{meta['command']}`.", "",
             f"Each configuration alone in its process (the median over {meta['repeats']} turns of {TURN} consecutive "
             "blocks, each turn's time including the store's last writes):", "",
             "| model | clients | state | client-steps/s | round s | create population s (data + store) | "
             "evaluate s | data GB | data RSS GB | peak RSS GB, training | peak RSS GB, evaluation | state GB | "
             "disk GB | load |",
             "|" + "---|" * 14]
    for r in rows:
        if r.get("paired"):
            continue
        lines.append(f"| {r['model']} | {r['population']:,} | {r['state_store']} | {r['client_steps_per_s']:,.0f} | "
                     f"{r['round_seconds']:.3f} | {r['generate_seconds'] + r['create_seconds']:.1f} "
                     f"({r['generate_seconds']:.1f} + {r['create_seconds']:.1f}) | {r['evaluate_seconds']:.1f} | "
                     f"{r['data_bytes'] / 1e9:.2f} | {(r['rss_with_data'] - r['rss_before_data']) / 1e9:.2f} | "
                     f"{r['train_peak_rss'] / 1e9:.2f} | {r['evaluate_peak_rss'] / 1e9:.2f} | "
                     f"{r['state_bytes'] / 1e9:.2f} | {r['disk_bytes'] / 1e9:.2f} | "
                     f"{r['load_before']:.1f}–{r['load_after']:.1f} |")
    lines += ["", "`data RSS GB`: what loading the data added to the process; `peak RSS GB`: the process's peak from "
              "the data loaded to the last timed block (training) and during one evaluation of every client "
              "(evaluation), the data included (what the run needs beyond them is the difference); `create "
              "population s`: generating the data, then the store (its files reserved) and the initial state "
              "(compiling included); `state GB`: the clients' state (on the device, or in the store); `disk GB`: the "
              "store's allocated blocks.",
              "", "Paired (both configurations in one process, their blocks alternating: the same load for both):",
              ""]
    for model in STORE_MODELS:
        pair = {r["state_store"]: r for r in rows if r.get("paired") and r["model"] == model}
        if "disk" in pair and "device" in pair:
            ratio = pair["disk"]["client_steps_per_s"] / pair["device"]["client_steps_per_s"]
            lines.append(f"* {model}: {pair['disk']['client_steps_per_s']:,.0f} client-steps/s with "
                         f"{spec['population']:,} clients on disk against {pair['device']['client_steps_per_s']:,.0f} "
                         f"with {spec['base']:,} on the device: {100 * ratio:.0f} % (target ≥ 50 %)")
    return "\n".join(lines) + "\n"


def store_main(args, argv) -> int:
    import jax

    from fljax.runner.files import write_json, write_text

    spec = STORE_QUICK if args.quick else STORE
    rows = []
    jobs = [["--store-one", str(pop), kind, model] for model in STORE_MODELS
            for pop, kind in ((spec["population"], "disk"), (spec["base"], "device"))]
    jobs += [["--store-pair", model] for model in STORE_MODELS]
    for job in jobs:
        cmd = [sys.executable, os.path.abspath(__file__), *job, "--repeats", str(args.repeats)] + \
            (["--quick"] if args.quick else []) + (["--store-dir", args.store_dir] if args.store_dir else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAILED {' '.join(job)}: {out.stderr.strip()[-2000:]}", file=sys.stderr)
            return 1
        for row in json.loads(out.stdout.strip().splitlines()[-1]):
            rows.append(row)
            print(f"{row['model']:>6} {row['population']:>9,} clients  {row['state_store']:<6} "
                  f"{'paired ' if row.get('paired') else ''}{row['client_steps_per_s']:>10,.0f} client-steps/s"
                  + (f"  peak RSS {row['train_peak_rss'] / 1e9:.2f} GB" if "train_peak_rss" in row else ""),
                  file=sys.stderr)
    meta = {"command": " ".join(["python benchmarks/scale.py"] + (argv if argv is not None else sys.argv[1:])),
            "jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "local_steps": STEPS, "batch_size": BATCH, "repeats": args.repeats,
            "data": DATA, "spec": spec, "date": time.strftime("%Y-%m-%d")}
    name = "scale_store_quick" if args.quick else "scale_store"
    md = store_markdown(meta, rows)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, name + ".json"), {"meta": meta, "rows": rows})
    write_text(os.path.join(args.out, name + ".md"), md)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="populations of 200 and 2,000, 2 repeats (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--one", nargs=3, metavar=("POPULATION", "STORAGE", "COHORTS"), help=argparse.SUPPRESS)
    ap.add_argument("--pair", nargs=4, type=int, metavar=("POPULATION", "COHORT", "BASE_POPULATION", "BASE_COHORT"),
                    help="only one target's two configurations, rounds alternating in one process (prints JSON)")
    ap.add_argument("--store", action="store_true", help="Ditto with its clients' state on disk (issue 38)")
    ap.add_argument("--store-dir", default=None, help="where the disk stores are written (default: the temporary "
                                                      "directory); removed afterwards")
    ap.add_argument("--store-one", nargs=3, metavar=("POPULATION", "STORE", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--store-pair", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.store_one:
        spec = STORE_QUICK if args.quick else STORE
        print(json.dumps([store_one(int(args.store_one[0]), args.store_one[1], args.store_one[2], spec,
                                    args.repeats, args.store_dir)]))
        return 0
    if args.store_pair:
        spec = STORE_QUICK if args.quick else STORE
        print(json.dumps(store_pair(args.store_pair, spec, args.repeats, args.store_dir)))
        return 0
    if args.store:
        return store_main(args, argv)
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
