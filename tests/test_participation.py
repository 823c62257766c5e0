"""Participation with systems (fljax.participation): FedScale's trace formats read back from files the generator
wrote and refused when damaged; the devices' clock and availability against their definitions and a brute-force scan
of time; a round's draw (availability, deadline with both policies, H1 failures, over-selection, the round's
duration) against a plain loop over the selected clients; FedProx's straggler protocol; and through the engine: the
clocked path reproduces the default run, the virtual time is the rounds' slowest reports summed, a round that finds
nobody is skipped and waits."""
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.data.batching import BatchPlan
from fljax.engine import Simulation
from fljax.engine.context import RoundContext
from fljax.engine.executors import make_executor
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.participation import Poisson, Uniform, Work
from fljax.participation.traces import (generate, read_behave_trace, read_capacity, synthetic_behave_trace,
                                        write_trace)

N = 30


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return generate(str(tmp_path_factory.mktemp("traces")), N, seed=4)


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 23, n)
    xs = [rng.normal(size=(s, 4)).astype(np.float32) for s in sizes]
    ys = [rng.integers(0, 3, s).astype(np.int32) for s in sizes]
    arrays = D.pad_clients(xs, ys)
    return D.FederatedData(train=arrays, test=arrays, num_classes=3, input_shape=(4,), name="toy")


# ------------------------------------------------------------------------------------------------------ traces


def test_the_reader_reads_what_the_generator_wrote(traces):
    behave, capacity = traces
    with open(behave, "rb") as f:
        raw = pickle.load(f)
    trace = read_behave_trace(behave)
    for i, key in enumerate(sorted(raw)):
        on, off = raw[key]["active"], raw[key]["inactive"]
        np.testing.assert_array_equal(trace.active[i, :len(on)], on)
        np.testing.assert_array_equal(trace.inactive[i, :len(off)], off)
        assert np.all(np.isinf(trace.active[i, len(on):])) and trace.finish[i] == raw[key]["finish_time"]
    with open(capacity, "rb") as f:
        raw = pickle.load(f)
    speeds = read_capacity(capacity)
    np.testing.assert_array_equal(speeds.ms_per_sample, [raw[k]["computation"] for k in sorted(raw)])
    np.testing.assert_array_equal(speeds.kbps, [raw[k]["communication"] for k in sorted(raw)])


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize("content,key,message", [
    ({1: {"computation": 5.0, "communication": 100.0}, 2: {"computation": -1.0, "communication": 100.0}},
     "capacity_trace", "client 2 in '{path}' has computation -1 ms per sample"),
    ({1: {"computation": 5.0, "communication": 0.0}}, "capacity_trace", "has communication 0 kbit/s"),
    ({1: {"active": [0, 10], "inactive": [5], "finish_time": 20}}, "behave_trace",
     "'active' and 'inactive' must be lists of equal length"),
    ({1: {"active": [10, 0], "inactive": [20, 5], "finish_time": 30}}, "behave_trace",
     "its intervals must satisfy 0 <= active[0] <= inactive[0]"),
    ({1: {"active": [], "inactive": [], "finish_time": 30}}, "behave_trace", "no client is ever available"),
    ([1, 2], "behave_trace", "must hold a non-empty dictionary of clients"),
    (_Evil(), "capacity_trace", "references posix.system, which a trace does not hold"),
])
def test_damaged_traces_are_refused_in_one_line(tmp_path, content, key, message):
    path = str(tmp_path / "trace")
    with open(path, "wb") as f:
        pickle.dump(content, f)
    read = read_capacity if key == "capacity_trace" else read_behave_trace
    with pytest.raises(OptionError, match=None) as e:
        read(path)
    assert e.value.key == key and message.format(path=path) in str(e.value) and "\n" not in str(e.value)


def test_a_trace_must_cover_the_population(traces):
    behave, capacity = traces
    with pytest.raises(OptionError, match=f"holds {N} clients, fewer than the 40 training clients"):
        Uniform(speed="trace", capacity_trace=capacity).validate(40, 10)
    with pytest.raises(OptionError, match=f"holds {N} clients, fewer than the 31 training clients"):
        Uniform(speed="synthetic", availability="trace", behave_trace=behave).validate(31, 10)


