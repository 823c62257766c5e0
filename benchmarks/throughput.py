"""FedAvg round throughput per workload and executor.

Workloads (engine issue): logistic regression on Synthetic(1,1) with 1,000 and 10,000 clients, and the MLP and CNN1
on 28×28×1 inputs with 64 clients; every client participates, 10 local SGD steps of batch 20 per round.
For each executor (and, for CNN1, each convolution implementation and scan unroll) it reports client-steps/s,
samples/s, achieved FLOP/s as a fraction of this machine's measured float32 matmul peak, compile seconds and peak
memory (the XLA program's own estimate and the process's peak RSS). Each configuration runs in its own process;
times are medians over ``--repeats`` timed blocks of rounds after a warm-up.

    python benchmarks/throughput.py                 # full table -> benchmarks/results/throughput.{json,md}
    python benchmarks/throughput.py --quick         # a seconds-long smoke run
    python benchmarks/throughput.py --privacy       # the cost of DP -> benchmarks/results/throughput_privacy.*

``--privacy`` measures, for the logistic-regression and MLP workloads under the ``auto`` executor, plain FedAvg,
FedAvg with Poisson batches (DP-SGD's lots, no privacy: the batch plan example-level DP needs), client-level DP
(DP-FedAvg: every update clipped, Gaussian noise on the sum, Poisson cohort buffer) and example-level DP (DP-SGD:
per-example gradients by a vmap over the batch inside the vmap over clients, each clipped, noise on the sum), each
relative to plain FedAvg (docs/privacy.md).
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
sys.path.insert(0, HERE)
from machine import matmul_peak, memory_bandwidth, time_rounds  # noqa: E402  (benchmarks/machine.py)

WORKLOADS = {
    "logreg-synthetic-1k": dict(model="logreg", data="synthetic", clients=1000),
    "logreg-synthetic-10k": dict(model="logreg", data="synthetic", clients=10000),
    "mlp-28x28-64": dict(model="mlp", data="images", clients=64),
    "mlp-28x28-256": dict(model="mlp", data="images", clients=256),
    "mlp-28x28-1024": dict(model="mlp", data="images", clients=1024),
    "cnn1-28x28-64": dict(model="cnn1", data="images", clients=64),
    "cnn1_s-28x28-64": dict(model="cnn1_s", data="images", clients=64),  # FedJAX-EMNIST's CNN (3×3, 16-32)
    # the accelerator issue's CNN: 5×5×16-pool-5×5×32-pool-128-10, SAME (benchmarks/gpu.py, beside PyTorch)
    "cnn5-28x28-64": dict(model="cnn_s", data="images", clients=64, options={"kernel": 5, "width": 128}),
    # benchmarks/gpu.py's (not in this script's default table: hours on a CPU)
    "resnet18gn-32x32-64": dict(model="resnet18_gn", data="images", clients=64, shape=(32, 32, 3)),
}
CPU_TABLE = ("logreg-synthetic-1k", "logreg-synthetic-10k", "mlp-28x28-64", "mlp-28x28-256", "mlp-28x28-1024",
             "cnn1-28x28-64")
EXECUTORS = ["auto", "vmap", "chunked", "sharded", "loop"]
STEPS, BATCH = 10, 20
PRIVACY_TABLE = ("logreg-synthetic-1k", "mlp-28x28-64")
# --privacy rows: plain FedAvg; its Poisson batches alone; client-level DP; example-level DP (docs/privacy.md)
PRIVACY_LEVELS = {"none": "FedAvg", "poisson": "FedAvg, Poisson batches (no DP)",
                  "client": "client-level DP (DP-FedAvg)", "example": "example-level DP (DP-SGD)"}


def _data(spec: dict, quick: bool):

    import fljax.data as D

    if spec["data"] == "synthetic":
        return D.make_federated("synthetic", spec["clients"], seed=0, max_samples=200)
    rng = np.random.default_rng(0)
    n = 200 if not quick else 40
    shape = spec.get("shape", (28, 28, 1))
    xs = [rng.random((n, *shape), np.float32) for _ in range(spec["clients"])]
    ys = [rng.integers(0, 10, n).astype(np.int32) for _ in range(spec["clients"])]
    arr = D.pad_clients(xs, ys)
    return D.FederatedData(train=arr, test=arr, num_classes=10, input_shape=shape,
                           name="random-" + "x".join(map(str, shape)))


def step_cost(model, data) -> tuple[float, float]:
    """(FLOPs, bytes accessed) of one client's SGD step — forward and backward on a batch of BATCH and the parameter
    update — from XLA's cost analysis of that step compiled alone. The bytes count every operation's inputs and
    outputs, as if no intermediate stayed in cache: the traffic the step would cost without caches. (The round
    programs' own analyses count a loop's body once, not once per iteration, so they cannot give these figures.)"""
    import jax

    from fljax.data import Batch

    params = model.init(jax.random.PRNGKey(0))
    batch = Batch(x=data.train.x[0, :BATCH], y=data.train.y[0, :BATCH], mask=data.train.mask[0, :BATCH])

    def sgd_step(p, b):
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, jax.grad(model.loss)(p, b))

    cost = jax.jit(sgd_step).lower(params, batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _privacy(level: str, algo, data, clients: int):
    """The run's :class:`fljax.privacy.Privacy` for a --privacy row (z = 1, C = 1; None for the non-private rows)."""
    from fljax.privacy import LocalSteps, PrivacyOptions, resolve_run

    if level in ("none", "poisson"):
        return None
    local = None
    if level == "example":
        counts = np.asarray(data.train.count)
        local = LocalSteps(int(counts.min()), int(counts.sum()), BATCH, algo.plan().num_steps(data.train.n_max))
    return resolve_run(PrivacyOptions(noise_multiplier=1.0, clip_norm=1.0, level=level), None, clients=clients,
                       cohort_size=None, rounds=100, local=local)


