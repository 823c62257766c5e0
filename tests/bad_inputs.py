"""The bad-input catalogue: what a user may get wrong, and the one line the command line answers with.

Every case runs ``fljax`` (``fljax.cli.main``) in an empty working directory holding only the case's files (and, for
a ``busy`` case, directories another process holds locked), with the case's environment variables set and its
``missing`` modules unimportable (a package that is not installed), and must end with exit status 2, one line on
stderr starting ``fljax: error:`` (no traceback), a message containing the case's ``expect`` fragment, and nothing
written (no file added, removed or changed). A ``python`` case runs its code instead (with ``fljax``, ``np`` and
``from_arrays`` in scope), which must raise a ``ValueError`` (``fljax.ConfigError``, ``fljax.data.DataError``) of
one line, nothing written. ``tests/test_cli.py`` runs every case; ``docs/errors.md`` is generated from them (a
section per ``section``, in the order of their first case), and a test fails when it differs from the regenerated
text. Regenerate it with::

    python tests/bad_inputs.py
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "errors.md")


@dataclasses.dataclass(frozen=True)
class Case:
    section: str
    argv: tuple[str, ...]  # after `fljax` (a python case: none)
    expect: str  # a fragment the message must contain
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written into the working directory first
    shown: str = ""  # how the catalogue shows a file's content (default: the text itself)
    busy: tuple[str, ...] = ()  # directories another fljax process holds locked during the case
    env: tuple[tuple[str, str], ...] = ()  # environment variables set during the case
    missing: tuple[str, ...] = ()  # modules that cannot be imported during the case (a package not installed)
    python: str = ""  # a python case: the code that must raise


def _case(section, command, expect, files=(), shown="", busy=(), env=(), missing=()):
    return Case(section, tuple(command.split()), expect, tuple(files), shown, tuple(busy), tuple(env), tuple(missing))


def _python(section, code, expect):
    return Case(section, (), expect, python=code)


_FILES = "Config files and YAML"
_KEYS = "Keys"
_NAMES = "Names"
_TYPES = "Types and numbers"
_VALUES = "Values"
_DATA = "Data that cannot be split as asked"
_COMMANDS = "Commands"
_RESUME = "Run directories and --resume"
_MEMORY = "Simulations too large for the memory"
_OWN_DATA = "Data sets that are not there"
_OUTPUT = "Output options"
_PRIVACY = "Privacy and compression"
_GROUPS = "Process groups (--processes and the FLJAX_* variables)"
_STUDIES = "Reproductions (fljax reproduce)"
_TUNE = "Tuning by gradient (fljax tune)"
_DAMAGED = "Damaged files"
_PYTHON = "Your own data, from Python"
_HETERO = "Participation, devices and asynchrony"
_TEXT = "Text data sets and their files (LEAF, Stack Overflow)"
_RUN = "r/config.yaml", "algorithm: fedavg\n"
_COMPARE = [("c/config.yaml", "data:\n  dataset: digits\n"),
            ("c/summary.json", '{"algorithms": [{"label": "fedavg", "algorithm": "fedavg", "hyperparameters": {}}]}\n')]
_SWEEP = [("s/config.yaml", "algorithm: fedprox\n"), ("s/summary.json", '{"grid": {"algo.lr": [0.1, 0.2]}}\n')]
_OWN = [_RUN, ("r/directory.json", '{"kind": "run", "origin": {"data": {"name": "arrays", "clients": 4, '
                                   '"fingerprint": "c0dc0790f89bcfe0"}}}\n')]
_OWN_MODEL = [_RUN, ("r/directory.json", '{"kind": "run", "origin": {"model": {"class": "Net", '
                                         '"fingerprint": "5be0e1d4f5a7b2c1"}}}\n')]
_STUDY = [("st/directory.json", '{"kind": "study", "origin": "config", "study": "dfedalt"}\n')]
_MEMBER = [_COMPARE[0], ("c/directory.json", '{"kind": "comparison", "origin": "config", "algorithms": '
                                              '[{"label": "fedavg", "algorithm": "fedavg", "hyperparameters": {}}]}\n'),
           ("c/fedavg/config.yaml", "algorithm: fedavg\n"),
           ("c/fedavg/directory.json", '{"kind": "run", "origin": "config", "part_of": "comparison"}\n')]
_GROUP = (("FLJAX_COORDINATOR", "localhost:1"), ("FLJAX_NUM_PROCESSES", "2"), ("FLJAX_PROCESS_ID", "1"))
_PAIRS = "[(np.ones((2, 3)), [0, 1])] * 4, [(np.ones((1, 3)), [1])] * 4"  # 4 clients of from_arrays
_SMALL = " --set data.num_clients=4 --set algo.cohort_size=2"
_MLP = "run --set model.name=mlp "
_DIGITS = "run --dataset digits "
_SYNTHETIC = "run --dataset synthetic "  # `run` without a file starts from the digits quick-start preset
_DP = "run --set privacy.noise_multiplier=1 --set privacy.clip_norm=1 "
_LEAF_RUN = "run --dataset shakespeare --set data.data_dir=leaf --set model.name=lstm"
_WINDOWS = {"x": ["To be, or", "o be, or ", " be, or n"], "y": [" ", "n", "o"]}  # LEAF's Shakespeare samples


def _leaf(user_data: dict, users: list | None = None) -> str:
    """A LEAF JSON file of these users' data."""
    import json

    return json.dumps({"users": list(user_data) if users is None else users,
                       "num_samples": [len(v["y"]) for v in user_data.values()], "user_data": user_data}) + "\n"


_EXAMPLE = _DP + "--set privacy.level=example "

