"""Hypergradients of whole runs (fljax.hypergrad, issue 39): forward and reverse mode agree with each other and with
central finite differences of the whole run under the same key, in float64 (parameters and data cast to float64,
hyperparameters traced as float64 under x64); the objective is the metric the ordinary driver computes; what has no
gradient is refused or named; hypergradient descent takes Adam's steps in log space; the validation split is what
its definition says."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import hypergrad as H
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.errors import ConfigError, OptionError
from fljax.models import make_model
from fljax.models.model import Model


class Float64Model(Model):
    """The same model with float64 parameters (so that a run under x64 computes in float64 end to end)."""

    def init(self, key):
        return jax.tree.map(lambda a: a.astype(jnp.float64), super().init(key))


def _f64(data):
    cast = lambda a: a.replace(x=a.x.astype(jnp.float64))  # noqa: E731
    return data.replace(train=cast(data.train), test=cast(data.test))


@pytest.fixture(scope="module")
def small():
    """Synthetic(1,1), 6 clients of different sizes (at most 30 rows), float32."""
    return D.make_federated("synthetic", 6, seed=1, max_samples=30)


@pytest.fixture(scope="module")
def tiny():
    """(synthetic(1,1) logreg data, digits MLP data): 4 and 5 clients of at most 24 rows, float64 inputs."""
    with jax.enable_x64(True):
        synthetic = _f64(D.make_federated("synthetic", 4, seed=0, max_samples=24))
        digits = D.make_federated("digits", 5, "dirichlet", seed=0, alpha=1.0)
        keep = lambda a, n: a.replace(x=a.x[:, :n], y=a.y[:, :n], mask=a.mask[:, :n],  # noqa: E731
                                      count=jnp.minimum(a.count, n), n_min=min(a.n_min, n), n_max=n)
        digits = _f64(digits.replace(train=keep(digits.train, 24), test=keep(digits.test, 12)))
        return synthetic, digits


def _model(name, data, **options):
    m = make_model(name, data.input_shape, data.num_classes, **options)
    return Float64Model(**{f.name: getattr(m, f.name) for f in dataclasses.fields(m)})


def _objective(data, model, algorithm, keys, rounds=3, metric="global_loss", last=1, remat="round", **algo):
    train, val = H.holdout(data, 0.25, seed=0)
    sim = Simulation(make_algorithm(algorithm, **algo), train, model, executor="vmap")
    return H.RunObjective(sim, keys, rounds, metric=metric, eval_data=train.replace(test=val), last=last,
                          remat=remat)


def _finite_differences(objective, keys, seed, rel=1e-4):
    """{key: dL/dh_key} by the fourth-order central difference (−L(h+2δ) + 8L(h+δ) − 8L(h−δ) + L(h−2δ)) / 12δ of
    whole runs under the same key, δ = rel·|h|; the 4·k runs as lanes of one program."""
    points, deltas = [], {}
    for key in keys:
        h0 = objective.start[key]
        deltas[key] = rel * max(abs(h0), 1e-2)
        points += [{**objective.start, key: h0 + m * deltas[key]} for m in (2, 1, -1, -2)]
    values = objective.values(points, seed).reshape(len(keys), 4)
    return {key: float(np.dot([-1, 8, -8, 1], v) / (12 * deltas[key])) for key, v in zip(keys, values)}


LOCAL = dict(cohort_size=3, local_steps=2, batch_size=5)
CASES = {  # name: (data index, model, algorithm, traced keys, metric, algorithm options)
    "fedavg-logreg": (0, ("logreg", {}), "fedavg", ["lr", "server_lr"], "global_loss", dict(lr=0.05, **LOCAL)),
    "fedavg-mlp": (1, ("mlp", {"hidden": [8]}), "fedavg", ["lr", "server_lr"], "global_loss",
                   dict(lr=0.05, **LOCAL)),
    "fedprox-logreg": (0, ("logreg", {}), "fedprox", ["mu", "lr"], "global_loss", dict(lr=0.05, mu=0.5, **LOCAL)),
    "fedadam-logreg": (0, ("logreg", {}), "fedavg", ["server_beta1", "server_beta2", "server_lr"], "global_loss",
                       dict(lr=0.05, server_optimizer="adam", server_lr=0.03, server_beta1=0.9, server_beta2=0.99,
                            **LOCAL)),
    "ditto-logreg": (0, ("logreg", {}), "ditto", ["lam", "lr"], "personal_loss",
                     dict(lr=0.05, lam=0.3, personal_epochs=1, **LOCAL)),
    "dfedavg-logreg": (0, ("logreg", {}), "dfedavg", ["lr"], "personal_loss",
                       dict(lr=0.05, topology="ring", local_epochs=None, local_steps=2, batch_size=5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_reverse_and_finite_differences_agree(tiny, case):
    """On every case: reverse mode (per-round rematerialisation) equals forward mode to rounding, and both equal
    the fourth-order central difference of whole runs under the same key (relative error < 1e-6)."""
    index, (model, options), algorithm, keys, metric, algo = CASES[case]
    with jax.enable_x64(True):
        data = tiny[index]
        objective = _objective(data, _model(model, data, **options), algorithm, keys, metric=metric, **algo)
        reverse = objective.value_and_grad(seed=3)
        forward = objective.value_and_grad(seed=3, mode="forward")
        assert reverse.value == pytest.approx(forward.value, rel=1e-13)
        differences = _finite_differences(objective, keys, seed=3)
        for key in keys:
            r, f, fd = reverse.grad[f"algo.{key}"], forward.grad[f"algo.{key}"], differences[key]
            assert abs(r) > 1e-6, (key, r)  # a gradient that says something
            assert r == pytest.approx(f, rel=1e-10), (key, r, f)
            assert r == pytest.approx(fd, rel=1e-6, abs=1e-9), (key, r, fd)
        assert not reverse.zero


def test_every_rematerialisation_gives_the_same_value_and_gradient_and_the_lanes_drivers_metric(tiny):
    """remat 'none', 'round' and 'block' (the first 4 of 6 rounds in blocks of 3: one block and a rest) differentiate
    the same function; its value is the metric the grid driver computes (:class:`fljax.engine.Lanes` with the same
    traced values): ``run_rounds`` then the evaluation, averaged over the evaluations after each of the last 2
    rounds."""
    from fljax.engine import Lanes

    with jax.enable_x64(True):
        data = tiny[0]
        sim = Simulation(make_algorithm("fedavg", lr=0.05, **LOCAL), data, _model("logreg", data), executor="vmap")
        results = {}
        for remat in H.REMAT:
            objective = H.RunObjective(sim, ["lr", "server_lr"], 6, last=2, remat=remat, block=3)
            results[remat] = objective.value_and_grad(seed=1)
        for remat in ("round", "block"):
            assert results[remat].value == pytest.approx(results["none"].value, rel=1e-13)
            for k, g in results["none"].grad.items():
                assert results[remat].grad[k] == pytest.approx(g, rel=1e-11)
        lanes = Lanes(sim, [1], hps=[objective.start], mode="map")
        states, _ = lanes.run_rounds(lanes.init(), 4)
        scores = []
        for _ in range(2):
            states, _ = lanes.run_rounds(states, 1)
            scores.append(float(lanes.evaluate(states)[0]["global_loss"][0]))
        assert results["none"].value == pytest.approx(np.mean(scores), rel=1e-12)


def test_local_epochs_over_clients_of_different_sizes_are_differentiated_through_their_scanned_steps(small):
    """Epochs over clients of 16 and 17 rows (4 and 5 batches of 4) run a while loop over each client's own steps,
    which reverse mode cannot transpose; the objective traces them as the masked scan over the schedule
    (``scanned_steps``): its value is the run the driver computes with the while loop (Lanes, the same traced
    values), and reverse mode, forward mode and the finite difference agree."""
    from fljax.engine import Lanes

    with jax.enable_x64(True):
        uneven, val = H.holdout(_f64(small), 0.3, seed=0)
        assert not make_algorithm("fedavg", local_epochs=1, batch_size=4).plan().every_step_active(
            uneven.train.n_min, uneven.train.n_max)
        sim = Simulation(make_algorithm("fedavg", lr=0.05, cohort_size=3, local_epochs=1, batch_size=4), uneven,
                         _model("logreg", uneven), executor="vmap")
        objective = H.RunObjective(sim, ["lr"], 3, eval_data=uneven.replace(test=val))
        reverse, forward = objective.value_and_grad(seed=2), objective.value_and_grad(seed=2, mode="forward")
        assert reverse.grad["algo.lr"] == pytest.approx(forward.grad["algo.lr"], rel=1e-10)
        assert reverse.grad["algo.lr"] == pytest.approx(_finite_differences(objective, ["lr"], 2)["lr"], rel=1e-6)
        lanes = Lanes(sim, [2], [uneven.replace(test=val)], hps=[objective.start], mode="map")
        states, _ = lanes.run_rounds(lanes.init(), 3)
        assert reverse.value == pytest.approx(float(lanes.evaluate(states)[0]["global_loss"][0]), rel=1e-12)


def test_a_clip_norm_no_gradient_reaches_has_an_exactly_zero_hypergradient_and_an_active_one_agrees(tiny):
    """LocalTraining's clip_norm: above every local gradient's norm it never acts, and its hypergradient is exactly
    zero (named in ``zero`` and in a note); low enough to clip, it agrees with the finite difference."""
    with jax.enable_x64(True):
        data = tiny[0]
        model = _model("logreg", data)
        inactive = _objective(data, model, "fedavg", ["clip_norm", "lr"], lr=0.05, clip_norm=1e6, **LOCAL)
        g = inactive.value_and_grad(seed=0)
        assert g.zero == ("algo.clip_norm",) and g.grad["algo.lr"] != 0.0
        assert "exactly zero" in g.notes()[0] and "algo.clip_norm" in g.notes()[0]
        active = _objective(data, model, "fedavg", ["clip_norm"], lr=0.05, clip_norm=0.05, **LOCAL)
        g = active.value_and_grad(seed=0)
        assert not g.zero
        assert g.grad["algo.clip_norm"] == pytest.approx(_finite_differences(active, ["clip_norm"], 0)["clip_norm"],
                                                         rel=1e-6)


def test_what_has_no_gradient_is_refused_in_one_line(small):
    data = small
    model = make_model("logreg", data.input_shape, data.num_classes)
    sim = Simulation(make_algorithm("fedavg", lr=0.05, momentum=0.5, **LOCAL), data, model, executor="vmap")
    cases = [(["local_steps"], "algo.local_steps is discrete (int)"),
             (["optimizer"], "algo.optimizer is discrete (a choice)"),
             (["weighting"], "algo.weighting is discrete (str)"),
             (["server_beta1"], "algo.server_beta1 is null"),
             (["lrr"], "Did you mean 'lr'?"),
             (["momentum"], "algo.momentum cannot be traced"),
             (["privacy.noise_multiplier"], "privacy.noise_multiplier is not a traced value of this run"),
             (["lr", "lr"], "algo.lr is named twice")]
    for keys, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
            H.RunObjective(sim, keys, 2)
        assert "\n" not in str(e.value)
    with pytest.raises(OptionError, match="piecewise constant"):
        H.RunObjective(sim, ["lr"], 2, metric="global_acc")
    with pytest.raises(OptionError, match="Did you mean 'global_loss'"):
        H.RunObjective(sim, ["lr"], 2, metric="global_los")
    with pytest.raises(OptionError, match="executor 'loop'"):
        H.RunObjective(Simulation(sim.algorithm, data, model, executor="loop"), ["lr"], 2)


def test_holdout_moves_round_fraction_of_every_clients_rows_to_the_validation_split(small):
    data = small
    train, val = H.holdout(data, 0.3, seed=5)
    for i in range(data.num_clients):
        n = int(data.train.count[i])
        k = min(max(round(0.3 * n), 1), n - 1) if n >= 2 else 0
        assert int(val.count[i]) == k and int(train.train.count[i]) == n - k
        rows = lambda a: {tuple(r) for r in np.asarray(a.x[i, :int(a.count[i])])}  # noqa: E731
        assert rows(train.train) | rows(val) == rows(data.train) and not rows(train.train) & rows(val)
    assert train.test is data.test
    with pytest.raises(OptionError, match="val_fraction must be in"):
        H.holdout(data, 1.0)


def test_grid_points_as_lanes_equal_their_runs_one_by_one(small):
    data = small
    model = make_model("logreg", data.input_shape, data.num_classes)
    objective = _objective(data, model, "fedavg", ["lr", "server_lr"], lr=0.05, **LOCAL)
    grid = H.grid_search(objective, {"algo.lr": [0.02, 0.1], "algo.server_lr": [0.5, 1.5]}, seed=2)
    assert [p for p, _ in grid] == [{"algo.lr": a, "algo.server_lr": b} for a in (0.02, 0.1) for b in (0.5, 1.5)]
    for point, value in grid:
        alone = objective.value({"lr": point["algo.lr"], "server_lr": point["algo.server_lr"]}, seed=2)
        assert value == pytest.approx(alone, rel=1e-5)


def test_tuning_steps_along_the_normalised_hypergradient_in_log_and_logit_space_on_redrawn_keys(tiny):
    """The first step is u₁ = u₀ − α·g/‖g‖ with u = (log lr, logit β₁) and g = dL/du = (lr·dL/dlr, β₁(1 − β₁)·dL/dβ₁),
    α = hyper_lr halved once per rejected try; it is kept because the run of the step's seed is better there; the
    runs of seed + step at every step."""
    with jax.enable_x64(True):
        data = tiny[0]
        objective = _objective(data, _model("logreg", data), "fedavg", ["lr", "server_beta1"], lr=0.05,
                               server_optimizer="adam", server_lr=0.03, server_beta1=0.9, **LOCAL)
        result = H.tune(objective, 2, hyper_lr=0.2, seed=4)
        first, second = result.trajectory[0], result.trajectory[1]
        assert [s.seed for s in result.trajectory] == [4, 5, 6] and result.gradients == 3
        assert result.spaces == {"algo.lr": "log", "algo.server_beta1": "logit"}
        assert result.runs == sum(s.tries for s in result.trajectory) and result.trajectory[-1].tries == 0
        g = np.array([0.05 * first.grad["algo.lr"], 0.9 * 0.1 * first.grad["algo.server_beta1"]])
        u = np.array([math.log(0.05), math.log(0.9 / 0.1)]) - 0.2 / 2 ** (first.tries - 1) * g / np.linalg.norm(g)
        assert second.hp["algo.lr"] == pytest.approx(math.exp(u[0]), rel=1e-9)
        assert second.hp["algo.server_beta1"] == pytest.approx(1 / (1 + math.exp(-u[1])), rel=1e-9)
        kept = objective.value({"lr": second.hp["algo.lr"], "server_beta1": second.hp["algo.server_beta1"]}, seed=4)
        assert kept < first.value
        assert second.value == pytest.approx(objective.value({"lr": second.hp["algo.lr"], "server_beta1":
                                                              second.hp["algo.server_beta1"]}, seed=5), rel=1e-12)


class _Bowl(H.RunObjective):
    """A stand-in objective L(lr) = (log lr − log 30)², not finite for lr > 10 (a run that diverges before the
    minimum, as training does past its edge of stability), with its gradient written out:
    :func:`fljax.hypergrad.tune`'s control flow alone."""

    def value(self, hp=None, seed=None):
        lr = self._check_hp(hp)["lr"]
        return math.log(lr / 30) ** 2 if lr <= 10 else math.nan

    def value_and_grad(self, hp=None, seed=None, mode="reverse"):
        lr = self._check_hp(hp)["lr"]
        grad = 2 * math.log(lr / 30) / lr if lr <= 10 else math.nan
        return H.Hypergradient(self.value(hp), {"algo.lr": grad}, {"algo.lr": lr}, mode)


