"""Reduced-scale reproduction of FedSLR (Huang et al., TMLR) and its baselines on digits (FedSLR spec §8).

    python -m fljax.reproduce.fedslr                                 # every study, 3 seeds, 300 rounds
    python -m fljax.reproduce.fedslr --only table --seeds 1 --rounds 30   # a quick look

Protocol (spec §8): scikit-learn digits scaled to [0, 1], 50 images per class held out as the test pool; M = 20
clients of n_i = 50 samples from the equal-size client sampler (Dir(0.1) class priors, or 2 classes per client for
the pathological split; exhausted class pools are refilled, D15); per-client test sets of ⌊prop_{i,c}·50⌋ images per
class (D16); 5 clients per round, T = 300 rounds, B = 10, 2 local epochs (FedSLR: E1 = 2, E2 = 1),
η_l(t) = 0.1·0.998^t, weight decay 1e-3; FedSLR η_g = 10, λ = 1e-3, μ = 1e-3. Model: the spec's reduced CNN
(``fedslr_cnn``, 23,648 parameters, PyTorch init). Accuracy = final round, unweighted mean over the 20 clients of
per-client accuracy; mean ± std (ddof 0) over seeds.

Studies (``--only``):
* ``table``: Table 1 (reduced): every baseline and FedSLR (GKR and mixed) on Dir(0.1) and pathological(2), with
  communication and model size (Table 2).
* ``lambda``: FedSLR for λ ∈ {0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2} (the spec's grid plus 3e-3) on Dir(0.1):
  accuracy, GKR rank density, parameters and downlink bytes (Table 3).
* ``mu``: FedSLR for μ ∈ {0, 1e-3, 1e-2, 1e-1} on Dir(0.1): accuracy and non-zeros of p_i (Table 4).
* ``extras``: the trends of claim 5: IID split (FedSLR, FedAvg), one Phase-I epoch (Table 6), pure personal
  (λ = 10 zeroes the GKR, Table 7; p starts as a copy of w_0, the authors' code, since a zero p on a zero GKR has
  zero gradient) and pure global (μ = 1 keeps p at zero, Table 8).
Then the qualitative claims 1–5 of spec §8 are checked. Outputs in ``--out`` (default
``benchmarks/results/fedslr``): ``results.json`` (every run's history, written after each run, so an interrupted
reproduction resumes where it stopped), ``README.md`` (tables and claims with the command), ``curves.png`` and
``sweeps.png``. ``--render`` rebuilds the report from an existing ``results.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from fljax.runner.files import write_png, write_text

__all__ = ["main", "SPLITS", "METHODS", "make_data", "run_one"]

NUM_CLIENTS, SAMPLES_PER_CLIENT, TEST_PER_CLIENT = 20, 50, 50
SPLITS = {  # name: (partition, options)
    "dir0.1": ("client_dirichlet", {"alpha": 0.1}),
    "pat2": ("client_pathological", {"classes_per_client": 2}),
    "iid": ("iid", {}),
}
SPLIT_TITLES = {"dir0.1": "Dir(0.1)", "pat2": "Pathological(2)", "iid": "IID"}
TABLE_SPLITS = ("dir0.1", "pat2")
COMMON = dict(cohort_size=5, lr=0.1, lr_decay=0.998, weight_decay=1e-3, batch_size=10, local_epochs=2)
FEDSLR = dict(COMMON, lam=1e-3, mu=1e-3, eta_g=10.0, personal_epochs=1)
# The papers' own values (Per-FedAvg α = 0.01, β = 0.001 from the FedSLR paper; pFedMe's MNIST η = 0.005, λ = 15,
# η_p = 0.1, K = 5) barely move the model in 300 rounds of 10 steps; the rows without "paper" use the best of a small
# grid on seed 0, Dir(0.1) (docs/fedslr.md): Per-FedAvg β ∈ {0.001, 0.01, 0.03, 0.1}, pFedMe (η, λ) ∈ {(0.005, 15),
# (0.05, 15), (0.1, 5)}.
PERFEDAVG = dict(cohort_size=5, alpha=0.01, beta=0.001, weight_decay=1e-3, batch_size=10, local_epochs=2)
PFEDME = dict(COMMON, lr=0.005, lr_decay=1.0, lam=15.0, personal_lr=0.1, inner_steps=5, local_steps=None)
# label: (algorithm, hyperparameters, the model Table 1 reports: "global" or "personal")
METHODS = {
    "FedAvg": ("fedavg", COMMON, "global"),
    "FedProx": ("fedprox", dict(COMMON, mu=0.01), "global"),
    "SCAFFOLD": ("scaffold", COMMON, "global"),
    "FedDyn": ("feddyn", dict(COMMON, alpha=0.1), "global"),
    "FedSLR (GKR)": ("fedslr", FEDSLR, "global"),
    "FedAvg-FT": ("fedavg_ft", dict(COMMON, finetune_steps=5), "personal"),
    "Per-FedAvg (FO, paper β)": ("perfedavg", PERFEDAVG, "personal"),
    "Per-FedAvg (FO)": ("perfedavg", dict(PERFEDAVG, beta=0.1), "personal"),
    "Per-FedAvg (HF)": ("perfedavg", dict(PERFEDAVG, beta=0.1, hvp_mode="exact"), "personal"),
    "pFedMe (paper η, λ)": ("pfedme", PFEDME, "personal"),
    "pFedMe": ("pfedme", dict(PFEDME, lr=0.1, lam=5.0), "personal"),
    "LG-FedAvg": ("lg_fedavg", COMMON, "personal"),
    "FedPer": ("fedper", COMMON, "personal"),
    "FedRep": ("fedrep", dict(COMMON, head_epochs=1, body_epochs=2), "personal"),
    "Ditto": ("ditto", dict(COMMON, lam=0.1, personal_epochs=1), "personal"),
    "APFL": ("apfl", dict(COMMON, alpha=0.5), "personal"),
    "Local": ("local", COMMON, "personal"),
    "FedSLR (mixed)": ("fedslr", FEDSLR, "personal"),
}
LAMBDAS = (0.0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2)
MUS = (0.0, 1e-3, 1e-2, 1e-1)
EXTRAS = {  # label: (split, algorithm, hyperparameters)
    "FedSLR IID": ("iid", "fedslr", FEDSLR),
    "FedAvg IID": ("iid", "fedavg", COMMON),
    "FedSLR E1=1": ("dir0.1", "fedslr", dict(FEDSLR, local_epochs=1)),
    "pure personal (λ=10)": ("dir0.1", "fedslr", dict(FEDSLR, lam=10.0, p_init="copy_w0")),
    "pure global (μ=1)": ("dir0.1", "fedslr", dict(FEDSLR, mu=1.0)),
}
STUDIES = ("table", "lambda", "mu", "extras")
DEFAULT_OUT = os.path.join("benchmarks", "results", "fedslr")
HISTORY_KEYS = ("round", "personal_acc", "global_acc", "train_loss", "bytes_up", "bytes_down", "gkr_rank_density",
                "gkr_params", "sparse_nnz_frac", "mixed_params", "mixed_params_std")


def make_data(split: str, seed: int):
    """The federated digits split of spec §8 for one seed (test rows padded to 50, one shape for every seed)."""
    from fljax.data import make_federated, pad_clients

    partition, options = SPLITS[split]
    data = make_federated("digits", NUM_CLIENTS, partition, seed, samples_per_client=SAMPLES_PER_CLIENT,
                          test_per_client=TEST_PER_CLIENT, test_rounding="floor", **options)
    test = data.test
    counts = np.asarray(test.count)
    xs = [np.asarray(test.x[i, :c]) for i, c in enumerate(counts)]
    ys = [np.asarray(test.y[i, :c]) for i, c in enumerate(counts)]
    return data.replace(test=pad_clients(xs, ys, n_max=TEST_PER_CLIENT))


def run_key(split: str, algorithm: str, hyper: dict, seed: int, rounds: int, eval_every: int) -> str:
    """A canonical key: identical runs requested by several studies are run once."""
    hp = ",".join(f"{k}={hyper[k]!r}" for k in sorted(hyper))
    return f"{algorithm}|{hp}|{split}|seed={seed}|T={rounds}|every={eval_every}"


def run_one(split: str, algorithm: str, hyper: dict, seed: int, rounds: int, eval_every: int) -> dict:
    """One run with the ``auto`` executor; returns its evaluation history, the model's parameter count and timings."""
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model

    data = make_data(split, seed)
    model = make_model("fedslr_cnn", data.input_shape, data.num_classes)
    sim = Simulation(make_algorithm(algorithm, **hyper), data, model, executor="auto", seed=seed)
    t0 = time.perf_counter()
    result = sim.run(rounds, eval_every, progress=False)
    history = {k: [rec[k] for rec in result.history] for k in HISTORY_KEYS if k in result.history[0]}
    history.update({k: [rec[k] for rec in result.history] for k in result.history[0] if k.startswith("rank/")})
    return {"history": history, "num_params": model.num_params(), "executor": sim.executor.describe(),
            "run_seconds": result.run_seconds, "compile_seconds": result.compile_seconds,
            "wall_seconds": time.perf_counter() - t0}


