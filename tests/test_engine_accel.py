"""Accelerator-facing engine choices tested on CPU: the precision option (fp32 bit-identical to the default on CPU,
bf16 computes in bfloat16 from float32 master weights and learns, with the MLP and the CNN), convolutions detected
in any model from its traced program (a user's Flax CNN gets the executor fljax's own CNN gets), ``conv_impl: auto``
read from the committed table (its GPU rows: the measured-fastest form), and a block of rounds as one device
program (no host round-trip per round)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.models import conv_table, make_model
from fljax.models.model import has_primitive, own_model
from fljax.experiment import default_model


@pytest.fixture(scope="module")
def digits():
    return D.make_federated("digits", 10, "dirichlet", seed=0, alpha=0.5)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _run(data, precision, rounds=3, model="mlp", **kw):
    algo = make_algorithm("fedavg", lr=0.1, cohort_size=5, local_steps=5, batch_size=10)
    sim = Simulation(algo, data, make_model(model, data.input_shape, data.num_classes), executor="vmap",
                     precision=precision, **kw)
    return sim, sim.run(rounds, eval_every=rounds, progress=False)


def test_fp32_is_bit_identical_to_the_default_on_cpu(digits):
    _, default = _run(digits, "tf32")
    _, fp32 = _run(digits, "fp32")
    for a, b in zip(_leaves(default.state), _leaves(fp32.state)):
        np.testing.assert_array_equal(a, b)
    assert default.final == {**fp32.final, "run_seconds": default.final["run_seconds"]}


def test_bf16_computes_in_bfloat16_with_float32_master_weights_and_learns(digits):
    sim, bf16 = _run(digits, "bf16", rounds=15)
    _, fp32 = _run(digits, "fp32", rounds=15)
    assert all(x.dtype == np.float32 for x in _leaves(bf16.state.server))  # master weights, aggregation
    chance = 0.1
    assert bf16.final["global_acc"] > chance + 0.4 and abs(bf16.final["global_acc"] - fp32.final["global_acc"]) < 0.05
    params = sim.model.init(jax.random.PRNGKey(0))
    x = jnp.ones((4,) + digits.input_shape)
    jaxpr = jax.make_jaxpr(sim.model.apply)(params, x)
    products = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert products and all(v.aval.dtype == jnp.bfloat16 for e in products for v in e.invars)
    assert sim.model.apply(params, x).dtype == jnp.float32
    grads = jax.grad(lambda p: sim.model.apply(p, x).sum())(params)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))


def _operand_dtypes(jaxpr, prims=("dot_general", "conv_general_dilated")) -> set:
    """The dtypes of the operands of every product and convolution in ``jaxpr`` and the jaxprs inside it."""
    out = set()
    for e in jaxpr.eqns:
        if e.primitive.name in prims:
            out |= {v.aval.dtype for v in e.invars}
        for value in e.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    out |= _operand_dtypes(getattr(sub, "jaxpr", sub), prims)
    return out


def test_a_bf16_cnn_computes_its_convolutions_in_bfloat16_and_learns(digits):
    """The CNN in bf16: every form's convolutions and products take bfloat16 operands; trained in the form GPUs
    run (``shifts``, clients vectorised) it learns as the fp32 run does (15 rounds: 0.76 both, chance 0.1)."""
    x = jnp.ones((4,) + digits.input_shape)
    for form in ("native", "patches", "shifts"):
        model = make_model("cnn_s", digits.input_shape, digits.num_classes, conv_impl=form).with_precision("bf16")
        params = model.init(jax.random.PRNGKey(0))
        assert _operand_dtypes(jax.make_jaxpr(model.apply)(params, x).jaxpr) == {jnp.dtype(jnp.bfloat16)}, form
        assert model.apply(params, x).dtype == jnp.float32
    _, bf16 = _run(digits, "bf16", rounds=15, model="cnn_s", conv_impl="shifts")
    _, fp32 = _run(digits, "fp32", rounds=15, model="cnn_s", conv_impl="shifts")
    assert all(x.dtype == np.float32 for x in _leaves(bf16.state.server))
    chance = 1 / digits.num_classes
    assert bf16.final["global_acc"] > chance + 0.4, bf16.final
    assert abs(bf16.final["global_acc"] - fp32.final["global_acc"]) < 0.05, (bf16.final, fp32.final)


def test_precision_from_the_config_and_the_cli_key():
    from fljax.config import ConfigError, load_config
    from fljax.experiment import build, privacy_of, resolve
    from fljax.runner.sweep import DataCache

    exp = resolve(load_config(None, ["precision=bf16", "data.num_clients=6", "algo.cohort_size=2", "memory_budget=2"]))
    data = DataCache()(exp, 0)
    sim = build(exp, data, privacy=privacy_of(exp, data))
    assert sim.model.precision == "bf16" and sim.precision == "bf16" and sim.memory_budget == 2
    with pytest.raises(ConfigError, match="precision must be one of"):
        load_config(None, ["precision=fp16"])


class UserCNN(nn.Module):
    """A CNN written with plain flax.linen layers (no fljax class, no conv_impl field)."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), (2, 2))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class UserMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1))))


