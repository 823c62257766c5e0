"""Stack Overflow (TFF's federated Stack Overflow; Reddi et al. 2021's next-word prediction): the real users from the
files TFF and FedJAX distribute, or the seeded stand-in (:func:`fljax.data.standins.stackoverflow_users`).

**Files** (read, never downloaded; put them in ``data_dir`` once, on a machine with network):

* TFF's ``stackoverflow.sqlite`` (``https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma``,
  decompressed with ``xz -dk stackoverflow.sqlite.lzma``; what ``tff.simulation.datasets.stackoverflow.load_data``
  reads): a table ``examples(split_name, client_id, serialized_example_proto)`` of one serialized ``tf.train.Example``
  per sentence (features ``tokens``, ``title``, ``tags``, ``type``, ``creation_date``, ``score``), splits ``train``,
  ``heldout`` and ``test``, and a table ``client_metadata(client_id, split_name, num_examples)``;
* or FedJAX's ``stackoverflow_train.sqlite`` and ``stackoverflow_test.sqlite``
  (``https://storage.googleapis.com/gresearch/fedjax/stackoverflow/``): a table ``federated_data(client_id,
  data, num_examples)`` whose ``data`` is a zlib-compressed msgpack of the client's feature arrays (``tokens`` a
  bytes array), one file per split;
* and, for either, the vocabulary's word counts ``stackoverflow.word_count`` (``…/tff-datasets-public/
  stackoverflow.word_count.tar.bz2``, unpacked; FedJAX reads the same file): one ``word count`` line per word, most
  frequent first.

**Tokens** as Reddi et al. and FedJAX make them: the vocabulary is the ``vocab`` most frequent words (the first lines
of the word counts), ids after PAD, BOS, EOS, every other word OOV (:mod:`fljax.data.text`); a sentence's
space-separated ``tokens`` become BOS, ids, EOS, with inputs x = that[:-1] and targets y = that[1:] truncated or
padded to ``seq_len`` (:func:`fljax.data.text.sentence_rows`).

**Clients**: the users of the train split (342,477 in TFF's files) with a train sentence (two with ``test_from:
train``), in the order of their ids, shuffled with the data seed; the first ``num_clients`` are the clients, each with its first
``max_samples`` train sentences. Their test split (``test_from``): ``test``, the same users' sentences of the test
split (after 2018-01-01; at most ``max_samples``; a user without any has an empty test split and is left out of
the accuracy summaries), or ``train``, the last ``test_fraction`` of their train sentences (the stand-in's split).

The chosen users' token arrays are built once and cached (:func:`fljax.data.text.cached_arrays`). The module
registers the data set ``stackoverflow`` (:mod:`fljax.data.registry`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import zlib
from typing import Literal

import numpy as np

from fljax.data import memory, standins, text
from fljax.data.registry import Source, register_source
from fljax.data.types import DataError, Natural, Samples
from fljax.options import Options, at_least, option

__all__ = ["StackOverflowOptions", "stackoverflow", "parse_example", "STACKOVERFLOW_USERS", "TFF_FILE",
           "FEDJAX_FILES", "WORD_COUNT_FILE"]

STACKOVERFLOW_USERS = 342_477  # users of TFF's train split
TFF_FILE = "stackoverflow.sqlite"
FEDJAX_FILES = {"train": "stackoverflow_train.sqlite", "test": "stackoverflow_test.sqlite"}
WORD_COUNT_FILE = "stackoverflow.word_count"
_TFF_URL = "https://storage.googleapis.com/tff-datasets-public"


@dataclasses.dataclass(frozen=True)
class StackOverflowOptions(Options):
    """Options of Stack Overflow (next-word prediction)."""

    source: Literal["tff", "standin"] = option("tff", "tff: TFF's (or FedJAX's) Stack Overflow files in data_dir; "
                                                      "standin: seeded stand-in users with the real set's shapes "
                                                      "(offline)")
    data_dir: str | None = option(None, "directory of stackoverflow.sqlite (TFF) or stackoverflow_{train,test}"
                                        ".sqlite (FedJAX) and stackoverflow.word_count (read, never downloaded)")
    seq_len: int = option(20, "tokens per sentence row (Reddi et al.: 20)", at_least(2))
    vocab: int = option(10_000, "regular words in the vocabulary: the most frequent (Reddi et al.: 10,000)",
                        at_least(1))
    max_samples: int | None = option(1_000, "sentences per user at most, its first (Reddi et al.: 1,000; null: no "
                                            "cap)", at_least(2))
    test_from: Literal["test", "train"] | None = option(
        None, "a client's test split: its sentences of the test split ('test') or the last test_fraction of its "
              "train sentences ('train'); null: test with source tff, train with the stand-in (it has no test split)")
    cache_dir: str | None = option(None, "where tokenised files are cached (null: $FLJAX_CACHE, else "
                                         "~/.cache/fljax)")


def _missing() -> str:
    return (f"put TFF's {TFF_FILE} ({_TFF_URL}/{TFF_FILE}.lzma, then `xz -dk {TFF_FILE}.lzma`) or FedJAX's "
            f"{FEDJAX_FILES['train']} and {FEDJAX_FILES['test']}, with {WORD_COUNT_FILE} ({_TFF_URL}/"
            f"{WORD_COUNT_FILE}.tar.bz2, unpacked), in one directory on a machine with network and set data.data_dir "
            f"to it, or use data.source=standin")


def _files(data_dir: str | None) -> tuple[str, dict[str, str], str]:
    """(kind 'tff' | 'fedjax', split -> database path, word-count path), or a one-line DataError."""
    if data_dir is None:
        raise DataError(f"stackoverflow reads TFF's Stack Overflow files: {_missing()}.")
    tff, fedjax = os.path.join(data_dir, TFF_FILE), {s: os.path.join(data_dir, f) for s, f in FEDJAX_FILES.items()}
    if os.path.isfile(tff):
        kind, databases = "tff", {"train": tff, "test": tff}
    elif all(os.path.isfile(p) for p in fedjax.values()):
        kind, databases = "fedjax", fedjax
    elif os.path.isfile(tff + ".lzma"):
        raise DataError(f"stackoverflow: {tff}.lzma is compressed; decompress it once (`xz -dk {tff}.lzma`, which "
                        f"writes {TFF_FILE} beside it).")
    else:
        raise DataError(f"stackoverflow: no {TFF_FILE} nor {FEDJAX_FILES['train']} and {FEDJAX_FILES['test']} in "
                        f"{data_dir!r}; {_missing()}.")
    counts = os.path.join(data_dir, WORD_COUNT_FILE)
    if not os.path.isfile(counts):
        raise DataError(f"stackoverflow: no {WORD_COUNT_FILE} in {data_dir!r} (the vocabulary's word counts, "
                        f"{_TFF_URL}/{WORD_COUNT_FILE}.tar.bz2, unpacked); put it beside the database.")
    return kind, databases, counts


def vocabulary(path: str, size: int) -> dict[str, int]:
    """The first ``size`` words of a word-count file (most frequent first) ↦ ids NUM_RESERVED, NUM_RESERVED + 1, …"""
    words: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] not in words:
                    words[parts[0]] = text.NUM_RESERVED + len(words)
                    if len(words) >= size:
                        break
    except UnicodeDecodeError:
        raise DataError(f"stackoverflow: {path} is not text (UTF-8 'word count' lines); put TFF's "
                        f"{WORD_COUNT_FILE} there, unpacked.") from None
    except OSError as e:
        raise DataError(f"stackoverflow: {path} cannot be read ({e.strerror or e}).") from None
    return words


_TABLES = {"tff": "examples(split_name, client_id, serialized_example_proto) and client_metadata(client_id, "
                  "split_name, num_examples)",
           "fedjax": "federated_data(client_id, data, num_examples)"}


@contextlib.contextmanager
def _database(kind: str, path: str):
    """A read-only connection to ``path``; any sqlite error inside (not a database, a missing table or column, a
    damaged page) is one line naming the file and the tables the format needs."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            yield db
    except sqlite3.Error as e:
        what = "TFF's" if kind == "tff" else "FedJAX's"
        raise DataError(f"stackoverflow: {path} is not {what} Stack Overflow database ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); it must hold the tables "
                        f"{_TABLES[kind]}: download it again.") from None


