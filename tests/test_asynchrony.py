"""FedBuff and FedAsync (fljax.algorithms.asynchronous) against a plain event loop, as FLSim and FedScale simulate
asynchrony: a heap of arrival times, one client at a time, each client trained when it is dispatched from the model
current then, the server stepping every K arrivals. Both dispatch rules, devices of three speeds (so that arrivals
tie: ties go to the lower client id), the same events in the same order, the same arrival times and the same models.
The staleness functions against their definitions; the options' refusals."""
import heapq

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.engine import Simulation
from fljax.engine.context import DISPATCH
from fljax.engine.protocol import ClientInput
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.ops.heterogeneity import local_steps_norm, staleness_weight
from fljax.participation import Uniform
from fljax.participation.traces import write_trace

N, DIM, CLASSES, PER_CLIENT = 12, 5, 3, 10
# ms per sample of the three device classes: durations 1.23, 2.9 and 4.1 s for 10 samples (2 steps of 5), in no
# simple ratio, so arrivals tie only between devices of one class dispatched together
CLASS_MS = (123.0, 290.0, 410.0)


def _data():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(PER_CLIENT, DIM)).astype(np.float32) for _ in range(N)]
    ys = [rng.integers(0, CLASSES, PER_CLIENT).astype(np.int32) for _ in range(N)]
    arrays = D.pad_clients(xs, ys)
    return D.FederatedData(train=arrays, test=arrays, num_classes=CLASSES, input_shape=(DIM,), name="toy")


