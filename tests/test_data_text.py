"""Text data: the tokenisers against FedJAX's documented layout, LEAF's Shakespeare and Sent140 readers and your
own per-client files on files these tests write (cached once, nothing written elsewhere, one-line errors), the
stand-ins against the real sets' shapes and sizes, and the published configs."""
import dataclasses
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fljax
import fljax.data as D
from fljax.data import leaf, standins, text
from fljax.data.text import BOS, EOS, PAD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ids(s: str) -> np.ndarray:
    return text.char_table(text.SHAKESPEARE_CHARS)[np.frombuffer(s.encode(), np.uint8)]


def test_chunking_is_fedjax_s_documented_example():
    """FedJAX's shakespeare.preprocess_client docstring: [b'ABCD', b'E'] with sequence_length=3 gives inputs
    [[BOS, A, B], [C, D, EOS], [BOS, E, PAD]] and outputs [[A, B, C], [D, EOS, BOS], [E, EOS, PAD]]."""
    a, b, c, d, e = _ids("ABCDE")
    x, y = text.chunk_snippets([_ids("ABCD"), _ids("E")], 3)
    np.testing.assert_array_equal(x, [[BOS, a, b], [c, d, EOS], [BOS, e, PAD]])
    np.testing.assert_array_equal(y, [[a, b, c], [d, EOS, BOS], [e, EOS, PAD]])


def test_sentence_rows_truncate_and_pad_as_tff_does():
    x, y = text.sentence_rows([np.array([5, 6, 7]), np.array([5])], 3)
    np.testing.assert_array_equal(x, [[BOS, 5, 6], [BOS, 5, PAD]])
    np.testing.assert_array_equal(y, [[5, 6, 7], [5, EOS, PAD]])


def test_the_shakespeare_vocabulary_is_86_characters_and_4_specials():
    assert len(text.SHAKESPEARE_CHARS) == 86 and leaf.SHAKESPEARE_VOCAB == 90
    table = text.char_table(text.SHAKESPEARE_CHARS)
    assert table[ord("~")] == 89 and table[ord("\n")] == 3 and sorted(set(table)) == list(range(3, 90))


def _windows(s: str, w: int = 5) -> tuple[list[str], list[str]]:
    """LEAF's Shakespeare samples of a role's text: every window of w characters and the character after it."""
    return [s[i:i + w] for i in range(len(s) - w)], [s[i + w] for i in range(len(s) - w)]


ROLES = {"THE_TEMPEST_PROSPERO": "Now does my project gather to a head",
         "HAMLET_HAMLET": "To be, or not to be, that is the question",
         "MACBETH_WITCH": "Fair is foul, and foul is fair",
         "BRIEF_ROLE": "Ay."}


def _shakespeare_files(root, roles=ROLES, split=True):
    os.makedirs(root, exist_ok=True)
    names = list(roles)
    for part, chunk in enumerate([names[:2], names[2:]] if split else [names]):
        data = {}
        for u in chunk:
            xs, ys = _windows(roles[u])
            if u == "MACBETH_WITCH":  # a second speech: its windows do not continue the first one's
                more = _windows("When shall we three meet again")
                xs, ys = xs + more[0], ys + more[1]
            data[u] = {"x": xs, "y": ys}
        blob = {"users": chunk, "num_samples": [len(data[u]["y"]) for u in chunk], "user_data": data}
        with open(os.path.join(root, f"all_data_{part}.json"), "w") as f:
            json.dump(blob, f)


def test_leaf_shakespeare_chains_windows_back_into_text_and_caches_once(tmp_path, monkeypatch):
    data_dir, cache = str(tmp_path / "all_data"), str(tmp_path / "cache")
    _shakespeare_files(data_dir)
    options = leaf.ShakespeareOptions(data_dir=data_dir, seq_len=8, cache_dir=cache)
    nat = leaf.shakespeare(options, 3, seed=0)  # BRIEF_ROLE has one sequence: no room for a test split
    expect = {u: text.chunk_snippets([_ids(s)], 8) for u, s in ROLES.items()}
    expect["MACBETH_WITCH"] = text.chunk_snippets([_ids(ROLES["MACBETH_WITCH"]),
                                                  _ids("When shall we three meet again")], 8)
    got = {tuple(map(tuple, x)) for x in nat.xs}
    assert got == {tuple(map(tuple, expect[u][0])) for u in ("THE_TEMPEST_PROSPERO", "HAMLET_HAMLET",
                                                            "MACBETH_WITCH")}
    for x, y in zip(nat.xs, nat.ys):  # the targets are the inputs one step ahead
        n = int((y != PAD).sum())
        np.testing.assert_array_equal(x.ravel()[1:n], y.ravel()[:n - 1])
    assert isinstance(nat.input_shape, text.TokenShape) and nat.input_shape.vocab == 90
    cached = os.listdir(os.path.join(cache, "data"))
    assert len(cached) == 1 and cached[0].startswith("shakespeare-") and sorted(os.listdir(data_dir)) == [
        "all_data_0.json", "all_data_1.json"]
    monkeypatch.setattr(text, "chunk_snippets", lambda *a: pytest.fail("tokenised again despite the cache"))
    again = leaf.shakespeare(options, 3, seed=0)
    np.testing.assert_array_equal(again.x, nat.x)
    capped = leaf.shakespeare(dataclasses.replace(options, max_samples=2), 3, seed=0)
    assert capped.counts.max() == 2
    with pytest.raises(D.DataError, match="need 4 users with at least two samples"):
        leaf.shakespeare(options, 4, seed=0)


