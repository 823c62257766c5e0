"""What a hypergradient of a whole run costs (issue 39; docs/tuning.md): time as a multiple of one forward run, and
peak working memory, for reverse mode with each rematerialisation and for forward mode, against the number of
rounds and the model's size.

Workload: FedAvg on Synthetic(1,1) (60 features, 10 classes), 20 clients, cohorts of 5, 5 local SGD steps of batch
10, lr 0.05, executor ``vmap``; the metric is the global model's loss on a validation split (20 % of every client's
rows, :func:`fljax.hypergrad.holdout`) after the last round; hyperparameters: the client and the server learning
rates (k = 2). Models: an MLP with one hidden layer of ``--hidden`` units (the rounds axis: ``--hidden-rounds``
units), at ``--size-rounds`` rounds for the size axis.

Rows, each compiled once (:class:`fljax.hypergrad.RunObjective`, through ``Simulation.compiled``) and timed as the
median of ``--repeats`` calls, all programs of one setting called in turn (``benchmarks/machine.py``'s
``interleaved_medians``) so that load changes hit them alike:

* ``run``: L(h) alone (the forward run and one evaluation);
* ``reverse/none``, ``reverse/round``, ``reverse/block``: ``jax.value_and_grad`` storing every round's
  intermediates, only the states (``jax.checkpoint`` per round), or the states at the ends of blocks of ⌈√T⌉ rounds;
* ``forward``: ``jax.jvp`` along the k = 2 unit tangents, vmapped.

``x run``: the row's median over the run's. Memory: XLA's count of the compiled program's temporaries
(``memory_analysis().temp_size_in_bytes``: the peak of everything it allocates beyond its arguments and outputs),
in MiB. Writes ``benchmarks/results/hypergrad.{json,md,png}``.

    python benchmarks/hypergrad.py                        # the committed results (about 15 min on 2 shared cores)
    python benchmarks/hypergrad.py --rounds 10,50 --sizes 32 --repeats 2 --out /tmp/hg   # a quick look
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import interleaved_medians  # noqa: E402  (benchmarks/machine.py)

import fljax.data as D  # noqa: E402
from fljax import hypergrad as H  # noqa: E402
from fljax.algorithms import make_algorithm  # noqa: E402
from fljax.engine import Simulation  # noqa: E402
from fljax.models import make_model  # noqa: E402

ALGO = dict(lr=0.05, cohort_size=5, local_steps=5, batch_size=10, local_epochs=None)
KEYS = ["lr", "server_lr"]
ROWS = ("run", "reverse/none", "reverse/round", "reverse/block", "forward")


def measure(data, hidden: int, rounds: int, repeats: int) -> dict:
    """One setting: every row's median seconds, multiple of the run, and XLA temporaries (MiB)."""
    train, val = H.holdout(data, 0.2, seed=0)
    model = make_model("mlp", data.input_shape, data.num_classes, hidden=[hidden])
    sim = Simulation(make_algorithm("fedavg", **ALGO), train, model, executor="vmap")
    objectives = {remat: H.RunObjective(sim, KEYS, rounds, eval_data=train.replace(test=val), remat=remat)
                  for remat in H.REMAT}
    base = objectives["round"]
    calls = {"run": lambda: base.value(seed=0),
             **{f"reverse/{r}": (lambda o: lambda: o.value_and_grad(seed=0))(o) for r, o in objectives.items()},
             "forward": lambda: base.value_and_grad(seed=0, mode="forward")}
    c0 = time.perf_counter()
    for call in calls.values():  # compile every program first (the timing below then sees warm programs only)
        call()
    compile_s = time.perf_counter() - c0
    seconds = interleaved_medians(calls, repeats)
    memory = {"run": base.temp_bytes("value"), "forward": base.temp_bytes("forward"),
              **{f"reverse/{r}": o.temp_bytes("reverse") for r, o in objectives.items()}}
    return {"hidden": hidden, "params": model.num_params(), "rounds": rounds, "block": base.block,
            "client_steps": H.client_steps(sim, rounds), "compile_seconds": compile_s,
            "rows": {name: {"seconds": seconds[name], "x_run": seconds[name] / seconds["run"],
                            "temp_mib": None if memory[name] is None else memory[name] / 2 ** 20}
                     for name in ROWS}}


