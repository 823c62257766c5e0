"""The fljax command line: every wrong input is refused in one line (exit status 2, no traceback) before anything
runs; --help everywhere; list; reproduce dispatch; example configs for every algorithm."""
import os
import textwrap

import pytest

from fljax.algorithms import ALGORITHMS
from fljax.cli import main
from fljax.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _error(capsys, argv) -> str:
    """Run the CLI expecting a user error; return its one line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fljax: error: "), err
    assert "Traceback" not in err
    return lines[0][len("fljax: error: "):]


@pytest.mark.parametrize("argv,expected", [
    (["--algorithm", "fedavgg"], "algorithm: unknown value 'fedavgg'; choose one of ['"),
    (["--algorithm", "fedavgg"], "Did you mean 'fedavg'?"),
    (["--dataset", "digitz"], "data.dataset: unknown value 'digitz'"),
    (["--set", "data.partition=dirichlett"], "data.partition: unknown value 'dirichlett'"),
    (["--set", "model.name=mlpp"], "model.name: unknown value 'mlpp'"),
    (["--set", "executor=vmapp"], "executor: unknown value 'vmapp'"),
    (["--set", "roundz=3"], "unknown key 'roundz'. Did you mean 'rounds'?"),
    (["--set", "data.alpah=0.1"], "unknown key 'data.alpah'. Did you mean 'alpha'?"),
    (["--set", "algo.lrr=0.1"], "unknown key 'algo.lrr' for algorithm 'fedavg'. Did you mean 'lr'?"),
    (["--set", "model.name=mlp", "--set", "model.options.hiden=[8]"],
     "model.options: model 'mlp' has no option 'hiden'. Did you mean 'hidden'?"),
    (["--set", "rounds=ten"], "rounds: expected int, got 'ten'."),
    (["--set", "algo.lr=fast"], "algo.lr: expected float, got 'fast'."),
    (["--set", "data.num_clients=1.5"], "data.num_clients: expected int, got 1.5."),
    (["--set", "algo.lr=-0.1"], "algo.lr must be > 0, got -0.1."),
    (["--set", "data.num_clients=20", "--set", "algo.cohort_size=50"],
     "algo.cohort_size must be between 1 and num_clients=20 (or null for full participation), got 50."),
    (["--set", "data.alpha=0"], "data.alpha must be > 0 (Dirichlet concentration), got 0.0."),
    (["--set", "data.alpha=-0.5"], "data.alpha must be > 0 (Dirichlet concentration), got -0.5."),
    (["--seeds", "0"], "seeds must be > 0, got 0."),
    (["--checkpoint-every", "-1"], "checkpoint_every must be >= 0 (0: no checkpoints), got -1."),
])
def test_wrong_input_is_one_line(capsys, tmp_path, argv, expected):
    message = _error(capsys, ["run", *argv, "--out", str(tmp_path / "r")])
    assert expected in message
    assert not (tmp_path / "r").exists()  # refused before anything ran or was written


def test_partition_that_leaves_a_client_empty(capsys, tmp_path):
    message = _error(capsys, ["run", "--dataset", "digits", "--set", "data.num_clients=500", "--set",
                              "data.alpha=0.001", "--set", "algo.cohort_size=5", "--out", str(tmp_path / "r")])
    assert message.startswith("dirichlet(alpha=0.001) left a client with fewer than 1 samples")
    assert "raise alpha or lower num_clients" in message


def test_missing_and_broken_config_files(capsys, tmp_path):
    assert _error(capsys, ["run", str(tmp_path / "nope.yaml")]) == \
        f"config file {str(tmp_path / 'nope.yaml')!r} does not exist."
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1\n")
    assert _error(capsys, ["run", str(bad)]).startswith(f"config file {str(bad)!r} is not valid YAML:")
    typo = tmp_path / "typo.yaml"
    typo.write_text("algorithm: fedavg\nrouds: 3\n")
    assert "unknown key 'rouds'. Did you mean 'rounds'?" in _error(capsys, ["run", str(typo)])


def test_resume_errors(capsys, tmp_path):
    assert _error(capsys, ["run", "--resume"]) == "--resume needs --out DIR: the directory of the run to continue."
    assert "is not a run directory (no config.yaml)" in _error(capsys, ["run", "--resume", "--out", str(tmp_path)])
    (tmp_path / "config.yaml").write_text("algorithm: fedavg\n")
    message = _error(capsys, ["run", "--resume", "--out", str(tmp_path)])
    assert message.startswith(f"--resume: no checkpoint in {str(tmp_path / 'checkpoints')!r}")
    assert "--resume reads the config from" in _error(capsys, ["run", "cfg.yaml", "--resume", "--out", str(tmp_path)])


def test_compare_refuses_unknown_algorithm_before_running(capsys, tmp_path):
    message = _error(capsys, ["compare", "--algorithms", "fedavg,fedprx", "--out", str(tmp_path / "c")])
    assert message.startswith("unknown algorithm 'fedprx'") and "Did you mean 'fedprox'?" in message
    assert not (tmp_path / "c").exists()


def test_compare_algo_keys_apply_to_the_algorithms_that_have_them(capsys, tmp_path):
    message = _error(capsys, ["compare", "--algorithms", "fedavg,perfedavg", "--set", "algo.betta=0.1",
                              "--out", str(tmp_path / "c")])
    assert message == ("unknown key 'algo.betta': none of the compared algorithms (fedavg, perfedavg) has it. "
                       "Did you mean 'beta'?")
    assert not (tmp_path / "c").exists()
    small = ["--set", "rounds=2", "--set", "eval_every=2", "--set", "data.num_clients=4", "--set", "algo.cohort_size=2"]
    assert main(["compare", "--algorithms", "fedavg,perfedavg", "--set", "algo.beta=0.05", *small, "--quiet",
                 "--out", str(tmp_path / "ok")]) == 0  # beta is Per-FedAvg's only
    saved = load_config(str(tmp_path / "ok" / "perfedavg" / "config.yaml"))
    assert saved.algo["beta"] == 0.05 and "beta" not in load_config(str(tmp_path / "ok" / "fedavg" / "config.yaml")).algo


def test_help_everywhere(capsys):
    for argv in (["--help"], ["run", "--help"], ["compare", "--help"], ["list", "--help"], ["reproduce", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "usage: fljax" in out
        if argv[0] in ("run", "compare", "reproduce"):
            assert "examples:" in out and "fljax " + argv[0] in out


def test_list_shows_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for section in ("algorithms:", "datasets:", "partitioners:", "models:", "executors:", "topologies:"):
        assert section in out
    for name in (*ALGORITHMS, "digits", "dirichlet", "mlp", "vmap", "ring"):
        assert f"  {name} " in out


def test_reproduce_dispatches_by_name(capsys, tmp_path, monkeypatch):
    import fljax.reproduce

    (tmp_path / "toy.py").write_text(textwrap.dedent("""
        CALLS = []
        def main(argv):
            CALLS.append(argv)
            return 7
    """))
    monkeypatch.setattr(fljax.reproduce, "__path__", [*fljax.reproduce.__path__, str(tmp_path)])
    assert main(["reproduce", "toy", "--rounds", "3", "x"]) == 7
    import fljax.reproduce.toy as toy

    assert toy.CALLS == [["--rounds", "3", "x"]]
    message = _error(capsys, ["reproduce", "tyo"])
    assert message.startswith("unknown reproduction 'tyo'; available: [") and "'toy'" in message
    assert "Did you mean 'toy'?" in message


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_has_an_example_config(name):
    path = os.path.join(ROOT, "configs", f"{name}.yaml")
    assert os.path.exists(path), f"add configs/{name}.yaml (an example config for {name})"
    cfg = load_config(path)  # parses, type-checks and validates (hyperparameters included)
    assert cfg.algorithm == name
    with open(path) as f:
        assert f.readline().startswith("#"), "start the file with a comment saying what it runs"
