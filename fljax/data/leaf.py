"""LEAF's JSON files (Caldas et al. 2018): FEMNIST, Shakespeare and Sent140 with their natural clients.

LEAF stores a data set as JSON files, each ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
"y": [...]}}}``. The readers never download: run LEAF's ``preprocess.sh`` for the data set on a machine with network
and point ``data_dir`` at the directory of JSON files it writes (``data/<name>/data/all_data``).

* **FEMNIST** (QuPeD spec §9, D23): x rows of 784 pixels in [0, 1], labels 0-9 digits, 10-35 upper-case and 36-61
  lower-case letters. The writers (those with a sample of the kept classes) are shuffled with the data seed and
  client i takes writers ``[w·i, w·i + w)``, ``w = writers_per_client`` (QuPeD: 3 writers per client, 66 clients).
  Images are 28×28×1 float32. ``femnist`` keeps the 10 digit classes (D23), ``femnist62`` all 62 (D23's option).
  ``source: standin`` draws writers from :func:`fljax.data.standins.emnist_writers` instead.
* **Shakespeare** (McMahan et al. 2017): one user per speaking role; LEAF stores every 80-character window of the
  role's text with the character that follows (x: the window, y: the next character). The reader chains the
  windows back into the role's text (a window that does not continue the previous one starts a new snippet), maps
  characters to ids (:data:`fljax.data.text.SHAKESPEARE_CHARS`, others to OOV) and cuts next-token sequences of
  ``seq_len`` as FedJAX does (:func:`fljax.data.text.chunk_snippets`).
* **Sent140** (Go et al. 2009): one user per Twitter account; x rows ``[id, date, query, user, text]``, y the
  sentiment (0 negative, 1 positive; raw Sentiment140's 4 reads as 1). Tweets become word ids of a vocabulary of the
  ``vocab`` most frequent words of all tweets read, as ``[BOS, w_1, …, EOS]`` truncated or padded to ``seq_len``.

Shakespeare and Sent140 are tokenised once and cached (:func:`fljax.data.text.cached_arrays`). Users with fewer
than two samples (no room for a test split) are dropped; the others are shuffled with the data seed and the first
``num_clients`` become the clients. The module registers the data sets ``femnist``, ``femnist62``, ``shakespeare``
and ``sent140`` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
from typing import Literal

import numpy as np

from fljax.data import memory, standins, text
from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Natural
from fljax.options import Options, at_least, option

__all__ = ["LeafOptions", "ShakespeareOptions", "Sent140Options", "femnist", "shakespeare", "sent140",
           "LEAF_FEMNIST_WRITERS", "LEAF_SHAKESPEARE_USERS", "LEAF_SENT140_USERS", "SHAKESPEARE_VOCAB"]

LEAF_FEMNIST_WRITERS = 3_597  # writers in LEAF's full FEMNIST
LEAF_SHAKESPEARE_USERS = 1_129  # speaking roles in LEAF's full Shakespeare
LEAF_SENT140_USERS = 660_120  # Twitter accounts in LEAF's full Sent140
SHAKESPEARE_VOCAB = text.vocab_size(len(text.SHAKESPEARE_CHARS))  # 90: PAD, BOS, EOS, 86 characters, OOV


def _data_dir(option_doc: str):
    return option(None, f"directory of LEAF's {option_doc} JSON files (read, never downloaded)")


def _cache_dir():
    return option(None, "where tokenised files are cached (null: $FLJAX_CACHE, else ~/.cache/fljax)")


@dataclasses.dataclass(frozen=True)
class LeafOptions(Options):
    """Options of LEAF's FEMNIST."""

    source: Literal["leaf", "standin"] = option("leaf", "leaf: LEAF's JSON files in data_dir; standin: seeded "
                                                        "stand-in writers with EMNIST-62's shapes (offline)")
    data_dir: str | None = _data_dir("FEMNIST (data/femnist/data/all_data)")
    writers_per_client: int = option(3, "writers pooled into one client (QuPeD: 3)", at_least(1))


