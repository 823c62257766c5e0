"""The composition root (fljax.experiment): a config is resolved once, below the runner, the API and the command
line. The import graph read from the source has no arrow from the runner up to the API and no circle among the
outer modules; along `fljax run` the algorithm object is constructed and validated once and run by every seed's
simulation."""
import os

import pytest

import fljax
from fljax.algorithms import ALGORITHMS, Algorithm, FedAvg, FedProx
from fljax.algorithms.registry import declarations
from fljax.cli import main
from fljax.config import apply_overrides, load_config
from fljax.errors import ConfigError, OptionError
from fljax.experiment import Experiment, preset, quickstart, resolve
from import_graph import imports, package_modules, reachable

PACKAGE = os.path.dirname(os.path.abspath(fljax.__file__))
OUTER = ("fljax.api", "fljax.cli", "fljax.config", "fljax.experiment", "fljax.runner")
TINY = ["--set", "data.num_clients=6", "--set", "data.max_samples=40", "--set", "model.name=logreg", "--set",
        "algo.cohort_size=3", "--set", "algo.local_steps=2", "--set", "algo.batch_size=10", "--set", "rounds=2",
        "--set", "eval_every=1", "--dataset", "synthetic", "--quiet"]


def _node(module: str) -> str:
    """The graph node of a module: the runner is one node (its modules may import each other)."""
    return "fljax.runner" if module.startswith("fljax.runner") else module


def _import_graph() -> dict[str, set[str]]:
    """Every import statement of the package, at module level or inside a function (lazy imports count too), as
    edges between nodes. ``from fljax import x`` points at module ``fljax.x``; the package itself (``import fljax``,
    for ``__version__``) is not a node: it is the namespace that re-exports the facade."""
    known = package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = {_node(t) for t in imports(path, known)} - {_node(name)}
        graph.setdefault(_node(name), set()).update(edges)
    return graph


def test_the_runner_never_imports_the_api_and_the_outer_modules_form_no_circle():
    graph = _import_graph()
    assert "fljax.api" not in graph["fljax.runner"]
    assert {"fljax.runner", "fljax.experiment"} <= graph["fljax.api"] and "fljax.experiment" in graph["fljax.runner"]
    circles = [(a, b) for a in OUTER for b in OUTER if a < b and b in reachable(graph, a)
               and a in reachable(graph, b)]
    assert not circles, circles
    assert not reachable(graph, "fljax.experiment") & {"fljax.api", "fljax.cli", "fljax.runner"}
    # config.py only parses: no registry of algorithms, models or executors below it
    assert not {n for n in reachable(graph, "fljax.config")
                if n.startswith(("fljax.algorithms", "fljax.models", "fljax.engine"))}


def _count_constructions(monkeypatch, cls) -> list:
    calls = []
    original = Algorithm.__post_init__

    def counting(self):
        if type(self) is cls:
            calls.append(self)
        original(self)

    monkeypatch.setattr(Algorithm, "__post_init__", counting)
    return calls


def _count_validations(monkeypatch, cls) -> list:
    """The number of clients of every call of ``cls.validate`` (from outside: a template's ``super().validate``
    inside it is part of the same call)."""
    calls = []
    original = cls.validate

    def counting(self, num_clients):
        calls.append(num_clients)
        original(self, num_clients)

    monkeypatch.setattr(cls, "validate", counting)
    return calls


