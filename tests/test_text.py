"""Sequence models and token metrics: the generalised loss and accuracies against their per-token definition, the
LSTM against its equations, every executor (and ragged storage) against the loop on an LSTM and a Transformer FedAvg
round, the perplexity against a brute-force pass over every test token, and the model/data pairing refused when a
config is read."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.data.text import BOS, EOS, PAD, TokenShape
from fljax.engine import Simulation
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.models.model import accuracy_stats, auto_model, masked_cross_entropy
from fljax.models.sequence import LSTM, token_stats

from conftest import assert_trees_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_token_loss_and_accuracies_follow_their_per_token_definition():
    rng = np.random.default_rng(0)
    n, t, v = 5, 7, 12
    logits = rng.normal(size=(n, t, v)).astype(np.float32)
    labels = rng.integers(0, v, (n, t))
    labels[:, -2:] = PAD
    labels[0, 0], labels[1, 1], labels[2, 2] = EOS, v - 1, BOS  # EOS, OOV (the last id), BOS targets
    logits[0, 0, EOS] = logits[1, 1, v - 1] = 50.0  # both predicted right: counted only with specials
    mask = np.array([1, 1, 1, 0, 1], bool)
    ce, tokens, right_all, right, counted = 0.0, 0, 0, 0, 0
    for i in range(n):
        for j in range(t):
            y = labels[i, j]
            if not mask[i] or y == PAD:
                continue
            ce -= _log_softmax(logits[i, j])[y]
            tokens += 1
            hit = int(np.argmax(logits[i, j]) == y)
            right_all += hit
            if y not in (BOS, EOS, v - 1):
                right, counted = right + hit, counted + 1
    args = jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask)
    np.testing.assert_allclose(masked_cross_entropy(*args), ce / tokens, rtol=1e-5)
    assert tuple(map(int, accuracy_stats(*args))) == (right, counted)
    assert tuple(map(int, token_stats(*args))) == (right_all, tokens)
    assert right_all >= right + 2 and tokens > counted
    y1 = jnp.asarray(labels[:, 0])  # per-sample labels keep the classification meaning
    np.testing.assert_allclose(masked_cross_entropy(args[0][:, 0], y1, args[2]),
                               -np.mean([_log_softmax(logits[i, 0])[labels[i, 0]] for i in range(n) if mask[i]]),
                               rtol=1e-5)
    with pytest.raises(ValueError, match="use a sequence model"):
        masked_cross_entropy(args[0][:, 0], args[1], args[2])


def test_lstm_layer_follows_its_equations():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 3))
    layer = LSTM(4)
    params = layer.init(jax.random.PRNGKey(2), x)["params"]
    assert np.allclose(params["bias"][4:8], 1.0) and np.allclose(params["bias"][:4], 0.0)  # forget gate bias 1
    w, u, b = (np.asarray(params[k], np.float64) for k in ("input_kernel", "recurrent_kernel", "bias"))
    sig = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    h, c, out = np.zeros((2, 4)), np.zeros((2, 4)), []
    for step in range(5):
        z = np.asarray(x[:, step], np.float64) @ w + h @ u + b
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        out.append(h)
    np.testing.assert_allclose(layer.apply({"params": params}, x), np.stack(out, 1), rtol=1e-5, atol=1e-6)


def test_published_text_models_have_the_papers_sizes():
    """Reddi et al. (2021) Table: Stack Overflow NWP 4,050,748 parameters, EMNIST CR 1,206,590; the Shakespeare
    LSTM is embedding 90x8 + LSTM(8->256) + LSTM(256->256) + Dense(256->90) = 820,522."""
    so = make_model("lstm", TokenShape(20, 10_004), 10_004, embed=96, hidden=[670], projection=96)
    shk = make_model("lstm", TokenShape(80, 90), 90, embed=8, hidden=[256, 256])
    cnn = make_model("emnist_cnn", (28, 28, 1), 62)
    assert (so.num_params(), shk.num_params(), cnn.num_params()) == (4_050_748, 820_522, 1_206_590)
    assert cnn.stochastic  # dropout: a mask per training step, none at evaluation


def test_transformer_is_causal():
    model = make_model("transformer", TokenShape(6, 20), 20, width=8, layers=2, heads=2)
    params = model.init(jax.random.PRNGKey(0))
    x = jnp.asarray([[BOS, 5, 6, 7, 8, 9]])
    changed = x.at[0, 4].set(13)
    a, b = model.apply(params, x), model.apply(params, changed)
    np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[0, 4:], b[0, 4:])


@pytest.fixture(scope="module")
def words():
    return D.make_federated("stackoverflow", 12, seed=0, source="standin", max_samples=10, vocab=40, seq_len=6)


def _round(data, model, executor, rounds=2):
    algo = make_algorithm("fedavg", lr=0.5, batch_size=4, cohort_size=5, local_epochs=1)
    sim = Simulation(algo, data, model, executor=executor, chunk_size=2, seed=3)
    state, metrics = sim.run_rounds(sim.init(), rounds)
    summary, _ = sim.evaluate(state)
    return state, metrics, summary


@pytest.mark.parametrize("name,options", [("lstm", dict(embed=4, hidden=[8, 8], projection=5)),
                                          ("transformer", dict(width=8, layers=1, heads=2))])
@pytest.mark.parametrize("executor", ["vmap", "chunked"])
def test_executors_agree_with_loop_on_a_language_model(words, name, options, executor):
    model = make_model(name, words.input_shape, words.num_classes, **options)
    ref_state, ref_metrics, ref = _round(words, model, "loop")
    state, metrics, summary = _round(words, model, executor)
    assert_trees_close(state.server["params"], ref_state.server["params"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["train_loss"], ref_metrics["train_loss"], rtol=1e-5)
    assert {"global_acc_with_specials", "global_perplexity"} <= set(ref)
    for k in ref:
        np.testing.assert_allclose(summary[k], ref[k], rtol=1e-5, atol=1e-6)



def test_sharded_executor_agrees_with_loop_on_a_language_model():
    """The same rounds as above under `sharded` on 4 forced host devices (a subprocess: the device count is fixed
    when JAX starts): 5 clients a round over 4 devices (one padded slot), the evaluation's 12 clients likewise."""
    script = textwrap.dedent("""
        import jax, numpy as np
        assert jax.device_count() == 4, jax.devices()
        import fljax.data as D
        from fljax.models import make_model
        from test_text import _round
        words = D.make_federated("stackoverflow", 12, seed=0, source="standin", max_samples=10, vocab=40, seq_len=6)
        for name, options in [("lstm", dict(embed=4, hidden=[8, 8], projection=5)),
                              ("transformer", dict(width=8, layers=1, heads=2))]:
            model = make_model(name, words.input_shape, words.num_classes, **options)
            (ref_state, ref_metrics, ref), (state, metrics, summary) = (_round(words, model, ex)
                                                                        for ex in ("loop", "sharded"))
            for a, b in zip(jax.tree.leaves(ref_state.server["params"]), jax.tree.leaves(state.server["params"])):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(metrics["train_loss"], ref_metrics["train_loss"], rtol=1e-5)
            assert set(summary) == set(ref) and "global_perplexity" in ref
            for k in ref:
                np.testing.assert_allclose(summary[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
        print("SHARDED-OK")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "SHARDED-OK" in out.stdout, out.stderr[-3000:]

def test_ragged_token_storage_gives_the_padded_numbers(words):
    ragged = D.make_federated("stackoverflow", 12, seed=0, source="standin", max_samples=10, vocab=40, seq_len=6, storage="ragged")
    assert isinstance(ragged.train, D.RaggedArrays) and ragged.train.y.ndim == 2
    model = make_model("lstm", words.input_shape, words.num_classes, embed=4, hidden=[8])
    padded_state, _, padded = _round(words, model, "vmap")
    ragged_state, _, summary = _round(ragged, model, "vmap")
    assert_trees_close(ragged_state.server["params"], padded_state.server["params"], rtol=0, atol=0)
    assert {k: float(v) for k, v in summary.items()} == pytest.approx({k: float(v) for k, v in padded.items()},
                                                                        rel=1e-6)


def test_perplexity_and_accuracies_match_a_pass_over_every_test_token(words):
    model = make_model("lstm", words.input_shape, words.num_classes, embed=4, hidden=[8])
    state, _, summary = _round(words, model, "vmap", rounds=1)
    params = state.server["params"]
    mask = np.asarray(words.test.mask)
    x, y = np.asarray(words.test.x)[mask], np.asarray(words.test.y)[mask]
    logp = _log_softmax(np.asarray(model.apply(params, jnp.asarray(x)), np.float64))
    keep = y != PAD
    ce = -np.take_along_axis(logp, y[..., None], -1)[..., 0][keep]
    np.testing.assert_allclose(summary["global_perplexity"], np.exp(ce.mean()), rtol=1e-4)
    per_client = []
    for i in range(words.num_clients):  # acc_with_specials: the mean over clients of each one's token accuracy
        m = np.asarray(words.test.mask[i])
        xi, yi = np.asarray(words.test.x[i])[m], np.asarray(words.test.y[i])[m]
        pred = np.argmax(np.asarray(model.apply(params, jnp.asarray(xi))), -1)
        per_client.append(np.mean(pred[yi != PAD] == yi[yi != PAD]))
    np.testing.assert_allclose(summary["global_acc_with_specials"], np.mean(per_client), rtol=1e-5)


def test_token_label_histogram_counts_target_tokens(words):
    hist = words.train_label_counts()
    y, mask = np.asarray(words.train.y), np.asarray(words.train.mask)
    for i in (0, 5):
        tokens = y[i][mask[i]].ravel()
        np.testing.assert_array_equal(hist[i], np.bincount(tokens[tokens != PAD], minlength=words.num_classes))


def test_text_models_are_paired_with_text_data_when_the_config_is_read():
    shakespeare = {"dataset": "shakespeare", "source": "standin", "num_clients": 10}
    with pytest.raises(OptionError, match=r"model.name cannot be 'mlp' for next-token sequences of length 80: use "
                                          r"'lstm' or 'transformer'"):
        fljax.make_config(data=shakespeare, model={"name": "mlp"})
    with pytest.raises(OptionError, match="model.name cannot be 'lstm' for inputs of shape \\(8, 8, 1\\): it needs "
                                          "token sequences"):
        fljax.make_config(data={"dataset": "digits"}, model={"name": "lstm"})
    with pytest.raises(OptionError, match="cannot be 'lstm' for labelled token sequences"):
        fljax.make_config(data={"dataset": "sent140", "num_clients": 10}, model={"name": "lstm"})
    assert auto_model(D.SOURCES["shakespeare"].input_shape) == "lstm"
    assert auto_model(D.SOURCES["sent140"].input_shape) == "lstm_cls"
    fljax.make_config(data=shakespeare, model={"name": "transformer", "options": {"width": 16}})


def test_the_text_benchmark_measures_a_row_in_process():
    """benchmarks/text_workloads.measure(spec), the function benchmarks/gpu.py calls, at toy sizes."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import text_workloads

    row = text_workloads.measure({"workload": "stackoverflow-lstm", "cohort": 3, "population": 4, "dry": True})
    assert row["client_steps_per_s"] > 0 and row["tokens_per_s"] <= row["token_positions_per_s"]
    assert row["data"] == "stackoverflow (stand-in)" and row["local_steps"] == 2 and row["seq_len"] == 20
    assert "| 3 | 4 |" in text_workloads.markdown({"dry_run": True, "backend": "cpu", "cpu_count": 2, "devices": "cpu",
                                                   "jax": "-", "date": "-", "load_average": [0.0] * 3,
                                                   "command": "-"}, [row])


def test_text_reports_name_perplexity_and_token_accuracy():
    """A text run's table has a perplexity column per model (the mean over seeds of exp of the token-weighted mean
    cross-entropy) and its plots' axes name perplexity and token accuracy, not the raw metric keys (issue 40)."""
    from fljax.runner.plots import metric_label
    from fljax.runner.report import summary_row

    summaries = [{"final": {"personal_acc": 0.2, "global_acc": 0.1, "personal_perplexity": p, "global_perplexity": g,
                            "round": 3},
                  "run_seconds": 1.0, "compile_seconds": 2.0, "client_steps_per_second": 10.0}
                 for p, g in ((30.0, 50.0), (32.0, 54.0))]
    row = summary_row("fedavg", summaries)
    assert row["personal perplexity"] == "31.00 ± 1.41" and row["global perplexity"] == "52.00 ± 2.83"
    assert "global perplexity" not in summary_row("fedavg", [{**summaries[0], "final": {"round": 3}}])
    assert metric_label("personal_perplexity") == ("personalized test perplexity\n"
                                                   "(exp of the token-weighted mean cross-entropy)")
    assert metric_label("global_acc_with_specials").startswith("global-model test token accuracy\n")