@dataclasses.dataclass(frozen=True)
class ShakespeareOptions(Options):
    """Options of Shakespeare."""

    source: Literal["leaf", "standin"] = option("leaf", "leaf: LEAF's JSON files in data_dir; standin: seeded "
                                                        "stand-in speakers with Shakespeare's shapes (offline)")
    data_dir: str | None = _data_dir("Shakespeare (data/shakespeare/data/all_data)")
    seq_len: int = option(80, "characters per sequence (Reddi et al.: 80)", at_least(2))
    max_samples: int | None = option(None, "keep at most this many sequences of a speaker, its first (null: all)",
                                     at_least(2))
    cache_dir: str | None = _cache_dir()


@dataclasses.dataclass(frozen=True)
class Sent140Options(Options):
    """Options of Sent140."""

    data_dir: str | None = _data_dir("Sent140 (data/sent140/data/all_data)")
    seq_len: int = option(25, "tokens per tweet, BOS and EOS included (LEAF: 25 words)", at_least(3))
    vocab: int = option(10_000, "regular words in the vocabulary: the most frequent of all tweets read",
                        at_least(1))
    cache_dir: str | None = _cache_dir()


def _missing(name: str, where: str, script: str) -> str:
    """What to do when LEAF's files are absent (one line)."""
    return (f"set data.data_dir to the directory that holds them (LEAF's {where}, written by `{script}` in LEAF's "
            f"data/{name} on a machine with network)" + ("" if name == "sent140" else ", or use data.source=standin"))


def _json_paths(name: str, data_dir: str | None, where: str, script: str) -> list[str]:
    if data_dir is None:
        raise DataError(f"{name} reads LEAF's JSON files: {_missing(name, where, script)}.")
    paths = sorted(glob.glob(os.path.join(data_dir, "*.json")))
    if not paths:
        raise DataError(f"{name}: no LEAF JSON files (*.json) in {data_dir!r}; {_missing(name, where, script)}.")
    return paths


