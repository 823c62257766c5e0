"""Robust aggregation under attack (the robust spec's claims 1–6, reduced scale): the verdicts and the drops table.

The studies, tables and plots are data (``robust.yaml``, run by ``fljax reproduce robust``); this module computes
the claims from them. Accuracies are clean accuracies in percent (the global model on the honest clients' own test
splits: under attack none, the reference, the same clients as under an attack at 20 %; claim 1 reads every
client's), means over seeds; the **drop** of a rule under an attack is its accuracy under attack none on the same
data minus its attacked accuracy (points). The thresholds are the arguments of
:func:`claims`, named in every claim's line:

1. without an attack, every robust rule's accuracy is below the mean's on each label-skewed data set, krum's most
   (Karimireddy et al. 2022);
2. sign_flip and gaussian at 20 %: median, trimmed_mean and krum drop at most ``neutral`` points, the mean at least
   ``broken``;
3. alie's drop exceeds sign_flip's by at least ``far`` points for median, trimmed_mean and krum (Baruch et al. 2019);
4. for multi_krum and trimmed_mean, the smaller of min_max's and min_sum's drops is at least the larger of alie's and
   ipm's, less ``tie`` points (Shejwalkar & Houmansadr 2021);
5. with client momentum, centered_clip drops at most ``neutral`` points under alie and ipm while median and krum drop
   more (Karimireddy et al. 2021);
6. norm_bound's ASR is at least ``asr_gap`` points below the mean's, the mean's ASR at least 50 %, and norm_bound's
   clean accuracy without an attack within ``cost`` points of the mean's (Sun et al. 2019).

**Client momentum** (claim 5) is modelled as local SGD momentum (``algo.momentum`` 0.9, the buffer restarted every
round) at lr 0.025, which moves a constant gradient as far over the 10 local steps as plain SGD at lr 0.1 (Σ_k (1 −
0.9^{k+1})/0.1 ≈ 41.4 steps of lr·g against 10). Karimireddy et al. 2021 keep a worker's momentum across steps, each
step one communication; here a round is 10 local steps, and local momentum averages the stochastic gradients of a
client's round the way worker momentum averages a worker's recent ones, which is what shrinks the honest updates'
variance that ALIE hides in. A momentum carried across rounds would need per-client state that fljax's FedAvg does not
keep (and stale momenta under partial participation); server momentum does not reduce that variance (it acts after
the aggregation), which is why the paper puts momentum on the workers.
"""
from __future__ import annotations

from fljax.runner.report import markdown_table

__all__ = ["claims", "sections"]

SKEWED = ("digits", "mnist5k", "synthetic")
TITLES = {"digits": "digits Dir(0.3)", "digits-iid": "digits IID", "mnist5k": "MNIST-5k Dir(0.3)",
          "mnist5k-iid": "MNIST-5k IID", "synthetic": "Synthetic(1,1)"}
ROBUST = ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "centered_clip", "norm_bound")
ATTACKS = ("sign_flip", "gaussian", "alie", "ipm", "min_max", "min_sum")


def _acc(results, study: str, metric: str = "honest_global_acc", **labels) -> float:
    """Mean final ``metric`` (%) over the cell's seeds (NaN when the cell did not run); the table's cells at 20 %."""
    if study == "table":
        labels = {"attack.fraction": 0.2, **labels}
    values = results.final(study, metric, **labels)
    return 100 * float(values.mean()) if values.size else float("nan")


def _clean(results, data: str, defence: str, **labels) -> float:
    """The clean accuracy of ``defence`` under attack none (the same clients marked as an attack's at 20 %)."""
    return _acc(results, "momentum" if labels else "clean", data=data, attack="none", defence=defence, **labels)


def _drop(results, study: str, data: str, attack: str, defence: str, **labels) -> float:
    return _clean(results, data, defence, **labels) - _acc(results, study, data=data, attack=attack,
                                                           defence=defence, **labels)


def _verdict(oks: list[bool]) -> str:
    if not oks:
        return "not run"
    return "holds" if all(oks) else "fails" if not any(oks) else f"holds on {sum(oks)} of {len(oks)}"


def _has(results, study: str, **labels) -> bool:
    if study == "table":
        labels = {"attack.fraction": 0.2, **labels}
    return results.cell(study, **labels) is not None and len(results.seeds(study, **labels)) > 0


