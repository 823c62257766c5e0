"""One real ``kill -9`` during a checkpoint write, in the default suite (tests/test_kill.py, marked slow, kills at
28 moments): ``fljax run`` in a subprocess is killed while orbax writes a checkpoint (its temporary directory
present), and ``--resume`` ends at the uninterrupted run's result, bit for bit (metrics but for the clock, final
checkpoint). A kill that lands just after the write is retried (at most 4 tries)."""
import os
import signal
import time

from test_kill import _env, _fljax, _started, _wait, _where, _writing_checkpoint
from test_reliability import _assert_same_run
from test_runner import TINY

from fljax.runner import files

RUN = ["run", *TINY, "--set", "rounds=8", "--set", "eval_every=2", "--checkpoint-every", "1", "--quiet"]


def test_kill_9_during_a_checkpoint_write_resumes_bit_identically(tmp_path):
    env = _env(str(tmp_path / "jax-cache"))
    full = str(tmp_path / "full")
    proc = _fljax([*RUN, "--out", full], env, full + ".log")  # also fills the compilation cache
    assert proc.wait(timeout=600) == 0, open(full + ".log").read()
    for attempt in range(4):
        out = str(tmp_path / f"cut{attempt}")
        proc = _fljax([*RUN, "--out", out], env, out + ".log")
        assert _wait(proc, lambda: _started(out), time.monotonic() + 600), open(out + ".log").read()
        if _wait(proc, lambda: _writing_checkpoint(out), time.monotonic() + 300):
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=600)
        if proc.returncode == -signal.SIGKILL and _where(out) == "during a checkpoint write":
            break
    else:
        raise AssertionError("no kill landed during a checkpoint write in 4 tries")
    resumed = _fljax(["run", "--resume", "--out", out, "--quiet"], env, out + ".log")
    assert resumed.wait(timeout=600) == 0, open(out + ".log").read()
    _assert_same_run(out, full)
    assert files.read_json(os.path.join(out, "summary.json"))["status"] == "completed"
