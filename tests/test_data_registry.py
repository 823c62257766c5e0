"""fljax.data as layers (issue 37): the types, the registries, the readers that register themselves there, and what
reads the registries, with no import circle among the modules of fljax.data and fljax.problems (every import
counted, at module level or inside a function; importing another package's module counts as importing that
package too, whose __init__ Python runs first). A reader defined in a test is one call of register_source and then
a data set like any other. The consensus-regression problem is a problem-kind entry at both layers (its data kind,
its experiment kind) and the composition root compares no problem's name."""
import ast
import dataclasses
import os

import jax
import numpy as np
import pytest

import fljax.data as D
from fljax.algorithms import ALGORITHMS
from fljax.cli import main
from fljax.config import ExperimentConfig, from_dict, load_config
from fljax.errors import OptionError
from fljax.experiment import PROBLEM_KINDS, build, load_data, resolve
from fljax.options import Options, at_least, option
from import_graph import ROOT, imports, package_modules, reachable

PACKAGES = ("fljax.data", "fljax.problems")


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts))}


def _graph() -> dict[str, set[str]]:
    """The import graph of fljax.data and fljax.problems: an edge for every import, and one to every package above
    the imported module that is not above the importer (Python runs that package's __init__ first)."""
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        if not name.startswith(PACKAGES):
            continue
        edges = set()
        for target in imports(path, modules):
            edges |= {target} | (_parents(target) - _parents(name) - {name})
        graph[name] = {t for t in edges if t.startswith(PACKAGES) and t != name}
    return graph


def _registering(name: str) -> bool:
    """Whether a module registers a data set (calls register_source)."""
    with open(package_modules()[name]) as f:
        tree = ast.parse(f.read())
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "register_source"
               for n in ast.walk(tree))


def test_the_data_modules_form_layers_without_a_circle():
    graph = _graph()
    circles = sorted(m for m in graph if m in reachable(graph, m))
    assert not circles, f"in an import circle: {circles}"
    # the bottom: the types import nothing of fljax; the registry only the types (and fljax.options)
    modules = package_modules()
    assert imports(modules["fljax.data.types"], modules) == set()
    assert imports(modules["fljax.data.registry"], modules) == {"fljax.data.types", "fljax.options"}
    # data flows one way: fljax.data imports nothing of fljax.problems, nor anything above the options and errors
    outside = {t for m, p in modules.items() if m.startswith("fljax.data") for t in imports(p, modules)
               if not t.startswith("fljax.data")}
    assert outside <= {"fljax.options", "fljax.errors"}, outside
    # every reader registers its sets in the registry; those of fljax.data sit below what reads it (a reader of
    # another package, FedGiA's, sits above the package)
    readers = [m for m in graph if _registering(m) and m != "fljax.data.registry"]
    assert {"fljax.data.synthetic_data", "fljax.data.leaf", "fljax.problems.sources"} <= set(readers)
    for reader in readers:
        assert "fljax.data.registry" in graph[reader]
        if reader.startswith("fljax.data."):
            assert not reachable(graph, reader) & {"fljax.data", "fljax.data.config", "fljax.data.build"}, reader


@dataclasses.dataclass(frozen=True)
class SensorOptions(Options):
    sensors: int = option(3, "readings per sample", at_least(1))


def load_sensors(o: SensorOptions, num_clients: int, seed: int) -> D.Natural:
    """Every client's readings, one client after another; the label: whether the first reading is positive."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(6, 12, num_clients).astype(np.int32)
    x = rng.normal(size=(counts.sum(), o.sensors)) + np.repeat(rng.normal(size=num_clients), counts)[:, None]
    return D.Natural(x.astype(np.float32), (x[:, 0] > 0).astype(np.int32), counts, 2, "sensors")


@pytest.fixture
def registries():
    """The registries as they were, after the test."""
    saved = [(registry, dict(registry)) for registry in (D.SOURCES, D.PARTITIONERS, D.DATA_KINDS)]
    yield
    for registry, entries in saved:
        registry.clear()
        registry.update(entries)


@pytest.fixture
def sensors(registries):
    """A reader of one's own: one call of register_source."""
    return D.register_source("sensors", D.Source("sensor readings, one client per device", SensorOptions,
                                                 load_sensors, lambda o: 40, (3,), 2, natural=True,
                                                 shape_of=lambda o: (o.sensors,)))