def claims(results, neutral: float = 5.0, broken: float = 20.0, far: float = 5.0, tie: float = 1.0,
           asr_gap: float = 10.0, cost: float = 2.0) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) for the robust spec's claims 1–6 (points; means over seeds), one line per claim and
    data set; a claim whose runs are missing is left out."""
    out = []
    # 1. the heterogeneity cost of robust rules
    for data in SKEWED:
        if not _has(results, "clean", data=data, attack="none", defence="mean"):
            continue
        every = lambda d, r: _acc(results, "clean", "global_acc", data=d, attack="none", defence=r)  # noqa: E731
        mean = every(data, "mean")
        costs = {r: mean - every(data, r) for r in ROBUST if _has(results, "clean", data=data, attack="none",
                                                                   defence=r)}
        worst = max(costs, key=costs.get)
        iid = f"{data}-iid"
        iid_text = ""
        if _has(results, "clean", data=iid, attack="none", defence="mean"):
            iid_costs = {r: every(iid, "mean") - every(iid, r) for r in costs}
            iid_text = f"; IID: krum {iid_costs['krum']:+.1f}, largest {max(iid_costs.values()):+.1f}"
        ok = min(costs.values()) > 0 and worst == "krum"
        out.append((f"1. {TITLES[data]}, no attack: every robust rule below the mean, krum the furthest",
                    f"mean {mean:.1f}; cost " + ", ".join(f"{r} {c:+.1f}" for r, c in costs.items()) + iid_text,
                    "holds" if ok else "fails"))
    # 2. sign_flip and gaussian neutralised by median, trimmed_mean, krum; the mean broken
    for data in SKEWED:
        study = "table" if data == "digits" else "table_12"
        if not _has(results, study, data=data, attack="sign_flip", defence="mean"):
            continue
        drops = {(a, r): _drop(results, study, data, a, r) for a in ("sign_flip", "gaussian")
                 for r in ("mean", "median", "trimmed_mean", "krum")}
        ok = all(d <= neutral for (a, r), d in drops.items() if r != "mean") and all(
            drops[(a, "mean")] >= broken for a in ("sign_flip", "gaussian"))
        out.append((f"2. {TITLES[data]}, 20 %: sign_flip and gaussian cost median, trimmed_mean and krum ≤ "
                    f"{neutral:g} points, the mean ≥ {broken:g}",
                    "; ".join(f"{a}: " + ", ".join(f"{r} {drops[(a, r)]:+.1f}" for r in ("mean", "median",
                                                                                       "trimmed_mean", "krum"))
                              for a in ("sign_flip", "gaussian")), "holds" if ok else "fails"))
    # 3. alie hurts the median-type rules far more than sign_flip
    for data in SKEWED:
        study = "table" if data == "digits" else "table_12"
        if not _has(results, study, data=data, attack="alie", defence="median"):
            continue
        gaps = {r: (_drop(results, study, data, "alie", r), _drop(results, study, data, "sign_flip", r))
                for r in ("median", "trimmed_mean", "krum")}
        oks = [a - s >= far for a, s in gaps.values()]
        out.append((f"3. {TITLES[data]}, 20 %: alie's drop ≥ sign_flip's + {far:g} for median, trimmed_mean, krum",
                    ", ".join(f"{r} {a:+.1f} vs {s:+.1f}" for r, (a, s) in gaps.items()), _verdict(oks)))
    # 4. min_max / min_sum at least as strong as alie / ipm on multi_krum and trimmed_mean
    for data in SKEWED:
        study = "table" if data == "digits" else "table_4"
        if not _has(results, study, data=data, attack="min_max", defence="multi_krum"):
            continue
        rows, oks = [], []
        for r in ("multi_krum", "trimmed_mean"):
            d = {a: _drop(results, study, data, a, r) for a in ("alie", "ipm", "min_max", "min_sum")}
            oks.append(min(d["min_max"], d["min_sum"]) >= max(d["alie"], d["ipm"]) - tie)
            rows.append(f"{r}: " + ", ".join(f"{a} {v:+.1f}" for a, v in d.items()))
        out.append((f"4. {TITLES[data]}, 20 %: min_max and min_sum drop multi_krum and trimmed_mean at least as "
                    f"much as alie and ipm (within {tie:g})", "; ".join(rows), _verdict(oks)))
    # 5. centered clipping with client momentum
    for data in ("digits", "mnist5k"):
        if not _has(results, "momentum", data=data, attack="alie", defence="centered_clip", momentum="client"):
            continue
        d = {(a, r): _drop(results, "momentum", data, a, r, momentum="client") for a in ("alie", "ipm")
             for r in ("centered_clip", "median", "krum")}
        ok = all(d[(a, "centered_clip")] <= neutral for a in ("alie", "ipm")) and all(
            d[(a, r)] > neutral for a in ("alie", "ipm") for r in ("median", "krum"))
        out.append((f"5. {TITLES[data]}, 20 %, client momentum: centered_clip drops ≤ {neutral:g} points under "
                    f"alie and ipm, median and krum more",
                    "; ".join(f"{a}: " + ", ".join(f"{r} {d[(a, r)]:+.1f}" for r in ("centered_clip", "median",
                                                                                   "krum"))
                              for a in ("alie", "ipm")), "holds" if ok else "fails"))
    # 6. norm bounding against a backdoor
    for data in SKEWED:
        if not _has(results, "backdoor", data=data, attack="backdoor", defence="mean"):
            continue
        clean_cost = _clean(results, data, "mean") - _clean(results, data, "norm_bound")
        parts, oks = [], []
        for fraction in (0.1, 0.2):
            asr = {r: _acc(results, "backdoor", "global_asr", data=data, attack="backdoor", defence=r,
                           **{"attack.fraction": fraction}) for r in ("mean", "norm_bound")}
            oks.append(asr["mean"] >= 50 and asr["mean"] - asr["norm_bound"] >= asr_gap and clean_cost <= cost)
            parts.append(f"{fraction:.0%}: ASR mean {asr['mean']:.1f}, norm_bound {asr['norm_bound']:.1f}")
        out.append((f"6. {TITLES[data]}: norm_bound's ASR ≥ {asr_gap:g} points below the mean's (≥ 50 %), its clean "
                    f"cost ≤ {cost:g}", "; ".join(parts) + f"; clean cost {clean_cost:+.1f}", _verdict(oks)))
    return out


def sections(results) -> list[tuple[str, str]]:
    """The drop of every rule under every attack on digits Dir(0.3) (the no-attack accuracy minus the attacked one),
    the table a paper shows."""
    if not _has(results, "table", data="digits", attack="alie", defence="mean"):
        return []
    defences = [r for r in ("mean",) + ROBUST if _has(results, "table", data="digits", attack="alie", defence=r)]
    rows = [[r] + [f"{_drop(results, 'table', 'digits', a, r):+.1f}" for a in ATTACKS] for r in defences]
    return [("Drop against the no-attack accuracy of the same rule (points, digits Dir(0.3), 20 % malicious)",
             markdown_table(rows, ["defence"] + list(ATTACKS)))]
