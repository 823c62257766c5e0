"""Offline stand-ins for the natural-client benchmarks, generated from a seed for tests and benchmarks.

Each has the real set's sample shapes, vocabulary or classes, population and client-size distribution, and
synthetic content with structure a model can learn. They are **not** the real data: every stand-in's name says
``(stand-in)`` (data summaries, summary.json, tables), and its accuracy says nothing about the real benchmark.

* **Shakespeare** (:func:`shakespeare_speakers`): 715 speakers (TFF's and FedJAX's train split). A speaker's
  text length in characters is lognormal with LEAF's moments (Caldas et al. 2018, Table 1: 4,226,158 characters
  over 1,129 roles, mean 3,743, standard deviation 6,212, hence σ = 1.150, μ = 7.567). The text is lines of
  pseudo-words: a seeded lexicon of 500 words spelled with English letter frequencies, drawn with a Zipf law
  reweighted per speaker (lognormal factors, σ = 0.5), capitalised at a line's start, lines ended by punctuation;
  each line is a snippet (BOS, characters, EOS) cut into ``seq_len`` sequences as the real set is
  (:func:`fljax.data.text.chunk_snippets`).
* **Stack Overflow** (:func:`stackoverflow_users`): the first ``num_users`` of 342,477 users (TFF's train split; a
  smaller population is a prefix of a larger one, as for the other stand-ins);
  a user's sentence count is lognormal with the real mean (135,818,730 sentences over 342,477 users: 396.6) and an
  assumed σ = 1.6, capped at ``max_samples`` (Reddi et al.: 1,000). Sentences have 1 + Poisson(11) words; a word
  follows its predecessor through a seeded successor table (4 successors per word) with probability 1/2, else it is
  drawn from a Zipf law over the ``vocab`` words (70%) or from the user's own 32 favourite words (30%); 5% of words
  are out of vocabulary. Rows as TFF's tokeniser makes them (:func:`fljax.data.text.sentence_rows`).
* **EMNIST-62** (:func:`emnist_writers`): 3,400 writers (TFF's federated EMNIST). A writer's sample count is
  lognormal with the real mean (671,585 train + 77,483 test samples over 3,400 writers: 220.3) and an assumed
  σ = 0.4, at least 10. Every class is a prototype image of three soft strokes; a writer shifts and fades them its
  own way and every sample adds pixel noise. Classes are drawn with digits five times as likely as a letter (digits
  ≈ 49% of samples, as in EMNIST ByClass).
"""
from __future__ import annotations

import numpy as np

from fljax.data import memory, text

__all__ = ["SHAKESPEARE_SPEAKERS", "STACKOVERFLOW_USERS", "EMNIST_WRITERS", "shakespeare_speakers",
           "stackoverflow_users", "emnist_writers"]

SHAKESPEARE_SPEAKERS = 715
STACKOVERFLOW_USERS = 342_477
EMNIST_WRITERS = 3_400

