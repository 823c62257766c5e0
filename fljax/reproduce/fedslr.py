"""FedSLR reduced-scale reproduction (spec §8): the claims.

The studies, tables and plots are data (``fedslr.yaml``, run by ``fljax reproduce fedslr``); this module checks the
qualitative claims 1–4 of spec §8 (gated) on the seed means and reports the trends of claim 5 (not gated).
"""
from __future__ import annotations

import numpy as np

__all__ = ["claims"]

LAMBDAS = (0.0, 1.0e-4, 1.0e-3, 3.0e-3, 1.0e-2, 3.0e-2)
MUS = (0.0, 1.0e-3, 1.0e-2, 1.0e-1)
TITLES = {"dir0.1": "Dir(0.1)", "pat2": "Pathological(2)"}


def _mean(results, study: str, metric: str, **labels) -> float:
    values = results.final(study, metric, **labels)
    return float(values.mean()) if values.size else float("nan")


def _verdict(ok: bool, values) -> str:
    return "not run" if any(np.isnan(values)) else ("holds" if ok else "FAILS")


def claims(results) -> list[tuple[str, str, str]]:
    """Spec §8 claims 1–4 (gated) and the claim-5 trends (reported), on the means over seeds."""
    out = []
    for split in ("dir0.1", "pat2"):
        mixed = _mean(results, "table", "personal_acc", split=split, method="FedSLR (mixed)")
        gkr = _mean(results, "table", "global_acc", split=split, method="FedSLR (GKR)")
        fedavg = _mean(results, "table", "global_acc", split=split, method="FedAvg")
        out.append((f"1. {TITLES[split]}: mixed > FedAvg and > GKR",
                    f"mixed {100 * mixed:.2f}, FedAvg {100 * fedavg:.2f}, GKR {100 * gkr:.2f}",
                    _verdict(mixed > fedavg and mixed > gkr, [mixed, fedavg, gkr])))
    lam = lambda metric: [_mean(results, "lambda", metric, **{"algo.lam": v}) for v in LAMBDAS]  # noqa: E731
    dens, params, down, up = lam("gkr_rank_density"), lam("gkr_params"), lam("bytes_down"), lam("bytes_up")
    ok = all(a >= b for a, b in zip(dens, dens[1:])) and dens[-1] < 1 and all(a >= b for a, b in zip(params,
                                                                                                   params[1:]))
    out.append(("2. rank density non-increasing in λ, < 1 at the largest; GKR # params follows",
                "density " + ", ".join(f"{d:.3f}" for d in dens) + "; params " + ", ".join(f"{p:.0f}" for p in params),
                _verdict(ok, dens + params)))
    nnz = [_mean(results, "mu", "sparse_nnz_frac", **{"algo.mu": v}) for v in MUS]
    out.append(("3. nnz(p_i)/numel non-increasing in μ", ", ".join(f"{v:.4f}" for v in nnz),
                _verdict(all(a >= b for a, b in zip(nnz, nnz[1:])), nnz)))
    dense = up[0]
    ok = (all(d <= dense * (1 + 1e-9) for d in down[1:]) and down[-1] < dense and down[-2] < dense
          and all(a >= b for a, b in zip(down[1:], down[2:])) and all(u == dense for u in up))
    out.append(("4. downlink ≤ dense for λ > 0, < dense at the two largest λ, non-increasing; uplink = dense",
                "downlink/dense " + ", ".join(f"{d / dense:.3f}" for d in down), _verdict(ok, down + up)))
    return out + [(claim, measured, "reported") for claim, measured in trends(results)]


def trends(results) -> list[tuple[str, str]]:
    """Claim 5: reported, not gated (points are accuracy percentage points)."""
    m = lambda study, metric, **labels: 100 * _mean(results, study, metric, **labels)  # noqa: E731
    rows = []
    g, p = m("iid", "global_acc", method="FedSLR (GKR)"), m("iid", "personal_acc", method="FedSLR (GKR)")
    rows.append(("5. IID: mixed − GKR (paper: 1.45 to 3.12 below)",
                 f"{p - g:+.2f} (mixed {p:.2f}, GKR {g:.2f}, FedAvg {m('iid', 'global_acc', method='FedAvg'):.2f})"))
    accs = [m("lambda", "global_acc", **{"algo.lam": v}) for v in LAMBDAS]
    mixed = [m("lambda", "personal_acc", **{"algo.lam": v}) for v in LAMBDAS]
    rows.append(("5. GKR / mixed accuracy over λ = " + ", ".join(f"{v:g}" for v in LAMBDAS) + " (Table 3: too large "
                 "a λ lowers accuracy)", " / ".join(", ".join(f"{a:.2f}" for a in v) for v in (accs, mixed))))
    for split in ("dir0.1", "pat2"):
        gap = (m("table", "global_acc", split=split, method="FedSLR (GKR)")
               - m("table", "global_acc", split=split, method="FedAvg"))
        rows.append((f"5. {TITLES[split]}: GKR − FedAvg (paper: ≥ 0 on non-IID)", f"{gap:+.2f}"))
    e1 = m("variants", "personal_acc", variant="E1=1"), m("variants", "global_acc", variant="E1=1")
    e2 = (m("table", "personal_acc", split="dir0.1", method="FedSLR (mixed)"),
          m("table", "global_acc", split="dir0.1", method="FedSLR (GKR)"))
    rows.append(("5. E1 = 1 vs 2 Phase-I epochs, mixed / GKR (Table 6: 1 is worse)",
                 f"{e1[0]:.2f} vs {e2[0]:.2f} / {e1[1]:.2f} vs {e2[1]:.2f}"))
    pp = m("variants", "personal_acc", variant="pure personal (λ=10)")
    pg = m("variants", "personal_acc", variant="pure global (μ=1)")
    rows.append(("5. pure personal < pure global < mixed (Tables 7, 8)",
                 f"{pp:.2f} < {pg:.2f} < {e2[0]:.2f}: {'yes' if pp < pg < e2[0] else 'no'}"))
    return rows
