"""One simulation over several processes, on JAX's own distributed runtime (``jax.distributed``).

JAX runs multi-process programs SPMD: every process runs the same Python program, builds the same data (every
source and partition is seeded, so they agree) and calls the same compiled programs; ``jax.devices()`` then lists
every process's devices, and the :class:`~fljax.engine.executors.ShardedExecutor` (``auto``'s choice on several
devices) splits the client axis over all of them with ``shard_map``. Each process computes its shard of the clients;
the collectives between processes run on CPU through Gloo (``jax_cpu_collectives_implementation='gloo'``, the default
of jax >= 0.4.36) and on accelerators through the platform's own (NCCL on GPUs).

The engine's programs take and return arrays *replicated* on every device (:func:`program_shardings`): every process
holds the whole state and every metric, so each can read its results and feed them back into the next block of
rounds; inside a program the per-client work stays sharded. Only process 0 writes files (:func:`is_lead`).

A process joins a group when :func:`initialize` is called before JAX computes anything, with the coordinator's
``host:port``, the number of processes and its own index — or from the environment: ``FLJAX_COORDINATOR``,
``FLJAX_NUM_PROCESSES``, ``FLJAX_PROCESS_ID`` (:func:`from_environment`).

Before JAX's runtime is started, the processes meet (:func:`rendezvous`): process 0 listens on the coordinator's port
and every other process connects and says how many processes it was told the group has and which one it is. A
coordinator that cannot be reached, a process count or an index that disagrees, two processes with one index, or a
process that does not come are refused there, in one line, within ``FLJAX_JOIN_TIMEOUT`` seconds (default
:data:`JOIN_TIMEOUT`) — instead of ``jax.distributed.initialize`` waiting five minutes and aborting the process with
a C++ stack trace. Then JAX's runtime starts on the same port with that timeout.

During a run the processes stay in step: a stop request (SIGINT/SIGTERM) that reaches any of them is shared at the
end of every block of rounds (:func:`agree`), so all stop after the same block.
"""
from __future__ import annotations

import os
import socket
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fljax.errors import OptionError

__all__ = ["ENV", "initialize", "from_environment", "is_lead", "lead_only", "program_shardings", "rendezvous",
           "agree", "lost_group", "JOIN_TIMEOUT", "TIMEOUT_ENV"]

