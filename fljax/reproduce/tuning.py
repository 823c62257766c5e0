"""Tuning by gradient against grid search at the same cost (issue 39; docs/tuning.md): :data:`PROTOCOL` says what
runs, :data:`STUDY` holds the settings, the report goes to ``benchmarks/results/tuning/README.md``.

    python -m fljax.reproduce.tuning                       # the committed report (about 1 min on 2 cores)
    python -m fljax.reproduce.tuning --only digits --steps 4 --out /tmp/look   # a quick look
    python -m fljax.reproduce.tuning --render              # rebuild the report and figures from results.json.gz
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time

import numpy as np

__all__ = ["PROTOCOL", "STUDY", "run_dataset", "verdict", "render", "write_report", "main"]

STUDY = {
    "title": "Tuning FedAvg's client and server learning rates: hypergradient descent vs grid search",
    "out": "benchmarks/results/tuning",
    "base": {"algorithm": "fedavg", "rounds": 40, "seed": 0,
             "algo": {"cohort_size": 5, "local_steps": 5, "local_epochs": None, "batch_size": 10}},
    "datasets": {
        "digits": {"data": {"dataset": "digits", "num_clients": 20, "partition": "dirichlet", "alpha": 0.3},
                   "model": {"name": "mlp", "options": {"hidden": [32]}}},
        "mnist5k": {"data": {"dataset": "mnist5k", "num_clients": 20, "partition": "dirichlet", "alpha": 0.3},
                    "model": {"name": "mlp", "options": {"hidden": [32]}}},
        "synthetic": {"data": {"dataset": "synthetic", "num_clients": 20, "max_samples": 200},
                      "model": {"name": "logreg"}},
    },
    "box": {"algo.lr": [0.001, 1.0], "algo.server_lr": [0.1, 10.0]},  # the grid's box; tuning starts at its centre
    "metric": "global_loss",
    "val_fraction": 0.2,
    "steps": 20,
    "hyper_lr": 0.2,
    "repeats": 21,
    "eval_seeds": [100, 101, 102, 103, 104],
}


PROTOCOL = """\
For each data set, FedAvg's client and server learning rates are tuned on the clients' validation split (20 % of
every client's training rows, held out with the run seed, `fljax.hypergrad.holdout`; the metric is the global
model's validation loss after the last round) in two ways:

* **hypergradient descent** (`fljax.hypergrad.tune`): steps in (log lr, log server_lr) from the geometric centre
  of the grid's box along the negative reverse-mode hypergradient (per-round rematerialisation) of the run of seed
  0 + step (keys re-drawn), and again with the key fixed at seed 0, each step kept only where the run of the same
  seed is better (else halved and tried again); steps + 1 hypergradients and the runs at proposed points; its answer
  is the last point;
* **grid search** (`fljax.hypergrad.grid_search`): a log-spaced n × n grid over the box, all points lanes of one
  compiled program, the run of seed 0 each; its answer is the point of the lowest validation loss. n is what the
  descents' budget buys: g hypergradients and r runs cost g · c + r runs, c the measured time of one hypergradient
  over one run (medians of calls taken in turn), so n = ⌊√(g · c + r)⌋ (the mean over the two descents) and all
  spend the same client-steps in run-equivalents.

Wall times are of compiled programs (compilation is counted for neither). Every answer (and the start) is then
scored on five runs that neither method saw (seeds 100-104): the validation loss (what both minimise), the test loss
and the test accuracy (the clients' own test splits), mean ± sample std (ddof 1) over those seeds. The verdict
compares grid search with the better of the two descents."""


def _centre(box: dict) -> dict:
    return {k: math.sqrt(lo * hi) for k, (lo, hi) in box.items()}


def _median_seconds(fns: list, repeats: int) -> list[float]:
    """Median wall seconds of each callable after a warm-up call of each (it compiles), the callables timed in turn
    within every repeat so that load changes on a shared machine hit them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _scores(objective, lanes_of, point: dict, seeds: list[int]) -> dict:
    """The validation loss (the objective) and the test loss and accuracy (a plain run of the same simulation,
    scored on the clients' test splits) of ``point`` on every seed of ``seeds``."""
    from fljax.hypergrad import traced_key

    hp = {traced_key(k): v for k, v in point.items()}
    val = [objective.value(hp, s) for s in seeds]
    runs, _ = lanes_of(seeds, hp).run(objective.rounds, objective.rounds, progress=False, guards=())
    return {"val_loss": val, "test_loss": [r.final["global_loss"] for r in runs],
            "test_acc": [r.final["global_acc"] for r in runs]}


def run_dataset(name: str, study: dict = STUDY, steps: int | None = None, output=print) -> dict:
    """One data set of ``study``: both tunings, the equal-cost grid and the scores on fresh seeds."""
    from fljax import api
    from fljax.engine import Lanes
    from fljax.experiment import resolve
    from fljax.hypergrad import client_steps, grid_search, objective_of, traced_key, tune

    steps = study["steps"] if steps is None else steps
    config = copy.deepcopy(study["base"])
    for section, values in study["datasets"][name].items():
        config[section] = {**config.get(section, {}), **values}
    box, start = study["box"], _centre(study["box"])
    config["algo"].update({traced_key(k): v for k, v in start.items()})
    exp = resolve(api.make_config(config))
    data = api.load_data(exp)
    objective = objective_of(exp, data, list(box), metric=study["metric"], split="val",
                             val_fraction=study["val_fraction"])
    sim, seed = objective.sim, exp.seed
    out = {"dataset": name, "data": data.summary(), "client_steps": client_steps(sim, objective.rounds),
           "rounds": objective.rounds, "start": start}
    # c: one hypergradient over one run (both programs compiled here, outside every arm's wall time)
    run_s, grad_s = _median_seconds([lambda: objective.value(seed=seed), lambda: objective.value_and_grad(seed=seed)],
                                    study["repeats"])
    ratio = grad_s / run_s
    arms = {}
    for keys in ("redraw", "fixed"):
        t0 = time.perf_counter()
        result = tune(objective, steps, hyper_lr=study["hyper_lr"], keys=keys, seed=seed)
        arms[f"hypergradient ({keys} keys)"] = {"wall_seconds": time.perf_counter() - t0, "result": result.to_dict(),
                                               "point": result.final.hp, "gradients": result.gradients,
                                               "runs": result.runs}
        output(f"{name}: hypergradient descent, {keys} keys: {result.final.hp} (validation loss "
               f"{result.final.value:.4f})")
    spent = statistics.mean(_cost_runs({"ratio": ratio}, arm) for arm in arms.values())
    n = max(2, math.isqrt(int(spent)))
    grid = {k: list(np.geomspace(lo, hi, n)) for k, (lo, hi) in box.items()}
    grid_search(objective, grid, seed)  # compiles the grid's program, outside its wall time
    t0 = time.perf_counter()
    points = grid_search(objective, grid, seed)
    grid_wall = time.perf_counter() - t0
    best = min(points, key=lambda p: p[1] if math.isfinite(p[1]) else math.inf)
    arms["grid search"] = {"wall_seconds": grid_wall, "point": best[0], "points": len(points),
                           "grid": [[p, v] for p, v in points]}
    output(f"{name}: grid search, {n} x {n} points: {best[0]} (validation loss {best[1]:.4f})")
    out.update(run_seconds=run_s, gradient_seconds=grad_s, ratio=ratio, n=n)

    def lanes_of(seeds, hp):
        return Lanes(sim, seeds, hps=[hp] * len(seeds))

    for arm in arms.values():
        arm["scores"] = _scores(objective, lanes_of, arm["point"], study["eval_seeds"])
    out["start_scores"] = _scores(objective, lanes_of, start, study["eval_seeds"])
    out["arms"] = arms
    return out


# ---------------------------------------------------------------------------------------------------- report


def _mean_std(values) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "diverged"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def _cost_runs(r: dict, arm: dict) -> float:
    """An arm's cost in run-equivalents: hypergradients × the measured ratio + the runs at proposed points, or the
    grid's points."""
    return arm["gradients"] * r["ratio"] + arm["runs"] if "gradients" in arm else arm["points"]


def verdict(r: dict) -> str:
    """Which arm reaches the lower mean validation loss on the fresh seeds, at what cost, and whether the gap
    between grid search and the better hypergradient arm exceeds the larger of their seed standard deviations."""
    def stats(arm):
        values = arm["scores"]["val_loss"]
        if not all(math.isfinite(v) for v in values):
            return math.inf, 0.0
        return statistics.mean(values), statistics.stdev(values)

    arms = r["arms"]
    hyper = min((name for name in arms if name != "grid search"), key=lambda name: stats(arms[name])[0])
    (g, g_std), (h, h_std) = stats(arms["grid search"]), stats(arms[hyper])
    best = "grid search" if g < h else hyper
    within = abs(g - h) <= max(g_std, h_std)
    return (f"{best} reaches the lower validation loss on the fresh seeds: grid search {g:.4f} ± {g_std:.4f} at "
            f"{_cost_runs(r, arms['grid search']):.0f} run-equivalents, {hyper} {h:.4f} ± {h_std:.4f} at "
            f"{_cost_runs(r, arms[hyper]):.0f}; the difference, {abs(g - h):.4f}, is "
            + ("within" if within else "beyond") + " the larger seed standard deviation.")


def render(results: list[dict], study: dict, command: str, wall: float) -> str:
    from fljax.runner.report import markdown_table

    parts = [f"# {study['title']}", "", f"Command: `{command}` ({wall / 60:.1f} min on this machine's 2 shared CPU "
             f"cores, {study.get('date', '')}, load average {study.get('load', float('nan')):.1f} at the end).", "",
             "## Summary", "", *[f"* **{r['dataset']}**: {verdict(r)}" for r in results], "", "## Protocol", "",
             PROTOCOL, "",
             f"Settings: {study['base']['rounds']} rounds of FedAvg, cohorts of {study['base']['algo']['cohort_size']} "
             f"of 20 clients, {study['base']['algo']['local_steps']} local steps of batch "
             f"{study['base']['algo']['batch_size']}; box lr ∈ {study['box']['algo.lr']}, server_lr ∈ "
             f"{study['box']['algo.server_lr']}; {study['steps']} hypergradient steps of length up to "
             f"{study['hyper_lr']} in the logs; scores over seeds {study['eval_seeds']}."]
    for r in results:
        rows = [["start (the box's centre)", "0", "—", f"{r['start']['algo.lr']:.4g}",
                 f"{r['start']['algo.server_lr']:.4g}", _mean_std(r["start_scores"]["val_loss"]),
                 _mean_std(r["start_scores"]["test_loss"]), _mean_std(r["start_scores"]["test_acc"])]]
        for name, arm in r["arms"].items():
            what = f"{arm['gradients']} hypergradients + {arm['runs']} runs" if "gradients" in arm else (
                f"{arm['points']} runs ({r['n']} × {r['n']} lanes)")
            rows.append([name, f"{_cost_runs(r, arm):.0f} ({what})", f"{arm['wall_seconds']:.1f}",
                         f"{arm['point']['algo.lr']:.4g}", f"{arm['point']['algo.server_lr']:.4g}",
                         _mean_std(arm["scores"]["val_loss"]), _mean_std(arm["scores"]["test_loss"]),
                         _mean_std(arm["scores"]["test_acc"])])
        parts += ["", f"## {r['dataset']}", "", r["data"], "",
                  f"One run: {r['client_steps']:,} client-steps, {r['run_seconds'] * 1e3:.1f} ms; one hypergradient "
                  f"(reverse mode, per-round rematerialisation): {r['gradient_seconds'] * 1e3:.1f} ms, c = "
                  f"{r['ratio']:.2f} runs (medians of {study['repeats']} calls).", "",
                  markdown_table(rows, ["method", "cost (run-equivalents)", "wall s", "lr", "server_lr",
                                        "val loss", "test loss", "test acc"]), "",
                  f"**Verdict**: {verdict(r)}", "", f"![{r['dataset']}](tuning_{r['dataset']}.png)"]
    return "\n".join(parts) + "\n"


def figure(r: dict, path: str) -> None:
    """The grid's validation-loss surface with both descents' paths on it, and every answer's validation loss on
    the fresh seeds against its cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fljax.hypergrad import plot_surface
    from fljax.runner import files, plots

    with plt.rc_context(plots.rc()):
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
        grid = r["arms"]["grid search"]["grid"]
        paths = {name: [s["hp"] for s in arm["result"]["trajectory"]] for name, arm in r["arms"].items()
                 if "result" in arm}
        plot_surface(left, [(p, v) for p, v in grid], paths, chosen=r["arms"]["grid search"]["point"])
        left.set_title(f"{r['dataset']}: validation loss of the {r['n']} × {r['n']} grid (seed 0)")
        answers = [("start", 0.0, r["start_scores"])] + [(name, _cost_runs(r, arm), arm["scores"])
                                                           for name, arm in r["arms"].items()]
        for i, (name, cost, scores) in enumerate(answers):
            values = [v for v in scores["val_loss"] if math.isfinite(v)]
            if values:
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                right.errorbar([cost], [statistics.mean(values)], yerr=[std], label=name, capsize=3, ls="none",
                               **{k: v for k, v in plots.style(i).items() if k != "linestyle"})
        right.set(xlabel="cost (run-equivalents)", ylabel="validation loss (fresh seeds)",
                  title=f"each answer on {len(r['start_scores']['val_loss'])} fresh seeds: mean ± std")
        right.legend(fontsize=7)
        files.write_figure(path, fig)
        plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fljax.reproduce.tuning", description=__doc__.split(":data:")[0])
    p.add_argument("--only", help="comma-separated data sets (default: all of STUDY's)")
    p.add_argument("--steps", type=int, help="hypergradient steps (default: STUDY's)")
    p.add_argument("--out", default=STUDY["out"])
    p.add_argument("--render", action="store_true", help="only rebuild README.md and the figures from results.json.gz")
    args = p.parse_args(argv)
    from fljax.runner import files

    if args.render:
        saved = files.read_json(os.path.join(args.out, "results.json.gz"), expect=dict)
        write_report(saved["results"], saved["study"], saved["command"], saved["wall_seconds"], args.out)
        return 0

    names = list(STUDY["datasets"]) if not args.only else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in STUDY["datasets"]]
    if unknown:
        p.error(f"--only: no data set {unknown[0]!r}; choose from {list(STUDY['datasets'])}")
    study = {**STUDY, "steps": args.steps or STUDY["steps"], "date": time.strftime("%Y-%m-%d")}
    t0 = time.perf_counter()
    results = [run_dataset(n, study, output=lambda s: print(s, file=sys.stderr, flush=True)) for n in names]
    wall = time.perf_counter() - t0
    study["load"] = os.getloadavg()[0]
    command = "python -m fljax.reproduce.tuning" + ("" if not argv else " " + " ".join(argv))
    os.makedirs(args.out, exist_ok=True)
    files.write_json(os.path.join(args.out, "results.json.gz"), {"study": study, "command": command,
                                                              "wall_seconds": wall, "results": results})
    print(write_report(results, study, command, wall, args.out))
    return 0


def write_report(results: list[dict], study: dict, command: str, wall: float, out: str) -> str:
    """README.md and one figure per data set into ``out``; returns the report."""
    from fljax.runner import files

    for r in results:
        figure(r, os.path.join(out, f"tuning_{r['dataset']}.png"))
    text = render(results, study, command, wall)
    files.write_text(os.path.join(out, "README.md"), text)
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