# ------------------------------------------------------------------------------ tf.train.Example, without TF


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protocol-buffer message: varints as ints, length-delimited fields as
    bytes; 32- and 64-bit fields as their raw bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"unsupported protocol-buffer wire type {wire}")
        yield number, wire, value


def parse_example(serialized: bytes, feature: str = "tokens") -> bytes | None:
    """The first bytes value of ``feature`` in a serialized ``tf.train.Example`` (``Example{features: Features{
    feature: map<string, Feature>}}``, ``Feature{bytes_list: BytesList{value: repeated bytes} = 1, ...}``), or
    None when the example has none."""
    key = feature.encode()
    for number, _, features in _fields(serialized):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            name = value = None
            for n, _, v in _fields(entry):
                if n == 1:
                    name = v
                elif n == 2:
                    value = v
            if name != key or value is None:
                continue
            for kind, _, listed in _fields(value):
                if kind == 1:  # bytes_list
                    for n, _, item in _fields(listed):
                        if n == 1:
                            return item
            return None
    return None


def _fedjax_unpack(blob: bytes) -> dict:
    """A FedJAX client blob (zlib-compressed msgpack; bytes arrays as extension type 4 of (shape, flat list),
    numeric arrays as type 1 of (shape, dtype name, buffer), scalars as type 3)."""
    import msgpack

    def ext(code, data):
        if code == 4:
            shape, flat = msgpack.unpackb(data, raw=True)
            return np.array(flat, dtype=object).reshape(shape)
        if code in (1, 3):
            shape, dtype, buffer = msgpack.unpackb(data, raw=True)
            array = np.frombuffer(buffer, np.dtype(dtype.decode() if isinstance(dtype, bytes) else dtype))
            return array.reshape(shape) if code == 1 else array.reshape(())[()]
        return msgpack.ExtType(code, data)

    return msgpack.unpackb(zlib.decompress(blob), ext_hook=ext, raw=False)


