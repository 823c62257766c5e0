"""A new user's first run: the quick-start preset without a config file, the resolved config (resolved.yaml), times in
summary.json that add up (compile time under every executor), the environment recorded."""
import dataclasses

import pytest
import yaml

import fljax
from fljax.algorithms import ALGORITHMS, make_algorithm
from fljax.algorithms.registry import declarations
from fljax.cli import _load, make_parser
from fljax.config import ExperimentConfig, from_dict, load_config, to_dict
from fljax.experiment import resolve
from fljax.runner import files

TINY = {"data": {"dataset": "synthetic", "num_clients": 6, "max_samples": 40}, "model": {"name": "logreg"},
        "algo": {"cohort_size": 3, "local_steps": 2, "batch_size": 10}, "rounds": 2, "eval_every": 1}


def _cli_config(*argv):
    return _load(make_parser().parse_args(["run", *argv])).config


def test_run_without_a_config_file_uses_the_compare_preset():
    cfg = _cli_config("--algorithm", "fedavg", "--dataset", "digits", "--set", "rounds=5")
    assert (cfg.model.name, cfg.model.options, cfg.data.num_clients, cfg.rounds) == ("mlp", {"hidden": [64]}, 50, 5)
    assert _cli_config("--algorithm", "fedavg", "--rounds", "5") == _cli_config("--algorithm", "fedavg", "--set",
                                                                               "rounds=5")  # as reproduce --rounds
    assert cfg.algo == {"cohort_size": 10, "lr": 0.1, "batch_size": 10, "local_epochs": 2}
    # the preset's algo keys an algorithm does not take are left out; the user's own are still checked
    assert _cli_config("--algorithm", "dfedalt").algo == {"lr": 0.1, "batch_size": 10, "local_epochs": 2}
    # a component the user picks takes none of the preset's options for the preset's component
    assert _cli_config("--dataset", "synthetic").data.partition == "natural"
    assert _cli_config("--set", "data.partition=iid").data.to_dict().get("alpha") is None
    assert _cli_config("--set", "model.name=logreg").model.options == {}
    assert "local_epochs" not in _cli_config("--set", "algo.local_steps=3").algo
    with pytest.raises(fljax.ConfigError, match="algo.local_epoch .*Did you mean 'local_epochs'"):
        _cli_config("--algorithm", "fedavg", "--set", "algo.local_epoch=1")


@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.problem == "classification"))
def test_resolved_config_loads_back_to_the_same_experiment(name):
    exp = resolve(load_config(None, [f"algorithm={name}", "data.dataset=digits"]))
    full = exp.resolved()
    assert set(full.algo) == set(declarations(ALGORITHMS[name]))  # flat: the local training's lr among them
    assert full.model.name != "auto"
    back = resolve(from_dict(ExperimentConfig, yaml.safe_load(yaml.safe_dump(to_dict(full)))))
    assert back.algorithm == exp.algorithm == make_algorithm(name, **exp.config.algo)
    assert back.config.model == full.model


@pytest.mark.parametrize("executor", ["loop", "vmap"])
def test_summary_times_add_up_and_count_compilation(executor, tmp_path):
    out = tmp_path / executor
    fljax.run(TINY, algorithm="fedavg", executor=executor, out=str(out), progress=False)
    summary = files.read_json(out / "summary.json")
    parts = [summary[k] for k in ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds")]
    assert min(parts) >= 0 and summary["wall_seconds"] == pytest.approx(sum(parts))
    assert summary["compile_seconds"] > 0  # the loop executor's per-client jit compilations too
    assert summary["executor"] == executor and summary["model"] == "logreg"
    env = summary["environment"]
    assert env["jax"] and env["fljax"] == fljax.__version__ and env["device"] and env["backend"]
    full = yaml.safe_load(open(out / "resolved.yaml"))
    assert full["algo"]["lr"] == make_algorithm("fedavg").local.lr  # a default, recorded
    assert "lr" not in yaml.safe_load(open(out / "config.yaml"))["algo"]  # config.yaml: as given


def test_list_one_algorithm_shows_its_hyperparameters(capsys):
    from fljax.cli import main

    assert main(["list", "fedprox"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fedprox: FedProx")
    assert lines[1] == "family: one global model; example: configs/fedprox.yaml"  # its registration
    fields = list(declarations(ALGORITHMS["fedprox"]))  # its own and its values' (local training, server) options
    assert [line.split()[0] for line in lines[3:]] == fields  # one line each, in order
    assert {"lr", "server_lr", "mu"} <= set(fields)
    assert "  lr (float, default 0.1): client learning rate η (at round t: lr · lr_decay^t)" in lines
    assert "  mu (float, default 0.01): μ of the proximal term (μ/2)‖w − w_t‖² in every local objective (0: FedAvg)" \
        in lines


def test_every_hyperparameter_of_every_algorithm_is_declared_with_a_one_line_doc():
    """`fljax list` reads the declarations only: every hyperparameter (a field, or an option of a value it holds: its
    local training, its server optimizer) is an option(default, doc, check)."""
    missing = [f"{name}.{d.name}" for name, cls in sorted(ALGORITHMS.items()) for d in declarations(cls).values()
               if not d.doc or "\n" in d.doc]
    missing += [f"{name}.{f.name}" for name, cls in sorted(ALGORITHMS.items()) for f in dataclasses.fields(cls)
                if "check" not in f.metadata]
    assert not missing, "declare these fields with fljax.options.option(default, 'one line', check)"