CASES = [
    _case(_FILES, "run nope.yaml", "config file 'nope.yaml' does not exist."),
    _case(_FILES, "run bad.yaml", "config file 'bad.yaml' is not valid YAML:", [("bad.yaml", "rounds: [1\n")]),
    _case(_FILES, "run list.yaml", "must hold a mapping of keys to values", [("list.yaml", "- rounds: 3\n")]),
    _case(_FILES, "run dup.yaml", "key 'rounds' appears twice in one mapping (lines 1 and 2)",
          [("dup.yaml", "rounds: 3\nrounds: 30\n")]),
    _case(_FILES, "run key.yaml", "key 1 (line 1) is not a name", [("key.yaml", "1: fedavg\n")]),
    _case(_FILES, "run algokey.yaml", "key 0.1 (line 2) is not a name", [("algokey.yaml", "algo:\n  0.1: lr\n")]),
    _case(_FILES, "run deep.yaml", "nests deeper than 32 levels",
          [("deep.yaml", "rounds: " + "[" * 5000 + "]" * 5000 + "\n")], "rounds: [[[[…]]]] (5,000 levels)"),
    _case(_FILES, "run --set rounds=" + "[" * 5000 + "]" * 5000, "nests deeper than 32 levels", (),
          "fljax run --set rounds=[[[[…]]]] (5,000 levels)"),
    _case(_FILES, "run alias.yaml", "aliases (*name) are not supported",
          [("alias.yaml", "seed: &s 3\nrounds: *s\n")]),
    _case(_FILES, "run tag.yaml", "tag 'tag:yaml.org,2002:python/object/apply:os.system' (line 1) is not supported",
          [("tag.yaml", "name: !!python/object/apply:os.system [ls]\n")]),
    _case(_FILES, "run big.yaml", "has 120 digits", [("big.yaml", "rounds: " + "9" * 120 + "\n")],
          "rounds: 999…9 (120 digits)"),
    _case(_KEYS, "run --set roundz=3", "roundz is not a valid key. Did you mean 'rounds'?"),
    _case(_KEYS, "run --set data.alpah=0.1", "data.alpah is not a valid key for data set 'digits' with partition "
                                             "'dirichlet'. Did you mean 'alpha'?"),
    _case(_KEYS, _SYNTHETIC + "--set data.alpha=0.1", "data.alpha is an option of partitions 'dirichlet' and "
                                             "'client_dirichlet', not of data set 'synthetic'"),
    _case(_KEYS, "run configs/fedavg.yaml --set data.partition=iid",
          "data.alpha is an option of partitions 'dirichlet' and 'client_dirichlet', not of data set 'digits' with "
          "partition 'iid'; remove it (or set it to null)."),
    _case(_KEYS, _SYNTHETIC + "--set data.noise=0.5", "data.noise is an option of data set 'digits'"),
    _case(_KEYS, "run --set algo.lrr=0.1", "algo.lrr is not a valid key for algorithm 'fedavg'. Did you mean 'lr'?"),
    _case(_KEYS, _MLP + "--set model.options.hiden=[8]",
          "model.options.hiden is not a valid key for model 'mlp'. Did you mean 'hidden'?"),
    _case(_KEYS, _SYNTHETIC + "--set model.name=auto --set model.options.hidden=[8]",
          "model.options.hidden is not a valid key for model 'logreg' (picked by model.name: auto"),
    _case(_KEYS, "run --set data=5", "data must be a mapping of keys to values, got 5."),
    _case(_KEYS, "run --set rounds", "override 'rounds' must look like key=value"),
    _case(_KEYS, "run --set data..alpha=0.1", "'data..alpha' is not a dotted key name"),
    _case(_KEYS, "run configs/fedavg.yaml --set rounds.x=1", "'rounds' is not a section"),
    _case(_NAMES, "run --algorithm fedavgg", "got 'fedavgg'. Did you mean 'fedavg'?"),
    _case(_NAMES, "run --algorithm fedgia", "algorithm 'fedgia' solves consensus regression problems"),
    _case(_NAMES, "run --dataset fedgia_v1", "data set 'fedgia_v1' poses consensus regression problems; choose"),
    _case(_KEYS, "run --algorithm fedgia --dataset fedgia_v1 --set model.name=mlp", "model must be left out"),
    _case(_KEYS, "run --set stop.tol=1e-7", "stop is for consensus-regression problems only"),
    _case(_NAMES, "run --dataset digitz", "data.dataset must be one of ["),
    _case(_NAMES, "run --set data.partition=dirichlett", "data.partition must be one of ["),
    _case(_NAMES, _SYNTHETIC + "--set data.partition=iid", "data.partition must be 'natural' for synthetic"),
    _case(_NAMES, _DIGITS + "--set data.partition=natural", "data.partition cannot be 'natural' for digits"),
    _case(_NAMES, "run --set model.name=mlpp", "model.name must be one of ["),
    _case(_NAMES, _SYNTHETIC + "--set model.name=cnn1", "model.name cannot be 'cnn1' for inputs of shape (60,)"),
    _case(_NAMES, "run --set executor=vmapp", "executor must be one of ["),
    _case(_NAMES, "run --set model.conv_impl=fast", "model.conv_impl must be one of ['auto', 'native', 'patches', 'shifts']"),
    _case(_NAMES, _DIGITS + "--set data.test_rounding=round", "data.test_rounding must be one of ['largest_remainder'"),
    _case(_NAMES, _DIGITS + "--set data.partition=client_dirichlet --set data.on_exhausted=reuse",
          "data.on_exhausted must be one of ['refill', 'redraw'], got 'reuse'."),
    _case(_NAMES, "run --set model.name=resnet18_gn --dataset digits --set model.options.weight_init=torch",
          "model.options.weight_init must be one of ['flax', 'pytorch'], got 'torch'. Did you mean 'pytorch'?"),
    _case(_TYPES, "run --set rounds=ten", "rounds must be an integer, got 'ten'."),
    _case(_TYPES, "run --set rounds=1e20", "rounds must be an integer, got 1e+20."),
    _case(_TYPES, "run --set algo.lr=fast", "algo.lr must be a number, got 'fast'."),
    _case(_TYPES, "run --set algo.lr=.nan", "algo.lr must be a finite number, got nan."),
    _case(_TYPES, "run --set data.num_clients=1.5", "data.num_clients must be an integer, got 1.5."),
    _case(_TYPES, _DIGITS + "--set data.alpha=.nan", "data.alpha must be a finite number, got nan."),
    _case(_TYPES, _SYNTHETIC + "--set data.synthetic_beta=.inf", "data.synthetic_beta must be a finite number, got inf."),
    _case(_TYPES, _MLP + "--set model.options.hidden=abc", "model.options.hidden must be a list, got 'abc'."),
    _case(_TYPES, _MLP + "--set model.options.hidden=[16.5]", "model.options.hidden[0] must be an integer, got 16.5."),
    _case(_TYPES, _MLP + "--set model.options.hidden=[64,x]", "model.options.hidden[1] must be an integer, got 'x'."),
    _case(_TYPES, "run --set algo.weight_decay=1e300", "algo.weight_decay must be at most 3.403e+38 in magnitude "
                                                       "(computations are float32, where it would be infinite)"),
    _case(_TYPES, "run --set seeds=true", "seeds must be an integer, got True."),
    _case(_TYPES, "run --set name=[a]", "name must be a string or null, got ['a']."),
    _case(_VALUES, "run --set rounds=0", "rounds must be between 1 and 2147483647, got 0."),
    _case(_VALUES, "run --set rounds=100000000000000000000", "rounds must be an integer of at most 9223372036854775807"),
    _case(_VALUES, "run --set eval_every=-5", "eval_every must be between 1 and 2147483647, got -5."),
    _case(_VALUES, "run --set eval_clients=0", "eval_clients must be between 1 and 2147483647, got 0."),
    _case(_VALUES, "run --set eval_clients=51", "eval_clients must be at most data.num_clients=50 (the clients it "
                                                "samples; null: every client), got 51."),
    _case(_VALUES, "run --algorithm fedgia --dataset fedgia_v1 --set eval_clients=5",
          "eval_clients samples the clients of classification data; this problem's evaluation measures every client"),
    _case(_VALUES, "run --set seed=-1", "seed must be between 0 and 4294967295 (a uint32 PRNG seed), got -1."),
    _case(_VALUES, "run --set seed=4294967296", "seed must be between 0 and 4294967295"),
    _case(_VALUES, "run --set data.seed=-3", "data.seed must be between 0 and 4294967295"),
    _case(_VALUES, "run --seeds 0", "seeds must be between 1 and 10000, got 0."),
    _case(_VALUES, "run --seeds 100000000", "seeds must be between 1 and 10000, got 100000000."),
    _case(_VALUES, "run --set seed=4294967295 --seeds 3", "seeds must be at most 1 from seed 4294967295"),
    _case(_VALUES, "run --checkpoint-every -1", "checkpoint_every must be between 0 and 2147483647, got -1."),
    _case(_VALUES, "run --set chunk_size=0", "chunk_size must be between 1 and 2147483647, got 0."),
    _case(_VALUES, "run --set name=a/b", "name must not contain '/' (it names the run directory)"),
    _case(_VALUES, "run --set name=../../x", "name must not contain '/' (it names the run directory)"),
    _case(_VALUES, "run --set data.num_clients=0", "data.num_clients must be >= 1, got 0."),
    _case(_VALUES, _SYNTHETIC + "--set data.num_clients=1000000000",
          "data.num_clients must be at most 100000 (the most clients synthetic generates), got 1000000000."),
    _case(_VALUES, _DIGITS + "--set data.num_clients=5000",
          "data.num_clients must be at most 1297 (the training samples of digits, at least one per client)"),
    _case(_VALUES, _SYNTHETIC + "--set data.max_samples=0", "data.max_samples must be >= 11, got 0."),
    _case(_VALUES, _SYNTHETIC + "--set data.max_samples=-5", "data.max_samples must be >= 11, got -5."),
    _case(_VALUES, "run --set data.test_fraction=1", "data.test_fraction must be in (0, 1), got 1.0."),
    _case(_VALUES, _DIGITS + "--set data.test_per_client=0", "data.test_per_client must be >= 1, got 0."),
    _case(_VALUES, _DIGITS + "--set data.test_per_client=-3", "data.test_per_client must be >= 1, got -3."),
    _case(_VALUES, _DIGITS + "--set data.alpha=0", "data.alpha must be > 0, got 0.0."),
    _case(_VALUES, _DIGITS + "--set data.alpha=-0.5", "data.alpha must be > 0, got -0.5."),
    _case(_VALUES, _DIGITS + "--set data.noise=-1", "data.noise must be >= 0, got -1.0."),
    _case(_VALUES, "run --dataset mnist --set data.limit=-1", "data.limit must be >= 1, got -1."),
    _case(_VALUES, _DIGITS + "--set data.partition=pathological --set data.classes_per_client=11",
          "data.classes_per_client must be at most 10 (the data set's classes), got 11."),
    _case(_VALUES, _DIGITS + "--set data.partition=client_dirichlet --set data.samples_per_client=5000",
          "data.samples_per_client must be at most 1297 (the train pool's size), got 5000."),
    _case(_VALUES, _MLP + "--set model.options.hidden=[0]", "model.options.hidden element 0 must be >= 1, got 0."),
    _case(_VALUES, _MLP + "--set model.options.hidden=[-4]", "model.options.hidden element 0 must be >= 1, got -4."),
    _case(_VALUES, "run --dataset digits --set model.name=resnet18_gn --set model.options.groups=3",
          "model.options.groups must divide 64"),
    _case(_VALUES, "run --set algo.lr=-0.1", "algo.lr must be > 0, got -0.1."),
    _case(_VALUES, "run --set algo.weight_decay=.inf", "algo.weight_decay must be a finite number, got inf."),
    _case(_VALUES, "run --set data.num_clients=20 --set algo.cohort_size=50",
          "algo.cohort_size must be between 1 and num_clients=20 (or null for full participation), got 50."),
    _case(_VALUES, 'run --set data.num_clients=20 --set groups=[{"name":"a","size":12}]',
          "groups sizes must add up to data.num_clients=20, got 12."),
    _case(_VALUES, 'run --set data.num_clients=4 --set algo.cohort_size=null '
                   '--set groups=[{"name":"a","size":2},{"name":"b","size":2,"algo":{"lr":0}}]',
          "groups[1].algo.lr must be > 0, got 0.0."),
    _case(_VALUES, 'run --set data.num_clients=4 --set algo.cohort_size=null '
                   '--set groups=[{"name":"a","size":2,"model":{"name":"mlpp"}},{"name":"b","size":2}]',
          "groups[0].model.name must be one of ["),
    _case(_VALUES, 'run --set data.num_clients=4 --set algo.cohort_size=null '
                   '--set groups=[{"name":"a","size":2,"model":{"nme":"mlp"}},{"name":"b","size":2}]',
          "groups[0].model.nme is not a valid key. Did you mean 'name'?"),
    _case(_VALUES, "run --set name=" + "a" * 100_000, "name must be at most 200 bytes long (it names the run "
                                                       "directory), got 100,000 bytes", (),
          "fljax run --set name=aaa…a (100,000 characters)"),
    _case(_VALUES, "run --set algorithm=quped --set algo.bits=0", "algo.bits must be in 1..8 or null (full "
                                                                  "precision), got 0."),
    _case(_VALUES, 'run --set data.storage=ragged --set data.num_clients=4 --set algo.cohort_size=null '
                   '--set groups=[{"name":"a","size":2},{"name":"b","size":2}]',
          "groups need padded client arrays (data.storage: padded), which groups slice; the data is stored ragged."),
    _case(_DATA, _DIGITS + "--set data.num_clients=500 --set data.alpha=0.001 --set algo.cohort_size=5",
          "dirichlet(alpha=0.001) left a client with fewer than 1 samples"),
    _case(_DATA, _DIGITS + "--set data.partition=client_dirichlet --set data.test_per_client=1 "
                           "--set data.test_rounding=floor",
          "data.test_per_client is too small: 1 with test_rounding='floor' leaves"),
    _case(_MEMORY, _MLP + "--set model.options.hidden=[100000000000]",
          "the simulation needs at least 27.3 TiB of memory, more than the"),
    _case(_MEMORY, "run --set algo.batch_size=1000000000000", "one client's round draws 2,000,000,000,000 "
                                                              "samples (7.3 TiB of minibatch indices); lower "
                                                              "algo.batch_size"),
    _case(_COMMANDS, "sweep --seeds 2 --grid algo.lr=" + ",".join(map(str, range(1, 101))) + " --grid "
          "algo.local_steps=" + ",".join(map(str, range(1, 101))),
          "--grid gives 10,000 points × 2 seed(s) = 20,000 runs, more than the 10,000 one command may start", (),
          "fljax sweep --seeds 2 --grid algo.lr=1,2,…,100 --grid algo.local_steps=1,2,…,100"),
    _case(_COMMANDS, "sweep --grid attack.name=none,alie --grid aggregator.name=median,krum --set aggregator.tau=0.3",
          "--grid aggregator.tau: none of the aggregator names swept (median, krum) has the option 'tau'"),
    _case(_COMMANDS, "compare --algorithms ,,,", "no algorithm to compare; name at least one"),
    _case(_COMMANDS, "compare --algorithms fedavg,fedprx", "unknown algorithm 'fedprx'"),
    _case(_COMMANDS, "compare --algorithms fedavg,perfedavg --set algo.betta=0.1",
          "algo.betta is not a valid key for any of the compared algorithms (fedavg, perfedavg). Did you mean "
          "'beta'?"),
    _case(_COMMANDS, "run --resume", "--resume needs --out DIR"),
    _case(_COMMANDS, "run --resume --out empty", "is not a run directory (no config.yaml)",
          [("empty/.keep", "")]),
    _case(_COMMANDS, "run cfg.yaml --resume --out r", "--resume reads the config from r/config.yaml"),
    _case(_GROUPS, "run --processes 0", "--processes must be >= 1, got 0."),
    _case(_GROUPS, "run --resume --out r --processes 2", "--resume continues a run in one process; drop --processes.",
          [_RUN]),
    _case(_GROUPS, "run --processes 3", "--processes 3 disagrees with FLJAX_NUM_PROCESSES=2; give one of them.",
          env=[("FLJAX_NUM_PROCESSES", "2")]),
    _case(_GROUPS, "run --out r", "FLJAX_JOIN_TIMEOUT must be a number of seconds in (0, 86400], got 'abc'",
          env=[*_GROUP, ("FLJAX_JOIN_TIMEOUT", "abc")]),
    _case(_GROUPS, "run --out r", "FLJAX_COORDINATOR localhost:1 did not answer within 0.5 s (FLJAX_JOIN_TIMEOUT); "
                                  "start process 0 there first", env=[*_GROUP, ("FLJAX_JOIN_TIMEOUT", "0.5")]),
    _case(_STUDIES, "reproduce nosuch", "unknown reproduction 'nosuch'; available: ["),
    _case(_STUDIES, "reproduce dfedalt --only ,,,", "--only ',,,' names no study; give comma-separated names from ["),
    _case(_STUDIES, "reproduce fedgia --only v11", "--only: fedgia has no study 'v11'; choose from ['v1', 'v2qot', "),
    _case(_STUDIES, "reproduce fedgia --only v1,v1", "--only names 'v1' twice; name each study once."),
    _case(_STUDIES, "reproduce dfedalt --seeds 100000", "--seeds must be between 1 and 10,000, got 100,000."),
    _case(_STUDIES, "reproduce fedgia --seeds 10000 --only smoke", "--seeds/--only: fedgia's smoke has 6 cells × "
                                                                   "their seeds = 60,000 runs, more than the 10,000"),
    _case(_STUDIES, "reproduce dfedalt --rounds 0", "--rounds must be between 1 and 2,147,483,647, got 0."),
    _case(_STUDIES, "reproduce dfedalt --jobs 0", "--jobs must be between 1 and 1,024, got 0."),
    _case(_STUDIES, "reproduce dfedalt --render --only table --out st", "st/results.json.gz does not exist and "
                    "st/runs holds no finished run of table; run the study first (without --render)."),
    _case(_STUDIES, "reproduce dfedalt --out r", "--out: 'r' holds a run, not a study; continue it with `fljax run "
                                                 "--resume --out r`", [_RUN]),
    _case(_RESUME, "run --resume --out c", "--resume: 'c' holds a comparison, not a run; continue it with `fljax "
                                           "compare --resume --out c`", _COMPARE),
    _case(_RESUME, "run --resume --out s", "--resume: 's' holds a sweep, not a run; continue it with `fljax sweep "
                                           "--resume --out s`", _SWEEP),
    _case(_RESUME, "run --resume --out st", "--resume: 'st' holds a study, not a run; continue it with `fljax "
                                            "reproduce dfedalt --out st`", _STUDY),
    _case(_RESUME, "compare --resume --out r", "--resume: 'r' holds a run, not a comparison; continue it with `fljax "
                                               "run --resume --out r`", [_RUN]),
    _case(_RESUME, "sweep --resume --out c", "--resume: 'c' holds a comparison, not a sweep", _COMPARE),
    _case(_RESUME, "run --out s" + _SMALL, "--out: 's' holds a sweep, not a run; continue it with `fljax sweep "
                                           "--resume --out s`, or choose another --out.", _SWEEP),
    _case(_RESUME, "compare --resume --out c --algorithms fedavg,fedprox",
          "--resume continues the comparison of fedavg in c; drop --algorithms (got 'fedavg,fedprox')", _COMPARE),
    _case(_RESUME, "run --resume --out r", "--resume: 'r' was run from Python with your own data 'arrays' (4 "
                                           "clients), which config.yaml does not describe and fljax cannot rebuild; "
                                           "continue it from Python with the same data: fljax.run(config, data=<the "
                                           "same data>, out='r', resume=True).", _OWN),
    _case(_RESUME, "run --resume --out r", "--resume: 'r' was run from Python with your own model Net", _OWN_MODEL),
    _case(_RESUME, "run --resume --out c/fedavg --set rounds=200", "--resume: 'c/fedavg' is part of the comparison "
                                                                    "in 'c', which would be left out of date; "
                                                                    "continue the comparison with `fljax compare "
                                                                    "--resume --out c`", _MEMBER),
    _case(_DAMAGED, "run --resume --out r", "r/summary.json is damaged (not valid JSON: Expecting value at line 1 "
                                            "column 1); fljax writes its files whole",
          [_RUN, ("r/summary.json", "garbage\n")]),
    _case(_DAMAGED, "run --resume --out r", "r/metrics.jsonl is damaged (line 2 is cut short:",
          [_RUN, ("r/summary.json", '{"status": "completed", "rounds": 100}\n'),
           ("r/metrics.jsonl", '{"round": 0}\n{"round": 1')]),
    _case(_DAMAGED, "run --resume --out r", "config file 'r/config.yaml' is not valid YAML:",
          [("r/config.yaml", "rounds: [1\n")]),
    _case(_DAMAGED, "run --resume --out r", "r/directory.json is damaged (not valid JSON: Expecting value at line 1 "
                                            "column 1)", [_RUN, ("r/directory.json", "garbage\n")]),
    _case(_DAMAGED, "run --resume --out r", "r/directory.json is damaged (its kind is 'swep', not one of ['run', "
                                            "'sweep', 'comparison', 'study'])",
          [_RUN, ("r/directory.json", '{"kind": "swep"}\n')]),
    _case(_DAMAGED, "reproduce fedgia --render --out st", "st/results.json.gz is damaged (Not a gzipped file",
          [("st/results.json.gz", "garbage\n")]),
    _case(_PRIVACY, "run --set privacy.noise_multiplier=1 --set privacy.clip_norm=-0.5",
          "privacy.clip_norm must be > 0, got -0.5."),
    _case(_PRIVACY, "run --set privacy.noise_multiplier=1", "privacy.clip_norm must be set: the noise is calibrated to "
                                                          "the clip norm, and noise without clipping bounds nothing"),
    _case(_PRIVACY, _DP + "--set privacy.delta=0.05", "privacy.delta must be in (0, 1/N) = (0, 0.02) for N = 50 "
                                                      "protected records"),
    _case(_PRIVACY, _DP + "--algorithm scaffold", "privacy applies to an algorithm whose upload is a model trained "
                                                  "from the broadcast one and read by the server only through its "
                                                  "aggregate"),
    _case(_PRIVACY, "run --set privacy.target_epsilon=2 --set privacy.clip_norm=1 --set participation.name=uniform",
          "privacy.accountant 'pld' cannot account fixed-size sampling without replacement"),
    _case(_PRIVACY, _DP + "--set participation.name=poisson --set participation.capacity=20 "
                          "--set privacy.accountant=rdp",
          "participation.capacity 20 < 50 truncates Poisson sampling, which only the PLD accountant models"),
    _case(_PRIVACY, _DP + "--set privacy.sampling=fixed", "privacy.sampling moved to participation.name (poisson or "
                                                          "uniform)"),
    _case(_PRIVACY, _EXAMPLE, "algo.sampling must be 'poisson' under privacy.level: example"),
    _case(_PRIVACY, _EXAMPLE + "--algorithm apfl", "privacy.level 'example' needs an algorithm whose clients touch "
                                                   "their data only through the local steps of its batch plan"),
    _case(_PRIVACY, _EXAMPLE + "--set algo.sampling=poisson --set algo.local_steps=2 --set model.name=emnist_cnn",
          "privacy.level 'example' clips per-example gradients, which a model with Dropout (emnist_cnn) does not "
          "give"),
    _case(_PRIVACY, "run --algorithm scaffold --set compression.kind=sign",
          "compression applies to an algorithm whose upload is a model"),
    _case(_PRIVACY, "run --set compression.kind=top_k", "compression.fraction must be set for kind 'top_k'."),
    _case(_PRIVACY, "run --set compression.kind=qsgd --set compression.bits=2 --set compression.ef_scaling=none",
          "compression.ef_scaling applies to error feedback only"),
    _case(_PRIVACY, "run --resume --out r --set rounds=50", "--resume cannot change rounds (100 in r/config.yaml, 50 "
                                                            "now) of a run whose noise is calibrated to "
                                                            "privacy.target_epsilon",
          [("r/config.yaml", "algorithm: fedavg\nprivacy: {target_epsilon: 8.0, clip_norm: 1.0, accountant: rdp}\n")]),
    _case(_RESUME, "run --resume --out r --set data.num_clients=20",
          "--resume cannot change data.num_clients (100 in r/config.yaml, 20 now): it changes the simulation", [_RUN]),
    _case(_RESUME, "run --resume --out r --set algo.lr=0.5", "--resume cannot change algo.lr (0.1 in r/config.yaml, "
                                                           "0.5 now)", [_RUN]),
    _case(_RESUME, "run --resume --out r --set seed=1", "--resume cannot change seed (0 in r/config.yaml, 1 now)",
          [_RUN]),
    _case(_RESUME, "run --resume --out r --set eval_clients=5", "--resume cannot change eval_clients (None in "
                                                                 "r/config.yaml, 5 now)", [_RUN]),
    _case(_RESUME, "run --resume --out r --seeds 3", "--resume cannot change seeds (1 in r/config.yaml, 3 now)",
          [_RUN]),
    _case(_RESUME, "run --resume --out r --set model.name=mlp", "--resume cannot change model.name", [_RUN]),
    _case(_RESUME, "compare --resume --out c --set data.alpha=0.1",
          "--resume cannot change data.alpha (0.5 in c/config.yaml, 0.1 now)", _COMPARE),
    _case(_RESUME, "sweep --resume --out s --set algo.mu=0.1",
          "--resume cannot change algo.mu (0.01 in s/config.yaml, 0.1 now)", _SWEEP),
    _case(_RESUME, "run --out r", "run directory 'r' already holds results (a checkpoint or a finished run); "
                                  "continue it with --resume", [_RUN, ("r/summary.json", '{"status": "completed"}\n')]),
    _case(_RESUME, "run --out r" + _SMALL, "run directory 'r' is in use by another fljax process (pid", busy=["r"]),
    _case(_RESUME, "run --out f/r" + _SMALL, "is a file, not a directory; choose another --out.", [("f", "x\n")]),
    _case(_DATA, "run --set data.partition=meta_pairs --set data.num_clients=20 --set data.target_clients=20",
          "data.target_clients must be below num_clients=20 (some clients must train), got 20."),
    _case(_OWN_DATA, "run --dataset cifar10 --set data.data_dir=nope/tfds",
          "TFDS data set 'cifar10' is not prepared in nope/tfds/cifar10/"),
    _case(_OWN_DATA, "run --dataset digits --set data.partition=meta_pairs --set data.num_clients=20 "
                     "--set server.pretrained=cnn_s --set server.pretrain_data=mnist "
                     "--set server.pretrain_data_options.data_dir=nope/tfds",
          "TFDS data set 'mnist' is not prepared in nope/tfds/mnist/"),
    _case(_OUTPUT, "run --tensorboard f", "--tensorboard 'f' is a file, not a directory", [("f", "x\n")]),
    _case(_OUTPUT, "run --tensorboard f/logs", "--tensorboard 'f/logs': ", [("f", "x\n")]),
    _case(_OUTPUT, "run --tensorboard tb/" + "a" * 300, "is 300 bytes long, more than the 255 the file system "
                                                        "allows; choose a shorter one.", (),
          "fljax run --tensorboard tb/aaa…a (a name of 300 characters)"),
    _case(_OUTPUT, "run --tensorboard tb", "--tensorboard needs tensorboardX, which is not installed: pip install "
                                           "'fljax[explore]'", missing=["tensorboardX"]),
    _case(_RESUME, "sweep --grid algo.lr=0.1,0.2 --out s" + _SMALL, "run directory 's/lr=0.2' is in use by another "
                                                                    "fljax process", busy=["s/lr=0.2"]),
    _case(_TUNE, "tune --algorithm fedavg", "fljax tune needs at least one --hp KEY"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.lr --steps -1", "--steps must be an integer >= 0"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.local_steps", "algo.local_steps is discrete (int): it has no "
                                                                   "gradient; compare its values with fljax sweep"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.lrr", "algo.lrr is not a hyperparameter of fedavg. Did you mean "
                                                          "'lr'?"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.momentum", "algo.momentum cannot be traced: Python control flow "
                                                               "reads its value"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.lr --metric global_acc", "metric 'global_acc' counts correct "
                                                                             "predictions: it is piecewise constant"),
    _case(_TUNE, "tune --algorithm fedavg --hp algo.lr --val-fraction 1.5", "val_fraction must be in (0, 1)"),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)), [0, 2 ** 40])], [(np.ones((1, 3)), [0])])",
            "train[0] (client 0): label 1099511627776 is larger than 2147483646, the largest label int32 holds"),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)), [0, -1])], [(np.ones((1, 3)), [0])])",
            "labels must be in [0, 1) (num_classes: 1 + the largest label), got -1 to 0 (first in train[0] (client "
            "0))."),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)), [0, 1])], [(np.ones((1, 3)), [0])], num_classes='abc')",
            "num_classes must be a positive integer (or None: 1 + the largest label), got 'abc'."),
    _python(_PYTHON, "from_arrays([([[1.0, 2.0], [3.0]], [0, 1])], [(np.ones((1, 2)), [0])])",
            "train[0] (client 0): x is ragged: its rows differ in length"),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)), ['a', 'b'])], [(np.ones((1, 3)), [0])])",
            "train[0] (client 0): y must hold numbers, got text"),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)) * 1j, [0, 1])], [(np.ones((1, 3)), [0])])",
            "train[0] (client 0): x holds complex numbers"),
    _python(_PYTHON, "from_arrays([(np.ones((2, 3)), [0, 1])] * 2, [(np.ones((1, 3)), [0])])",
            "test must have one (x, y) pair per client: 2 train pairs, 1 test pairs."),
    _python(_PYTHON, "import flax.linen as nn\n"
                     "class CNN(nn.Module):\n"
                     "    @nn.compact\n"
                     "    def __call__(self, x):\n"
                     "        return nn.Dense(2)(nn.Conv(4, (3, 3))(x).reshape(x.shape[0], -1))\n"
                     "fljax.run({'data': {'dataset': 'synthetic'}}, model=CNN())",
            "model CNN takes inputs [batch, H, W, channels] (its first Conv, kernel (3, 3)), but data set "
            "'synthetic(1,1)' has inputs of shape (60,)"),
    _python(_PYTHON, "fljax.sweep({'data.num_clients': [2, 4]}, data=from_arrays(" + _PAIRS + "), out='s')",
            "--grid data.num_clients: the sweep runs on your own data ('arrays', 4 clients), which data.num_clients "
            "does not change"),
    # --- participation, devices and asynchrony (issue 36; docs/heterogeneity.md) ---
    _case(_HETERO, "run --set participation.speed=trace --set participation.capacity_trace=capacity",
          "participation.capacity_trace 'capacity' holds 3 clients, fewer than the 50 training clients it must cover",
          [("capacity", '(dp0\nI1\n(dp1\nVcomputation\np2\nF5.0\nsVcommunication\np3\nF1000.0\nssI2\n(dp4\ng2\nF5.0\nsg3\nF1000.0\nssI3\n(dp5\ng2\nF5.0\nsg3\nF1000.0\nss.')], shown="a FedScale client_device_capacity pickle of 3 clients"),
    _case(_HETERO, "run --set participation.speed=trace --set participation.capacity_trace=capacity",
          "participation.capacity_trace client 1 in 'capacity' has computation -1 ms per sample; every device needs a "
          "positive computation time and bandwidth.",
          [("capacity", '(dp0\nI1\n(dp1\nVcomputation\np2\nF-1.0\nsVcommunication\np3\nF1000.0\nss.')], shown="client 1: computation -1.0, communication 1000.0 (pickled)"),
    _case(_HETERO, "run --set participation.speed=synthetic --set participation.ms_per_sample=-5",
          "participation.ms_per_sample must be > 0, got -5.0."),
    _case(_HETERO, "run --set participation.speed=synthetic --set participation.deadline=0.001",
          "participation.deadline 0.001 s is shorter than every client's round"),
    _case(_HETERO, "run --set participation.deadline=30", "participation.deadline needs device speeds, the virtual "
                                                          "clock (speed: synthetic or trace)."),
    _case(_HETERO, "run --algorithm fedbuff --set algo.concurrency=10 --set algo.buffer_size=20",
          "algo.buffer_size must be at most the concurrency 10 (the clients in flight), got 20."),
    _case(_HETERO, "run --set algo.staleness=hinge", "algo.staleness is an option of the asynchronous algorithms "
                                                     "(fedasync, fedbuff); fedavg is synchronous"),
    _case(_HETERO, "run --algorithm fedbuff --set participation.name=uniform",
          "participation.speed must be 'synthetic' or 'trace': fedbuff runs on a virtual clock"),
    _case(_HETERO, "run --algorithm fedasync --set participation.speed=synthetic --set participation.deadline=60",
          "participation.deadline is not supported by the asynchronous fedasync"),
    _case(_HETERO, _DP + "--set participation.speed=synthetic --set participation.availability=diurnal",
          "draws cohorts that no dp-accounting event describes (availability, deadlines, dropouts or dropped "
          "stragglers decide who counts"),
    _case(_HETERO, "run --algorithm dfedavg --set algo.link_failure=0.2 --set algo.gossip_form=gather",
          "algo.gossip_form ='gather' needs a graph of static degree"),
    # issue 41: text readers, size bounds, null sections, reproduce's output, the smaller ones
    _python(_PYTHON, "import flax.linen as nn; fljax.run({'data': {'dataset': 'digits', 'num_clients': 10}}, "
                     "model=nn.Dense(0))",
            "model Dense cannot be initialised for the inputs of data set 'digits', of shape (8, 8, 1): an "
            "initializer divided by zero"),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json holds a list, not LEAF's mapping of users, num_samples and "
                            "user_data", [("leaf/a.json", "[1, 2, 3]\n")]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json is empty", [("leaf/a.json", "\n")]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json is not valid JSON (Unterminated string starting at: line 1 "
                            "column 44)", [("leaf/a.json", '{"users": ["a"], "user_data": {"a": {"x": ["To be')]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json has no 'user_data'",
          [("leaf/a.json", '{"users": ["a"], "num_samples": [3]}\n')]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json: user 'b' is listed in 'users' but has no entry in 'user_data'",
          [("leaf/a.json", _leaf({"a": _WINDOWS}, ["a", "b"]))]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json: user 'a' has 6 x rows and 2 y labels; LEAF pairs every x row "
                            "with one label", [("leaf/a.json", _leaf({"a": {"x": _WINDOWS["x"] * 2,
                                                                          "y": _WINDOWS["y"][:2]}}))]),
    _case(_TEXT, _LEAF_RUN, "shakespeare: leaf/a.json: user 'a': x[0] must be a text window, got 1",
          [("leaf/a.json", _leaf({"a": {"x": [1, 2, 3], "y": _WINDOWS["y"]}}))]),
    _case(_TEXT, "run --dataset sent140 --set data.data_dir=leaf --set model.name=lstm_cls",
          "sent140: leaf/a.json: user 'alice': x[0] must be LEAF's 5 fields [id, date, query, user, text]",
          [("leaf/a.json", _leaf({"alice": {"x": [["1", "so glad"]], "y": [1]}}))]),
    _case(_TEXT, "run --dataset femnist --set data.data_dir=leaf", "femnist: leaf/a.json: user 'w1': x[0] must be a "
                                                                  "row of 784 pixel values (28×28), got a row of 2",
          [("leaf/a.json", _leaf({"w1": {"x": [[0.5, 0.5]], "y": [3]}}))]),
    _case(_TEXT, "run --dataset stackoverflow --set data.data_dir=so --set model.name=lstm",
          "stackoverflow: so/stackoverflow.sqlite is not TFF's Stack Overflow database (DatabaseError: file is not a "
          "database); it must hold the tables examples(",
          [("so/stackoverflow.sqlite", "not a database\n"), ("so/stackoverflow.word_count", "the 10\n")]),
    _case(_TEXT, "run --dataset shakespeare --set data.source=standin --set data.seq_len=40 --set model.name=mlp",
          "model.name cannot be 'mlp' for next-token sequences of length 40"),
    _case(_MEMORY, _LEAF_RUN + " --set data.seq_len=1000000000000", "shakespeare's 1 sequences of data.seq_len="
                                                                    "1,000,000,000,000 characters would take 14.6 TiB",
          [("leaf/a.json", _leaf({"a": _WINDOWS}))]),
    _case(_MEMORY, "run configs/shakespeare_fedavg.yaml --set data.source=standin --set data.seq_len=1000000000",
          "the Shakespeare stand-in's 715+ sequences of data.seq_len=1,000,000,000 characters would take 10.4 TiB"),
    _case(_MEMORY, "run configs/stackoverflow_fedavg.yaml --set data.source=standin --set data.seq_len=100000000",
          "data.seq_len=100,000,000 tokens over data.vocab=10,000 words would take"),
    _case(_MEMORY, "run configs/stackoverflow_fedavg.yaml --set data.source=standin --set data.vocab=100000000000",
          "data.seq_len=20 tokens over data.vocab=100,000,000,000 words would take 5.1 TiB"),
    _case(_MEMORY, "run --dataset sent140 --set data.data_dir=leaf --set model.name=lstm_cls "
                   "--set data.seq_len=1000000000000", "sent140's 1 tweets of data.seq_len=1,000,000,000,000 tokens "
                                                       "would take 3.6 TiB",
          [("leaf/a.json", _leaf({"alice": {"x": [["1", "date", "NO_QUERY", "alice", "so glad"]], "y": [1]}}))]),
    _case(_MEMORY, _SYNTHETIC + "--set data.max_samples=null --set data.size_log_mean=100",
          "synthetic's 7.18e+45 samples would take 1.59e+36 TiB"),
    _case(_MEMORY, _DIGITS + "--set data.test_rows=1000000000", "50 clients' test splits padded to data.test_rows="
                                                               "1,000,000,000 rows would take"),
    _case(_MEMORY, "run configs/fedgia_qot.yaml --set data.dataset=fedgia_sct_standin --set data.rows=1000000000",
          "the sct stand-in's data.rows=1,000,000,000 rows × data.features=200 would take 4.4 TiB"),
    _case(_MEMORY, "run --set memory_budget=1e-12", "the rounds program needs"),
    _case(_KEYS, "run c.yaml --set compression.kind=top_k", "compression.fraction must be set for kind 'top_k'.",
          [("c.yaml", "algorithm: fedavg\nprivacy: null\ncompression: null\n")]),
    _case(_RESUME, "run --resume --out r --set privacy.noise_multiplier=1 --set privacy.clip_norm=1",
          "--resume cannot add privacy (null in r/config.yaml, set now)",
          [("r/config.yaml", "algorithm: fedavg\nprivacy: null\ncompression: null\n")]),
    _case(_NAMES, "run --set precision=FP32", "precision must be one of ['fp32', 'tf32', 'bf16'], got 'FP32'. Did you "
                                              "mean 'fp32'?"),
    _case(_VALUES, "run c.yaml", "name must not contain control or formatting characters ('\\n'",
          [("c.yaml", 'name: "a\\nb"\n')]),
    Case(_VALUES, ("run", "--set", "name=x\u202egpj.exe"), "name must not contain control or formatting characters "
                                                          "('\\u202e', RIGHT-TO-LEFT OVERRIDE",
         shown="fljax run --set name=x<U+202E>gpj.exe"),
    Case(_OUTPUT, ("run", "--tensorboard", ""), "--tensorboard must be a directory path, got ''.",
         shown="fljax run --tensorboard ''"),
    _case(_STUDIES, "reproduce fedgia --only smoke --out f", "--out 'f' is a file, not a directory; choose another "
                                                             "--out.", [("f", "x\n")]),
    _case(_STUDIES, "reproduce dfedalt --render", "--render rebuilds a report where it is: give --out DIR"),
    _case(_STUDIES, "reproduce dfedalt --update-report --out d", "--update-report writes into the committed report "
                                                                 "(benchmarks/results/dfedalt); drop --out d"),
]

