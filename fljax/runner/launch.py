"""``fljax run|sweep|compare --processes N``: one simulation over N processes of this machine, which behave as one.

The launcher checks the command first (config, overrides, grid, algorithms, output options: a mistake is one line,
before any process starts), then starts N copies of it, each with ``FLJAX_COORDINATOR`` (``localhost:<a free
port>``), ``FLJAX_NUM_PROCESSES`` (N) and its ``FLJAX_PROCESS_ID`` (0…N-1) set and the run directory named
(``--out``); each joins the group through :func:`fljax.engine.processes.from_environment` and runs the simulation
SPMD, its clients sharded over every process's devices. Process 0 prints and writes the run directory; the others
run quietly and write nothing. What is guaranteed:

* **a signal reaches every process once**: the workers form their own process group; SIGINT (Ctrl-C) and SIGTERM
  to the launcher are forwarded to it, the workers agree at the end of the block of rounds to stop there
  (:func:`fljax.engine.processes.agree`), checkpoint and exit 130/143 as one process would; a second signal stops
  them at once;
* **a dead launcher takes its workers with it**: each worker asks the kernel for SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)`` on Linux; elsewhere a thread that watches the parent), so ``kill -9`` of the
  launcher leaves no orphan training on and holding the run directory's lock (the kernel drops a lock with its
  process);
* **a dead worker ends the group**: the others are stopped at once and the launcher says, in one line, which
  process ended and how, and how to continue from the last checkpoint (checkpoints are committed whole, so the last
  one is intact); the other workers' output (collective errors of the survivors) is not shown;
* a worker's own refusal or guard (exit 2 or 3) is process 0's one line, as in one process.

On several hosts there is no launcher: start the same command once on every host with the three variables set by
hand (the coordinator is process 0's ``host:port``, reachable from the others).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from fljax.engine import processes

__all__ = ["spawn", "free_port", "die_with_parent", "LAUNCHER_ENV", "REPORT_ENV", "GRACE_SECONDS",
           "UNEXPECTED_EXIT"]

LAUNCHER_ENV = "FLJAX_LAUNCHER"  # the launcher's pid, in every worker's environment
REPORT_ENV = "FLJAX_REPORT"  # a file where a worker writes the one line of an unexpected error
GRACE_SECONDS = 10.0  # how long the others may take to end the same way once process 0 has ended
UNEXPECTED_EXIT = 1  # the status of a group that a worker's unexpected end (a crash, a kill) stopped
OWN_STATUSES = (2, 3, 130, 143)  # a worker's one-line refusal, guard or interruption: it says why itself


def free_port() -> int:
    """A TCP port of localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def die_with_parent(parent: int) -> None:
    """Called in a worker: SIGKILL this process when its parent (the launcher, pid ``parent``) dies — the kernel's
    parent-death signal on Linux, else a daemon thread that polls the parent; a parent already gone ends it now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = sys.platform.startswith("linux") and libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    if not armed:
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="fljax-parent-watch", daemon=True).start()


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


def spawn(argv: list[str], n: int, out: str, command: str) -> int:
    """Run ``fljax ARGV`` (which names the run directory ``out`` with ``--out``) as ``n`` processes of one group on
    localhost (module docstring); returns the group's exit status: 0, process 0's own status (2, 3, 130, 143: it
    printed why), or :data:`UNEXPECTED_EXIT` after one line saying which process ended how. ``command``: run,
    sweep or compare (for the resume hint)."""
    coordinator = f"localhost:{free_port()}"
    workdir = tempfile.mkdtemp(prefix="fljax-group-")
    reports = [os.path.join(workdir, f"process_{i}.err") for i in range(n)]
    logs = [None] + [open(os.path.join(workdir, f"process_{i}.log"), "wb") for i in range(1, n)]
    children: list[subprocess.Popen] = []
    signals: list[int] = []
    previous = {}

    def forward(signum, frame):
        signals.append(signum)
        _signal_group(children, signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        previous[s] = signal.signal(s, forward)
    try:
        for i in range(n):
            env = {**os.environ, processes.ENV["coordinator"]: coordinator,
                   processes.ENV["num_processes"]: str(n), processes.ENV["process_id"]: str(i),
                   LAUNCHER_ENV: str(os.getpid()), REPORT_ENV: reports[i]}
            quiet = {} if i == 0 else {"stdout": logs[i], "stderr": logs[i]}
            children.append(subprocess.Popen([sys.executable, "-m", "fljax.cli", *argv], env=env,
                                             **_group(0 if i == 0 else children[0].pid), **quiet))
        if signals:  # a signal while the workers were being started
            _signal_group(children, signals[-1])
        return _wait(children, reports, signals, out, command)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _kill(children)
        for f in logs[1:]:
            f.close()
        for name in os.listdir(workdir):
            os.remove(os.path.join(workdir, name))
        os.rmdir(workdir)


def _wait(children, reports, signals, out: str, command: str) -> int:
    forwarded_twice_at = None
    while True:
        codes = [c.poll() for c in children]
        if all(code == 0 for code in codes):
            return 0
        if len(signals) >= 2 and forwarded_twice_at is None:
            forwarded_twice_at = time.monotonic()
        if forwarded_twice_at is not None and time.monotonic() - forwarded_twice_at > GRACE_SECONDS:
            _kill(children)  # a second signal: stop at once, whatever the workers are waiting for
            return 128 + signals[-1]
        lead = codes[0]
        if lead is not None and lead != 0:
            if lead in OWN_STATUSES:  # it said why (a refusal, a guard, an interruption); the others follow or stop
                _settle(children)
                return lead
            return _unexpected(children, 0, lead, reports, out, command)
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            if codes[failed] in OWN_STATUSES:  # the same refusal process 0 is about to print: give it the time
                deadline = time.monotonic() + GRACE_SECONDS
                while children[0].poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if children[0].poll() in OWN_STATUSES:
                    _settle(children)
                    return children[0].returncode
            return _unexpected(children, failed, codes[failed], reports, out, command)
        if lead == 0:  # process 0 finished and wrote everything: the others end with it (or are stopped)
            _settle(children)
            return 0
        time.sleep(0.05)


def _settle(children) -> None:
    """Process 0 ended on its own terms: the others get the time to end the same way, then are stopped."""
    deadline = time.monotonic() + GRACE_SECONDS
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill(children)


def _unexpected(children, index: int, code: int, reports, out: str, command: str) -> int:
    """Process ``index`` ended unexpectedly: stop the group at once and say so in one line."""
    _kill(children)
    reason = ""
    with contextlib.suppress(OSError):
        with open(reports[index]) as f:
            reason = f.read().strip().splitlines()[0][:300]
    resume = (f"{out} keeps its last checkpoint; continue in one process with: fljax {command} --resume --out {out}"
              if os.path.exists(os.path.join(out, "config.yaml")) else f"nothing to resume in {out}; run it again")
    print(f"fljax: error: process {index} of {len(children)} ended unexpectedly ({_how(code)}"
          f"{': ' + reason if reason else ''}); the other processes were stopped. {resume}.", file=sys.stderr)
    return UNEXPECTED_EXIT


def _group(pgid: int) -> dict:
    """Popen arguments that put the child into process group ``pgid`` (0: a new group it leads)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}


def _signal_group(children, signum: int) -> None:
    """``signum`` once to every worker: their process group (it outlives its leader while members remain)."""
    if children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(children[0].pid, signum)


def _kill(children) -> None:
    for c in children:
        if c.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                c.kill()
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.wait(timeout=30)
