"""FedAvg's server optimizers by name (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2): the optax
transformations of fljax.ops.fedopt against the paper's update written out in NumPy, against optax where optax
implements the same thing, through FedAvg's server update, and the options' refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fljax
from fljax.algorithms import make_algorithm
from fljax.errors import OptionError
from fljax.ops.fedopt import fedopt


def algorithm_2(kind, deltas, eta, beta1, beta2, tau, v0, bias_correction=False):
    """Reddi et al.'s Algorithm 2 in float64 on the clients' mean changes Δ_t (x_i − x_t): the iterates x_t from
    x_0 = 0, step for step as the paper writes them."""
    x = np.zeros_like(deltas[0], np.float64)
    m, v = np.zeros_like(x), np.full_like(x, v0)
    out = []
    for t, d in enumerate(deltas, start=1):
        m = beta1 * m + (1 - beta1) * d
        if kind == "adagrad":
            v = v + d ** 2
        elif kind == "yogi":
            v = v - (1 - beta2) * d ** 2 * np.sign(v - d ** 2)
        else:
            v = beta2 * v + (1 - beta2) * d ** 2
        m_hat, v_hat = (m / (1 - beta1 ** t), v / (1 - beta2 ** t)) if bias_correction else (m, v)
        x = x + eta * m_hat / (np.sqrt(v_hat) + tau)
        out.append(x.copy())
    return out


def run_transform(tx, deltas):
    """The iterates of optax transformation ``tx`` fed the pseudo-gradients g_t = −Δ_t (fljax's sign) from 0."""
    x = jnp.zeros(deltas[0].shape, jnp.float32)
    state = tx.init(x)
    out = []
    for d in deltas:
        updates, state = tx.update(-jnp.asarray(d, jnp.float32), state, x)
        x = optax.apply_updates(x, updates)
        out.append(np.asarray(x))
    return out


def _deltas(seed, steps=12, size=64):
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(0, 1.5, size))  # coordinates of very different sizes: the adaptivity matters
    return [rng.normal(0, 1, size) * scale * (0.5 + rng.random()) for _ in range(steps)]


@pytest.mark.parametrize("kind, bias_correction", [("adagrad", False), ("yogi", False), ("yogi", True),
                                                   ("adam", False), ("adam", True)])
def test_fedopt_is_algorithm_2(kind, bias_correction):
    deltas = _deltas({"adagrad": 0, "yogi": 1, "adam": 2}[kind])
    for eta, beta1, beta2, tau, v0 in ((0.1, 0.9, 0.99, 1e-3, None), (0.03, 0.0, 0.9, 0.1, 0.5),
                                       (1.0, 0.5, 0.999, 1e-2, 0.0)):
        got = run_transform(fedopt(kind, eta, beta1, beta2, tau, v0, bias_correction), deltas)
        want = algorithm_2(kind, deltas, eta, beta1, beta2, tau, tau ** 2 if v0 is None else v0, bias_correction)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * eta)  # float32 against float64
    # each rule is its own: the three differ on the same deltas
    finals = [run_transform(fedopt(k, 0.1), deltas)[-1] for k in ("adagrad", "yogi", "adam")]
    assert not np.allclose(finals[0], finals[1]) and not np.allclose(finals[1], finals[2])


def test_fedopt_with_bias_correction_is_optax_adam_and_yogi():
    """Where optax implements the same update: optax.adam (v starts at 0) and optax's yogi (m and v start at its
    initial_accumulator_value, here 0) bias-correct both moments and add ε outside the root."""
    deltas = _deltas(3)
    ours = run_transform(fedopt("adam", 0.05, 0.9, 0.999, 1e-3, 0.0, bias_correction=True), deltas)
    theirs = run_transform(optax.adam(0.05, b1=0.9, b2=0.999, eps=1e-3), deltas)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    ours = run_transform(fedopt("yogi", 0.05, 0.9, 0.999, 1e-3, 0.0, bias_correction=True), deltas)
    theirs = run_transform(optax.chain(optax.scale_by_yogi(b1=0.9, b2=0.999, eps=1e-3, initial_accumulator_value=0.0),
                                       optax.scale(-0.05)), deltas)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    # and where it does not: optax.adagrad has no momentum and puts ε inside the root
    ours = run_transform(fedopt("adagrad", 0.05, 0.0, tau=1e-3, initial_accumulator=0.1), deltas)
    theirs = run_transform(optax.adagrad(0.05, initial_accumulator_value=0.1, eps=1e-3), deltas)
    assert not np.allclose(ours, theirs, rtol=1e-4)