# ------------------------------------------------------------------------------------------ client-state stores
# (issue 38, fljax.engine.store): what a store cannot hold, a folder that cannot hold it, another run's store
_STORES = "Client-state stores (state_store)"
_STORE_RUN = ("run --dataset synthetic --set data.num_clients=8 --set data.max_samples=40 --set algo.cohort_size=4 "
              "--set algo.local_steps=2 --set algo.batch_size=10 --set model.name=logreg --algorithm ditto "
              "--set state_store=disk ")


def _meta(algorithm: str, run: str) -> tuple[str, str]:
    """A store's meta.json in r/store (a run directory of a run that died before its first checkpoint)."""
    return ("r/store/meta.json", '{"format": 1, "num_clients": 8, "identity": {"algorithm": "%s", "run": "%s"}, '
                                 '"leaves": []}\n' % (algorithm, run))


CASES += [
    _case(_STORES, "run --set state_store=ram", "state_store must be one of ['device', 'host', 'disk'], got 'ram'."),
    _case(_STORES, "run --algorithm dfedalt --set state_store=disk",
          "state_store disk cannot hold this run's clients: dfedalt runs every client every round"),
    _case(_STORES, "run --algorithm fedslr --set state_store=disk",
          "fedslr: its server averages every client's dual γ_i each round (Algorithm 2; algo.memory_efficient: true"),
    _case(_STORES, "run --set state_store=host --set algo.cohort_mode=mask",
          "algo.cohort_mode: mask computes every client every round"),
    _case(_STORES, "run --algorithm fedgia --dataset fedgia_v1 --set state_store=disk",
          "state_store disk keeps the clients of classification runs; fedgia solves a consensus problem"),
    _case(_STORES, "run --dataset synthetic --set data.num_clients=20000 --set data.storage=ragged "
                   "--set data.max_samples=11 --set data.min_samples=11 --algorithm ditto --set model.name=mlp "
                   "--set model.options.hidden=[200000] --set state_store=disk --out r",
          "cannot hold the client-state store: it needs 1,192.80 GB (20,000 clients × 56,800,040 bytes"),
    _case(_STORES, _STORE_RUN + "--out r", "the client-state store in '", [_meta("fedrep", "0123")]),
    _case(_STORES, _STORE_RUN + "--out r", "belongs to another run (configuration and seed)",
          [_meta("ditto", "0123")]),
    _case(_STORES, _STORE_RUN + "--out r", "holds files that are not a client-state store",
          [("r/store/notes.txt", "mine\n")]),
]


