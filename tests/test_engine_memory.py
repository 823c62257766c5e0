"""Memory planning (fljax.engine.budget): every compiled program of FedJAX's EMNIST-shaped workload stays under a
stated budget, evaluation over the whole population is chunked whatever the cohort's executor, lanes share the
budget, the estimate is checked against XLA's count, and a run that cannot fit is refused in one line before it
compiles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.data.build import stack_clients
from fljax.engine import Lanes, Simulation, budget
from fljax.engine.budget import MemoryPlanError, peak_bytes
from fljax.models import make_model
from fljax.experiment import default_model

BUDGET_GIB = 0.4  # 409.6 MiB of temporaries per program: the cohort of 10 in one vmap, on the CPU too


def emnist_shaped(clients=3400, train_scale=0.05, seed=0):
    """FedJAX's EMNIST-62 federated shape: 3,400 clients, log-normal sizes (σ 0.6) of the real totals (77,483 test
    images; the 671,585 training images scaled by ``train_scale`` to fit CI), 28×28×1, 62 classes; ragged storage."""
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 0.6, clients)
    parts = []
    for total in (671_585 * train_scale, 77_483):
        sizes = np.maximum(1, np.round(w / w.sum() * total)).astype(int)
        n = int(sizes.sum())
        parts.append(stack_clients(rng.random((n, 28, 28, 1), np.float32), rng.integers(0, 62, n).astype(np.int32),
                                   sizes, "ragged"))
    return D.FederatedData(train=parts[0], test=parts[1], num_classes=62, input_shape=(28, 28, 1),
                           name="emnist-shaped")


@pytest.fixture(scope="module")
def emnist():
    return emnist_shaped()


def _fedjax_sim(data, **kw):
    algo = make_algorithm("fedavg", cohort_size=10, local_epochs=1, local_steps=None, batch_size=20, lr=0.1)
    return Simulation(algo, data, make_model("cnn1_s", data.input_shape, data.num_classes), **kw)


def test_emnist_shaped_programs_fit_the_budget_and_compile_in_seconds(emnist):
    """The cohort runs vmapped (the accelerator's choice for 10 clients); evaluation of all 3,400 clients is
    planned in chunks. Every program's temporaries by XLA's own count stay under the budget."""
    assert emnist.num_clients == 3400 and emnist.test.n_max >= 100
    sim = _fedjax_sim(emnist, executor="vmap", memory_budget=BUDGET_GIB)
    plans = sim.compile(rounds=2)
    limit = BUDGET_GIB * 2 ** 30
    assert set(name for name, _ in plans) == {"init", "block", "evaluate"}
    for (name, _), plan in plans.items():
        assert plan["budget_bytes"] == limit
        assert 0 < plan["xla_temp_bytes"] <= limit, (name, plan)
    (evaluation,) = plans["evaluate", ()]["maps"]
    assert evaluation["clients"] == 3400
    assert evaluation["per_client_bytes"] * 3400 > 10 * limit  # all at once would need 10× the budget...
    assert 1 <= evaluation["side_by_side"] < 3400  # ...so it runs in chunks
    # on the CPU a client counts CPU_RESIDENT times its estimate: what XLA:CPU's runtime holds beside its own count
    # (issue 41: 2.1-2.4x the estimate per client, measured by benchmarks/host_memory.py)
    assert evaluation["resident_bytes"] == evaluation["per_client_bytes"] * budget.CPU_RESIDENT == \
        evaluation["per_client_bytes"] * 2.5
    assert evaluation["side_by_side"] == int(limit // evaluation["resident_bytes"])
    (cohort,) = plans["block", (2,)]["maps"]
    assert cohort["clients"] == 10 and cohort["side_by_side"] == 10  # the cohort fits: one vmap
    # compiled in seconds (a guard against the unplanned program, not a benchmark): a few seconds each unloaded
    assert sim.compile_seconds < 180


def test_planned_evaluation_equals_unplanned_and_runs(emnist):
    """On a slice of the population small enough to evaluate in one vmap, the chunked evaluation gives the same
    summaries (chunking only splits the client axis)."""
    small = emnist.replace(train=emnist.train.take(jnp.arange(60)), test=emnist.test.take(jnp.arange(60)))
    outs = []
    for gib in (None, 2 ** -4):  # the machine's default budget (one vmap), then 64 MiB (one client: ~40 MiB)
        sim = _fedjax_sim(small, executor="vmap", memory_budget=gib)
        state = sim.init()
        outs.append(sim.evaluate(state))
        side = sim.memory_plans["evaluate", ()]["maps"][0]["side_by_side"]
        assert (side == 60) == (gib is None), side
    for k in outs[0][0]:
        np.testing.assert_allclose(outs[0][0][k], outs[1][0][k], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(outs[0][1]["global_acc"], outs[1][1]["global_acc"], rtol=1e-6)


def test_the_estimate_is_checked_against_xla():
    """The per-client estimate is within a small factor of XLA:CPU's count for a CNN evaluation chunk (it errs high
    here). These bounds are the CPU's: on the H200 the estimate of the EMNIST-shaped evaluation was 0.495× XLA:GPU's
    count (56.8 GB estimated, 106.8 GiB asked; docs/performance.md), just below the lower one, an under-estimate
    that the re-plan corrects (test_an_estimate_below_xlas_count_is_planned_again_and_the_result_is_unchanged)."""
    data = emnist_shaped(clients=340, train_scale=0.01)
    sim = _fedjax_sim(data, executor="vmap", memory_budget=0.5)
    plan = sim.compile()["evaluate", ()]
    (evaluation,) = plan["maps"]
    assert evaluation["side_by_side"] < 340
    estimate = evaluation["per_client_bytes"] * evaluation["side_by_side"]
    assert 0.5 * plan["xla_temp_bytes"] <= estimate <= 8 * plan["xla_temp_bytes"], (estimate, plan)
    # peak_bytes on known programs of [1000] float32 values: an elementwise chain is fused (only its result is
    # stored); two results feeding a product are both stored, with the product's scalar
    x = jnp.ones(1000)
    assert peak_bytes(jax.make_jaxpr(lambda x: jnp.sin(jnp.cos(jnp.exp(x))))(x)) == 4000
    assert peak_bytes(jax.make_jaxpr(lambda x: jnp.dot(jnp.exp(x), jnp.cos(x)))(x)) == 8004
    assert peak_bytes(jax.make_jaxpr(lambda x: jax.jit(jnp.exp)(x) @ x)(x)) == 4004  # a called function inlined


def test_a_program_that_cannot_fit_one_client_is_refused_in_one_line_before_compiling(emnist):
    sim = _fedjax_sim(emnist, executor="vmap", memory_budget=2 ** -20)  # 1 KiB
    with pytest.raises(MemoryPlanError) as err:
        sim.compile()
    message = str(err.value)
    assert "\n" not in message and "memory_budget" in message and "for one client" in message
    assert sim.executable("block", (1,)) is None and sim.executable("evaluate") is None


def test_lanes_share_the_budget_and_the_default_budget_is_the_devices():
    data = D.make_federated("synthetic", 12, seed=0, max_samples=40)
    sim = Simulation(make_algorithm("fedavg", cohort_size=4, local_steps=2, batch_size=8), data, default_model(data),
                     executor="vmap", memory_budget=0.5)
    lanes = Lanes(sim, seeds=[0, 1, 2])
    lanes.evaluate(lanes.init())
    assert sim.memory_plans["lanes_evaluate", ("vmap",)]["budget_bytes"] == 0.5 * 2 ** 30 / 3
    assert Lanes(sim, seeds=[0, 1], mode="map").side_by_side == 1
    total, source = Simulation(sim.algorithm, data, default_model(data)).program_budget((data,))
    _, have = budget.device_memory()
    assert 0 < total <= min(budget.CAP, budget.CPU_FRACTION * have) and "of this machine" in source


def test_the_default_budget_is_a_fraction_of_the_device_capped(monkeypatch):
    """A large device (an H200's allocator limit) gets CAP, not 75 % of its memory: the H200 run whose evaluation
    asked XLA for 106.8 GiB (budget.py's docstring); a small one gets the fraction left after the arguments."""
    args = (np.zeros(2 ** 20, np.float32),)  # 4 MiB, twice over with the outputs
    monkeypatch.setattr(budget, "device_memory", lambda: ("1 × NVIDIA H200", 105 * 2 ** 30))
    assert budget.default_budget(args)[0] == budget.CAP and "at most 4.0 GiB" in budget.default_budget(args)[1]
    monkeypatch.setattr(budget, "device_memory", lambda: ("this machine", 2 ** 30))
    assert budget.default_budget(args)[0] == budget.CPU_FRACTION * (2 ** 30 - 8 * 2 ** 20)


def test_run_refuses_an_impossible_budget_naming_the_key():
    import fljax
    from fljax.errors import ConfigError

    with pytest.raises(ConfigError, match="memory_budget"):
        fljax.run({"algorithm": "fedavg", "rounds": 1, "executor": "vmap", "memory_budget": 1e-9,
                   "algo": {"cohort_size": 2}, "data": {"dataset": "digits", "num_clients": 5}}, progress=False)


# the algorithms whose initialisation draws something per client (not one broadcast model)
PER_CLIENT_INIT = [("dfedavgm", {"client_init": "independent", "k": 2}), ("dispfl", {"k": 2}),
                   ("quped", {"personal_init": "independent"})]


@pytest.mark.parametrize("name,kw", PER_CLIENT_INIT, ids=[n for n, _ in PER_CLIENT_INIT])
def test_per_client_initialisation_is_planned_and_its_chunks_keep_the_bits(name, kw):
    """Initialisation is a program like the others: its per-client draws (models, masks, quantization centres) are
    client maps planned against its budget, chunked under a small one, with the same state as the one vmap the
    default budget runs (chunking only splits the client axis): bit for bit, except that a reduction compiled for a
    chunk can round its last bit differently (QuPeD's κ, from the std of each client's initial weights: 1 ulp)."""
    data = D.make_federated("digits", 12, "dirichlet", seed=0, alpha=0.5)

    def sim(gib):
        return Simulation(make_algorithm(name, **kw), data, make_model("mlp", data.input_shape, data.num_classes),
                          executor="vmap", memory_budget=gib, seed=3)

    plain = sim(None)
    whole = plain.init()
    maps = plain.memory_plans["init", ()]["maps"]
    assert maps and all(m["clients"] == 12 and m["side_by_side"] == 12 for m in maps), maps
    per_client = max(m["per_client_bytes"] for m in maps)
    small = sim(4.5 * per_client / 2 ** 30)  # four of the largest map's clients side by side (fewer if re-planned)
    chunked = small.init()
    plans = small.memory_plans["init", ()]
    assert [m["per_client_bytes"] for m in plans["maps"]] == [m["per_client_bytes"] for m in maps]
    assert any(m["per_client_bytes"] == per_client and 1 <= m["side_by_side"] <= 4 for m in plans["maps"]), plans
    rtol = 1e-6 if name == "quped" else 0.0
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=0)
    if name == "dfedavgm":  # the definition: client i's model drawn from fold_in(fold_in(fold_in(key, 0), INIT), i)
        from fljax.engine.context import INIT

        base = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(3), 0), INIT)
        for i in (0, 7, 11):
            mine = plain.model.init(jax.random.fold_in(base, i))
            for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(chunked.clients["params"]), strict=True):
                np.testing.assert_array_equal(a, b[i])


