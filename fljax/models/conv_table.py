"""Which convolution form ``conv_impl: auto`` runs, read from committed measurements.

``conv_forms.json`` (beside this module) holds rows measured by ``benchmarks/conv_forms.py`` (CPU, this project's
2-core machine) and by ``bash benchmarks/gpu.sh`` (GPU rows; the script writes them into the file): for a backend,
a model, a kind of executor ('vectorised': vmap, chunked, sharded; 'loop': one client at a time) and a number of
clients side by side, the FedAvg client-steps/s of each form (:data:`fljax.models.layers.CONV_FORMS`).

:func:`choose` picks, for a backend and an executor kind, the form with the highest score over the rows of the
model itself (or, when it has none, over all the backend's rows: a form fast on every measured CNN), where a
form's score is the sum over the measured workloads (model, clients) of its client-steps/s as a fraction of that
workload's fastest form. A backend may be *pinned* (the table's ``pinned`` entry, with its reason): the CPU is, to
the forms it ran before the table existed, so that CPU results published with them keep their bits (the forms
compute the same function but round differently); its measured rows stay in the table for whoever sets
``conv_impl`` by hand. A backend without rows keeps the rule measured before the table existed:
``patches`` when clients are vectorised, ``native`` one client at a time (:data:`FALLBACK`). A model of your own
(``Model.conv_forms`` False) runs its convolutions as written.
"""
from __future__ import annotations

import functools
import json
import os

__all__ = ["TABLE", "FALLBACK", "rows", "pinned", "choose", "executor_kind"]

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_forms.json")
FALLBACK = {"vectorised": "patches", "loop": "native"}


@functools.lru_cache(maxsize=1)
def _read(path: str = TABLE) -> dict:
    with open(path) as f:
        return json.load(f)


def _load() -> tuple:
    return tuple(_read()["rows"])


def pinned(backend: str) -> dict:
    """The forms a backend is pinned to ({executor kind: form, 'why': reason}; empty when it is not)."""
    return _read().get("pinned", {}).get(backend, {})


def rows(backend: str | None = None, kind: str | None = None) -> list[dict]:
    """The committed rows, optionally of one backend ('cpu', 'gpu', 'tpu') and executor kind."""
    return [r for r in _load() if backend in (None, r["backend"]) and kind in (None, r["executor"])]


def executor_kind(vectorised: bool) -> str:
    return "vectorised" if vectorised else "loop"


def choose(backend: str, model: str, vectorised: bool) -> str:
    """The form ``auto`` runs for ``model`` (a zoo name) on ``backend`` under an executor that vectorises clients
    (``vectorised``) or runs them one at a time (module docstring)."""
    kind = executor_kind(vectorised)
    if kind in pinned(backend):
        return pinned(backend)[kind]
    table = rows(backend, kind)
    if not table:
        return FALLBACK[kind]
    table = [r for r in table if r["model"] == model] or table
    score: dict = {}
    for workload in sorted({(r["model"], r["clients"]) for r in table}):
        group = [r for r in table if (r["model"], r["clients"]) == workload]
        best = max(r["client_steps_per_s"] for r in group)
        for r in group:
            score[r["form"]] = score.get(r["form"], 0.0) + r["client_steps_per_s"] / best
    return max(score, key=score.get)