_joined = {"group": None}
ENV = {"coordinator": "FLJAX_COORDINATOR", "num_processes": "FLJAX_NUM_PROCESSES", "process_id": "FLJAX_PROCESS_ID"}
TIMEOUT_ENV = "FLJAX_JOIN_TIMEOUT"
JOIN_TIMEOUT = 60.0  # seconds for every process of a group to meet (a coordinator that does not answer, a missing one)
_HELLO = "fljax-group 1"


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the group of ``num_processes`` processes whose process 0 serves ``coordinator`` (``host:port``) as
    process ``process_id``; must precede every JAX computation in this process. Joining the same group again does
    nothing."""
    if num_processes < 1:
        raise OptionError("processes", f"must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise OptionError("process_id", f"must be in [0, {num_processes}), got {process_id}")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise OptionError("coordinator", f"must be host:port, got {coordinator!r}")
    group = (coordinator, num_processes, process_id)
    if _joined["group"] is not None:
        if _joined["group"] != group:
            raise OptionError("processes", f"this process is in the group {_joined['group']} already")
        return
    if num_processes == 1:
        _joined["group"] = group
        return
    timeout = join_timeout()
    rendezvous(host, int(port), num_processes, process_id, timeout)
    if process_id != 0:
        _await_service(host, int(port), timeout)
    _joined["group"] = group
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                               initialization_timeout=max(1, int(timeout)))


def _await_service(host: str, port: int, timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, until process 0 serves JAX's runtime on ``host:port`` (it starts it once
    the group has met): a follower whose process 0 ended after the meeting, or whose coordinator said 'go' and
    never served, is refused in one line here instead of waiting in ``jax.distributed.initialize`` (which aborts the
    process with a C++ stack trace, or waits on)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise OptionError(ENV["coordinator"], f"{host}:{port}: process 0 met the group but did not start "
                                                      f"its runtime within {timeout:g} s ({TIMEOUT_ENV}); see its "
                                                      f"message, and start the group again") from None
            time.sleep(0.1)


def join_timeout() -> float:
    """``FLJAX_JOIN_TIMEOUT`` (seconds), else :data:`JOIN_TIMEOUT`."""
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return JOIN_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:
        raise OptionError(TIMEOUT_ENV, f"must be a number of seconds in (0, 86400], got {text!r}")
    return value


def rendezvous(host: str, port: int, num_processes: int, process_id: int, timeout: float) -> None:
    """Meet the other processes of the group before JAX's runtime starts (module docstring). Process 0 listens on
    ``port`` and answers each process's hello; the others connect to ``host:port``. Raises a one-line
    :class:`~fljax.errors.OptionError` (naming the variable to fix) on any disagreement or when the group is not
    complete within ``timeout`` seconds; returns once every process has checked in."""
    deadline = time.monotonic() + timeout
    if process_id == 0:
        _lead_rendezvous(port, num_processes, deadline, timeout)
    else:
        _join_rendezvous(host, port, num_processes, process_id, deadline, timeout)


def _lead_rendezvous(port: int, n: int, deadline: float, timeout: float) -> None:
    try:
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True) \
            if socket.has_dualstack_ipv6() else socket.create_server(("", port))
    except OSError as e:
        raise OptionError(ENV["coordinator"], f"port {port} cannot be served by process 0 on this host "
                                              f"({e.strerror or e}); choose a free port") from None
    joined: dict[int, socket.socket] = {}
    try:
        while len(joined) < n - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, n)) - set(joined))
                raise OptionError(ENV["num_processes"], f"is {n}, but process{'es' if len(missing) > 1 else ''} "
                                  f"{', '.join(map(str, missing))} did not join within {timeout:g} s ({TIMEOUT_ENV}); "
                                  f"start every process of the group, each with its own {ENV['process_id']}")
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except (socket.timeout, TimeoutError):
                continue
            conn.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
            try:
                words = _read_line(conn).split()
            except OSError:
                conn.close()
                continue
            problem = _check_hello(words, n, joined)
            if problem:
                with _suppress():
                    conn.sendall(f"no {problem}\n".encode())
                conn.close()
                raise OptionError(problem.split(" ", 1)[0], problem.split(" ", 1)[1])
            joined[int(words[3])] = conn
        for conn in joined.values():
            conn.sendall(b"go\n")
        for conn in joined.values():  # the others close first: the port is free for JAX's service at once
            conn.settimeout(5.0)
            with _suppress():
                conn.recv(1)
    finally:
        for conn in joined.values():
            conn.close()
        server.close()


def _check_hello(words: list[str], n: int, joined: dict) -> str | None:
    """A problem ('<VARIABLE> <message>') with a process's hello, else None."""
    if len(words) != 4 or " ".join(words[:2]) != _HELLO or not words[2].isdigit() or not words[3].isdigit():
        return f"{ENV['coordinator']} is reached by something that is not an fljax process of this group"
    count, index = int(words[2]), int(words[3])
    if count != n:
        return (f"{ENV['num_processes']} disagrees between processes: process {index} says {count}, process 0 says "
                f"{n}; start every process with the same {ENV['num_processes']}")
    if not 1 <= index < n or index in joined:
        return (f"{ENV['process_id']} {index} is {'given twice' if index in joined else 'out of range'} in a group of "
                f"{n}; give each process its own id 0..{n - 1}")
    return None


