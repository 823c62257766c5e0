"""The client-state store (issue 38, fljax.engine.store): a run whose clients live in host memory or on disk equals the
run with every client's state on the device, bit for bit — the server, every round's metrics, every evaluation and
every client's state — for every algorithm family with per-client state; unsampled clients are never touched; the
disk store's undo journal returns it to any checkpoint; what cannot run with a store is refused in one line."""
import errno
import os
import shutil
import signal
import time

import jax
import numpy as np
import pytest

from test_reliability import _assert_same_run
from test_runner import TINY, _metrics, _without_time

import fljax.data as D
from fljax.algorithms import make_algorithm
from fljax.cli import main
from fljax.engine import Lanes, Simulation
from fljax.engine.store import DiskStore, StoredClients, StoreWriteError, client_states
from fljax.errors import OptionError
from fljax.models import make_model
from fljax.runner.checkpoint import Checkpointer
from fljax.participation import Poisson

# 40 ragged Synthetic clients of 11–30 samples: small, and sizes that differ (padding, budgets, weights)
DATA = D.make_federated("synthetic", 40, seed=0, storage="ragged", max_samples=30, min_samples=11)
LOGREG = make_model("logreg", DATA.input_shape, DATA.num_classes)
MLP = make_model("mlp", DATA.input_shape, DATA.num_classes, hidden=[8])
FAST = dict(cohort_size=6, local_steps=2, batch_size=5)


def _run(sim, blocks=(3, 2), state=None):
    """(state, the last block's metrics, the evaluation) after blocks of rounds of these lengths."""
    state = sim.init() if state is None else state
    metrics = None
    for n in blocks:
        state, metrics = sim.run_rounds(state, n)
    return state, metrics, sim.evaluate(state)