def measure(workload: str, executor: str, conv: str, unroll: str, repeats: int, quick: bool,
            clients: int | None = None, precision: str = "tf32", privacy: str = "none") -> dict:
    """One configuration, in this process (``clients``: instead of the workload's number; ``precision``: the
    simulation's; ``privacy``: a key of :data:`PRIVACY_LEVELS`)."""
    import jax

    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model

    spec = dict(WORKLOADS[workload], **({"clients": clients} if clients else {}))
    data = _data(spec, quick)
    model = make_model(spec["model"], data.input_shape, data.num_classes, **spec.get("options", {}))
    poisson = {"sampling": "poisson"} if privacy in ("poisson", "example") else {}
    algo = make_algorithm("fedavg", lr=0.01, cohort_size=None, local_steps=STEPS, batch_size=BATCH, **poisson)
    chunk = max(1, spec["clients"] // 8) if executor == "chunked" else None  # auto sizes its own chunks
    sim = Simulation(algo, data, model, executor=executor, chunk_size=chunk, seed=0,
                     conv_impl=conv, unroll=unroll if unroll == "auto" else int(unroll), precision=precision,
                     privacy=_privacy(privacy, algo, data, spec["clients"]))
    state = sim.init()
    loop = not sim.executor.jittable
    rounds = 1 if loop or quick or spec["model"] in ("cnn1", "cnn1_s", "cnn_s", "resnet18_gn") else (
        2 if spec["clients"] >= 10000 else 5)
    state, first, per_round = time_rounds(sim, state, rounds, repeats)
    client_steps = spec["clients"] * STEPS
    compiled = sim.executable("block", (rounds,))
    mem = compiled.memory_analysis() if compiled is not None else None
    xla_bytes = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes) if mem else None
    flops, moved = step_cost(sim.model, data)
    return {
        "workload": workload, "executor": executor, "resolved": sim.executor.describe(),
        "conv": sim.model.conv_impl or "-", "precision": precision, "backend": jax.default_backend(),
        "unroll": sim.unroll, "clients": spec["clients"], "round_seconds": per_round,
        "client_steps_per_s": client_steps / per_round, "samples_per_s": client_steps * BATCH / per_round,
        "flops_per_s": flops * client_steps / per_round,
        "compile_seconds": sim.compile_seconds if not loop else first - per_round,
        "xla_bytes": xla_bytes, "bytes_per_client_step": moved,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "repeats": repeats, "privacy": privacy, "load": os.getloadavg()[0],
    }


