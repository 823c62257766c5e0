"""The accelerator benchmark: one prepared device call of under 10 minutes (``bash benchmarks/gpu.sh``).

``gpu.sh`` runs the parts below in this order, each in its own process with its own time limit
(``python benchmarks/gpu.py --part NAME``); every part adds its rows to ``benchmarks/results/gpu.json`` and rewrites
``gpu.md`` after each measurement, so a part stopped by its limit keeps what it measured and the next part still runs.

1. ``emnist`` — **FedJAX's EMNIST workload end to end through** :func:`fljax.run`, stood in by synthetic data of its
   shape (EMNIST-62 cannot be downloaded there): 3,400 clients holding 671,585 training and 77,483 test images of
   28×28×1 in 62 classes, log-normal client sizes (σ 0.6) of the real totals (largest ~1,000), ragged storage; 1,500
   rounds of FedAvg, 10 clients per round, one local epoch of batch 20 (lr 0.1), the CNN ``cnn1_s``, evaluated at
   round 0 and at the end over all 3,400 clients; ``auto`` executor and convolution form, then again with
   ``precision: bf16``. Target: under 30 s of ``fljax.run`` wall time.
2. ``cnn`` — the dense matmul peak of the chip measured in this process (float32 as TF32, exact float32, bfloat16),
   then FedAvg rounds (every client, 10 local SGD steps of batch 20) of the issue's CNN (5×5 16-32 SAME, dense 128)
   at 64 clients for every convolution form under ``vmap`` (native = the grouped convolution vmap makes, patches =
   im2col + batched matmul, shifts = k² shifted batched matmuls) and the fastest form again in bf16, at 1,024
   clients that form in tf32 and bf16 (the other forms' 1,024-client rows of 2026-11-27 stay in the table), and the
   ``peer_torch`` rows (torch.func vmap at both sizes; the PyTorch loop at 64 clients) when torch imports. The form
   rows are written into ``fljax/models/conv_forms.json`` (the table ``conv_impl: auto`` reads; commit it).
3. ``dense`` — logistic regression 60→10 (1,000 clients) and the MLP 784-200-200-10 (64 clients), ``auto``,
   with their PyTorch peers.
4. ``resnet`` — ResNet-18-GN on 32×32×3, 64 clients, ``auto`` (its form from the table), tf32 (bf16 too was
   measured on 2026-11-27; the two do not fit in the script's 8 minutes: their compiles alone took 80 s).
5. ``text`` — the text targets of issue 26 on the offline stand-ins (synthetic text of the real sets' shapes and
   client sizes, :mod:`fljax.data.standins`) through ``benchmarks/text_workloads.measure``, FedAvg in the published
   settings (one local epoch, each member running its own ceil(n_i / batch) steps): Shakespeare, 715 speakers, the
   character LSTM, 10 clients per round, batch 4, lr 1 (target: 1,200 rounds in under 2 minutes), and Stack
   Overflow, the first 2,000 of the config's 10,000 users (at most 1,000 sentences each; the same law of cohort
   sizes), the word LSTM, 50 clients per round, batch 16, lr 10^-0.5 (target: 1,500 rounds in under 20 minutes).
   Each times a block of a fixed number of rounds after a warm-up block (which compiles it) and projects the full
   run (compile + rounds × seconds per round; evaluations not counted), stated in the table; then the throughput rows of
   ``text_workloads`` (2 local steps) at cohorts of 10 and 500, as time allows.
6. ``async`` (run when named: ``bash benchmarks/gpu.sh async``; the five parts above fill the 8 minutes) — FedBuff
   with 1,000 clients in flight and a buffer of 100 against synchronous FedAvg at a cohort of 100 and against the
   plain event loop, logistic regression and the MLP 60-64-10 (``benchmarks/asynchrony.measure``: issue 36's
   goal, asynchrony costing at most 20 % per client-step).
7. ``robust`` (run when named: ``bash benchmarks/gpu.sh robust``) — the attack × defence table of
   ``benchmarks/robust.py`` on the device: 4 attacks × 4 defences × 3 fractions × 2 seeds (96 runs, 200 rounds) as one
   ``fljax sweep`` (16 programs), against a sample of its cells run one at a time through ``fljax.run`` and the
   per-client PyTorch loop on the GPU (``benchmarks/robust_torch.py``, when torch imports), both extrapolated to the
   table (issue 35: the table ≥ 3× faster than cell by cell, ≥ 10× than the loop).

Time: ``gpu.sh`` gives each part a limit from the committed figures (its comment says which), the five under
8 minutes with their kill grace; each part's stamp records its seconds from start to its last saved measurement.
``python benchmarks/gpu.py`` (no ``--part``) only re-renders ``gpu.md`` from ``gpu.json``; ``--plan`` prints how
today's memory plan runs the ``cnn`` part's fljax rows under the default cap (lowered here, nothing measured).

``--dry-run`` runs every part at toy sizes on any backend in seconds and writes ``gpu_dry_run.*`` (the ResNet part
is left out: its CPU compile alone takes minutes). The GPU machine has no tensorflow-datasets: nothing here imports it.

    bash benchmarks/gpu.sh             # on the GPU machine
    bash benchmarks/gpu.sh --dry-run   # anywhere: checks the script
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

START = time.perf_counter()  # the part's process started (its stamp's seconds count from here)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import throughput  # noqa: E402  (benchmarks/throughput.py: the measurement and its table)
import torch_peers  # noqa: E402

PARTS = ("emnist", "cnn", "dense", "resnet", "text", "async", "robust")
EMNIST = {"clients": 3400, "train": 671_585, "test": 77_483, "classes": 62, "rounds": 1500, "cohort": 10,
          "batch_size": 20, "local_epochs": 1, "lr": 0.1, "model": "cnn1_s", "sigma": 0.6}
DRY_EMNIST = {"clients": 34, "train": 680, "test": 340, "rounds": 3, "cohort": 2}
CNN_CLIENTS, DRY_CLIENTS = (64, 1024), (2,)  # every form at the first size, its fastest at the others
REPEATS = {"cnn": 3, "dense": 3, "resnet": 2}  # timed rounds of a part's fljax rows (after a compiling one)
FORMS = ("native", "patches", "shifts")


# ---------------------------------------------------------------------------------------------- part 1
def emnist_like(spec: dict, seed: int = 0):
    """Synthetic stand-in of EMNIST-62's federated shape (ragged storage): ``spec['train']`` and ``spec['test']``
    images split over ``spec['clients']`` clients with log-normal (σ = ``spec['sigma']``) sizes scaled to the
    totals, each client's test share proportional to its training share; pixels uniform, labels uniform."""
    import fljax.data as D
    from fljax.data.build import stack_clients

    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, spec["sigma"], spec["clients"])
    parts = []
    for total in (spec["train"], spec["test"]):
        sizes = np.maximum(1, np.round(weights / weights.sum() * total)).astype(int)
        n = int(sizes.sum())
        parts.append(stack_clients(rng.random((n, 28, 28, 1), np.float32),
                                   rng.integers(0, spec["classes"], n).astype(np.int32), sizes, "ragged"))
    return D.FederatedData(train=parts[0], test=parts[1], num_classes=spec["classes"], input_shape=(28, 28, 1),
                           name="emnist-like")