def test_shakespeare_reaches_the_config_layer_and_refuses_missing_files_in_one_line(tmp_path):
    data_dir = str(tmp_path / "leaf")
    _shakespeare_files(data_dir)
    fed = D.make_federated("shakespeare", 3, seed=1, data_dir=data_dir, seq_len=8, cache_dir=str(tmp_path / "c"))
    assert fed.name == "shakespeare" and fed.input_shape == (8,) and fed.num_classes == 90
    assert int(fed.test.count.min()) >= 1 and fed.train.y.shape[-1] == 8
    with pytest.raises(D.DataError, match=r"^shakespeare reads LEAF's JSON files: set data.data_dir to the directory "
                                          r"that holds them \(LEAF's data/shakespeare/data/all_data, written by "
                                          r"`\./preprocess\.sh .*`.*\), or use data.source=standin\.$"):
        D.make_federated("shakespeare", 3, seed=1)
    with pytest.raises(D.DataError, match=r"^shakespeare: no LEAF JSON files \(\*\.json\) in "):
        D.make_federated("shakespeare", 3, seed=1, data_dir=str(tmp_path))


def test_leaf_sent140_gives_labelled_word_sequences(tmp_path):
    tweets = {"alice": (["I love this so much!", "great day", "love love love"], [1, 4, 1]),
              "bob": (["this is awful", "I hate rain", "so sad today"], [0, 0, 0]),
              "carol": (["meh"], [1])}
    blob = {"users": list(tweets), "num_samples": [len(v[1]) for v in tweets.values()],
            "user_data": {u: {"x": [["1", "date", "NO_QUERY", u, t] for t in ts], "y": ys}
                          for u, (ts, ys) in tweets.items()}}
    data_dir = tmp_path / "sent140"
    data_dir.mkdir()
    (data_dir / "all_data.json").write_text(json.dumps(blob))
    options = leaf.Sent140Options(data_dir=str(data_dir), seq_len=6, vocab=5, cache_dir=str(tmp_path / "c"))
    nat = leaf.sent140(options, 2, seed=0)
    assert nat.num_classes == 2 and nat.input_shape == (6,) and not nat.input_shape.per_token
    assert nat.input_shape.vocab == 9 and sorted(np.concatenate(nat.ys).tolist()) == [0, 0, 0, 1, 1, 1]
    vocab = text.word_vocabulary([text.words(t) for ts, _ in tweets.values() for t in ts], 5)
    assert vocab["love"] == 3  # the most frequent word
    row = nat.x[list(np.concatenate(nat.ys)).index(1)]  # alice's first tweet: i love this so much !
    oov = 8
    expect = [BOS] + [vocab.get(w, oov) for w in ["i", "love", "this", "so", "much"]]
    np.testing.assert_array_equal(row, expect)  # truncated at 6 tokens: no EOS
    np.testing.assert_array_equal(nat.x[np.concatenate(nat.ys) == 0][2][:4], [BOS, vocab.get("so", oov),
                                                                             vocab.get("sad", oov), oov][:4])
    blob["user_data"]["alice"]["y"][0] = 2
    (data_dir / "all_data.json").write_text(json.dumps(blob))
    with pytest.raises(D.DataError, match="all_data.json: user 'alice': labels must be 0 .* got \\[2\\]"):
        leaf.sent140(options, 2, seed=0)


def test_sent140_trains_the_sequence_classifier(tmp_path):
    rng = np.random.default_rng(0)
    happy, sad = ["love", "great", "fun", "nice"], ["hate", "awful", "sad", "bad"]
    users = {f"u{i}": [(" ".join(rng.choice(happy if y else sad, 4)), int(y)) for y in rng.integers(0, 2, 8)]
             for i in range(6)}
    blob = {"users": list(users), "num_samples": [8] * 6,
            "user_data": {u: {"x": [["1", "d", "q", u, t] for t, _ in rows], "y": [y for _, y in rows]}
                          for u, rows in users.items()}}
    (tmp_path / "all.json").write_text(json.dumps(blob))
    result = fljax.run(algorithm="fedavg", data={"dataset": "sent140", "num_clients": 6, "data_dir": str(tmp_path),
                                                 "cache_dir": str(tmp_path / "c"), "seq_len": 6, "vocab": 20},
                       model={"name": "lstm_cls", "options": {"embed": 8, "hidden": [8]}},
                       algo={"lr": 0.5, "cohort_size": 6, "batch_size": 4, "local_steps": 5}, rounds=15,
                       eval_every=15, progress=False)
    assert result.final["global_acc"] > 0.8


def _npz_clients(root, n=4, tokens=False, test=True):
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        if tokens:
            x = rng.integers(3, 9, (3 + i, 5))
            arrays = {"x": x, "y": np.roll(x, -1, axis=1)}
        else:
            arrays = {"x": rng.normal(size=(3 + i, 2, 2)).astype(np.float32), "y": rng.integers(0, 3, 3 + i)}
        if test:
            arrays.update(x_test=arrays["x"][:2], y_test=arrays["y"][:2])
        np.savez(os.path.join(root, f"client{i:02d}.npz"), **arrays)


def test_a_folder_of_client_npz_files_is_a_natural_data_set(tmp_path):
    _npz_clients(str(tmp_path / "mine"))
    before = sorted(os.listdir(tmp_path / "mine"))
    fed = D.make_federated("files", 4, seed=0, path=str(tmp_path / "mine"))
    assert fed.input_shape == (2, 2) and fed.num_classes == 3 and fed.name == "files:mine"
    np.testing.assert_array_equal(fed.train.count, [3, 4, 5, 6])
    np.testing.assert_array_equal(fed.test.count, [2, 2, 2, 2])  # the files' own test splits
    with np.load(tmp_path / "mine" / "client02.npz") as f:
        np.testing.assert_allclose(np.asarray(fed.train.x[2, :5]), f["x"])
    assert sorted(os.listdir(tmp_path / "mine")) == before
    some = D.make_federated("files", 2, seed=0, path=str(tmp_path / "mine"))
    assert some.num_clients == 2
    _npz_clients(str(tmp_path / "tok"), tokens=True, test=False)
    tok = D.make_federated("files", 4, seed=0, path=str(tmp_path / "tok"), test_fraction=0.4)
    assert isinstance(tok.input_shape, text.TokenShape) and tok.input_shape.vocab == tok.num_classes == 9
    assert fljax.make_config(data={"dataset": "files", "path": str(tmp_path / "tok"), "num_clients": 4},
                             algo={"cohort_size": 2}, model={"name": "lstm", "options": {"embed": 4, "hidden": [4]}})