def table(results: list[dict]) -> str:
    from fljax.runner.report import markdown_table

    rows = []
    for r in results:
        for name in ROWS:
            row = r["rows"][name]
            rows.append([str(r["rounds"]), f"{r['params']:,}", name, f"{row['seconds'] * 1e3:.1f}",
                         f"{row['x_run']:.2f}", "" if row["temp_mib"] is None else f"{row['temp_mib']:.2f}"])
    return markdown_table(rows, ["rounds", "params", "row", "ms (median)", "x run", "XLA temp MiB"])


def figure(by_rounds: list[dict], by_size: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fljax.runner import files, plots

    with plt.rc_context(plots.rc()):
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), layout="constrained")
        for i, name in enumerate(ROWS[1:], 1):
            axes[0].plot([r["rounds"] for r in by_rounds], [r["rows"][name]["x_run"] for r in by_rounds],
                         label=name, **plots.style(i))
            axes[1].plot([r["rounds"] for r in by_rounds], [r["rows"][name]["temp_mib"] for r in by_rounds],
                         label=name, **plots.style(i))
            axes[2].plot([r["params"] for r in by_size], [r["rows"][name]["x_run"] for r in by_size], label=name,
                         **plots.style(i))
        axes[1].plot([r["rounds"] for r in by_rounds], [r["rows"]["run"]["temp_mib"] for r in by_rounds],
                     label="run", **plots.style(0))
        axes[0].set(xlabel="rounds T", ylabel="time / one run", title=f"cost vs rounds (MLP, "
                    f"{by_rounds[0]['params']:,} params)")
        axes[1].set(xlabel="rounds T", ylabel="XLA temporaries (MiB)", title="peak working memory vs rounds")
        axes[2].set(xlabel="model parameters", ylabel="time / one run", title=f"cost vs model size "
                    f"({by_size[0]['rounds']} rounds)")
        for ax in axes:
            plots.log_axis(ax, "x")
        plots.log_axis(axes[1], "y")
        axes[0].legend(fontsize=7)
        axes[1].legend(fontsize=7)
        files.write_figure(path, fig)
        plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", default="10,50,200,500", help="the rounds axis (comma-separated)")
    p.add_argument("--hidden-rounds", type=int, default=32, help="hidden units of the MLP on the rounds axis")
    p.add_argument("--sizes", default="8,64,512", help="hidden units of the MLPs on the size axis")
    p.add_argument("--size-rounds", type=int, default=50, help="rounds on the size axis")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    data = D.make_federated("synthetic", 20, seed=0, max_samples=200)
    t0 = time.perf_counter()
    by_rounds = [measure(data, args.hidden_rounds, int(t), args.repeats) for t in args.rounds.split(",")]
    for r in by_rounds:
        print(f"rounds {r['rounds']}: " + ", ".join(f"{n} {v['x_run']:.2f}x" for n, v in r["rows"].items()),
              flush=True)
    by_size = [measure(data, int(h), args.size_rounds, args.repeats) for h in args.sizes.split(",")]
    wall = time.perf_counter() - t0
    command = "python benchmarks/hypergrad.py" + ("" if argv is None else " " + " ".join(argv))
    meta = {"command": command, "wall_seconds": wall, "load_average": os.getloadavg(), "jax": jax.__version__,
            "device": str(jax.devices()[0]), "machine": platform.machine(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}
    os.makedirs(args.out, exist_ok=True)
    from fljax.runner import files

    files.write_json(os.path.join(args.out, "hypergrad.json"), {"meta": meta, "rounds": by_rounds, "size": by_size})
    text = (f"# Hypergradient cost and memory\n\nCommand: `{command}` ({wall / 60:.1f} min, {meta['date']}, "
            f"{meta['cpus']} CPU cores, load average {meta['load_average'][0]:.1f} at the end, jax {jax.__version__})."
            f"\n\n{__doc__.split(chr(10) + chr(10), 1)[1].rsplit(chr(10) + chr(10), 1)[0]}\n\n"
            f"## Against rounds (MLP {args.hidden_rounds} hidden units)\n\n{table(by_rounds)}\n\n"
            f"## Against model size ({args.size_rounds} rounds)\n\n{table(by_size)}\n")
    files.write_text(os.path.join(args.out, "hypergrad.md"), text)
    figure(by_rounds, by_size, os.path.join(args.out, "hypergrad.png"))
    print(table(by_rounds + by_size))
    print(f"wrote {args.out}/hypergrad.{{md,json,png}} in {wall / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
