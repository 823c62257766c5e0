"""Attack × defence tables in one command (issue 35 point 4; docs/robust.md): a sweep over attack.name ×
aggregator.name × attack.fraction × seeds compiles one program per (attack, rule) and writes attacks.md (clean
accuracy, drop against attack.name=none, ASR, malicious share, each recomputed here from the points' own records) and
attacks.png; the no-attack reference (attack none) is the honest run with its fraction's clients marked; a swept
section's options apply to the rules that declare them."""
import itertools
import json
import re

import jax
import numpy as np

import fljax
from fljax.aggregation import malicious_mask
from fljax.cli import main
from fljax.config import ExperimentConfig, from_dict
from fljax.experiment import build, load_data, privacy_of, resolve
from fljax.runner.sweep import point_label, swept_sections

BASE = {"data": {"dataset": "synthetic", "num_clients": 12, "max_samples": 40}, "model": {"name": "logreg"},
        "rounds": 2, "eval_every": 2, "algorithm": "fedavg", "checkpoint_every": 0,
        "algo": {"cohort_size": None, "local_steps": 3, "batch_size": 8}}


def _leaves(t):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]


def test_no_attack_is_the_honest_run_with_its_fraction_s_clients_left_out_of_the_clean_accuracy():
    """attack.name=none trains and aggregates as the run without an attack (same parameters, bit for bit); its
    honest accuracy is the mean over the clients R4's draw does not mark; a rule needing f takes it from the
    fraction (R3)."""
    honest = fljax.run(BASE, progress=False)
    none = fljax.run({**BASE, "attack": {"name": "none", "fraction": 0.25}}, progress=False)
    for a, b in zip(_leaves(honest.state.server["params"]), _leaves(none.state.server["params"])):
        np.testing.assert_array_equal(a, b)
    exp = resolve(from_dict(ExperimentConfig, {**BASE, "attack": {"name": "none", "fraction": 0.25}}))
    data = load_data(exp)
    sim = build(exp, data, privacy=privacy_of(exp, data))
    summary, per_client = sim.evaluate(none.state)
    marked = np.asarray(malicious_mask(jax.random.fold_in(none.state.key, 9), 12, 0.25))
    assert marked.sum() == 3
    acc = np.asarray(per_client["global_acc"])
    np.testing.assert_allclose(none.final["honest_global_acc"], acc[~marked].mean(), rtol=1e-6)
    assert abs(acc[~marked].mean() - acc.mean()) > 0  # the marked clients are really left out
    krum = resolve(from_dict(ExperimentConfig, {**BASE, "aggregator": {"name": "krum"},
                                               "attack": {"name": "none", "fraction": 0.25}}))
    assert krum.aggregator.f == 3  # ⌈0.25 · 12⌉


def test_an_attack_table_compiles_one_program_per_attack_and_rule_and_reports_its_drops(tmp_path):
    """3 attacks (none among them) × 2 rules × 2 fractions × 2 seeds: 6 compiled programs (fractions and seeds are
    lanes); attacks.md's clean accuracy, drop, ASR and malicious share equal what the points' own metrics give."""
    grid = {"attack.name": ["none", "sign_flip", "backdoor"], "aggregator.name": ["mean", "krum"],
            "attack.fraction": [0.1, 0.3]}
    out = tmp_path / "table"
    fljax.sweep(grid, {**BASE, "seeds": 2, "data": {**BASE["data"], "seed": 0}}, out=str(out), progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["programs"] == {"runs": 24, "vectorised_runs": 24, "compiled": 6}
    text = (out / "attacks.md").read_text()
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| attack")}
    assert len(rows) == 12 and (out / "attacks.png").exists() and not (out / "sweep.png").exists()

    def seeds(label, metric):
        return np.array([json.loads(open(out / label / f"seed_{s}" / "metrics.jsonl").readlines()[-1])[metric]
                         for s in (0, 1)])

    for values in [dict(zip(grid, v)) for v in itertools.product(*grid.values())]:
        label = point_label(values)
        row = rows[(values["attack.name"], values["aggregator.name"], str(values["attack.fraction"]))]
        clean = 100 * seeds(label, "honest_global_acc")
        assert row[3] == f"{clean.mean():.2f} ± {np.std(clean, ddof=1):.2f}"
        reference = 100 * seeds(point_label({**values, "attack.name": "none"}), "honest_global_acc")
        assert row[4] == ("-" if values["attack.name"] == "none" else f"{reference.mean() - clean.mean():+.2f}")
        asr = 100 * seeds(label, "global_asr") if values["attack.name"] == "backdoor" else None
        assert row[5] == ("-" if asr is None else f"{asr.mean():.2f} ± {np.std(asr, ddof=1):.2f}")
        share = seeds(label, "malicious_share") if values["aggregator.name"] == "krum" else None
        assert row[6] == ("-" if share is None else f"{share.mean():.2f} ± {np.std(share, ddof=1):.2f}")
    assert rows[("sign_flip", "mean", "0.3")][4] != "-" and float(rows[("sign_flip", "mean", "0.3")][4]) > 0


def test_options_of_a_swept_section_apply_to_the_rules_that_declare_them(tmp_path, capsys):
    """--set aggregator.beta with aggregator.name swept reaches trimmed_mean only (a one-value grid key); an option
    none of the swept rules has is refused in one line before anything runs."""
    values, grid = swept_sections({"aggregator": {"name": "mean", "beta": 0.3}, "rounds": 2},
                                  {"aggregator.name": ["median", "trimmed_mean"]})
    assert "aggregator" not in values and grid == {"aggregator.name": ["median", "trimmed_mean"],
                                                   "aggregator.beta": [0.3]}
    results = fljax.sweep({"aggregator.name": ["median", "trimmed_mean"]}, {**BASE, "aggregator": {"beta": 0.3}},
                          progress=False)
    rules = {label: r.cfg.aggregator for label, r in results.items()}
    assert rules == {"name=median,beta=0.3": fljax.aggregation.RULES["median"](),
                     "name=trimmed_mean,beta=0.3": fljax.aggregation.RULES["trimmed_mean"](beta=0.3)}
    config = tmp_path / "base.yaml"
    config.write_text(json.dumps(BASE))
    code = main(["sweep", str(config), "--grid", "aggregator.name=median,krum", "--set", "aggregator.tau=0.3",
                 "--out", str(tmp_path / "bad"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.search(r"aggregator.tau: none of the aggregator names swept \(median, krum\) has the option 'tau'", err)
    assert not (tmp_path / "bad").exists()


def test_labels_name_whole_keys_only_where_last_parts_collide():
    assert point_label({"attack.name": "alie", "aggregator.name": "krum", "attack.fraction": 0.2}) == \
        "attack.name=alie,aggregator.name=krum,fraction=0.2"
    assert point_label({"algo.lr": 0.1, "algo.mu": 0}) == "lr=0.1,mu=0"


def test_a_bad_fraction_in_a_table_is_refused_before_it_runs(tmp_path, capsys):
    config = tmp_path / "base.yaml"
    config.write_text(json.dumps(BASE))
    code = main(["sweep", str(config), "--grid", "attack.name=none,alie", "--grid", "attack.fraction=0.2,1.5",
                 "--out", str(tmp_path / "bad"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "attack.fraction" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "bad").exists()