def _listing(directory: str) -> set[str]:
    """Every file (with a digest of its content) and directory under ``directory``."""
    def digest(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]

    return {f"{os.path.relpath(os.path.join(d, f), directory)} {digest(os.path.join(d, f))}"
            for d, _, fs in os.walk(directory) for f in fs} | \
           {os.path.relpath(os.path.join(d, s), directory) + "/" for d, ss, _ in os.walk(directory) for s in ss}


_HOLDER = """import sys
from fljax.runner.lock import hold
with hold(sys.argv[1:]):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def _held_by_another_process(directories: tuple[str, ...]):
    """Another Python process holds the run-directory locks of ``directories`` (as a running fljax would)."""
    if not directories:
        yield
        return
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, *directories], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


_ABSENT = object()


@contextlib.contextmanager
def _setting(case: Case):
    """The case's environment variables set, and its ``missing`` modules unimportable, for the duration."""
    saved_env = {name: os.environ.get(name) for name, _ in case.env}
    saved_modules = {name: sys.modules.get(name, _ABSENT) for name in case.missing}
    os.environ.update(dict(case.env))
    sys.modules.update({name: None for name in case.missing})  # `import name` raises ImportError
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, module in saved_modules.items():
            if module is _ABSENT:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _call(case: Case) -> tuple[int, str]:
    """Run the case: (exit status, stderr) of ``fljax argv``, or for a python case (2, its error's message as the
    command line would print it) once its code raised a ValueError."""
    from fljax.cli import main

    if not case.python:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(list(case.argv))
        return status, err.getvalue()
    import numpy as np

    import fljax
    from fljax.data import from_arrays

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(case.python, "<case>", "exec"), {"fljax": fljax, "np": np, "from_arrays": from_arrays})
    except ValueError as e:
        return 2, f"fljax: error: {e}\n"
    raise AssertionError(f"{case.python} raised nothing")


