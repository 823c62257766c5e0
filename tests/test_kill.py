"""``kill -9`` at many moments of a run (issue 14, done-when): every directory left behind resumes to the result of
the uninterrupted run, bit for bit (metrics.jsonl but for the clock, and the final checkpoint's state).

Each try starts ``fljax run`` (or ``fljax sweep``) in a subprocess and kills it with SIGKILL once its
``config.yaml`` exists (from then on the directory holds a run; a process killed earlier has written no run and
is simply started again): at once (before the first checkpoint), at the next checkpoint write seen after a seeded
random delay (a temporary checkpoint directory present), at the next metrics write (a temporary metrics file
present), or after a seeded random delay. Then ``--resume`` runs it to the end. The tally of where the kills
landed is printed (``-s``). Slow: about 20 s a try on two cores.
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from test_reliability import _assert_same_run
from test_runner import TINY

from fljax.runner import files

pytestmark = pytest.mark.slow

RUN = ["run", *TINY, "--set", "rounds=12", "--set", "eval_every=1", "--checkpoint-every", "1", "--quiet"]
SWEEP = ["sweep", *TINY, "--set", "data.seed=0", "--set", "rounds=8", "--set", "eval_every=1", "--checkpoint-every",
         "1", "--grid", "algo.lr=0.05,0.2", "--seeds", "2", "--quiet"]
SWEEP_RUNS = [f"lr={lr}/seed_{s}" for lr in (0.05, 0.2) for s in (0, 1)]
TRIGGERS = ("start", "checkpoint", "metrics", "delay")


def _env(cache: str) -> dict:
    """The subprocesses share a compilation cache (a resumed run then loads its programs instead of compiling)."""
    return {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "FLJAX_DEBUG": ""}


def _fljax(argv, env, log: str) -> subprocess.Popen:
    """``fljax argv`` in a subprocess, its stderr in the file ``log``."""
    with open(log, "a") as err:
        return subprocess.Popen([sys.executable, "-m", "fljax.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                                stderr=err)


def _entries(out: str):
    """Every file and directory name under ``out`` (the temporary ones of a write in progress included)."""
    names = []
    for d, subdirs, fs in os.walk(out):
        names += subdirs + fs
    return names


def _writing_checkpoint(out: str) -> bool:
    return any(".orbax-checkpoint-tmp" in n for n in _entries(out))


def _writing_metrics(out: str) -> bool:
    return any(n.startswith(".metrics.jsonl.") for n in _entries(out))


def _started(out: str) -> bool:
    return os.path.exists(os.path.join(out, "config.yaml"))


def _wait(proc, condition, deadline: float) -> bool:
    """Poll until ``condition()`` (True), the process ends or the deadline passes (False)."""
    while proc.poll() is None and time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.0005)
    return False


def _where(out: str) -> str:
    """Where the kill landed, read from what it left behind."""
    if _writing_checkpoint(out):
        return "during a checkpoint write"
    if _writing_metrics(out):
        return "during a metrics write"
    if not any(n.isdigit() for n in _entries(out)):
        return "before the first checkpoint"
    return "between writes"


def _kill_and_resume(argv, out: str, trigger: str, rng: random.Random, span: float, env: dict) -> str:
    log = out + ".log"
    proc = _fljax([*argv, "--out", out], env, log)
    assert _wait(proc, lambda: _started(out), time.monotonic() + 600), open(log).read()
    now = time.monotonic()
    if trigger == "checkpoint":
        time.sleep(rng.uniform(0, 0.6 * span))
        _wait(proc, lambda: _writing_checkpoint(out), now + span)
    elif trigger == "metrics":
        time.sleep(rng.uniform(0, 0.6 * span))
        _wait(proc, lambda: _writing_metrics(out), now + span)
    elif trigger == "delay":
        time.sleep(rng.uniform(0, 0.8 * span))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    where = _where(out) if proc.returncode == -signal.SIGKILL else "not killed: it had finished"
    resumed = _fljax([argv[0], "--resume", "--out", out, "--quiet"], env, log)
    assert resumed.wait(timeout=600) == 0, (where, open(log).read())
    return where


def _tries(tmp_path, argv, runs: list[str], count: int):
    """``count`` kills and resumes of ``argv``, each compared with the uninterrupted run; returns the tally."""
    env = _env(str(tmp_path / "jax-cache"))
    full = str(tmp_path / "full")
    for out in (str(tmp_path / "warm-up"), full):  # the first fills the compilation cache the tries then load
        proc = _fljax([*argv, "--out", out], env, out + ".log")
        assert _wait(proc, lambda: _started(out), time.monotonic() + 600), open(out + ".log").read()
        started = time.monotonic()
        assert proc.wait() == 0, open(out + ".log").read()
    span = time.monotonic() - started  # from config.yaml to the end of a run with a warm cache
    tally: dict[str, int] = {}
    t0 = time.monotonic()
    for i in range(count):
        out = str(tmp_path / f"cut{i}")
        where = _kill_and_resume(argv, out, TRIGGERS[i % len(TRIGGERS)], random.Random(i), span, env)
        tally[where] = tally.get(where, 0) + 1
        for run in runs:
            _assert_same_run(os.path.join(out, run), os.path.join(full, run))
            assert files.read_json(os.path.join(out, run, "summary.json"))["status"] == "completed"
    print(f"\n{argv[0]}: {count} kills in {time.monotonic() - t0:.0f} s, run span {span:.1f} s: {tally}")
    return tally


def test_kill_9_at_20_moments_of_a_run_always_resumes_bit_identically(tmp_path):
    tally = _tries(tmp_path, RUN, [""], 20)
    assert tally.get("before the first checkpoint", 0) >= 1 and tally.get("during a checkpoint write", 0) >= 1, tally
    assert tally.get("not killed: it had finished", 0) <= 2, tally


def test_kill_9_of_a_sweep_always_resumes_bit_identically(tmp_path):
    tally = _tries(tmp_path, SWEEP, SWEEP_RUNS, 8)
    assert tally.get("not killed: it had finished", 0) <= 2, tally
