"""The FedGiA reproduction driver (fljax.reproduce.fedgia): a tiny run end to end, bad options, and (slow) the full
Table IV with its gates."""
import json
import os

import numpy as np
import pytest

from fljax.reproduce import fedgia as rep


def test_quick_table_run_writes_the_report(tmp_path, capsys):
    out = str(tmp_path)
    assert rep.main(["--quick", "--methods", "fedgia_d,FedAvg", "--k0", "1", "--no-figures", "--out", out]) == 0
    text = open(os.path.join(out, "table4.md")).read()
    assert "| FedGiA_D | 1 | 1.744 |" in text and "| FedAvg | 1 | 1.744 |" in text and "Command:" in text
    data = json.load(open(os.path.join(out, "table4.json")))
    row = data["results"]["v1"]["FedGiA_D"]["1"]
    assert len(row["cr"]) == 2 and all(row["converged"]) and data["provenance"]["x64"] is True
    assert "FedGiA_D" in capsys.readouterr().out


def test_cells_are_cached_and_reused_only_with_the_same_settings(tmp_path, monkeypatch):
    out = str(tmp_path)
    argv = ["--quick", "--methods", "fedgia_d", "--k0", "1", "--no-figures", "--out", out]
    assert rep.main(argv) == 0
    first = json.load(open(os.path.join(out, "table4.json")))["results"]["v1"]["FedGiA_D"]["1"]
    assert os.path.exists(os.path.join(out, "cells", "v1-FedGiA_D.npz"))

    def no_solving(*args, **kwargs):
        raise AssertionError("a cached cell was recomputed")

    monkeypatch.setattr(rep, "run_grid", no_solving)
    assert rep.main(argv) == 0  # same settings: read back, nothing solved
    again = json.load(open(os.path.join(out, "table4.json")))["results"]["v1"]["FedGiA_D"]["1"]
    assert again["cr"] == first["cr"] and again["obj"] == first["obj"]
    with pytest.raises(AssertionError, match="recomputed"):
        rep.main(argv + ["--alpha", "0.7"])  # another α is another cell


def test_bad_options_are_refused_with_one_line(capsys):
    assert rep.main(["--methods", "fedgia_x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown method 'fedgia_x'" in err and "fedgia_d" in err and len(err.splitlines()) == 1
    assert rep.main(["--examples", "v2sct"]) == 2
    assert "--sct-standin" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_with_figures(tmp_path):
    assert rep.main(["--quick", "--out", str(tmp_path)]) == 0
    for name in ("fig1.png", "fig2.png", "fig3.png", "fig4.png", "table4.md"):
        assert os.path.getsize(tmp_path / name) > 0


@pytest.mark.slow
def test_full_table4_meets_the_gates(tmp_path):
    """The gated rows of the full reproduction (about 22 min on 2 CPU cores): every FedGiA row within 0.03 of the
    paper's Obj and 1.5 of its CR, every FedAvg CR within 20%."""
    assert rep.main(["--methods", "fedgia_d,fedgia_g,fedavg", "--no-figures", "--out", str(tmp_path)]) == 0
    results = json.load(open(tmp_path / "table4.json"))["results"]
    for ex, by_label in results.items():
        for label, by_k0 in by_label.items():
            for k0, row in by_k0.items():
                obj_p, cr_p, _ = rep.PAPER_TABLE4[ex][label][rep.PAPER_K0.index(int(k0))]
                cr = sum(row["cr"]) / len(row["cr"])
                obj = sum(row["obj"]) / len(row["obj"])
                if label.startswith("FedGiA"):
                    assert abs(obj - obj_p) <= 0.03 and abs(cr - cr_p) <= 1.5, (ex, label, k0, obj, cr)
                elif label == "FedAvg":
                    assert abs(cr / cr_p - 1) <= 0.2, (ex, label, k0, cr)


def _least_squares_optimum(inst):
    """min_x (1/m) Σ_i ‖A_i x − b_i‖²/(2d_i), by the normal equations in float64 NumPy."""
    h = sum(a.T @ a / len(b) for a, b in inst)
    c = sum(a.T @ b / len(b) for a, b in inst)
    x = np.linalg.solve(h, c)
    return float(np.mean([np.sum((a @ x - b) ** 2) / (2 * len(b)) for a, b in inst]))


def test_quick_table_objective_is_the_least_squares_optimum_of_its_instances(tmp_path):
    """The table's measured Obj (the '1.5078 ± 0.0016' beside the paper's 1.744 in the quick run) derived: FedGiA
    stops at Error ≤ 1e-7, so each trial's objective is the least-squares optimum of its Example V.1 instance (data
    seed = trial, m = 16), computed here by the normal equations; the row prints their mean ± std."""
    from fljax.problems import v1_instance

    out = str(tmp_path)
    assert rep.main(["--quick", "--methods", "fedgia_d", "--k0", "1", "--no-figures", "--out", out]) == 0
    row = json.load(open(os.path.join(out, "table4.json")))["results"]["v1"]["FedGiA_D"]["1"]
    optimum = [_least_squares_optimum(v1_instance(seed, m=16)) for seed in (0, 1)]
    np.testing.assert_allclose(row["obj"], optimum, rtol=1e-5)      # stopped at Error ≤ 1e-7: 1.4e-6 above
    assert all(o >= f - 1e-12 for o, f in zip(row["obj"], optimum))  # never below the minimum
    line = next(line for line in open(os.path.join(out, "table4.md")) if line.startswith("| FedGiA_D | 1 |"))
    paper, measured = (cell.strip() for cell in line.split("|")[3:5])
    assert paper == f"{rep.PAPER_TABLE4['v1']['FedGiA_D'][0][0]:.3f}" == "1.744"
    mean, std = (float(v) for v in measured.split("±"))
    assert (mean, std) == pytest.approx((np.mean(optimum), np.std(optimum)), abs=1e-4)


def test_papers_objective_is_the_least_squares_optimum_of_example_v1():
    """The paper's Obj for Example V.1 (Table IV: 1.744 for every method and k0, m = 128, 20 trials) derived: the
    mean over 20 generated instances (data seeds 0-19) of the least-squares optimum, in NumPy, is within the
    reproduction's Obj gate (0.03) of it; measured when written: 1.753 ± 0.060 (std over instances)."""
    from fljax.problems import v1_instance

    optimum = [_least_squares_optimum(v1_instance(seed, m=128)) for seed in range(20)]
    assert abs(np.mean(optimum) - rep.PAPER_TABLE4["v1"]["FedGiA_D"][0][0]) <= rep.GATES["obj"], np.mean(optimum)