def run_case(case: Case, workdir: str) -> str:
    """Run ``case`` in the empty directory ``workdir``; check the refusal (status 2, one line, no traceback,
    nothing written) and return its message."""
    for name, text in case.files:
        os.makedirs(os.path.dirname(os.path.join(workdir, name)) or workdir, exist_ok=True)
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    if any(a.startswith("configs/") for a in case.argv):
        os.symlink(os.path.join(ROOT, "configs"), os.path.join(workdir, "configs"))
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with _held_by_another_process(case.busy), _setting(case):
            before = _listing(workdir)
            status, err = _call(case)
            after = _listing(workdir)
    finally:
        os.chdir(cwd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, (status, err)
    assert len(lines) == 1 and lines[0].startswith("fljax: error: "), err
    assert after == before, (sorted(after - before), sorted(before - after))
    message = lines[0][len("fljax: error: "):]
    assert case.expect in message, (case.expect, message)
    return message


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _shown(case: Case) -> str:
    if case.python:
        return _cell(case.python.replace("\n", " ↵ "))  # a table cell is one line
    if case.shown and not case.files:
        command = _cell(case.shown)
    else:
        command = _cell("fljax " + " ".join(case.argv))
    files = [f"{name}: {_cell(case.shown or text.rstrip().replace(chr(10), ' ↵ '))}" for name, text in case.files if text]
    settings = [f"environment: {_cell(' '.join(f'{k}={v}' for k, v in case.env))}"] if case.env else []
    settings += [f"{name} not installed" for name in case.missing]
    return command + "".join(f"<br>{f}" for f in files + settings)


def _machine_free(message: str) -> str:
    """The message without what differs from machine to machine: a process id, the memory size (of the machine, or
    of an address-space or cgroup limit), a disk's free bytes, a store's absolute folder."""
    message = re.sub(r"its disk has [0-9.,]+ GB free", "its disk has … GB free",
                     re.sub(r"'[^']*/r/store'", "'r/store'", message))  # (a store's folder, absolute)
    return re.sub(r"more than the [0-9.,]+ [KMGT]iB of (this machine|this process's address-space limit \(ulimit "
                  r"-v\)|this cgroup's memory limit \(memory.max\))", "more than the memory of this machine",
                  re.sub(r"pid [0-9]+", "pid …", message))


def render(messages: list[str]) -> str:
    """docs/errors.md from every case's message (in the order of :data:`CASES`)."""
    out = ["# Bad inputs and what fljax answers",
           "",
           "Every input below is refused before anything runs or is written: one line on stderr starting with",
           "`fljax: error:` and exit status 2 (`FLJAX_DEBUG=1` shows the Python traceback instead). The same checks",
           "apply to `fljax.run`, `fljax.make_config` and `fljax.data.make_federated`, which raise",
           "`fljax.ConfigError` (an `OptionError`, with the option's name in `.key`, for a bad option).",
           "",
           "Generated from the test cases in `tests/bad_inputs.py` (`python tests/bad_inputs.py` rewrites this file;",
           "a test fails when it is out of date).",
           ""]
    by_section: dict[str, list[str]] = {}
    for case, message in zip(CASES, messages):
        busy = "".join(f"<br>{d}/ in use by another run" for d in case.busy)
        by_section.setdefault(case.section, []).append(f"| {_shown(case)}{busy} | {_cell(_machine_free(message))} |")
    for section, rows in by_section.items():
        out += ["", f"## {section}", ""]
        if section == _PYTHON:
            out += ["From Python the same checks raise `ValueError`s (`fljax.ConfigError`, `fljax.data.DataError`)",
                    "with the message below; `np` is numpy, `from_arrays` is `fljax.data.from_arrays`.", ""]
        out += ["| input | message |", "|---|---|", *rows]
    return "\n".join(out) + "\n"


def messages() -> list[str]:
    result = []
    for case in CASES:
        with tempfile.TemporaryDirectory() as workdir:
            result.append(run_case(case, workdir))
    return result


if __name__ == "__main__":
    os.environ.pop("FLJAX_DEBUG", None)
    text = render(messages())  # every case first: a case that crashes leaves the catalogue as it was
    with open(DOC, "w") as f:
        f.write(text)
    print(f"wrote {DOC} ({len(CASES)} cases)", file=sys.stderr)