_SHAKESPEARE_LOG_CHARS = (7.567, 1.150)  # lognormal (μ, σ) with LEAF's mean 3,743 and std 6,212 characters
_STACKOVERFLOW_LOG_SENTENCES = (np.log(396.6) - 1.6 ** 2 / 2, 1.6)
_EMNIST_LOG_SAMPLES = (np.log(220.3) - 0.4 ** 2 / 2, 0.4)
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"  # by English frequency (percent below)
_LETTER_FREQ = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
                         1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def shakespeare_speakers(num_speakers: int, seed: int, seq_len: int = 80,
                         lexicon_size: int = 500) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-speaker next-character sequences ``(xs, ys)`` of the Shakespeare stand-in (module docstring)."""
    rng = _rng(seed, 1)
    table = text.char_table(text.SHAKESPEARE_CHARS)
    ids = lambda s: table[np.frombuffer(s.encode("ascii"), np.uint8)]  # noqa: E731
    lengths = np.minimum(1 + rng.poisson(3.5, lexicon_size), 12)
    letters = rng.choice(list(_LETTERS), size=int(lengths.sum()), p=_LETTER_FREQ / _LETTER_FREQ.sum())
    spelled = np.split(letters, np.cumsum(lengths)[:-1])
    lexicon = [ids("".join(w)) for w in spelled]
    capital = [ids("".join(w).capitalize()) for w in spelled]
    space, marks = ids(" ")[0], ids(".,;:!?")
    zipf = 1.0 / np.arange(1, lexicon_size + 1)
    budgets = [_speaker(seed, i, seq_len)[1] for i in range(num_speakers)]  # each speaker's text is at least this
    rows = sum(text.chunk_count([budget - 2], seq_len) for budget in budgets)  # long: the rows, at least
    memory.check_bytes(text.sequence_bytes(rows, seq_len), "lower data.seq_len",
                       f"the Shakespeare stand-in's {rows:,}+ sequences of data.seq_len={seq_len:,} characters")
    xs, ys = [], []
    for i in range(num_speakers):  # each speaker from its own stream: a smaller population is a prefix
        rng, budget = _speaker(seed, i, seq_len)
        p = zipf * rng.lognormal(0.0, 0.5, lexicon_size)
        p /= p.sum()
        snippets, used = [], 0
        while used < budget:
            line = rng.choice(lexicon_size, size=1 + rng.poisson(6), p=p)
            parts = [capital[line[0]]]
            for w in line[1:]:
                parts += [[space], lexicon[w]]
            parts.append([marks[rng.integers(len(marks))]])
            snippets.append(np.concatenate(parts).astype(np.int32))
            used += len(snippets[-1]) + 2
        x, y = text.chunk_snippets(snippets, seq_len)
        xs.append(x), ys.append(y)
    return xs, ys


def _speaker(seed: int, i: int, seq_len: int) -> tuple[np.random.Generator, int]:
    """Speaker ``i``'s stream and its text budget in characters (its first draw)."""
    rng = np.random.default_rng([seed, 1, i])
    return rng, int(np.clip(rng.lognormal(*_SHAKESPEARE_LOG_CHARS), 2 * seq_len + 2, 250_000))


STACKOVERFLOW_BLOCK = 1_000  # users drawn together from one stream: the first N users are the same for every N


def stackoverflow_users(num_users: int, seed: int, seq_len: int = 20, vocab: int = 10_000,
                        max_samples: int | None = 1_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x [S, seq_len], y [S, seq_len], counts [num_users])`` of the Stack Overflow stand-in (module docstring);
    the vocabulary has ``vocab`` regular words, ids ``text.NUM_RESERVED`` … and OOV last. Users are drawn in blocks
    of :data:`STACKOVERFLOW_BLOCK` from their own streams, so a smaller population is a prefix of a larger one."""
    count = -(-num_users // STACKOVERFLOW_BLOCK)
    sentences = [_block_counts(np.random.default_rng([seed, 2, b]), max_samples) for b in range(count)]
    total, largest = sum(int(c.sum()) for c in sentences), max(int(c.sum()) for c in sentences)
    memory.check_bytes(8 * 7 * vocab + 48 * largest * seq_len + text.sequence_bytes(total, seq_len),
                       "lower data.vocab, data.seq_len or data.max_samples",
                       f"the Stack Overflow stand-in's {total:,} sentences of data.seq_len={seq_len:,} tokens over "
                       f"data.vocab={vocab:,} words")
    shared = _rng(seed, 2)
    zipf = 1.0 / np.arange(1, vocab + 1)
    zipf /= zipf.sum()
    successors = shared.integers(0, vocab, (vocab, 4))
    blocks = [_stackoverflow_block(np.random.default_rng([seed, 2, b]), zipf, successors, seq_len, max_samples)
              for b in range(count)]
    counts = np.concatenate([c for _, _, c in blocks])[:num_users]
    total = int(counts.sum())
    x = np.concatenate([x for x, _, _ in blocks])[:total]
    y = np.concatenate([y for _, y, _ in blocks])[:total]
    return x, y, counts


def _block_counts(rng, max_samples: int | None) -> np.ndarray:
    """The sentence counts of a block's users: the block stream's first draw."""
    counts = np.maximum(2, rng.lognormal(*_STACKOVERFLOW_LOG_SENTENCES, STACKOVERFLOW_BLOCK)).astype(np.int64)
    return counts if max_samples is None else np.minimum(counts, max_samples)


def _stackoverflow_block(rng, zipf: np.ndarray, successors: np.ndarray, seq_len: int,
                         max_samples: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block of users: their rows, in user order, and their sentence counts."""
    vocab = len(zipf)
    counts = _block_counts(rng, max_samples)
    total = int(counts.sum())
    favourites = rng.integers(0, vocab, (STACKOVERFLOW_BLOCK, 32))[np.repeat(np.arange(STACKOVERFLOW_BLOCK), counts)]
    words = np.empty((total, seq_len), np.int64)

    def fresh():
        own = favourites[np.arange(total), rng.integers(0, 32, total)]
        return np.where(rng.random(total) < 0.3, own, rng.choice(vocab, size=total, p=zipf))

    words[:, 0] = fresh()
    for t in range(1, seq_len):
        follow = successors[words[:, t - 1], rng.integers(0, 4, total)]
        words[:, t] = np.where(rng.random(total) < 0.5, follow, fresh())
    oov = text.oov_id(text.vocab_size(vocab))
    ids = np.where(rng.random(words.shape) < 0.05, oov, words + text.NUM_RESERVED)
    length = 1 + rng.poisson(11, total)  # words per sentence
    pos = np.arange(seq_len)
    # full sentence: BOS, w_1 .. w_L, EOS; x_j = full[j], y_j = full[j + 1] while j <= L
    x = np.where(pos == 0, text.BOS, np.where(pos <= length[:, None], np.roll(ids, 1, axis=1), text.PAD))
    y = np.where(pos < length[:, None], ids, np.where(pos == length[:, None], text.EOS, text.PAD))
    return x.astype(np.int32), y.astype(np.int32), counts.astype(np.int32)