def configurations(quick: bool):
    for w in CPU_TABLE:
        spec = WORKLOADS[w]
        if quick and w != "mlp-28x28-64":
            continue
        for ex in EXECUTORS:
            if spec["model"] == "cnn1" and ex in ("vmap", "loop"):  # the convolution and unroll choices
                for conv in ("native", "patches"):
                    for unroll in ("1", str(STEPS)):
                        yield w, ex, conv, unroll
            else:  # the executor's own choices (auto: loop, native, unroll 10 for CNN1 on CPU)
                yield w, ex, "auto", "auto"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3, help="--privacy: passes over the settings (the median is shown)")
    ap.add_argument("--quick", action="store_true", help="one small workload, 2 repeats (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--one", nargs=4, metavar=("WORKLOAD", "EXECUTOR", "CONV", "UNROLL"), help=argparse.SUPPRESS)
    ap.add_argument("--clients", type=int, help=argparse.SUPPRESS)  # with --one: override the workload's
    ap.add_argument("--precision", default="tf32", help=argparse.SUPPRESS)  # with --one
    ap.add_argument("--privacy", nargs="?", const="table", default=None,
                    help="the cost of DP: FedAvg, client- and example-level DP (benchmarks/results/throughput_privacy)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, repeats=args.repeats, quick=args.quick, clients=args.clients,
                                 precision=args.precision, privacy=args.privacy or "none")))
        return
    if args.privacy:
        return privacy_table(args)
    repeats = 2 if args.quick else args.repeats
    from fljax.runner.files import write_json, write_text

    peak = matmul_peak(512 if args.quick else 2048)
    rows = measure_all(configurations(args.quick), repeats, args.quick, peak)
    # after the children: a process's peak RSS starts from its parent's at the fork (Linux keeps it across exec)
    bandwidth = memory_bandwidth(64 if args.quick else 512)
    for row in rows:
        row["bandwidth_fraction"] = row["bytes_per_client_step"] * row["client_steps_per_s"] / bandwidth
    meta = describe(" ".join(["python benchmarks/throughput.py"] + sys.argv[1:]), peak, repeats, bandwidth)
    name = "throughput_quick" if args.quick else "throughput"
    md = markdown(meta, rows)
    write_json(os.path.join(args.out, name + ".json"), {"meta": meta, "rows": rows})
    write_text(os.path.join(args.out, name + ".md"), md)
    print(md)


def describe(command: str, peak: float, repeats: int, bandwidth: float | None = None) -> dict:
    """The machine and settings a table was measured with."""
    import jax

    return {"command": command, "jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "matmul_peak_flops": peak, "memory_bandwidth_bytes": bandwidth, "local_steps": STEPS, "batch_size": BATCH,
            "repeats": repeats, "date": time.strftime("%Y-%m-%d")}


def measure_all(configs, repeats: int, quick: bool, peak: float, clients: int | None = None,
                timeout: float | None = None) -> list[dict]:
    """:func:`measure` each (workload, executor, conv, unroll[, precision[, clients]]) in its own process, without
    the persistent compile cache so that compile times are the compiler's (``clients``: override the workload's
    number of clients); a failed or timed-out one (``timeout`` seconds) is reported on stderr and left out.
    ``peak_fraction`` against ``peak`` FLOP/s."""
    rows = []
    for cfg in configs:
        cfg, extra = tuple(cfg[:4]), tuple(cfg[4:])
        cmd = [sys.executable, os.path.abspath(__file__), "--one", *cfg, "--repeats", str(repeats)]
        n = extra[1] if len(extra) > 1 else clients
        cmd += (["--precision", extra[0]] if extra else []) + (["--clients", str(n)] if n else [])
        cmd += ["--privacy", extra[2]] if len(extra) > 2 else []
        cmd += ["--quick"] if quick else []
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, FLJAX_COMPILE_CACHE="0"))
        except subprocess.TimeoutExpired:
            print(f"TIMED OUT {cfg + extra} after {timeout:.0f} s", file=sys.stderr)
            continue
        if out.returncode != 0:
            print(f"FAILED {cfg}: {out.stderr.strip().splitlines()[-1] if out.stderr else ''}", file=sys.stderr)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["peak_fraction"] = row["flops_per_s"] / peak
        rows.append(row)
        print(f"{row['workload']:<22} {row['executor']:<8} {row['conv']:<8} {row['precision']:<5} "
              f"unroll {row['unroll']:<3} {row['privacy']:<8} "
              f"{row['client_steps_per_s']:>12,.0f} client-steps/s  compile {row['compile_seconds']:.1f}s",
              file=sys.stderr)
    return rows


