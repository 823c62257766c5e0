"""Asynchrony's cost, measured: FedBuff with 1,000 clients in flight and a buffer of 100 (Nguyen et al. 2022) against
synchronous FedAvg with cohorts of 100 — both train 100 clients a round (a server step) with the same local work, so
client-steps per second compare what asynchrony's bookkeeping costs (goal: at most 20 % per client-step) — and
against the plain event loop that FLSim and FedScale run (a heap of arrival times, one client at a time, each client
trained as it is dispatched: ``tests/test_asynchrony.py``'s reference, which gives the same events and numbers): how
much faster fljax simulates the same events.

Workloads: Synthetic(1,1)-shaped clients (60 features, 10 classes; 20–50 samples each) with multinomial logistic
regression and an MLP 60-64-10; 10 local steps of batch 10; devices of log-normal speed (the participation's
``speed: synthetic``). fljax: steady seconds per round, ``--rounds`` rounds as one compiled block (median of
``--repeats``, timed in turn with the other rows); the event loop: seconds per server step over ``--loop-steps``
steps after its start (the first C dispatches are not timed). Writes ``results/asynchrony.{json,md}``.

    python benchmarks/asynchrony.py                    # CPU: 2,000 clients, C = 1,000, K = 100
    python benchmarks/asynchrony.py --dry-run          # seconds: toy sizes
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

WORKLOADS = {"logreg": ("logreg", {}), "mlp": ("mlp", {"hidden": [64]})}


def measure(clients: int, concurrency: int, buffer: int, rounds: int, repeats: int, loop_steps: int,
            workloads=("logreg", "mlp"), command: str = "", dry_run: bool = False) -> dict:
    """The rows (module docstring) and the meta of one measurement: nothing is written."""
    import jax

    import fljax.data as D
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model
    from fljax.participation import Uniform
    from machine import interleaved_medians
    from test_asynchrony import EventLoop

    data = D.make_federated("synthetic", num_clients=clients, seed=0, min_samples=20, max_samples=50)
    local = dict(lr=0.05, batch_size=10, local_steps=10)
    participation = Uniform(speed="synthetic")
    k, steps = buffer, local["local_steps"]
    rows = []
    for workload in workloads:
        name, options = WORKLOADS[workload]
        model = make_model(name, data.input_shape, data.num_classes, **options)
        sims = {"FedAvg, cohort of K": Simulation(make_algorithm("fedavg", cohort_size=k, **local), data, model,
                                                  executor="vmap", participation=participation),
                "FedBuff, C in flight, buffer K": Simulation(
                    make_algorithm("fedbuff", concurrency=concurrency, buffer_size=k, **local), data, model,
                    executor="vmap", participation=participation)}
        states = {label: sim.init() for label, sim in sims.items()}
        t0 = time.perf_counter()
        for label, sim in sims.items():  # compile the blocks once
            jax.block_until_ready(sim.run_rounds(states[label], rounds))
        compile_s = time.perf_counter() - t0
        seconds = interleaved_medians({label: (lambda s=sim, st=states[label]: s.run_rounds(st, rounds)[0])
                                       for label, sim in sims.items()}, repeats)
        for label, s in seconds.items():
            per_round = s / rounds
            rows.append({"workload": workload, "what": label, "seconds_per_round": per_round,
                         "client_steps_per_second": k * steps / per_round})
        loop = EventLoop(sims["FedBuff, C in flight, buffer K"])
        loop.step()  # its jitted client call compiles here
        t0 = time.perf_counter()
        for _ in range(loop_steps):
            loop.step()
        per_step = (time.perf_counter() - t0) / loop_steps
        rows.append({"workload": workload, "what": "FedBuff, the event loop (one client at a time)",
                     "seconds_per_round": per_step, "client_steps_per_second": k * steps / per_step})
        sync, buff, ref = rows[-3:]
        sync["compile_seconds_both"] = compile_s
        buff["cost_per_client_step"] = sync["client_steps_per_second"] / buff["client_steps_per_second"] - 1
        buff["faster_than_event_loop"] = ref["seconds_per_round"] / buff["seconds_per_round"]
        print(rows[-3:], file=sys.stderr)
    meta = {"command": command, "jax": jax.__version__, "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind), "cpu_count": os.cpu_count(), "clients": clients,
            "concurrency": concurrency, "buffer": k, "local_steps": steps, "rounds": rounds, "repeats": repeats,
            "loop_steps": loop_steps, "load_average": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d"),
            "dry_run": dry_run}
    return {"meta": meta, "rows": rows}


def render(result: dict, heading: str = "#") -> list[str]:
    """The Markdown of :func:`measure`'s result."""
    meta, rows = result["meta"], result["rows"]
    lines = [f"{heading} Asynchrony's cost ({meta['backend']}: {meta['device']}, {meta['cpu_count']} cores, load "
             f"average {meta['load_average']:.1f} at the end, jax {meta['jax']}{', dry run' if meta['dry_run'] else ''})",
             "", f"{meta['clients']:,} Synthetic(1,1)-shaped clients; every round (server step) trains K = "
             f"{meta['buffer']} clients for {meta['local_steps']} local steps of batch 10. FedBuff keeps C = "
             f"{meta['concurrency']:,} in flight; FedAvg's cohort is K. fljax: median of {meta['repeats']} blocks of "
             f"{meta['rounds']} rounds; the event loop: {meta['loop_steps']} server steps after its start. Command: "
             f"`{meta['command']}`; {meta['date']}.", "",
             "| workload | simulation | s per round | client-steps/s | FedBuff's cost per client-step | "
             "fljax FedBuff vs the event loop |", "|---|---|---|---|---|---|"]
    for r in rows:
        cost = f"{100 * r['cost_per_client_step']:+.0f} %" if "cost_per_client_step" in r else ""
        faster = f"{r['faster_than_event_loop']:,.0f}× faster" if "faster_than_event_loop" in r else ""
        lines.append(f"| {r['workload']} | {r['what']} | {r['seconds_per_round']:.4f} | "
                     f"{r['client_steps_per_second']:,.0f} | {cost} | {faster} |")
    goal = [r for r in rows if "cost_per_client_step" in r]
    return lines + ["", "Goal: asynchrony costs at most 20 % per client-step against synchronous FedAvg: "
                    + "; ".join(f"{r['workload']} {100 * r['cost_per_client_step']:+.0f} % "
                                f"({'met' if r['cost_per_client_step'] <= 0.2 else 'not met'})" for r in goal) + "."]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--buffer", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-steps", type=int, default=2)
    ap.add_argument("--workloads", default="logreg,mlp")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes: 60 clients, C = 20, K = 5, 2 rounds")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.dry_run:
        args.clients, args.concurrency, args.buffer, args.rounds, args.repeats, args.loop_steps = 60, 20, 5, 2, 1, 1
    from fljax.runner.files import write_json, write_text

    command = " ".join(["python benchmarks/asynchrony.py"] + (argv if argv is not None else sys.argv[1:]))
    result = measure(args.clients, args.concurrency, args.buffer, args.rounds, args.repeats, args.loop_steps,
                     tuple(args.workloads.split(",")), command, args.dry_run)
    stem = "asynchrony_dry_run" if args.dry_run else "asynchrony"
    write_json(os.path.join(args.out, f"{stem}.json"), result)
    lines = render(result)
    write_text(os.path.join(args.out, f"{stem}.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