def emnist_end_to_end(spec: dict, data, precision: str, executor: str = "auto") -> dict:
    """The whole FedJAX-EMNIST-shaped run through :func:`fljax.run`: wall seconds and summary.json's parts."""
    import fljax
    from fljax.models import make_model

    # the zoo's module passed as the run's own model (a config's model section is checked against the config's
    # data set, not against data passed in); it keeps the zoo model's convolution forms
    module = make_model(spec["model"], data.input_shape, data.num_classes).module
    config = {"algorithm": "fedavg", "rounds": spec["rounds"], "eval_every": spec["rounds"], "executor": executor,
              "checkpoint_every": 0, "precision": precision,
              "algo": {"cohort_size": spec["cohort"], "batch_size": spec["batch_size"],
                       "local_epochs": spec["local_epochs"], "lr": spec["lr"]}}
    t0 = time.perf_counter()
    result = fljax.run(config, data=data, model=module, progress=False)
    wall = time.perf_counter() - t0
    summary = result.runs[0].progress.summary
    return {"precision": precision, "run_wall_seconds": wall, "executor": summary["executor"],
            **{k: summary.get(k) for k in ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds",
                                           "client_steps_per_second")},
            "conv_impl": summary.get("environment", {}).get("conv_impl"), "final": result.final}


