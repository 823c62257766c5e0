"""The config layer: numbers as a person writes them, options declared and checked by the components that own
them (errors carry their key), the flat data section, and config.yaml read back unchanged. The refusals themselves
(one line, exit status 2, nothing written) are the catalogue in tests/bad_inputs.py, run by tests/test_cli.py."""
import glob
import os

import numpy as np
import pytest

import fljax
import fljax.data as D
from fljax import yaml_io
from fljax.config import apply_overrides, load_config, to_dict
from fljax.data import partitioners as P
from fljax.errors import ConfigError, OptionError
from fljax.experiment import compare_points, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text,value", [("1e-3", 1e-3), ("1E5", 1e5), (".5", 0.5), ("-2.5e-4", -2.5e-4), ("3", 3),
                                        ("010", 10), ("1_000", 1000), ("0x10", 16), ("true", True), ("null", None),
                                        ("yes", "yes"), ("off", "off"), ("1:30", "1:30"), ("2024-01-01", "2024-01-01"),
                                        ("'1e-3'", "1e-3"), (".inf", float("inf"))])
def test_yaml_reads_numbers_as_a_person_means(text, value):
    assert yaml_io.load(f"v: {text}")["v"] == value
    assert type(yaml_io.load(f"v: {text}")["v"]) is type(value)


def test_a_learning_rate_in_exponent_form_is_a_float(tmp_path):
    assert load_config(None, ["algo.lr=1e-3"]).algo["lr"] == 0.001  # YAML 1.1 read this as the text '1e-3'
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: fedprox\nalgo: {lr: 5E-2, mu: 1e-3}\ndata: {dataset: digits, alpha: .3}\n")
    cfg = load_config(str(path))
    assert (cfg.algo["lr"], cfg.algo["mu"], cfg.data.options["alpha"]) == (0.05, 0.001, 0.3)


def test_dump_quotes_text_that_would_read_back_as_something_else():
    value = {"a": "1e3", "b": "0o17", "c": "yes", "d": [1.5e-05, float("inf")], "e": None, "f": (1, 2), "g": "~"}
    back = yaml_io.load(yaml_io.dump(value))
    assert back == {**value, "f": [1, 2]}


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))
                                        + [os.path.join(ROOT, "fljax", "configs", "quickstart.yaml")]),
                         ids=os.path.basename)
def test_every_config_reads_back_from_its_config_yaml(tmp_path, path):
    cfg = resolve(load_config(path)).config
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml_io.dump(to_dict(cfg)))
    assert to_dict(load_config(str(saved))) == to_dict(cfg)


def test_errors_carry_their_key():
    cases = [({"data": {"dataset": "digits", "alpha": -1.0}}, "data.alpha"),
             ({"data": {"dataset": "digits", "partition": "iid", "alpha": 0.3}}, "data.alpha"),
             ({"data": {"num_clients": 1.5}}, "data.num_clients"),
             ({"model": {"name": "mlp", "options": {"hidden": [8, 0]}}}, "model.options.hidden"),
             ({"model": {"name": "mlp", "options": {"hidden": ["a"]}}}, "model.options.hidden[0]"),
             ({"algo": {"lr": float("nan")}}, "algo.lr"),
             ({"algo": {"lrr": 0.1}}, "algo.lrr"),
             ({"seed": 2 ** 32}, "seed"),
             ({"roundz": 3}, "roundz")]
    for values, key in cases:
        with pytest.raises(OptionError) as e:
            fljax.make_config(values)
        assert e.value.key == key and str(e.value).startswith(key + " "), (values, str(e.value))


def test_the_data_layer_checks_its_own_options():
    with pytest.raises(OptionError) as e:
        D.make_federated("digits", 10, "dirichlet", alpha=0.0)
    assert e.value.key == "alpha" and str(e.value) == "alpha must be > 0, got 0.0."
    with pytest.raises(OptionError, match="noise is an option of data set 'digits'"):
        D.make_federated("synthetic", 10, noise=0.5)
    with pytest.raises(OptionError, match=r"sigmaa is not a valid key for partition 'power_law'\. Did you mean"):
        P.partition("power_law", np.arange(40) % 4, 4, 0, sigmaa=1.0)
    with pytest.raises(OptionError, match="alpha must be > 0"):
        P.DirichletOptions(alpha=-1.0)  # direct construction checks too


def test_a_resolved_data_section_holds_exactly_the_chosen_components_keys():
    data = to_dict(fljax.make_config(data={"dataset": "digits", "partition": "client_pathological"}))["data"]
    common = ["dataset", "num_clients", "partition", "seed", "test_per_client", "test_fraction", "test_rounding",
              "storage", "test_rows"]
    assert list(data) == [*common, "noise", "test_per_class", "classes_per_client", "samples_per_client", "on_exhausted"]
    assert to_dict(fljax.make_config({}))["data"]["partition"] == "natural"  # null resolved to the default


def test_null_unsets_a_key_of_another_component():
    with pytest.raises(ConfigError, match="data.alpha is an option of partitions"):
        load_config(os.path.join(ROOT, "configs", "fedavg.yaml"), ["data.partition=iid"])
    cfg = load_config(os.path.join(ROOT, "configs", "fedavg.yaml"), ["data.partition=iid", "data.alpha=null"])
    assert cfg.data.partition == "iid" and "alpha" not in cfg.data.options


