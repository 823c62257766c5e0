"""FedGiA (fljax.algorithms.fedgia) against its definition: losses and constants, the D/G solves, a literal
iteration-level Algorithm 1, convergence to directly computed optima, α limits, freezing, traced hyperparameters,
executors, Lemma IV.1. Everything runs through fljax.engine (Simulation, Lanes, run_until) in float64."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.algorithms.fedgia import FedGiA, selection
from fljax.engine import Lanes, Simulation, Stopping, Tolerance, run_until
from fljax.engine.context import SAMPLE
from fljax.engine.executors import ChunkedExecutor, LoopExecutor, VmapExecutor
from fljax.engine.stopping import start, step
from fljax.errors import OptionError
from fljax.ops import admm
from fljax.problems import (LeastSquares, Logistic, NonconvexLogistic, lambda_max_host,
                            lambda_max_power, pack_trials)
from fljax.reproduce.fedgia_claims import paper_tol0
from tests.fedgia_reference import fedgia_literal, lipschitz, loss_np, table3

LOSSES = {"ls": LeastSquares(), "log": Logistic(), "ncv": NonconvexLogistic()}
MU = {"ls": 0.0, "log": 1e-3, "ncv": 1e-2}


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def instance(kind, m=6, n=5, sizes=(3, 12), seed=0, scale=1.0, rows=None):
    """m clients with unequal row counts (uniform in ``sizes``, or exactly ``rows``); logistic labels in {0, 1}."""
    rng = np.random.default_rng(seed)
    out = []
    for d in (rng.integers(sizes[0], sizes[1] + 1, size=m) if rows is None else rows):
        a = scale * rng.standard_normal((d, n))
        b = rng.standard_normal(d) if kind == "ls" else (rng.random(d) < 0.4).astype(float)
        out.append((a, b))
    return out


def ordered(inst, data, t=0):
    """The instance's clients in the packed order."""
    return [inst[i] for i in np.asarray(data.order[t])]


def simulation(alg, data, t=0, executor=VmapExecutor()):
    """``alg`` on trial t of packed ``data``."""
    return Simulation(alg, jax.device_put(data.trials()[t]), executor=executor)