def part_emnist(dry: bool, save) -> None:
    spec = {**EMNIST, **(DRY_EMNIST if dry else {})}
    t0 = time.perf_counter()
    data = emnist_like(spec)
    record = {"spec": spec, "data_seconds": time.perf_counter() - t0, "clients": data.num_clients,
              "train_samples": int(np.asarray(data.train.count).sum()), "max_client_size": int(data.train.n_max),
              "runs": []}
    save("emnist", record)
    # a dry run takes the accelerator's path (vmap, not the CPU's loop), in tf32 only (bf16 is the same path)
    for precision in ("tf32",) if dry else ("tf32", "bf16"):
        record["runs"].append(emnist_end_to_end(spec, data, precision, "vmap" if dry else "auto"))
        save("emnist", record)


# ---------------------------------------------------------------------------------------------- parts 2-4
def peaks(dry: bool) -> dict:
    """Dense n×n matmul FLOP/s of this device in this process: float32 at the default precision (TF32 on NVIDIA
    GPUs), exact float32, and bfloat16 operands."""
    import jax
    import jax.numpy as jnp

    from machine import median_seconds

    n = 256 if dry else 8192
    out = {}
    for name, dtype, precision in (("tf32", jnp.float32, None), ("fp32", jnp.float32, "highest"),
                                   ("bf16", jnp.bfloat16, None)):
        a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
        f = jax.jit(lambda x, p=precision: jnp.matmul(x, x, precision=p))
        out[name] = 2 * n ** 3 / median_seconds(lambda: f(a), 3 if dry else 10)
    return out


def fljax_row(workload: str, executor: str, conv: str, precision: str, clients: int | None, dry: bool,
              peak: dict, repeats: int = 3) -> dict:
    row = throughput.measure(workload, executor, conv, "1" if dry else "auto", 1 if dry else repeats, dry,
                             clients=clients, precision=precision)  # a dry run: no unrolled steps (compile time)
    row["peak_key"] = "bf16" if precision == "bf16" else "tf32"
    return row


def model_flops(rows: list[dict]) -> dict:
    """FLOPs of one client-step per workload: the largest of XLA's counts over its rows (XLA's cost analysis
    does not count the grouped convolution of the ``native`` form, so a form's own count understates it)."""
    out: dict = {}
    for r in rows:
        per_step = r["flops_per_s"] / r["client_steps_per_s"]
        out[r["workload"]] = max(out.get(r["workload"], 0.0), per_step)
    return out


def peak_fraction(row: dict, flops: dict, peak: dict) -> float:
    return row["client_steps_per_s"] * flops[row["workload"]] / peak[row.get("peak_key", "tf32")]


def torch_row(model: str, style: str, clients: int, dry: bool) -> dict:
    # 3 timed rounds: an odd count, so that their median is one of them (of 2, torch_peers takes the slower)
    return torch_peers.measure(model, style, clients, repeats=1 if dry else 3,
                               timed_clients=64 if style == "loop" else None)


