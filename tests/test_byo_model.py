"""Own Flax modules with BatchNorm (``batch_stats``: averaged or local) and Dropout (per-client rngs): they learn,
the statistics equal a hand-written single-client loop, the executors agree, masks differ across clients and
rounds and follow the seed, evaluation is deterministic, and what stays unsupported is refused in one line."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fljax
from fljax.algorithms import Local, make_algorithm
from fljax.algorithms.model_state import WithStats
from fljax.data import from_arrays
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.models.model import own_model

from conftest import assert_trees_close


class BNMLP(nn.Module):
    dropout: float = 0.0
    classes: int = 3

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.Dense(16)(x)))
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.classes, name="head")(x)


class MaskRecorder(nn.Module):
    """Dropout on a row of ones, copied to every row of the batch, then a BatchNorm with momentum 0: its running
    mean is the last step's mask × 2."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        kept = jnp.broadcast_to(nn.Dropout(0.5, deterministic=not train)(jnp.ones((1, 32))), (x.shape[0], 32))
        kept = nn.BatchNorm(use_running_average=not train, momentum=0.0)(kept)
        return nn.Dense(3)(x) + 0.0 * kept[:, :3]


def _data(sizes=(5, 8, 11), dim=4):
    rng = np.random.default_rng(0)
    pairs = [(rng.normal(size=(n, dim)).astype(np.float32) + i, np.arange(n) % 3) for i, n in enumerate(sizes)]
    return from_arrays(train=pairs, test=pairs), pairs


def _sim(algorithm, module, data, executor="vmap", seed=0, **hp):
    algo = make_algorithm(algorithm, cohort_size=None, batch_size=None, local_steps=3, lr=0.1, **hp)
    return Simulation(algo, data, own_model(module, data.input_shape, data.num_classes), executor=executor,
                      seed=seed)


def _by_hand(module, params, stats, x, y, steps=3, lr=0.1):
    """Full-batch SGD on one client's own (unpadded) rows: BatchNorm in training mode, its statistics carried."""
    def loss(p, s):
        logits, new = module.apply({"params": p, "batch_stats": s}, x, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new["batch_stats"]

    for _ in range(steps):
        g, stats = jax.grad(loss, has_aux=True)(params, stats)
        params = jax.tree.map(lambda p, d: p - lr * d, params, g)
    return params, stats


def test_averaged_server_statistics_are_the_weighted_mean_of_the_clients_hand_trained_ones():
    data, pairs = _data()
    sim = _sim("fedavg", BNMLP(), data)
    state = sim.init()
    assert isinstance(state.server, WithStats) and not isinstance(state.clients, WithStats)
    params, stats = state.server.state["params"], state.server.batch_stats["batch_stats"]
    trained = [_by_hand(BNMLP(), params, stats, x, y) for x, y in pairs]
    n = np.array([len(y) for _, y in pairs], np.float32)
    mean = lambda trees: jax.tree.map(lambda *a: sum(w * t for w, t in zip(n / n.sum(), a)), *trees)  # noqa: E731
    new = sim.round(state)[0]
    assert_trees_close(new.server.batch_stats["batch_stats"], mean([s for _, s in trained]), rtol=1e-4, atol=1e-5)
    assert_trees_close(new.server.state["params"], mean([p for p, _ in trained]), rtol=1e-4, atol=1e-5)


def test_local_statistics_stay_with_each_client_and_equal_a_single_client_loop():
    data, pairs = _data()
    sim = _sim("fedavg", BNMLP(), data, batch_stats="local")
    state = sim.init()
    assert isinstance(state.clients, WithStats) and not isinstance(state.server, WithStats)
    params, stats = state.server["params"], state.clients.batch_stats["batch_stats"]
    new = sim.round(state)[0]
    for i, (x, y) in enumerate(pairs):
        own = jax.tree.map(lambda a: a[i], new.clients.batch_stats["batch_stats"])
        assert_trees_close(own, _by_hand(BNMLP(), params, jax.tree.map(lambda a: a[i], stats), x, y)[1],
                           rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm,hp", [("fedavg", {}), ("fedavg", {"batch_stats": "local"}),
                                          ("scaffold", {}), ("local", {})])
