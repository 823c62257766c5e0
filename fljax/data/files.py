"""Your own data, one client at a time, from files (``dataset: files``): a folder with one ``.npz`` per client, or one
table (``.csv``, or ``.parquet`` with pyarrow installed) with a client-id column.

* **Folder of .npz**: every ``<client>.npz`` holds ``x`` (one row per sample: features, an image, or token ids) and
  ``y`` (integer labels ``[n]``, or next-token targets ``[n, T]`` with integer ``x [n, T]``: a language-model data
  set in the layout of :mod:`fljax.data.text`); optionally ``x_test`` and ``y_test``, its own test split (every
  file or none). Clients are the files, by name.
* **Table**: one row per sample; ``client_column`` names the client, ``label_column`` the integer label, every other
  column (all numeric) is a feature; ``split_column``, when set, marks each row ``train`` or ``test`` (the clients'
  own test splits; otherwise the data config's ``test_fraction`` is held out).

With fewer clients asked than the files hold, a seeded random choice of them is used (every run seed draws its own
unless ``data.seed`` is set). Nothing is written. Every problem is refused in one line naming the file. The module
registers the data set ``files`` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import os
import zipfile

import numpy as np

from fljax.data import memory, text
from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Natural, Samples
from fljax.options import Options, at_least, option

__all__ = ["FilesOptions", "load_files", "FILES_MAX_CLIENTS"]

FILES_MAX_CLIENTS = 10_000_000  # the files say how many clients they hold; checked when they are read


@dataclasses.dataclass(frozen=True)
class FilesOptions(Options):
    """Options of your own per-client files."""

    path: str | None = option(None, "a folder of <client>.npz files, or a .csv / .parquet table with a client column")
    client_column: str = option("client", "tables: the column naming each row's client")
    label_column: str = option("label", "tables: the column of integer labels")
    split_column: str | None = option(None, "tables: a column marking each row train or test (null: hold out "
                                            "test_fraction of every client)")
    num_classes: int | None = option(None, "number of classes (null: 1 + the largest label; token data: the "
                                           "vocabulary, 1 + the largest id)", at_least(2))


def _error(message: str):
    return DataError(f"files: {message}")


def _npz_clients(folder: str) -> dict[str, dict]:
    paths = sorted(glob.glob(os.path.join(folder, "*.npz")))
    if not paths:
        raise _error(f"no <client>.npz files in {folder!r}; put one file per client there (arrays x and y).")

    clients, declared = {}, 0
    for path in paths:
        name = os.path.basename(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                if not hasattr(f, "files"):
                    raise ValueError("it holds one array, not arrays named x and y (np.savez writes those)")
                declared += _declared_bytes(f)  # a compressed file can declare far more than its size
                memory.check_bytes(2 * declared, "make the client files smaller (data.path)",
                                   f"the arrays of the client files read so far ({name} the last)")
                arrays = {k: f[k] for k in f.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            if isinstance(e, DataError):  # the memory check's own refusal
                raise
            raise _error(f"cannot read {name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}.") from None
        missing = {"x", "y"} - set(arrays)
        if missing:
            raise _error(f"{name} lacks {sorted(missing)}; every client file holds arrays x and y.")
        if ("x_test" in arrays) != ("y_test" in arrays):
            raise _error(f"{name} holds only one of x_test and y_test; give both or neither.")
        clients[name[:-4]] = arrays
    with_test = {k for k, a in clients.items() if "x_test" in a}
    if with_test and len(with_test) < len(clients):
        raise _error(f"{sorted(set(clients) - with_test)[0]}.npz has no x_test/y_test but others do; give every "
                     f"client a test split or none.")
    return clients


def _declared_bytes(npz) -> int:
    """The bytes the arrays of an open ``.npz`` declare in their headers (shape × item size), read before any of
    them is: a compressed member of zeros can declare terabytes in a file of kilobytes."""
    total = 0
    for member in npz.zip.namelist():
        with npz.zip.open(member) as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
        total += int(np.prod(shape, dtype=object)) * dtype.itemsize
    return total


def _read_table(path: str) -> dict[str, np.ndarray]:
    """Columns of a CSV or Parquet table as numpy arrays (numbers where a column parses as numbers)."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise _error("reading Parquet needs the package pyarrow, which is not installed (pip install pyarrow), "
                         "or give a .csv table.") from None
        table = pq.read_table(path)
        return {name: np.asarray(table.column(name).to_numpy(zero_copy_only=False)) for name in table.column_names}
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise _error(f"{os.path.basename(path)} has no rows under its header.")
    header, body = rows[0], rows[1:]
    bad = next((i for i, r in enumerate(body) if len(r) != len(header)), None)
    if bad is not None:
        raise _error(f"{os.path.basename(path)} row {bad + 2} has {len(body[bad])} fields, the header "
                     f"{len(header)}.")
    columns = {}
    for j, name in enumerate(header):
        values = [r[j] for r in body]
        try:
            columns[name] = np.asarray(values, np.float64)
        except ValueError:
            columns[name] = np.asarray(values, object)
    return columns


