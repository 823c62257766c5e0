"""Seeds of one experiment: which seeds, their data, and whether they run vectorised or one after another.

Seed sweep ``seeds: N`` runs seeds ``seed, seed+1, ..., seed+N-1``. The data seed is ``data.seed`` when set (every
run seed then shares one data set and partition) and otherwise follows the run seed (each seed draws its own
partition). The seeds run as ONE compiled program, vmapped over a leading seed axis of the state
(:class:`fljax.engine.Lanes`), when

* the executor is jitted on one device (``vmap`` or ``chunked``; not ``loop`` or ``sharded``), and
* every seed has the same data, or per-seed data of identical shapes (for example an ``iid`` split, whose client
  sizes do not depend on the seed); no padding is added, since padding would change the batch schedules and
  with them the results;
* when resuming, every seed's checkpoint is at the same round.

Otherwise they run one after another (sharing compiled programs whenever they share the data).
"""
from __future__ import annotations

import dataclasses
import json

from fljax.config import ExperimentConfig, to_dict
from fljax.data import FederatedData

__all__ = ["seed_list", "DataCache", "data_seed"]


def seed_list(cfg: ExperimentConfig) -> list[int]:
    return [cfg.seed + i for i in range(cfg.seeds)]


def data_seed(cfg: ExperimentConfig, seed: int) -> int:
    return seed if cfg.data.seed is None else cfg.data.seed


class DataCache:
    """Federated data sets by (data config, data seed), built once and shared between seeds and algorithms."""

    def __init__(self):
        self._cache: dict = {}

    def __call__(self, cfg: ExperimentConfig, seed: int) -> FederatedData:
        from fljax.api import load_data

        key = (json.dumps(to_dict(cfg.data), sort_keys=True), data_seed(cfg, seed))
        if key not in self._cache:
            self._cache[key] = load_data(dataclasses.replace(cfg, seed=seed))
        return self._cache[key]
