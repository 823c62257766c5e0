"""``eval_clients``: evaluation on a fixed sample of the clients, checked against its definition (the metrics of
exactly those clients' test data), its fixity (every evaluation, every seed, after a resume) and its refusals."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax.engine.sampling import evaluation_sample
from fljax.engine.state import State
from fljax.errors import OptionError
from fljax.experiment import default_model

DATA = {"dataset": "synthetic", "num_clients": 12}


def test_the_sample_is_a_sorted_prefix_of_one_fixed_permutation():
    a = evaluation_sample(50, 10)
    assert a.dtype == np.int32 and len(set(a.tolist())) == 10 and np.all(np.diff(a) > 0)
    assert 0 <= a.min() and a.max() < 50
    np.testing.assert_array_equal(a, evaluation_sample(50, 10))  # the same sample every time it is asked for
    assert set(a.tolist()) <= set(evaluation_sample(50, 20).tolist())  # a smaller sample is part of a larger one
    assert evaluation_sample(50, None) is None and evaluation_sample(50, 50) is None  # every client


def _state_on(sim_full, ids, state):
    """``state`` with only the clients ``ids`` (a simulation on those clients' data)."""
    return State(server=state.server, clients=jax.tree.map(lambda x: x[ids], state.clients), round=state.round,
                 key=state.key)


@pytest.mark.parametrize("algorithm", ["ditto", "fedavg"])
def test_sampled_summaries_equal_an_evaluation_of_the_sampled_clients_data(algorithm):
    cfg = {"algorithm": algorithm, "data": DATA, "algo": {"cohort_size": 4}, "model": {"name": "logreg"}}
    full = fljax.build(cfg)
    sampled = fljax.build({**cfg, "eval_clients": 5}, data=full.data)
    ids = sampled.eval_ids
    assert len(ids) == 5 and sampled.eval_clients == 5 and full.eval_clients == 12
    state, _ = full.run_rounds(full.init(), 2)
    summary, per_client = jax.device_get(sampled.evaluate(state))
    # the definition: the metrics of a data set holding exactly those clients' train and test splits
    data = full.data.replace(train=full.data.train.take(ids), test=full.data.test.take(ids))
    alone = fljax.build(cfg, data=data)
    ref_summary, ref_per_client = jax.device_get(alone.evaluate(_state_on(full, ids, state)))
    assert set(summary) == set(ref_summary)
    for k in summary:
        np.testing.assert_allclose(summary[k], ref_summary[k], rtol=1e-6, err_msg=k)
    full_summary, full_per_client = jax.device_get(full.evaluate(state))
    for k in per_client:  # each sampled client's row is its row in the evaluation of every client
        np.testing.assert_allclose(per_client[k], ref_per_client[k], rtol=1e-6)
        np.testing.assert_allclose(per_client[k], full_per_client[k][ids], rtol=1e-6)
    # and by hand from the full evaluation's rows: the unweighted mean over the sampled clients with a test split
    valid = np.asarray(full.data.test.count)[ids] > 0
    np.testing.assert_allclose(summary["personal_acc"], np.mean(full_per_client["personal_acc"][ids][valid]),
                               rtol=1e-6)
    assert not np.isclose(summary["personal_acc"], full_summary["personal_acc"])  # a sample, not everyone


def test_a_randomised_evaluation_scores_each_sampled_client_with_its_own_keys():
    # FedAvg-FT fine-tunes every client on minibatches drawn from its evaluation key: a sampled client must draw
    # the batches it draws in an evaluation of every client (its key comes from its id, not its position)
    cfg = {"algorithm": "fedavg_ft", "data": DATA, "model": {"name": "logreg"},
           "algo": {"cohort_size": 4, "batch_size": 4, "finetune_steps": 3}}
    full = fljax.build(cfg)
    sampled = fljax.build({**cfg, "eval_clients": 6}, data=full.data)
    state, _ = full.run_rounds(full.init(), 1)
    _, every = jax.device_get(full.evaluate(state))
    _, some = jax.device_get(sampled.evaluate(state))
    np.testing.assert_array_equal(some["personal_acc"], every["personal_acc"][sampled.eval_ids])
    np.testing.assert_array_equal(some["global_acc"], every["global_acc"][sampled.eval_ids])


def test_eval_metrics_still_see_the_whole_state():
    cfg = {"algorithm": "dfedavg", "data": DATA, "model": {"name": "logreg"}}
    full = fljax.build(cfg)
    sampled = fljax.build({**cfg, "eval_clients": 3}, data=full.data)
    state, _ = full.run_rounds(full.init(), 1)
    a, _ = jax.device_get(full.evaluate(state))
    b, per_client = jax.device_get(sampled.evaluate(state))
    assert a["consensus"] == b["consensus"] and per_client["personal_acc"].shape == (3,)


def test_every_evaluation_seed_and_resume_uses_the_same_sample(tmp_path):
    cfg = {"data": DATA, "model": {"name": "logreg"}, "eval_clients": 4, "eval_every": 2,
           "checkpoint_every": 2, "seeds": 2}
    first = fljax.run(cfg, rounds=2, out=str(tmp_path / "r"), progress=False)
    resumed = fljax.run(cfg, rounds=4, out=str(tmp_path / "r"), progress=False, resume=True)
    straight = fljax.run(cfg, rounds=4, out=str(tmp_path / "s"), progress=False)
    ids = evaluation_sample(12, 4).tolist()
    for seed in (0, 1):
        for root in ("r", "s"):
            summary = json.loads((tmp_path / root / f"seed_{seed}" / "summary.json").read_text())
            assert (summary["eval_clients"], summary["num_clients"], summary["eval_client_ids"]) == (4, 12, ids)
    top = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert top["eval_client_ids"] == ids
    assert first.history[-1]["round"] == 2
    # the resumed run's evaluations are the uninterrupted run's (the same clients scored at every evaluation)
    for a, b in zip(resumed.histories, straight.histories):
        assert [h["round"] for h in a] == [0, 2, 4]
        for ha, hb in zip(a, b):
            assert ha["personal_acc"] == hb["personal_acc"] and ha["global_loss"] == hb["global_loss"]


def test_a_sampled_run_says_so_in_its_table_and_summary(tmp_path):
    from fljax.runner.report import distinct_table, summary_row

    res = fljax.run({"data": DATA, "model": {"name": "logreg"}}, rounds=1, eval_clients=5,
                    out=str(tmp_path / "r"), progress=False)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    row = summary_row("fedavg", [summary])
    assert row["evaluated"] == "5 of 12 clients"
    assert "fixed sample of 5 of 12 clients (eval_clients)" in distinct_table([row, {**row, "algorithm": "x"}])
    every = fljax.run({"data": DATA, "model": {"name": "logreg"}}, rounds=1,
                      progress=False)
    assert "evaluated" not in summary_row("fedavg", [every.runs[0].progress.summary])
    assert every.runs[0].progress.summary["eval_clients"] == 12 and "eval_client_ids" not in every.runs[0].progress.summary
    assert res.history[-1]["round"] == 1


def test_lanes_of_a_sweep_share_the_sample(tmp_path):
    cfg = {"data": DATA, "model": {"name": "logreg"}, "eval_clients": 4, "rounds": 2}
    results = fljax.sweep({"algo.lr": [0.05, 0.1]}, cfg, progress=False)  # two lanes of one program
    alone = fljax.run(cfg, algo={"lr": 0.1}, progress=False)
    assert all(res.vectorised for res in results.values())
    np.testing.assert_allclose(results["lr=0.1"].final["personal_acc"], alone.final["personal_acc"], rtol=1e-6)


@pytest.mark.parametrize("overrides, fragment", [
    ({"eval_clients": 0}, "eval_clients must be between 1 and 2147483647, got 0."),
    ({"eval_clients": 13}, "eval_clients must be at most data.num_clients=12 (the clients it samples; null: every "
                           "client), got 13."),
    ({"eval_clients": 2, "groups": [{"name": "a", "size": 6}, {"name": "b", "size": 6}]},
     "eval_clients samples a homogeneous population; client groups (groups, or data in groups of its own) are "
     "evaluated on every client"),
    ({"eval_clients": 2, "algorithm": "fedgia", "data": {"dataset": "fedgia_v1", "num_clients": 12}},
     "eval_clients samples the clients of classification data"),
    ({"eval_clients": 4, "data": {"dataset": "mnist5k", "num_clients": 12, "partition": "meta_pairs",
                                  "target_clients": 2}},
     "eval_clients samples the training clients of a population; this split's 2 target clients are evaluated apart"),
])
def test_bad_samples_are_refused_in_one_line(overrides, fragment):
    """Refused by the config's resolution, before any data is loaded: the rule a simulation asks of its arguments
    (:func:`fljax.engine.sampling.check_sample`), a meta-learning split's target clients included."""
    with pytest.raises(OptionError) as e:
        fljax.make_config({"data": DATA, **overrides})
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_simulation_refuses_a_sample_it_cannot_evaluate():
    data = fljax.load_data({"data": DATA})
    algo = fljax.build({"data": DATA, "algo": {"cohort_size": 4}}).algorithm
    model = default_model(data)
    with pytest.raises(OptionError, match="between 1 and the 12 clients"):
        fljax.Simulation(algo, data, model, eval_clients=20)
    with pytest.raises(OptionError, match="3 target clients are evaluated apart"):
        fljax.Simulation(algo, data.replace(num_target=3), model, eval_clients=4)
    sim = fljax.Simulation(algo, data, model, eval_clients=12)  # every client: the evaluation of every client
    assert sim.eval_ids is None and sim.eval_clients == 12
    assert jnp.asarray(sim.evaluate(sim.init())[1]["personal_acc"]).shape == (12,)