def measure_rows(part: str, dry: bool, save) -> None:
    """Parts 2-4: fljax rows (in this process, one after another), then the PyTorch peers; saved after each."""
    import jax

    peak = peaks(dry)
    rows, peers = [], []
    record = {"peaks": peak, "rows": rows, "peer_torch": peers,
              "torch": "available" if torch_peers.available() else "not installed: peer_torch rows skipped"}
    jobs = []
    if part == "cnn":
        sizes = DRY_CLIENTS if dry else CNN_CLIENTS
        for clients in sizes:
            if clients == sizes[0]:
                jobs += [("fljax", ("cnn5-28x28-64", "vmap", form, "tf32", clients)) for form in FORMS]
            else:
                jobs += [("fljax-best", ("cnn5-28x28-64", "vmap", None, "tf32", clients))]
            jobs += [("fljax-best", ("cnn5-28x28-64", "vmap", None, "bf16", clients))]
            jobs += [("torch", ("cnn5", "vmap", clients))]
            if clients == sizes[0]:  # the loop is timed on 64 clients whatever the size: one row
                jobs += [("torch", ("cnn5", "loop", clients))]
    elif part == "dense":
        for workload, model in (("logreg-synthetic-1k", "logreg"), ("mlp-28x28-64", "mlp")):
            clients = 2 if dry else None
            jobs += [("fljax", (workload, "auto", "auto", "tf32", clients)),
                     ("torch", (model, "vmap", clients or (1000 if model == "logreg" else 64))),
                     ("torch", (model, "loop", clients or (1000 if model == "logreg" else 64)))]
    elif part == "resnet" and not dry:  # a dry run leaves it out: its CPU compile alone takes minutes
        jobs += [("fljax", ("resnet18gn-32x32-64", "auto", "auto", "tf32", None))]
    save(part, record)
    repeats = REPEATS.get(part, 3)
    for kind, args in jobs:
        try:
            if kind == "fljax-best":  # the fastest tf32 form measured at this size, else at the first size
                tf32 = [r for r in rows if r["precision"] == "tf32"]
                first = (DRY_CLIENTS if dry else CNN_CLIENTS)[0]
                same = [r for r in tf32 if r["clients"] == args[4]] or [r for r in tf32 if r["clients"] == first]
                if not same:
                    continue
                best = max(same, key=lambda r: r["client_steps_per_s"])["conv"]
                rows.append(fljax_row(args[0], args[1], best, args[3], args[4], dry, peak, repeats))
            elif kind == "fljax":
                rows.append(fljax_row(*args, dry=dry, peak=peak, repeats=repeats))
            elif torch_peers.available():
                peers.append(torch_row(*args, dry=dry))
        except Exception as e:  # noqa: BLE001 - one failed measurement must not lose the part's others
            print(f"FAILED {kind} {args}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  file=sys.stderr)
        save(part, record)
    if part == "cnn" and not dry:
        from conv_forms import table_rows, update_table

        update_table(table_rows([r for r in rows if r["precision"] == "tf32"], "benchmarks/results/gpu.json"),
                     jax.default_backend())


def cap_plan(row: dict) -> dict:
    """How today's memory plan runs the round program of a fljax row of parts 2-4 on a large accelerator: its
    client map planned under :data:`fljax.engine.budget.CAP` (the default budget of any device with more than
    CAP / FRACTION of memory), traced and lowered on this machine; nothing compiles or runs. XLA's count after
    compiling can re-plan it smaller (:mod:`fljax.engine.budget`): on the H200 that count was about twice the
    estimate."""
    import jax

    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation, budget
    from fljax.models import make_model
    from fljax.models.model import precision_scope

    spec = dict(throughput.WORKLOADS[row["workload"]], clients=row["clients"])
    data = throughput._data(spec, False)
    model = make_model(spec["model"], data.input_shape, data.num_classes, **spec.get("options", {}))
    algo = make_algorithm("fedavg", lr=0.01, cohort_size=None, local_steps=throughput.STEPS,
                          batch_size=throughput.BATCH)
    sim = Simulation(algo, data, model, executor="vmap", conv_impl=row["conv"] if row["conv"] != "-" else "auto",
                     unroll=1, precision=row["precision"])  # unroll 1: auto's choice off the CPU
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), data)
    with budget.scope(budget.CAP, "rounds") as maps, precision_scope("fp32"):  # as Simulation.compiled traces it
        jax.jit(lambda s, d: sim.block_fn(s, d, 1)).lower(sim.state_shapes(), shapes)
    return {**{k: row[k] for k in ("workload", "clients", "conv", "precision")}, "cap_bytes": budget.CAP,
            "per_client_bytes": maps[0]["per_client_bytes"], "side_by_side": maps[0]["side_by_side"]}


