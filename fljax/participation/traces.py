"""FedScale's device traces: read, write and generate files of its two formats.

FedScale (Lai et al., ICML 2022) ships two traces of real devices, each a pickled dictionary keyed by client id
(FedScale's ``benchmark/dataset/data/device_info/README.md``; the files themselves are downloaded with FedScale's
benchmark data, see docs/heterogeneity.md):

* ``client_device_capacity``: ``{client: {'computation': ms per sample, 'communication': kbit/s}}`` — a device's
  inference latency per training sample and its bandwidth;
* ``client_behave_trace``: ``{client: {'active': [s, …], 'inactive': [s, …], 'finish_time': s, …}}`` — the device
  is available from each ``active[k]`` to ``inactive[k]`` (both inclusive, as FedScale's ``is_active``), the pattern
  repeating every ``finish_time`` seconds (FedScale reads a time t as t mod finish_time). Other keys (``duration``,
  ``model``) are ignored.

fljax maps client i (0-based) to the i-th record in ascending key order; a trace with fewer records than the
population is refused (FedScale wraps around, client mod records). The reader unpickles plain containers and numbers
only (a restricted unpickler: a pickle cannot run code here), checks every record and refuses, in one line naming the
file and the client, what a simulation cannot use (a negative or zero speed, intervals out of order). :func:`generate`
writes small files of both formats (synthetic devices, for tests and examples).
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle

import numpy as np

from fljax.errors import OptionError
from fljax.options import show

__all__ = ["BehaveTrace", "Capacity", "read_behave_trace", "read_capacity", "write_trace", "synthetic_behave_trace",
           "synthetic_capacity", "generate"]

# what a trace pickle may hold: containers, numbers, strings and numpy scalars (FedScale's files hold no more)
_SAFE = {("builtins", name) for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bool",
                                         "complex")} | {
    (module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray") for name in ("scalar",)} | {
    ("numpy", "dtype")}


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it references {module}.{name}, which a trace does not hold")


def _read(path: str, key: str) -> dict:
    """The dictionary a trace file holds (a one-line :class:`OptionError` on ``key`` otherwise)."""
    if not isinstance(path, str) or not path:
        raise OptionError(key, f"must be the path of a FedScale trace file, got {show(path)}.")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise OptionError(key, f"cannot read {path!r}: {e.strerror or e}.") from None
    try:
        value = _Restricted(io.BytesIO(raw)).load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise OptionError(key, f"{path!r} is not a FedScale trace (a pickled dictionary): {e}.") from None
    if not isinstance(value, dict) or not value:
        raise OptionError(key, f"{path!r} must hold a non-empty dictionary of clients, got {show(type(value))}.")
    return value


def _records(trace: dict) -> list[tuple]:
    """(client key, record) in ascending key order (numeric keys numerically; mixed keys as text)."""
    try:
        keys = sorted(trace)
    except TypeError:
        keys = sorted(trace, key=str)
    return [(k, trace[k]) for k in keys]


def _number(value, what: str, path: str, key: str, client) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not math.isfinite(float(value)):
        raise OptionError(key, f"client {client!r} in {path!r}: {what} must be a finite number, got {show(value)}.")
    return float(value)


@dataclasses.dataclass(frozen=True, eq=False)
class Capacity:
    """Device speeds, one entry per record in key order: ``ms_per_sample`` [n] and ``kbps`` [n]."""

    ms_per_sample: np.ndarray
    kbps: np.ndarray

    @property
    def clients(self) -> int:
        return len(self.kbps)


def read_capacity(path: str, key: str = "capacity_trace") -> Capacity:
    """A ``client_device_capacity`` file: every record's ``computation`` (ms per sample) and ``communication``
    (kbit/s), both positive."""
    trace = _read(path, key)
    ms, kbps = [], []
    for client, record in _records(trace):
        if not isinstance(record, dict) or not {"computation", "communication"} <= set(record):
            raise OptionError(key, f"client {client!r} in {path!r} must hold 'computation' and 'communication', got "
                                   f"{show(record)}.")
        for name, out, unit in (("computation", ms, "ms per sample"), ("communication", kbps, "kbit/s")):
            value = _number(record[name], name, path, key, client)
            if value <= 0:
                raise OptionError(key, f"client {client!r} in {path!r} has {name} {value:g} {unit}; every device "
                                       f"needs a positive computation time and bandwidth.")
            out.append(value)
    return Capacity(np.asarray(ms, np.float64), np.asarray(kbps, np.float64))


@dataclasses.dataclass(frozen=True, eq=False)
class BehaveTrace:
    """Availability intervals, one row per record in key order: ``active`` and ``inactive`` [n, K] seconds within a
    period (padded rows: active +inf, inactive −inf, never available), ``finish`` [n] each record's period."""

    active: np.ndarray
    inactive: np.ndarray
    finish: np.ndarray

    @property
    def clients(self) -> int:
        return len(self.finish)