def _table_clients(path: str, o: FilesOptions) -> dict[str, dict]:
    name = os.path.basename(path)
    columns = _read_table(path)
    for key, column in (("client_column", o.client_column), ("label_column", o.label_column),
                        ("split_column", o.split_column)):
        if column is not None and column not in columns:
            raise _error(f"{name} has no column {column!r} (data.{key}); its columns: {sorted(columns)}.")
    features = [c for c in columns if c not in (o.client_column, o.label_column, o.split_column)]
    text_columns = [c for c in features if columns[c].dtype == object]
    if text_columns or not features:
        raise _error(f"{name}: every column but the client, label and split columns must be numeric, got "
                     f"{text_columns or 'no feature columns'}.")
    labels = columns[o.label_column]
    if labels.dtype == object or not np.all(labels == np.round(labels)):
        raise _error(f"{name}: column {o.label_column!r} must hold integer labels.")
    x = np.stack([columns[c] for c in features], axis=1).astype(np.float32)
    y = labels.astype(np.int64)
    owner = np.asarray([str(v) for v in columns[o.client_column]])
    test = np.zeros(len(y), bool)
    if o.split_column is not None:
        split = np.asarray([str(v) for v in columns[o.split_column]])
        unknown = sorted(set(split) - {"train", "test"})
        if unknown:
            raise _error(f"{name}: column {o.split_column!r} must say train or test, got {unknown[:3]}.")
        test = split == "test"
    clients = {}
    for client in sorted(set(owner)):
        mine = owner == client
        arrays = {"x": x[mine & ~test], "y": y[mine & ~test]}
        if o.split_column is not None:
            arrays.update(x_test=x[mine & test], y_test=y[mine & test])
        clients[client] = arrays
    return clients


def _check(name: str, x: np.ndarray, y: np.ndarray, shape, what: str):
    if len(x) != len(y):
        raise _error(f"client {name!r}: {what} x has {len(x)} rows, y {len(y)}.")
    if len(y) == 0:
        raise _error(f"client {name!r} has no {what} samples; every client needs at least one.")
    if not np.issubdtype(y.dtype, np.integer):
        raise _error(f"client {name!r}: {what} y must hold integer labels, got {y.dtype}.")
    if x.shape[1:] != shape[0] or y.shape[1:] != shape[1]:
        raise _error(f"client {name!r}: {what} samples of shape {x.shape[1:]} with labels {y.shape[1:]}, the first "
                     f"client's are {shape[0]} with {shape[1]}; every sample must have one shape.")
    if not np.issubdtype(x.dtype, np.integer) and not np.all(np.isfinite(x)):
        raise _error(f"client {name!r}: {what} x holds NaN or Inf.")


def load_files(o: FilesOptions, num_clients: int, seed: int):
    """The clients of ``o.path`` (module docstring) as a :class:`~fljax.data.types.Natural` data set."""
    if o.path is None:
        raise _error("set data.path to a folder of <client>.npz files or to a .csv / .parquet table with a client "
                     "column.")
    if os.path.isdir(o.path):
        clients = _npz_clients(o.path)
    elif os.path.isfile(o.path) and o.path.endswith((".csv", ".parquet")):
        clients = _table_clients(o.path, o)
    else:
        raise _error(f"data.path {o.path!r} is neither a folder of .npz files nor a .csv / .parquet table.")
    if num_clients > len(clients):
        raise _error(f"{o.path!r} holds {len(clients)} clients, fewer than data.num_clients={num_clients}.")
    names = sorted(clients)
    if num_clients < len(names):
        names = sorted(np.random.default_rng(seed).permutation(names)[:num_clients])
    first = clients[names[0]]
    shape = (first["x"].shape[1:], first["y"].shape[1:])
    tokens = len(shape[1]) == 1
    if len(shape[1]) > 1 or (tokens and (shape[0] != shape[1] or not np.issubdtype(first["x"].dtype, np.integer))):
        raise _error(f"client {names[0]!r}: labels must be one integer per sample, or next-token targets [n, T] "
                     f"with integer token ids x [n, T]; got x {first['x'].shape} and y {first['y'].shape}.")
    own_test = "x_test" in first
    for name in names:
        a = clients[name]
        _check(name, a["x"], a["y"], shape, "train")
        if own_test:
            _check(name, a["x_test"], a["y_test"], shape, "test")
    parts = ("x", "y") + (("x_test", "y_test") if own_test else ())
    x, y, *test = (np.concatenate([clients[n][k] for n in names]) for k in parts)
    ids = [y, *test[1:]] + ([x, *test[:1]] if tokens else [])  # labels, and token ids for token data
    lowest, largest = min(int(a.min()) for a in ids), max(int(a.max()) for a in ids)
    classes = o.num_classes if o.num_classes is not None else largest + 1
    if lowest < 0 or largest >= classes:
        raise _error(f"labels{' and token ids' if tokens else ''} must lie in [0, {classes}) (num_classes), got "
                     f"{lowest} to {largest}.")
    x = x.astype(np.int32) if tokens else x.astype(np.float32)
    counts = np.asarray([len(clients[n]["y"]) for n in names], np.int32)
    split = None
    if own_test:
        test_x = test[0].astype(x.dtype)
        split = Samples(test_x, test[1].astype(np.int32), np.asarray([len(clients[n]["y_test"]) for n in names],
                                                                      np.int32))
    input_shape = text.TokenShape(shape[0][0], classes) if tokens else None
    return Natural(x, y.astype(np.int32), counts, classes, f"files:{os.path.basename(os.path.normpath(o.path))}",
                   test=split, input_shape=input_shape)


register_source("files", Source(
    "your own per-client files: a folder of <client>.npz (x, y) or a .csv / .parquet table with a client column "
    "(offline, path)", FilesOptions, load_files, lambda o: FILES_MAX_CLIENTS, None, 0, natural=True))
