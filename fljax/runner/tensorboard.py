"""Evaluation records as TensorBoard scalars, written by tensorboardX (the ``explore`` extra:
``pip install 'fljax[explore]'``).

One event-file directory per run and seed, ``<logdir>/<run>/seed_<s>/``, so TensorBoard overlays the algorithms
of a comparison or the points of a sweep; every numeric metric of a record is a scalar at step = round
(``personal_acc``, ``global_acc``, ``train_loss``, ``bytes_up``, …, and the extras an algorithm logs).
"""
from __future__ import annotations

import math
import os

from fljax.errors import ConfigError
from fljax.options import show

__all__ = ["TensorBoard"]


def _writable(logdir) -> str:
    """``logdir`` as a path, checked before the run starts (nothing is created here: the writers create their
    directories at their first record): a directory, or a path whose nearest existing parent is a directory this
    process may write into."""
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
    if parent and not os.path.isdir(parent):
        raise ConfigError(f"--tensorboard {show(path)}: {show(parent)} is a file, not a directory.")
    if not os.access(parent or ".", os.W_OK | os.X_OK):
        raise ConfigError(f"--tensorboard {show(path)}: {show(parent)} is not writable by this user; choose "
                          f"another directory.")
    return path


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
        from fljax.runner.experiment import dir_name

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
