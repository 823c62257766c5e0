"""The QuPeD reproduction's claims (fljax/reproduce/quped.py) on hand-made results: verdicts follow spec §12."""
import numpy as np

from fljax.reproduce.quped import claims


class Results:
    """The two StudyResults methods the claims read, from {method: [accuracy per seed]}."""

    def __init__(self, acc: dict):
        self.acc = acc

    def cell(self, study, **labels):
        return labels["method"] if labels["method"] in self.acc else None

    def final(self, study, metric, **labels):
        return np.asarray(self.acc.get(labels["method"], []), float) / 100


PAPERLIKE = {"FedAvg (FP)": [60, 61, 62], "Local (FP)": [71, 72, 70], "Local (2 bits)": [70, 71, 70],
             "Local (1 bit)": [69, 69, 68], "QuPeD (FP)": [75, 75, 76], "QuPeD (2 bits)": [74, 75, 74],
             "QuPeD (1 bit)": [71, 71, 72], "QuPeD (2 bits) no center updates": [74, 74, 74],
             "QuPeD (1 bit) no center updates": [67, 67, 68]}


def test_paper_like_numbers_pass_every_claim():
    verdicts = [v for _, _, v in claims(Results(PAPERLIKE))]
    assert verdicts == ["holds", "holds", "holds", "holds", "as in the paper"]


def test_claims_fail_where_the_numbers_disagree():
    acc = {**PAPERLIKE, "QuPeD (FP)": [62, 62, 62], "QuPeD (2 bits)": [50, 50, 51],
           "QuPeD (1 bit) no center updates": [72, 72, 72]}
    out = {c.split(".")[0]: v for c, _, v in claims(Results(acc))}
    assert out["C1"] == "fails" and out["C2"] == "fails" and out["C4 (direction only)"].startswith("not seen")
    assert [v for c, _, v in claims(Results(acc)) if "C3. QuPeD" in c] == ["fails"]  # 2 bits far below 1 bit


def test_ties_within_one_pooled_std_hold():
    acc = {**PAPERLIKE, "Local (2 bits)": [72, 70, 71.5]}  # 2 bits above FP by less than a pooled std
    assert [v for c, _, v in claims(Results(acc)) if "C3. Local" in c] == ["holds"]
    assert claims(Results({})) == []


def test_the_pooled_std_is_the_tables_sample_std():
    """Seeds 70, 71, 72 and 70.9, 71.9, 72.9 have sample std 1 each (ddof 1, the tables' ±; the population std would
    be sqrt(2/3) ≈ 0.82): FP 0.9 below 2 bits is within one pooled std, 1.1 below is not."""
    for below, verdict in [(0.9, "holds"), (1.1, "fails")]:
        acc = {**PAPERLIKE, "Local (FP)": [70, 71, 72], "Local (2 bits)": [70 + below, 71 + below, 72 + below]}
        assert [v for c, _, v in claims(Results(acc)) if "C3. Local" in c] == [verdict]