def _join_rendezvous(host: str, port: int, n: int, index: int, deadline: float, timeout: float) -> None:
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror as e:
        raise OptionError(ENV["coordinator"], f"host {host!r} cannot be resolved ({e.strerror or e})") from None
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        except OSError:
            if time.monotonic() >= deadline:
                raise OptionError(ENV["coordinator"], f"{host}:{port} did not answer within {timeout:g} s "
                                                      f"({TIMEOUT_ENV}); start process 0 there first, and check that "
                                                      f"this host reaches it") from None
            time.sleep(0.1)
    try:
        conn.sendall(f"{_HELLO} {n} {index}\n".encode())
        while True:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                answer = _read_line(conn)
            except (socket.timeout, TimeoutError):
                raise OptionError(ENV["num_processes"], f"is {n}, but the group was not complete within {timeout:g} "
                                                        f"s ({TIMEOUT_ENV}); start every process of the group") \
                    from None
            except OSError:
                answer = ""
            if answer == "go":
                return
            if not answer:
                raise OptionError(ENV["coordinator"], f"process 0 at {host}:{port} closed the group before it was "
                                                      f"complete; see its message")
            if answer.startswith("no "):
                key, _, message = answer[3:].partition(" ")
                raise OptionError(key, message)
            raise OptionError(ENV["coordinator"], f"{host}:{port} is not fljax's process 0 of this group (it answered "
                                                  f"{answer[:40]!r})")
    finally:
        conn.close()


def _read_line(conn: socket.socket, limit: int = 512) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(limit)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, OSError)


def agree(signum: int) -> int:
    """The stop request of the whole group: ``signum`` (0: none) of this process, shared with the others at the same
    point of every process's run; the first non-zero one (by process index), else 0. One process: ``signum``."""
    if jax.process_count() == 1:
        return signum
    from jax.experimental import multihost_utils

    every = np.asarray(multihost_utils.process_allgather(np.int32(signum))).ravel()
    nonzero = every[every != 0]
    return int(nonzero[0]) if nonzero.size else 0


def lost_group(e: BaseException) -> str | None:
    """The one line for an error of JAX's distributed runtime in a process of a group (a collective that timed out
    because another process ended or stopped answering), or None for any other error, or outside a group."""
    group = _joined["group"]
    if group is None or group[1] <= 1 or not isinstance(e, jax.errors.JaxRuntimeError):
        return None
    text = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return (f"process {group[2]} of {group[1]} lost its group ({text}): another process ended or stopped answering "
            f"(see process 0's message); start the group again, or continue its run in one process with --resume")


def from_environment() -> bool:
    """:func:`initialize` from ``FLJAX_COORDINATOR`` / ``FLJAX_NUM_PROCESSES`` / ``FLJAX_PROCESS_ID`` when they
    are set (all three, or none); returns whether they were."""
    values = {k: os.environ.get(v) for k, v in ENV.items()}
    if not any(values.values()):
        return False
    missing = [ENV[k] for k, v in values.items() if not v]
    if missing:
        raise OptionError(missing[0], f"must be set together with {', '.join(v for v in ENV.values() if v not in missing)}")
    for k in ("num_processes", "process_id"):
        if not values[k].isdigit():
            raise OptionError(ENV[k], f"must be a non-negative integer, got {values[k]!r}")
    initialize(values["coordinator"], int(values["num_processes"]), int(values["process_id"]))
    return True


def is_lead() -> bool:
    """Whether this process writes the results (process 0, or the only process)."""
    return jax.process_index() == 0


def lead_only(path: str | None) -> str | None:
    """``path`` on the process that writes the results, None (write nothing) on the others."""
    return path if is_lead() else None


def program_shardings() -> dict:
    """``jax.jit`` keyword arguments for the engine's programs: none on one process; on several, inputs and outputs
    replicated over every process's devices (module docstring)."""
    if jax.process_count() == 1:
        return {}
    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("clients",)), PartitionSpec())
    return {"in_shardings": replicated, "out_shardings": replicated}