def _same(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert jax.tree.structure(a) == jax.tree.structure(b)


def test_a_reader_defined_here_is_a_data_set_like_any_other(sensors, capsys, tmp_path):
    loaded = load_sensors(SensorOptions(sensors=4), 6, 3)
    _same(vars(D.load_source("sensors", num_clients=6, seed=3, sensors=4)), vars(loaded))
    data = D.make_federated("sensors", 6, seed=3, sensors=4, test_fraction=0.25)
    _same(data, D.federate(loaded, 6, "natural", 3, test_fraction=0.25))
    assert data.input_shape == (4,) and data.num_classes == 2
    # a config's data section: the reader's own key, its shape for the model, its population bound, foreign keys
    cfg = from_dict(ExperimentConfig, {"algorithm": "fedavg", "data": {"dataset": "sensors", "num_clients": 6,
                                                                       "sensors": 4},
                                       "algo": {"cohort_size": 3, "local_steps": 2, "batch_size": 4}, "rounds": 1})
    exp = resolve(cfg)
    assert exp.model.name == "logreg" and cfg.data.options == {"sensors": 4} and cfg.data.input_shape == (4,)
    _same(load_data(exp), D.make_federated("sensors", 6, seed=cfg.seed, sensors=4))
    sim = build(exp, load_data(exp), privacy=None)
    state, _ = sim.run_rounds(sim.init(), 1)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.server["params"]))
    with pytest.raises(OptionError, match=r"^num_clients must be at most 40 \(the most clients sensors generates\)"):
        D.DataConfig.from_dict({"dataset": "sensors", "num_clients": 41})
    with pytest.raises(OptionError, match=r"^noise is an option of data set 'digits', not of data set 'sensors'"):
        D.DataConfig.from_dict({"dataset": "sensors", "noise": 0.1})
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "sensors        sensor readings, one client per device" in listing and "readings per sample" in listing
    # the command line of a script that imported the reader first (docs/data.md): `run --dataset sensors`
    out = tmp_path / "run"
    assert main(["run", "--dataset", "sensors", "--set", "data.num_clients=6", "--set", "data.sensors=4", "--set",
                 "rounds=1", "--set", "algo.cohort_size=3", "--quiet", "--out", str(out)]) == 0
    written = load_config(str(out / "config.yaml"))
    assert written.data.dataset == "sensors" and written.data.options == {"sensors": 4}


def test_registration_is_refused_in_one_line_and_changes_nothing(registries):
    before = (dict(D.SOURCES), dict(D.PARTITIONERS), dict(D.DATA_KINDS))
    source = D.Source("again", SensorOptions, load_sensors, lambda o: 40, (3,), 2, natural=True)
    cases = [(lambda: D.register_source("digits", source), r"^data set 'digits' is registered already \(scikit"),
             (lambda: D.register_source(" sensors", source), r"^a data set's name must be a non-empty string"),
             (lambda: D.register_source("sensors", load_sensors), r"must be registered as a fljax\.data\.Source, got "
                                                                  r"function\.$"),
             (lambda: D.register_source("sensors", dataclasses.replace(source, options=dict)),
              r"^data set 'sensors': options must be a fljax\.options\.Options dataclass"),
             (lambda: D.register_data_kind("classification", D.DataKind("again", lambda c, s, seed: s)),
              r"^data kind 'classification' is registered already"),
             (lambda: D.register_partitioner("iid", D.PARTITIONERS["dirichlet"]),
              r"^partition 'iid' is registered already")]
    for register, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            register()
        assert "\n" not in str(e.value)
    assert (D.SOURCES, D.PARTITIONERS, D.DATA_KINDS) == before


def test_every_problem_has_its_data_kind_and_its_experiment_kind():
    posed = {s.problem for s in D.SOURCES.values()} | {c.problem for c in ALGORITHMS.values()}
    assert posed == set(D.DATA_KINDS) == set(PROBLEM_KINDS) == {"classification", "consensus regression"}
    assert PROBLEM_KINDS["consensus regression"].float64 and not PROBLEM_KINDS["classification"].float64


def test_the_composition_root_compares_no_problem_s_name():
    """experiment.py's problem-kind branches are entries of PROBLEM_KINDS: no comparison names a problem."""
    with open(os.path.join(ROOT, "fljax", "experiment.py")) as f:
        tree = ast.parse(f.read())
    named = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
             and any(isinstance(c, ast.Constant) and c.value in PROBLEM_KINDS for c in [node.left, *node.comparators])]
    assert not named, f"experiment.py compares a problem's name at lines {named}"


V1 = {"algorithm": "fedgia", "algo": {"loss": "least_squares", "k0": 2}, "rounds": 2,
      "data": {"dataset": "fedgia_v1", "num_clients": 4, "features": 3, "rows_min": 4, "rows_max": 6}}


def test_the_consensus_regression_kind_checks_builds_and_writes_its_experiments(monkeypatch):
    kind, calls = PROBLEM_KINDS["consensus regression"], []

    def recorded(step):
        def call(*args):
            calls.append(step)
            return getattr(kind, step)(*args)
        return call

    monkeypatch.setitem(PROBLEM_KINDS, kind.name, dataclasses.replace(
        kind, resolve=recorded("resolve"), build=recorded("build"), resolved=recorded("resolved")))
    with jax.enable_x64(True):
        exp = resolve(from_dict(ExperimentConfig, V1))
        build(exp, load_data(exp), privacy=None)
        exp.resolved()
    assert calls == ["resolve", "build", "resolved"] and exp.settings.x64
    # its data kind: the packed clients as loaded, and the keys of a test split refused (a config's and
    # make_federated's alike)
    for key, value in (("test_fraction", 0.3), ("test_per_client", 2), ("test_rows", 9), ("storage", "ragged")):
        with pytest.raises(OptionError, match=rf"^{key} does not apply to fedgia_v1 \(every client's rows are "
                                              rf"training rows, padded per size class\); remove it\.$"):
            D.make_federated("fedgia_v1", 4, seed=0, **{key: value})