def test_convolutions_are_detected_in_any_model_from_its_traced_program(digits):
    shape, classes = digits.input_shape, digits.num_classes
    assert own_model(UserCNN(), shape, classes).has_conv and not own_model(UserMLP(), shape, classes).has_conv
    for form in ("native", "patches", "shifts"):  # fljax's own, whatever form it runs in
        assert make_model("cnn1", shape, classes, conv_impl=form).has_conv
    assert not make_model("mlp", shape, classes).has_conv
    jaxpr = jax.make_jaxpr(lambda x: jax.lax.cond(True, lambda y: jnp.sin(y), lambda y: y, x))(1.0)
    assert has_primitive(jaxpr, "sin") and not has_primitive(jaxpr, "cos")  # nested jaxprs searched

    algo = make_algorithm("fedavg", cohort_size=4, local_steps=2, batch_size=10)
    users = Simulation(algo, digits, own_model(UserCNN(), shape, classes))
    ours = Simulation(algo, digits, make_model("cnn1", shape, classes))
    assert users.executor == ours.executor  # on CPU: the per-client loop (CNNs), not chunks
    assert users.executor.describe() == "loop" and users.unroll == ours.unroll > 1
    assert users.model.conv_impl == "native" and make_model("mlp", shape, classes).conv_impl is None


def test_auto_conv_form_follows_the_committed_table(monkeypatch):
    for row in conv_table.rows():
        assert set(row) >= {"backend", "model", "executor", "clients", "form", "client_steps_per_s"}
    cpu = conv_table.rows("cpu")
    assert {r["form"] for r in cpu} == {"native", "patches", "shifts"}, "CPU rows committed (benchmarks/conv_forms.py)"
    loop = max((r for r in cpu if r["model"] == "cnn1" and r["executor"] == "loop"),
               key=lambda r: r["client_steps_per_s"])
    assert conv_table.choose("cpu", "cnn1", False) == loop["form"] == "native"  # measured, and what CPU ran before
    # the CPU is pinned to the forms its published results ran with (their bits), with the reason stated
    assert conv_table.choose("cpu", "cnn1_s", True) == "patches" and "published" in conv_table.pinned("cpu")["why"]
    rows = ({"backend": "gpu", "model": "cnn1", "executor": "vectorised", "clients": 64, "form": "shifts",
             "client_steps_per_s": 3.0},
            {"backend": "gpu", "model": "cnn1", "executor": "vectorised", "clients": 64, "form": "patches",
             "client_steps_per_s": 2.0},
            {"backend": "gpu", "model": "cnn_s", "executor": "vectorised", "clients": 64, "form": "patches",
             "client_steps_per_s": 5.0},
            {"backend": "gpu", "model": "cnn_s", "executor": "vectorised", "clients": 64, "form": "shifts",
             "client_steps_per_s": 1.0})
    monkeypatch.setattr(conv_table, "_load", lambda: rows)
    assert conv_table.choose("gpu", "cnn1", True) == "shifts"  # its own rows
    assert conv_table.choose("gpu", "cnn_s", True) == "patches"
    assert conv_table.choose("gpu", "cnn2", True) == "patches"  # no rows: the form best across the backend's rows
    assert conv_table.choose("tpu", "cnn1", True) == "patches" and conv_table.choose("tpu", "cnn1", False) == "native"


