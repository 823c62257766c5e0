"""Seconds per decentralized round vs number of nodes, dense vs neighbour-gather gossip (DFedAlt issue, point 6).

Workload: DFedAvg with multinomial logistic regression (60 features → 10 classes, d = 610 parameters) on random data
(20 samples per node), 5 local SGD steps of batch 20, all nodes active, ``random_k`` with k = 10 redrawn every round
inside jit (k = m − 1 at m = 10). For every m it times

* ``round``: a whole round (local training, the draw of W, the gossip, the consensus distance) as a compiled block of
  rounds, per form: ``gossip_form='dense'`` (einsum with W [m, m], O(m²·d)) and ``'gather'`` (neighbour slots,
  O(m·(k+1)·d));
* ``gossip``: the mixing step alone on [m, d] parameters (the draw of W plus one gossip), per form.

Times are medians over ``--repeats`` timed calls after a warm-up call (compilation excluded); the four measurements
of one m are interleaved within every repeat, so load changes on a shared machine hit both forms alike. The crossover is the
smallest m from which the gather form is faster in every larger m measured.

    python benchmarks/gossip_scaling.py           # 10 … 10,000 nodes -> benchmarks/results/gossip_scaling.{json,md}
    python benchmarks/gossip_scaling.py --quick   # 10 … 300 nodes, a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import interleaved_medians  # noqa: E402  (benchmarks/machine.py)

NODES = (10, 30, 100, 300, 1000, 3000, 10000)
QUICK_NODES = (10, 30, 100, 300)
K, SAMPLES, FEATURES, CLASSES, STEPS, BATCH = 10, 20, 60, 10, 5, 20


def _data(m: int):
    import fljax.data as D

    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32) for _ in range(m)]
    ys = [rng.integers(0, CLASSES, SAMPLES).astype(np.int32) for _ in range(m)]
    arr = D.pad_clients(xs, ys)
    return D.FederatedData(train=arr, test=arr, num_classes=CLASSES, input_shape=(FEATURES,), name="random")


def round_fn(m: int, form: str):
    """A callable running a block of rounds, and the number of rounds in it."""
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model

    data = _data(m)
    algo = make_algorithm("dfedavg", topology="random_k", k=min(K, m - 1), gossip_form=form, batch_size=BATCH,
                          local_epochs=None, local_steps=STEPS, eval_point="gossip")
    sim = Simulation(algo, data, make_model("logreg", data.input_shape, CLASSES), executor="vmap", seed=0)
    state = sim.init()
    rounds = 10 if m <= 1000 else 2
    return (lambda: sim.run_rounds(state, rounds)[0]), rounds


def gossip_fn(m: int, form: str):
    """A callable drawing W and gossiping [m, d] parameters once."""
    import jax

    from fljax.ops import gossip

    topo = gossip.make_topology("random_k", m, k=min(K, m - 1))
    x = jax.random.normal(jax.random.PRNGKey(0), (m, (FEATURES + 1) * CLASSES))

    @jax.jit
    def step(key, x):
        mixing = topo.sample(key)
        if form == "dense":
            return gossip.gossip(mixing, x)
        return gossip.gossip_gather(mixing.idx, mixing.wts, x)

    return lambda: step(jax.random.PRNGKey(1), x)


def crossover(nodes: list[int], dense: list[float], gather: list[float]) -> int | None:
    """Smallest m from which gather is faster at every measured m ≥ it (None if never)."""
    best = None
    for m, d, g in reversed(list(zip(nodes, dense, gather))):
        if g < d:
            best = m
        else:
            break
    return best


def _write(path: str, text: str) -> None:
    """Atomic write (temporary file, then rename) with the usual permissions."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 … 300 nodes (a smoke run)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    import jax

    command = " ".join(["python benchmarks/gossip_scaling.py"] + list(sys.argv[1:] if argv is None else argv))
    nodes = list(QUICK_NODES if args.quick else NODES)
    rows = []
    for m in nodes:
        (dense, rounds), (gather, _) = round_fn(m, "dense"), round_fn(m, "gather")
        fns = {"round_dense": dense, "round_gather": gather, "gossip_dense": gossip_fn(m, "dense"),
               "gossip_gather": gossip_fn(m, "gather")}
        row = {"nodes": m, **interleaved_medians(fns, args.repeats)}
        row["round_dense"] /= rounds
        row["round_gather"] /= rounds
        rows.append(row)
        print(f"m={m:>6}: round dense {row['round_dense'] * 1e3:9.2f} ms, gather {row['round_gather'] * 1e3:9.2f} ms;"
              f" gossip dense {row['gossip_dense'] * 1e3:9.3f} ms, gather {row['gossip_gather'] * 1e3:9.3f} ms",
              flush=True)
    cross = {kind: crossover(nodes, [r[f"{kind}_dense"] for r in rows], [r[f"{kind}_gather"] for r in rows])
             for kind in ("round", "gossip")}
    meta = {"command": command, "jax": jax.__version__, "backend": jax.default_backend(),
            "device": str(jax.devices()[0]), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "workload": f"DFedAvg, logreg {FEATURES}->{CLASSES} (d={(FEATURES + 1) * CLASSES}), "
                        f"{SAMPLES} samples/node, "
                        f"{STEPS} local steps of batch {BATCH}, random_k k={K}", "repeats": args.repeats}
    name = "gossip_scaling_quick" if args.quick else "gossip_scaling"
    os.makedirs(args.out, exist_ok=True)
    _write(os.path.join(args.out, name + ".json"), json.dumps({"meta": meta, "rows": rows, "crossover": cross},
                                                              indent=1))
    lines = [f"# Gossip scaling: dense vs gather\n\nCommand: `{command}`  \n{meta['workload']}; "
             f"{meta['backend']} ({meta['cpu_count']} cores), jax {meta['jax']}; medians of {args.repeats} "
             "interleaved timed calls after a warm-up.\n",
             "| nodes | round, dense (s) | round, gather (s) | gather speed-up | gossip only, dense (ms) | "
             "gossip only, gather (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['round_dense']:.4g} | {r['round_gather']:.4g} | "
                     f"{r['round_dense'] / r['round_gather']:.2f}× | {1e3 * r['gossip_dense']:.4g} | "
                     f"{1e3 * r['gossip_gather']:.4g} |")
    lines.append("")
    for kind, label in (("round", "whole round"), ("gossip", "gossip step alone")):
        c = cross[kind]
        lines.append(f"Crossover ({label}): " + (f"gather is faster from m = {c} on (every larger m measured)."
                                                 if c is not None else "gather was never faster at every larger m."))
    _write(os.path.join(args.out, name + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
