"""Evaluation records as TensorBoard scalars, written by tensorboardX (the ``explore`` extra:
``pip install 'fljax[explore]'``).

One event-file directory per run and seed, ``<logdir>/<run>/seed_<s>/``, so TensorBoard overlays the algorithms
of a comparison or the points of a sweep; every numeric metric of a record is a scalar at step = round
(``personal_acc``, ``global_acc``, ``train_loss``, ``bytes_up``, …, and the extras an algorithm logs).
"""
from __future__ import annotations

import math
import os
import tempfile

from fljax.errors import ConfigError
from fljax.options import show

__all__ = ["TensorBoard"]


def _writable(logdir) -> str:
    """``logdir`` as a path, checked before the run starts: a directory, or a path whose nearest existing parent is
    a directory where this process can create files, and whose every name fits the file system (``NAME_MAX``,
    ``PATH_MAX``). The parent is tried for real — a permission check alone passes for root everywhere, /proc
    included — by opening a temporary file in it that is removed at once (unnamed, ``O_TMPFILE``, where the file
    system supports it: then it never appears); nothing else is created here (the writers create their
    directories at their first record)."""
    try:
        path = os.fspath(logdir)
    except TypeError:
        raise ConfigError(f"--tensorboard must be a directory path, got {show(logdir)}.") from None
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(f"--tensorboard must be a directory path, got {show(logdir)}.")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--tensorboard {show(path)} is a file, not a directory; choose a directory for the event "
                          f"files.")
    parent = path
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    parent = parent or "."
    if not os.path.isdir(parent):
        raise ConfigError(f"--tensorboard {show(path)}: {show(parent)} is a file, not a directory.")
    name_max, path_max = (_limit(parent, name, default) for name, default in (("PC_NAME_MAX", 255),
                                                                              ("PC_PATH_MAX", 4096)))
    long = next((part for part in path.split(os.sep) if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise ConfigError(f"--tensorboard {show(path)}: the name {show(long)} is {len(os.fsencode(long)):,} bytes "
                          f"long, more than the {name_max} the file system allows; choose a shorter one.")
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        raise ConfigError(f"--tensorboard {show(path)} is {len(os.fsencode(os.path.abspath(path))):,} bytes long "
                          f"(as an absolute path), more than the {path_max - 1} the file system allows; choose a "
                          f"shorter path.")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ConfigError(f"--tensorboard {show(path)}: no file can be created in {show(parent)} "
                          f"({e.strerror or e}); choose another directory.") from None
    return path


def _limit(directory: str, name: str, default: int) -> int:
    """The file system's ``os.pathconf`` limit ``name`` where ``directory`` is (``default`` where it gives none)."""
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


class TensorBoard:
    """Writers by (run, seed), opened on their first record; :meth:`close` flushes and closes them."""

    def __init__(self, logdir: str):
        self.logdir = _writable(logdir)
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ConfigError("--tensorboard needs tensorboardX, which is not installed: pip install "
                              "'fljax[explore]' (or pip install tensorboardX).") from None
        self._make = SummaryWriter
        self._writers: dict = {}

    def write(self, run: str, seed: int, record: dict) -> None:
        from fljax.runner.directories import dir_name

        key = (run, seed)
        if key not in self._writers:
            self._writers[key] = self._make(os.path.join(self.logdir, dir_name(run), f"seed_{seed}"))
        writer = self._writers[key]
        for name, value in record.items():
            if name != "round" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                writer.add_scalar(name, value, global_step=record["round"])
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
