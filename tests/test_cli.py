"""The fljax command line: every wrong input is refused in one line (exit status 2, no traceback) before anything
runs; --help everywhere; list; reproduce dispatch; example configs for every algorithm."""
import os

import pytest
from bad_inputs import CASES, run_case

from fljax.algorithms import ALGORITHMS
from fljax.cli import main
from fljax.config import load_config
from fljax.experiment import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("case", CASES, ids=[(" ".join(c.argv) or c.python)[:80] for c in CASES])
def test_wrong_input_is_one_line(case, tmp_path, monkeypatch):
    """Every case of the bad-input catalogue (tests/bad_inputs.py, docs/errors.md): exit status 2, one line naming
    the key, no traceback, nothing written."""
    monkeypatch.delenv("FLJAX_DEBUG", raising=False)
    run_case(case, str(tmp_path))


def test_default_run_directories_are_claimed_not_guessed(tmp_path, monkeypatch):
    """Issue 41 item 6: two commands started in the same second without --out picked the same default directory
    (the free name was checked, then created later), and one was told the other held a directory it never chose.
    The default directory is created when it is chosen (one os.mkdir succeeds), so the second gets the next name;
    a command that ends with it empty removes it again (with the runs/ folder it created)."""
    import datetime
    import types

    import fljax.cli as cli

    monkeypatch.chdir(tmp_path)
    frozen = datetime.datetime(2026, 12, 6, 15, 9, 21)  # both commands in the same second
    monkeypatch.setattr(cli, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: frozen)))
    first, second = cli._default_out("fedavg"), cli._default_out("fedavg")
    assert (first, second) == (os.path.join("runs", "fedavg-20261206-150921"),
                               os.path.join("runs", "fedavg-20261206-150921-2"))
    assert os.path.isdir(first) and os.path.isdir(second)
    open(os.path.join(first, "config.yaml"), "w").close()  # a command wrote into the first
    cli._release_claims()
    assert os.listdir("runs") == [os.path.basename(first)] and not cli._CLAIMED
    os.remove(os.path.join(first, "config.yaml"))
    os.rmdir(first)
    os.rmdir("runs")
    cli._default_out("fedavg")
    cli._release_claims()
    assert not os.path.exists("runs")  # nothing was written: what the claim created is gone


def test_compare_algo_keys_apply_to_the_algorithms_that_have_them(tmp_path):
    small = ["--set", "rounds=2", "--set", "eval_every=2", "--set", "data.num_clients=4", "--set", "algo.cohort_size=2"]
    assert main(["compare", "--algorithms", "fedavg,perfedavg", "--set", "algo.beta=0.05", *small, "--quiet",
                 "--out", str(tmp_path / "ok")]) == 0  # beta is Per-FedAvg's only
    saved = load_config(str(tmp_path / "ok" / "perfedavg" / "config.yaml"))
    assert saved.algo["beta"] == 0.05 and "beta" not in load_config(str(tmp_path / "ok" / "fedavg" / "config.yaml")).algo