# ------------------------------------------------------------------------------------------------ reading


def _users(kind: str, database: str) -> list[tuple]:
    """(user id, train sentences) of the train split's users, sorted by id."""
    with _database(kind, database) as db:
        if kind == "tff":
            rows = db.execute("SELECT client_id, SUM(num_examples) FROM client_metadata WHERE split_name = 'train' "
                              "GROUP BY client_id").fetchall()
        else:
            rows = db.execute("SELECT client_id, num_examples FROM federated_data").fetchall()
    bad = next((r for r in rows if not isinstance(r[1], int)), None)
    if bad is not None:
        raise DataError(f"stackoverflow: {database}: user {bad[0]!r} has {bad[1]!r} examples, not a count; download "
                        f"the database again.")
    try:
        return sorted(rows)
    except TypeError:  # ids of different types do not sort
        raise DataError(f"stackoverflow: {database}: the client ids are of mixed types; download the database "
                        f"again.") from None


def _sentences(kind: str, database: str, split: str, users: list) -> dict:
    """``{user: [tokens bytes, …]}`` of ``users``' sentences in ``split``, in the file's order (TFF's: one pass over
    the examples joined with the chosen ids; FedJAX's: one row per user, by its primary key)."""
    out: dict = {u: [] for u in users}
    with _database(kind, database) as db:
        if kind == "tff":
            db.execute("CREATE TEMP TABLE chosen (id PRIMARY KEY)")
            db.executemany("INSERT INTO temp.chosen VALUES (?)", [(u,) for u in users])
            rows = db.execute("SELECT e.client_id, e.serialized_example_proto FROM examples e JOIN temp.chosen c "
                              "ON e.client_id = c.id WHERE e.split_name = ? ORDER BY e.rowid", (split,))
            for user, proto in rows:
                tokens = _decoded(database, user, parse_example, proto)
                if tokens is not None:
                    out[user].append(tokens)
            return out
        for start in range(0, len(users), 500):  # bounded SQL parameter lists
            chunk = users[start:start + 500]
            for user, blob in db.execute(f"SELECT client_id, data FROM federated_data WHERE client_id IN "
                                         f"({','.join('?' * len(chunk))})", chunk):
                out[user] = list(_decoded(database, user, lambda b: _fedjax_unpack(b)["tokens"], blob))
    return out


def _decoded(database: str, user, decode, blob):
    """``decode(blob)`` of one stored example or client, or a one-line refusal naming the file and the user (a
    damaged protocol buffer, zlib stream or msgpack; a value of another type)."""
    try:
        if not isinstance(blob, bytes):
            raise TypeError(f"a stored value is {type(blob).__name__}, not bytes")
        value = decode(blob)
        if value is not None and not isinstance(value, bytes) and not all(isinstance(t, bytes) for t in value):
            raise TypeError("its tokens are not bytes")
        return value
    except Exception as e:  # noqa: BLE001 - whatever the decoders raise on damaged bytes (IndexError, zlib.error...)
        raise DataError(f"stackoverflow: {database}: user {user!r}: a stored example cannot be decoded "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else 'damaged'}); download the "
                        f"database again.") from None


