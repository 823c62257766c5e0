"""Host memory of FedJAX's EMNIST-shaped evaluation on the CPU: where the resident memory goes, against the plan.

The population is FedJAX's EMNIST-62 federated shape (``small_cohorts.population``: log-normal client sizes with
EMNIST's means of 197.5 training and 22.8 test images of 28×28×1 per client, 62 classes, ragged storage; synthetic
pixels, since tensorflow-datasets' EMNIST is not downloaded here), the first ``--clients`` of 3,400 clients, and
FedAvg with FedJAX's ``cnn1_s`` on the ``vmap`` executor (the CPU's convolution form for it: ``patches``). Each
configuration runs in a process of its own, which builds the data, initialises the model and evaluates every
client twice (the first compiles), and reports its resident memory (VmRSS, sampled every 20 ms by a thread, and the
kernel's ``ru_maxrss``) after each phase, with the memory plan of the evaluation program: its budget, the clients
it runs side by side, the estimated bytes of one client's temporaries and XLA's own count of the program's
temporaries. A watchdog ends a process whose resident memory passes ``--rss-limit`` GiB (this machine is shared).

    python benchmarks/host_memory.py                                   # the whole population, default budget
    python benchmarks/host_memory.py --clients 340 --budgets 0.125,0.25,0.5,1   # how memory follows the budget

Writes ``results/host_memory.{json,md}`` (``--tag`` names another pair).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def one(clients: int, budget: float | None, train_scale: float, rss_limit: float, conv_impl: str = "auto",
        resident: float | None = None) -> dict:
    """One configuration in this process: the resident memory after each phase and the evaluation's plan."""
    peak, current = [0], ["data"]

    def watch():
        while True:
            rss = _rss()
            peak[0] = max(peak[0], rss)
            if rss > rss_limit * 2 ** 30:
                print(json.dumps({"killed": f"resident memory above {rss_limit} GiB in phase '{current[0]}'"}),
                      flush=True)
                os._exit(99)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    import jax
    import numpy as np

    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation, budget as plan_module
    from fljax.models import make_model
    from small_cohorts import population

    if resident is not None:  # 1.0: the plan before the CPU's resident factor (issue 41)
        plan_module.CPU_RESIDENT = resident
    phases = {}

    def mark(name, t0):
        """The phase since ``t0``: its seconds, the resident memory at its end and at its peak (the sampler's peak
        restarts with every phase; ``maxrss_gib``, the kernel's, is the process's so far)."""
        phases[name] = {"seconds": time.perf_counter() - t0, "rss_gib": _rss() / 2 ** 30, "peak_gib": peak[0] / 2 ** 30,
                        "maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}
        peak[0] = _rss()
        current[0] = next_phase.get(name, "")

    next_phase = {"start": "data", "data": "init", "init": "evaluate", "evaluate": "evaluate again"}
    mark("start", time.perf_counter())
    t0 = time.perf_counter()
    data = population(clients, 1.0)
    if train_scale != 1.0:  # fewer training images (evaluation reads the test split); the test split as EMNIST's
        train = population(clients, train_scale)
        data = data.replace(train=train.train)
    jax.block_until_ready(data)
    mark("data", t0)
    algo = make_algorithm("fedavg", cohort_size=10, local_epochs=1, local_steps=None, batch_size=20, lr=0.1)
    sim = Simulation(algo, data, make_model("cnn1_s", data.input_shape, data.num_classes), executor="vmap",
                     memory_budget=budget, conv_impl=conv_impl)
    t0 = time.perf_counter()
    state = jax.block_until_ready(sim.init())
    mark("init", t0)
    for phase in ("evaluate", "evaluate again"):
        t0 = time.perf_counter()
        jax.block_until_ready(sim.evaluate(state))
        mark(phase, t0)
    plan = sim.memory_plans["evaluate", ()]
    (m,) = plan["maps"]
    return {"clients": clients, "test_images": int(np.asarray(data.test.count).sum()),
            "train_images": int(np.asarray(data.train.count).sum()), "test_n_max": int(data.test.n_max),
            "budget_gib": plan["budget_bytes"] / 2 ** 30, "budget": plan["budget"],
            "side_by_side": m["side_by_side"], "per_client_mib": m["per_client_bytes"] / 2 ** 20,
            "xla_temp_gib": (plan["xla_temp_bytes"] or 0) / 2 ** 30, "conv_impl": sim.model.conv_impl,
            "phases": phases}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=3400)
    p.add_argument("--budgets", default="default", help="memory_budget values in GiB, comma-separated ('default': "
                                                         "the plan's own)")
    p.add_argument("--train-scale", type=float, default=1.0, help="training images per client × this")
    p.add_argument("--rss-limit", type=float, default=7.0, help="GiB of resident memory a configuration may reach")
    p.add_argument("--conv-impl", default="auto", help="the convolutions' form (auto: the CPU's choice, patches)")
    p.add_argument("--resident-factors", default="plan", help="comma-separated values of fljax.engine.budget."
                   "CPU_RESIDENT to run each budget with ('plan': the library's; 1: the plan before issue 41)")
    p.add_argument("--tag", default="host_memory")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        budget = None if args.one == "default" else float(args.one)
        factor = None if args.resident_factors == "plan" else float(args.resident_factors)
        print(json.dumps(one(args.clients, budget, args.train_scale, args.rss_limit, args.conv_impl, factor)),
              flush=True)
        return
    rows = []
    for factor in args.resident_factors.split(","):
        for budget in args.budgets.split(","):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", budget, "--clients",
                                  str(args.clients), "--train-scale", str(args.train_scale), "--rss-limit",
                                  str(args.rss_limit), "--conv-impl", args.conv_impl, "--resident-factors", factor],
                                 capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"error": out.stderr.strip().splitlines()[-1:]}
            row.update(asked=budget, resident_factor=factor, wall_seconds=time.perf_counter() - t0,
                       returncode=out.returncode)
            rows.append(row)
            print(json.dumps(row), flush=True)
    load = os.getloadavg()[0]
    record = {"command": "python benchmarks/host_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "load_average": load, "rows": rows}
    with open(os.path.join(HERE, "results", f"{args.tag}.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(HERE, "results", f"{args.tag}.md"), "w") as f:
        f.write(render(record))


def render(record: dict) -> str:
    lines = ["# Host memory of the EMNIST-shaped evaluation (CPU)", "",
             f"`{record['command']}` ({record['date']}, load average {record['load_average']:.1f}). Resident memory "
             f"(GiB) at its peak in each phase, sampled every 20 ms; 'per client' is the peak of the second "
             f"evaluation above the resident memory after initialisation, per client run side by side; 'factor' is "
             f"fljax.engine.budget.CPU_RESIDENT (1: the plan before issue 41).", "",
             "| factor | budget GiB | clients | side by side | estimate MiB/client | XLA temp GiB | data | init | "
             "evaluate | evaluate again | per client MiB | evaluate s |", "|---" * 12 + "|"]
    for r in record["rows"]:
        if "phases" not in r:
            why = r.get("killed") or r.get("error")
            lines.append(f"| {r['resident_factor']} | {r['asked']} | | | | | {why} | | | | | |")
            continue
        ph = r["phases"]
        per = (ph["evaluate again"]["peak_gib"] - ph["init"]["rss_gib"]) * 1024 / r["side_by_side"]
        lines.append(f"| {r['resident_factor']} | {r['budget_gib']:.3g} | {r['clients']:,} | {r['side_by_side']} | "
                     f"{r['per_client_mib']:.1f} | {r['xla_temp_gib']:.3f} | {ph['data']['peak_gib']:.2f} | "
                     f"{ph['init']['peak_gib']:.2f} | {ph['evaluate']['peak_gib']:.2f} | "
                     f"{ph['evaluate again']['peak_gib']:.2f} | {per:.1f} | {ph['evaluate again']['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