def test_a_step_into_a_diverging_run_is_halved_until_the_run_is_better(small):
    """From lr = 0.1 a step of 4 in log lr lands at 0.1·e⁴ ≈ 5.46 (better: kept, 1 try). From there e⁴, e², e¹ lead
    past 10 (not finite) and e^0.5 to 9.0 (better: kept after 4 tries, the step length then doubles to 1); from 9.0,
    e¹ … e^0.125 fail and e^0.0625 is kept (5 tries). Every kept point is better on the (fixed) key, so the values
    fall. A step that no try improves leaves the point where it is."""
    sim = Simulation(make_algorithm("fedavg", lr=0.1, **LOCAL), small, make_model("logreg", small.input_shape,
                                                                                   small.num_classes))
    result = H.tune(_Bowl(sim, ["lr"], 1), 3, hyper_lr=4.0, keys="fixed")
    lrs = [s.hp["algo.lr"] for s in result.trajectory]
    assert lrs[:3] == pytest.approx([0.1, 0.1 * math.exp(4), 0.1 * math.exp(4.5)], rel=1e-12)
    assert lrs[3] == pytest.approx(0.1 * math.exp(4.5 + 0.0625), rel=1e-12)
    assert [s.tries for s in result.trajectory] == [1, 4, 5, 0]
    assert [s.hyper_lr for s in result.trajectory][:3] == [4.0, 1.0, 0.125]
    values = [s.value for s in result.trajectory]
    assert all(b < a for a, b in zip(values, values[1:]))
    stuck = H.tune(_Bowl(sim, ["lr"], 1), 1, hyper_lr=4.0, start={"algo.lr": 9.9}, tries=2, keys="fixed")
    assert stuck.trajectory[1].hp["algo.lr"] == 9.9 and stuck.trajectory[0].tries == 2 and stuck.runs == 2
    with pytest.raises(FloatingPointError, match="starting point"):
        H.tune(_Bowl(sim, ["lr"], 1), 1, start={"algo.lr": 20.0})


