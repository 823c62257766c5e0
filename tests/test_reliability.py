"""Issue 14, the run layer: every fault a run can meet leaves a directory that continues to the same result.

A damaged newest checkpoint falls back to the newest good one; a run that died before its first checkpoint can be
restarted or resumed; ``--resume`` refuses a change of the simulation before touching ``config.yaml``; a run
directory has one owner (an OS lock, stale locks of dead processes ignored); SIGTERM and Ctrl-C checkpoint, write
the status and exit 143/130, for runs, sweeps and comparisons; the divergence guard ends a run with exit status 3.
(The bad inputs among these are in the catalogue, tests/bad_inputs.py; ``kill -9`` at random moments is
tests/test_kill.py.)
"""
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from bad_inputs import _HOLDER
from test_runner import TINY, _final_params, _metrics, _without_time

from fljax.cli import main
from fljax.runner import files
from fljax.runner.checkpoint import Checkpointer
from fljax.runner.interrupt import Interrupted, graceful
from fljax.runner.lock import LOCK_NAME, hold
from fljax.runner.results import RunDir


def _run(capsys, argv) -> tuple[int, list[str]]:
    """Exit status and the stderr lines of ``fljax argv``."""
    status = main(argv)
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _assert_same_run(a, b):
    """Equal metrics (but for the clock) and equal final checkpoints, bit for bit."""
    assert _without_time(_metrics(a)) == _without_time(_metrics(b))
    (state_a, log_a), (state_b, log_b) = _final_params(a), _final_params(b)
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert (log_a.bytes_up, log_a.bytes_down) == (log_b.bytes_up, log_b.bytes_down)


def _die_at_checkpoint(monkeypatch, round_: int, before: bool = False):
    """The process dies at the checkpoint of ``round_`` (after writing it, or ``before``)."""
    save = Checkpointer.save

    def save_then_die(self, state, log):
        if not before:
            save(self, state, log)
        if int(state.round) == round_:
            raise KeyboardInterrupt  # as if the process were killed here

    monkeypatch.setattr(Checkpointer, "save", save_then_die)


# ------------------------------------------------------------------------------------------------ checkpoints