TITLES = {"logreg-synthetic-1k": "Logistic regression 60→10, Synthetic(1,1), 1,000 clients",
          "logreg-synthetic-10k": "Logistic regression 60→10, Synthetic(1,1), 10,000 clients",
          "mlp-28x28-64": "MLP 784-200-200-10, 64 clients", "mlp-28x28-256": "MLP 784-200-200-10, 256 clients",
          "mlp-28x28-1024": "MLP 784-200-200-10, 1,024 clients",
          "cnn1-28x28-64": "CNN1 (LeNet-5), 28×28×1, 64 clients",
          "cnn5-28x28-64": "CNN 5×5 16-32 SAME, dense 128 (the accelerator issue's), 28×28×1",
          "cnn1_s-28x28-64": "CNN1-S (3×3 conv 16-32, dense 256-128; FedJAX-EMNIST's size), 28×28×1, 64 clients",
          "resnet18gn-32x32-64": "ResNet-18-GN, 32×32×3, 64 clients"}


def markdown(meta: dict, rows: list[dict]) -> str:
    """One table per workload: its executors (and, for convolutional models, convolution and unroll choices)."""
    lines = [f"FedAvg throughput, {meta['local_steps']} local steps of batch {meta['batch_size']}, all clients "
             f"every round; median of {meta['repeats']} timed blocks. Backend {meta['backend']} "
             f"({meta['cpu_count']} cores), jax {meta['jax']}, measured matmul peak "
             f"{meta['matmul_peak_flops'] / 1e9:.1f} GFLOP/s"
             + (f" and memory bandwidth {meta['memory_bandwidth_bytes'] / 1e9:.1f} GB/s"
                if meta.get("memory_bandwidth_bytes") else "")
             + f" (measured in this run). Command: `{meta['command']}`."]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == workload]
        loop = max((r["client_steps_per_s"] for r in rs if r["executor"] == "loop"), default=None)
        conv = any(r["conv"] != "-" for r in rs)
        kb = rs[0]["bytes_per_client_step"] / 1e3
        measured = sorted({r["clients"] for r in rs})
        title = TITLES.get(workload, workload)
        if measured != [WORKLOADS.get(workload, {}).get("clients")]:  # clients overridden (--clients)
            title = title.rsplit(",", 1)[0] + f", measured with {' and '.join(f'{n:,}' for n in measured)} clients"
        lines += ["", f"**{title}** (`{workload}`; one client-step moves {kb:,.0f} KB by XLA's count)", "",
                  "| executor | " + ("conv, unroll | " if conv else "") + "client-steps/s | samples/s | GFLOP/s | "
                  "% of peak | % of memory bandwidth | vs loop | compile s | XLA MB | peak RSS MB |",
                  "|" + "---|" * (11 if conv else 10)]
        for r in rs:
            lines.append(
                f"| {r['executor']} ({r['resolved']}) | " + (f"{r['conv']}, {r['unroll']} | " if conv else "")
                + f"{r['client_steps_per_s']:,.0f} | {r['samples_per_s']:,.0f} | {r['flops_per_s'] / 1e9:.2f} | "
                f"{100 * r['peak_fraction']:.1f} | {100 * r.get('bandwidth_fraction', float('nan')):.0f} | "
                f"{r['client_steps_per_s'] / loop if loop else float('nan'):.1f}× | "
                f"{r['compile_seconds']:.1f} | {(r['xla_bytes'] or 0) / 1e6:.0f} | {r['peak_rss_bytes'] / 1e6:.0f} |")
    lines += ["", "Compile s: the AOT compile time of the round program without the persistent cache; for `loop`, the "
              "first round's time minus a steady round's (it compiles per-client programs lazily, and includes the "
              "first-call costs). KB moved: XLA's count of the bytes one SGD step (forward, backward, update) reads "
              "and writes, every operation's inputs and outputs as if nothing stayed in cache; % of memory "
              "bandwidth: that traffic at the measured rate, so above 100 % the caches serve the difference."]
    return "\n".join(lines) + "\n"