def test_fljax_tune_writes_the_trajectory_fljax_tune_returns(tmp_path, capsys):
    """``fljax tune`` and ``fljax.tune`` take the same path: the same trajectory (points, values, gradients), written
    to tune.json and tune.md; a clip norm no gradient reaches gets its one warning line."""
    import json

    import fljax
    from fljax.cli import main

    sets = ["rounds=2", "data.num_clients=6", "algo.cohort_size=3", "algo.local_epochs=null", "algo.local_steps=2",
            "algo.clip_norm=1e6", "model.options.hidden=[8]"]
    argv = ["tune", "--algorithm", "fedavg", "--hp", "algo.lr", "--hp", "algo.clip_norm", "--steps", "1",
            "--out", str(tmp_path / "t")] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("fljax: warning: algo.clip_norm: its gradient is exactly zero") == 1
    saved = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert [s["seed"] for s in saved["trajectory"]] == [0, 1] and saved["spaces"]["algo.lr"] == "log"
    assert (tmp_path / "t" / "tune.png").exists() and "| step |" in (tmp_path / "t" / "tune.md").read_text()
    algo = {"cohort_size": 3, "local_epochs": None, "local_steps": 2, "clip_norm": 1e6}
    result = fljax.tune(hp=["algo.lr", "algo.clip_norm"], steps=1, rounds=2, algo=algo, algorithm="fedavg",
                        data={"num_clients": 6}, model={"options": {"hidden": [8]}})
    for point, step in zip(saved["trajectory"], result.trajectory):
        assert point["hp"] == pytest.approx(step.hp, rel=1e-6) and point["value"] == pytest.approx(step.value,
                                                                                                   rel=1e-6)
        assert point["grad"]["algo.lr"] == pytest.approx(step.grad["algo.lr"], rel=1e-5)
        assert step.grad["algo.clip_norm"] == 0.0
    g = fljax.hypergradient(hp=["algo.lr"], rounds=2, algo=algo, algorithm="fedavg", data={"num_clients": 6},
                            model={"options": {"hidden": [8]}}, mode="forward")
    assert g.grad["algo.lr"] == pytest.approx(result.trajectory[0].grad["algo.lr"], rel=1e-4)