# ------------------------------------------------------------------------------------------------------ devices


def test_round_times_are_the_formula(traces):
    devices = Uniform(speed="trace", capacity_trace=traces[1], compute_factor=3.0).devices(N)
    raw = read_capacity(traces[1])
    ids = np.array([0, 7, 29, 13])
    steps, samples, nbytes = np.array([4, 1, 9, 0]), np.array([5.0, 2.5, 10.0, 7.0]), 12_345.0
    got = devices.seconds(jnp.asarray(ids), jnp.asarray(steps), jnp.asarray(samples), nbytes)
    want = steps * samples * 3 * raw.ms_per_sample[ids] / 1000 + 8 * nbytes / (1000 * raw.kbps[ids])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _scan(available_at, t, horizon, dt):
    """Brute force: (available now, until when, first moment someone is) by stepping through time."""
    grid = t + np.arange(0, horizon, dt)
    states = np.array([available_at(s) for s in grid])  # [steps, n]
    now = states[0]
    until = np.array([grid[np.argmin(states[:, i])] if now[i] and not states[:, i].all() else np.inf
                      for i in range(states.shape[1])])
    first = grid[np.argmax(states.any(axis=1))]
    return now, until, first


@pytest.mark.parametrize("kind", ["diurnal", "trace"])
def test_availability_is_its_definition(kind, traces):
    if kind == "diurnal":
        p = Uniform(speed="synthetic", availability="diurnal", period=100.0, on_fraction=0.3, seed=2)
        dev = p.devices(N)
        phase = dev.phase.astype(np.float64)

        def available_at(s):  # frac(s/P + φ_i) < f
            return np.mod(s / 100.0 + phase, 1.0) < 0.3
    else:
        p = Uniform(speed="synthetic", availability="trace", behave_trace=traces[0])
        dev = p.devices(N)
        raw = read_behave_trace(traces[0])

        def available_at(s):  # active_k <= s mod finish <= inactive_k for some k (FedScale's is_active)
            tau = np.mod(s, raw.finish)[:, None]
            return np.any((raw.active <= tau) & (tau <= raw.inactive), axis=1)
    dt = 0.05 if kind == "diurnal" else 20.0
    for t in ([0.0, 13.3, 71.9, 250.0] if kind == "diurnal" else [0.0, 3600.0, 40000.0, 100000.0]):
        now, until, first = _scan(available_at, t, 200.0 if kind == "diurnal" else 90000.0, dt)
        np.testing.assert_array_equal(np.asarray(dev.available(t)), now)
        got_until = np.asarray(dev.until(t))
        np.testing.assert_allclose(np.where(now, got_until, np.inf), until, atol=dt + 1e-3 * t)
        assert float(dev.next_start(t)) == pytest.approx(first, abs=dt + 1e-3 * t)


# ------------------------------------------------------------------------------------------------------ a round


def _ctx(p, data, r):
    return RoundContext(make_executor("vmap"), data, jnp.int32(r), jax.random.PRNGKey(100 + r), participation=p)


PLAN = BatchPlan(batch_size=5, epochs=3)


