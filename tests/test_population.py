"""Heterogeneous client populations (fljax.engine.population, QuPeD spec §8): groups against the plain loop, against
one homogeneous run per architecture, and the two cohort modes (D32) against each other."""
import jax
import numpy as np
import pytest

import fljax

from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.engine.population import ClientGroup, Population
from fljax.models import make_model
from fljax.experiment import default_model

from conftest import assert_trees_close

FEDAVG = dict(lr=0.05, cohort_size=6, local_steps=3, batch_size=8)


def _mlp(data, width):
    return make_model("mlp", data.input_shape, data.num_classes, hidden=[width])


def _run(algo, data, model=None, groups=None, executor="vmap", rounds=3):
    sim = Simulation(algo, data, default_model(data) if model is None else model, executor=executor, seed=1,
                     groups=groups)
    state, metrics = sim.run_rounds(sim.init(), rounds)
    summary, per_client = sim.evaluate(state)
    return state, metrics, summary, per_client


def _split(clients, sizes):
    """The homogeneous per-client pytree cut into the population's groups."""
    bounds = np.cumsum([0] + list(sizes))
    return tuple(jax.tree.map(lambda x: x[lo:hi], clients) for lo, hi in zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("mode", ["gather", "mask"])
def test_two_groups_of_one_type_equal_the_plain_population(synth20, mode):
    """Client-id keys: cutting a homogeneous population into groups changes no number (spec §8, T5)."""
    algo = make_algorithm("fedavg", **FEDAVG, eval_model="stored", cohort_mode=mode)
    ref = _run(make_algorithm("fedavg", **FEDAVG, eval_model="stored"), synth20)
    out = _run(algo, synth20, groups=[ClientGroup("a", 7), ClientGroup("b", 13)])
    assert_trees_close(out[0].server["params"], ref[0].server["params"], rtol=1e-5, atol=1e-6)
    assert_trees_close(out[0].clients, _split(ref[0].clients, (7, 13)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1]["train_loss"], ref[1]["train_loss"], rtol=1e-5)
    for k in ref[2]:
        np.testing.assert_allclose(out[2][k], ref[2][k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[3]["personal_acc"], ref[3]["personal_acc"], rtol=1e-6)


def test_cohort_modes_agree_and_leave_unsampled_clients_alone(synth20):
    """D32: masked commit and gather/scatter agree; a client outside every cohort keeps its state bit for bit."""
    groups = [ClientGroup("a", 9), ClientGroup("b", 11)]
    out = {m: _run(make_algorithm("local", lr=0.05, cohort_size=4, local_steps=3, batch_size=8, cohort_mode=m),
                   synth20, groups=groups, rounds=1) for m in ("gather", "mask")}
    assert_trees_close(out["gather"][0].clients, out["mask"][0].clients, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["gather"][1]["train_loss"], out["mask"][1]["train_loss"], rtol=1e-5)
    sim = Simulation(make_algorithm("local", lr=0.05, cohort_size=4, local_steps=3, batch_size=8), synth20,
                     default_model(synth20), seed=1)
    before = jax.tree.leaves(_split(sim.init().clients, (9, 11)))
    after = jax.tree.leaves(out["mask"][0].clients)
    changed = [np.any(np.asarray(a != b).reshape(a.shape[0], -1), axis=1) for a, b in zip(before, after)]
    half = len(changed) // 2  # group a's leaves, then group b's
    moved = np.concatenate([np.any(changed[:half], axis=0), np.any(changed[half:], axis=0)])
    assert moved.sum() == 4  # exactly the cohort changed; the 16 others are bit-identical


def test_heterogeneous_groups_equal_one_architecture_at_a_time(synth20):
    """Two architectures in one program: each group's clients follow exactly the trajectory they follow in a
    homogeneous run of their own architecture (Local training: no coupling across groups), and the per-group
    hyperparameter override applies to its group only."""
    small, large = _mlp(synth20, 8), _mlp(synth20, 24)
    kw = dict(lr=0.05, cohort_size=8, local_steps=3, batch_size=8)
    groups = [ClientGroup("small", 12, model=small), ClientGroup("large", 8, model=large, hp={"lr": 0.1})]
    het = _run(make_algorithm("local", **kw), synth20, small, groups)
    ref_small = _run(make_algorithm("local", **kw), synth20, small)
    ref_large = _run(make_algorithm("local", **{**kw, "lr": 0.1}), synth20, large)
    assert_trees_close(het[0].clients[0], _split(ref_small[0].clients, (12, 8))[0], rtol=1e-5, atol=1e-6)
    assert_trees_close(het[0].clients[1], _split(ref_large[0].clients, (12, 8))[1], rtol=1e-5, atol=1e-6)
    acc = np.concatenate([ref_small[3]["personal_acc"][:12], ref_large[3]["personal_acc"][12:]])
    np.testing.assert_allclose(het[3]["personal_acc"], acc, rtol=1e-6)


def test_heterogeneous_population_matches_the_loop_executor(synth20):
    groups = [ClientGroup("small", 12, model=_mlp(synth20, 8)), ClientGroup("large", 8, model=_mlp(synth20, 24))]
    algo = make_algorithm("local", lr=0.05, cohort_size=8, local_steps=3, batch_size=8)
    ref = _run(algo, synth20, groups=groups, executor="loop", rounds=2)
    for ex in ("vmap", "chunked"):
        out = _run(algo, synth20, groups=groups, executor=ex, rounds=2)
        assert_trees_close(out[0].clients, ref[0].clients, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1]["train_loss"], ref[1]["train_loss"], rtol=1e-5)


def test_groups_that_cannot_be_aggregated_or_run_are_refused(synth20):
    groups = [ClientGroup("small", 10, model=_mlp(synth20, 8)), ClientGroup("large", 10, model=_mlp(synth20, 24))]
    with pytest.raises(ValueError, match="trains the global model .* group 'large' runs another architecture"):
        Simulation(make_algorithm("fedavg", **FEDAVG), synth20, _mlp(synth20, 8), groups=groups)
    with pytest.raises(ValueError, match=r"groups sizes must add up to data.num_clients=20, got 12\."):
        Simulation(make_algorithm("fedavg", **FEDAVG), synth20, default_model(synth20), groups=[ClientGroup("a", 12)])
    with pytest.raises(ValueError, match="does not run client groups"):
        Simulation(make_algorithm("dfedavg", k=4), synth20, default_model(synth20), groups=[ClientGroup("a", 20)])
    with pytest.raises(ValueError, match="distinct"):
        Population((ClientGroup("a", 10), ClientGroup("a", 10)))


def test_groups_an_experiment_cannot_run_are_refused_by_its_resolution():
    """The rule a simulation asks of its groups (:func:`fljax.engine.population.check_groups`) refuses a config's
    groups when it is resolved, naming ``groups``, before any data is loaded: an algorithm that runs no groups,
    sizes that do not add up, ragged storage."""
    from fljax.errors import OptionError

    base = {"data": {"dataset": "synthetic", "num_clients": 4}, "algo": {"cohort_size": None}}
    groups = [{"name": "a", "size": 2}, {"name": "b", "size": 2}]
    for sections, message in (({"algorithm": "dfedavg", "algo": {"k": 2}}, "cannot be run by algorithm 'dfedavg'"),
                              ({"groups": groups[:1]}, "sizes must add up to data.num_clients=4, got 2"),
                              ({"data": {**base["data"], "storage": "ragged"}}, "need padded client arrays")):
        with pytest.raises(OptionError, match=message) as e:
            fljax.make_config({**base, "groups": groups, **sections})
        assert e.value.key == "groups" and "\n" not in str(e.value)


def test_each_group_runs_a_callable_per_group_in_client_order():
    """The one loop over groups (cohorts, evaluation and full-participation rounds use it): run(k, lo, hi) per group with its own
    client range, outputs concatenated in id order, per group when asked, and a one-line refusal for outputs that
    cannot be stacked."""
    import jax.numpy as jnp

    from fljax.engine.population import GroupShapeError, each_group

    calls = []

    def run(k, lo, hi):
        calls.append((k, lo, hi))
        return jnp.arange(lo, hi) * (k + 1)

    np.testing.assert_array_equal(each_group([2, 3], run), [0, 1, 4, 6, 8])
    assert calls == [(0, 0, 2), (1, 2, 5)]
    widths = each_group([2, 1], lambda k, lo, hi: jnp.zeros((hi - lo, k + 1)), concat=False)
    assert [w.shape for w in widths] == [(2, 1), (1, 2)]
    with pytest.raises(GroupShapeError, match="client groups' outputs differ"):
        each_group([2, 1], lambda k, lo, hi: jnp.zeros((hi - lo, k + 1)))