def _read(name: str, path: str) -> dict:
    """One LEAF file: valid JSON text holding a mapping with ``users`` (a list) and ``user_data`` (a mapping), or a
    one-line :class:`~fljax.data.types.DataError` naming the file."""

    def refuse(problem: str) -> DataError:
        return DataError(f"{name}: {path} {problem}; LEAF's preprocess.sh writes each file whole: write it again, or "
                         f"move it out of data.data_dir.")

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"{name}: {path} cannot be read ({e.strerror or e}).") from None
    if not raw.strip():
        raise refuse("is empty")
    try:
        blob = json.loads(raw)
    except UnicodeDecodeError:
        raise refuse("is not text (not UTF-8 JSON)") from None
    except json.JSONDecodeError as e:
        raise refuse(f"is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise refuse("nests too deeply to be LEAF's JSON") from None
    if not isinstance(blob, dict):
        raise refuse(f"holds a {type(blob).__name__}, not LEAF's mapping of users, num_samples and user_data")
    for key, kind in (("users", list), ("user_data", dict)):
        if key not in blob:
            raise refuse(f"has no {key!r} (LEAF's files hold users, num_samples and user_data)")
        if not isinstance(blob[key], kind):
            raise refuse(f"has {key!r} of type {type(blob[key]).__name__}, not a "
                         f"{'list' if kind is list else 'mapping'}")
    return blob


def _users(name: str, paths: list[str]):
    """(file, user, x, y) of every user of the files, in file order, checked: every listed user has an entry in
    ``user_data`` with lists ``x`` and ``y`` of equal length (one label per sample: a shorter ``y`` is refused, not
    zipped away). Errors name the file and the user."""
    for path in paths:
        blob = _read(name, path)
        for user in blob["users"]:
            where = f"{name}: {path}: user {user!r}"
            data = blob["user_data"].get(user) if isinstance(user, str) else None
            if data is None:
                raise DataError(f"{where} is listed in 'users' but has no entry in 'user_data'.")
            if not isinstance(data, dict) or not isinstance(data.get("x"), list) or not isinstance(data.get("y"),
                                                                                                   list):
                raise DataError(f"{where}: its user_data entry must be a mapping with lists 'x' and 'y', got "
                                f"{_kind(data)}.")
            if len(data["x"]) != len(data["y"]):
                raise DataError(f"{where} has {len(data['x'])} x rows and {len(data['y'])} y labels; LEAF pairs every "
                                f"x row with one label: write the file again.")
            yield path, user, data["x"], data["y"]


def _kind(value) -> str:
    """What a JSON value is, for a message: 'a list', 'a mapping with keys [...]', 'a str'."""
    if isinstance(value, dict):
        return f"a mapping with keys {sorted(map(str, value))[:5]}"
    return f"a {type(value).__name__}"


def _labels(name: str, path: str, user: str, y: list, allowed: str, valid) -> np.ndarray:
    """``y`` as int64 labels, each passing ``valid`` (an array test), or a one-line refusal naming file and user."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in y):
        bad = next(v for v in y if not isinstance(v, int) or isinstance(v, bool))
        raise DataError(f"{name}: {path}: user {user!r}: labels must be integers {allowed}, got {bad!r}.")
    labels = np.asarray(y, np.int64)
    if labels.size and not valid(labels).all():
        raise DataError(f"{name}: {path}: user {user!r}: labels must be {allowed}, got "
                        f"{sorted(set(labels[~valid(labels)].tolist()))[:5]}.")
    return labels


def _choose(name: str, counts: np.ndarray, num_clients: int, seed: int, data_dir: str) -> np.ndarray:
    """Indices of the clients: users with at least two samples, shuffled with the data seed, the first num_clients."""
    usable = np.flatnonzero(counts >= 2)
    if len(usable) < num_clients:
        raise DataError(f"{name}: {num_clients} clients need {num_clients} users with at least two samples, "
                        f"{data_dir!r} holds {len(usable)}; lower data.num_clients.")
    return np.sort(np.random.default_rng(seed).permutation(usable)[:num_clients])


def _rows(offsets: np.ndarray, counts: np.ndarray, cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Flat row indices of the chosen users' samples (their first ``cap`` each) and the counts kept."""
    kept = counts if cap is None else np.minimum(counts, cap)
    rows = np.repeat(offsets, kept) + np.arange(kept.sum()) - np.repeat(np.cumsum(kept) - kept, kept)
    return rows, kept


def femnist(data_dir: str | None, num_clients: int, seed: int, writers_per_client: int = 3,
            num_classes: int = 10, source: str = "leaf"):
    """The clients of FEMNIST (module docstring): ``num_classes`` 10 keeps the digits, 62 every class."""
    need = num_clients * writers_per_client
    name = "femnist" if num_classes == 10 else "femnist62"
    if source == "standin":
        xs, ys = standins.emnist_writers(need, seed, num_classes)
        writers = dict(enumerate(zip(xs, ys)))
        name += " (stand-in)"
    else:
        paths = _json_paths("femnist", data_dir, "data/femnist/data/all_data", "./preprocess.sh -s niid --sf 1.0 -k 0")
        writers = {}
        for path, user, xs, ys in _users("femnist", paths):
            y = _labels("femnist", path, user, ys, "in 0..61 (LEAF's 62 classes)",
                        lambda v: (v >= 0) & (v < 62)).astype(np.int32)
            keep = y < num_classes
            if keep.any():
                writers[user] = (_pixels(path, user, xs)[keep].reshape(-1, 28, 28, 1), y[keep])
        if len(writers) < need:
            raise DataError(f"femnist: {num_clients} clients x {writers_per_client} writers need {need} writers, "
                            f"{data_dir!r} holds {len(writers)}.")
    order = np.random.default_rng(seed).permutation(sorted(writers))[:need]
    groups = [order[i * writers_per_client:(i + 1) * writers_per_client] for i in range(num_clients)]
    counts = np.asarray([sum(len(writers[w][1]) for w in g) for g in groups], np.int32)
    x = np.concatenate([writers[w][0] for g in groups for w in g])
    y = np.concatenate([writers[w][1] for g in groups for w in g])
    return Natural(x, y, counts, num_classes, name)


def _pixels(path: str, user: str, xs: list) -> np.ndarray:
    """A FEMNIST writer's ``x``: rows of 784 numbers (28×28 pixels), as float32 ``[n, 784]``."""
    bad = next((i for i, row in enumerate(xs) if not isinstance(row, list) or len(row) != 784
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)), None)
    if bad is not None:
        row = xs[bad]
        raise DataError(f"femnist: {path}: user {user!r}: x[{bad}] must be a row of 784 pixel values (28×28), got "
                        f"{f'a row of {len(row)}' if isinstance(row, list) else _kind(row)}.")
    return np.asarray(xs, np.float32).reshape(-1, 784)


