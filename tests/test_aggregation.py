"""The aggregation seam in runs (fljax.aggregation; robust spec R1-R5): every rule and attack as the template applies
it equals its definition written out on the round's own uploads, data poisoning changes exactly what a malicious
client trains on, evaluation reports the honest clients' accuracy and a backdoor's success rate, and a whole
attack × rule table runs from one config key (the issue's example: sign flipping at 30 % breaks the mean, the median
learns)."""
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
import fljax.ops.attacks as A
import fljax.ops.robust as R
from fljax.aggregation import WithAggregator, malicious_mask
from fljax.config import ExperimentConfig, from_dict
from fljax.engine.loop import NonFiniteError
from fljax.errors import OptionError
from fljax.experiment import build, load_data, privacy_of, resolve

BASE = {"data": {"dataset": "synthetic", "num_clients": 12, "max_samples": 40}, "model": {"name": "logreg"},
        "rounds": 1, "eval_every": 1, "algorithm": "fedavg",
        "algo": {"cohort_size": None, "local_steps": 3, "batch_size": 8, "eval_model": "stored"}}


def _sim(**sections):
    exp = resolve(from_dict(ExperimentConfig, {**BASE, **sections}))
    data = load_data(exp)
    return build(exp, data, privacy=privacy_of(exp, data))


def _own(state):
    """(server, clients) of the algorithm, the aggregator's state beside them peeled (a rule with memory)."""
    server, clients = state.server, state.clients
    return (server.state, clients.state) if isinstance(server, WithAggregator) else (server, clients)


def _leaves(t):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]


RULE_CASES = [("mean", {}), ("median", {}), ("trimmed_mean", {"beta": 0.2}), ("krum", {"f": 2}),
              ("multi_krum", {"f": 2, "m": 5}), ("bulyan", {"f": 2}), ("geometric_median", {}),
              ("norm_bound", {"bound": 0.05}), ("centered_clip", {"tau": 0.05})]
ATTACK_CASES = [None, ("sign_flip", {"s": 3.0}), ("alie", {}), ("ipm", {"eps": 0.5}), ("min_sum", {}),
                ("scale", {"gamma": 5.0})]