def test_auto_picks_the_measured_fastest_form_from_the_committed_gpu_rows(monkeypatch):
    """The GPU rows committed in fljax/models/conv_forms.json (written by ``bash benchmarks/gpu.sh``): for each model
    measured, the form fastest at every measured number of clients is the one ``auto`` picks, and a Simulation of
    that CNN on a GPU backend runs it; a CNN without rows gets the same form (the best across the backend's rows)."""
    gpu = conv_table.rows("gpu", "vectorised")
    assert gpu and {r["source"] for r in gpu} == {"benchmarks/results/gpu.json"}
    for model in sorted({r["model"] for r in gpu}):
        mine = [r for r in gpu if r["model"] == model]
        sizes = sorted({r["clients"] for r in mine})
        fastest = {max((r for r in mine if r["clients"] == c), key=lambda r: r["client_steps_per_s"])["form"]
                   for c in sizes}
        assert len(fastest) == 1 and len(sizes) >= 2, (model, fastest, sizes)  # one form wins at every size
        (form,) = fastest
        assert conv_table.choose("gpu", model, True) == form
    assert conv_table.choose("gpu", "cnn_s", True) == "shifts"  # the CNN's rows (benchmarks/results/gpu.md, part 2)
    assert conv_table.choose("gpu", "cnn1", True) == "shifts"  # no rows of its own
    assert conv_table.choose("gpu", "cnn_s", False) == conv_table.FALLBACK["loop"]  # no GPU rows one at a time
    data = D.make_federated("digits", 4, seed=0)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # construction only: nothing is compiled
    sim = Simulation(make_algorithm("fedavg", cohort_size=2), data,
                     make_model("cnn_s", data.input_shape, data.num_classes))
    assert sim.executor.describe() == "vmap" and sim.model.conv_impl == "shifts"


def test_a_block_of_rounds_is_one_device_program_without_host_round_trips(digits):
    """n rounds are one compiled program: one while loop of n iterations, no transfer to or from the host inside
    (no outfeed, infeed, send/recv or host callback)."""
    sim = Simulation(make_algorithm("fedavg", cohort_size=4, local_epochs=1, local_steps=None, batch_size=10),
                     digits, default_model(digits), executor="vmap")
    sim.run_rounds(sim.init(), 25)
    text = sim.executable("block", (25,)).as_text()
    assert "while" in text
    for word in ("outfeed", "infeed", "send(", "recv(", "callback", "host_compute"):
        assert word not in text.lower(), word


class BNNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.Dense(16)(x.reshape(x.shape[0], -1))))
        return nn.Dense(10)(x)


def test_bf16_keeps_batchnorm_statistics_in_float32(digits):
    algo = make_algorithm("fedavg", lr=0.1, cohort_size=4, local_steps=3, batch_size=10)
    sim = Simulation(algo, digits, own_model(BNNet(), digits.input_shape, digits.num_classes), executor="vmap",
                     precision="bf16")
    state, _ = sim.run_rounds(sim.init(), 2)
    assert all(x.dtype == np.float32 for x in _leaves(state.server))
    assert np.isfinite(sim.evaluate(state)[0]["global_loss"])
