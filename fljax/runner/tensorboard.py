"""Evaluation records as TensorBoard scalars, written by tensorboardX (the ``explore`` extra:
``pip install 'fljax[explore]'``).

One event-file directory per run and seed, ``<logdir>/<run>/seed_<s>/``, so TensorBoard overlays the algorithms
of a comparison or the points of a sweep; every numeric metric of a record is a scalar at step = round
(``personal_acc``, ``global_acc``, ``train_loss``, ``bytes_up``, …, and the extras an algorithm logs).
"""
from __future__ import annotations

import math
import os

__all__ = ["TensorBoard"]


class TensorBoard:
    """Writers by (run, seed), opened on their first record; :meth:`close` flushes and closes them."""

    def __init__(self, logdir: str):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ImportError("--tensorboard needs tensorboardX: pip install 'fljax[explore]' (or pip install "
                              "tensorboardX).") from None
        self.logdir = os.fspath(logdir)
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