def test_fljax_run_constructs_and_validates_the_algorithm_once(monkeypatch, tmp_path):
    """Two seeds, each with its own data and simulation: one algorithm object, constructed and validated once, runs
    both; a resume of the finished run constructs and validates it once too."""
    import fljax.runner.schedule as runner

    calls = _count_constructions(monkeypatch, FedProx)
    validations = _count_validations(monkeypatch, FedProx)
    sims = []
    build = runner.build
    monkeypatch.setattr(runner, "build", lambda exp, data, module=None, **kw: sims.append(
        build(exp, data, module, **kw)) or sims[-1])
    out = str(tmp_path / "r")
    assert main(["run", "--algorithm", "fedprox", "--seeds", "3", "--out", out, *TINY]) == 0
    assert len(calls) == 1 and len(sims) == 3 and all(s.algorithm is calls[0] for s in sims)
    assert validations == [6]
    calls.clear(), validations.clear()
    assert main(["run", "--resume", "--out", out, "--quiet"]) == 0
    assert len(calls) == 1 and validations == [6]


def test_a_simulation_built_from_python_validates_its_algorithm(monkeypatch):
    """A simulation that the user builds validates the algorithm for its data's training clients; one built from an
    experiment does not again, unless the data (the user's own) has another number of training clients."""
    from fljax.engine import Simulation
    from fljax.experiment import build, default_model
    from fljax.data import make_federated

    data = make_federated("synthetic", num_clients=6, max_samples=40)
    with pytest.raises(OptionError, match="cohort_size must be between 1 and num_clients=6"):
        Simulation(FedProx(cohort_size=7), data, default_model(data))
    validations = _count_validations(monkeypatch, FedProx)
    exp = resolve(load_config(None, ["algorithm=fedprox", "data.num_clients=6", "data.max_samples=40",
                                     "algo.cohort_size=3"]))
    assert validations == [6]
    build(exp, data, privacy=None)
    assert validations == [6]
    build(exp, make_federated("synthetic", num_clients=8, max_samples=40), privacy=None)
    assert validations == [6, 8]


def test_the_algorithm_is_validated_for_the_clients_that_train():
    """A meta_pairs split's target clients never train: a hyperparameter per client counts the others."""
    sets = ["algorithm=augfl", "data.dataset=mnist5k", "data.partition=meta_pairs", "data.num_clients=12",
            "data.target_clients=2", "model.name=mlp", "server.pretrained=mlp"]
    assert resolve(load_config(None, [*sets, f"algo.rho_per_client={[1.0] * 10}"])).algorithm.rho_per_client
    with pytest.raises(OptionError, match=r"algo.rho_per_client must list one penalty per training client \(10\)"):
        resolve(load_config(None, [*sets, f"algo.rho_per_client={[1.0] * 12}"]))
    with pytest.raises(OptionError, match="data.target_clients must be below num_clients=12"):
        load_config(None, [*sets, "data.target_clients=12"])


def test_resolve_builds_the_experiment_once_and_names_every_key():
    exp = resolve(load_config(None, ["algorithm=fedprox", "algo.mu=1", "data.dataset=digits"]))
    assert isinstance(exp, Experiment) and isinstance(exp.algorithm, FedProx)
    assert exp.algorithm.mu == 1.0 and type(exp.config.algo["mu"]) is float  # as the algorithm holds it
    assert exp.model.name == "cnn1" and exp.config.model.name == "auto"  # auto resolved, the config as given
    assert exp.with_seed(3).algorithm is exp.algorithm and exp.with_seed(3).config.seed == 3
    for overrides, message in [(["algorithm=fedprox", "algo.mu=-1"], "algo.mu must be >= 0, got -1.0."),
                               (["algo.muu=1"], "algo.muu is not a valid key for algorithm 'fedavg'"),
                               (["algorithm=fedavgg"], "algorithm must be one of"),
                               (["executor=fast"], "executor must be one of")]:
        with pytest.raises(ConfigError) as e:
            resolve(load_config(None, overrides))
        assert message in str(e.value) and "\n" not in str(e.value)
    groups = ('groups=[{"name": "a", "size": 50}, {"name": "b", "size": 50, "algo": {"lr": 0.5}}]',)
    exp = resolve(load_config(None, ["algo.cohort_size=null", *groups]))
    assert [(g.name, g.size, g.hp) for g in exp.groups] == [("a", 50, {}), ("b", 50, {"lr": 0.5})]
    with pytest.raises(OptionError, match=r"groups\[1\].algo.lr must be > 0"):
        resolve(load_config(None, ["algo.cohort_size=null", groups[0].replace("0.5", "0")]))


