"""A heterogeneous QuPeD population in one program vs the same clients one group after another.

Population (QuPeD spec §8, two architectures × two precisions): ``--models cnn``: CNN1-S 2-bit, CNN1-S FP, CNN2-S
2-bit, CNN2-S FP (λ_p 0.15 for the second architecture, D26); ``--models mlp``: MLP 128-64 and MLP 256-128-64 (the
same population with models that compile in seconds on a CPU); ``--per-group`` clients each, all distilled with
one FP global model of the first architecture, on noisy digits (class slots of 4 classes). ``together``: one Simulation with four client groups, every group vmapped inside
the round's one compiled program. ``one group after another``: four Simulations, one per group on its own clients
(the same per-client work, four programs called in turn; their global models are not coupled, which only makes the
work smaller). Reports client-steps/s (clients × τ local iterations per round / seconds; median of ``--repeats``
timed blocks of ``--rounds`` rounds after a warm-up) and compile seconds; writes
``results/quped_population_<models>.{json,md}``.

    python benchmarks/quped_population.py [--models cnn|mlp] [--per-group 5] [--rounds 5] [--repeats 3] [--unroll 1]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax

import fljax.data as D

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import time_rounds  # noqa: E402  (benchmarks/machine.py)
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.engine.population import ClientGroup
from fljax.models import make_model

HERE = os.path.dirname(os.path.abspath(__file__))
TAU, BATCH = 10, 12
PRECISIONS = (2, None)
ARCHITECTURES = {  # (global and first architecture, second architecture): --models
    "cnn": (("cnn1_s", {}), ("cnn2_s", {})),
    "mlp": (("mlp", {"hidden": [128, 64]}), ("mlp", {"hidden": [256, 128, 64]})),
}


def _algo(**kw):
    return make_algorithm("quped", lr=0.1, lr_gamma=0.97518, batch_size=BATCH, local_steps=TAU, epochs=100,
                          finetune_epochs=20, bits=2, **kw)


def _timed(sim, rounds: int, repeats: int) -> tuple[float, float]:
    """(median seconds per block of ``rounds`` rounds, compile seconds: the warm-up block's)."""
    _, compile_s, per_round = time_rounds(sim, sim.init(), rounds, repeats)
    return per_round * rounds, compile_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", choices=sorted(ARCHITECTURES), default="cnn")
    ap.add_argument("--per-group", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--unroll", default="auto", help="scan unroll of the local steps (auto: the engine's rule)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    n = args.per_group * 2 * len(PRECISIONS)
    data = D.make_federated("digits", n, "class_slots", seed=0, classes_per_client=4,
                            train_per_slot=max(1, min(33, 134 * 10 // (4 * n))), test_per_slot=2, noise=0.5,
                            test_per_class=40)
    first, second = (make_model(name, data.input_shape, data.num_classes, **opts)
                     for name, opts in ARCHITECTURES[args.models])
    groups = [ClientGroup(f"{tag}_{bits or 'fp'}", args.per_group, model, {"bits": bits, **extra})
              for tag, model, extra in (("a", first, {}), ("b", second, {"lam_p": 0.15})) for bits in PRECISIONS]
    steps = n * TAU * args.rounds
    rows = []
    sim = Simulation(_algo(), data, first, executor="vmap", seed=0, groups=groups, unroll=args.unroll)
    seconds, compile_s = _timed(sim, args.rounds, args.repeats)
    rows.append({"mode": "together (one program, 4 groups)", "seconds": seconds, "compile_seconds": compile_s,
                 "client_steps_per_s": steps / seconds})
    total, compile_total = 0.0, 0.0
    for g, group in enumerate(groups):
        part = jax.tree.map(lambda a: a[g * args.per_group:(g + 1) * args.per_group], data)
        one = Simulation(_algo(), part, first, executor="vmap", seed=0, groups=[group], unroll=args.unroll)
        s, c = _timed(one, args.rounds, args.repeats)
        total, compile_total = total + s, compile_total + c
    rows.append({"mode": "one group after another (4 programs)", "seconds": total, "compile_seconds": compile_total,
                 "client_steps_per_s": steps / total})
    meta = {"command": " ".join(["python benchmarks/quped_population.py"] + sys.argv[1:]), "clients": n,
            "models": [f"{name} {opts}" for name, opts in ARCHITECTURES[args.models]],
            "local_steps": TAU, "batch_size": BATCH, "rounds_per_block": args.rounds, "repeats": args.repeats,
            "unroll": args.unroll,
            "jax": jax.__version__, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")}
    md = markdown(meta, rows)
    from fljax.runner.files import write_json, write_text

    name = f"quped_population_{args.models}"
    write_json(os.path.join(args.out, name + ".json"), {"meta": meta, "rows": rows})
    write_text(os.path.join(args.out, name + ".md"), md)
    print(md)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"QuPeD population of {meta['clients']} clients ({' and '.join(meta['models'])}, each 2-bit and FP), "
             f"τ = {meta['local_steps']} iterations of batch {meta['batch_size']} per round, median of "
             f"{meta['repeats']} blocks of {meta['rounds_per_block']} rounds, scan unroll {meta['unroll']}. "
             f"Backend {meta['backend']} "
             f"({meta['cpu_count']} cores, {meta['devices'][0]}), jax {meta['jax']}. Command: `{meta['command']}`.",
             "", "| mode | client-steps/s | s per block | compile s |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['client_steps_per_s']:,.0f} | {r['seconds']:.2f} | "
                     f"{r['compile_seconds']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