def _chained_snippets(xs: list[str], ys: list[str]) -> list[str]:
    """A role's text from LEAF's windows: window i + 1 continues window i when it equals window i without its first
    character, followed by y_i; a window that does not starts a new snippet."""
    snippets, current, previous = [], [], None
    for x, y in zip(xs, ys):
        if previous is None or x != previous[0][1:] + previous[1]:
            if current:
                snippets.append("".join(current))
            current = [x]
        current.append(y)
        previous = (x, y)
    if current:
        snippets.append("".join(current))
    return snippets


def _check_windows(path: str, user: str, xs: list, ys: list) -> None:
    """A Shakespeare role's samples: ``x`` rows are text windows, ``y`` the one character after each."""
    for which, rows, one in (("x", xs, False), ("y", ys, True)):
        bad = next((i for i, v in enumerate(rows) if not isinstance(v, str) or (one and len(v) != 1)), None)
        if bad is not None:
            want = "one character (the one after x's window)" if one else "a text window"
            raise DataError(f"shakespeare: {path}: user {user!r}: {which}[{bad}] must be {want}, got "
                            f"{rows[bad]!r:.60}.")


def _char_ids(snippet: str, table: np.ndarray) -> np.ndarray:
    """Ids of a snippet's characters (:func:`fljax.data.text.char_table`; characters beyond one byte are OOV)."""
    codes = np.fromiter(map(ord, snippet), np.int64, len(snippet))
    return np.where(codes < 256, table[np.minimum(codes, 255)], text.oov_id(SHAKESPEARE_VOCAB)).astype(np.int32)


def shakespeare(o: ShakespeareOptions, num_clients: int, seed: int):
    """The clients of Shakespeare (module docstring) from LEAF's files, or stand-in speakers
    (:func:`fljax.data.standins.shakespeare_speakers`)."""
    if o.source == "standin":
        xs, ys = standins.shakespeare_speakers(num_clients, seed, o.seq_len)
        counts = np.asarray([len(x) for x in xs], np.int64)
        x, y, name = np.concatenate(xs), np.concatenate(ys), "shakespeare (stand-in)"
        chosen = np.arange(num_clients)
    else:
        paths = _json_paths("shakespeare", o.data_dir, "data/shakespeare/data/all_data",
                            "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample")

        def build():
            table = text.char_table(text.SHAKESPEARE_CHARS)
            roles = []
            for path, user, x_rows, y_rows in _users("shakespeare", paths):
                _check_windows(path, user, x_rows, y_rows)
                roles.append([_char_ids(s, table) for s in _chained_snippets(x_rows, y_rows)])
            rows = sum(text.chunk_count([len(s) for s in snippets], o.seq_len) for snippets in roles)
            memory.check_bytes(text.sequence_bytes(rows, o.seq_len), "lower data.seq_len",
                               f"shakespeare's {rows:,} sequences of data.seq_len={o.seq_len:,} characters")
            xs, ys = zip(*(text.chunk_snippets(snippets, o.seq_len) for snippets in roles))
            return {"x": np.concatenate(xs), "y": np.concatenate(ys), "counts": np.asarray([len(a) for a in xs])}

        arrays = text.cached_arrays("shakespeare", paths, {"seq_len": o.seq_len, "version": 1}, build, o.cache_dir,
                                    keys=("x", "y", "counts"))
        x, y, counts, name = arrays["x"], arrays["y"], arrays["counts"].astype(np.int64), "shakespeare"
        chosen = _choose("shakespeare", counts, num_clients, seed, o.data_dir)
    rows, kept = _rows((np.cumsum(counts) - counts)[chosen], counts[chosen], o.max_samples)
    return Natural(x[rows], y[rows], kept.astype(np.int32), SHAKESPEARE_VOCAB, name,
                   input_shape=text.TokenShape(o.seq_len, SHAKESPEARE_VOCAB))