def _strokes(rng: np.random.Generator, num_classes: int, size: int = 28) -> np.ndarray:
    """``[num_classes, size, size]`` prototypes: three soft line segments each, intensities in [0, 1]."""
    grid = np.stack(np.meshgrid(np.arange(size), np.arange(size), indexing="ij"), -1).astype(np.float64)
    ends = rng.uniform(6, size - 6, (num_classes, 3, 2, 2))
    a, b = ends[:, :, 0], ends[:, :, 1]  # [C, 3, 2]
    ab = b - a
    p = grid[None, None] - a[:, :, None, None]  # [C, 3, H, W, 2]
    t = np.clip(np.sum(p * ab[:, :, None, None], -1) / np.maximum(np.sum(ab * ab, -1), 1e-9)[:, :, None, None], 0, 1)
    d2 = np.sum((p - t[..., None] * ab[:, :, None, None]) ** 2, -1)
    return np.exp(-d2 / (2 * 1.2 ** 2)).max(axis=1)


def emnist_writers(num_writers: int, seed: int, num_classes: int = 62) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-writer ``(xs [n_i, 28, 28, 1] float32 in [0, 1], ys [n_i])`` of the EMNIST-62 stand-in (module
    docstring); ``num_classes`` 10 keeps each writer's digits only, as FEMNIST's digit split does."""
    protos = _strokes(_rng(seed, 3), 62)
    prior = np.r_[np.full(10, 5.0), np.ones(52)]
    prior /= prior.sum()
    xs, ys = [], []
    share = prior[:num_classes].sum()  # a digits-only writer keeps its digit samples: about half of them
    for i in range(num_writers):  # each writer from its own stream: a smaller population is a prefix
        rng = np.random.default_rng([seed, 3, i])
        n = max(10, int(rng.lognormal(*_EMNIST_LOG_SAMPLES)))
        y = rng.choice(num_classes, size=max(2, round(n * share)), p=prior[:num_classes] / share)
        shift = rng.integers(-2, 3, 2)
        fade = rng.uniform(0.6, 1.0)
        img = np.roll(protos[y], tuple(shift), axis=(1, 2)) * fade + rng.normal(0, 0.1, (len(y), 28, 28))
        xs.append(np.clip(img, 0, 1).astype(np.float32)[..., None])
        ys.append(y.astype(np.int32))
    return xs, ys
