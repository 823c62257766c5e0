"""The FedSLR reproduction script: data protocol, claim checks on hand-made results, and (slow) an end-to-end run."""
import json
import os

import numpy as np
import pytest

from fljax.reproduce import fedslr as R


def test_data_follows_the_reduced_protocol():
    for split in ("dir0.1", "pat2"):
        data = R.make_data(split, 0)
        counts = np.asarray(data.train.count)
        assert data.num_clients == 20 and (counts == 50).all()
        assert data.test.n_max == 50 and np.asarray(data.test.count).max() <= 50
        hist = data.train_label_counts()
        if split == "pat2":
            assert ((hist > 0).sum(1) <= 2).all()
        # floor rounding: each client's test classes are ⌊prop_c·50⌋ of its train mix
        y, m = np.asarray(data.test.y[3]), np.asarray(data.test.mask[3])
        np.testing.assert_array_equal(np.bincount(y[m], minlength=10), np.floor(hist[3] / 50 * 50 + 1e-9))


def _fake_results(seeds=2, **overrides):
    """Results whose final metrics are chosen by hand (every other value constant)."""
    plan = R.cells(R.STUDIES, seeds, 10, 10)
    results = {"runs": {}, "cells": {"|".join(k): [j[0] for j in v] for k, v in plan.items()},
               "meta": {"seeds": seeds, "rounds": 10, "eval_every": 10}}
    for (study, label, split), jobs in plan.items():
        for job in jobs:
            hp = job[3]
            final = {"personal_acc": 0.9, "global_acc": 0.8, "bytes_up": 100.0,
                     "bytes_down": 100.0 * (1 - min(hp.get("lam", 0) * 10, 0.5)),
                     "gkr_rank_density": 1 - min(hp.get("lam", 0) * 10, 0.5), "gkr_params": 1000.0,
                     "sparse_nnz_frac": 0.5 - min(hp.get("mu", 0), 0.4), "mixed_params": 1500.0,
                     "mixed_params_std": 10.0}
            if job[2] == "fedavg":
                final["global_acc"] = final["personal_acc"] = 0.85
            results["runs"][job[0]] = {"history": {k: [v] for k, v in {"round": 10, **final}.items()},
                                       "num_params": 1000, "executor": "loop", "run_seconds": 1.0,
                                       "compile_seconds": 0.0, "wall_seconds": 1.0}
    for (study, label, split), jobs in plan.items():
        for job in jobs:
            for k, v in overrides.get(label, {}).items():
                results["runs"][job[0]]["history"][k] = [v]
    return results


def test_claims_hold_and_fail_on_hand_made_results():
    verdicts = [c[2] for c in R.claims(_fake_results())]
    assert verdicts == ["holds"] * 5, R.claims(_fake_results())
    bad = _fake_results(**{"FedSLR (mixed)": {"personal_acc": 0.5}, "μ=0.1": {"sparse_nnz_frac": 0.9}})
    verdicts = [c[2] for c in R.claims(bad)]
    assert verdicts == ["FAILS", "FAILS", "holds", "FAILS", "holds"]
    text = R.report(bad, "cmd")
    for title in ("Table 1 (reduced)", "λ sweep", "μ sweep", "Claims 1–4", "Claim 5"):
        assert title in text
    # one shared run serves several cells (the default FedSLR run is Table 1's, λ = 1e-3's and μ = 1e-3's)
    assert len(set(R.cells(R.STUDIES, 1, 10, 10)[("lambda", "λ=0.001", "dir0.1")][0][:1]) &
               set(j[0] for j in R.cells(R.STUDIES, 1, 10, 10)[("table", "FedSLR (mixed)", "dir0.1")])) == 1


@pytest.mark.slow
def test_reproduction_end_to_end(tmp_path):
    argv = ["--only", "lambda,mu", "--seeds", "1", "--rounds", "3", "--eval-every", "3", "--out", str(tmp_path)]
    assert R.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["runs"]) == 9  # 6 λ + 4 μ, one shared
    assert {"README.md", "results.json", "sweeps.png"} <= set(os.listdir(tmp_path))
    assert R.main(argv + ["--render"]) == 0