def privacy_table(args) -> None:
    """--privacy: each workload of :data:`PRIVACY_TABLE` (``auto`` executor) at every level of
    :data:`PRIVACY_LEVELS`, each in its own process; writes throughput_privacy{,_quick}.{json,md}."""
    from fljax.runner.files import write_json, write_text

    repeats = 2 if args.quick else args.repeats
    workloads = PRIVACY_TABLE[1:] if args.quick else PRIVACY_TABLE
    configs = [(w, "auto", "auto", "auto", "tf32", None, level) for w in workloads for level in PRIVACY_LEVELS]
    peak = matmul_peak(512 if args.quick else 2048)
    # the small data of --quick (40 images per client) and one round per timed block: example-level DP on the
    # MLP takes about a minute per round on a 2-core CPU
    # the configurations one after another, `passes` times over, and each one's median pass: a shared machine's load
    # drifts over minutes, so one pass puts that drift between the rows of a table
    passes = [measure_all(configs, repeats, True, peak) for _ in range(1 if args.quick else args.passes)]
    rows = []
    for cfg in dict.fromkeys((r["workload"], r["privacy"]) for p in passes for r in p):
        runs = sorted((r for p in passes for r in p if (r["workload"], r["privacy"]) == cfg),
                      key=lambda r: r["client_steps_per_s"])
        rows.append({**runs[(len(runs) - 1) // 2], "passes": [r["client_steps_per_s"] for r in runs],
                     "load": [r["load"] for r in runs]})
    meta = describe(" ".join(["python benchmarks/throughput.py"] + sys.argv[1:]), peak, repeats)
    lines = [f"The cost of differential privacy in FedAvg: {meta['local_steps']} local steps of batch "
             f"{meta['batch_size']}, every client every round, `auto` executor, z = 1, C = 1; clients of 40 random "
             f"images (MLP) or Synthetic(1,1) sizes capped at 200 (logistic regression); median of "
             f"{meta['repeats']} timed blocks of one round, in each of {len(passes)} passes over the settings (one "
             f"process each), and the median pass. Backend {meta['backend']} ({meta['cpu_count']} cores), jax "
             f"{meta['jax']}; load average {min(min(r['load']) for r in rows):.1f}–{max(max(r['load']) for r in rows):.1f}"
             f" during the measurements. Command: `{meta['command']}`."]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == workload]
        base = next((r["client_steps_per_s"] for r in rs if r["privacy"] == "none"), None)
        lines += ["", f"**{TITLES.get(workload, workload)}** (`{workload}`)", "",
                  "| setting | client-steps/s | vs FedAvg | passes (client-steps/s) | round ms | compile s | XLA MB |",
                  "|---|---|---|---|---|---|---|"]
        for r in rs:
            lines.append(f"| {PRIVACY_LEVELS[r['privacy']]} | {r['client_steps_per_s']:,.0f} | "
                         f"{r['client_steps_per_s'] / base if base else float('nan'):.2f}× | "
                         f"{', '.join(f'{v:,.0f}' for v in r['passes'])} | {1e3 * r['round_seconds']:.1f} | {r['compile_seconds']:.1f} | "
                         f"{(r['xla_bytes'] or 0) / 1e6:.0f} |")
    lines += ["", "Poisson batches (DP-SGD's lots): every example of a client in a step with probability B/n_i, "
              "masked in a buffer of the client's whole data, so a step computes on n_i rows rather than B; "
              "example-level DP adds per-example gradients and clipping on top. Client-level DP adds one norm, a "
              "scale and one Gaussian draw per round (and the Poisson cohort buffer)."]
    md = "\n".join(lines) + "\n"
    name = "throughput_privacy_quick" if args.quick else "throughput_privacy"
    write_json(os.path.join(args.out, name + ".json"), {"meta": meta, "rows": rows})
    write_text(os.path.join(args.out, name + ".md"), md)
    print(md)


if __name__ == "__main__":
    main()
