"""One owner per run directory, enforced by the operating system.

A process that writes into run directories first locks each of them: an exclusive ``flock`` on ``<dir>/.lock``
(POSIX), taken without waiting. What is guaranteed:

* while a process holds a directory's lock, no other process gets it: a second ``fljax run`` on the same ``--out``
  is refused at once, in one line naming the directory (and the holder's pid);
* the kernel drops a lock when the process holding it ends, however it ends (``kill -9`` included), so a lock file
  left behind by a dead process never blocks anyone;
* a sweep or a comparison locks its root and every run directory under it (each point, each seed): a second sweep
  over the same root, or a run started by hand in one of its directories, is refused, and so is the sweep when one
  of its directories is in use;
* within one process the locks are re-entrant (``fljax compare`` holds its root while the runs under it lock it
  again);
* the lock leaves nothing behind: on release the lock file is removed (before it is unlocked; an acquirer checks
  that the file it locked is still the one at the path, so two processes never both own a directory), and the
  directories created only to hold the lock are removed again when they are still empty (a refused run writes
  nothing).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import resource

from fljax.errors import ConfigError

__all__ = ["hold", "LOCK_NAME"]

LOCK_NAME = ".lock"

_held: dict[str, list] = {}  # real path -> [file descriptor, depth]


@contextlib.contextmanager
def hold(directories: list[str | None]):
    """Lock every directory of ``directories`` (None entries are skipped; missing directories are created) for
    the duration of the ``with`` block. Raises :class:`~fljax.errors.ConfigError` when one is held by another
    process (the locks already taken are released)."""
    wanted = list(dict.fromkeys(d for d in directories if d is not None))
    for directory in wanted:
        blocked = _file_in_the_way(directory)
        if blocked is not None:
            raise ConfigError(f"run directory {_short(directory)} cannot be created: {_short(blocked)} is a file, not "
                              f"a directory; choose another --out.")
    taken, created = [], []
    _room_for(len(wanted))
    try:
        for directory in wanted:
            real = os.path.realpath(directory)
            if real not in _held:
                created += _makedirs(real)
                _held[real] = [_acquire(real, directory), 0]
            _held[real][1] += 1
            taken.append(real)
        yield
    finally:
        for real in reversed(taken):
            _held[real][1] -= 1
            if _held[real][1] == 0:
                _release(real, _held.pop(real)[0])
        for directory in reversed(created):
            with contextlib.suppress(OSError):  # not empty: the run wrote into it
                os.rmdir(directory)


def _acquire(real: str, shown: str) -> int:
    path = os.path.join(real, LOCK_NAME)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the directory was removed meanwhile (a refused run cleaning up)
            _makedirs(real)
            continue
        except OSError as e:  # ELOOP: a link planted as the lock file (it would truncate what it points to)
            raise ConfigError(f"{os.path.join(shown, LOCK_NAME)!r} cannot be opened as the run directory's lock "
                              f"({e.strerror or e}); remove it.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise ConfigError(f"run directory {shown!r} is in use by another fljax process"
                              f"{f' (pid {pid})' if pid.isdigit() else ''}; wait for it to end or choose another "
                              f"--out.") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the previous owner removed this file on release: lock the one now at the path


def _release(real: str, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(real, LOCK_NAME))
    os.close(fd)


def _makedirs(path: str) -> list[str]:
    """Create ``path`` and its missing parents; return the directories created (outermost first). A path that
    cannot be created (a file in the way, a name too long, no permission) is refused in one line naming it, and
    the directories this call created are removed again."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    created = []
    try:
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory)
                created.append(directory)
    except OSError as e:
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        raise ConfigError(f"cannot create the run directory {_short(missing[0])}: {e.strerror or e}; choose "
                          f"another --out.") from None
    return created


def _file_in_the_way(path: str) -> str | None:
    """The part of ``path`` (as given) that exists but is not a directory, if any."""
    while path and not os.path.isdir(path):
        if os.path.lexists(path):
            return path
        path = os.path.dirname(path)
    return None


def _short(path: str, limit: int = 120) -> str:
    """A path for a message: quoted, its middle cut when it is long."""
    text = repr(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]}"


def _room_for(count: int) -> None:
    """Raise the soft limit of open files when a large sweep needs more lock files than it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = len(_held) + count + 256
    if soft != resource.RLIM_INFINITY and need > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))