def test_the_quick_start_preset_keeps_the_algo_keys_an_algorithm_declares():
    path = os.path.join(PACKAGE, "configs", "quickstart.yaml")
    declared = lambda name: set(declarations(ALGORITHMS[name]))  # noqa: E731  (flat: its local training's too)
    for name in ALGORITHMS:
        algo = preset(path, {"algorithm": name})["algo"]
        assert set(algo) <= declared(name)
        assert set(algo) == set(preset(path, {"algorithm": name}, algorithm_keys=False)["algo"]) & declared(name)
    assert preset(path, {"algorithm": "quped"})["algo"] == {"cohort_size": 10, "lr": 0.1, "batch_size": 10}  # no epochs
    assert FedAvg().local.lr == preset(path, {"algorithm": "fedavg"})["algo"]["lr"]


def test_the_quick_start_cohort_belongs_to_its_population():
    """The preset's 10 clients per round are 10 of its 50: a user's own population (``data.num_clients`` or a
    partition) trains in full unless they choose a cohort, so ``num_clients=8`` is not refused for a cohort the user
    never set (the algorithm's own default applies); their own cohort and the preset's population keep it."""
    path = os.path.join(PACKAGE, "configs", "quickstart.yaml")
    cohort = lambda user: preset(path, user)["algo"].get("cohort_size")  # noqa: E731
    assert cohort({}) == 10 and cohort({"data": {"num_clients": 50}}) == 10
    assert cohort({"data": {"num_clients": 8}}) is None and cohort({"data": {"partition": "meta_pairs"}}) is None
    assert preset(path, {}, grid={"data.num_clients": [20, 50]})["algo"].get("cohort_size") is None
    for sets, expected in ((["algorithm=augfl", "data.num_clients=8"], None),  # AugFL's own default: all
                           (["algorithm=augfl", "data.num_clients=8", "algo.cohort_size=4"], 4),
                           (["data.num_clients=80"], FedAvg().cohort_size)):
        base = quickstart(apply_overrides({}, sets))  # as `fljax run --set ...` without a config
        assert resolve(load_config(None, sets, base=base)).algorithm.cohort_size == expected


@pytest.mark.parametrize("name,key,value", [("local", "weighting", "uniform"), ("quped_local", "weighting", "samples"),
                                            ("fedrep", "local_epochs", 2), ("fedrep", "local_steps", 5),
                                            ("fedrep", "sampling", "replacement")])
def test_an_option_that_an_algorithm_would_ignore_does_not_exist(name, key, value):
    """Local and QuPeD's Local Training aggregate nothing (no ``weighting``); FedRep's local work is its head and
    body epochs, each a shuffle of the client's data (no ``local_epochs``, ``local_steps``, ``sampling``)."""
    from fljax.algorithms import make_algorithm

    with pytest.raises(OptionError, match=f"^{key} is not a valid key for algorithm '{name}'"):
        make_algorithm(name, **{key: value})


def test_the_run_layer_is_named_parts_of_at_most_400_lines_without_circles():
    """fljax.runner is parts, one layer each (issue 37): no module over 400 lines, and no two of its modules
    import each other, lazily or not (the study runner and the report renderer once did), nor through others."""
    modules = {name: path for name, path in package_modules().items() if name.startswith("fljax.runner.")}
    long = {name: n for name, path in modules.items() if (n := sum(1 for _ in open(path))) > 400}
    assert not long, long
    graph = {name: imports(path, modules) - {name} for name, path in modules.items()}
    circles = sorted((a, b) for a in modules for b in modules if a < b and b in reachable(graph, a)
                     and a in reachable(graph, b))
    assert not circles, circles