@pytest.mark.parametrize("problem,match", [
    ("empty", r"no <client>\.npz files in"),
    ("no_y", r"client00\.npz lacks \['y'\]"),
    ("half_test", r"holds only one of x_test and y_test"),
    ("mixed_test", r"has no x_test/y_test but others do"),
    ("shape", r"client 'client01': train samples of shape \(3,\)"),
    ("few", r"holds 4 clients, fewer than data\.num_clients=5"),
])
def test_bad_client_files_are_refused_in_one_line(tmp_path, problem, match):
    root = tmp_path / "f"
    if problem != "empty":
        _npz_clients(str(root))
    else:
        root.mkdir()
    if problem == "no_y":
        np.savez(root / "client00.npz", x=np.zeros((2, 2)))
    if problem == "half_test":
        np.savez(root / "client00.npz", x=np.zeros((2, 2)), y=np.zeros(2, int), x_test=np.zeros((1, 2)))
    if problem == "mixed_test":
        np.savez(root / "client00.npz", x=np.zeros((2, 2, 2)), y=np.zeros(2, int))
    if problem == "shape":
        np.savez(root / "client01.npz", x=np.zeros((2, 3)), y=np.zeros(2, int), x_test=np.zeros((1, 3)),
                 y_test=np.zeros(1, int))
    with pytest.raises(D.DataError, match=f"^files: .*{match}"):
        D.make_federated("files", 5 if problem == "few" else 4, seed=0, path=str(root))


def _table(tmp_path):
    rng = np.random.default_rng(1)
    rows = [(f"c{i % 3}", rng.integers(0, 2), rng.normal(), rng.normal(), "test" if k % 4 == 0 else "train")
            for k, i in enumerate(range(24))]
    path = tmp_path / "table.csv"
    path.write_text("user,label,a,b,split\n" + "".join(f"{c},{y},{a},{b},{s}\n" for c, y, a, b, s in rows))
    return path, rows


def test_a_csv_table_with_a_client_column(tmp_path):
    path, rows = _table(tmp_path)
    fed = D.make_federated("files", 3, seed=0, path=str(path), client_column="user", split_column="split")
    assert fed.input_shape == (2,) and fed.num_classes == 2
    assert int(fed.train.count.sum()) == 18 and int(fed.test.count.sum()) == 6
    first = [r for r in rows if r[0] == "c0" and r[4] == "train"]
    np.testing.assert_allclose(np.asarray(fed.train.x[0, :len(first)]), [[r[2], r[3]] for r in first], rtol=1e-6)
    with pytest.raises(D.DataError, match=r"^files: table\.csv has no column 'client' \(data\.client_column\); its "
                                          r"columns: "):
        D.make_federated("files", 3, seed=0, path=str(path))