def test_help_everywhere(capsys):
    for argv in (["--help"], ["run", "--help"], ["compare", "--help"], ["list", "--help"], ["reproduce", "--help"],
                 ["tune", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "usage: fljax" in out
        if argv[0] in ("run", "compare", "reproduce", "tune"):
            assert "examples:" in out and "fljax " + argv[0] in out


def test_version_and_help_start_without_jax(capsys):
    """``fljax --version``, ``--help`` and a command's ``--help`` parse without importing JAX (issue 40, point 5; the
    time is measured in benchmarks/first_run.py); a ``tune`` choice is checked when the command runs."""
    import subprocess
    import sys

    from fljax import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fljax {__version__}"
    probe = ("import sys; from fljax.cli import main\n"
             "for argv in (['--help'], ['--version'], ['run', '--help'], ['sweep', '--help'], ['tune', '--help']):\n"
             "    try: main(argv)\n"
             "    except SystemExit: pass\n"
             "print('JAX', 'jax' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.stderr.strip().splitlines()[-1] == "JAX False", done.stderr
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])  # every reproduction with its studies, the choices of --only
    out = capsys.readouterr().out
    from fljax.runner.study import load_study, study_names

    for name in study_names():
        assert f"  {name} " in out and f"--only {','.join(load_study(name).studies)}\n" in out
    assert main(["tune", "--hp", "algo.lr", "--split", "validation"]) == 2
    assert "fljax: error: --split must be one of val, test, train, got 'validation'." in capsys.readouterr().err


def test_list_shows_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for section in ("algorithms:", "datasets:", "partitioners:", "models:", "executors:", "topologies:",
                    "participations (participation: {name: NAME, ...}):", "aggregation rules (aggregator:",
                    "attacks (attack:"):
        assert section in out
    from fljax.aggregation import ATTACKS, RULES
    from fljax.participation import PARTICIPATIONS

    for name in (*ALGORITHMS, *PARTICIPATIONS, *RULES, *ATTACKS, "digits", "dirichlet", "mlp", "vmap", "ring"):
        assert f"  {name} " in out
    assert "      beta (default 0.1): β: the share trimmed from each end" in out  # a rule's options
    for option in ("alpha (default 0.5): Dirichlet concentration", "samples_per_client (default null)",
                   "noise (default 0.0)", "hidden (default [200, 200])", "test_per_client "):
        assert option in out  # each data set's, partitioner's and model's options


def test_reproduce_takes_study_files_only(capsys):
    """Every reproduction is a study file (FedGiA's too): a typo gets the closest name, a script's option (FedGiA's
    old --quick) one line."""
    assert main(["reproduce", "fedgai"]) == 2
    err = capsys.readouterr().err
    assert "unknown reproduction 'fedgai'; available: [" in err and "Did you mean 'fedgia'?" in err
    assert main(["reproduce", "fedgia", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unrecognized arguments: --quick" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.problem == "classification"))
def test_every_algorithm_has_an_example_config(name):
    path = os.path.join(ROOT, "configs", f"{name}.yaml")
    assert os.path.exists(path), f"add configs/{name}.yaml (an example config for {name})"
    cfg = resolve(load_config(path)).config  # parsed, then checked against the registries (hyperparameters too)
    assert cfg.algorithm == name
    with open(path) as f:
        assert f.readline().startswith("#"), "start the file with a comment saying what it runs"


def test_the_quick_start_takes_one_algorithm_per_family_and_all_takes_every_general_one(capsys):
    """Every general-purpose algorithm belongs to exactly one family; `fljax compare` without --algorithms runs the
    quick start's representatives (general-purpose, at most one per family but the baselines'), `--algorithms all`
    every general-purpose one; the help says which and why; an untuned default names a real hyperparameter."""
    from fljax.algorithms.families import QUICKSTART, families, family
    from fljax.cli import _compared

    generic = [n for n, c in ALGORITHMS.items() if c.generic]
    listed = [n for names in families().values() for n in names]
    assert sorted(listed) == sorted(ALGORITHMS) and all(family(n) != "other" for n in generic)
    assert set(QUICKSTART) <= set(generic) and len({family(n) for n in QUICKSTART}) >= 5
    assert _compared(None) == list(QUICKSTART) and _compared("all") == generic
    assert _compared("fedavg, ditto") == ["fedavg", "ditto"]
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Why these:" in help_text and ", ".join(QUICKSTART) in help_text and "'all'" in help_text


def test_a_comparison_notes_a_model_caveat_under_the_row_and_warns_nothing(tmp_path, capsys):
    """QuPeD on the preset's two-layer MLP quantizes no layer (its first and last stay full precision): no warning
    on the way, a numbered note under its row in the printed table and in compare.md."""
    from fljax.experiment import build_model, load_data, resolve

    small = ["--set", "rounds=1", "--set", "eval_every=1", "--set", "data.num_clients=4", "--set",
             "algo.cohort_size=2"]
    out = tmp_path / "cmp"
    assert main(["compare", "--algorithms", "quped,fedavg", *small, "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert "warning" not in err.lower()
    exp = resolve(load_config(str(out / "quped" / "config.yaml")))
    caveat = exp.algorithm.model_warning(build_model(exp.model, load_data(exp)))
    assert caveat and "full precision" in caveat
    for text in (printed, (out / "compare.md").read_text()):
        rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}
        mark = next(r for r in rows if r.startswith("quped ["))[len("quped ["):-1]
        assert f"[{mark}] quped: {caveat}" in text and "fedavg" in rows  # fedavg: no note


def test_the_run_table_has_only_columns_that_say_something(tmp_path, capsys):
    """`fljax run` prints the comparison's kind of table: no `weighted` column equal to `personal acc` (every
    client's test split has one size in the preset), `seeds` and `rounds` in a note rather than as columns."""
    small = ["--set", "rounds=2", "--set", "eval_every=2", "--set", "data.num_clients=4", "--set",
             "algo.cohort_size=2"]
    assert main(["run", "--algorithm", "fedavg", *small, "--out", str(tmp_path / "r"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert header == ["algorithm", "personal acc", "p10 client", "global acc", "MB up+down", "run s", "compile s",
                      "client-steps/s"]
    assert lines[3] == "" and lines[4].startswith("[1] the sample-weighted personalized accuracy equals")
    assert lines[5] == "[2] 1 seed, 2 rounds."
