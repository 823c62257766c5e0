"""FedGiA's Table IV reproduction: the paper's numbers and the gated claims (spec §7–§9).

The paper's numbers and rules, apart from how the runs are driven (:mod:`fljax.reproduce.fedgia`, ``fljax
reproduce fedgia``), so that tests and other drivers read them from one place.
"""
from __future__ import annotations

from fljax.problems.regression import LeastSquares, Loss

__all__ = ["paper_tol0", "PAPER_TABLE4", "PAPER_K0"]

PAPER_K0 = (1, 5, 10)

# Table IV (copied from the paper): (Obj, CR, Time) for k0 = 1, 5, 10; m = 128, means over 20 trials.
PAPER_TABLE4 = {
    "v1": {"FedAvg": [(1.744, 515.3, 1.18), (1.744, 112.0, 0.70), (1.744, 63.7, 0.64)],
           "FedProx": [(1.744, 315.7, 1.64), (1.744, 74.3, 1.41), (1.744, 49.9, 1.83)],
           "FedPD": [(1.744, 21.9, 0.15), (1.744, 15.1, 0.29), (1.744, 11.2, 0.42)],
           "FedGiA_D": [(1.744, 6.1, 0.11), (1.744, 3.0, 0.11), (1.744, 3.0, 0.11)],
           "FedGiA_G": [(1.744, 4.5, 0.13), (1.744, 3.0, 0.16), (1.744, 3.0, 0.19)]},
    "v2qot": {"FedAvg": [(0.301, 597.4, 6.64), (0.301, 120.9, 3.83), (0.301, 61.2, 3.53)],
              "FedProx": [(0.301, 71.7, 2.01), (0.301, 15.8, 1.81), (0.301, 8.7, 1.93)],
              "FedPD": [(0.288, 20.5, 0.68), (0.292, 10.8, 1.31), (0.299, 7.6, 1.74)],
              "FedGiA_D": [(0.285, 5.7, 0.33), (0.285, 5.1, 0.34), (0.285, 5.0, 0.35)],
              "FedGiA_G": [(0.287, 5.2, 0.39), (0.285, 5.0, 0.60), (0.285, 4.9, 0.79)]},
    "v3qot": {"FedAvg": [(0.331, 682.7, 7.90), (0.331, 138.3, 4.53), (0.331, 70.3, 4.15)],
              "FedProx": [(0.331, 83.7, 2.43), (0.331, 19.1, 2.27), (0.330, 11.0, 2.51)],
              "FedPD": [(0.322, 18.5, 0.66), (0.324, 10.0, 1.29), (0.330, 8.0, 1.89)],
              "FedGiA_D": [(0.318, 5.7, 0.34), (0.322, 5.1, 0.35), (0.322, 4.9, 0.36)],
              "FedGiA_G": [(0.320, 5.2, 0.40), (0.321, 5.0, 0.61), (0.321, 4.9, 0.81)]},
}


def paper_tol0(loss: Loss, d: int) -> float:
    """§V-B: tol0 = 10⁻⁷ for Example V.1 (least squares), 5·10⁻⁶/d for Examples V.2 and V.3 (d = Σ_i d_i)."""
    return 1e-7 if isinstance(loss, LeastSquares) else 5e-6 / d
