"""``fljax run|sweep|compare --processes N``: one simulation over N processes of this machine.

The launcher starts N copies of the same command, each with ``FLJAX_COORDINATOR`` (``localhost:<a free port>``),
``FLJAX_NUM_PROCESSES`` (N) and its ``FLJAX_PROCESS_ID`` (0…N-1) set; each copy joins the group through
:func:`fljax.engine.processes.from_environment` and runs the simulation SPMD, its clients sharded over every
process's devices. Process 0 prints and writes the run directory; the others run quietly and write nothing. The
launcher waits for all of them; when one fails, it stops the others and returns the failed one's exit status.

On several hosts there is no launcher: start the same command once on every host with the three variables set by
hand (the coordinator is process 0's ``host:port``, reachable from the others).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from fljax.engine import processes

__all__ = ["spawn", "free_port"]


def free_port() -> int:
    """A TCP port of localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], n: int) -> int:
    """Run ``fljax ARGV`` as ``n`` processes of one group on localhost; the first non-zero exit status, else 0."""
    coordinator = f"localhost:{free_port()}"
    children = []
    for i in range(n):
        env = {**os.environ, processes.ENV["coordinator"]: coordinator,
               processes.ENV["num_processes"]: str(n), processes.ENV["process_id"]: str(i)}
        children.append(subprocess.Popen([sys.executable, "-m", "fljax.cli", *argv], env=env))
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                _stop(children)
                return failed[0]
            if all(code == 0 for code in codes):
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:  # the children got the same Ctrl-C: let them checkpoint and report
        return [c.wait() for c in children][0]


def _stop(children: list[subprocess.Popen]) -> None:
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    for c in children:
        c.wait()