def sent140(o: Sent140Options, num_clients: int, seed: int):
    """The clients of Sent140 (module docstring)."""
    paths = _json_paths("sent140", o.data_dir, "data/sent140/data/all_data", "./preprocess.sh -s niid --sf 1.0 -k 0")

    def build():
        tweets, labels, counts = [], [], []
        for path, user, xs, ys in _users("sent140", paths):
            y = _labels("sent140", path, user, ys, "0 (negative) or 1 (positive; 4 in raw Sentiment140)",
                        lambda v: np.isin(v, (0, 1, 4)))
            bad = next((i for i, row in enumerate(xs) if not isinstance(row, list) or len(row) != 5
                        or not isinstance(row[4], str)), None)
            if bad is not None:
                raise DataError(f"sent140: {path}: user {user!r}: x[{bad}] must be LEAF's 5 fields [id, date, query, "
                                f"user, text] with the tweet's text last, got {xs[bad]!r:.80}.")
            tweets += [text.words(row[4]) for row in xs]
            labels.append(np.minimum(y, 1))
            counts.append(len(y))
        memory.check_bytes(4 * len(tweets) * o.seq_len, "lower data.seq_len",
                           f"sent140's {len(tweets):,} tweets of data.seq_len={o.seq_len:,} tokens")
        vocab = text.word_vocabulary(tweets, o.vocab)
        oov = text.oov_id(text.vocab_size(o.vocab))
        x = text.pad_rows([[text.BOS, *(vocab.get(w, oov) for w in t), text.EOS] for t in tweets], o.seq_len)
        return {"x": x, "y": np.concatenate(labels).astype(np.int32), "counts": np.asarray(counts)}

    arrays = text.cached_arrays("sent140", paths, {"seq_len": o.seq_len, "vocab": o.vocab, "version": 1}, build,
                                o.cache_dir, keys=("x", "y", "counts"))
    counts = arrays["counts"].astype(np.int64)
    chosen = _choose("sent140", counts, num_clients, seed, o.data_dir)
    rows, kept = _rows((np.cumsum(counts) - counts)[chosen], counts[chosen])
    vocab = text.vocab_size(o.vocab)
    return Natural(arrays["x"][rows], arrays["y"][rows], kept.astype(np.int32), 2, "sent140",
                   input_shape=text.TokenShape(o.seq_len, vocab, per_token=False))


def _femnist_clients(o: LeafOptions) -> int:
    return (standins.EMNIST_WRITERS if o.source == "standin" else LEAF_FEMNIST_WRITERS) // o.writers_per_client


def _load_femnist(num_classes: int, o: LeafOptions, num_clients: int, seed: int) -> Natural:
    return femnist(o.data_dir, num_clients, seed, o.writers_per_client, num_classes, o.source)


register_source("femnist", Source(
    "FEMNIST digits from LEAF's JSON files, clients of writers_per_client writers (offline, data_dir; source: "
    "standin for seeded stand-in writers)", LeafOptions, functools.partial(_load_femnist, 10), _femnist_clients,
    (28, 28, 1), 10, natural=True))
register_source("femnist62", Source(
    "FEMNIST / EMNIST-62 with natural writers, all 62 classes, from LEAF's JSON files (offline, data_dir; source: "
    "standin for 3,400 seeded stand-in writers)", LeafOptions, functools.partial(_load_femnist, 62),
    _femnist_clients, (28, 28, 1), 62, natural=True))
register_source("shakespeare", Source(
    "Shakespeare next-character prediction, one client per speaking role: LEAF's JSON files (data_dir) or, with "
    "source: standin, 715 seeded stand-in speakers (offline)", ShakespeareOptions, shakespeare,
    lambda o: standins.SHAKESPEARE_SPEAKERS if o.source == "standin" else LEAF_SHAKESPEARE_USERS,
    text.TokenShape(80, SHAKESPEARE_VOCAB), SHAKESPEARE_VOCAB, natural=True,
    shape_of=lambda o: text.TokenShape(o.seq_len, SHAKESPEARE_VOCAB)))
register_source("sent140", Source(
    "Sent140 tweet sentiment (2 classes), one client per Twitter account, from LEAF's JSON files (offline, "
    "data_dir)", Sent140Options, sent140, lambda o: LEAF_SENT140_USERS,
    text.TokenShape(25, text.vocab_size(10_000), per_token=False), 2, natural=True,
    shape_of=lambda o: text.TokenShape(o.seq_len, text.vocab_size(o.vocab), per_token=False)))
