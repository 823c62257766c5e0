"""Privacy and compression in runs (issue 25, item 4 at run level): a DP run with no noise and a clip above every
update norm is the non-private run bit for bit (every algorithm that declares its upload a model), ε in a run's
metrics, summary, table and load_run is dp-accounting's called directly and survives a resume, a private round under
vmap equals the loop, error feedback keeps an unsampled client's residual bit for bit, DP-SGD's local step equals a
hand-written per-example loop, Poisson cohorts run in a static buffer, and noise levels trace as lanes of one
program."""
import dataclasses
import math

import dp_accounting as dpa
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fljax
from fljax import tree as T
from fljax.algorithms import ALGORITHMS
from fljax.algorithms.local_training import train_steps
from fljax.data.batching import gather_batch
from fljax.engine.context import SAMPLE
from fljax.engine.driver import _round_key
from fljax.engine.protocol import ClientInput
from fljax.errors import OptionError
from fljax.experiment import build, load_data, privacy_of, resolve
from fljax.config import from_dict, ExperimentConfig
from fljax.aggregation import WithAggregator
from fljax.privacy import ExamplePrivacy

from conftest import assert_trees_close

BASE = {"data": {"dataset": "synthetic", "num_clients": 12, "max_samples": 40},
        "model": {"name": "logreg"}, "rounds": 3, "eval_every": 1,
        "algo": {"cohort_size": 4, "local_steps": 3, "batch_size": 8, "weighting": "uniform"}}
NO_NOISE = {"noise_multiplier": 0.0, "clip_norm": 1e6, "accountant": "rdp"}
UNIFORM = {"name": "uniform"}  # the engine's fixed-size cohorts (replace-one adjacency, accountant rdp)
ALGOS = {"fedavg": {}, "fedprox": {"mu": 0.1}, "ditto": {}, "apfl": {}, "fedper": {}, "fedrep": {}, "lg_fedavg": {},
         "perfedavg": {}, "pfedme": {}, "fml": {}, "fedrod": {}}
HEAD = {"name": "mlp", "options": {"hidden": [8]}}  # a model with a 'head' layer (partial models, FedRoD)


def _config(algorithm="fedavg", algo=None, **sections) -> dict:
    cfg = {**BASE, "algorithm": algorithm, **sections}
    cfg["algo"] = {k: v for k, v in {**BASE["algo"], **(algo or {})}.items()
                   if k in fljax.algorithms.registry.declarations(ALGORITHMS[algorithm])}
    return cfg


def _own(state):
    """The algorithm's own pytrees of a state (the upload pipeline's beside them peeled)."""
    server, clients = state.server, state.clients
    if isinstance(server, WithAggregator):
        server, clients = server.state, clients.state
    return server, clients