def test_vmap_executor_equals_the_loop_executor(algorithm, hp):
    data, _ = _data()
    module = BNMLP(dropout=0.3)
    states = [(s := _sim(algorithm, module, data, executor=ex, **hp)).run_rounds(s.init(), 2, stack=False)[0]
              for ex in ("vmap", "loop")]
    assert_trees_close(states[0], states[1], rtol=1e-4, atol=1e-5)


def _masks(seed, rounds=1):
    data, _ = _data(sizes=(4, 4, 4))
    sim = _sim("local", MaskRecorder(), data, seed=seed)
    state = sim.init()
    out = []
    for _ in range(rounds):
        state = sim.round(state)[0]
        out.append(np.asarray(state.clients.batch_stats["batch_stats"]["BatchNorm_0"]["mean"]))
    return out


def test_dropout_masks_differ_across_clients_and_rounds_and_follow_the_seed():
    first, second = _masks(0, rounds=2)
    assert set(np.unique(first)) <= {0.0, 2.0}  # the recorder holds the last step's mask (× 1/(1 − 0.5))
    assert len({m.tobytes() for m in first}) == 3  # three clients, three masks
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(_masks(0)[0], first)
    assert not np.array_equal(_masks(1)[0], first)


def test_evaluation_is_deterministic_and_uses_the_running_statistics():
    data, _ = _data()
    sim = _sim("fedavg", BNMLP(dropout=0.5), data)
    state = sim.run_rounds(sim.init(), 2, stack=False)[0]
    first, second = sim.evaluate(state), sim.evaluate(state)
    assert first[0] == second[0]
    variables = {"params": state.server.state["params"], **state.server.batch_stats}
    logits = BNMLP(dropout=0.5).apply(variables, data.test.x[0], train=False)
    acc = np.mean((np.argmax(logits, -1) == data.test.y[0])[np.asarray(data.test.mask[0])])
    np.testing.assert_allclose(first[1]["global_acc"][0], acc, rtol=1e-6)


@pytest.mark.slow
def test_a_batchnorm_model_learns_on_digits():
    result = fljax.run(algorithm="fedavg", algo={"cohort_size": 5, "lr": 0.05},
                       data={"dataset": "digits", "num_clients": 10, "partition": "dirichlet", "alpha": 0.5},
                       model=BNMLP(dropout=0.1, classes=10), rounds=15, eval_every=15, progress=False)
    assert result.final["global_acc"] > 0.8


def test_unsupported_uses_are_refused_in_one_line():
    data, _ = _data()
    with pytest.raises(ValueError, match="model BNMLP has BatchNorm, which only these algorithms train: fedavg, "
                                         "fedavg_ft, fedlp, fedprox, local, scaffold; got 'ditto'") as e:
        fljax.run(algorithm="ditto", algo={"cohort_size": 2}, data=data, model=BNMLP(), rounds=1, progress=False)
    assert "\n" not in str(e.value)
    assert "batch_stats" not in {f.name for f in dataclasses.fields(Local)}  # Local keeps them local: no choice
    with pytest.raises(OptionError, match="batch_stats must be one of \\['averaged', 'local'\\], got 'shared'"):
        make_algorithm("fedavg", batch_stats="shared", cohort_size=None)


def test_a_run_resumed_from_its_checkpoint_equals_the_straight_run(tmp_path):
    data, _ = _data()
    run = dict(algo={"cohort_size": 2, "batch_stats": "local"}, data=data, model=BNMLP(dropout=0.3), eval_every=2,
               progress=False)
    fljax.run(rounds=2, checkpoint_every=2, out=str(tmp_path), **run)
    resumed = fljax.run(rounds=4, checkpoint_every=2, out=str(tmp_path), resume=True, **run)
    straight = fljax.run(rounds=4, **run)
    assert resumed.final["global_acc"] == straight.final["global_acc"]
    assert resumed.final["train_loss"] == straight.final["train_loss"]