def _worker_init(cache: str) -> None:
    if cache:
        import jax

        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _run_job(job):
    return job[0], run_one(*job[1:])


# ---------------------------------------------------------------------------------------------------- planning


def cells(studies, seeds: int, rounds: int, eval_every: int) -> dict[str, list[tuple]]:
    """(study, label, split) → the runs it needs, as (key, split, algorithm, hyper, seed, rounds, eval_every)."""
    out: dict = {}

    def add(study, label, split, algorithm, hyper):
        out[(study, label, split)] = [(run_key(split, algorithm, hyper, s, rounds, eval_every), split, algorithm,
                                       hyper, s, rounds, eval_every) for s in range(seeds)]

    for study in studies:
        if study == "table":
            for split in TABLE_SPLITS:
                for label, (algorithm, hyper, _) in METHODS.items():
                    add("table", label, split, algorithm, hyper)
        elif study == "lambda":
            for lam in LAMBDAS:
                add("lambda", f"λ={lam:g}", "dir0.1", "fedslr", dict(FEDSLR, lam=lam))
        elif study == "mu":
            for mu in MUS:
                add("mu", f"μ={mu:g}", "dir0.1", "fedslr", dict(FEDSLR, mu=mu))
        else:
            for label, (split, algorithm, hyper) in EXTRAS.items():
                add("extras", label, split, algorithm, hyper)
    return out