def _reference(p, data, cohort, m, now, nbytes):
    """A round's draw written as a loop over the selected clients (no jitter, dropouts or stragglers)."""
    dev = p.devices(N)
    counts = np.asarray(data.train.count)
    reports, steps_out, times, events = [], [], [], []
    until = np.asarray(dev.until(now)) - now
    for c in np.asarray(cohort.ids):
        if c >= N:
            reports.append(False), steps_out.append(0), times.append(np.inf), events.append(0.0)
            continue
        epoch = -(-counts[c] // 5)
        full, samples = 3 * epoch, counts[c] / epoch
        step = samples * float(dev.ms_per_sample[c]) / 1000
        comm = 8 * nbytes / (1000 * float(dev.kbps[c]))
        steps, late = full, False
        if p.deadline is not None:
            if p.policy == "partial":
                steps = min(full, int(np.floor((p.deadline - comm) / step)))
                late = comm > p.deadline or steps < 1
            else:
                late = full * step + comm > p.deadline
        time = steps * step + comm
        failed = not late and time > until[c]
        reports.append(not late and not failed), steps_out.append(steps), times.append(time)
        events.append(until[c] if failed else p.deadline if late else time)
    reports, times = np.array(reports), np.array(times)
    if p.over_selection:
        order = sorted(np.flatnonzero(reports), key=lambda j: (times[j], np.asarray(cohort.ids)[j]))
        reports = np.isin(np.arange(len(reports)), order[:m])
    selected = np.asarray(cohort.ids) < N
    if not selected.any():
        duration = float(dev.next_start(now)) - now
    elif p.over_selection and reports.sum() >= m:
        duration = times[reports].max()
    else:
        duration = max(np.array(events)[selected])
    return reports, np.array(steps_out), times, duration


@pytest.mark.parametrize("options", [
    dict(deadline=0.15, policy="drop"),
    dict(deadline=0.15, policy="partial"),
    dict(deadline=0.3, over_selection=0.5),
    dict(),
], ids=["deadline-drop", "deadline-partial", "over-selection", "no-deadline"])
def test_a_round_is_the_loop_over_its_clients(options, traces, tmp_path):
    """Rounds of 0.05–0.35 s on devices whose availability flips every second or so: late clients, clients whose
    availability ends mid-round (H1), over-selected ones."""
    data = _data()
    behave = write_trace(str(tmp_path / "behave"), synthetic_behave_trace(N, 5, finish_time=50.0, mean_on=1.5,
                                                                          mean_off=1.0))
    p = Uniform(speed="trace", capacity_trace=traces[1], availability="trace", behave_trace=behave, **options)
    nbytes, m = 2_000.0, 8
    seen_late = 0
    for r, now in enumerate([0.3, 7.7, 12.9, 23.5, 41.2, 44.6]):
        ctx = _ctx(p, data, r)
        cohort = p.draw(ctx, m, Work.of(PLAN, data.train, nbytes, now))
        ids = np.asarray(cohort.ids)
        available = np.asarray(p.devices(N).available(now))
        chosen = ids[ids < N]
        assert available[chosen].all() and len(chosen) == min(p.selected(N, m), available.sum())
        reports, steps, times, duration = _reference(p, data, cohort, m, now, nbytes)
        np.testing.assert_array_equal(np.asarray(cohort.valid), reports, err_msg=f"round at {now}")
        np.testing.assert_array_equal(np.asarray(cohort.steps)[reports], steps[reports])
        np.testing.assert_allclose(np.asarray(cohort.time)[reports], times[reports], rtol=1e-5)
        assert float(cohort.duration) == pytest.approx(duration, rel=1e-5)
        assert float(cohort.metrics["clients_reported"]) == reports.sum()
        assert float(cohort.metrics["round_time"]) == pytest.approx(duration, rel=1e-5)
        seen_late += int(np.sum((ids < N) & ~reports))
    assert seen_late > 0, "the settings should drop some client"


def test_poisson_cohorts_keep_only_available_clients():
    """Poisson draws every client with probability m/N and keeps the available ones: sorted ids, empties last."""
    data = _data()
    p = Poisson(speed="synthetic", availability="diurnal", period=100.0, on_fraction=0.4, seed=1)
    for r, now in enumerate([0.0, 31.0, 77.0]):
        cohort = p.draw(_ctx(p, data, r), 15, Work.of(PLAN, data.train, 100.0, now))
        ids, selected = np.asarray(cohort.ids), np.asarray(cohort.ids) < N
        available = np.asarray(p.devices(N).available(now))
        assert selected.any() and available[ids[selected]].all() and np.all(np.diff(ids) >= 0)
        assert not selected[selected.sum():].any()  # empty slots after the clients


def test_stragglers_are_fedprox_s_protocol():
    """FedProx Section 5: of the m selected, round(m(1 − s)) do all E epochs and the rest x ~ U{1..E} epochs; the same
    stragglers for 'drop' (FedAvg: those short of E are dropped) and 'partial' (FedProx: kept with x epochs)."""
    data = _data()
    counts = np.asarray(data.train.count)
    drew_all = 0
    for r in range(6):
        drawn = {}
        for policy in ("drop", "partial"):
            p = Uniform(stragglers=0.5, policy=policy)
            drawn[policy] = p.draw(_ctx(p, data, r), 10, Work.of(PLAN, data.train, 0.0))
        ids = np.asarray(drawn["partial"].ids)
        np.testing.assert_array_equal(ids, np.asarray(drawn["drop"].ids))
        epoch = -(-counts[ids] // 5)
        steps = np.asarray(drawn["partial"].steps)
        np.testing.assert_array_equal(steps, np.asarray(drawn["drop"].steps))
        assert np.all(steps % epoch == 0) and np.all((steps >= epoch) & (steps <= 3 * epoch))
        short = steps < 3 * epoch
        assert short.sum() <= 5 <= short.sum() + np.sum(steps == 3 * epoch)  # 5 stragglers, some drew x = E
        assert np.asarray(drawn["partial"].valid).all()
        np.testing.assert_array_equal(np.asarray(drawn["drop"].valid), ~short)
        drew_all += int(np.sum(steps == 3 * epoch)) - 5
    assert drew_all > 0, "x ~ U{1, …, E}: some straggler draws all E epochs"


def test_dropout_and_jitter_draw_as_declared():
    data = _data(400, seed=1)
    p = Uniform(speed="synthetic", compute_sigma=0.0, bandwidth_sigma=0.0, jitter=0.3, dropout=0.2)
    plain = Uniform(speed="synthetic", compute_sigma=0.0, bandwidth_sigma=0.0)
    work = Work.of(BatchPlan(batch_size=5, steps=4), data.train, 1000.0)
    ctx = RoundContext(make_executor("vmap"), data, jnp.int32(0), jax.random.PRNGKey(0), participation=p)
    cohort = p.draw(ctx, None, work)
    base = plain.draw(RoundContext(make_executor("vmap"), data, jnp.int32(0), jax.random.PRNGKey(0),
                                   participation=plain), None, work)
    failed = ~np.asarray(cohort.valid)
    assert abs(failed.mean() - 0.2) < 4 * np.sqrt(0.2 * 0.8 / 400)
    ratio = np.log(np.asarray(cohort.time)[~failed] / np.asarray(base.time)[~failed])
    assert abs(ratio.mean()) < 4 * 0.3 / np.sqrt(ratio.size) and abs(ratio.std() - 0.3) < 0.05


# ------------------------------------------------------------------------------------------------------ engine


def _sim(participation, cohort_size=None, rounds_data=None):
    data = rounds_data or _data()
    alg = make_algorithm("fedavg", lr=0.1, batch_size=5, local_epochs=2, cohort_size=cohort_size)
    return Simulation(alg, data, make_model("logreg", (4,), 3), executor="vmap", participation=participation)


def test_the_clocked_path_is_the_default_run_and_its_time_is_the_slowest_report(traces):
    """Device speeds with no deadline or drops change nothing but add the clock: the same models as the default
    run; each round lasts its slowest client (full participation: every client), summed into virtual_time."""
    plain = _sim(None)
    clocked = _sim(Uniform(speed="trace", capacity_trace=traces[1]))
    a = plain.run(4, eval_every=2, progress=False)
    b = clocked.run(4, eval_every=2, progress=False)
    for x, y in zip(jax.tree.leaves(a.state.server["params"]), jax.tree.leaves(b.state.server.state["params"])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert "virtual_time" not in a.history[-1]
    raw, counts = read_capacity(traces[1]), np.asarray(plain.data.train.count)
    epoch = -(-counts // 5)
    nbytes = 2 * (4 * 3 + 3) * 4  # the logreg model down and up
    slowest = max(2 * epoch * (counts / epoch) * raw.ms_per_sample[:N] / 1000 + 8 * nbytes / (1000 * raw.kbps[:N]))
    assert [r["virtual_time"] for r in b.history] == pytest.approx([0.0, 2 * slowest, 4 * slowest], rel=1e-5)
    assert b.history[-1]["skipped_rounds"] == 0 and b.history[-1]["clients_reported"] == N


def test_rounds_in_which_nobody_reports_are_skipped_and_the_clock_moves_on(tmp_path):
    """H1 and H4. Every client is available in [0, 200] of each 1000 s and a round's work takes 150 s: round 1 reports
    at 150 s; round 2's clients fail when their availability ends at 200 s (nobody reports: the model, server
    momentum included, stays); round 3 starts at 200 s exactly, whose clients fail at once (the clock moves one
    float32 step); round 4 finds nobody and waits until 1000 s; round 5 runs."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(10, 4)).astype(np.float32) for _ in range(N)]
    arrays = D.pad_clients(xs, [rng.integers(0, 3, 10).astype(np.int32) for _ in range(N)])
    data = D.FederatedData(train=arrays, test=arrays, num_classes=3, input_shape=(4,), name="equal")
    trace = {i + 1: {"active": [0], "inactive": [200], "finish_time": 1000} for i in range(N)}
    path = write_trace(str(tmp_path / "behave"), trace)
    p = Uniform(speed="synthetic", availability="trace", behave_trace=path, ms_per_sample=15_000.0,
                compute_sigma=0.0, kbps=1e9, bandwidth_sigma=0.0)
    alg = make_algorithm("fedavg", lr=0.1, batch_size=5, local_steps=2, cohort_size=5, server_momentum=0.9)
    sim = Simulation(alg, data, make_model("logreg", (4,), 3), executor="vmap", participation=p)
    state = sim.init()
    skipped, times = [], []
    for r in range(5):
        before = jax.device_get(state.server.state["params"])
        state, metrics = sim.round(state)
        skipped.append(int(metrics["round_skipped"]))
        times.append(float(state.server.now))
        if skipped[-1]:
            for x, y in zip(jax.tree.leaves(state.server.state["params"]), jax.tree.leaves(before)):
                np.testing.assert_array_equal(x, y)
    assert skipped == [0, 1, 1, 1, 0]
    assert times[:2] == pytest.approx([150.0, 200.0], abs=1e-3) and 200.0 < times[2] < 200.01
    assert times[3:] == pytest.approx([1000.0, 1150.0], abs=1e-2)


def test_a_deadline_nobody_meets_is_refused_when_the_simulation_is_built():
    """The fastest client's round — its computation and the logreg model's 60 bytes down and 60 up — against the
    deadline: at 0.5 kbit/s the bytes alone take 1.92 s > 1 s; at 2 kbit/s, 0.48 s."""
    alg = make_algorithm("fedavg", lr=0.1, batch_size=5, local_steps=2, cohort_size=4)
    for kbps, refused in ((0.5, True), (2.0, False)):
        p = Uniform(speed="synthetic", ms_per_sample=0.01, compute_sigma=0.0, kbps=kbps, bandwidth_sigma=0.0,
                    deadline=1.0, policy="partial")
        build = lambda: Simulation(alg, _data(), make_model("logreg", (4,), 3), executor="vmap",  # noqa: E731
                                   participation=p)
        if refused:
            with pytest.raises(OptionError, match="participation.deadline 1 s is shorter than every client's round: "
                                                  "the fastest .* needs 1.92 s .* to send 120 bytes"):
                build()
        else:
            build()


def test_privacy_refuses_a_participation_without_amplification():
    assert Uniform().sampling(50, 10) is not None and Poisson().sampling(50, 10) is not None
    assert Uniform(stragglers=0.5, policy="partial").sampling(50, 10) is not None  # nobody dropped
    for p in (Uniform(speed="synthetic", availability="diurnal"), Uniform(speed="synthetic", deadline=5.0),
              Uniform(stragglers=0.5), Poisson(dropout=0.1)):
        assert p.sampling(50, 10) is None


@pytest.mark.parametrize("options,key,message", [
    (dict(deadline=5.0), "deadline", "needs device speeds, the virtual clock"),
    (dict(speed="synthetic", period=10.0), "period", "applies to availability: diurnal, not availability: always"),
    (dict(speed="trace"), "capacity_trace", "must name a FedScale trace file with speed: trace"),
    (dict(policy="partial"), "policy", "'partial' applies to clients past a deadline or stragglers"),
    (dict(speed="synthetic", ms_per_sample=0.0), "ms_per_sample", "must be > 0, got 0.0"),
])
def test_impossible_options_are_refused(options, key, message):
    with pytest.raises(OptionError, match=message) as e:
        Uniform(**options)
    assert e.value.key == key