def round_key(seed, s):
    """The engine's selection key of round s of a run with ``seed``: the round's SAMPLE stream,
    fold_in(fold_in(fold_in(PRNGKey(seed), 1), s), SAMPLE)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), s), SAMPLE)


def trajectory(alg, data, rounds, seed=0):
    """Aggregates x and the clients' uploads z at the start of each of ``rounds`` plain engine rounds of trial 0,
    and the initial state (σ on the server, each client's curvature in its state, a tuple per size class)."""
    sim = simulation(alg, data)
    state = first = sim.init(seed)
    xs, zs = [], []
    for _ in range(rounds):
        xs.append(np.asarray(alg.aggregate(sim.data, state.server)))
        zs.append(np.asarray(state.server.uploads))
        state, _ = sim.round(state)
    return xs, zs, first


# The reference code's conventions (spec §4: Error = ‖∇f‖²/m², tol = min(tol0, 0.1·Error₀), CR = rounds) and the
# paper-literal ones (Error (35), tol = tol0, CR (31) = 2·rounds): the rule's metric, its `relative`, CR.
CODE = ("error", 0.1, 1)
PAPER = ("grad_norm_sq", None, 2)


def stop_rule(alg, data, tol0=None, max_iters=10_000, max_rounds=None, conventions=CODE):
    """Table IV's rule for ``data``: Error ≤ min(tol0, 0.1·Error₀), at most ``max_iters`` local iterations."""
    rows = int(sum(np.asarray(blk.d)[0].sum() for blk in data.blocks))                      # d of trial 0
    tol0 = paper_tol0(alg.loss, rows) if tol0 is None else tol0
    metric, relative, _ = conventions
    return Stopping(Tolerance(tol0=tol0, relative=relative, metric=metric), max_rounds=max_rounds or max_iters,
                    max_iters=max_iters, track=("train_loss", "error"))


def solve(alg, data, executor=VmapExecutor(), seed0=0, conventions=CODE, **stop):
    """Every trial of ``data`` as lane t (run seed seed0 + t) until ``stop_rule``; per-trial host arrays, with the
    final aggregate ``x``."""
    trials = [jax.device_put(t) for t in data.trials()]
    sim = Simulation(alg, trials[0], executor=executor)
    rule = stop_rule(alg, data, conventions=conventions, **stop)
    if executor.jittable:
        lanes = Lanes(sim, [seed0 + t for t in range(len(trials))], trials)
        res = run_until(lanes, rule)
        x = jax.vmap(lambda s, d: alg.aggregate(d, s.server))(res.state, lanes.data)
    else:
        runs = [run_until(Simulation(alg, d, executor=executor), rule, seed=seed0 + t) for t, d in enumerate(trials)]
        res = types.SimpleNamespace(**{k: np.stack([getattr(r, k) for r in runs])
                                       for k in ("rounds", "iters", "converged", "diverged")},
                                    metrics={k: np.stack([r.metrics[k] for r in runs]) for k in runs[0].metrics},
                                    history={k: np.stack([r.history[k] for r in runs]) for k in runs[0].history})
        x = [alg.aggregate(d, r.state.server) for d, r in zip(trials, runs)]
    metric, _, cr_per_round = conventions
    return types.SimpleNamespace(x=np.asarray(x), obj=res.metrics["train_loss"], err=res.metrics[metric],
                                 rounds=res.rounds, cr=cr_per_round * res.rounds, iters=res.iters,
                                 converged=res.converged, hist_f=res.history["train_loss"],
                                 hist_e=res.history[metric])


# ------------------------------------------------------------------------------------------------ losses, constants


@pytest.mark.parametrize("kind,gram", [("ls", False), ("ls", True), ("log", False), ("ncv", False)])
def test_padded_loss_and_grad_match_unpadded_definition(kind, gram):
    inst = instance(kind, m=3)
    data = pack_trials([inst], blocks=2, gram=gram)
    f, g = loss_np(kind, MU[kind])
    x = np.random.default_rng(1).standard_normal(5)
    clients = iter(ordered(inst, data))
    with jax.enable_x64(True):
        for blk in data.blocks:
            for j in range(blk.num_clients):
                one = jax.tree.map(lambda v: jnp.asarray(v[0, j]), blk)
                a, b = next(clients)
                val, grad = LOSSES[kind].value_and_grad(jnp.asarray(x), one)
                np.testing.assert_allclose(val, f(x, a, b), rtol=1e-13)
                np.testing.assert_allclose(grad, g(x, a, b), rtol=1e-12, atol=1e-15)
                np.testing.assert_allclose(LOSSES[kind].grad(jnp.asarray(x), one), grad, rtol=1e-13)
                # the padded gradient is the autodiff gradient of the padded value
                np.testing.assert_allclose(jax.grad(LOSSES[kind].value)(jnp.asarray(x), one), grad, rtol=1e-12)


def test_lipschitz_constants_match_dense_eigensolve():
    for a, _ in instance("ls", m=4, sizes=(2, 9)):        # rows fewer and more than n = 5
        lam = np.linalg.eigvalsh(a.T @ a)[-1]
        assert lambda_max_host(a) == pytest.approx(lam, rel=1e-13)
        padded = np.vstack([a, np.zeros((4, a.shape[1]))])
        assert lambda_max_host(padded) == pytest.approx(lam, rel=1e-13)
        with jax.enable_x64(True):
            assert float(lambda_max_power(jnp.asarray(padded), iters=2000)) == pytest.approx(lam, rel=1e-8)
        for kind, loss in LOSSES.items():
            d = a.shape[0]
            assert float(loss.lipschitz(lam, d)) == pytest.approx(lipschitz(kind, a, MU[kind]), rel=1e-13)
            # r_i bounds the Hessian of f_i: the data term's curvature ≤ λ/(κd), the regulariser's ≤ μ/d
            if kind == "ls":
                assert np.linalg.eigvalsh(a.T @ a / d)[-1] <= float(loss.lipschitz(lam, d)) * (1 + 1e-12)


@pytest.mark.parametrize("kind", ["ls", "log", "ncv"])
@pytest.mark.parametrize("variant,solver", [("D", "inverse"), ("G", "inverse"), ("G", "cholesky"), ("G", "cg")])
def test_curvature_solves_match_dense_solve(kind, variant, solver):
    """(H_i/m + σI)⁻¹v for Table III's H_i: scalar (D), Cholesky when n ≤ rows and Woodbury otherwise (G), CG."""
    inst = instance(kind, n=6, rows=[3, 12, 2, 9, 14])
    data = pack_trials([inst], blocks=2, row_multiple=1)  # a block with rows < n (Woodbury), one with rows ≥ n
    method = FedGiA(loss=LOSSES[kind], variant=variant, gram_solver=solver)
    rows = [blk.rows for blk in data.blocks]
    assert min(rows) < 6 <= max(rows)
    if solver == "cholesky":            # per-step triangular solves are refused with several size classes
        with pytest.raises(OptionError, match="deadlock") as e:
            trajectory(method, data, 0)
        assert e.value.key == "gram_solver" and "\n" not in str(e.value)
        data = pack_trials([inst], row_multiple=1)
    v = np.random.default_rng(2).standard_normal(6)
    _, _, state = trajectory(method, data, 0)
    sigma, m = float(state.server.sigma), 5
    clients = ordered(inst, data)
    r = max(lipschitz(kind, a, MU[kind]) for a, _ in clients)
    t = 0.15 if kind == "ls" else max(0.025, 4 * np.log(sum(len(b) for _, b in inst)) / 6)
    assert sigma == pytest.approx(t * r / m, rel=1e-12)
    i = 0
    for blk, own in zip(data.blocks, state.clients):                     # one pytree per size class
        curv = own.curv
        for j in range(blk.num_clients):
            a, _ = clients[i]
            dense = table3(kind, variant, a, MU[kind]) / m + sigma * np.eye(6)
            cj = jax.tree.map(lambda c: c[j], curv)
            got = admm.linearized_primal(jnp.zeros(6), jnp.asarray(v), jnp.zeros(6), cj)
            tol = 1e-7 if solver == "cg" else 1e-11
            np.testing.assert_allclose(-np.asarray(got), np.linalg.solve(dense, v), rtol=tol, atol=tol)
            i += 1


# ------------------------------------------------------------------------------------------------ Algorithm 1


@pytest.mark.parametrize("kind,variant,k0,alpha", [("ls", "D", 1, 0.5), ("ls", "G", 3, 0.5), ("log", "G", 2, 1.0),
                                                    ("log", "D", 3, 0.3), ("ncv", "G", 1, 0.5),
                                                    ("ncv", "D", 2, 0.7)])
def test_round_stepper_matches_literal_algorithm_1(kind, variant, k0, alpha):
    inst = instance(kind, m=7, n=5, sizes=(2, 10))
    data = pack_trials([inst], blocks=2)
    method = FedGiA(loss=LOSSES[kind], variant=variant, k0=k0, alpha=alpha)
    rounds = 5
    xs, zs, _ = trajectory(method, data, rounds, seed=3)
    t = 0.15 if kind == "ls" else max(0.025, 4 * np.log(sum(len(b) for _, b in inst)) / 5)
    ref_x, ref_z = fedgia_literal(kind, ordered(inst, data), variant, k0, alpha, lambda s: round_key(3, s),
                                  rounds * k0, t, MU[kind])
    scale = max(1.0, np.abs(ref_x[-1]).max())
    for s in range(rounds):
        np.testing.assert_allclose(xs[s], ref_x[s], rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(zs[s], ref_z[s], rtol=0, atol=1e-12 * max(1.0, np.abs(ref_z[s]).max()))


def test_selection_is_a_uniform_subset_of_ceil_alpha_m():
    m = 10
    keys = jax.random.split(jax.random.PRNGKey(0), 2000)
    for alpha, size in [(0.5, 5), (0.31, 4), (0.7, 7), (1.0, 10), (1e-6, 1), (0.0, 0)]:
        sel = np.asarray(jax.vmap(lambda k: selection(k, m, alpha))(keys))
        assert (sel.sum(axis=1) == size).all()
        if 0 < size < m:
            freq = sel.mean(axis=0)
            assert np.abs(freq - size / m).max() < 0.05          # every client equally likely (±4.5 sd)


# ------------------------------------------------------------------------------------------------ solutions


def test_least_squares_converges_to_direct_solution():
    inst = instance("ls", m=6, n=5, sizes=(4, 12))
    data = pack_trials([inst, instance("ls", m=6, n=5, sizes=(4, 12), seed=9)], gram=True)
    for variant in "DG":     # t = 1: the paper's t = 0.15 is tuned for V.1's large clients and diverges here
        res = solve(FedGiA(loss=LeastSquares(), variant=variant, k0=3, t=1.0), data, tol0=1e-26, max_iters=3000)
        for t, clients in enumerate([inst, instance("ls", m=6, n=5, sizes=(4, 12), seed=9)]):
            h = sum(a.T @ a / len(b) for a, b in clients) / 6
            c = sum(a.T @ b / len(b) for a, b in clients) / 6
            x_star = np.linalg.solve(h, c)
            f, _ = loss_np("ls", 0.0)
            np.testing.assert_allclose(res.x[t], x_star, atol=1e-9)
            assert res.obj[t] == pytest.approx(np.mean([f(x_star, a, b) for a, b in clients]), rel=1e-12)


def test_logistic_converges_to_long_gradient_descent_optimum():
    inst = instance("log", m=6, n=4, sizes=(5, 15))
    _, g = loss_np("log", 1e-3)
    f, _ = loss_np("log", 1e-3)
    x = np.zeros(4)
    # 1/L with L = ‖(1/m)Σ_i B_i/(4d_i)‖ + μ·mean(1/d_i), the Lipschitz constant of ∇f
    lip = np.linalg.eigvalsh(sum(a.T @ a / (4 * len(b)) for a, b in inst) / 6)[-1] + 1e-3 * np.mean(
        [1 / len(b) for _, b in inst])
    grad = np.ones(4)
    while np.linalg.norm(grad) > 1e-13:
        grad = np.mean([g(x, a, b) for a, b in inst], axis=0)
        x = x - grad / lip
    res = solve(FedGiA(loss=Logistic(), variant="G", k0=5, t=1.0), pack_trials([inst]), tol0=1e-28, max_iters=4000)
    np.testing.assert_allclose(res.x[0], x, atol=1e-8)
    assert res.obj[0] == pytest.approx(np.mean([f(x, a, b) for a, b in inst]), rel=1e-12)


# ------------------------------------------------------------------------------------------------ α limits


def test_alpha_one_selects_everyone_and_ignores_the_keys():
    data = pack_trials([instance("log", m=5)])
    a = solve(FedGiA(loss=Logistic(), variant="G", k0=2, alpha=1.0), data, seed0=0)
    b = solve(FedGiA(loss=Logistic(), variant="G", k0=2, alpha=1.0), data, seed0=123)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.hist_e, b.hist_e)
    c = solve(FedGiA(loss=Logistic(), variant="G", k0=2, alpha=0.5), data, seed0=123)
    assert not np.array_equal(a.hist_e, c.hist_e)


def test_alpha_zero_is_gradient_descent_with_step_one_over_m_sigma():
    """With no client selected every client takes (15)–(17), so x⁺ = mean_i(x − ḡ_i/σ) = x − ∇f(x)/(mσ) (any k0)."""
    inst = instance("ncv", m=6)
    data = pack_trials([inst])
    f, g = loss_np("ncv", 1e-2)
    for k0 in (1, 4):
        res = solve(FedGiA(loss=NonconvexLogistic(), variant="D", k0=k0, alpha=0.0), data, max_iters=40)
        sigma = float(trajectory(FedGiA(loss=NonconvexLogistic()), data, 0)[2].server.sigma)
        x = np.zeros(5)
        for s in range(int(res.rounds[0]) + 1):
            assert res.hist_f[0, s] == pytest.approx(np.mean([f(x, a, b) for a, b in inst]), rel=1e-12)
            x = x - np.mean([g(x, a, b) for a, b in inst], axis=0) / (6 * sigma)
        assert res.iters[0] == k0 * res.rounds[0]


# ------------------------------------------------------------------------------------------------ driver


def test_finished_trial_is_frozen_bitwise_and_batching_does_not_change_results():
    inst = [instance("ls", m=6, seed=s) for s in range(2)]
    data = pack_trials(inst)
    method = FedGiA(loss=LeastSquares(), variant="G", k0=2, t=1.0)
    batch = solve(method, data)
    assert batch.rounds[0] != batch.rounds[1]             # the trials stop at different rounds
    for t in range(2):
        alone = solve(method, data.trial(t), seed0=t)     # lane t runs with seed t
        np.testing.assert_allclose(alone.x[0], batch.x[t], rtol=0, atol=1e-13)
        assert alone.rounds[0] == batch.rounds[t]
    # a finished run passes through the loop's step unchanged, bit for bit
    sim = simulation(method, data)
    rule = stop_rule(method, data)
    body = jax.jit(lambda c: step(sim, rule, c, sim.data, None))
    carry = start(sim, rule, sim.init(), sim.data, None)
    while not bool(carry.done):
        carry = body(carry)
    again = body(body(carry))
    for u, v in zip(jax.tree.leaves(carry), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_traced_k0_and_alpha_lanes_equal_separate_runs():
    """A grid over k0 and α is one program (the values are traced lane arguments); each lane equals the run with
    those values as constants."""
    data = pack_trials([instance("log", m=6)])
    trial = jax.device_put(data.trials()[0])
    points = [{"k0": 1, "alpha": 0.3}, {"k0": 3, "alpha": 0.7}, {"k0": 2, "alpha": 1.0}]
    method = FedGiA(loss=Logistic(), variant="G")
    sim = Simulation(method, trial, executor="vmap")
    rule = stop_rule(method, data)
    grid = run_until(Lanes(sim, [5] * 3, hps=points), rule)
    compiled = len(sim._compiled)
    again = run_until(Lanes(sim, [5] * 3, hps=points[::-1]), rule)          # other values: the same programs
    assert len(sim._compiled) == compiled and again.compile_seconds == 0.0
    np.testing.assert_array_equal(again.rounds, grid.rounds[::-1])
    for i, point in enumerate(points):
        alone = run_until(Simulation(FedGiA(loss=Logistic(), variant="G", **point), trial, executor="vmap"), rule,
                          seed=5)
        assert alone.rounds == grid.rounds[i] and alone.iters == point["k0"] * alone.rounds
        np.testing.assert_allclose(grid.history["error"][i], alone.history["error"], rtol=1e-10, atol=0)


def test_executors_agree():
    inst = instance("log", n=6, rows=[3, 12, 2, 9, 14, 4, 7])
    data = pack_trials([inst], blocks=2, row_multiple=1)   # Woodbury in one block, Cholesky in the other
    assert min(blk.rows for blk in data.blocks) < 6 <= max(blk.rows for blk in data.blocks)
    method = FedGiA(loss=Logistic(), variant="G", k0=3)       # 3 aggregations, capped at k = 6
    ref = solve(method, data, executor=LoopExecutor(), max_iters=6)
    assert ref.rounds[0] == 2 and not ref.converged[0]
    for ex in (VmapExecutor(), ChunkedExecutor(chunk_size=2)):
        got = solve(method, data, executor=ex, max_iters=6)
        np.testing.assert_array_equal(got.rounds, ref.rounds)
        np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got.hist_e, ref.hist_e, rtol=1e-10, atol=1e-16)


def test_registered_and_runs_as_a_plain_engine_run():
    """FedGiA and its baselines are ordinary registered algorithms (out of the default classification comparison):
    the auto executor and work_per_round accept their data (no model), and Simulation.run evaluates f and Error at
    the aggregate, i.e. at the point the next round's metrics describe."""
    from fljax.algorithms import ALGORITHMS, make_algorithm

    for name in ("fedgia", "fedavg_gd", "fedprox_gd", "fedpd"):
        assert not ALGORITHMS[name].generic and ALGORITHMS[name].problem == "consensus regression"
    data = pack_trials([instance("ls", m=6)], gram=True)
    sim = Simulation(make_algorithm("fedgia", loss=LeastSquares(), variant="G", k0=2, t=1.0),
                     jax.device_put(data.trials()[0]))                         # executor "auto", no model
    assert sim.model is None and sim.work_per_round() == (0, 0)
    res = sim.run(6, eval_every=2, progress=False)
    errors = [r["error"] for r in res.history]
    assert [r["round"] for r in res.history] == [0, 2, 4, 6] and errors[0] > errors[1] > errors[2] > errors[3]
    _, metrics = sim.round(res.state)
    assert float(metrics["error"]) == pytest.approx(errors[-1], rel=1e-12)


def test_conventions_and_errors():
    data = pack_trials([instance("ls", m=5)])
    code = solve(FedGiA(loss=LeastSquares(), k0=2), data)
    paper = solve(FedGiA(loss=LeastSquares(), k0=2), data, conventions=PAPER)
    assert code.cr[0] == code.rounds[0] and paper.cr[0] == 2 * paper.rounds[0]
    # Error(paper) = m²·Error(code) at the same point
    assert paper.hist_e[0, 0] == pytest.approx(25 * code.hist_e[0, 0], rel=1e-13)
    tol = min(1e-7, 0.1 * code.hist_e[0, 0])
    assert code.err[0] <= tol and (code.hist_e[0, :code.rounds[0]] > tol).all()
    for bad in [dict(variant="X"), dict(alpha=1.5), dict(k0=0), dict(gram_solver="qr"), dict(lipschitz="svd"),
                dict(t=-1.0), dict(r0=0.0)]:
        with pytest.raises(OptionError) as e:
            simulation(FedGiA(loss=LeastSquares(), **bad), data)
        assert e.value.key == next(iter(bad)) and "\n" not in str(e.value)
    for bad in [dict(max_rounds=0), dict(max_iters=2.5)]:
        with pytest.raises(OptionError) as e:
            run_until(simulation(FedGiA(), data), Stopping(Tolerance(1e-7), **{"max_rounds": 10, **bad}))
        assert e.value.key == next(iter(bad))
    with pytest.raises(OptionError, match="tol0"):
        run_until(simulation(FedGiA(), data), Stopping(Tolerance(0.0)))


# ------------------------------------------------------------------------------------------------ theory regime


@pytest.mark.parametrize("kind,variant", [("ls", "G"), ("log", "D"), ("ncv", "G")])
def test_lagrangian_decreases_in_the_theory_regime(kind, variant):
    """Lemma IV.1 and B.2 with σ = 6r/m and H_i = Θ_i majorising f_i (V.2's H_i shifted by μ/d_i): 𝓛(x^τ, X, Π)
    after every iteration is non-increasing and ≥ f(x^τ); the gradient at the aggregate vanishes (Theorem IV.1:
    here at least 100-fold in 600 iterations)."""
    inst = instance(kind, m=6, n=4, sizes=(3, 10), scale=2.0)
    f, g = loss_np(kind, MU[kind])
    values, fx = [], []

    def record(k, x, X, Pi, sigma):
        lag = sum(f(X[i], a, b) / 6 + (X[i] - x) @ Pi[i] + 0.5 * sigma * np.sum((X[i] - x) ** 2)
                  for i, (a, b) in enumerate(inst))
        values.append(lag)
        fx.append(np.mean([f(x, a, b) for a, b in inst]))

    xs, _ = fedgia_literal(kind, inst, variant, 3, 0.5, lambda s: round_key(1, s), 600, 6.0, MU[kind],
                           shift_v2=True, record=record)
    values, fx = np.array(values), np.array(fx)
    assert (np.diff(values) <= 1e-13 * np.abs(values[:-1])).all()
    assert (values >= fx - 1e-13).all()
    grad = np.mean([g(xs[-1], a, b) for a, b in inst], axis=0)
    assert np.linalg.norm(grad) < 1e-2 * np.linalg.norm(np.mean([g(xs[0], a, b) for a, b in inst], axis=0))


@pytest.mark.parametrize("kind,variant", [("ls", "G"), ("log", "D"), ("ncv", "G")])
def test_lagrangian_of_fljax_iterates_decreases_in_the_theory_regime(kind, variant):
    """Lemma IV.1 on fljax's own iterates (the test above checks it on the NumPy reference): FedGiA through the
    engine, k0 = 1 so every round is one iteration, σ = 6r/m and H_i majorising f_i (logistic: the μ/d_i shift,
    ``h_shift_rule='code'``). After every round 𝓛(x^τ, X, Π) = Σ_i [f_i(x_i)/m + ⟨x_i − x, π_i⟩ + (σ/2)‖x_i − x‖²],
    computed in NumPy from the unpadded client rows, is non-increasing and ≥ f(x^τ), and ∇f at the aggregate falls
    at least 100-fold in 600 rounds (Theorem IV.1)."""
    losses = {"ls": LeastSquares(), "log": Logistic(h_shift_rule="code"), "ncv": NonconvexLogistic()}
    inst = instance(kind, m=6, n=4, sizes=(3, 10), scale=2.0)
    data = pack_trials([inst])
    clients = ordered(inst, data)
    f, g = loss_np(kind, MU[kind])
    alg = FedGiA(loss=losses[kind], variant=variant, k0=1, alpha=0.5, t=6.0)
    sim = simulation(alg, data)
    state = sim.init(1)
    sigma = float(state.server.sigma)
    r = max(lipschitz(kind, a, MU[kind]) for a, _ in clients)
    assert sigma == pytest.approx(6.0 * r / 6, rel=1e-12)
    values, fx, grads = [], [], []
    for _ in range(600):
        x = np.asarray(alg.aggregate(sim.data, state.server))
        state, _ = sim.round(state)               # one compiled round
        (own,) = state.clients                    # one size class
        X, Pi = np.asarray(own.x), np.asarray(own.pi)
        values.append(sum(f(X[i], a, b) / 6 + (X[i] - x) @ Pi[i] + 0.5 * sigma * np.sum((X[i] - x) ** 2)
                          for i, (a, b) in enumerate(clients)))
        fx.append(np.mean([f(x, a, b) for a, b in clients]))
        grads.append(np.linalg.norm(np.mean([g(x, a, b) for a, b in clients], axis=0)))
    values, fx = np.array(values), np.array(fx)
    assert (np.diff(values) <= 1e-12 * np.abs(values[:-1])).all(), np.diff(values).max()
    assert (values >= fx - 1e-12).all()
    assert grads[-1] < 1e-2 * grads[0]