# ---------------------------------------------------------------------------------------------------- summaries


def _runs(results: dict, study: str, label: str, split: str) -> list[dict]:
    keys = results["cells"].get(f"{study}|{label}|{split}", [])
    return [results["runs"][k] for k in keys if k in results["runs"]]


def final(results: dict, study: str, label: str, split: str, metric: str) -> np.ndarray:
    """The final evaluation's ``metric`` of every seed (empty when the cell or the metric is missing)."""
    return np.array([r["history"][metric][-1] for r in _runs(results, study, label, split)
                     if metric in r["history"]])


def fmt(values: np.ndarray, scale: float = 100.0, digits: int = 2) -> str:
    """'mean ± std' (ddof 0), or '-' when there are no runs."""
    if values.size == 0:
        return "-"
    return f"{scale * values.mean():.{digits}f} ± {scale * values.std():.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def reported(label: str) -> str:
    """The accuracy Table 1 reports for a method: its global model's or its personalized model's."""
    return f"{METHODS[label][2]}_acc"


def model_params(results: dict, label: str, split: str) -> np.ndarray:
    """# of parameters of the deployed model (spec §5, D28): FedSLR GKR D_T and mixed D_T + nnz(p_i); APFL two
    models; every other method the dense count."""
    if label == "FedSLR (GKR)":
        return final(results, "table", label, split, "gkr_params")
    if label == "FedSLR (mixed)":
        return final(results, "table", label, split, "mixed_params")
    runs = _runs(results, "table", label, split)
    return np.array([r["num_params"] * (2 if label == "APFL" else 1) for r in runs], float)