def _rows(sentences: list, vocab: dict[str, int], oov: int, seq_len: int, cap: int | None):
    ids = [np.fromiter((vocab.get(w, oov) for w in s.decode("utf-8", "replace").split(" ") if w), np.int32)
           for s in sentences[:cap]]
    return text.sentence_rows(ids, seq_len)


def stackoverflow(o: StackOverflowOptions, num_clients: int, seed: int):
    """The clients of Stack Overflow (module docstring) as a :class:`~fljax.data.types.Natural`."""
    vocab_size = text.vocab_size(o.vocab)
    shape = text.TokenShape(o.seq_len, vocab_size)
    test_from = o.test_from or ("train" if o.source == "standin" else "test")
    if o.source == "standin":
        if test_from != "train":
            raise DataError("stackoverflow: the stand-in has no test split of its own; set data.test_from to train or null (the "
                            "last test_fraction of every user's sentences).")
        x, y, counts = standins.stackoverflow_users(num_clients, seed, o.seq_len, o.vocab, o.max_samples)
        return Natural(x, y, counts, vocab_size, "stackoverflow (stand-in)", input_shape=shape)
    kind, databases, word_counts = _files(o.data_dir)

    least = 2 if test_from == "train" else 1  # sentences a client needs: to train, and to hold out a test split

    def build():
        users = [u for u, n in _users(kind, databases["train"]) if n >= least]
        if len(users) < num_clients:
            raise DataError(f"stackoverflow: {num_clients} clients need {num_clients} users with at least {least} "
                            f"train sentence{'s' * (least > 1)}, {o.data_dir!r} holds {len(users)}; lower "
                            f"data.num_clients.")
        chosen = [users[i] for i in np.random.default_rng(seed).permutation(len(users))[:num_clients]]
        vocab = vocabulary(word_counts, o.vocab)
        oov = text.oov_id(vocab_size)
        arrays = {}
        for split in ("train", "test") if test_from == "test" else ("train",):
            found = _sentences(kind, databases[split], split, chosen)
            count = sum(len(found[u][:o.max_samples]) for u in chosen)
            memory.check_bytes(text.sequence_bytes(count, o.seq_len), "lower data.seq_len or data.max_samples",
                               f"stackoverflow's {count:,} {split} sentences of data.seq_len={o.seq_len:,} tokens")
            rows = [_rows(found[u], vocab, oov, o.seq_len, o.max_samples) for u in chosen]
            arrays[f"x_{split}"] = np.concatenate([r[0] for r in rows])
            arrays[f"y_{split}"] = np.concatenate([r[1] for r in rows])
            arrays[f"counts_{split}"] = np.asarray([len(r[0]) for r in rows], np.int64)
        return arrays

    settings = {"num_clients": num_clients, "seed": seed, "seq_len": o.seq_len, "vocab": o.vocab,
                "max_samples": o.max_samples, "test_from": test_from, "version": 1}
    paths = sorted(set(databases.values())) + [word_counts]
    splits = ("train", "test") if test_from == "test" else ("train",)
    arrays = text.cached_arrays("stackoverflow", paths, settings, build, o.cache_dir,
                                keys=[f"{k}_{split}" for split in splits for k in ("x", "y", "counts")])
    counts = arrays["counts_train"].astype(np.int32)
    test = None if test_from == "train" else Samples(arrays["x_test"], arrays["y_test"],
                                                       arrays["counts_test"].astype(np.int32))
    return Natural(arrays["x_train"], arrays["y_train"], counts, vocab_size, "stackoverflow", test=test,
                   input_shape=shape)


register_source("stackoverflow", Source(
    "Stack Overflow next-word prediction, one client per user: TFF's or FedJAX's files (data_dir) or, with source: "
    "standin, seeded stand-in users (offline; the first num_clients of 342,477)", StackOverflowOptions,
    stackoverflow, lambda o: STACKOVERFLOW_USERS, text.TokenShape(20, text.vocab_size(10_000)),
    text.vocab_size(10_000), natural=True, shape_of=lambda o: text.TokenShape(o.seq_len, text.vocab_size(o.vocab))))