def test_overrides_refuse_malformed_keys_and_values():
    assert apply_overrides({}, ["data.alpha=0.1", "algo.lr=", "name=a: b"]) == {
        "data": {"alpha": 0.1}, "algo": {"lr": None}, "name": {"a": "b"}}
    assert apply_overrides({}, ["name=[unclosed"]) == {"name": "[unclosed"}  # not YAML: taken as text
    with pytest.raises(ConfigError, match="appears twice"):
        apply_overrides({}, ["model.options={a: 1, a: 2}"])


def test_a_null_section_is_an_empty_one_to_an_override_of_its_keys(tmp_path):
    """Issue 41 item 5: every saved config.yaml holds `privacy: null` and `compression: null`; `--set
    privacy.noise_multiplier=1` over it sets the section, as over a config without the lines. The sections that may
    be null are read off ExperimentConfig's types (a section added later is one too), and only those: a null
    scalar is still not a section."""
    from fljax.config import nullable_sections

    assert {"privacy", "compression", "stop"} <= nullable_sections()
    assert not nullable_sections() & {"data", "model", "server", "rounds", "name", "groups", "chunk_size"}
    saved = tmp_path / "config.yaml"
    saved.write_text("algorithm: fedavg\nprivacy: null\ncompression: null\nstop: null\nname: null\n")
    sets = ["privacy.noise_multiplier=1", "privacy.clip_norm=0.5", "compression.kind=top_k",
            "compression.fraction=0.1"]
    cfg = load_config(str(saved), sets)
    assert (cfg.privacy.noise_multiplier, cfg.privacy.clip_norm) == (1.0, 0.5)
    assert (cfg.compression.kind, cfg.compression.fraction) == ("top_k", 0.1)
    assert to_dict(cfg) == to_dict(load_config(None, ["algorithm=fedavg", *sets]))  # as without the null lines
    assert apply_overrides({"stop": None}, ["stop.tol=1e-6"]) == {"stop": {"tol": 1e-6}}
    with pytest.raises(ConfigError, match="'name' is not a section"):
        apply_overrides({"name": "a"}, ["name.x=1"])
    assert load_config(str(saved)).privacy is None  # without an override the section stays off

def test_test_per_client_is_used_as_given():
    data = D.make_federated("digits", 10, "iid", test_per_client=3)
    assert (np.asarray(data.test.count) == 3).all()


def test_compare_shared_keys_apply_to_the_algorithms_that_declare_them():
    cfg = load_config(None, ["data.dataset=digits", "algo.local_epochs=2", "algo.lr=0.1", "algo.batch_size=10",
                             "algo.mu=0.5"])
    points = {name: exp for _, exp, name, _ in compare_points(cfg, ["fedavg", "fedprox", "quped", "perfedavg"])}
    # QuPeD counts its iterations per round (local_steps) and declares no local_epochs; only FedProx declares mu
    assert points["quped"].config.algo == {"lr": 0.1, "batch_size": 10} and points["quped"].algorithm.lr == 0.1
    assert points["fedavg"].config.algo == {"local_epochs": 2, "lr": 0.1, "batch_size": 10}
    assert points["fedprox"].algorithm.mu == 0.5 and points["perfedavg"].algorithm.batch_size == 10
    with pytest.raises(OptionError, match="algo.local_epochs is not a valid key for algorithm 'quped'"):
        compare_points(load_config(None, ["data.dataset=digits"]), [("quped", {"local_epochs": 2})])  # own: kept
    with pytest.raises(ConfigError, match="algo.muu is not a valid key for any of the compared algorithms"):
        compare_points(load_config(None, ["algo.muu=1"]), ["fedavg", "fedprox"])


@pytest.mark.parametrize("override, section", [("lr=0.1", "algo"), ("mu=0.1", "algo"), ("num_clients=5", "data"),
                                               ("hidden=[8]", None)])
def test_a_section_key_at_the_top_level_names_its_section(override, section):
    """``--set lr=0.1`` points at ``algo.lr`` (a hyperparameter of a built-in algorithm), a key that no section has
    gets the usual list of valid keys."""
    with pytest.raises(OptionError) as e:
        load_config(None, [override], base={"algorithm": "fedprox"})
    key = override.split("=")[0]
    if section:
        assert f"did you mean {section}.{key}?" in str(e.value) and "Valid keys" not in str(e.value)
    else:
        assert "Valid keys" in str(e.value)


def test_the_top_level_hint_knows_every_registered_algorithms_hyperparameters():
    """The hint on a hyperparameter given at the top level is derived from the registry (no hand-kept list): a local
    training option (``lr``), a server optimizer's (``server_lr``) and an algorithm's own (``mu``) are each hinted as
    ``algo.<key>``, and so is every flat name the registry declares."""
    from fljax.algorithms import ALGORITHMS
    from fljax.algorithms.registry import declarations, option_names
    from fljax.config import _section_of

    declared = set().union(*(declarations(cls) for cls in ALGORITHMS.values()))
    assert option_names() == declared and {"lr", "server_lr", "mu", "local_steps"} <= declared
    assert all(_section_of(k) == "algo" for k in declared)
    for key in ("lr", "server_lr", "mu"):
        with pytest.raises(OptionError, match=f"did you mean algo.{key}"):
            fljax.make_config(**{key: 0.1})
