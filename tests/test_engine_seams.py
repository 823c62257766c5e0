"""The centralized template's two seams (fljax.aggregation, fljax.participation): a participation draws the cohort
(Poisson cohorts run without privacy too, their empty slots change nothing), the aggregator reduces the uploads (the
default is the weighted mean of the sampled clients' models), and what a seam cannot serve is refused in one line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax.config import ExperimentConfig, from_dict
from fljax.engine.driver import _round_key
from fljax.errors import OptionError
from fljax.experiment import build, load_data, privacy_of, resolve

BASE = {"data": {"dataset": "synthetic", "num_clients": 12, "max_samples": 40}, "model": {"name": "logreg"},
        "rounds": 1, "algorithm": "fedavg",
        "algo": {"cohort_size": 4, "local_steps": 3, "batch_size": 8, "eval_model": "stored"}}


def _sim(**sections):
    exp = resolve(from_dict(ExperimentConfig, {**BASE, **sections}))
    data = load_data(exp)
    return build(exp, data, privacy=privacy_of(exp, data))


@pytest.mark.parametrize("mode", ["gather", "mask"])
def test_a_poisson_round_averages_exactly_the_drawn_clients_models(mode):
    """participation: poisson without privacy: the new global model is Σ n_i w_i / Σ n_i over the drawn clients
    (each one's trained model, stored by eval_model: stored), and every other client's stored model is untouched."""
    sim = _sim(participation={"name": "poisson", "capacity": 8}, algo={**BASE["algo"], "cohort_mode": mode})
    sizes = set()
    state = sim.init()
    for r in range(8):
        ctx = sim.context(sim.data, jnp.int32(r), _round_key(state.key, r), state.key)
        draw = sim.participation.draw(ctx, sim.algorithm.cohort_size)
        ids = np.asarray(draw.ids)[np.asarray(draw.valid)]
        sizes.add(len(ids))
        new, _ = sim.run_rounds(state, 1, stack=False)
        counts = np.asarray(sim.data.train.count, np.float64)
        for leaf, stored, before in zip(*(jax.tree.leaves(t) for t in (new.server["params"], new.clients["params"],
                                                                       state.clients["params"]))):
            stored = np.asarray(stored, np.float64)
            if len(ids):
                want = np.tensordot(counts[ids] / counts[ids].sum(), stored[ids], 1)
                np.testing.assert_allclose(np.asarray(leaf), want, rtol=1e-5, atol=1e-6)
            others = np.setdiff1d(np.arange(12), ids)
            np.testing.assert_array_equal(stored[others], np.asarray(before)[others])
        state = new
    assert len(sizes) > 1  # the cohort's size varies: Poisson sampling


def test_participation_and_aggregation_refusals_are_one_line():
    def refused(key, match, **sections):
        with pytest.raises(OptionError, match=match) as e:
            resolve(from_dict(ExperimentConfig, {**BASE, **sections}))
        assert e.value.key == key and "\n" not in str(e.value)

    refused("participation", "clients all take part in every round", algorithm="dfedavg", algo={},
            participation={"name": "poisson"})
    refused("attack", "reads the stacked uploads themselves", algorithm="scaffold", algo={},
            attack={"name": "sign_flip"})
    refused("privacy.sampling", "moved to participation.name", privacy={"noise_multiplier": 1.0, "clip_norm": 1.0,
                                                                         "sampling": "fixed"})
    refused("participation.capacity", "at most the 12 training clients", participation={"name": "poisson",
                                                                                         "capacity": 13})
    with pytest.raises(OptionError, match="must be one of") as e:
        fljax.make_config(dict(BASE, participation={"name": "poison"}))
    assert "Did you mean 'poisson'" in str(e.value)