def test_damaged_newest_checkpoint_falls_back_to_the_newest_good_one(tmp_path, capsys, monkeypatch):
    """(issue: a corrupt latest checkpoint gave a 148-line orbax traceback.) One warning line, the damaged
    checkpoint moved aside, and the run resumes from the one before to the uninterrupted result."""
    args = [*TINY, "--set", "rounds=6", "--set", "eval_every=2", "--checkpoint-every", "2", "--quiet"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(["run", *args, "--out", full]) == 0
    _die_at_checkpoint(monkeypatch, 4)
    assert main(["run", *args, "--out", cut]) == 130
    monkeypatch.undo()
    hopeless = str(tmp_path / "hopeless")
    shutil.copytree(cut, hopeless)
    open(os.path.join(cut, "checkpoints", "4", "state", "_METADATA"), "w").close()  # damaged
    capsys.readouterr()

    status, err = _run(capsys, ["run", "--resume", "--out", cut, "--quiet"])
    assert status == 0
    assert len(err) == 1 and re.fullmatch(r"fljax: warning: the checkpoint of round 4 in \S+ cannot be read \(.+\); "
                                          r"moved it to 4\.unreadable and resumed from round 2", err[0]), err
    assert sorted(os.listdir(os.path.join(cut, "checkpoints"))) == ["4", "4.unreadable", "6"]  # (max_to_keep: 2)
    _assert_same_run(cut, full)

    for r in ("2", "4"):  # no checkpoint can be read: refused in one line, nothing moved
        open(os.path.join(hopeless, "checkpoints", r, "state", "_METADATA"), "w").close()
    status, err = _run(capsys, ["run", "--resume", "--out", hopeless, "--quiet"])
    assert status == 2 and len(err) == 1 and "no checkpoint in" in err[0] and "can be read" in err[0], err
    assert sorted(os.listdir(os.path.join(hopeless, "checkpoints"))) == ["2", "4"]


def test_run_that_died_before_its_first_checkpoint_can_be_restarted_or_resumed(tmp_path, capsys, monkeypatch):
    """(issue: such a directory could neither be restarted — "already holds a run" — nor resumed — "no
    checkpoint".) Both now work and give the uninterrupted result."""
    args = [*TINY, "--set", "rounds=4", "--set", "eval_every=2", "--checkpoint-every", "4", "--quiet"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(["run", *args, "--out", full]) == 0
    _die_at_checkpoint(monkeypatch, 4, before=True)
    assert main(["run", *args, "--out", cut]) == 130
    monkeypatch.undo()
    assert not RunDir(cut).has_checkpoint() and os.path.exists(os.path.join(cut, "metrics.jsonl"))
    resumed = str(tmp_path / "resumed")
    shutil.copytree(cut, resumed)
    capsys.readouterr()
    assert main(["run", *args, "--out", cut]) == 0  # restarted
    _assert_same_run(cut, full)
    assert main(["run", "--resume", "--out", resumed, "--quiet"]) == 0  # resumed from round 0
    _assert_same_run(resumed, full)


# ------------------------------------------------------------------------------------------------ --resume


def test_resume_refuses_a_changed_simulation_before_touching_config_yaml(tmp_path, capsys):
    """(issue: an incompatible --set printed ~120 lines and overwrote config.yaml first; --set
    data.num_clients=20 silently continued on another partition.) One line naming the key, config.yaml as it was,
    and the run still resumes; the changes that keep the simulation (rounds, cadences, the guard, the executor)
    are allowed and recorded."""
    out = str(tmp_path / "run")
    assert main(["run", *TINY, "--set", "rounds=4", "--set", "eval_every=2", "--out", out, "--quiet"]) == 0
    config = open(os.path.join(out, "config.yaml"), "rb").read()
    capsys.readouterr()
    for change, key in ((["--set", "data.num_clients=20"], "data.num_clients"), (["--set", "algo.lr=0.5"], "algo.lr"),
                        (["--set", "model.name=mlp"], "model.name"), (["--seeds", "2"], "seeds"),
                        (["--set", "data.seed=3"], "data.seed"), (["--set", "algo.local_steps=3"], "algo.local_steps")):
        status, err = _run(capsys, ["run", "--resume", "--out", out, *change, "--quiet"])
        assert status == 2 and len(err) == 1 and err[0].startswith(f"fljax: error: --resume cannot change {key} ("), err
        assert open(os.path.join(out, "config.yaml"), "rb").read() == config
    status, err = _run(capsys, ["run", "--resume", "--out", out, "--set", "rounds=2", "--quiet"])
    assert status == 2 and "rounds must be at least 4 to resume" in err[0], err
    assert open(os.path.join(out, "config.yaml"), "rb").read() == config
    assert main(["run", "--resume", "--out", out, "--set", "rounds=6", "--set", "eval_every=3", "--checkpoint-every",
                 "3", "--set", "diverge_factor=null", "--set", "executor=vmap", "--quiet"]) == 0
    assert [r["round"] for r in _metrics(out)] == [0, 2, 4, 6]
    saved = files.read_json(os.path.join(out, "summary.json"))
    assert saved["status"] == "completed" and saved["rounds"] == 6
    assert "rounds: 6" in open(os.path.join(out, "config.yaml")).read()


# ------------------------------------------------------------------------------------------------ one owner


def _holder(*directories) -> subprocess.Popen:
    """Another process holding the locks of ``directories``, as a running fljax does."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, *directories], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_run_directory_has_one_owner_and_a_dead_owner_does_not_block(tmp_path, capsys):
    """(issue: two runs on one --out mixed two seeds under one config.yaml.) While another process holds the
    directory, a run is refused in one line naming it and the holder's pid; once the holder is killed (its lock
    file stays behind), the directory is free."""
    out = str(tmp_path / "run")
    holder = _holder(out)
    status, err = _run(capsys, ["run", *TINY, "--set", "rounds=2", "--set", "eval_every=2", "--out", out, "--quiet"])
    assert status == 2 and err == [f"fljax: error: run directory {out!r} is in use by another fljax process (pid "
                                   f"{holder.pid}); wait for it to end or choose another --out."]
    assert os.listdir(out) == [LOCK_NAME]
    holder.kill()  # kill -9: the lock file stays, the lock goes with the process
    holder.wait()
    assert os.listdir(out) == [LOCK_NAME]
    assert main(["run", *TINY, "--set", "rounds=2", "--set", "eval_every=2", "--out", out, "--quiet"]) == 0
    assert LOCK_NAME not in os.listdir(out)  # released on exit


def test_lock_is_reentrant_and_leaves_nothing_behind(tmp_path):
    root = tmp_path / "a" / "b"
    with hold([str(root)]):
        with hold([str(root), str(root / "c")]):  # the same process may take it again
            assert sorted(os.listdir(root)) == [LOCK_NAME, "c"]
        assert os.listdir(root) == [LOCK_NAME]
    assert os.listdir(tmp_path) == []  # the directories created only to hold the lock are gone
    (tmp_path / "kept").mkdir()
    with hold([str(tmp_path / "kept")]):
        (tmp_path / "kept" / "metrics.jsonl").write_text("")
    assert os.listdir(tmp_path / "kept") == ["metrics.jsonl"]


# ------------------------------------------------------------------------------------------------ signals


def _signal_at_round(monkeypatch, signum: int, round_: int, where: str = ""):
    """Send ``signum`` to this process when the metrics of round ``round_`` (of the run directory ending with
    ``where``) are written."""
    write = RunDir.write_metrics

    def write_then_signal(self, history):
        write(self, history)
        if history and history[-1]["round"] == round_ and self.path.endswith(where):
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(RunDir, "write_metrics", write_then_signal)


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_checkpoint_write_the_status_and_resume_bit_identically(tmp_path, capsys, monkeypatch,
                                                                                   signum, status):
    """(issue: SIGTERM had no handler: no final checkpoint, no status.) The run finishes its block (round 3, not a
    checkpoint round), checkpoints there, says 'interrupted' and how to resume, exits 128 + the signal; the resumed
    run is the uninterrupted one."""
    args = [*TINY, "--set", "rounds=6", "--set", "eval_every=1", "--checkpoint-every", "2", "--quiet"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(["run", *args, "--out", full]) == 0
    _signal_at_round(monkeypatch, signum, 3)
    capsys.readouterr()
    code, err = _run(capsys, ["run", *args, "--out", cut])
    monkeypatch.undo()
    name = signal.Signals(signum).name
    assert code == status
    assert err == [f"fljax: warning: {name}: stopping after the current block of rounds (checkpoint and status); "
                   f"send it again to stop at once",
                   f"fljax: interrupted by {name}; continue from the last checkpoint with: fljax run --resume --out "
                   f"{cut}"]
    summary = files.read_json(os.path.join(cut, "summary.json"))
    assert summary["status"] == "interrupted" and summary["message"] == f"stopped by {name} after round 3"
    assert sorted(os.listdir(os.path.join(cut, "checkpoints"))) == ["2", "3"]
    assert main(["run", "--resume", "--out", cut, "--quiet"]) == 0
    _assert_same_run(cut, full)


def test_a_signal_before_the_run_started_leaves_nothing_to_resume(tmp_path, capsys, monkeypatch):
    """SIGTERM while the data is still being built: exit 143, nothing written, and no resume command offered for a
    directory that holds no run."""
    from fljax.runner.sweep import DataCache

    def build_then_signal(self, cfg, seed):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(DataCache, "__call__", build_then_signal)
    out = str(tmp_path / "run")
    status, err = _run(capsys, ["run", *TINY, "--out", out, "--quiet"])
    assert status == 143 and err == [f"fljax: interrupted by SIGTERM before the run started; nothing to resume in "
                                     f"{out}"], err
    assert os.listdir(tmp_path) == []


def test_a_second_signal_stops_at_once():
    notes = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as first:  # leaving the block honours the first signal
        with graceful(notes.append) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.name == "SIGTERM" and len(notes) == 1
            with pytest.raises(Interrupted) as e:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):  # the handler runs at the next bytecode
                    pass
    assert e.value.exit_status == 130 and first.value.exit_status == 143
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers of before the block, restored


def test_sweep_interrupted_by_sigterm_resumes_to_the_uninterrupted_sweep(tmp_path, capsys, monkeypatch):
    """A sweep (2 learning rates × 2 seeds as lanes of one program) gets SIGTERM: every lane is checkpointed at the
    end of the block, every run and the sweep's root say 'interrupted'; `fljax sweep --resume` gives every run of
    the uninterrupted sweep bit for bit, also when one lane's newest checkpoint is missing (the lanes then all
    continue from the round they share, as one program again)."""
    args = ["sweep", *TINY, "--set", "data.seed=0", "--set", "rounds=4", "--set", "eval_every=1",
            "--checkpoint-every", "2", "--grid", "algo.lr=0.05,0.2", "--seeds", "2", "--quiet"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*args, "--out", str(full)]) == 0
    _signal_at_round(monkeypatch, signal.SIGTERM, 3, "lr=0.2/seed_1")
    assert main([*args, "--out", str(cut)]) == 143
    monkeypatch.undo()
    assert files.read_json(cut / "summary.json")["status"] == "interrupted"
    runs = [f"lr={lr}/seed_{s}" for lr in (0.05, 0.2) for s in (0, 1)]
    for run in runs:
        assert files.read_json(cut / run / "summary.json")["status"] == "interrupted"
        assert sorted(os.listdir(cut / run / "checkpoints")) == ["2", "3"]
    shutil.rmtree(cut / runs[0] / "checkpoints" / "3")  # a lane left behind (killed while writing round 3)
    capsys.readouterr()
    assert main(["sweep", "--resume", "--out", str(cut), "--quiet"]) == 0  # every lane continues from round 2
    assert files.read_json(cut / "summary.json")["status"] == "completed"
    for run in runs:
        _assert_same_run(cut / run, full / run)


def test_comparison_interrupted_by_sigterm_continues(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    argv = ["compare", *TINY, "--set", "model.options={}", "--set", "rounds=2",
            "--set", "eval_every=1", "--algorithms", "fedavg", "--out", str(out), "--quiet"]
    _signal_at_round(monkeypatch, signal.SIGTERM, 1, "fedavg")
    assert main(argv) == 143
    monkeypatch.undo()
    assert files.read_json(out / "summary.json")["status"] == "interrupted"
    assert files.read_json(out / "fedavg" / "summary.json")["status"] == "interrupted"
    assert main(["compare", "--resume", "--out", str(out), "--quiet"]) == 0
    summary = files.read_json(out / "summary.json")
    assert summary["status"] == "completed" and summary["results"]["fedavg"]["rounds"] == 2


# ------------------------------------------------------------------------------------------------ divergence


def test_divergence_guard_stops_the_run_with_exit_status_3(tmp_path, capsys):
    """(issue: lr=1e6 reached a loss of 3.8e30 at chance accuracy and ended 'completed', exit 0.)"""
    args = ["run", *TINY, "--set", "rounds=4", "--set", "eval_every=2", "--set", "algo.lr=1e6", "--quiet"]
    status, err = _run(capsys, [*args, "--out", str(tmp_path / "a")])
    assert status == 3 and len(err) == 1, err
    assert re.match(r"fljax: error: round \d+ diverged: train_loss=\S+ is above 1000 × max\(initial loss \S+, 1\) "
                    r"\(diverge_factor\); ", err[0]), err
    kept = [r["round"] for r in _metrics(tmp_path / "a")]  # (issue: "Kept: metrics.jsonl" when none was written)
    assert err[0].endswith(f"Kept in {tmp_path / 'a'}: metrics.jsonl up to round {kept[-1]} and no checkpoint."), err
    assert not RunDir(str(tmp_path / "a")).has_checkpoint()
    summary = files.read_json(tmp_path / "a" / "summary.json")
    assert summary["status"] == "stopped" and "diverged" in summary["message"]
    assert main([*args, "--set", "diverge_factor=null", "--out", str(tmp_path / "b")]) == 0
    assert files.read_json(tmp_path / "b" / "summary.json")["status"] == "completed"


# ------------------------------------------------------------------------------------------------ memory


class _Device:
    def __init__(self, platform, stats):
        self.platform, self.device_kind, self._stats = platform, "Fake GPU", stats

    def memory_stats(self):
        return self._stats


def test_device_memory_is_the_accelerators_or_the_machines(monkeypatch):
    from fljax.runner import memory

    monkeypatch.setattr(memory.jax, "local_devices", lambda: [_Device("gpu", {"bytes_limit": 2 ** 30})] * 2)
    assert memory.device_memory() == ("2 × Fake GPU", 2 ** 31)
    from fljax.data.memory import host_memory

    monkeypatch.setattr(memory.jax, "local_devices", lambda: [_Device("gpu", None)])  # no statistics
    assert memory.device_memory() == host_memory()
    monkeypatch.setattr(memory.jax, "local_devices", lambda: [_Device("cpu", None)])
    assert memory.device_memory() == host_memory()
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert host_memory()[1] <= machine


def test_a_simulation_is_refused_only_when_its_lower_bound_exceeds_the_memory(monkeypatch):
    """The bound counts the state (server and clients) and one client's minibatch indices of a round."""
    from fljax import tree
    from fljax.api import build
    from fljax.config import ConfigError, load_config
    from fljax.experiment import resolve
    from fljax.runner import memory
    from fljax.runner.sweep import DataCache

    exp = resolve(load_config(None, ["data.num_clients=8", "data.max_samples=40", "algo.cohort_size=4",
                                     "algo.local_steps=3", "algo.batch_size=10"]))
    sim = build(exp, DataCache()(exp, 0))
    need = tree.nbytes(sim.state_shapes()) + 4 * 3 * 10
    monkeypatch.setattr(memory, "device_memory", lambda: ("this machine", need))
    memory.check_fits(sim)
    monkeypatch.setattr(memory, "device_memory", lambda: ("this machine", need - 1))
    with pytest.raises(ConfigError, match=f"the simulation needs at least {need:,} bytes of memory, more than the "
                                          f"{need - 1:,} bytes of this machine: the server's and clients' states "
                                          f"take"):  # (issue 41: it said 0.0 GiB, more than 0.0 GiB)
        memory.check_fits(sim)


@pytest.mark.parametrize("leave", ["normally", "by the second signal"])
def test_graceful_installs_its_handler_and_restores_the_previous_ones(leave):
    """Inside ``graceful`` SIGINT and SIGTERM are handled by it (the first signal is recorded, not raised); after
    the block, however it is left, each signal has exactly the handler it had before (here a sentinel handler), and
    the recorded signal is raised (a block left normally did not look at it: it is honoured all the same)."""
    def sentinel(signum, frame):
        raise AssertionError("the previous handler ran")

    saved = {s: signal.signal(s, sentinel) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(Interrupted) as e:
            with graceful(lambda note: None) as stop:
                assert all(signal.getsignal(s) not in (sentinel, saved[s]) for s in saved)
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):  # the handler runs at the next bytecode
                    pass
                assert stop.name == "SIGTERM"
                if leave != "normally":
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(100):
                        pass
        assert e.value.name == ("SIGTERM" if leave == "normally" else "SIGINT")
        assert all(signal.getsignal(s) is sentinel for s in saved)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
