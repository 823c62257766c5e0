"""FedNova (fljax.algorithms.fednova) against its fixed point on quadratics written out in closed form, FedAvg's
biased fixed point beside it (heterogeneity spec, "FedNova"), and FedNova = FedAvg when every client does the same
plain-SGD work."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax import tree
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.engine.protocol import ClientInput
from fljax.models import make_model

M, DIM, ETA = 8, 3, 0.01
TAUS = np.array([2, 20, 5, 11, 3, 17, 8, 14])  # heterogeneous local steps in {2, …, 20}


class Quadratic:
    """f_i(x) = ½‖x − e_i‖²: a 'model' whose loss on client i's one row e_i is that quadratic (full-batch GD)."""

    has_mode = False

    def loss(self, params, batch):
        return 0.5 * jnp.sum(batch.mask[:, None] * (params["x"] - batch.x) ** 2)

    def train_loss(self, params, batch, variables=None, key=None):
        return self.loss(params, batch), variables


def _quadratic_rounds(name, rounds, momentum=0.0):
    """The algorithm's own client update on every client (budget τ_i), then its server on the stacked results."""
    rng = np.random.default_rng(0)
    e = rng.normal(size=(M, DIM)).astype(np.float32)
    train = D.pad_clients([e[i:i + 1] for i in range(M)], [np.zeros(1, np.int32)] * M)
    hp = dict(lr=ETA, batch_size=None, local_steps=int(TAUS.max()), cohort_size=None, weighting="uniform")
    if momentum:
        hp["momentum"] = momentum
    alg = make_algorithm(name, **hp)
    model = Quadratic()

    @jax.jit
    def one_round(x):
        def client(train_i, steps):
            inp = ClientInput(state={}, train=train_i, key=jax.random.PRNGKey(0), round=jnp.int32(0),
                              down={"x": x}, model=model, steps=steps)
            return alg.client_update(inp)

        result = jax.vmap(client)(train, jnp.asarray(TAUS, jnp.int32))
        if name == "fednova":
            return alg.server_update(None, {"params": {"x": x}}, None, None, result)["params"]["x"]
        return tree.weighted_mean_clients(result.upload, alg.aggregation_weights(result))["x"]  # FedAvg: the mean

    x = jnp.zeros(DIM, jnp.float32)
    for _ in range(rounds):
        x = one_round(x)
    return np.asarray(x, np.float64), e.astype(np.float64)


def _heavy_ball(tau, rho):
    """(c, ‖a‖₁) of τ steps of GD with heavy-ball momentum ρ on ½(y − e)² from y = 0, e = 1, written out:
    Δ = c (e − y₀), and ‖a‖₁ = Σ_k (1 − ρ^{τ−k+1})/(1 − ρ)."""
    y, b = 0.0, 0.0
    for _ in range(tau):
        b = rho * b + (y - 1.0)
        y = y - ETA * b
    return y, sum((1 - rho ** (tau - k + 1)) / (1 - rho) for k in range(1, tau + 1))


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_fednova_fixed_point_on_quadratics_is_the_closed_form(momentum):
    """GD on f_i gives Δ_i = c_i (e_i − x) with c_i = 1 − (1 − η)^{τ_i} (ρ = 0): FedAvg's fixed point is
    Σ c_i e_i / Σ c_i, FedNova's Σ (c_i/‖a_i‖₁) e_i / Σ (c_i/‖a_i‖₁) (uniform p_i), the latter close to the optimum
    ē = mean e_i, the former not."""
    c, norm = np.array([_heavy_ball(int(t), momentum) for t in TAUS]).T
    if momentum == 0:
        np.testing.assert_allclose(c, 1 - (1 - ETA) ** TAUS, rtol=1e-12)
    nova, e = _quadratic_rounds("fednova", 400, momentum)
    want = (c / norm) @ e / np.sum(c / norm)
    np.testing.assert_allclose(nova, want, rtol=1e-4, atol=1e-5)
    avg, _ = _quadratic_rounds("fedavg", 400, momentum)
    np.testing.assert_allclose(avg, c @ e / np.sum(c), rtol=1e-4, atol=1e-5)
    optimum = e.mean(0)
    assert np.linalg.norm(nova - optimum) < 0.25 * np.linalg.norm(avg - optimum)


def test_fednova_is_fedavg_when_every_client_does_the_same_work():
    """Equal τ_i and ρ = 0: d_i = Δ_i/τ, τ_eff = τ, so w + τ Σ p_i Δ_i/τ = FedAvg's weighted mean (through the
    engine: the same cohorts and batches)."""
    data = D.make_federated("synthetic", num_clients=12, seed=1)
    model = make_model("logreg", data.input_shape, data.num_classes)
    hp = dict(lr=0.05, batch_size=10, local_steps=4, cohort_size=5)
    states = []
    for name in ("fednova", "fedavg"):
        sim = Simulation(make_algorithm(name, **hp), data, model, executor="vmap")
        state, _ = sim.run_rounds(sim.init(), 3)
        states.append(state.server["params"])
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