def _assert_identical(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _compare(algo, model=LOGREG, stores=("disk",), executor="vmap", data=DATA, blocks=(3, 2), **kwargs):
    """Run ``algo`` with the state on the device and in each store; everything must agree bit for bit."""
    device = Simulation(algo, data, model, executor=executor, **kwargs)
    want_state, want_metrics, want_eval = _run(device, blocks)
    want = (jax.device_get(want_state.server), jax.device_get(want_metrics), jax.device_get(want_eval),
            client_states(device, want_state))
    for kind in stores:
        sim = Simulation(algo, data, model, executor=executor, state_store=kind, **kwargs)
        state, metrics, ev = _run(sim, blocks)
        assert isinstance(state.clients, StoredClients)
        got = (jax.device_get(state.server), jax.device_get(metrics), jax.device_get(ev), client_states(sim, state))
        _assert_identical(want, got)
    return want_state


# ------------------------------------------------------------------------------------------ bit for bit, per family

FAMILIES = {  # each family's hyperparameters (with FAST's cohort and local steps where it takes them)
    "ditto": dict(**FAST, lam=0.5),  # a personal model pulled towards the global one
    "fedrep": dict(cohort_size=6, batch_size=5, head_epochs=1, body_epochs=1),  # a personal head, a shared body
    "fedper": dict(**FAST),
    "pfedme": dict(**FAST, inner_steps=2),  # personal θ_i of the Moreau envelope
    "apfl": dict(**FAST, adaptive_alpha=True),  # a personal model and a learned mixing weight α_i
    "fedslr": dict(**FAST, memory_efficient=True),  # sparse personal part p_i and dual γ_i (Algorithm 3)
    "scaffold": dict(**FAST),  # control variates c_i
    "feddyn": dict(**FAST),  # dynamic-regulariser gradients g_i
    "fedrod": dict(**FAST),  # a personal head and the stored body
    "fml": dict(**FAST),  # a personal model distilled with the meme
    "local": dict(**FAST),  # every client's own model
    "quped": dict(**FAST, bits=2, cohort_mode="gather"),  # quantized personal models with their centers
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_with_per_client_state_runs_bit_identically_on_disk(name):
    model = MLP if name in ("fedrep", "fedper", "fedrod", "quped") else LOGREG  # a body and a head
    _compare(make_algorithm(name, **FAMILIES[name]), model, blocks=(2, 1))


def test_ditto_in_host_memory_and_on_disk_equals_the_device():
    """Blocks of equal length: each block's rows are read ahead while the previous one runs, those it shares with
    the previous block taken from that block's output."""
    _compare(make_algorithm("ditto", **FAST, lam=0.5), stores=("host", "disk"), blocks=(2, 2, 2))


def _experiment(**keys):
    """The resolved experiment of a config (tiny Synthetic, Ditto) with ``keys`` set."""
    from fljax.config import ExperimentConfig, from_dict
    from fljax.experiment import resolve

    base = {"algorithm": "ditto", "algo": FAST, "data": {"dataset": "synthetic", "num_clients": 40,
                                                         "storage": "ragged", "max_samples": 30, "min_samples": 11},
            "model": {"name": "logreg"}, "executor": "vmap"}
    return resolve(from_dict(ExperimentConfig, {**base, **keys}))


def test_error_feedback_residuals_beside_the_clients_are_stored_too():
    """Compressed uploads with error feedback: every client's residual e_i lives beside its state
    (fljax.aggregation.WithAggregator) and is gathered and scattered through the block's rows."""
    from fljax.experiment import build, load_data, privacy_of

    compression = {"kind": "top_k", "fraction": 0.2, "error_feedback": True}
    runs = {}
    for kind in ("device", "host", "disk"):
        exp = _experiment(compression=compression, state_store=kind)
        data = load_data(exp)
        sim = build(exp, data, privacy=privacy_of(exp, data))
        state, metrics, ev = _run(sim)
        runs[kind] = (jax.device_get(state.server), jax.device_get(metrics), jax.device_get(ev),
                      client_states(sim, state))
    for kind in ("host", "disk"):
        _assert_identical(runs["device"], runs[kind])
    residuals = runs["disk"][3].aggregator
    assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(residuals))  # the feedback is live


def test_poisson_cohorts_with_empty_slots_and_the_chunked_and_loop_executors():
    algo = make_algorithm("ditto", **FAST)
    _compare(algo, participation=Poisson(capacity=12), executor="chunked", chunk_size=4)
    _compare(algo, executor="loop", blocks=(2,))


def test_an_evaluation_sample_and_full_participation():
    _compare(make_algorithm("ditto", **FAST), eval_clients=9)
    _compare(make_algorithm("ditto", local_steps=2, batch_size=5, cohort_size=None), blocks=(2, 1))


# ------------------------------------------------------------------------------------------ runs, checkpoints, resume

TINY_DITTO = [*TINY, "--algorithm", "ditto"]


def _store_files(run_dir) -> dict:
    """Every file of a run's disk store but its journals (the rows, the written flags, meta.json): name -> bytes."""
    root = os.path.join(run_dir, "store")
    return {name: open(os.path.join(root, name), "rb").read() for name in sorted(os.listdir(root))
            if os.path.isfile(os.path.join(root, name))}


def _assert_same_store_run(a, b):
    _assert_same_run(a, b)
    assert _store_files(a) == _store_files(b)


def test_a_disk_store_run_records_the_device_runs_numbers_and_resumes_bit_identically(tmp_path, monkeypatch):
    """fljax run with state_store: disk writes the metrics of the same run with the state on the device; a run that
    dies at the checkpoint of round 6 before writing it (its store a block past the checkpoint of round 4) resumes
    to the uninterrupted run: the same metrics, final checkpoint and store files, byte for byte."""
    args = [*TINY_DITTO, "--set", "rounds=8", "--set", "eval_every=2", "--checkpoint-every", "2", "--quiet"]
    device, full, cut = (str(tmp_path / n) for n in ("device", "full", "cut"))
    assert main(["run", *args, "--out", device]) == 0
    assert main(["run", *args, "--set", "state_store=disk", "--out", full]) == 0
    assert _without_time(_metrics(full)) == _without_time(_metrics(device))
    save = Checkpointer.save

    def save_until_6(self, state, log):
        if int(state.round) == 6:
            raise KeyboardInterrupt  # as if the process were killed here, its store a block past round 4
        save(self, state, log)

    monkeypatch.setattr(Checkpointer, "save", save_until_6)
    assert main(["run", *args, "--set", "state_store=disk", "--out", cut]) == 130
    assert sorted(os.listdir(os.path.join(cut, "store", "undo"))) == ["0000000002-0000000004.npz",
                                                                    "0000000004-0000000006.npz"]
    monkeypatch.undo()
    assert main(["run", "--resume", "--out", cut, "--quiet"]) == 0
    _assert_same_store_run(cut, full)


def test_a_full_disk_mid_run_stops_in_one_line_and_loses_nothing(tmp_path, monkeypatch, capsys):
    """The journal of rounds 5–6 cannot be written (no space left on device): the run stops at once with one line,
    its store unchanged past the checkpoint of round 4 and no later block written; after making room, --resume
    ends at the uninterrupted run."""
    args = [*TINY_DITTO, "--set", "rounds=8", "--set", "eval_every=2", "--checkpoint-every", "2", "--set",
            "state_store=disk", "--quiet"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(["run", *args, "--out", full]) == 0
    savez = np.savez

    def full_disk(file, **arrays):
        if os.path.basename(os.path.dirname(getattr(file, "name", ""))) == "undo" and len(os.listdir(
                os.path.dirname(file.name))) >= 2:  # the journal of 2–4 is there: no room for 4–6's
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return savez(file, **arrays)

    monkeypatch.setattr(np, "savez", full_disk)
    capsys.readouterr()
    assert main(["run", *args, "--out", cut]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("fljax: error: could not write the store's journal of rounds 5–6 "), err
    assert "no space left on device; the store was not changed, the last checkpoint is intact" in err[0]
    monkeypatch.undo()
    assert main(["run", "--resume", "--out", cut, "--quiet"]) == 0
    _assert_same_store_run(cut, full)


def _journaling(out: str) -> bool:
    undo = os.path.join(out, "store", "undo")
    return os.path.isdir(undo) and any(n.startswith(".") for n in os.listdir(undo))


def _kill_during(tmp_path, moments, tries: int = 6):
    """``kill -9`` of ``fljax run`` with a disk store at each of ``moments`` ((name, condition on the run directory
    and the seconds since it started), e.g. while a checkpoint or a block's journal is written), then ``--resume``:
    the uninterrupted run's metrics, final checkpoint and store files, byte for byte (the harness of
    tests/test_kill.py). Returns the moments where a kill landed."""
    from test_kill import _env, _fljax, _started, _wait

    argv = ["run", *TINY_DITTO, "--set", "rounds=10", "--set", "eval_every=1", "--checkpoint-every", "1", "--set",
            "state_store=disk", "--quiet"]
    env = _env(str(tmp_path / "jax-cache"))
    full = str(tmp_path / "full")
    proc = _fljax([*argv, "--out", full], env, full + ".log")  # also fills the compilation cache
    assert proc.wait(timeout=900) == 0, open(full + ".log").read()
    landed = []
    for name, during in moments:
        for attempt in range(tries):
            out = str(tmp_path / f"{name}{attempt}")
            proc = _fljax([*argv, "--out", out], env, out + ".log")
            assert _wait(proc, lambda: _started(out), time.monotonic() + 900), open(out + ".log").read()
            t0 = time.monotonic()
            if _wait(proc, lambda: during(out, time.monotonic() - t0), time.monotonic() + 600):
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=900)
            if proc.returncode == -signal.SIGKILL and during(out, time.monotonic() - t0):
                break
            shutil.rmtree(out)
        else:
            raise AssertionError(f"no kill landed while {name} in {tries} tries")
        resumed = _fljax(["run", "--resume", "--out", out, "--quiet"], env, out + ".log")
        assert resumed.wait(timeout=900) == 0, open(out + ".log").read()
        _assert_same_store_run(out, full)
        landed.append(name)
    return landed


def _in_a_block(out: str, seconds: float) -> bool:
    """Some checkpoints written, the run past them (the store a block or more ahead of its last checkpoint)."""
    done = os.path.join(out, "checkpoints")
    return seconds > 1.0 and os.path.isdir(done) and sum(n.isdigit() for n in os.listdir(done)) >= 2


def test_kill_9_during_a_block_a_checkpoint_write_and_a_journal_write_resumes_bit_identically(tmp_path):
    from test_kill import _writing_checkpoint

    landed = _kill_during(tmp_path, [("in-a-block", _in_a_block),
                                     ("checkpointing", lambda out, _: _writing_checkpoint(out)),
                                     ("journaling", lambda out, _: _journaling(out))])
    assert landed == ["in-a-block", "checkpointing", "journaling"]


def test_seeds_and_grid_points_run_one_after_another_each_with_its_own_store(tmp_path):
    """A sweep's points and seeds, lanes of one program with the state on the device, run one after another with a
    store, each run's store in its own directory: the numbers of the device's separate runs (--lanes off)."""
    sweep = ["sweep", *TINY_DITTO, "--set", "rounds=4", "--set", "eval_every=2", "--grid", "algo.lam=0.1,0.5",
             "--seeds", "2", "--quiet"]
    device, disk = str(tmp_path / "device"), str(tmp_path / "disk")
    assert main([*sweep, "--lanes", "off", "--out", device]) == 0
    assert main([*sweep, "--set", "state_store=disk", "--out", disk]) == 0
    for run in (f"lam={lam}/seed_{s}" for lam in (0.1, 0.5) for s in (0, 1)):
        assert _without_time(_metrics(os.path.join(disk, run))) == _without_time(_metrics(os.path.join(device, run)))
        assert os.path.exists(os.path.join(disk, run, "store", "meta.json"))


# ------------------------------------------------------------------------------------------ the disk store alone


def _disk_store(tmp_path, n=10):
    treedef = jax.tree.structure({"a": 0, "b": 0})
    specs = [((2,), np.dtype(np.float32)), ((), np.dtype(np.int32))]
    return DiskStore.create(str(tmp_path / "store"), treedef, specs, n, {"algorithm": "x", "run": "r"})


def _rows(store):
    return [np.array(a) for a in store.leaves], np.array(store.written)


def test_the_undo_journal_returns_the_rows_to_each_kept_checkpoint(tmp_path):
    """Blocks 0–2 (before any checkpoint), 2–4 and 4–6 written; restoring round 4, then round 2, gives the rows and
    written flags as they were at those rounds (a NumPy copy taken then); journals of blocks before the oldest kept
    checkpoint are forgotten."""
    store = _disk_store(tmp_path)
    rng = np.random.default_rng(0)

    def block(ids, start, end):
        old, _ = store.read(ids)
        new = [rng.normal(size=(len(ids), 2)).astype(np.float32), rng.integers(0, 9, len(ids)).astype(np.int32)]
        store.write_block(ids, new, old, start, end)

    block(np.array([0, 3, 4]), 0, 2)
    store.commit(2)
    at = {2: _rows(store)}
    block(np.array([3, 5, 9]), 2, 4)  # 3 again, 5 and 9 for the first time
    store.commit(4)
    at[4] = _rows(store)
    block(np.array([1, 3, 9]), 4, 6)
    store.restore(4, store.checkpoint_tree())
    for got, want in zip(_rows(store)[0] + [_rows(store)[1]], at[4][0] + [at[4][1]]):
        np.testing.assert_array_equal(got, want)
    store.restore(2, store.checkpoint_tree())
    for got, want in zip(_rows(store)[0] + [_rows(store)[1]], at[2][0] + [at[2][1]]):
        np.testing.assert_array_equal(got, want)
    assert store.written.tolist() == [1, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    block(np.array([2]), 2, 4)
    store.commit(4)
    store.forget_before(4)
    assert os.listdir(os.path.join(store.directory, "undo")) == []


def test_after_a_failed_journal_write_no_later_block_is_written(tmp_path, monkeypatch):
    """The journal of a block cannot be written: the block's rows stay as they were, and so do the next block's
    (its journal would hold rows the failed block never wrote)."""
    store = _disk_store(tmp_path)
    store.commit(0)
    before = _rows(store)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    ids = np.array([1, 2])
    new = [np.ones((2, 2), np.float32), np.ones(2, np.int32)]
    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(StoreWriteError, match="no space left on device; the store was not changed"):
        store.write_block(ids, new, store.read(ids)[0], 0, 2)
    monkeypatch.undo()
    with pytest.raises(StoreWriteError):
        store.write_block(ids, new, store.read(ids)[0], 2, 4)
    for got, want in zip(_rows(store)[0] + [_rows(store)[1]], before[0] + [before[1]]):
        np.testing.assert_array_equal(got, want)
    assert os.listdir(os.path.join(store.directory, "undo")) == []  # no journal, not even a partial one


def test_lanes_and_an_older_state_are_refused_in_one_line():
    sim = Simulation(make_algorithm("ditto", **FAST), DATA, LOGREG, executor="vmap", state_store="host")
    with pytest.raises(ValueError, match="a client-state store"):
        Lanes(sim, [0, 1])
    start = sim.init()
    sim.run_rounds(start, 1)
    with pytest.raises(ValueError, match="this state is of round 0, its store holds the clients of round 1"):
        sim.run_rounds(start, 1)
    with pytest.raises(OptionError, match="state_store must be one of"):
        Simulation(make_algorithm("ditto", **FAST), DATA, LOGREG, state_store="ram")


def test_ten_thousand_clients_on_disk_equal_the_device_and_only_sampled_rows_are_written(tmp_path):
    """10⁴ clients, cohorts of 50: the disk run equals the device run bit for bit, and the store wrote exactly the
    rows of the clients the rounds sampled (the cohorts recomputed here from the run key: fold_in(fold_in(
    fold_in(key, 1), t), SAMPLE), uniform without replacement); every other row is still its reserved zeros."""
    from fljax.engine.context import SAMPLE
    from fljax.engine.sampling import sample_cohort

    data = D.make_federated("synthetic", 10_000, seed=1, storage="ragged", max_samples=14, min_samples=11,
                            size_log_mean=0.0, size_log_std=0.5)
    algo = make_algorithm("ditto", cohort_size=50, local_steps=2, batch_size=5)
    _compare(algo, data=data, blocks=(2, 2), executor="chunked", chunk_size=25)
    sim = Simulation(algo, data, LOGREG, executor="chunked", chunk_size=25, state_store="disk",
                     store_dir=str(tmp_path / "store"))
    state, _, _ = _run(sim, blocks=(2, 2))
    key = jax.random.PRNGKey(0)
    sampled = set()
    for t in range(4):
        stream = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, 1), t), SAMPLE)
        sampled |= set(np.asarray(sample_cohort(stream, 10_000, 50)).tolist())
    store = state.clients.store
    store.drain()
    assert set(np.flatnonzero(np.asarray(store.written)).tolist()) == sampled
    others = np.setdiff1d(np.arange(10_000), sorted(sampled))
    for leaf in store.leaves:
        assert not np.asarray(leaf[others]).any()


def test_resuming_without_the_store_is_refused_in_one_line(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = [*TINY_DITTO, "--set", "rounds=4", "--set", "eval_every=2", "--checkpoint-every", "2", "--set",
            "state_store=disk", "--quiet"]
    assert main(["run", *args, "--set", "rounds=2", "--out", out]) == 0
    shutil.rmtree(os.path.join(out, "store"))
    capsys.readouterr()
    assert main(["run", "--resume", "--out", out, "--set", "rounds=4", "--quiet"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "the client-state store" in err[0] and "is missing (no meta.json)" in err[0], err


def test_a_runs_memory_plan_traces_the_stores_programs():
    """A run's programs are planned under their memory budgets before anything is written
    (Simulation.plan_memory, called by the runner's check_fits); with a store they are the store's — one round on a
    block's buffer, one evaluation chunk — whose clients are rows, not the population's state (the population-shaped
    programs have no client rows to plan a budgeted client map over)."""
    sim = Simulation(make_algorithm("ditto", **FAST), DATA, LOGREG, executor="chunked", state_store="disk")
    sim.plan_memory()
    assert sim._planned