def test_a_parquet_table_reads_with_pyarrow_and_is_refused_without_it(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path, rows = _table(tmp_path)
    table = pa.table({"user": [r[0] for r in rows], "label": [int(r[1]) for r in rows], "a": [r[2] for r in rows],
                      "b": [r[3] for r in rows]})
    pq.write_table(table, tmp_path / "t.parquet")
    fed = D.make_federated("files", 3, seed=0, path=str(tmp_path / "t.parquet"), client_column="user")
    assert int(fed.train.count.sum() + fed.test.count.sum()) == 24
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(D.DataError, match=r"^files: reading Parquet needs the package pyarrow, which is not "
                                          r"installed \(pip install pyarrow\), or give a \.csv table\.$"):
        D.make_federated("files", 3, seed=0, path=str(tmp_path / "t.parquet"), client_column="user")


def test_shakespeare_stand_in_has_the_real_set_s_shape_and_sizes():
    xs, ys = standins.shakespeare_speakers(300, seed=0, seq_len=80)
    chars = np.array([int((y != PAD).sum()) for y in ys])  # targets: every character, EOS and BOS of each line
    assert abs(np.log(np.median(chars)) - 7.567) < 0.25  # LEAF: median exp(7.567) = 1,930 characters
    assert all(x.shape[1] == 80 and x.dtype == np.int32 and x.max() < 90 for x in xs)
    first = standins.shakespeare_speakers(3, seed=0)[0]
    for a, b in zip(first, xs):  # a smaller population is the first speakers of a larger one
        np.testing.assert_array_equal(a, b)
    nat = leaf.shakespeare(leaf.ShakespeareOptions(source="standin"), 5, seed=0)
    assert nat.name == "shakespeare (stand-in)"
    again = leaf.shakespeare(leaf.ShakespeareOptions(source="standin"), 5, seed=0)
    np.testing.assert_array_equal(again.x, nat.x)
    assert D.SOURCES["shakespeare"].max_clients(leaf.ShakespeareOptions(source="standin")) == 715


def test_stackoverflow_stand_in_has_the_real_set_s_shape_and_sizes():
    x, y, counts = standins.stackoverflow_users(400, seed=0, seq_len=20, vocab=10_000, max_samples=None)
    assert abs(np.log(counts.mean()) - np.log(396.6)) < 0.35 and counts.min() >= 2
    assert (x[:, 0] == BOS).all() and x.max() == y.max() == 10_003 and x.shape == y.shape == (counts.sum(), 20)
    np.testing.assert_array_equal(x[:, 1:][y[:, :-1] != EOS], y[:, :-1][y[:, :-1] != EOS])
    words = y[(y > EOS)]
    assert abs(np.mean(words == 10_003) - 0.05) < 0.01  # 5% out of vocabulary
    capped = standins.stackoverflow_users(50, seed=0, max_samples=1_000)[2]
    assert capped.max() <= 1_000
    few, many = standins.stackoverflow_users(3, seed=1), standins.stackoverflow_users(1_005, seed=1)
    rows = int(few[2].sum())  # a smaller population is the first users of a larger one
    np.testing.assert_array_equal(many[2][:3], few[2])
    np.testing.assert_array_equal(many[0][:rows], few[0])
    np.testing.assert_array_equal(many[1][:rows], few[1])
    fed = D.make_federated("stackoverflow", 8, seed=0, max_samples=20, source="standin")
    assert fed.name == "stackoverflow (stand-in)" and fed.num_classes == 10_004


# ------------------------------------------------------------------ Stack Overflow: TFF's and FedJAX's files


def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def _pb(number: int, payload: bytes) -> bytes:
    """One length-delimited protocol-buffer field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _tf_example(**features) -> bytes:
    """A serialized tf.train.Example: str features as bytes_list (1), ints as a packed int64_list (3)."""
    entries = b""
    for name, value in features.items():
        if isinstance(value, int):
            feature = _pb(3, _pb(1, _varint(value)))
        else:
            feature = _pb(1, _pb(1, value.encode()))
        entries += _pb(1, _pb(1, name.encode()) + _pb(2, feature))
    return _pb(1, entries)


SO_USERS = {  # user: (train sentences, test sentences)
    "00017": (["how do i sort a list", "use sorted ( )", "thanks"], ["sort it ."]),
    "00042": (["the list is empty", "i use python", "a list of list", "sort the list", "zzz unknownword"], []),
    "00100": (["why is it slow", "it is python"], ["python is slow", "use a list"]),
    "01234": (["print the list ."], ["thanks ."]),
}
SO_WORDS = ["list", "the", "is", "a", "sort", "python", "use", "i", ".", "it"]  # most frequent first


def _stackoverflow_files(root, fmt="tff"):
    import sqlite3
    import zlib

    import msgpack

    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "stackoverflow.word_count"), "w") as f:
        f.writelines(f"{w} {1000 - i}\n" for i, w in enumerate(SO_WORDS + ["how", "do", "why", "slow", "thanks"]))
    if fmt == "tff":
        db = sqlite3.connect(os.path.join(root, "stackoverflow.sqlite"))
        db.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                   "serialized_example_proto BLOB NOT NULL)")
        db.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
                   "num_examples INTEGER NOT NULL)")
        rows = [(j, split, user, s) for split, k in (("train", 0), ("test", 1)) for user, v in SO_USERS.items()
                for j, s in enumerate(v[k])]
        rows += [(1, "heldout", "00017", "never read"), (0, "heldout", "99999", "a held out user")]
        for _, split, user, sentence in sorted(rows, key=lambda r: r[0]):  # users and splits interleaved
            db.execute("INSERT INTO examples VALUES (?, ?, ?)",
                       (split, user, _tf_example(creation_date="2010-01-01 UTC", score=3, tags="python|list",
                                                 title="a title", tokens=sentence, type="answer")))
        for split in ("train", "test", "heldout"):
            for user, n in db.execute("SELECT client_id, COUNT(*) FROM examples WHERE split_name = ? GROUP BY "
                                      "client_id", (split,)).fetchall():
                db.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (user, split, n))
        db.commit()
        db.close()
        return
    def blob(sentences):  # FedJAX's serialization: bytes arrays as msgpack extension 4 of (shape, flat list)
        arrays = {"tokens": msgpack.ExtType(4, msgpack.packb(((len(sentences),), [s.encode() for s in sentences]),
                                                             use_bin_type=True)),
                  "score": msgpack.ExtType(1, msgpack.packb(((len(sentences),), "int64",
                                                             np.arange(len(sentences), dtype=np.int64).tobytes()),
                                                            use_bin_type=True))}
        return zlib.compress(msgpack.packb(arrays, use_bin_type=True))
    for split, k in (("train", 0), ("test", 1)):
        db = sqlite3.connect(os.path.join(root, f"stackoverflow_{split}.sqlite"))
        db.execute("CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
                   "num_examples INTEGER NOT NULL)")
        for user, v in SO_USERS.items():
            if v[k]:
                db.execute("INSERT INTO federated_data VALUES (?, ?, ?)", (user.encode(), blob(v[k]), len(v[k])))
        db.commit()
        db.close()


def _so_rows(sentences, vocab, seq_len):
    """Reddi et al.'s rows written out: BOS, word ids (the vocab most frequent words after PAD, BOS, EOS; OOV
    last), EOS; x = [:-1], y = [1:], truncated or padded with PAD."""
    oov = 3 + vocab
    x, y = [], []
    for s in sentences:
        ids = [BOS] + [3 + SO_WORDS.index(w) if w in SO_WORDS[:vocab] else oov for w in s.split()] + [EOS]
        pad = lambda r: (r + [PAD] * seq_len)[:seq_len]  # noqa: E731
        x.append(pad(ids[:-1])), y.append(pad(ids[1:]))
    return np.asarray(x, np.int32).reshape(-1, seq_len), np.asarray(y, np.int32).reshape(-1, seq_len)


def test_tf_example_parser_reads_tokens_among_other_features():
    from fljax.data.stackoverflow import parse_example

    blob = _tf_example(score=172, tags="sql|median", tokens="if you're using sql 2005", type="answer")
    assert parse_example(blob) == b"if you're using sql 2005" and parse_example(blob, "tags") == b"sql|median"
    assert parse_example(blob, "title") is None


@pytest.mark.parametrize("fmt", ["tff", "fedjax"])
def test_stackoverflow_reads_tff_and_fedjax_files_as_reddi_et_al_tokenise_them(tmp_path, fmt, monkeypatch):
    data_dir, cache = str(tmp_path / "so"), str(tmp_path / "cache")
    _stackoverflow_files(data_dir, fmt)
    before = sorted(os.listdir(data_dir))
    options = dict(data_dir=data_dir, seq_len=5, vocab=8, max_samples=4, cache_dir=cache)
    fed = D.make_federated("stackoverflow", 3, seed=2, **options)
    assert fed.name == "stackoverflow" and fed.num_classes == 12 and fed.input_shape == (5,)
    users = sorted(SO_USERS)
    chosen = [users[i] for i in np.random.default_rng(2).permutation(4)[:3]]  # sorted ids, seeded shuffle
    for i, user in enumerate(chosen):
        train, test = SO_USERS[user]
        for split, sentences in (("train", train[:4]), ("test", test[:4])):
            arrays = getattr(fed, split)
            n = int(arrays.count[i])
            x, y = _so_rows(sentences, 8, 5)
            assert n == len(sentences)
            np.testing.assert_array_equal(np.asarray(arrays.x)[i, :n], x)
            np.testing.assert_array_equal(np.asarray(arrays.y)[i, :n], y)
    # read once: the tokenised users are cached, nothing is written beside the files
    assert sorted(os.listdir(data_dir)) == before and len(os.listdir(os.path.join(cache, "data"))) == 1
    from fljax.data import stackoverflow as so
    monkeypatch.setattr(so, "_sentences", lambda *a: pytest.fail("read again despite the cache"))
    again = D.make_federated("stackoverflow", 3, seed=2, **options)
    np.testing.assert_array_equal(np.asarray(again.train.x), np.asarray(fed.train.x))
    monkeypatch.undo()
    # test_from=train: the last test_fraction of every user's train sentences; the users with one sentence (01234)
    # cannot hold one out and are not drawn
    tail = D.make_federated("stackoverflow", 3, seed=2, test_from="train", test_fraction=0.5, **options)
    chosen = [[u for u in users if u != "01234"][i] for i in np.random.default_rng(2).permutation(3)]
    np.testing.assert_array_equal(np.asarray(tail.train.count) + np.asarray(tail.test.count),
                                  [min(4, len(SO_USERS[u][0])) for u in chosen])
    first_rows = [_so_rows(SO_USERS[u][0][:1], 8, 5)[0][0] for u in chosen]
    np.testing.assert_array_equal(np.asarray(tail.train.x)[:, 0], first_rows)
    with pytest.raises(D.DataError, match="4 clients need 4 users with at least 2 train sentences"):
        D.make_federated("stackoverflow", 4, seed=2, test_from="train", **options)


def test_stackoverflow_files_give_the_same_clients_in_both_formats(tmp_path):
    feds = []
    for fmt in ("tff", "fedjax"):
        _stackoverflow_files(str(tmp_path / fmt), fmt)
        feds.append(D.make_federated("stackoverflow", 4, seed=0, data_dir=str(tmp_path / fmt), seq_len=6, vocab=10,
                                     cache_dir=str(tmp_path / "cache"), storage="ragged"))
    for split in ("train", "test"):
        a, b = (getattr(f, split) for f in feds)
        np.testing.assert_array_equal(np.asarray(a.count), np.asarray(b.count))
        np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))


@pytest.mark.parametrize("layout, match", [
    ("none", r"^stackoverflow reads TFF's Stack Overflow files: put TFF's stackoverflow\.sqlite .* set "
             r"data\.data_dir to it, or use data\.source=standin\.$"),
    ("empty", r"^stackoverflow: no stackoverflow\.sqlite nor stackoverflow_train\.sqlite and "
              r"stackoverflow_test\.sqlite in '.*'; put TFF's"),
    ("lzma", r"^stackoverflow: .*stackoverflow\.sqlite\.lzma is compressed; decompress it once \(`xz -dk "),
    ("no_counts", r"^stackoverflow: no stackoverflow\.word_count in '.*' \(the vocabulary's word counts"),
    ("too_many", r"^stackoverflow: 9 clients need 9 users with at least 1 train sentence, '.*' holds 4; lower "
                 r"data\.num_clients\.$"),
    ("standin_test", r"^stackoverflow: the stand-in has no test split of its own; set data\.test_from"),
])
def test_stackoverflow_refuses_missing_files_in_one_line(tmp_path, layout, match):
    data_dir, cache = tmp_path / "so", tmp_path / "cache"
    options = {"cache_dir": str(cache)}
    if layout != "none":
        data_dir.mkdir()
        options["data_dir"] = str(data_dir)
    if layout == "lzma":
        (data_dir / "stackoverflow.sqlite.lzma").write_bytes(b"\x5d\x00")
    if layout in ("no_counts", "too_many"):
        _stackoverflow_files(str(data_dir))
    if layout == "no_counts":
        os.remove(data_dir / "stackoverflow.word_count")
    if layout == "standin_test":
        options = {"source": "standin", "test_from": "test"}
    with pytest.raises(D.DataError, match=match) as e:
        D.make_federated("stackoverflow", 9 if layout == "too_many" else 3, seed=0, **options)
    assert "\n" not in str(e.value) and not cache.exists()


def test_token_weighting_weighs_clients_by_their_target_tokens():
    """weighting: tokens aggregates with each client's count of non-padding train targets (TFF and Reddi et al.'s
    Stack Overflow), samples with its sentences (FedJAX's); for one label per sample the two agree."""
    import jax
    import jax.numpy as jnp

    from fljax.algorithms import make_algorithm
    from fljax.algorithms.base import ClientInput
    from fljax.models import make_model

    fed = D.make_federated("stackoverflow", 6, seed=0, max_samples=12, vocab=30, seq_len=20, source="standin")
    y, mask = np.asarray(fed.train.y), np.asarray(fed.train.mask)
    tokens = ((y != PAD) & mask[..., None]).sum(axis=(1, 2))
    rows = np.asarray(fed.train.count)
    assert not np.allclose(tokens / tokens.sum(), rows / rows.sum())  # the two weightings differ here
    np.testing.assert_array_equal(np.asarray(fed.train.tokens()), tokens)
    model = make_model("lstm", fed.input_shape, fed.num_classes, embed=4, hidden=[8])
    params = model.init(jax.random.PRNGKey(0))
    for weighting, want in (("tokens", tokens), ("samples", rows)):
        algo = make_algorithm("fedavg", weighting=weighting, local_steps=1, batch_size=2)
        for i in range(6):
            inp = ClientInput(state={}, train=jax.tree.map(lambda a: a[i], fed.train), key=jax.random.PRNGKey(i),
                              round=jnp.int32(0), down=params, model=model)
            assert int(algo.client_update(inp).weight) == int(want[i])
    digits = D.make_federated("digits", 4, seed=0)
    np.testing.assert_array_equal(np.asarray(digits.train.tokens()), np.asarray(digits.train.count))
    with pytest.raises(fljax.errors.OptionError, match="weighting must be one of"):
        make_algorithm("ditto", weighting="tokens")  # only where it is honoured: the FedAvg family


def test_emnist_stand_in_writers():
    xs, ys = standins.emnist_writers(200, seed=0)
    sizes = np.array([len(y) for y in ys])
    assert abs(np.log(sizes.mean()) - np.log(220.3)) < 0.1 and sizes.min() >= 10
    labels = np.concatenate(ys)
    assert abs(np.mean(labels < 10) - 0.49) < 0.03 and labels.max() == 61
    assert xs[0].shape[1:] == (28, 28, 1) and 0 <= xs[0].min() and xs[0].max() <= 1
    fed = D.make_federated("femnist62", 6, seed=0, source="standin", writers_per_client=1)
    assert fed.name == "femnist62 (stand-in)" and fed.num_classes == 62
    assert D.SOURCES["femnist62"].max_clients(leaf.LeafOptions(source="standin", writers_per_client=1)) == 3_400
    digits = D.make_federated("femnist", 4, seed=0, source="standin")
    assert int(digits.train.y.max()) <= 9


def test_pachinko_follows_its_definition():
    """Without exhaustion, a client's coarse classes follow θ_i and its fine classes within a coarse class φ_i."""
    labels = np.repeat(np.arange(100), 3_000)
    parts = D.partitioners.pachinko(labels, D.partitioners.CIFAR100_COARSE, 4, 4_000, seed=3)
    theta, phi = D.partitioners.pachinko_distributions(D.partitioners.CIFAR100_COARSE, 4, 0.1, 10.0, seed=3)
    assert len(np.unique(np.concatenate(parts))) == 16_000  # without replacement, disjoint
    coarse = D.partitioners.CIFAR100_COARSE
    for i, p in enumerate(parts):
        freq = np.bincount(coarse[labels[p]], minlength=20) / 4_000
        assert np.abs(freq - theta[i]).max() < 5 * np.sqrt(0.25 / 4_000)
        k = int(np.argmax(theta[i]))
        fine = labels[p][coarse[labels[p]] == k]
        members = np.flatnonzero(coarse == k)
        expect = phi[i, members] / phi[i, members].sum()
        got = np.array([np.mean(fine == f) for f in members])
        assert np.abs(got - expect).max() < 5 * np.sqrt(0.25 / len(fine))


def test_pachinko_exhausts_classes_and_renormalises_down_to_the_last_sample():
    labels = np.repeat(np.arange(100), 5)
    parts = D.partitioners.pachinko(labels, D.partitioners.CIFAR100_COARSE, 5, 100, seed=0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(500))
    with pytest.raises(D.PartitionError, match="need 600, the pool holds 500"):
        D.partitioners.pachinko(labels, D.partitioners.CIFAR100_COARSE, 6, 100, seed=0)


def test_pachinko_through_federate_cuts_test_slices_the_same_way():
    rng = np.random.default_rng(0)
    y_train, y_test = np.repeat(np.arange(100), 10), np.repeat(np.arange(100), 2)
    pooled = D.Pooled(rng.normal(size=(1000, 3)).astype(np.float32), y_train,
                      rng.normal(size=(200, 3)).astype(np.float32), y_test, 100, "cifar100-like")
    fed = D.federate(pooled, 10, "pachinko", seed=1)
    np.testing.assert_array_equal(fed.train.count, 100)
    np.testing.assert_array_equal(fed.test.count, 20)
    with pytest.raises(fljax.errors.OptionError, match="data.partition pachinko splits CIFAR-100"):
        fljax.make_config(data={"dataset": "digits", "partition": "pachinko"})


def test_the_published_configs_validate():
    from fljax.config import load_config

    for name, dataset, model in [("shakespeare_fedavg", "shakespeare", "lstm"),
                                 ("stackoverflow_fedavg", "stackoverflow", "lstm"),
                                 ("emnist_fedavg", "femnist62", "emnist_cnn")]:
        cfg = load_config(os.path.join(ROOT, "configs", f"{name}.yaml"))
        assert (cfg.data.dataset, cfg.model.name) == (dataset, model)
    # each published config reads the real set's files (a run without data_dir stops in one line) and runs offline
    # on the stand-in with data.source=standin (docs/data.md, configs/README.md)
    real = {"emnist": "leaf", "shakespeare": "leaf", "stackoverflow": "tff"}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
        prefix = os.path.basename(path).split("_")[0]
        if prefix in real:
            options = load_config(path).data.options
            assert (options["source"], options.get("data_dir")) == (real[prefix], None), path
            assert load_config(path, ["data.source=standin"]).data.options["source"] == "standin"
    for name in ("fedavg", "fedadam", "fedyogi", "fedadagrad"):  # a fixed sample of 50 speakers; null: all of them
        cfg = load_config(os.path.join(ROOT, "configs", f"shakespeare_{name}.yaml"))
        assert (cfg.eval_clients, cfg.eval_every, cfg.rounds, cfg.data.num_clients) == (50, 10, 1200, 715)
        assert load_config(os.path.join(ROOT, "configs", f"shakespeare_{name}.yaml"),
                           ["eval_clients=null"]).eval_clients is None


@pytest.mark.parametrize("name, kind", [(f"{d}_fed{k}", k) for d in ("emnist", "shakespeare", "stackoverflow")
                                         for k in ("adagrad", "adam", "yogi")]
                         + [("emnist_conv_fedjax", "adam"), ("stackoverflow_word_fedjax", "adam")])
def test_the_fedopt_configs_resolve_to_their_server_optimizer(name, kind):
    from fljax.config import load_config
    from fljax.experiment import resolve

    algo = resolve(load_config(os.path.join(ROOT, "configs", f"{name}.yaml"))).algorithm
    assert algo.server.server_optimizer == kind and algo.local.local_epochs == 1


def test_the_shakespeare_config_runs_from_the_cli_on_the_stand_in(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fljax.cli", "run", os.path.join(ROOT, "configs", "shakespeare_fedavg.yaml"),
           "--set", "data.source=standin", "--set", "data.num_clients=6", "--set", "data.max_samples=4",
           "--set", "model.options.hidden=[8]", "--set", "model.options.embed=4", "--set", "algo.cohort_size=3",
           "--set", "rounds=2", "--set", "eval_every=1", "--set", "eval_clients=3", "--quiet", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "shakespeare (stand-in)" and "global_perplexity" in summary["final"]
    # the config evaluates a fixed sample (50 of 715 speakers; here 3 of 6), and the run's table says so
    assert (summary["eval_clients"], summary["num_clients"], len(summary["eval_client_ids"])) == (3, 6, 3)
    assert "3 of 6 clients" in proc.stdout


def test_the_stackoverflow_config_runs_on_the_stand_in_and_without_files_stops_in_one_line(tmp_path):
    config = os.path.join(ROOT, "configs", "stackoverflow_fedavg.yaml")
    small = ["--set", "data.num_clients=4", "--set", "data.max_samples=3", "--set", "data.vocab=30",
             "--set", "model.options={embed: 4, hidden: [8], projection: 4}", "--set", "algo.cohort_size=2",
             "--set", "rounds=1", "--set", "eval_every=1", "--quiet"]
    run = lambda *args: subprocess.run([sys.executable, "-m", "fljax.cli", "run", config, *small, *args],  # noqa: E731
                                       capture_output=True, text=True, cwd=tmp_path, timeout=900,
                                       env={**os.environ, "PYTHONPATH": ROOT, "FLJAX_CACHE": str(tmp_path / "c")})
    refused = run("--out", str(tmp_path / "refused"))
    assert refused.returncode == 2 and refused.stderr.startswith("fljax: error: stackoverflow reads TFF's Stack")
    assert refused.stderr.count("\n") == 1 and sorted(os.listdir(tmp_path)) == []
    proc = run("--set", "data.source=standin", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "stackoverflow (stand-in)" and "global_perplexity" in summary["final"]


# ------------------------------------------------------------------------------ damaged and malformed files (issue 41)

_ROLE = {"x": ["To be, or", "o be, or ", " be, or n"], "y": [" ", "n", "o"]}  # three windows of one role
_TWEET = ["1", "date", "NO_QUERY", "alice", "so glad"]
_PIXELS = [0.5] * 784


def _blob(user_data, users=None):
    return json.dumps({"users": list(user_data) if users is None else users,
                       "num_samples": [len(v.get("y", [])) if isinstance(v, dict) else 0 for v in user_data.values()],
                       "user_data": user_data})


@pytest.mark.parametrize("dataset, content, message", [
    ("shakespeare", "", "is empty"),
    ("shakespeare", '{"users": ["a"], "user_data": {"a": {"x": ["To be', "is not valid JSON (Unterminated string "
                                                                       "starting at: line 1 column 44)"),
    ("shakespeare", b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "is not text (not UTF-8 JSON)"),
    ("shakespeare", "[1, 2, 3]", "holds a list, not LEAF's mapping of users, num_samples and user_data"),
    ("shakespeare", '{"users": ["a"], "num_samples": [3]}', "has no 'user_data' (LEAF's files hold users, "
                                                             "num_samples and user_data)"),
    ("shakespeare", '{"users": "a", "user_data": {}}', "has 'users' of type str, not a list"),
    ("shakespeare", _blob({"a": _ROLE}, users=["a", "b"]), "user 'b' is listed in 'users' but has no entry in "
                                                            "'user_data'"),
    ("shakespeare", _blob({"a": [1, 2]}), "user 'a': its user_data entry must be a mapping with lists 'x' and 'y', "
                                          "got a list"),
    ("shakespeare", _blob({"a": {"x": _ROLE["x"]}}), "user 'a': its user_data entry must be a mapping with lists "
                                                     "'x' and 'y', got a mapping with keys ['x']"),
    ("shakespeare", _blob({"a": {"x": [1, 2, 3], "y": _ROLE["y"]}}), "user 'a': x[0] must be a text window, got 1"),
    ("shakespeare", _blob({"a": {"x": _ROLE["x"], "y": [" ", "no", "o"]}}), "user 'a': y[1] must be one character"),
    ("shakespeare", _blob({"a": {"x": _ROLE["x"] * 14 + ["x"], "y": _ROLE["y"][:2] + ["o"] * 3}}),
     "user 'a' has 43 x rows and 5 y labels; LEAF pairs every x row with one label"),  # the probe's zipped user
    ("sent140", _blob({"alice": {"x": [["1", "so glad"]], "y": [1]}}), "user 'alice': x[0] must be LEAF's 5 fields "
                                                                      "[id, date, query, user, text]"),
    ("sent140", _blob({"alice": {"x": [_TWEET], "y": ["1"]}}), "user 'alice': labels must be integers"),
    ("sent140", _blob({"alice": {"x": [_TWEET, _TWEET], "y": [1]}}), "user 'alice' has 2 x rows and 1 y labels"),
    ("femnist", _blob({"w1": {"x": [[0.5] * 10], "y": [3]}}), "user 'w1': x[0] must be a row of 784 pixel values "
                                                              "(28×28), got a row of 10"),
    ("femnist", _blob({"w1": {"x": [_PIXELS], "y": [70]}}), "user 'w1': labels must be in 0..61 (LEAF's 62 "
                                                            "classes), got [70]"),
])
def test_malformed_leaf_files_are_refused_in_one_line_naming_file_and_user(tmp_path, dataset, content, message):
    """Issue 41 items 2 and 3: a LEAF file that is empty, cut short, binary, a list, without user_data, with a user
    listed without data, rows of the wrong kind, labels out of range, or a user whose y list is shorter than its x
    list (43 windows with 5 labels were zipped to 5 sequences, with exit 0) is refused in one line that names the
    file (and the user where it is one user's), before anything is cached."""
    data_dir, cache = tmp_path / "leaf", tmp_path / "cache"
    data_dir.mkdir()
    path = data_dir / "all_data_0.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    options = {"data_dir": str(data_dir)} if dataset == "femnist" else {"data_dir": str(data_dir), "cache_dir":
                                                                       str(cache)}
    with pytest.raises(D.DataError) as e:
        D.load_source(dataset, num_clients=1, seed=0, **options)
    text_ = str(e.value)
    assert text_.startswith(f"{dataset}: {path}") and message in text_ and "\n" not in text_, text_
    assert not cache.exists()


def test_a_well_formed_leaf_file_of_the_same_shapes_reads(tmp_path):
    """The refusals above are of the damage alone: the same files, well formed, read (the one-to-one pairs of the
    zipped user keep all 43 samples)."""
    data_dir = tmp_path / "leaf"
    data_dir.mkdir()
    role = {"x": _ROLE["x"] * 14 + ["x"], "y": _ROLE["y"] * 14 + ["o"]}
    (data_dir / "a.json").write_text(_blob({"a": role, "b": _ROLE}))
    nat = D.load_source("shakespeare", num_clients=2, seed=0, data_dir=str(data_dir), seq_len=8,
                        cache_dir=str(tmp_path / "c"))
    chained = leaf._chained_snippets(role["x"], role["y"])
    assert sorted(nat.counts.tolist()) == sorted([text.chunk_count([len(s) for s in chained], 8),
                                                  text.chunk_count([len(s) for s in leaf._chained_snippets(
                                                      _ROLE["x"], _ROLE["y"])], 8)])
    (data_dir / "a.json").write_text(_blob({"w": {"x": [_PIXELS] * 3, "y": [1, 40, 61]}}))
    writers = D.load_source("femnist62", num_clients=1, seed=0, data_dir=str(data_dir), writers_per_client=1)
    assert writers.x.shape == (3, 28, 28, 1) and writers.y.tolist() == [1, 40, 61]


@pytest.mark.parametrize("damage, message", [
    ("text", "stackoverflow.sqlite is not TFF's Stack Overflow database (DatabaseError: file is not a database); it "
             "must hold the tables examples(split_name, client_id, serialized_example_proto) and client_metadata("),
    ("tables", "stackoverflow.sqlite is not TFF's Stack Overflow database (OperationalError: no such table: "
               "client_metadata)"),
    ("proto", "stackoverflow.sqlite: user '00017': a stored example cannot be decoded"),
    ("counts", "stackoverflow.word_count is not text (UTF-8 'word count' lines)"),
    ("fedjax", "stackoverflow_train.sqlite: user b'00017': a stored example cannot be decoded (error: "),
])
def test_damaged_stackoverflow_files_are_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    """Issue 41 item 2: a stackoverflow.sqlite that is not a database or lacks TFF's tables, a damaged example or
    client blob, a binary word-count file: one line naming the file (and the user whose data is damaged), not a
    46-line sqlite3/IndexError traceback."""
    import sqlite3

    data_dir = tmp_path / "so"
    _stackoverflow_files(str(data_dir), "fedjax" if damage == "fedjax" else "tff")
    tff = data_dir / "stackoverflow.sqlite"
    if damage == "text":
        tff.write_text("not a database\n" * 100)
    elif damage in ("tables", "proto"):
        with sqlite3.connect(tff) as db:
            if damage == "tables":
                db.execute("DROP TABLE client_metadata")
            else:  # a protocol buffer cut short: a field that says it is longer than what follows
                db.execute("UPDATE examples SET serialized_example_proto = ? WHERE client_id = '00017'",
                           (b"\x0a\xff\x01\x0a",))
    elif damage == "counts":
        (data_dir / "stackoverflow.word_count").write_bytes(b"\xff\xfe\x00\x01 12\n")
    else:
        with sqlite3.connect(data_dir / "stackoverflow_train.sqlite") as db:
            db.execute("UPDATE federated_data SET data = ? WHERE client_id = ?", (b"not zlib", b"00017"))
    with pytest.raises(D.DataError) as e:
        D.load_source("stackoverflow", num_clients=4, seed=0, data_dir=str(data_dir), cache_dir=str(tmp_path / "c"))
    assert str(e.value).startswith("stackoverflow: ") and message in str(e.value) and "\n" not in str(e.value), \
        str(e.value)


def test_a_damaged_tokenised_cache_entry_is_moved_aside_and_rebuilt(tmp_path, capsys):
    """Issue 41 item 4: a cache entry cut short, overwritten, holding a pickled object array (which is never
    loaded) or lacking an array stopped every later run with NumPy's advice to unpickle. It is moved aside to
    <entry>.damaged-<id>, a one-line warning names it, the arrays are tokenised again (equal to the first ones) and
    written back, so the next call reads the cache without a word."""
    data_dir, cache = str(tmp_path / "leaf"), tmp_path / "cache"
    _shakespeare_files(data_dir)
    options = leaf.ShakespeareOptions(data_dir=data_dir, seq_len=8, cache_dir=str(cache))
    first = leaf.shakespeare(options, 3, seed=0)
    (entry,) = (cache / "data").iterdir()
    good = entry.read_bytes()
    object_array = tmp_path / "obj.npz"
    np.savez(object_array, x=np.array([{"a": 1}], dtype=object))
    damages = {"cut short": good[:len(good) // 2], "overwritten": b"garbage" * 10,
               "pickled": object_array.read_bytes(), "lacks counts": None}
    for why, content in damages.items():
        if content is None:
            with np.load(entry) as f:
                np.savez(entry, x=f["x"], y=f["y"])
        else:
            entry.write_bytes(content)
        capsys.readouterr()
        again = leaf.shakespeare(options, 3, seed=0)
        np.testing.assert_array_equal(again.x, first.x)
        np.testing.assert_array_equal(again.y, first.y)
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"fljax: warning: the tokenised-data cache entry {entry} is "
                                                   f"damaged (") and "tokenised the files again" in err[0], (why, err)
        aside = [p for p in (cache / "data").iterdir() if p.name.startswith(entry.name + ".damaged-")]
        assert aside and entry.read_bytes() == good, why
        for p in aside:
            p.unlink()
    leaf.shakespeare(options, 3, seed=0)
    assert capsys.readouterr().err == ""  # the rebuilt entry reads