# ---------------------------------------------------------------------------------------------- part 5
# the published settings (configs/shakespeare_fedavg.yaml, configs/stackoverflow_fedavg.yaml), timed rounds
TEXT_TARGETS = (
    {"workload": "shakespeare-lstm", "cohort": 10, "local_epochs": 1, "lr": 1.0, "population": 715,
     "data": {"test_fraction": 0.2}, "rounds": 5, "full_rounds": 1200, "target_seconds": 120},
    # the config's 10,000 users cut to their first 2,000 (the stand-in's users are i.i.d. in size, so the rounds'
    # cohorts, and their time, have the same law; building 10,000 takes longer than the part's limit allows)
    {"workload": "stackoverflow-lstm", "cohort": 50, "local_epochs": 1, "lr": 0.316227766, "population": 2_000,
     "data": {"test_fraction": 0.1}, "rounds": 5, "full_rounds": 1500, "target_seconds": 1200})
TEXT_COHORTS = (10, 500)


def part_text(dry: bool, save) -> None:
    import text_workloads  # benchmarks/text_workloads.py

    record = {"targets": [], "rows": []}
    save("text", record)
    jobs = [("targets", dict(t, rounds=2, population=4, cohort=2, dry=True) if dry else t) for t in TEXT_TARGETS]
    jobs += [("rows", {"workload": w, "cohort": 2 if dry else k, "local_steps": 2, "rounds": 1 if dry else 2,
                       "repeats": 1 if dry else 2, **({"dry": True, "population": 2} if dry else {})})
             for w in text_workloads.WORKLOADS for k in (TEXT_COHORTS[:1] if dry else TEXT_COHORTS)]
    for kind, spec in jobs:
        try:
            row = text_workloads.measure(spec)
        except Exception as e:  # noqa: BLE001 - one failed measurement must not lose the part's others
            print(f"FAILED text {spec}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  file=sys.stderr)
            continue
        if kind == "targets":
            row.update(full_rounds=spec["full_rounds"], target_seconds=spec["target_seconds"],
                       projected_seconds=row["compile_seconds"] + spec["full_rounds"] * row["round_seconds"])
        record[kind].append(row)
        save("text", record)


def part_async(dry: bool, save) -> None:
    """FedBuff against synchronous FedAvg and the event loop (``benchmarks/asynchrony.py``), one workload at a time
    (each saved as it is measured)."""
    import asynchrony  # benchmarks/asynchrony.py

    record = {"rows": [], "meta": None}
    save("async", record)
    sizes = dict(clients=60, concurrency=20, buffer=5, rounds=2, repeats=1, loop_steps=1) if dry else \
        dict(clients=2000, concurrency=1000, buffer=100, rounds=10, repeats=3, loop_steps=2)
    for workload in asynchrony.WORKLOADS:
        result = asynchrony.measure(**sizes, workloads=(workload,), command="python benchmarks/gpu.py --part async",
                                    dry_run=dry)
        record["meta"], record["rows"] = result["meta"], record["rows"] + result["rows"]
        save("async", record)


def part_robust(dry: bool, save) -> None:
    """The attack table three ways (``benchmarks/robust.py``): the sweep, cells one at a time, the PyTorch loop, each
    saved as it is measured."""
    import robust  # benchmarks/robust.py
    import torch_peers

    attacks, defences = (robust.ATTACKS[:1], robust.DEFENCES[:2]) if dry else (robust.ATTACKS[:4],
                                                                                robust.DEFENCES[:4])
    rounds, sample = (2, 1) if dry else (200, 2)
    import jax

    record = {"rounds": rounds, "attacks": attacks, "defences": defences, "load": "-",
              "machine": ", ".join(str(d.device_kind) for d in jax.devices()),
              "command": "python benchmarks/gpu.py --part robust"}
    record["table"] = robust.part_table(rounds, attacks, defences)
    save("robust", record)
    record["cells"] = robust.part_cells(rounds, sample, attacks, defences)
    save("robust", record)
    if torch_peers.available():
        record["torch"] = robust.part_torch(rounds, sys.executable, sample, 1, attacks, defences)
        save("robust", record)


# ---------------------------------------------------------------------------------------------- report
def _fmt(x, spec=",.0f"):
    return "–" if x is None else format(x, spec)


def _stamp(record: dict) -> str:
    """Where and when a part was measured (absent in records written before parts carried it: see the header)."""
    m = record.get("measured")
    if not m:
        return ""
    took = "" if m.get("seconds") is None else f" {m['seconds']:.0f} s from the part's start to its last measurement."
    return (f"Measured on {', '.join(m['devices'])}, jax {m['jax']}, {m['date']}, `{m['command']}` (run by "
            f"`bash benchmarks/gpu.sh`).{took}\n")


def _medians(rows: list[dict]) -> str:
    counts = sorted({r["repeats"] for r in rows if "repeats" in r})
    return "/".join(map(str, counts)) or "3"


def markdown(result: dict) -> str:
    meta = result.get("meta", {})
    text = ["# Accelerator benchmark" + (" (dry run: toy sizes)" if meta.get("dry_run") else ""), "",
            f"Device {meta.get('devices')}, jax {meta.get('jax')}, backend {meta.get('backend')}; "
            f"command `{meta.get('command')}`; {meta.get('date')}. FedAvg rounds: every client, 10 local SGD steps of "
            f"batch 20, lr 0.1; client-steps/s are medians of timed rounds after a compiling one.", ""]
    notes = result.get("notes", {})
    if notes.get("header"):  # about the file as a whole (a fresh run of every part starts without notes)
        text += [notes["header"], ""]
    em = result.get("emnist")
    text += ["## 1. FedJAX's EMNIST workload (synthetic stand-in), end to end through `fljax.run`", ""]
    if notes.get("emnist"):
        text += [notes["emnist"], ""]
    if not em:
        text += ["not measured", ""]
    else:
        text += [_stamp(em)]
        spec = em["spec"]
        text += [f"{em['clients']:,} clients ({em['train_samples']:,} training images, the largest client "
                 f"{em['max_client_size']}), {spec['rounds']:,} rounds × {spec['cohort']} clients, one local epoch "
                 f"of batch {spec['batch_size']}, model {spec['model']}, evaluated at round 0 and at the end; building "
                 f"the data took {em['data_seconds']:.1f} s (not counted). Pixels and labels are uniform random: the final "
                 f"accuracy is chance (1/{spec['classes']}), its column only shows the run ran to the end.", ""]
        if em["runs"]:
            text += ["| precision | executor | conv | `fljax.run` wall s | compile s | rounds + evaluations s | other s | "
                     "client-steps/s | final accuracy |", "|---|---|---|---|---|---|---|---|---|"]
        for r in em["runs"]:
            text.append(f"| {r['precision']} | {r['executor']} | {r['conv_impl']} | **{r['run_wall_seconds']:.1f}** | "
                        f"{_fmt(r['compile_seconds'], '.1f')} | {_fmt(r['run_seconds'], '.1f')} | "
                        f"{_fmt(r['other_seconds'], '.1f')} | {_fmt(r['client_steps_per_second'])} | "
                        f"{r['final'].get('global_acc', float('nan')):.3f} |")
        text.append("")
    for part, title in (("cnn", "2. The CNN (5×5 16-32 SAME, dense 128), each convolution form, beside PyTorch"),
                        ("dense", "3. Logistic regression and the MLP, beside PyTorch"),
                        ("resnet", "4. ResNet-18-GN, 32×32×3, 64 clients")):
        rec = result.get(part)
        text += [f"## {title}", ""]
        if not rec:
            text += ["not measured" + (f": {notes[part]}" if notes.get(part) else ""), ""]
            continue
        pk, flops = rec["peaks"], model_flops(rec["rows"])
        text += [_stamp(rec)] if rec.get("measured") else []
        text += [notes[part], ""] if notes.get(part) else []
        text += [f"Dense matmul peak in this process: {pk['tf32'] / 1e12:.1f} TFLOP/s float32 (default precision), "
                 f"{pk['fp32'] / 1e12:.1f} exact float32, {pk['bf16'] / 1e12:.1f} bfloat16. PyTorch: {rec['torch']}.",
                 f"client-steps/s: the median of {_medians(rec['rows'])} timed rounds after a compiling one. "
                 "% of peak: client-steps/s × the workload's FLOPs per client-step (XLA's largest count over its "
                 "forms: the native grouped convolution is not counted by XLA) ÷ the peak of the row's precision.",
                 "", "| workload | clients | executor | conv | precision | client-steps/s | % of peak | compile s |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in rec["rows"]:
            text.append(f"| {r['workload']} | {r['clients']:,} | {r['resolved']} | {r['conv']} | {r['precision']} | "
                        f"{r['client_steps_per_s']:,.0f} | {100 * peak_fraction(r, flops, pk):.1f} | "
                        f"{r['compile_seconds']:.1f} |")
        if rec["peer_torch"]:
            text += ["", "PyTorch runs with TF32 allowed (`allow_tf32`, matmuls and cuDNN). *fljax best*: the fastest "
                     "fljax row of the model at that number of clients, bf16 included; *fljax tf32*: the fastest in "
                     "TF32, the peer's precision.", "",
                     "| peer_torch | model | clients | client-steps/s | fljax best ÷ peer | fljax tf32 ÷ peer |",
                     "|---|---|---|---|---|---|"]
            for p in rec["peer_torch"]:
                ours = [r for r in rec["rows"] if r["clients"] == p["clients"]
                        and r["workload"].startswith(p["model"] + "-")]
                ratios = [f"{max(r['client_steps_per_s'] for r in rows) / p['client_steps_per_s']:.1f}×" if rows
                          else "–" for rows in (ours, [r for r in ours if r["precision"] == "tf32"])]
                text.append(f"| {p['peer']} ({p['device']}, torch {p['torch']}) | {p['model']} | {p['clients']:,}"
                            + (f" (timed {p['timed_clients']})" if p["timed_clients"] != p["clients"] else "")
                            + f" | {p['client_steps_per_s']:,.0f} | {' | '.join(ratios)} |")
        text.append("")
    text += _text_markdown(result.get("text"))
    text += ["## 6. Asynchrony: FedBuff (1,000 in flight, buffer 100) against FedAvg and the event loop", ""]
    rec = result.get("async")
    if rec and rec.get("meta"):
        import asynchrony

        text += [_stamp(rec)] + asynchrony.render({"meta": rec["meta"], "rows": rec["rows"]}, "###")[2:] + [""]
    else:
        text += ["not measured (`bash benchmarks/gpu.sh async`)", ""]
    text += ["## 7. Attack × defence tables: the sweep against cell by cell and a PyTorch loop", ""]
    rec = result.get("robust")
    if rec and rec.get("table"):
        import robust

        text += [_stamp(rec)] + robust.render(rec, "###").splitlines()[2:] + [""]
    else:
        text += ["not measured (`bash benchmarks/gpu.sh robust`)", ""]
    return "\n".join(text)


def _text_markdown(rec: dict | None) -> list[str]:
    text = ["## 5. Text: Shakespeare and Stack Overflow FedAvg targets (stand-ins), LSTM throughput", ""]
    if not rec:
        return text + ["not measured", ""]
    text += [_stamp(rec), "Published settings, one local epoch (each member runs its own ceil(n_i / batch) steps); the run is "
             "projected from the timed block of rounds: compile + rounds × s/round (the block's mean); evaluations not "
             "counted. Client-steps/s from the expected steps per round.", "",
             "| workload | population | cohort | executor | timed rounds | s/round | compile s | projected run "
             "| target | client-steps/s | tokens/s |", "|" + "---|" * 11]
    for r in rec["targets"]:
        text.append(f"| {r['workload']} | {r['population']:,} | {r['cohort']} | {r['executor']} | {r['rounds']} | "
                    f"{r['round_seconds']:.3f} | {r['compile_seconds']:.1f} | **{r['full_rounds']:,} rounds: "
                    f"{r['projected_seconds']:.0f} s** | {r['target_seconds']} s | {r['client_steps_per_s']:,.0f} | "
                    f"{r['tokens_per_s']:,.0f} |")
    text += ["", "| workload | cohort | local steps | executor | s/round | client-steps/s | tokens/s | compile s |",
             "|" + "---|" * 8]
    for r in rec["rows"]:
        text.append(f"| {r['workload']} | {r['cohort']} | {r['local_steps']} | {r['executor']} | "
                    f"{r['round_seconds']:.3f} | {r['client_steps_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                    f"{r['compile_seconds']:.1f} |")
    return text + [""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=PARTS, help="measure one part (gpu.sh runs each in its own process)")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on any backend, seconds")
    ap.add_argument("--fresh", action="store_true", help="start a new results file (gpu.sh does, before part 1)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--plan", action="store_true", help="print how today's memory plan runs the cnn part's fljax rows "
                                                        "(lowered on this machine; nothing measured or written)")
    args = ap.parse_args(argv)
    from fljax.runner.files import write_json, write_text

    name = os.path.join(args.out, "gpu_dry_run" if args.dry_run else "gpu")
    result = {} if args.fresh or not os.path.exists(name + ".json") else json.load(open(name + ".json"))
    if args.plan:
        for row in result.get("cnn", {}).get("rows", []):
            print(json.dumps(cap_plan(row)))
        return
    if args.fresh or "meta" not in result:
        import jax

        result["meta"] = {"command": "bash benchmarks/gpu.sh" + (" --dry-run" if args.dry_run else ""),
                          "jax": jax.__version__, "backend": jax.default_backend(),
                          "devices": [str(d.device_kind) for d in jax.devices()], "dry_run": args.dry_run,
                          "date": time.strftime("%Y-%m-%d %H:%M")}

    import jax

    # each part stamps where and when it was measured (a later call may re-measure some parts only)
    stamp = {"devices": [str(d.device_kind) for d in jax.devices()], "jax": jax.__version__,
             "date": time.strftime("%Y-%m-%d %H:%M"), "command": f"python benchmarks/gpu.py --part {args.part}"}

    def save(part: str, record: dict) -> None:
        record["measured"] = dict(stamp, seconds=round(time.perf_counter() - START, 1))
        result.get("notes", {}).pop(part, None)  # a note on an earlier measurement of this part
        result[part] = record
        write_json(name + ".json", result)
        write_text(name + ".md", markdown(result))

    if args.part == "emnist":
        part_emnist(args.dry_run, save)
    elif args.part == "text":
        part_text(args.dry_run, save)
    elif args.part == "async":
        part_async(args.dry_run, save)
    elif args.part == "robust":
        part_robust(args.dry_run, save)
    elif args.part in ("cnn", "dense", "resnet"):
        measure_rows(args.part, args.dry_run, save)
    else:
        write_json(name + ".json", result)
        write_text(name + ".md", markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