@pytest.mark.parametrize("rule,options", RULE_CASES)
@pytest.mark.parametrize("attack", [None, ("sign_flip", {"s": 3.0})])
def test_a_round_aggregates_by_the_rule_written_out(rule, options, attack):
    """One full-participation round: the new global model is w_t + rule(craft(w_i − w_t)) of the clients' own trained
    models (eval_model: stored keeps them), the rule and the attack called directly on those deltas; for mean the
    weights are n_i."""
    sections = {"aggregator": {"name": rule, **options}}
    if attack is not None:
        sections["attack"] = {"name": attack[0], "fraction": 0.25, **attack[1]}
    sim = _sim(**sections)
    state = sim.init()
    new, metrics = sim.run_rounds(state, 1, stack=False)
    (server, _), (new_server, new_clients) = _own(state), _own(new)
    w_t = server["params"]
    deltas = jax.tree.map(lambda w, s: s - w[None], w_t, new_clients["params"])
    counts = jnp.asarray(sim.data.train.count, jnp.float32)
    if attack is not None:
        mal = malicious_mask(jax.random.fold_in(state.key, 9), 12, 0.25)
        assert int(jnp.sum(mal)) == 3 and float(metrics["malicious_uploads"]) == 3
        deltas = A.MODEL_ATTACKS[attack[0]](deltas, mal, None, **attack[1])
    if rule == "mean":
        want = jax.tree.map(lambda w, d: w + d, w_t, R.mean(deltas, None, counts)[0])
    else:
        extra = {"v0": jax.tree.map(jnp.zeros_like, w_t)} if rule == "centered_clip" else {}
        delta, _ = R.RULES[rule](deltas, None, counts, **options, **extra)
        want = jax.tree.map(lambda w, d: w + d, w_t, delta)
    for got, exp in zip(_leaves(new_server["params"]), _leaves(want)):
        np.testing.assert_allclose(got, exp, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("attack", [a for a in ATTACK_CASES if a is not None])
def test_model_poisoning_replaces_only_the_malicious_uploads(attack):
    """Under the mean, an attack moves the aggregate by exactly its malicious rows' change: the weighted mean of the
    crafted deltas; honest clients' stored models are the same as without the attack."""
    plain = _sim()
    sim = _sim(attack={"name": attack[0], "fraction": 0.25, **attack[1]})
    state = sim.init()
    new, _ = sim.run_rounds(state, 1, stack=False)
    clean, _ = plain.run_rounds(plain.init(), 1, stack=False)
    for a, b in zip(_leaves(new.clients["params"]), _leaves(clean.clients["params"])):
        np.testing.assert_array_equal(a, b)  # model poisoning does not change what anyone trains
    w_t = state.server["params"]
    deltas = jax.tree.map(lambda w, s: s - w[None], w_t, new.clients["params"])
    mal = malicious_mask(jax.random.fold_in(state.key, 9), 12, 0.25)
    crafted = A.MODEL_ATTACKS[attack[0]](deltas, mal, None, **attack[1])
    counts = jnp.asarray(sim.data.train.count, jnp.float32)
    want = jax.tree.map(lambda w, d: w + d, w_t, R.mean(crafted, None, counts)[0])
    for got, exp in zip(_leaves(new.server["params"]), _leaves(want)):
        np.testing.assert_allclose(got, exp, rtol=2e-5, atol=2e-6)


def test_label_flip_trains_the_malicious_clients_on_flipped_labels():
    """A malicious client's trained model is what the same client trains on labels C − 1 − y; an honest client's is
    untouched."""
    sim = _sim(attack={"name": "label_flip", "fraction": 0.25})
    state = sim.init()
    new, _ = sim.run_rounds(state, 1, stack=False)
    mal = np.asarray(malicious_mask(jax.random.fold_in(state.key, 9), 12, 0.25))
    flipped = sim.data.replace(train=sim.data.train.replace(
        y=jnp.where(jnp.asarray(mal)[:, None] & sim.data.train.mask, 9 - sim.data.train.y, sim.data.train.y)))
    plain = _sim()
    ref, _ = plain.run_rounds(plain.init(), 1, stack=False)
    honest_models = _leaves(ref.clients["params"])
    plain.data = flipped
    poisoned, _ = plain.run_rounds(plain.init(), 1, stack=False)
    for got, want_flip, want_honest in zip(_leaves(new.clients["params"]), _leaves(poisoned.clients["params"]),
                                           honest_models):
        np.testing.assert_allclose(got[mal], want_flip[mal], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got[~mal], want_honest[~mal])
        assert not np.allclose(got[mal], want_honest[mal])


def test_evaluation_reports_honest_accuracy_and_the_backdoor_success_rate():
    """honest_*_acc is the mean accuracy of the honest clients; global_asr is the share of the honest clients'
    stamped test rows of another class that the global model puts in the target class, both recomputed here from
    the logits."""
    sim = _sim(attack={"name": "backdoor", "fraction": 0.25, "target": 2}, algo={**BASE["algo"],
                                                                                 "eval_model": "global"})
    state, _ = sim.run_rounds(sim.init(), 3)
    summary, per_client = sim.evaluate(state)
    mal = np.asarray(malicious_mask(jax.random.fold_in(state.key, 9), 12, 0.25))
    acc = np.asarray(per_client["global_acc"])
    np.testing.assert_allclose(summary["honest_global_acc"], acc[~mal].mean(), rtol=1e-6)
    test, w = sim.data.test, state.server["params"]
    trigger = sim.attack.trigger
    assert trigger.kind == "vector" and trigger.value == pytest.approx(float(np.max(sim.data.train.x)))
    logits = jax.vmap(lambda x: sim.model.apply(w, x))(trigger.stamp(test.x, test.mask))
    counted = np.asarray(test.mask & (test.y != 2)) & ~mal[:, None]
    hits = counted & (np.argmax(np.asarray(logits), -1) == 2)
    np.testing.assert_allclose(summary["global_asr"], hits.sum() / counted.sum(), rtol=1e-6)


def test_sign_flipping_breaks_the_mean_and_the_median_learns(tmp_path, monkeypatch):
    """The issue's example, from fljax.run and from the command line: --set attack.name=sign_flip --set
    attack.fraction=0.3 --set aggregator.name=median learns where the mean collapses (near chance, or diverged)."""
    cfg = {**BASE, "data": {"dataset": "digits", "num_clients": 30, "partition": "iid"},
           "model": {"name": "mlp", "options": {"hidden": [16]}}, "rounds": 20, "eval_every": 20,
           "algo": {"cohort_size": 10, "local_steps": 5, "lr": 0.1}, "attack": {"name": "sign_flip", "fraction": 0.3}}

    def honest_acc(config):
        try:
            return fljax.run(config, progress=False).final["honest_global_acc"]
        except NonFiniteError:  # diverged: the divergence guard stopped it
            return 0.0

    assert honest_acc(cfg) < 0.2  # chance is 0.1
    assert honest_acc({**cfg, "aggregator": {"name": "median"}}) > 0.4
    from fljax.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["run", "--set", "data.dataset=digits", "--set", "data.num_clients=30", "--set", "data.partition=iid",
            "--set", "model.name=mlp", "--set", "model.options.hidden=[16]", "--set", "rounds=20", "--set",
            "algo.cohort_size=10", "--set", "algo.local_steps=5", "--set", "attack.name=sign_flip", "--set",
            "attack.fraction=0.3", "--quiet"]
    assert main(args + ["--set", "aggregator.name=median", "--out", "median"]) == 0
    assert json.loads((tmp_path / "median" / "summary.json").read_text())["final"]["honest_global_acc"] > 0.4


def test_attack_fractions_and_rule_options_run_as_lanes_of_one_program(tmp_path):
    """A sweep over attack.fraction and a rule's option traces them: one program, every point equal to its own run."""
    cfg = {**BASE, "rounds": 2, "attack": {"name": "ipm", "fraction": 0.25}, "aggregator": {"name": "trimmed_mean"}}
    results = fljax.sweep({"attack.fraction": [0.1, 0.3], "aggregator.beta": [0.1, 0.2]}, cfg,
                          out=str(tmp_path / "s"), progress=False)
    assert all(r.vectorised for r in results.values())
    assert len(results) == 4
    for (fraction, beta), r in zip(itertools.product([0.1, 0.3], [0.1, 0.2]), results.values()):
        alone = fljax.run({**cfg, "attack": {**cfg["attack"], "fraction": fraction},
                           "aggregator": {**cfg["aggregator"], "beta": beta}}, progress=False)
        for got, want in zip(_leaves(r.state.server["params"]), _leaves(alone.state.server["params"])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_data_poisoning_with_traced_fractions_keeps_what_it_knows_of_the_data(tmp_path):
    """An attack whose fraction is a lane (a sweep over attack.fraction) keeps the facts it took from the data
    (label_flip's classes C, backdoor's trigger; Aggregator.at): the backdoor's lanes equal their own runs."""
    data = load_data(resolve(from_dict(ExperimentConfig, BASE)))
    for name, fact in (("label_flip", "num_classes"), ("backdoor", "trigger")):
        bound = fljax.aggregation.ATTACKS[name](fraction=0.25).with_data(data)
        lane = fljax.aggregation.Aggregator(attack=bound).at({"attack.fraction": 0.4}).attack
        assert lane.fraction == 0.4 and getattr(lane, fact) is getattr(bound, fact)
    cfg = {**BASE, "rounds": 2, "attack": {"name": "backdoor", "fraction": 0.25}}
    results = fljax.sweep({"attack.fraction": [0.2, 0.4]}, cfg, out=str(tmp_path / "s"), progress=False)
    assert all(r.vectorised for r in results.values())
    for fraction, r in zip([0.2, 0.4], results.values()):
        alone = fljax.run({**cfg, "attack": {**cfg["attack"], "fraction": fraction}}, progress=False)
        for got, want in zip(_leaves(r.state.server["params"]), _leaves(alone.state.server["params"])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_impossible_combinations_are_refused_in_one_line():
    def refused(key, match, **sections):
        with pytest.raises(OptionError, match=match) as e:
            resolve(from_dict(ExperimentConfig, {**BASE, **sections}))
        assert e.value.key == key and "\n" not in str(e.value)

    refused("aggregator.f", r"krum needs a cohort of n ≥ 2f \+ 3", aggregator={"name": "krum", "f": 5})
    refused("aggregator.f", "needs f", aggregator={"name": "bulyan"})
    refused("aggregator.beta", r"must be in \[0, 0.5\)", aggregator={"name": "trimmed_mean", "beta": 0.5})
    refused("aggregator.name", "under client-level privacy is refused", aggregator={"name": "median"},
            privacy={"noise_multiplier": 1.0, "clip_norm": 1.0})
    refused("aggregator", "reads the uploads only through their aggregate", algorithm="feddyn", algo={},
            aggregator={"name": "median"})
    refused("attack", "robust gossip is not supported", algorithm="dfedavg", algo={},
            attack={"name": "sign_flip"})
    refused("attack.name", "must be one of", attack={"name": "sign_flp"})
    refused("attack.fraction", r"between 0 and 1", attack={"name": "alie", "fraction": 1.5})


def test_fltrust_weighs_uploads_by_their_cosine_with_the_servers_own_update_on_root_data():
    """FLTrust: the server's g₀ is its own client update from w_t on the root set (root_size training rows drawn from
    the clients'), and the new model is w_t + fltrust(Δ; g₀) with Δ the clients' trained models' deltas."""
    from fljax.algorithms.base import ClientInput
    from fljax.data import ClientArrays

    sim = _sim(aggregator={"name": "fltrust", "root_size": 20}, attack={"name": "sign_flip", "fraction": 0.25})
    state = sim.init()
    new, metrics = sim.run_rounds(state, 1, stack=False)
    sim_root = sim.data.server
    assert sim_root.y.shape == (20,)
    rows = {tuple(np.asarray(r)) for r in np.asarray(sim.data.train.x)[np.asarray(sim.data.train.mask)]}
    assert all(tuple(np.asarray(r)) in rows for r in np.asarray(sim_root.x))  # drawn from the clients' rows
    w_t = state.server["params"]
    key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(state.key, 1), 0), 6)  # round 0's SERVER stream
    root = ClientArrays(x=sim_root.x, y=sim_root.y, mask=jnp.ones(20, bool), count=jnp.int32(20), n_min=20, n_max=20)
    inp = ClientInput(state={"params": jax.tree.map(jnp.zeros_like, w_t)}, train=root, key=key,
                      round=jnp.int32(0), down=w_t, model=sim.model)
    g0 = jax.tree.map(lambda a, b: a - b, sim.algorithm.client_update(inp).upload, w_t)
    deltas = jax.tree.map(lambda w, s: s - w[None], w_t, new.clients["params"])
    mal = malicious_mask(jax.random.fold_in(state.key, 9), 12, 0.25)
    deltas = A.sign_flip(deltas, mal, None, s=4.0)
    want, selected = R.fltrust(deltas, None, None, g0=g0)
    for got, exp in zip(_leaves(new.server["params"]), _leaves(jax.tree.map(jnp.add, w_t, want))):
        np.testing.assert_allclose(got, exp, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(metrics["malicious_share"], float(jnp.sum(selected * mal)), rtol=1e-5, atol=1e-7)
