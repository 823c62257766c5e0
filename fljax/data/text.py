"""Token sequences: the vocabulary layout every text data set shares, tokenisers, and the marker of token inputs.

**Layout.** A vocabulary of V ids holds three reserved ids first, the regular tokens next, one out-of-vocabulary id
last::

    0 = PAD (padding, never a target)   1 = BOS   2 = EOS   3 .. V-2 = the regular tokens   V-1 = OOV

(FedJAX's Shakespeare and Stack Overflow tokenisers use the same layout: Shakespeare's 86 characters give V = 90,
Stack Overflow's 10,000 words V = 10,004.) Losses count every target but PAD; the token accuracy reported as
``acc`` counts only regular targets (no PAD, BOS, EOS or OOV: Reddi et al. 2021's accuracy, TFF's
``accuracy_no_oov_no_eos``), ``acc_with_specials`` every target but PAD (:mod:`fljax.models.sequence`).

**Next-token data.** A client's samples are sequences ``x [n, T]`` of input ids and ``y [n, T]`` of target ids, y
being x shifted by one (:func:`chunk_snippets`, :func:`sentence_rows`). **Sequence classification** (Sent140): ``x
[n, T]`` ids and one label per sequence, ``y [n]``.

:class:`TokenShape` is the input shape of such data: a tuple ``(T,)`` that also says its entries are token ids, and
whether the targets are per token. Models check it (a convolutional network is refused for text, a language model
for images), so a wrong pairing is refused when the config is read, before anything runs.

Tokenised arrays of files that need parsing (LEAF's JSON) are cached once under :func:`cache_root` ``/data``
(:func:`cached_arrays`); nothing else is written.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import uuid
from collections import Counter
from typing import Callable, Iterable, Sequence

import numpy as np

__all__ = ["PAD", "BOS", "EOS", "NUM_RESERVED", "TokenShape", "vocab_size", "oov_id", "SHAKESPEARE_CHARS",
           "char_table", "chunk_snippets", "chunk_count", "sequence_bytes",
           "pad_rows", "sentence_rows", "words", "word_vocabulary", "cache_root",
           "cached_arrays"]

PAD, BOS, EOS = 0, 1, 2
NUM_RESERVED = 3  # PAD, BOS, EOS; regular tokens follow, OOV is the last id


class TokenShape(tuple):
    """The input shape ``(T,)`` of token sequences of ids in [0, ``vocab``); ``per_token``: the targets are next
    tokens ``[n, T]`` (a language model), else one label per sequence ``[n]``. Equal to the plain tuple (it is one),
    so it stands wherever an input shape does."""

    def __new__(cls, length: int, vocab: int, per_token: bool = True):
        shape = super().__new__(cls, (int(length),))
        shape.vocab, shape.per_token = int(vocab), bool(per_token)
        return shape

    def __getnewargs__(self):
        return (self[0], self.vocab, self.per_token)


def vocab_size(regular: int) -> int:
    """V for ``regular`` regular tokens: PAD, BOS, EOS, the tokens, OOV."""
    return NUM_RESERVED + regular + 1


def oov_id(vocab: int) -> int:
    return vocab - 1


# Shakespeare's characters (the 86 of TFF's and FedJAX's tables): printable ASCII without + < = > \ ^ ` { | } ~,
# plus newline and carriage return; ids follow ASCII order.
SHAKESPEARE_CHARS = "".join(sorted(set(map(chr, range(32, 127))) - set("+<=>\\^`{|}~") | {"\n", "\r"}))


def char_table(chars: str) -> np.ndarray:
    """``[256]`` id of every byte: ``chars[i]`` ↦ NUM_RESERVED + i, any other byte ↦ OOV."""
    table = np.full(256, oov_id(vocab_size(len(chars))), np.int32)
    table[np.frombuffer(chars.encode("latin-1"), np.uint8)] = NUM_RESERVED + np.arange(len(chars), dtype=np.int32)
    return table


def chunk_snippets(snippets: Sequence[np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One client's next-token sequences from its snippets (arrays of regular ids), as FedJAX's Shakespeare
    preprocessing defines them: every snippet becomes BOS, its ids, EOS; the client's snippets are joined into one
    stream s of length L; inputs are s[:-1] and targets s[1:], cut into rows of ``seq_len``, the last row padded
    with PAD. Returns ``(x, y)``, each ``[⌈(L−1)/seq_len⌉, seq_len]`` int32."""
    if not snippets:
        return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
    joined = np.concatenate([np.concatenate([[BOS], np.asarray(s, np.int32), [EOS]]) for s in snippets])
    n = len(joined) - 1
    rows = -(-n // seq_len)
    x = np.full(rows * seq_len, PAD, np.int32)
    y = np.full(rows * seq_len, PAD, np.int32)
    x[:n], y[:n] = joined[:-1], joined[1:]
    return x.reshape(rows, seq_len), y.reshape(rows, seq_len)


def chunk_count(lengths: Sequence[int], seq_len: int) -> int:
    """The rows :func:`chunk_snippets` cuts from snippets of these lengths (without building them):
    ⌈(Σ(len + 2) − 1)/seq_len⌉, 0 for none."""
    if not len(lengths):
        return 0
    return -(-(int(np.sum(lengths, dtype=np.int64)) + 2 * len(lengths) - 1) // seq_len)


def sequence_bytes(rows: int, seq_len: int, copies: int = 2) -> int:
    """Bytes of ``rows`` next-token rows of ``seq_len`` (x and y, int32), ``copies`` times: a reader holds its
    clients' pieces and their concatenation at once (the estimate :func:`fljax.data.memory.check_bytes` compares)."""
    return copies * 2 * 4 * int(rows) * int(seq_len)


def pad_rows(seqs: Sequence[np.ndarray], seq_len: int) -> np.ndarray:
    """``[len(seqs), seq_len]`` int32: every sequence truncated to ``seq_len`` or padded with PAD."""
    lengths = np.minimum([len(s) for s in seqs], seq_len).astype(np.int64)
    out = np.full((len(seqs), seq_len), PAD, np.int32)
    if len(seqs):
        flat = np.concatenate([np.asarray(s, np.int32)[:k] for s, k in zip(seqs, lengths)])
        out[np.repeat(np.arange(len(seqs)), lengths), np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths,
                                                                                         lengths)] = flat
    return out


def sentence_rows(ids: Sequence[np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Next-token rows of independent sentences, as TFF's and FedJAX's Stack Overflow tokenisers define them: each
    sentence becomes BOS, its ids, EOS; x = that[:-1], y = that[1:], truncated or padded with PAD to ``seq_len``.
    Returns ``(x, y)``, each ``[len(ids), seq_len]`` int32."""
    full = [np.concatenate([[BOS], np.asarray(s, np.int32), [EOS]]) for s in ids]
    return pad_rows([f[:-1] for f in full], seq_len), pad_rows([f[1:] for f in full], seq_len)


_WORD = re.compile(r"[a-z0-9']+|[.,!?;:]")


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text``."""
    return _WORD.findall(text.lower())


def word_vocabulary(texts: Iterable[list[str]], size: int) -> dict[str, int]:
    """The ``size`` most frequent words (ties: alphabetical) ↦ ids NUM_RESERVED, NUM_RESERVED + 1, …"""
    counts = Counter(w for t in texts for w in t)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))[:size]
    return {w: NUM_RESERVED + i for i, w in enumerate(ranked)}


def cache_root(cache_dir: str | None = None) -> str:
    """``cache_dir``, else ``$FLJAX_CACHE``, else ``$XDG_CACHE_HOME/fljax`` (``~/.cache/fljax``): where fljax keeps
    what it computes once (tokenised data sets under ``data/``)."""
    if cache_dir:
        return os.path.abspath(os.path.expanduser(cache_dir))
    if os.environ.get("FLJAX_CACHE"):
        return os.path.abspath(os.environ["FLJAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fljax")


def _fingerprint(paths: Sequence[str]) -> list:
    return [(os.path.basename(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in sorted(paths)]


def _warn(text: str) -> None:
    print(f"fljax: warning: {text}", file=sys.stderr, flush=True)


def _read_cached(path: str, keys: Sequence[str]) -> dict:
    """The arrays of a cache entry, every one read whole (the zip's checksums checked), or ValueError saying why
    the entry is damaged: not a NumPy archive, cut short, a member that does not decompress, an object array (a
    pickle, which is never loaded), or one of ``keys`` missing."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if not hasattr(f, "files"):
                raise ValueError("a single array, not the archive of arrays fljax writes")
            arrays = {k: f[k] for k in f.files}
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile, zlib.error, EOFError, OSError: a damaged file
        raise ValueError(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else 'unreadable'}") from None
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise ValueError(f"it lacks the arrays {missing}")
    return arrays


def cached_arrays(kind: str, paths: Sequence[str], settings: dict, build: Callable[[], dict],
                  cache_dir: str | None = None, keys: Sequence[str] = (),
                  warn: Callable[[str], None] = _warn) -> dict:
    """``build()`` (a dict of arrays holding ``keys``), computed once: saved as ``<cache root>/data/<kind>-<key>.npz``,
    the key hashing the input files (names, sizes, modification times) and ``settings``; later calls with the same
    inputs read it back. The file is written to a temporary name and renamed, so an interrupted write leaves no
    cache. A cache entry that cannot be read whole (cut short, changed by hand, written by something else) is moved
    aside to ``<entry>.damaged-<id>`` (kept for inspection), ``warn`` says so in one line, and the arrays are built
    again, as the pretrained-model cache does (:mod:`fljax.runner.pretrained`): a damaged entry never stops a run."""
    key = hashlib.sha256(json.dumps([kind, _fingerprint(paths), settings], sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    directory = os.path.join(cache_root(cache_dir), "data")
    path = os.path.join(directory, f"{kind}-{key}.npz")
    if os.path.exists(path):
        try:
            return _read_cached(path, keys)
        except ValueError as e:
            aside = f"{path}.damaged-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(path, aside)
            except FileNotFoundError:  # another process moved it aside first
                pass
            else:
                warn(f"the tokenised-data cache entry {path} is damaged ({e}); moved it to {os.path.basename(aside)} "
                     f"and tokenised the files again")
    arrays = build()
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return arrays