@pytest.mark.parametrize("kind", ["adagrad", "yogi", "adam"])
def test_fedavg_server_step_steps_the_clients_mean_change(kind):
    """Two rounds of FedAvg's server step given the weighted mean of the uploads (its aggregate): Δ_t is the mean
    minus the global model, and the new global model is Algorithm 2's x_{t+1}."""
    kw = dict(server_optimizer=kind, server_lr=0.05, server_beta1=0.8, server_eps=1e-2,
              server_initial_accumulator=0.3)
    if kind != "adagrad":
        kw["server_beta2"] = 0.95
    algo = make_algorithm("fedavg", **kw)
    rng = np.random.default_rng(4)
    x = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.asarray(rng.normal(size=2), jnp.float32)}
    server = algo.server.init(x)
    flat = lambda p: np.concatenate([np.ravel(p["b"]), np.ravel(p["w"])]).astype(np.float64)  # noqa: E731
    deltas, iterates = [], []
    for t in range(2):
        ups = {k: jnp.asarray(np.asarray(v)[None] + rng.normal(size=(4,) + v.shape), jnp.float32)
               for k, v in server["params"].items()}
        weights = jnp.asarray([1.0, 3.0, 2.0, 4.0])
        mean = {k: np.tensordot(np.asarray(weights) / 10.0, np.asarray(u), 1) for k, u in ups.items()}
        deltas.append(flat(mean) - flat(server["params"]))
        server = algo.server_step(None, server, {k: jnp.asarray(v, jnp.float32) for k, v in mean.items()})
        iterates.append(flat(server["params"]))
    want = algorithm_2(kind, deltas, 0.05, 0.8, 0.95, 1e-2, 0.3)
    start = flat(x)
    for got, w in zip(iterates, want):
        np.testing.assert_allclose(got, start + w, rtol=1e-5, atol=1e-5)


def test_default_server_is_sgd_and_fedadam_runs_from_a_config():
    assert make_algorithm("fedavg").server.server_optimizer == "sgd"
    cfg = {"rounds": 3, "data": {"num_clients": 8}, "algo": {"cohort_size": 4}}
    plain = fljax.run(cfg, progress=False).final
    explicit = fljax.run({**cfg, "algo": {"cohort_size": 4, "server_optimizer": "sgd", "server_lr": 1.0}},
                         progress=False).final
    assert plain["global_acc"] == explicit["global_acc"] and plain["train_loss"] == explicit["train_loss"]
    adam = fljax.run({**cfg, "algo": {"cohort_size": 4, "server_optimizer": "adam", "server_lr": 0.01}},
                     progress=False).final
    assert np.isfinite(adam["train_loss"]) and adam["train_loss"] != plain["train_loss"]
    for name in ("fedprox", "fedavg_ft", "ditto", "fedrod"):  # every algorithm whose server is FedAvg's
        assert make_algorithm(name, server_optimizer="yogi").server.server_optimizer == "yogi"


@pytest.mark.parametrize("kw, key", [
    ({"server_optimizer": "adamw"}, "server_optimizer"),
    ({"server_beta1": 0.9}, "server_beta1"),
    ({"server_bias_correction": True}, "server_bias_correction"),
    ({"server_optimizer": "adam", "server_momentum": 0.9}, "server_momentum"),
    ({"server_optimizer": "adagrad", "server_beta2": 0.99}, "server_beta2"),
    ({"server_optimizer": "adagrad", "server_bias_correction": True}, "server_bias_correction"),
    ({"server_optimizer": "adam", "server_beta2": 1.0}, "server_beta2"),
    ({"server_optimizer": "yogi", "server_eps": 0.0}, "server_eps"),
])
def test_server_options_refused_in_one_line(kw, key):
    with pytest.raises(OptionError) as e:
        make_algorithm("fedavg", **kw)
    assert e.value.key == key and "\n" not in str(e.value)
    with pytest.raises(OptionError, match=f"algo.{key}"):
        fljax.make_config(algorithm="fedavg", algo=kw)


def test_server_lr_is_traced_in_a_sweep():
    """Lanes replace hyperparameters by traced values: the adaptive server's options are traced arrays too."""
    algo = make_algorithm("fedavg", server_optimizer="adam", server_lr=0.1)
    traced = algo.with_values(server_lr=jnp.float32(0.2), server_beta1=jnp.float32(0.5))
    assert float(traced.server.server_beta1) == 0.5  # the flat name reaches the server optimizer's value
    x = {"w": jnp.ones(3)}
    tx = jax.jit(lambda lr: traced.with_values(server_lr=lr).server.transform().update(
        {"w": jnp.ones(3)}, traced.server.transform().init(x), x)[0])(jnp.float32(0.2))
    assert np.all(np.asarray(tx["w"]) < 0)