def test_the_dp_noise_multiplier_has_the_finite_difference_hypergradient_under_a_fixed_key(tiny):
    """DP-FedAvg's noise multiplier z is traced (``privacy.noise_multiplier``): with the key fixed, the noise z·C·ξ/W
    is a smooth function of z and its hypergradient agrees with the finite difference, in both modes. The upload
    pipeline computes its clip factors and weights in float32 (fljax.ops.privacy), so here the modes agree to
    float32's precision, not float64's."""
    from fljax.config import ExperimentConfig, from_dict
    from fljax.experiment import privacy_of, resolve

    with jax.enable_x64(True):
        data = tiny[0]
        exp = resolve(from_dict(ExperimentConfig, {
            "algorithm": "fedavg", "data": {"dataset": "synthetic", "num_clients": data.num_clients},
            "algo": {"lr": 0.05, "local_epochs": None, **LOCAL}, "rounds": 3,
            "privacy": {"clip_norm": 0.5, "noise_multiplier": 0.3}}))
        train, val = H.holdout(data, 0.25, seed=0)
        sim = Simulation(exp.algorithm, train, _model("logreg", data), executor="vmap",
                         privacy=privacy_of(exp, train))
        objective = H.RunObjective(sim, ["privacy.noise_multiplier", "lr"], 3, eval_data=train.replace(test=val))
        reverse, forward = objective.value_and_grad(seed=1), objective.value_and_grad(seed=1, mode="forward")
        # float32 parts: δ = 1e-2·h keeps their rounding (~1e-7 of L) below the difference's error
        differences = _finite_differences(objective, ["privacy.noise_multiplier", "lr"], seed=1, rel=1e-2)
        for key, name in (("privacy.noise_multiplier", "privacy.noise_multiplier"), ("lr", "algo.lr")):
            assert abs(reverse.grad[name]) > 1e-6
            assert reverse.grad[name] == pytest.approx(forward.grad[name], rel=1e-6)
            assert reverse.grad[name] == pytest.approx(differences[key], rel=1e-5)


