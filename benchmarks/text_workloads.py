"""Throughput of FedAvg rounds on the text workloads: the Shakespeare character LSTM and the Stack Overflow word LSTM
(Reddi et al. 2021's models) on their offline stand-ins (fljax.data.standins: the real sets' shapes and client sizes,
synthetic text), at cohorts of 10, 50 and 500 clients.

Every cohort member runs ``local_steps`` SGD steps of the workload's batch (Shakespeare 4 sequences of 80
characters, Stack Overflow 16 sentences of 20 words), so a round is cohort × local_steps client-steps; tokens/s
counts the non-padding target tokens those steps train on (the stand-in's share of real tokens per row, measured on
its training rows). Times: after a warm-up block (which compiles the program of ``rounds`` rounds), the median over
``repeats`` timed blocks of ``rounds`` rounds. Each row runs in its own process.

    python benchmarks/text_workloads.py             # CPU rows -> benchmarks/results/text_workloads.{json,md}
    python benchmarks/text_workloads.py --dry-run   # toy sizes, any backend, seconds -> text_workloads_dry_run.*

For another script (benchmarks/gpu.py): ``text_workloads.measure(spec)`` measures one row in the calling process and
returns its dict; ``spec`` = ``{"workload": "shakespeare-lstm" | "stackoverflow-lstm", "cohort": K}`` plus,
optionally, ``local_steps`` (default 2; the CPU table runs 1) or ``local_epochs`` (the published setting: each member
runs its own ceil(n_i / batch) steps per epoch; client-steps then count the expected number per round), ``lr`` (0.1),
``data`` (more stand-in keys, e.g. ``test_fraction``), ``rounds`` (1), ``repeats`` (1), ``executor`` ("auto"),
``chunk_size`` (None), ``population`` (the stand-in's clients; default max(cohort, 100), at most 715 for
Shakespeare) and ``dry`` (toy model and data). ``text_workloads.ROWS`` lists the CPU table's specs,
``text_workloads.measure_all(specs)`` runs each in its own process, ``text_workloads.markdown(meta, rows)`` renders
rows (``meta``: command, jax, backend, devices, cpu_count, date, dry_run).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine import time_rounds  # noqa: E402  (benchmarks/machine.py)

WORKLOADS = {
    "shakespeare-lstm": dict(dataset="shakespeare", data={"source": "standin", "seq_len": 80}, batch=4,
                             model={"embed": 8, "hidden": [256, 256]}, title="Shakespeare character LSTM "
                             "(8-d embedding, 2 x 256 LSTM, 90 symbols), batches of 4 x 80"),
    "stackoverflow-lstm": dict(dataset="stackoverflow",
                               data={"source": "standin", "seq_len": 20, "vocab": 10_000, "max_samples": 1_000},
                               batch=16, model={"embed": 96, "hidden": [670], "projection": 96},
                               title="Stack Overflow word LSTM (96-d embedding, LSTM 670, 96-d projection, 10,004 "
                                     "symbols), batches of 16 x 20"),
}
DRY = {"shakespeare-lstm": dict(data={"max_samples": 8}, model={"embed": 4, "hidden": [8]}),
       "stackoverflow-lstm": dict(data={"vocab": 50, "max_samples": 8}, model={"embed": 4, "hidden": [8],
                                                                                "projection": 4})}
COHORTS = (10, 50, 500)
ROWS = [{"workload": w, "cohort": k, "local_steps": 1} for w in WORKLOADS for k in COHORTS]  # the CPU table
SHAKESPEARE_SPEAKERS = 715


def _setup(spec: dict):
    """(data, model, algorithm) of a spec."""
    import fljax.data as D
    from fljax.algorithms import make_algorithm
    from fljax.models import make_model

    work = WORKLOADS[spec["workload"]]
    dry = DRY[spec["workload"]] if spec.get("dry") else {}
    population = spec.get("population") or max(spec["cohort"], 100)
    if spec["workload"] == "shakespeare-lstm":
        population = min(population, SHAKESPEARE_SPEAKERS)
    data = D.make_federated(work["dataset"], population, seed=0,
                            **{**work["data"], **spec.get("data", {}), **dry.get("data", {})})
    model = make_model("lstm", data.input_shape, data.num_classes, **{**work["model"], **dry.get("model", {})})
    local = ({"local_epochs": spec["local_epochs"]} if spec.get("local_epochs")
             else {"local_steps": spec.get("local_steps", 2)})
    algo = make_algorithm("fedavg", lr=spec.get("lr", 0.1), cohort_size=spec["cohort"], batch_size=work["batch"],
                          **local)
    return data, model, algo


def measure(spec: dict) -> dict:
    """One row (module docstring): client-steps/s, token positions/s and real tokens/s of FedAvg rounds."""
    from fljax.engine import Simulation

    data, model, algo = _setup(spec)
    sim = Simulation(algo, data, model, executor=spec.get("executor", "auto"), chunk_size=spec.get("chunk_size"),
                     seed=0)
    rounds, repeats = spec.get("rounds", 1), spec.get("repeats", 1)
    state = sim.init()
    state, first, per_round = time_rounds(sim, state, rounds, repeats)  # the warm-up block compiles
    if spec.get("local_epochs"):  # each member runs ceil(n_i / batch) steps per epoch: the expected count
        steps = _epoch_steps(data, spec)
    else:
        steps = spec["cohort"] * spec.get("local_steps", 2)
    batch, seq = WORKLOADS[spec["workload"]]["batch"], data.input_shape[0]
    mask = np.asarray(data.train.mask)
    real = float((np.asarray(data.train.y)[mask] != 0).mean())  # non-padding share of a training row's targets
    return {"workload": spec["workload"], "cohort": spec["cohort"], "population": data.num_clients,
            "data": data.name, "executor": sim.executor.describe(),
            "local_steps": f"{spec['local_epochs']} epoch" if spec.get("local_epochs") else spec.get("local_steps", 2),
            "batch": batch, "seq_len": seq, "params": model.num_params(), "round_seconds": per_round,
            "client_steps_per_s": steps / per_round, "token_positions_per_s": steps * batch * seq / per_round,
            "tokens_per_s": steps * batch * seq * real / per_round, "real_token_share": real,
            "first_round_seconds": first, "compile_seconds": sim.compile_seconds, "rounds": rounds,
            "repeats": repeats, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "dry": bool(spec.get("dry"))}


def _epoch_steps(data, spec: dict) -> float:
    """Expected client-steps per round of ``spec['local_epochs']`` local epochs: cohort × epochs × the population's
    mean ceil(n_i / batch) (cohorts are drawn uniformly; each member runs only its own active steps)."""
    batch, counts = WORKLOADS[spec["workload"]]["batch"], np.asarray(data.train.count)
    return float(spec["cohort"] * spec["local_epochs"] * np.ceil(counts / batch).mean())


def measure_all(specs: list[dict]) -> list[dict]:
    """:func:`measure` each spec in its own process; a failed one is reported on stderr and left out."""
    rows = []
    for spec in specs:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAILED {spec}: {out.stderr.strip().splitlines()[-1] if out.stderr else ''}", file=sys.stderr)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['workload']:<20} cohort {row['cohort']:>4}  {row['client_steps_per_s']:>8.1f} client-steps/s "
              f"{row['tokens_per_s']:>10,.0f} tokens/s  ({row['executor']})", file=sys.stderr)
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    """One table per workload, a row per cohort."""
    lines = [f"FedAvg rounds on the text stand-ins{' (dry run: toy models and data)' if meta['dry_run'] else ''}: "
             f"every cohort member runs the row's local steps; median of the timed blocks after a warm-up round. "
             f"Backend {meta['backend']} ({meta['cpu_count']} cores, {meta['devices']}), jax {meta['jax']}, "
             f"{meta['date']}; load average at the end {meta['load_average'][0]:.1f} (other processes share the "
             f"machine). Peak RSS includes the stacked uploads of the whole cohort (cohort × parameters × 4 bytes). "
             f"Command: `{meta['command']}`."]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == workload]
        lines += ["", f"**{WORKLOADS[workload]['title']}** (`{workload}`, data {rs[0]['data']}, "
                      f"{rs[0]['params']:,} parameters; {100 * rs[0]['real_token_share']:.0f}% of target positions "
                      f"are real tokens)", "",
                  "| cohort | population | executor | local steps | round s | client-steps/s | tokens/s | "
                  "token positions/s | first round s (with compile) | peak RSS MB |", "|" + "---|" * 10]
        for r in rs:
            lines.append(f"| {r['cohort']} | {r['population']} | {r['executor']} | {r['local_steps']} | "
                         f"{r['round_seconds']:.2f} | {r['client_steps_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['token_positions_per_s']:,.0f} | {r['first_round_seconds']:.1f} | "
                         f"{r['peak_rss_bytes'] / 1e6:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="toy models and data at the three cohorts, seconds")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a JSON spec: measure it in this process, print the row
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return
    import jax

    from fljax.runner.files import write_json, write_text

    specs = [dict(s, dry=True, population=s["cohort"]) if args.dry_run else s for s in ROWS]
    rows = measure_all(specs)
    meta = {"command": "python benchmarks/text_workloads.py" + (" --dry-run" if args.dry_run else ""),
            "jax": jax.__version__, "backend": jax.default_backend(), "devices": str(jax.devices()[0]),
            "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "dry_run": args.dry_run,
            "load_average": os.getloadavg()}
    name = os.path.join(args.out, "text_workloads_dry_run" if args.dry_run else "text_workloads")
    md = markdown(meta, rows)
    write_json(name + ".json", {"meta": meta, "rows": rows})
    write_text(name + ".md", md)
    print(md)


if __name__ == "__main__":
    main()