@pytest.fixture(scope="module")
def capacity(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "client_device_capacity"
    return write_trace(str(path), {i + 1: {"computation": CLASS_MS[i % 3], "communication": 1e4} for i in range(N)})


def _sim(name, capacity, **hp):
    algorithm = make_algorithm(name, lr=0.2, batch_size=5, local_steps=2, **hp)
    participation = Uniform(speed="trace", capacity_trace=capacity)
    return Simulation(algorithm, _data(), make_model("logreg", (DIM,), CLASSES), executor="vmap", seed=3,
                      participation=participation)


class EventLoop:
    """The reference: FLSim's and FedScale's simulation of asynchrony, one event at a time (module docstring): a heap
    of (arrival time, client id, …), each client trained when it is dispatched from the model current then, the server
    stepping every K arrivals. :meth:`step` runs one server step and returns the (client, arrival time, start
    version) of its K arrivals in order; ``w`` is the model after it. (``benchmarks/asynchrony.py`` times it.)"""

    def __init__(self, sim):
        alg, data = sim.algorithm, sim.data
        self.alg, self.k, self.rule = alg, alg.buffer(), alg.dispatch
        self.n = data.num_clients
        self.devices = sim.participation.devices(self.n)
        self.w = jax.device_get(sim.init().server["params"])  # the initial model (what init trains from)
        self.nbytes = 2 * sum(np.asarray(x).nbytes for x in jax.tree.leaves(self.w))
        self.base = jax.random.fold_in(jax.random.PRNGKey(sim.seed), DISPATCH)
        self.plan, self.count = alg.plan(), np.asarray(data.train.count)
        self.heap, self.busy, self.dispatched, self.version = [], set(), 0, 0

        @jax.jit
        def train(c, key, w, version):
            inp = ClientInput(state={}, train=jax.tree.map(lambda a: a[c], data.train), key=key, round=version,
                              down=w, model=sim.model, unroll=sim.unroll, id=c)
            return alg.client_update(inp).upload

        self.train = train
        self.dispatch(np.float32(0), 0, alg.concurrency)

    def seconds(self, c):
        """Client c's time, float32 seconds as fljax's clock: K local steps of min(B, n_c) samples at its
        ms/1000 seconds per sample, then the model down and the update up at its 1000·kbps/8 bytes per second."""
        f32 = np.float32
        per_sample = f32(np.float64(self.devices.ms_per_sample[c]) / 1000)
        step = f32(min(self.plan.batch_size, int(self.count[c]))) * per_sample
        return f32(self.plan.steps) * step + f32(self.nbytes) / f32(np.float64(self.devices.kbps[c]) * 125)

    def dispatch(self, now, version, count=1):
        """``count`` clients at once: the idle ones of smallest key in the first dispatch's draw, in that order."""
        u = np.array(jax.random.uniform(jax.random.fold_in(jax.random.fold_in(self.base, self.dispatched), 0),
                                        (self.n,)))
        u[list(self.busy)] = 2.0
        for c in np.argsort(u, kind="stable")[:count]:
            c, key = int(c), jax.random.fold_in(self.base, self.dispatched)
            self.busy.add(c)
            update = jax.device_get(self.train(c, jax.random.fold_in(key, 2), self.w, jnp.int32(version)))
            heapq.heappush(self.heap, (now + self.seconds(c), c, self.dispatched, version, update))  # ties: lower id
            self.dispatched += 1

    def step(self):
        alg, k, t = self.alg, self.k, self.version
        buffer = []
        while len(buffer) < k:
            now, c, _, version, update = heapq.heappop(self.heap)
            self.busy.discard(c)
            buffer.append((c, now, version, update))
            if self.rule == "arrival" and len(buffer) < k:
                self.dispatch(now, t)
        if alg.name == "fedbuff":  # w ← w + η_g/K Σ (1 + τ_i)^(−a) Δ_i
            self.w = jax.tree.map(lambda x, *u: x + alg.server_lr / k * sum(
                (1 + t - v) ** -alg.staleness_a * ui for (_, _, v, _), ui in zip(buffer, u)), self.w,
                *[b[3] for b in buffer])
        else:  # FedAsync: w ← (1 − α_t) w + α_t w_i, α_t = α (1 + τ)^(−a)
            alpha = alg.alpha * (1 + t - buffer[0][2]) ** -alg.staleness_a
            self.w = jax.tree.map(lambda x, u: (1 - alpha) * x + alpha * u, self.w, buffer[0][3])
        self.version += 1
        self.dispatch(now, t + 1, 1 if self.rule == "arrival" else k)
        return [(c, a, v) for c, a, v, _ in buffer]


def event_loop(sim, rounds):
    """Every server step's arrivals and the model after it, by the reference (:class:`EventLoop`)."""
    loop = EventLoop(sim)
    return [(loop.step(), loop.w) for _ in range(rounds)]


CASES = [("fedbuff", dict(concurrency=6, buffer_size=3, dispatch="step")),
         ("fedbuff", dict(concurrency=6, buffer_size=3, dispatch="arrival")),
         ("fedasync", dict(concurrency=4, dispatch="step", alpha=0.5)),
         ("fedasync", dict(concurrency=4, dispatch="arrival", alpha=0.5, rho=0.1))]


@pytest.mark.parametrize("name,hp", CASES, ids=[f"{n}-{h['dispatch']}" for n, h in CASES])
def test_vectorised_asynchrony_is_the_event_loop(name, hp, capacity):
    sim = _sim(name, capacity, **hp)
    rounds = 8
    reference = event_loop(sim, rounds)
    state = sim.init()
    ties = 0
    for t in range(rounds):
        state, metrics = sim.round(state)
        last = jax.device_get(state.server["last"])
        events, w = reference[t]
        assert [int(c) for c in last["ids"]] == [c for c, _, _ in events], f"step {t}: the arrivals"
        assert [int(v) for v in last["version"]] == [v for _, _, v in events], f"step {t}: their versions"
        np.testing.assert_allclose(last["arrival"], [a for _, a, _ in events], rtol=1e-6, err_msg=f"step {t}")
        ties += len(events) - len(set(a for _, a, _ in events))
        assert int(state.server["version"]) == t + 1
        np.testing.assert_allclose(float(metrics["staleness"]), np.mean([t - v for _, _, v in events]), rtol=1e-6)
        for got, want in zip(jax.tree.leaves(state.server["params"]), jax.tree.leaves(w)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"step {t}: the model")
    if name == "fedbuff":
        assert ties > 0, "the devices of one class should have arrived together at least once"


def test_concurrency_equal_to_the_buffer(capacity):
    """C = K under the step rule: initialisation trains nobody (every client starts in the first step)."""
    sim = _sim("fedbuff", capacity, concurrency=3, buffer_size=3)
    reference = event_loop(sim, 3)
    state = sim.init()
    for t in range(3):
        state, _ = sim.round(state)
        assert [int(c) for c in state.server["last"]["ids"]] == [c for c, _, _ in reference[t][0]]
    for got, want in zip(jax.tree.leaves(state.server["params"]), jax.tree.leaves(reference[-1][1])):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_staleness_weights_and_local_steps_norm_are_their_definitions():
    tau = np.arange(0, 12)
    np.testing.assert_allclose(staleness_weight(tau, "polynomial", 0.5), 1 / np.sqrt(1 + tau), rtol=1e-6)  # FedBuff
    np.testing.assert_allclose(staleness_weight(tau, "polynomial", 2.0), (tau + 1.0) ** -2, rtol=1e-6)
    np.testing.assert_allclose(staleness_weight(tau, "hinge", 10.0, 4.0),
                               [1.0 if s <= 4 else 1 / (10 * (s - 4) + 1) for s in tau], rtol=1e-6)
    np.testing.assert_array_equal(staleness_weight(tau, "constant"), np.ones(12))
    for rho in (0.0, 0.5, 0.9):  # ‖a‖₁ = Σ_k (1 − ρ^{τ−k+1})/(1 − ρ), the momentum buffer's weights written out
        for steps in (1, 2, 7, 20):
            want = sum((1 - rho ** (steps - k + 1)) / (1 - rho) for k in range(1, steps + 1))
            np.testing.assert_allclose(local_steps_norm(steps, rho), want, rtol=1e-5)


def test_refusals():
    with pytest.raises(OptionError, match="buffer_size must be at most the concurrency 4"):
        make_algorithm("fedbuff", concurrency=4, buffer_size=5)
    with pytest.raises(OptionError, match="concurrency must be at most the 12 training clients"):
        make_algorithm("fedbuff", concurrency=20).validate(12)
    with pytest.raises(OptionError, match="speed must be 'synthetic' or 'trace': fedbuff runs on a virtual clock"):
        Uniform().validate_asynchronous("fedbuff")
    with pytest.raises(OptionError, match="deadline is not supported by the asynchronous fedasync"):
        Uniform(speed="synthetic", deadline=3.0).validate_asynchronous("fedasync")