def test_per_client_aggregation_weights_have_a_reverse_hypergradient_equal_to_finite_differences(tiny):
    """``aggregation.weights`` (the per-client multipliers s_i of the server's weights p_i·s_i, a vector of ones at
    the start) in reverse mode: each client's entry equals the central difference of whole runs moving that client's
    weight alone; forward mode and tuning refuse the vector in one line."""
    with jax.enable_x64(True):
        data = tiny[0]
        objective = _objective(data, _model("logreg", data), "fedavg", ["aggregation.weights"], lr=0.05, **LOCAL)
        assert np.array_equal(objective.start["aggregation.weights"], np.ones(data.num_clients))
        reverse = objective.value_and_grad(seed=2)
        g = np.asarray(reverse.grad["aggregation.weights"])
        assert g.shape == (data.num_clients,) and np.any(np.abs(g) > 1e-6)
        delta, ones = 1e-4, np.ones(data.num_clients)
        for i in range(data.num_clients):
            e = np.eye(data.num_clients)[i]
            points = [{"aggregation.weights": ones + m * delta * e} for m in (2, 1, -1, -2)]
            fd = float(np.dot([-1, 8, -8, 1], objective.values(points, 2)) / (12 * delta))
            assert g[i] == pytest.approx(fd, rel=1e-6, abs=1e-9), (i, g[i], fd)
        with pytest.raises(OptionError, match="use mode 'reverse'"):
            objective.value_and_grad(seed=2, mode="forward")
        with pytest.raises(OptionError, match="holds one weight per client"):
            H.tune(objective, 1)