def comm_mb(results: dict, study: str, label: str, split: str, which: str = "both") -> np.ndarray:
    """Cumulative bytes over the run in MB (1e6 B): up, down or both."""
    parts = ("bytes_up", "bytes_down") if which == "both" else (f"bytes_{which}",)
    return sum(final(results, study, label, split, p) for p in parts) / 1e6


def table1(results: dict) -> str:
    header = ["Method", "reported model"] + [SPLIT_TITLES[s] for s in TABLE_SPLITS] + [
        "comm. up+down (MB)", "# params (k)"]
    rows = []
    for label in METHODS:
        acc = [fmt(final(results, "table", label, s, reported(label))) for s in TABLE_SPLITS]
        params = model_params(results, label, "dir0.1")
        rows.append([label, METHODS[label][2]] + acc + [fmt(comm_mb(results, "table", label, "dir0.1"), 1, 1),
                                                        fmt(params, 1e-3, 2)])
    return markdown_table(header, rows)


def table_all(results: dict) -> str:
    """Both accuracies of every method (the global model's where it has one)."""
    header = ["Method"] + [f"{SPLIT_TITLES[s]} {kind}" for s in TABLE_SPLITS for kind in ("global", "personal")]
    rows = []
    for label in METHODS:
        if label == "FedSLR (mixed)":
            continue
        name = "FedSLR" if label == "FedSLR (GKR)" else label
        rows.append([name] + [fmt(final(results, "table", label, s, f"{k}_acc")) for s in TABLE_SPLITS
                              for k in ("global", "personal")])
    return markdown_table(header, rows)


def table_lambda(results: dict) -> str:
    header = ["λ", "GKR acc", "mixed acc", "GKR rank density", "GKR # params (k)", "mixed # params (k)",
              "downlink (MB)", "downlink vs dense"]
    rows = []
    for lam in LAMBDAS:
        label = f"λ={lam:g}"
        f = lambda m, lab=label: final(results, "lambda", lab, "dir0.1", m)  # noqa: E731
        down, up = f("bytes_down"), f("bytes_up")
        rows.append([f"{lam:g}", fmt(f("global_acc")), fmt(f("personal_acc")), fmt(f("gkr_rank_density"), 1, 3),
                     fmt(f("gkr_params"), 1e-3, 2), fmt(f("mixed_params"), 1e-3, 2), fmt(down / 1e6, 1, 2),
                     fmt(down / up if up.size else up, 100, 1) + " %"])
    return markdown_table(header, rows)


def table_mu(results: dict) -> str:
    header = ["μ", "mixed acc", "GKR acc", "nnz(p_i)/numel", "mixed # params (k)", "std over clients (k)"]
    rows = []
    for mu in MUS:
        label = f"μ={mu:g}"
        f = lambda m, lab=label: final(results, "mu", lab, "dir0.1", m)  # noqa: E731
        rows.append([f"{mu:g}", fmt(f("personal_acc")), fmt(f("global_acc")), fmt(f("sparse_nnz_frac"), 1, 4),
                     fmt(f("mixed_params"), 1e-3, 2), fmt(f("mixed_params_std"), 1e-3, 2)])
    return markdown_table(header, rows)


def table_extras(results: dict) -> str:
    header = ["run", "split", "GKR / global acc", "mixed / personal acc"]
    rows = [[label, SPLIT_TITLES[split], fmt(final(results, "extras", label, split, "global_acc")),
             fmt(final(results, "extras", label, split, "personal_acc"))] for label, (split, _, _) in EXTRAS.items()]
    return markdown_table(header, rows)


