"""FEMNIST from LEAF's JSON files, split by writers (QuPeD spec §9, D23).

LEAF (Caldas et al. 2018) stores FEMNIST as JSON files, each ``{"users": [...], "num_samples": [...],
"user_data": {writer: {"x": [[784 pixels in [0, 1]], ...], "y": [labels]}}}``, labels 0-9 digits, 10-35 upper-case
and 36-61 lower-case letters. The reader never downloads: point ``data_dir`` at a directory of these files (LEAF's
``data/femnist/data/all_data`` after its preprocessing script). Clients: the writers (those with a sample of the
kept classes) are shuffled with the data seed and client i takes writers ``[w·i, w·i + w)``, ``w =
writers_per_client`` (QuPeD: 3 writers per client, 66 clients); the per-client test split is the data config's
stratified ``test_fraction`` hold-out (QuPeD: 0.1). Images are 28×28×1 float32. ``femnist`` keeps the 10 digit
classes (D23), ``femnist62`` all 62 (D23's option).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np

from fljax.options import Options, at_least, option

__all__ = ["LeafOptions", "femnist", "LEAF_FEMNIST_WRITERS"]

LEAF_FEMNIST_WRITERS = 3_597  # writers in LEAF's full FEMNIST


@dataclasses.dataclass(frozen=True)
class LeafOptions(Options):
    """Options of LEAF's FEMNIST."""

    data_dir: str | None = option(None, "directory of LEAF's FEMNIST JSON files (data/femnist/data/all_data)")
    writers_per_client: int = option(3, "writers pooled into one client (QuPeD: 3)", at_least(1))


def femnist(data_dir: str | None, num_clients: int, seed: int, writers_per_client: int = 3,
            num_classes: int = 10):
    """The clients of FEMNIST (module docstring): ``num_classes`` 10 keeps the digits, 62 every class."""
    from fljax.data.sources import DataError, Natural

    if data_dir is None:
        raise DataError("femnist reads LEAF's JSON files: set data.data_dir to the directory that holds them "
                        "(LEAF's data/femnist/data/all_data).")
    paths = sorted(glob.glob(os.path.join(data_dir, "*.json")))
    if not paths:
        raise DataError(f"femnist: no LEAF JSON files (*.json) in {data_dir!r}.")
    writers = {}
    for path in paths:
        with open(path) as f:
            blob = json.load(f)
        for user in blob["users"]:
            y = np.asarray(blob["user_data"][user]["y"], np.int32)
            keep = y < num_classes
            if keep.any():
                x = np.asarray(blob["user_data"][user]["x"], np.float32)[keep]
                writers[user] = (x.reshape(-1, 28, 28, 1), y[keep])
    need = num_clients * writers_per_client
    if len(writers) < need:
        raise DataError(f"femnist: {num_clients} clients x {writers_per_client} writers need {need} writers, "
                        f"{data_dir!r} holds {len(writers)}.")
    order = np.random.default_rng(seed).permutation(sorted(writers))[:need]
    groups = [order[i * writers_per_client:(i + 1) * writers_per_client] for i in range(num_clients)]
    counts = np.asarray([sum(len(writers[w][1]) for w in g) for g in groups], np.int32)
    x = np.concatenate([writers[w][0] for g in groups for w in g])
    y = np.concatenate([writers[w][1] for g in groups for w in g])
    return Natural(x, y, counts, num_classes, "femnist" if num_classes == 10 else "femnist62")
