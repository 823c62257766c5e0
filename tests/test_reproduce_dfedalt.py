"""The DFedAlt reproduction's bookkeeping: claim verdicts from results, and rendering the report and plots."""
import os

import pytest

from fljax.reproduce import dfedalt as R
from fljax.runner.files import read_json, write_json


def _results(acc: dict, cd: dict | None = None, seeds: int = 2) -> dict:
    """Fake results: ``acc[(study, label, split)]`` = final accuracy (seed s adds 0.001·s); ``cd`` the same for the
    post-gossip consensus distance."""
    runs = {}
    for key, a in acc.items():
        c = (cd or {}).get(key, 1.0)
        for s in range(seeds):
            runs["|".join(key) + f"|{s}"] = {"history": {"round": [20, 100], "personal_acc": [a, a + 0.001 * s],
                                                         "consensus": [c, c], "consensus_local": [2 * c, 2 * c]}}
    return {"runs": runs, "seconds": {"table": 1.0}, "meta": {"seeds": seeds, "rounds": 100, "eval_every": 1,
                                                              "commands": ["python -m fljax.reproduce.dfedalt"]}}


def _table(alt=0.90, fedavg=0.85, dfedavgm=0.87, local=0.80):
    acc = {}
    for split in R.SPLITS:
        shift = {"pat2": 0.0, "pat5": -0.1, "dir0.1": -0.02, "dir0.3": -0.12}[split]
        for label in R.TABLE_METHODS + R.SAM_METHODS[2:]:
            acc[("table", label, split)] = 0.82 + shift
        acc[("table", "DFedAlt", split)] = alt + shift
        acc[("table", "FedAvg", split)] = fedavg + shift
        acc[("table", "DFedAvgM", split)] = dfedavgm + shift
        acc[("table", "Local", split)] = local + shift
    return acc


def _verdicts(results):
    return {claim.split(".")[0]: verdict for claim, _, verdict in R.claims(results) if claim[0] in "123"}


def test_claim_verdicts_follow_the_margins():
    assert _verdicts(_results(_table())) == {"1": "holds", "2": "holds", "3": "holds"}
    assert _verdicts(_results(_table(dfedavgm=0.89)))["1"] == "fails"  # +1 < 2 points
    assert _verdicts(_results(_table(local=0.915)))["2"] == "fails"  # DFedAlt 1.5 below Local


def test_consensus_claim_needs_the_full_ordering():
    cds = {"full": 1e-13, "exp": 0.1, "torus": 0.5, "ring": 3.0, "random_k": 0.2}
    acc, cd = _table(), {}
    for split in R.MAIN_SPLITS:
        for label in R.TOPOLOGY_METHODS:
            for t in R.TOPOLOGIES:
                acc[("topology", f"{label}@{t}", split)] = 0.8
                cd[("topology", f"{label}@{t}", split)] = cds[t]
    got = [v for c, _, v in R.claims(_results(acc, cd)) if c.startswith("4a")]
    assert got == ["holds", "holds"]
    cd[("topology", "DFedAlt@torus", "pat2")] = 5.0  # torus above ring
    got = [v for c, _, v in R.claims(_results(acc, cd)) if c.startswith("4a")]
    assert got == ["fails", "holds"]


def test_render_writes_report_and_plots(tmp_path):
    write_json(str(tmp_path / "results.json.gz"), _results(_table()))
    assert R.main(["--render", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "README.md").read_text()
    assert "Command(s): `python -m fljax.reproduce.dfedalt`" in report and "| DFedAlt | 90.05 ± 0.05 |" in report
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        R.main(["--only", "tabel"])
    assert "unknown study 'tabel'" in capsys.readouterr().err
    assert R.main(["--render", "--out", str(tmp_path)]) == 2


@pytest.mark.slow
def test_end_to_end_tiny_run(tmp_path):
    assert R.main(["--only", "table", "--seeds", "1", "--rounds", "3", "--out", str(tmp_path),
                   "--compile-cache", ""]) == 0
    results = read_json(str(tmp_path / "results.json.gz"))
    assert len(results["runs"]) == len(R.SPLITS) * (len(R.TABLE_METHODS) + 2)