def _mean(results, study, label, split, metric) -> float:
    v = final(results, study, label, split, metric)
    return float(v.mean()) if v.size else float("nan")


def claims(results: dict) -> list[tuple[str, str, str]]:
    """Spec §8 claims 1–4 (gated) on the 3-seed means; NaN (missing study) reads 'not run'."""
    out = []

    def verdict(ok, values):
        return "not run" if any(np.isnan(values)) else ("holds" if ok else "FAILS")

    for split in TABLE_SPLITS:
        mixed = _mean(results, "table", "FedSLR (mixed)", split, "personal_acc")
        gkr = _mean(results, "table", "FedSLR (GKR)", split, "global_acc")
        fedavg = _mean(results, "table", "FedAvg", split, "global_acc")
        out.append((f"1. {SPLIT_TITLES[split]}: mixed > FedAvg and > GKR",
                    f"mixed {100 * mixed:.2f}, FedAvg {100 * fedavg:.2f}, GKR {100 * gkr:.2f}",
                    verdict(mixed > fedavg and mixed > gkr, [mixed, fedavg, gkr])))
    dens = [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", "gkr_rank_density") for lam in LAMBDAS]
    params = [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", "gkr_params") for lam in LAMBDAS]
    ok = (all(a >= b for a, b in zip(dens, dens[1:])) and dens[-1] < 1
          and all(a >= b for a, b in zip(params, params[1:])))
    out.append(("2. rank density non-increasing in λ, < 1 at the largest; GKR # params follows",
                "density " + ", ".join(f"{d:.3f}" for d in dens) + "; params " + ", ".join(f"{p:.0f}" for p in params),
                verdict(ok, dens + params)))
    nnz = [_mean(results, "mu", f"μ={mu:g}", "dir0.1", "sparse_nnz_frac") for mu in MUS]
    out.append(("3. nnz(p_i)/numel non-increasing in μ", ", ".join(f"{v:.4f}" for v in nnz),
                verdict(all(a >= b for a, b in zip(nnz, nnz[1:])), nnz)))
    down = [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", "bytes_down") for lam in LAMBDAS]
    up = [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", "bytes_up") for lam in LAMBDAS]
    dense = up[0]
    ok = (all(d <= dense * (1 + 1e-9) for d in down[1:]) and down[-1] < dense and down[-2] < dense
          and all(a >= b for a, b in zip(down[1:], down[2:])) and all(u == dense for u in up))
    out.append(("4. downlink ≤ dense for λ > 0, < dense at the two largest λ, non-increasing; uplink = dense",
                "downlink/dense " + ", ".join(f"{d / dense:.3f}" for d in down) if dense == dense else "-",
                verdict(ok, down + up)))
    return out


def trends(results: dict) -> list[tuple[str, str]]:
    """Claim 5: reported, not gated (points are accuracy percentage points)."""
    m = lambda study, label, split, metric: 100 * _mean(results, study, label, split, metric)  # noqa: E731
    rows = []
    g, p = m("extras", "FedSLR IID", "iid", "global_acc"), m("extras", "FedSLR IID", "iid", "personal_acc")
    rows.append(("IID: mixed − GKR (paper: 1.45 to 3.12 below)", f"{p - g:+.2f} (mixed {p:.2f}, GKR {g:.2f}, FedAvg "
                 f"{m('extras', 'FedAvg IID', 'iid', 'global_acc'):.2f})"))
    accs = [m("lambda", f"λ={lam:g}", "dir0.1", "global_acc") for lam in LAMBDAS]
    mixed = [m("lambda", f"λ={lam:g}", "dir0.1", "personal_acc") for lam in LAMBDAS]
    rows.append(("GKR / mixed accuracy over λ = " + ", ".join(f"{lam:g}" for lam in LAMBDAS) + " (Table 3: too "
                 "large a λ lowers accuracy)", " / ".join(", ".join(f"{a:.2f}" for a in v) for v in (accs, mixed))))
    for split in TABLE_SPLITS:
        gap = m("table", "FedSLR (GKR)", split, "global_acc") - m("table", "FedAvg", split, "global_acc")
        rows.append((f"{SPLIT_TITLES[split]}: GKR − FedAvg (paper: ≥ 0 on non-IID)", f"{gap:+.2f}"))
    e1 = m("extras", "FedSLR E1=1", "dir0.1", "personal_acc"), m("extras", "FedSLR E1=1", "dir0.1", "global_acc")
    e2 = m("table", "FedSLR (mixed)", "dir0.1", "personal_acc"), m("table", "FedSLR (GKR)", "dir0.1", "global_acc")
    rows.append(("E1 = 1 vs 2 Phase-I epochs, mixed / GKR (Table 6: 1 is worse)",
                 f"{e1[0]:.2f} vs {e2[0]:.2f} / {e1[1]:.2f} vs {e2[1]:.2f}"))
    pp = m("extras", "pure personal (λ=10)", "dir0.1", "personal_acc")
    pg = m("extras", "pure global (μ=1)", "dir0.1", "personal_acc")
    rows.append(("pure personal < pure global < mixed (Tables 7, 8)", f"{pp:.2f} < {pg:.2f} < {e2[0]:.2f}: "
                 f"{'yes' if pp < pg < e2[0] else 'no'}"))
    return rows


def timing(results: dict) -> str:
    by_algo: dict = {}
    for key, r in results["runs"].items():
        by_algo.setdefault(key.split("|")[0], []).append(r)
    rows = [[a, r[0]["executor"], str(len(r)), f"{np.mean([x['run_seconds'] for x in r]):.1f}",
             f"{np.mean([x['compile_seconds'] for x in r]):.1f}", f"{np.mean([x['wall_seconds'] for x in r]):.1f}"]
            for a, r in sorted(by_algo.items())]
    return markdown_table(["algorithm", "executor", "runs", "run s (mean)", "compile s (mean)", "wall s (mean)"], rows)


# ---------------------------------------------------------------------------------------------------- outputs


def _curve(results, study, label, split, metric):
    runs = [r for r in _runs(results, study, label, split) if metric in r["history"]]
    if not runs:
        return None, None
    return np.array(runs[0]["history"]["round"]), np.mean([r["history"][metric] for r in runs], axis=0)


def plots(results: dict, out: str) -> list[str]:
    """curves.png (Table-1 methods vs round) and sweeps.png (λ and μ sweeps); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name):
        path = os.path.join(out, name)
        write_png(path, fig)
        plt.close(fig)
        written.append(path)

    if _runs(results, "table", "FedAvg", "dir0.1"):
        fig, axes = plt.subplots(1, len(TABLE_SPLITS), figsize=(13, 4.5), sharey=True)
        for ax, split in zip(axes, TABLE_SPLITS):
            for label in METHODS:
                r, acc = _curve(results, "table", label, split, reported(label))
                if r is not None:
                    ax.plot(r, 100 * acc, label=label, lw=2.4 if label.startswith("FedSLR") else 1.1,
                            ls="--" if METHODS[label][2] == "global" else "-")
            ax.set_title(f"{SPLIT_TITLES[split]}: reported accuracy (mean of seeds; dashed = global model)")
            ax.set_xlabel("round")
        axes[0].set_ylabel("%")
        axes[-1].legend(fontsize=7, ncol=2, loc="lower right")
        save(fig, "curves.png")
    if _runs(results, "lambda", "λ=0", "dir0.1") or _runs(results, "mu", "μ=0", "dir0.1"):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        lam_x = [lam for lam in LAMBDAS if _runs(results, "lambda", f"λ={lam:g}", "dir0.1")]
        pos = np.arange(len(lam_x))
        for metric, name in (("gkr_rank_density", "GKR rank density"),):
            axes[0].plot(pos, [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", metric) for lam in lam_x], "o-",
                         label=name)
        down = [_mean(results, "lambda", f"λ={lam:g}", "dir0.1", "bytes_down") /
                _mean(results, "lambda", f"λ={lam:g}", "dir0.1", "bytes_up") for lam in lam_x]
        axes[0].plot(pos, down, "s-", label="downlink / dense")
        axes[0].set_xticks(pos, [f"{lam:g}" for lam in lam_x])
        axes[0].set_xlabel("λ")
        axes[0].set_title("λ sweep: rank and downlink (Dir(0.1), final round)")
        axes[0].legend(fontsize=8)
        for metric, name in (("global_acc", "GKR"), ("personal_acc", "mixed")):
            axes[1].plot(pos, [100 * _mean(results, "lambda", f"λ={lam:g}", "dir0.1", metric) for lam in lam_x],
                         "o-", label=name)
        axes[1].set_xticks(pos, [f"{lam:g}" for lam in lam_x])
        axes[1].set_xlabel("λ")
        axes[1].set_title("λ sweep: accuracy (%)")
        axes[1].legend(fontsize=8)
        mu_x = [mu for mu in MUS if _runs(results, "mu", f"μ={mu:g}", "dir0.1")]
        pos = np.arange(len(mu_x))
        axes[2].plot(pos, [_mean(results, "mu", f"μ={mu:g}", "dir0.1", "sparse_nnz_frac") for mu in mu_x], "o-",
                     label="nnz(p_i)/numel")
        axes[2].plot(pos, [_mean(results, "mu", f"μ={mu:g}", "dir0.1", "personal_acc") for mu in mu_x], "s-",
                     label="mixed accuracy")
        axes[2].set_xticks(pos, [f"{mu:g}" for mu in mu_x])
        axes[2].set_xlabel("μ")
        axes[2].set_title("μ sweep (Dir(0.1), final round)")
        axes[2].legend(fontsize=8)
        save(fig, "sweeps.png")
    return written


def report(results: dict, command: str) -> str:
    """The Markdown report: tables and claims (only the studies present in ``results``)."""
    meta = results.get("meta", {})
    total_min = sum(r["wall_seconds"] for r in results["runs"].values()) / 60
    have = lambda study: any(k.startswith(study + "|") for k in results["cells"])  # noqa: E731
    parts = [f"# FedSLR reduced-scale reproduction (digits, spec §8)\n\nCommand: `{command}`  \n"
             f"Seeds: {meta.get('seeds')}, rounds: {meta.get('rounds')}, evaluated every {meta.get('eval_every')} "
             f"rounds; {len(results['runs'])} runs taking {total_min:.0f} min of wall time one after another "
             f"(the last invocation: {meta.get('wall_seconds', 0) / 60:.0f} min, {meta.get('jobs', 1)} job(s)). "
             "Values: final-round accuracy (%), unweighted mean over the 20 clients' own test sets, mean ± std over seeds (ddof 0)."]
    if have("table"):
        parts += ["## Table 1 (reduced): reported accuracy, communication and model size\n\n"
                  "Global methods report their global model, personalized methods their personalized models (as "
                  "in the paper's Table 1). Communication: cumulative bytes over all rounds on Dir(0.1) (MB = 1e6 "
                  "B). # params: the deployed model (FedSLR: GKR factorised count, mixed adds nnz(p_i), mean over "
                  "clients; APFL keeps two models).\n\n" + table1(results),
                  "## Every accuracy (global model, personalized model)\n\n" + table_all(results)]
    if have("lambda"):
        parts += ["## λ sweep (Table 3, reduced; Dir(0.1))\n\n" + table_lambda(results)]
    if have("mu"):
        parts += ["## μ sweep (Table 4, reduced; Dir(0.1))\n\n" + table_mu(results)]
    if have("extras"):
        parts += ["## Extra runs for the claim-5 trends\n\n" + table_extras(results)]
    parts += ["## Claims 1–4 of spec §8 (gated)\n\n" + markdown_table(["claim", "measured", "verdict"],
                                                                      [list(c) for c in claims(results)])]
    if have("extras") and have("lambda") and have("table"):
        parts += ["## Claim 5: reported, not gated (percentage points)\n\n" +
                  markdown_table(["trend", "measured"], [list(r) for r in trends(results)])]
    parts += ["## Time per run (this machine)\n\n" + timing(results)]
    return "\n\n".join(parts) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="fljax reproduce fedslr", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(STUDIES), help=f"comma-separated studies: {', '.join(STUDIES)}")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--render", action="store_true", help="only rebuild README.md and plots from OUT/results.json")
    p.add_argument("--fresh", action="store_true", help="ignore the runs already in OUT/results.json")
    p.add_argument("--compile-cache", default=os.path.join(tempfile.gettempdir(), "fljax-jax-cache"),
                   help="JAX persistent compilation cache folder (seeds share programs); '' disables")
    args = p.parse_args(argv)
    studies = [s for s in args.only.split(",") if s]
    bad = [s for s in studies if s not in STUDIES]
    if bad:
        p.error(f"unknown study {bad[0]!r}; choose from {', '.join(STUDIES)}.")
    if args.seeds < 1 or args.rounds < 1 or args.eval_every < 1 or args.jobs < 1:
        p.error("--seeds, --rounds, --eval-every and --jobs must be >= 1.")
    args.studies = studies
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = "python -m fljax.reproduce.fedslr " + " ".join(argv)
    path = os.path.join(args.out, "results.json")
    results = {"runs": {}, "cells": {}, "meta": {}}
    if (args.render or not args.fresh) and os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    elif args.render:
        print(f"fljax: error: {path} does not exist; run the studies first (without --render).", file=sys.stderr)
        return 2
    if args.render:
        command = results.get("meta", {}).get("command", command)
    else:
        t0 = time.perf_counter()
        plan = cells(args.studies, args.seeds, args.rounds, args.eval_every)
        results["cells"].update({"|".join(k): [j[0] for j in jobs] for k, jobs in plan.items()})
        todo = {j[0]: j for jobs in plan.values() for j in jobs if j[0] not in results["runs"]}
        print(f"{len(todo)} runs to do ({sum(len(v) for v in plan.values())} cells incl. reused)", flush=True)
        save = lambda: write_text(path, json.dumps(results))  # noqa: E731
        for done, (key, out) in enumerate(_execute(list(todo.values()), args.jobs, args.compile_cache), 1):
            results["runs"][key] = out
            h = out["history"]
            print(f"[{done}/{len(todo)}] {key}: personal {h['personal_acc'][-1]:.4f}"
                  + (f" global {h['global_acc'][-1]:.4f}" if "global_acc" in h else "")
                  + f" ({out['run_seconds']:.0f}s run, {out['compile_seconds']:.0f}s compile)", flush=True)
            save()
        results["meta"] = {"seeds": args.seeds, "rounds": args.rounds, "eval_every": args.eval_every,
                           "command": command, "jobs": args.jobs, "wall_seconds": time.perf_counter() - t0}
        save()
    text = report(results, command)
    write_text(os.path.join(args.out, "README.md"), text)
    files = plots(results, args.out)
    print(text)
    print("wrote", ", ".join([path, os.path.join(args.out, "README.md")] + files))
    return 0


def _execute(jobs: list[tuple], n: int, cache: str):
    """Yield (key, result) for every job, in this process or in ``n`` worker processes."""
    if n == 1:
        _worker_init(cache)
        for job in jobs:
            yield _run_job(job)
        return
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    # workers are replaced every few runs: compiled programs accumulate in a long-lived process
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init, initargs=(cache,),
                                                max_tasks_per_child=6) as pool:
        for fut in concurrent.futures.as_completed([pool.submit(_run_job, j) for j in jobs]):
            yield fut.result()


if __name__ == "__main__":
    sys.exit(main())
