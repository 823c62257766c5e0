"""The accelerator benchmark: one prepared run of under 10 minutes on one H100 (``bash benchmarks/gpu.sh``).

1. **Throughput** (benchmarks/throughput.py's measurement, each configuration in its own process): FedAvg rounds of
   CNN1 on 28×28×1 and ResNet-18-GN on 32×32×3 inputs, 64 clients, every client every round, 10 local SGD steps of
   batch 20; ``vmap`` with the patches form of the convolutions, and ``auto`` with its own choice.
2. **FedJAX's EMNIST benchmark workload end to end**, stood in by synthetic data of its shape (FedJAX's EMNIST-62
   cannot be downloaded here): 3,400 clients holding 671,585 training and 77,483 test images of 28×28×1 in 62
   classes, split over the clients with log-normal sizes of the real mean (not the real per-client sizes), 1,500
   rounds of FedAvg with 10 clients per round, one local epoch of batch 20 (client lr 0.1), the CNN ``cnn1_s`` (two
   3×3 convolutions of 16 and 32 channels, dense 256-128; FedJAX's has 32 and 64 channels and dense 128),
   evaluated at round 0 and at the end; run through :func:`fljax.run` with ``auto``. Target: under 2 minutes.

Writes ``benchmarks/results/gpu.{json,md}`` after each part (so a run stopped by the time limit keeps what it
measured). ``--dry-run`` runs every path at toy sizes on any backend in seconds and writes ``gpu_dry_run.*``.

    bash benchmarks/gpu.sh             # on the GPU machine
    bash benchmarks/gpu.sh --dry-run   # anywhere: checks the script
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import throughput  # noqa: E402  (benchmarks/throughput.py: the measurement and its table)

CONFIGS = [(w, ex, conv, "auto") for w in ("cnn1-28x28-64", "resnet18gn-32x32-64")
           for ex, conv in (("vmap", "patches"), ("auto", "auto"))]
EMNIST = {"clients": 3400, "train": 671_585, "test": 77_483, "classes": 62, "rounds": 1500, "cohort": 10,
          "batch_size": 20, "local_epochs": 1, "lr": 0.1, "model": "cnn1_s", "sigma": 0.6}
DRY = {"clients": 34, "train": 3400, "test": 340, "rounds": 3, "cohort": 2}


def emnist_like(spec: dict, seed: int = 0):
    """Synthetic stand-in of EMNIST-62's federated shape: ``spec['train']`` and ``spec['test']`` images split over
    ``spec['clients']`` clients with log-normal (σ = ``spec['sigma']``) sizes scaled to the totals, each client's
    test share proportional to its training share; pixels uniform, labels uniform."""
    import fljax.data as D

    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, spec["sigma"], spec["clients"])
    train = np.maximum(1, np.round(weights / weights.sum() * spec["train"]).astype(int))
    test = np.maximum(1, np.round(weights / weights.sum() * spec["test"]).astype(int))
    pairs = [[(rng.random((n, 28, 28, 1), np.float32), rng.integers(0, spec["classes"], n).astype(np.int32))
              for n in sizes] for sizes in (train, test)]
    return D.from_arrays(train=pairs[0], test=pairs[1], num_classes=spec["classes"], name="emnist-like")


def emnist_end_to_end(spec: dict) -> dict:
    """The whole FedJAX-EMNIST-shaped run through :func:`fljax.run`: wall seconds and summary.json's parts."""
    import fljax
    from fljax.models import make_model

    t0 = time.perf_counter()
    data = emnist_like(spec)
    built = time.perf_counter() - t0
    # the zoo's module passed as the run's own model (a config's model section is checked against the config's
    # data set, not against data passed in); it keeps the zoo model's choice of convolution implementation
    module = make_model(spec["model"], data.input_shape, data.num_classes).module
    config = {"algorithm": "fedavg", "rounds": spec["rounds"],
              "eval_every": spec["rounds"], "executor": "auto", "checkpoint_every": 0,
              "algo": {"cohort_size": spec["cohort"], "batch_size": spec["batch_size"],
                       "local_epochs": spec["local_epochs"], "lr": spec["lr"]}}
    t0 = time.perf_counter()
    result = fljax.run(config, data=data, model=module, progress=False)
    wall = time.perf_counter() - t0
    summary = result.runs[0].summary
    return {"data_seconds": built, "run_wall_seconds": wall, "executor": summary["executor"],
            **{k: summary[k] for k in ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds")},
            "client_steps_per_second": summary["client_steps_per_second"], "final": result.final,
            "clients": data.num_clients, "train_samples": int(np.asarray(data.train.mask).sum()),
            "max_client_size": int(data.train.n_max), "spec": spec}


def markdown(meta: dict, rows: list[dict], emnist: dict | None) -> str:
    text = ["# Accelerator benchmark" + (" (dry run: toy sizes)" if meta["dry_run"] else ""), "",
            throughput.markdown(meta, rows), "## FedJAX's EMNIST workload (synthetic stand-in), end to end", ""]
    if emnist is None:
        return "\n".join(text + ["not measured (stopped before this part)", ""])
    spec = emnist["spec"]
    text += [f"{emnist['clients']:,} clients ({emnist['train_samples']:,} training images, the largest client "
             f"{emnist['max_client_size']}), {spec['rounds']:,} rounds × {spec['cohort']} clients, model "
             f"{spec['model']}, executor {emnist['executor']}: **{emnist['run_wall_seconds']:.1f} s** of "
             f"`fljax.run` wall time (setup {emnist['setup_seconds']:.1f}, compile {emnist['compile_seconds']:.1f}, "
             f"rounds and evaluations {emnist['run_seconds']:.1f}, other {emnist['other_seconds']:.1f}), "
             f"{emnist['client_steps_per_second']:,.0f} client-steps/s; building the data took "
             f"{emnist['data_seconds']:.1f} s.", ""]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on any backend, seconds")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    from fljax.runner.files import write_json, write_text

    dry = args.dry_run
    peak = throughput.matmul_peak(256 if dry else 8192)
    meta = {**throughput.describe("bash benchmarks/gpu.sh" + (" --dry-run" if dry else ""), peak, 1 if dry else 3),
            "dry_run": dry}
    name = os.path.join(args.out, "gpu_dry_run" if dry else "gpu")
    rows, emnist = [], None

    def save():
        write_json(name + ".json", {"meta": meta, "throughput": rows, "emnist": emnist})
        write_text(name + ".md", markdown(meta, rows, emnist))

    configs = [c for c in CONFIGS if not (dry and c[0].startswith("resnet"))]  # its compile would dominate a dry run
    rows = throughput.measure_all(configs, meta["repeats"], dry, peak, clients=2 if dry else None)
    save()
    emnist = emnist_end_to_end({**EMNIST, **(DRY if dry else {})})
    save()
    print(markdown(meta, rows, emnist))


if __name__ == "__main__":
    main()