def read_behave_trace(path: str, key: str = "behave_trace") -> BehaveTrace:
    """A ``client_behave_trace`` file: every record's ``active`` and ``inactive`` lists (equal lengths, ascending,
    each interval within ``[0, finish_time]``) and its positive ``finish_time``."""
    trace = _read(path, key)
    rows = []
    for client, record in _records(trace):
        if not isinstance(record, dict) or not {"active", "inactive", "finish_time"} <= set(record):
            raise OptionError(key, f"client {client!r} in {path!r} must hold 'active', 'inactive' and 'finish_time', "
                                   f"got {show(record)}.")
        on, off = record["active"], record["inactive"]
        if not isinstance(on, (list, tuple)) or not isinstance(off, (list, tuple)) or len(on) != len(off):
            raise OptionError(key, f"client {client!r} in {path!r}: 'active' and 'inactive' must be lists of equal "
                                   f"length, got {show(on)} and {show(off)}.")
        finish = _number(record["finish_time"], "finish_time", path, key, client)
        on = [_number(v, "active", path, key, client) for v in on]
        off = [_number(v, "inactive", path, key, client) for v in off]
        ends = [v for pair in zip(on, off) for v in pair]
        if finish <= 0 or any(b < a for a, b in zip(ends, ends[1:])) or (ends and (ends[0] < 0 or ends[-1] > finish)):
            raise OptionError(key, f"client {client!r} in {path!r}: its intervals must satisfy 0 <= active[0] <= "
                                   f"inactive[0] <= active[1] <= ... <= finish_time > 0, got active {show(on)}, "
                                   f"inactive {show(off)}, finish_time {finish:g}.")
        rows.append((on, off, finish))
    width = max(1, max(len(on) for on, _, _ in rows))
    active = np.full((len(rows), width), np.inf)
    inactive = np.full((len(rows), width), -np.inf)
    for i, (on, off, _) in enumerate(rows):
        active[i, :len(on)], inactive[i, :len(off)] = on, off
    finish = np.asarray([f for _, _, f in rows], np.float64)
    if not np.isfinite(active).any():
        raise OptionError(key, f"{path!r}: no client is ever available (every 'active' list is empty).")
    return BehaveTrace(active, inactive, finish)


# ------------------------------------------------------------------------------------------------------- writing


def write_trace(path: str, trace: dict) -> str:
    """Pickle ``trace`` (a dictionary of records) to ``path``, as FedScale's files are; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(trace, f, protocol=4)
    return path


def synthetic_capacity(num_clients: int, seed: int = 0, ms_per_sample: float = 5.0, kbps: float = 5000.0,
                       sigma: float = 0.6) -> dict:
    """A ``client_device_capacity`` dictionary of ``num_clients`` devices (keys 1 … n, as FedScale's): log-normal
    computation and communication around the medians ``ms_per_sample`` and ``kbps`` (σ = ``sigma`` of their
    logarithms)."""
    rng = np.random.default_rng(seed)
    ms = ms_per_sample * np.exp(sigma * rng.standard_normal(num_clients))
    bw = kbps * np.exp(sigma * rng.standard_normal(num_clients))
    return {i + 1: {"computation": float(ms[i]), "communication": float(bw[i])} for i in range(num_clients)}


def synthetic_behave_trace(num_clients: int, seed: int = 0, finish_time: float = 86400.0, mean_on: float = 7200.0,
                           mean_off: float = 14400.0) -> dict:
    """A ``client_behave_trace`` dictionary of ``num_clients`` devices (keys 1 … n): within one period of
    ``finish_time`` seconds each device alternates exponentially long on and off spells (means ``mean_on`` and
    ``mean_off`` seconds) from a random first state, recorded as integer seconds like FedScale's."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(num_clients):
        on, off, t, up = [], [], 0.0, bool(rng.random() < mean_on / (mean_on + mean_off))
        while t < finish_time:
            spell = rng.exponential(mean_on if up else mean_off)
            end = min(finish_time, t + max(1.0, spell))
            if up:
                on.append(int(t))
                off.append(int(end))
            t, up = end, not up
        out[i + 1] = {"duration": int(sum(b - a for a, b in zip(on, off))), "inactive": off,
                      "finish_time": int(finish_time), "active": on, "model": "synthetic"}
    return out


def generate(directory: str, num_clients: int, seed: int = 0) -> tuple[str, str]:
    """Write ``client_behave_trace`` and ``client_device_capacity`` files of ``num_clients`` synthetic devices into
    ``directory`` (:func:`synthetic_behave_trace`, :func:`synthetic_capacity`); returns their paths."""
    return (write_trace(os.path.join(directory, "client_behave_trace"), synthetic_behave_trace(num_clients, seed)),
            write_trace(os.path.join(directory, "client_device_capacity"), synthetic_capacity(num_clients, seed)))
