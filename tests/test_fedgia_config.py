"""FedGiA and its baselines from an experiment config: FedGiA's data sets as data sources, the consensus-regression
experiment resolved (no model), run by the runner in float64 (``x64``) and equal to the plain engine run; bad
combinations refused in one line naming the key."""
import jax
import numpy as np
import pytest

import fljax
from fljax.algorithms.fedgia import FedGiA
from fljax.config import ExperimentConfig, from_dict, to_dict
from fljax.data import DataConfig, load_federated
from fljax.engine import Lanes, Simulation, Stopping, Tolerance, run_until
from fljax.errors import ConfigError, OptionError
from fljax.experiment import resolve
from fljax.problems import LeastSquares, Logistic, pack_trials, qot_instance, v1_instance

V1 = {"algorithm": "fedgia", "algo": {"loss": "least_squares", "k0": 5}, "rounds": 6, "eval_every": 2,
      "data": {"dataset": "fedgia_v1", "num_clients": 8}}


def cfg(**changes):
    values = {**V1, **changes}
    return from_dict(ExperimentConfig, values)


def test_resolve_a_regression_experiment_and_its_resolved_config_round_trips():
    exp = resolve(cfg(algo={"loss": {"name": "logistic", "h_shift_rule": "code"}, "variant": "G"}))
    assert isinstance(exp.algorithm, FedGiA) and exp.algorithm.loss == Logistic(h_shift_rule="code")
    assert exp.settings.x64 and exp.config.algo["loss"] == {"name": "logistic", "h_shift_rule": "code"}
    again = resolve(from_dict(ExperimentConfig, to_dict(exp.resolved())))
    assert again.algorithm == exp.algorithm and again.config.algo["variant"] == "G"


@pytest.mark.parametrize("changes,key", [
    ({"algorithm": "fedavg", "algo": {}}, "fedgia_v1"),                       # classification on regression data
    ({"data": {"dataset": "digits", "num_clients": 8}}, "digits"),            # regression on classification data
    ({"model": {"name": "mlp"}}, "model"),
    ({"groups": [{"name": "a", "size": 8}]}, "groups"),
    ({"data": {**V1["data"], "test_per_client": 2}}, "data.test_per_client"),
    ({"algorithm": "fedavg", "algo": {}, "data": {"dataset": "digits", "num_clients": 8}, "x64": True}, "x64"),
    ({"algorithm": "fedavg", "algo": {}, "data": {"dataset": "digits", "num_clients": 8}, "stop": {}}, "stop"),
    ({"stop": {"metric": "accuracy"}}, "stop.metric"),
    ({"stop": {"record": ["error", "bytes"]}}, "stop.record"),
    ({"stop": {"tol": 0}}, "stop.tol"),
])
def test_mismatched_or_inapplicable_keys_are_refused_naming_them(changes, key):
    with pytest.raises((ConfigError, OptionError)) as e:
        resolve(cfg(**changes))
    assert key in str(e.value) and "\n" not in str(e.value)


def test_data_sources_pack_the_instances_of_fedgia_data():
    with jax.enable_x64(True):
        got = load_federated(DataConfig.from_dict({"dataset": "fedgia_qot", "num_clients": 16, "size_classes": 3}), 4)
        want = pack_trials([qot_instance(4, m=16)], blocks=3, gram=False).trials()[0]
    assert got.name == "fedgia_qot" and len(got.blocks) == 3
    for a, b in zip(jax.tree.leaves((got.blocks, got.order)), jax.tree.leaves((want.blocks, want.order))):  # not the timing
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # layout_seeds: every seed's classes have the same padded rows, so its runs are lanes of one program
    shapes = {tuple(blk.rows for blk in load_federated(DataConfig.from_dict(
        {"dataset": "fedgia_qot", "num_clients": 16, "size_classes": 3, "layout_seeds": 3}), s).blocks)
        for s in range(3)}
    assert len(shapes) == 1


def test_a_config_run_equals_the_plain_engine_run_in_float64(tmp_path):
    res = fljax.run(cfg(), out=str(tmp_path / "run"), progress=False)
    assert res.runs[0].progress.status == "completed" and (tmp_path / "run" / "summary.json").exists()
    final = res.history[-1]
    with jax.enable_x64(True):
        data = jax.device_put(pack_trials([v1_instance(0, m=8)], blocks=1, gram=True).trials()[0])
        plain = Simulation(FedGiA(loss=LeastSquares(), k0=5), data, executor="vmap").run(6, 2, progress=False)
    want = plain.history[-1]
    assert final["round"] == want["round"] == 6
    for k in ("objective", "error", "grad_norm_sq"):
        assert final[k] == want[k], k
    assert final["error"] < 1e-3 * res.history[0]["error"]
    floats = [leaf.dtype for leaf in jax.tree.leaves(res.state) if np.issubdtype(leaf.dtype, np.floating)]
    assert floats and set(floats) == {np.dtype("float64")}  # x64: null is float64 for consensus regression


def test_a_stop_section_runs_each_seed_until_the_rule_as_run_until_does(tmp_path):
    """``stop:`` drives :func:`run_until` through the runner: seeds as lanes (``layout_seeds``: one shape), each
    run's records are its rounds 0 … s and its summary the outcome, equal to run_until on the same data."""
    config = cfg(rounds=40, seeds=2, stop={"tol": 1e-7, "metric": "error"},
                 data={"dataset": "fedgia_v1", "num_clients": 8, "layout_seeds": 2})
    res = fljax.run(config, out=str(tmp_path / "run"), progress=False)
    exp = resolve(config)
    with jax.enable_x64(True):
        datas = [jax.device_put(fljax.experiment.load_data(exp, seed)) for seed in (0, 1)]
        sim = Simulation(exp.algorithm, datas[0], executor="vmap")
        want = run_until(Lanes(sim, [0, 1], datas), Stopping(Tolerance(tol0=1e-7, metric="error"), max_rounds=40,
                                                              track=("train_loss", "grad_norm_sq")))
    assert res.vectorised and all(want.converged)
    for i, run in enumerate(res.runs):
        s = int(want.rounds[i])
        assert run.progress.status == "completed" and run.progress.summary["stop"] == {
            "rounds": s, "iters": 5 * s, "converged": True, "diverged": False}
        assert [r["round"] for r in run.progress.log.history] == list(range(s + 1))
        for k in ("error", "train_loss", "grad_norm_sq"):
            np.testing.assert_array_equal([r[k] for r in run.progress.log.history], want.history[k][i, :s + 1])
        assert run.progress.log.history[-1]["error"] <= 1e-7 < run.progress.log.history[-2]["error"]
    again = fljax.run(config, out=str(tmp_path / "run"), progress=False, resume=True)  # stopped early, yet complete
    assert [run.progress.status for run in again.runs] == ["reused", "reused"]