def _bits(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


def test_every_algorithm_that_reads_an_aggregate_is_covered_here():
    declared = {n for n, c in ALGORITHMS.items() if c.reads_aggregate}
    assert declared - {"fedavg_ft", "fedlp", "fedbabu", "quped", "qupel"} == set(ALGOS)


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_no_noise_and_a_clip_above_every_norm_is_the_non_private_run_bit_for_bit(name):
    model = {"model": HEAD} if name in ("fedper", "fedrep", "lg_fedavg", "fedrod") else {}
    plain = fljax.run(_config(name, ALGOS[name], **model), progress=False)
    private = fljax.run(_config(name, ALGOS[name], privacy=NO_NOISE, participation=UNIFORM, **model),
                        progress=False)
    assert _bits(_own(private.state), _own(plain.state))
    private_only = ("epsilon", "clip_norm", "unclipped_fraction")
    for a, b in zip(private.history, plain.history):
        assert {k: v for k, v in a.items() if k not in (*private_only, "run_seconds")} == \
            {k: v for k, v in b.items() if k != "run_seconds"}
    assert private.history[-1]["epsilon"] == math.inf and private.history[0]["epsilon"] == 0.0
    assert all(h["clip_norm"] == 1e6 and h["unclipped_fraction"] == 1.0 for h in private.history[1:])


def test_compression_none_with_error_feedback_off_is_the_plain_run_and_identity_residuals_stay_zero():
    plain = fljax.run(_config(), progress=False)
    same = fljax.run(_config(compression={"kind": "qsgd", "bits": 16}), progress=False)
    # 16-bit QSGD is not the identity: close, and a valid run with its own byte count
    assert_trees_close(_own(same.state)[0], _own(plain.state)[0], rtol=1e-2, atol=1e-3)
    assert same.final["bytes_up"] < plain.final["bytes_up"]


def _direct_pld(q, z, steps, delta):
    acc = dpa.pld.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


def test_epsilon_in_metrics_summary_table_and_load_run_is_dp_accounting_and_a_resume_keeps_it(tmp_path):
    privacy = {"noise_multiplier": 1.1, "clip_norm": 0.5, "delta": 1e-3}
    compression = {"kind": "top_k", "fraction": 0.5, "error_feedback": True}
    cfg = _config(privacy=privacy, compression=compression, rounds=4, eval_every=2, checkpoint_every=2)
    whole = fljax.run(cfg, out=str(tmp_path / "whole"), progress=False)
    want = {r: _direct_pld(4 / 12, 1.1, r, 1e-3) for r in (2, 4)}
    got = {h["round"]: h["epsilon"] for h in whole.history}
    assert got == {0: 0.0, **want}
    summary = whole.summary
    assert summary["final"]["epsilon"] == want[4] and summary["privacy"]["noise_multiplier"] == 1.1
    assert summary["privacy"]["delta"] == 1e-3 and summary["privacy"]["compressor"].startswith("TopK")
    assert whole.row()["(ε, δ)"] == f"({want[4]:.3g}, 0.001)"  # papers report the pair
    frame = fljax.load_run(str(tmp_path / "whole"))
    assert list(frame["epsilon"]) == [0.0, want[2], want[4]]
    # a run stopped after 2 rounds and resumed to 4 gives the same records, ε included (and the residuals'
    # state, clip norm and Poisson cohorts it carries give the same model)
    fljax.run({**cfg, "rounds": 2}, out=str(tmp_path / "part"), progress=False)
    resumed = fljax.run(cfg, out=str(tmp_path / "part"), resume=True, progress=False)
    strip = lambda h: [{k: v for k, v in r.items() if k != "run_seconds"} for r in h]  # noqa: E731
    assert strip(resumed.history) == strip(whole.history)
    assert _bits(resumed.state, whole.state)


def _notes(capsys) -> list[str]:
    return [line.strip() for line in capsys.readouterr().err.splitlines() if line.startswith("  privacy:")]


def test_a_private_run_with_sample_weighting_says_which_weights_it_uses(capsys):
    """Client-level DP aggregates with min(n_i/ŵ, 1), not the n_i of ``algo.weighting: samples`` (FedAvg's default):
    one note line says so, once for a sweep of noise levels; none under uniform weighting or at example level."""
    private = {"noise_multiplier": 1.0, "clip_norm": 0.5, "delta": 1e-3}
    cfg = _config(algo={"weighting": "samples"}, privacy=private, rounds=1)
    del cfg["algo"]["weighting"]  # the algorithm's default
    fljax.sweep({"privacy.noise_multiplier": [0.7, 1.4]}, cfg, progress=True)
    assert _notes(capsys) == ["privacy: the private aggregate weighs client i by min(n_i/ŵ, 1) = 1 for every client "
                              "with data (uniform weights), not by n_i as algo.weighting: samples asks; ŵ is "
                              "privacy.weight_cap = 1"]
    fljax.run(_config(algo={"weighting": "samples"}, privacy={**private, "weight_cap": 20}, rounds=1), progress=True)
    assert _notes(capsys) == ["privacy: the private aggregate weighs client i by min(n_i/ŵ, 1), not by n_i as "
                              "algo.weighting: samples asks; ŵ is privacy.weight_cap = 20"]
    fljax.run(_config(privacy=private, rounds=1), progress=True)  # BASE: weighting uniform
    assert _notes(capsys) == []


def test_adaptive_clip_norm_is_recorded_and_follows_the_geometric_update_of_the_recorded_fractions(tmp_path):
    """Andrew et al. 2021: every evaluation record holds its last round's clip norm C_t and noised fraction b̄_t;
    consecutive rounds follow C_{t+1} = C_t·exp(−η_C(b̄_t − γ)) (replayed in NumPy from the records, from C_1 = the
    configured clip), the server's state after the last round is that update of the last record, a coarser evaluation
    schedule records the same last-round values, and summary.json's privacy block holds every setting."""
    z, sigma_b, gamma, lr = 1.0, 1.0, 0.3, 0.5
    private = {"noise_multiplier": z, "clip_norm": 0.5, "delta": 1e-3, "adaptive": True, "count_stddev": sigma_b,
               "target_quantile": gamma, "clip_lr": lr}
    cfg = _config(privacy=private, rounds=4, eval_every=1)
    result = fljax.run(cfg, out=str(tmp_path / "r"), progress=False)
    h = result.history
    clips = np.array([r["clip_norm"] for r in h[1:]])
    fractions = np.array([r["unclipped_fraction"] for r in h[1:]])
    replay = [0.5]
    for f in fractions:
        replay.append(replay[-1] * math.exp(-lr * (f - gamma)))
    np.testing.assert_allclose(clips, replay[:-1], rtol=2e-6)
    assert float(result.state.server.aggregator.encoder.clip_norm) == pytest.approx(replay[-1], rel=2e-6)
    assert len(set(clips)) == len(clips)  # it moves
    frame = fljax.load_run(str(tmp_path / "r"))
    assert list(frame["clip_norm"][1:]) == list(clips) and list(frame["unclipped_fraction"][1:]) == list(fractions)
    assert result.summary["final"]["clip_norm"] == clips[-1]
    block = result.summary["privacy"]
    assert {k: block[k] for k in ("clip_norm", "clipping", "adaptive", "target_quantile", "clip_lr", "count_stddev",
                                  "weight_cap")} == {"clip_norm": 0.5, "clipping": "flat", "adaptive": True,
                                                     "target_quantile": gamma, "clip_lr": lr, "count_stddev": sigma_b,
                                                     "weight_cap": 1.0}
    # the updates' share of the round's noise: z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (Andrew et al. 2021, Section 3.1)
    assert block["update_noise_multiplier"] == pytest.approx((z ** -2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-12)
    coarse = fljax.run({**cfg, "eval_every": 2}, progress=False).history
    assert [(r["clip_norm"], r["unclipped_fraction"]) for r in coarse[1:]] == \
        [(h[r]["clip_norm"], h[r]["unclipped_fraction"]) for r in (2, 4)]


def test_example_level_epsilon_is_the_smallest_clients_poisson_rate_over_every_local_step():
    algo = {"sampling": "poisson", "batch_size": 5}
    cfg = _config(algo=algo, privacy={"level": "example", "noise_multiplier": 1.0, "clip_norm": 1.0,
                                      "delta": 1e-4}, rounds=2, eval_every=2)
    exp = resolve(from_dict(ExperimentConfig, cfg))
    data = load_data(exp)
    counts = np.asarray(data.train.count)
    p = privacy_of(exp, data)
    assert p.example == ExamplePrivacy(1.0, 1.0, 5) and p.steps_per_round == 3 and p.uploads is None
    result = fljax.run(cfg, progress=False)
    assert result.history[-1]["epsilon"] == _direct_pld(5 / counts.min(), 1.0, 2 * 3, 1e-4)


def test_a_private_round_under_vmap_equals_the_loop():
    cfg = _config(privacy={"noise_multiplier": 0.8, "clip_norm": 0.3},
                  compression={"kind": "random_k", "fraction": 0.5, "error_feedback": True})
    states = {}
    for executor in ("loop", "vmap"):
        exp = resolve(from_dict(ExperimentConfig, {**cfg, "executor": executor}))
        sim = build(exp, data := load_data(exp), privacy=privacy_of(exp, data))
        states[executor], metrics = sim.run_rounds(sim.init(), 2)
        states[executor + "_metrics"] = metrics
    assert_trees_close(states["vmap"], states["loop"], rtol=1e-5, atol=1e-6)
    for k in ("bytes_up", "clip_norm", "unclipped_fraction", "train_loss"):
        np.testing.assert_allclose(states["vmap_metrics"][k], states["loop_metrics"][k], rtol=1e-5)


def _cohort(sim, state, round_):
    ctx = sim.context(sim.data, jnp.int32(round_), _round_key(state.key, round_), state.key)
    return ctx


@pytest.mark.parametrize("mode", ["gather", "mask"])
def test_error_feedback_keeps_an_unsampled_clients_residual_bit_for_bit(mode):
    cfg = _config(algo={"cohort_mode": mode}, compression={"kind": "top_k", "fraction": 0.25,
                                                           "error_feedback": True})
    exp = resolve(from_dict(ExperimentConfig, cfg))
    sim = build(exp, data := load_data(exp), privacy=privacy_of(exp, data))
    state = sim.init()
    before = state
    for r in range(3):
        cohort = np.asarray(sim.participation.draw(_cohort(sim, state, r), sim.algorithm.cohort_size).ids)
        after, metrics = sim.run_rounds(state, 1, stack=False)
        out = np.setdiff1d(np.arange(12), cohort)
        res_before, res_after = state.clients.aggregator, after.clients.aggregator
        assert _bits(T.take_clients(res_after, out), T.take_clients(res_before, out))
        # a sampled client's residual is what its compressed upload left out: nonzero under top-25%
        assert all(float(T.norm(T.take_clients(res_after, cohort[i:i + 1]))) > 0 for i in range(len(cohort)))
        # bytes: the top-k encoder's (values and int32 indices of a quarter of each leaf) of every sender
        one = _own(before)[0]["params"]
        per = sum(math.ceil(0.25 * a.size - 1e-9) * 8 for a in jax.tree.leaves(one))
        assert float(metrics["bytes_up"]) == per * len(cohort)
        state = after


def test_poisson_cohorts_run_in_a_static_buffer_whose_empty_slots_change_nothing():
    cfg = _config(privacy={"noise_multiplier": 0.0, "clip_norm": 1e6}, participation={"name": "poisson", "capacity": 8})
    exp = resolve(from_dict(ExperimentConfig, cfg))
    sim = build(exp, data := load_data(exp), privacy=privacy_of(exp, data))
    state = sim.init()
    sizes = set()
    for r in range(6):
        ctx = _cohort(sim, state, r)
        draw = sim.participation.draw(ctx, sim.algorithm.cohort_size)
        ids, valid = draw.ids, draw.valid
        assert ids.shape == (8,)
        sampled = np.asarray(ids)[np.asarray(valid)]
        sizes.add(len(sampled))
        new, metrics = sim.run_rounds(state, 1, stack=False)
        # no noise, no clip: the new model is the uniform mean of the sampled clients' models over the expected
        # cohort (q·N = 4) plus (1 − |S|/4) of the old one (McMahan et al.'s fixed denominator)
        assert float(metrics["bytes_down"]) == T.nbytes(_own(state)[0]["params"]) * len(sampled)
        state = new
    assert len(sizes) > 1  # the cohort size varies: Poisson sampling


def test_noise_levels_trace_as_lanes_of_one_program_with_each_runs_own_epsilon(tmp_path):
    cfg = _config(privacy={"noise_multiplier": 1.0, "clip_norm": 0.5, "delta": 1e-3}, rounds=2, eval_every=2)
    results = fljax.sweep({"privacy.noise_multiplier": [0.7, 1.4]}, cfg, out=str(tmp_path / "s"),
                                progress=False)
    assert all(r.vectorised for r in results.values())
    for z, r in zip((0.7, 1.4), results.values()):
        assert r.history[-1]["epsilon"] == _direct_pld(4 / 12, z, 2, 1e-3)
        alone = fljax.run({**cfg, "privacy": {**cfg["privacy"], "noise_multiplier": z}}, progress=False)
        assert_trees_close(_own(r.state)[0], _own(alone.state)[0], rtol=1e-4, atol=1e-5)


def _example_input(data, privacy, plan):
    train = jax.tree.map(lambda a: a[0], data.train)
    return ClientInput(state=None, train=train, key=jax.random.PRNGKey(3), round=jnp.int32(0), privacy=privacy)


def test_dp_sgd_local_steps_equal_a_hand_written_per_example_loop():
    """DP-SGD (Abadi et al. 2016, Alg. 1) in train_steps: for each step of the Poisson schedule, every drawn example's
    gradient clipped to C, summed, N(0, z²C²) added, divided by B, an SGD step — written out example by example."""
    exp = resolve(from_dict(ExperimentConfig, _config(algo={"sampling": "poisson", "batch_size": 5})))
    data = load_data(exp)
    sim = build(exp, data, privacy=privacy_of(exp, data))
    model = sim.model
    plan = exp.algorithm.plan()
    dp = ExamplePrivacy(clip_norm=0.5, noise_multiplier=0.7, batch_size=5)
    inp = _example_input(data, dp, plan)
    params = model.init(jax.random.PRNGKey(0))
    lr = 0.1
    got, _ = train_steps(model.loss, params, inp, plan, optax.sgd(lr))

    k_sched, k_steps = jax.random.split(inp.key)
    idx, mask, _ = plan.schedule(k_sched, inp.train.count, inp.train.n_min, inp.train.n_max)
    keys = jax.random.split(k_steps, idx.shape[0])
    want = params
    for s in range(idx.shape[0]):
        total = T.zeros_like(params)
        for j in range(idx.shape[1]):
            if not bool(mask[s, j]):
                continue
            one = gather_batch(inp.train.x, inp.train.y, idx[s, j:j + 1], jnp.ones(1, bool))
            g = jax.grad(model.loss)(want, one)
            norm = float(T.norm(g))
            total = T.add(total, T.scale(min(1.0, 0.5 / norm), g))
        noise = T.random_normal_like(keys[s], total)
        g = T.scale(1 / 5, T.axpy(0.7 * 0.5, noise, total))
        want = T.axpy(-lr, g, want)
    assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
    assert int(jnp.sum(mask)) > 0 and not bool(jnp.all(mask[:, :int(inp.train.count)]))  # a Poisson draw


class _BatchNormMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.BatchNorm(use_running_average=not train)(nn.Dense(8)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10, name="head")(nn.relu(x))


def test_privacy_is_refused_with_a_batchnorm_model_before_anything_runs(tmp_path):
    with pytest.raises(OptionError, match="privacy needs a model without BatchNorm"):
        fljax.run(_config(privacy={"noise_multiplier": 1.0, "clip_norm": 1.0}), model=_BatchNormMLP(),
                  out=str(tmp_path / "r"), progress=False)
    assert not (tmp_path / "r").exists()


def test_error_feedback_with_an_unbiased_compressor_sends_the_contractive_form_unless_asked_not_to():
    """``ef_scaling: contractive`` (the default) makes error feedback use C/(1 + ω) (fljax.ops.compress.Contractive);
    ``none`` keeps the unbiased C; both send the same bytes."""
    runs = {}
    for scaling in ("contractive", "none"):
        runs[scaling] = fljax.run(_config(rounds=2, compression={"kind": "random_k", "fraction": 0.5,
                                                                 "error_feedback": True, "ef_scaling": scaling}),
                                  progress=False)
    assert runs["contractive"].summary["privacy"]["compressor"].startswith("Contractive(inner=RandomK")
    assert runs["none"].summary["privacy"]["compressor"].startswith("RandomK")
    assert runs["contractive"].final["bytes_up"] == runs["none"].final["bytes_up"]
    assert runs["contractive"].final["train_loss"] != runs["none"].final["train_loss"]


@pytest.mark.parametrize("storage", ["padded", "ragged"])
def test_token_weighting_sets_the_fixed_denominator_from_the_clients_target_tokens(storage):
    """FedAvg with ``weighting: tokens`` aggregates with min(t_i/ŵ, 1), t_i the client's non-padding targets: the
    fixed denominator is W = m·mean_i min(t_i/ŵ, 1) over the training clients (not their example counts n_i),
    t_i counted here from the arrays, in either storage."""
    cfg = from_dict(ExperimentConfig, {
        "algorithm": "fedavg", "rounds": 2,
        "data": {"dataset": "shakespeare", "source": "standin", "num_clients": 10, "storage": storage},
        "algo": {"weighting": "tokens", "cohort_size": 4},
        "privacy": {"noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1e-3, "weight_cap": 400.0}})
    exp = resolve(cfg)
    data = load_data(exp)
    padded = data.train if storage == "padded" else data.train.to_padded()
    y, mask = np.asarray(padded.y), np.asarray(padded.mask)
    tokens = ((y != 0) & mask[..., None]).sum(axis=(1, 2))[:10]
    assert not np.allclose(tokens, np.asarray(padded.count)[:10])  # the two weightings differ on this data
    np.testing.assert_allclose(privacy_of(exp, data).uploads.expected_weight,
                               4 * np.minimum(tokens / 400.0, 1.0).mean(), rtol=1e-12)