def test_an_estimate_below_xlas_count_is_planned_again_and_the_result_is_unchanged(emnist, monkeypatch):
    """The re-plan: when XLA's count of a compiled program's temporaries exceeds its budget (the estimate was too
    low: on the H200 it was 0.49× XLA:GPU's count, docs/performance.md), the program is traced again under the
    budget scaled by budget / XLA's count, and compiled again. Here the estimate is made 9× too low (about 0.49×
    XLA:CPU's count, against the honest estimate's 4.4×): the first plan runs too many clients side by side, the
    second fits, and the evaluation is the same."""
    monkeypatch.setattr(budget, "CPU_RESIDENT", 1.0)  # a client counts its estimate alone, as on a GPU
    small = emnist.replace(train=emnist.train.take(jnp.arange(60)), test=emnist.test.take(jnp.arange(60)))
    honest = _fedjax_sim(small, executor="vmap")  # the default budget: one vmap of the 60 clients
    state = honest.init()
    expect = honest.evaluate(state)
    b = honest.memory_plans["evaluate", ()]["maps"][0]["per_client_bytes"]
    real = budget.per_client_bytes
    monkeypatch.setattr(budget, "per_client_bytes", lambda *a: real(*a) // 9)
    low = _fedjax_sim(small, executor="vmap", memory_budget=4 * b / 2 ** 30)  # 4 clients by the honest estimate
    got = low.evaluate(state)
    plan = low.memory_plans["evaluate", ()]
    limit, (chunk,) = plan["budget_bytes"], plan["maps"]
    assert plan["first_xla_temp_bytes"] > limit  # 36 clients side by side by the low estimate: too many
    assert plan["replanned_bytes"] == pytest.approx(limit * limit / plan["first_xla_temp_bytes"])
    assert chunk["per_client_bytes"] == b // 9 and chunk["side_by_side"] == int(plan["replanned_bytes"] // (b // 9))
    assert chunk["side_by_side"] < int(limit // (b // 9)) and plan["xla_temp_bytes"] <= limit
    for k in expect[0]:
        np.testing.assert_allclose(got[0][k], expect[0][k], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got[1]["global_acc"], expect[1]["global_acc"], rtol=1e-6)


def test_the_stopping_rule_loop_is_planned_under_its_budget():
    """The stopping-rule loop (``run_until``) is a program of its own: its rounds' client map is planned against
    its budget (re-planned when XLA's count exceeds it: here the program's temporaries that do not shrink with the
    chunk, about 3 MB, exceed the 4-client plan), and the run ends where the unplanned one does."""
    from fljax.engine.stopping import Stopping, Tolerance, run_until

    data = D.make_federated("synthetic", 12, seed=0, max_samples=60)
    rule = Stopping(Tolerance(tol0=1e-9, metric="train_loss"), max_rounds=3, track=("train_loss",))

    def sim(gib):
        return Simulation(make_algorithm("fedavg", cohort_size=None, local_steps=3, batch_size=10), data,
                          make_model("mlp", data.input_shape, data.num_classes), executor="vmap", memory_budget=gib)

    plain = sim(None)
    whole = run_until(plain, rule)
    (key,) = [k for k in plain.memory_plans if k[0] == "until"]
    # the round's map, traced twice (the carry's shapes, then the loop's body)
    every = plain.memory_plans[key]["maps"]
    assert {(m["clients"], m["side_by_side"]) for m in every} == {(12, 12)}
    b = every[0]["resident_bytes"]
    small = sim(4.5 * b / 2 ** 30)
    chunked = run_until(small, rule)
    plan = small.memory_plans[key]
    side = int(plan.get("replanned_bytes", plan["budget_bytes"]) // b)
    assert 1 <= side < 12 and plan["maps"] and {(m["clients"], m["side_by_side"]) for m in plan["maps"]} == {(12, side)}
    assert chunked.rounds == whole.rounds == 3
    np.testing.assert_allclose(chunked.history["train_loss"], whole.history["train_loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(whole.state), jax.tree.leaves(chunked.state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
