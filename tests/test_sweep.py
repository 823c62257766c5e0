"""Vectorised hyperparameter grids (`fljax sweep`, `fljax.sweep`): a grid of numeric hyperparameters × seeds is
one compiled program; it equals the separate runs (bit for bit when the lanes run one after another inside the
program, to float tolerance when they are batched); keys that cannot be traced fall back to separate programs; a
diverging point stops alone."""
import json
import os

import numpy as np
import pytest

import fljax
from fljax.cli import main
from fljax.runner import files
from fljax.runner.sweep import grid_points, parse_grid, point_label

COMMON = dict(algorithm="fedprox", data={"dataset": "digits", "num_clients": 8, "seed": 0},
              model={"name": "mlp", "options": {"hidden": [16]}}, algo={"cohort_size": 4, "local_steps": 3},
              rounds=4, eval_every=2, seeds=2, progress=False)


def _records(result):
    return [[{k: v for k, v in r.items() if k != "run_seconds"} for r in run.progress.log.history] for run in result.runs]


def test_grid_parsing_and_points():
    grid = parse_grid(["algo.lr=0.01,1e-3", "algo.mu=[0, 0.5]"])
    assert grid == {"algo.lr": [0.01, 0.001], "algo.mu": [0, 0.5]}  # 1e-3 is a float, as a person means
    points = grid_points(grid)
    assert points[1] == {"algo.lr": 0.01, "algo.mu": 0.5} and len(points) == 4
    assert point_label(points[1]) == "lr=0.01,mu=0.5"
    for bad in (["algo.lr"], ["algo.lr=0.1", "algo.lr=0.2"]):
        with pytest.raises(fljax.ConfigError):
            parse_grid(bad)


def test_grid_is_one_program_and_equals_its_separate_runs_bit_for_bit():
    """Lanes run one after another inside the program (lanes='map'): each point equals the same point swept alone
    (its own program, the hyperparameter traced the same way), every metric bit for bit."""
    grid = {"algo.lr": [0.03, 0.1, 0.3], "algo.mu": [0.0, 0.5]}
    together = fljax.sweep(grid, lanes="map", **COMMON)
    assert all(r.vectorised for r in together.values())
    for values in grid_points(grid):
        alone = fljax.sweep({k: [v] for k, v in values.items()}, lanes="map", **COMMON)
        (label, result), = alone.items()
        assert label == point_label(values)
        assert _records(result) == _records(together[label])


def test_vectorised_grid_agrees_with_plain_runs():
    """The default batched lanes equal `fljax.run` of each point (hyperparameters as constants) to float
    tolerance; the points really differ."""
    grid = {"algo.lr": [0.03, 0.3]}
    swept = fljax.sweep(grid, **COMMON)
    finals = []
    for values in grid_points(grid):
        plain = fljax.run(**{**COMMON, "algo": {**COMMON["algo"], "lr": values["algo.lr"]}})
        for a, b in zip(_records(plain), _records(swept[point_label(values)])):
            for ra, rb in zip(a, b):
                for key in ra:
                    np.testing.assert_allclose(rb[key], ra[key], rtol=2e-5, atol=1e-6, err_msg=key)
        finals.append(plain.final["personal_acc"])
    assert finals[0] != finals[1]


def test_untraceable_and_shape_changing_keys_run_as_separate_programs():
    """momentum is a Python branch (momentum or None), batch_size a shape: one program per value of theirs, the lr
    values still lanes; every point equals its plain run."""
    grid = {"algo.lr": [0.05, 0.2], "algo.momentum": [0.0, 0.5], "algo.batch_size": [5, 10]}
    swept = fljax.sweep(grid, **{**COMMON, "seeds": 1})
    assert len(swept) == 8 and all(r.vectorised for r in swept.values())  # lanes over lr (two lr per program)
    values = {"algo.lr": 0.2, "algo.momentum": 0.5, "algo.batch_size": 5}
    plain = fljax.run(**{**COMMON, "seeds": 1, "algo": {**COMMON["algo"], "lr": 0.2, "momentum": 0.5,
                                                        "batch_size": 5}})
    np.testing.assert_allclose(swept[point_label(values)].final["personal_acc"], plain.final["personal_acc"],
                               atol=1e-6)


def test_sweep_cli_table_files_and_a_diverging_point_stops_alone(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--algorithm", "fedavg", "--dataset", "digits", "--set", "data.num_clients=8",
            "--set", "model.name=mlp", "--set", "model.options.hidden=[16]", "--set", "rounds=4",
            "--set", "algo.cohort_size=4",
            "--set", "eval_every=2", "--grid", "algo.lr=0.1,1e6", "--seeds", "2", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split("|")[1].strip() == "lr"  # the grid key heads the point column
    assert "| 0.1 " in table and "stopped: round 1 diverged: train_loss=" in table
    assert sorted(os.listdir(out)) == ["config.yaml", "directory.json", "lr=0.1", "lr=1000000.0", "summary.json",
                                       "sweep.md", "sweep.pdf", "sweep.png", "sweep_metrics.pdf", "sweep_metrics.png"]
    summary = files.read_json(out / "summary.json")
    assert summary["grid"] == {"algo.lr": [0.1, 1000000.0]} and summary["programs"]["vectorised_runs"] == 4
    ok = files.read_json(out / "lr=0.1" / "seed_0" / "summary.json")
    bad = files.read_json(out / "lr=1000000.0" / "seed_1" / "summary.json")
    assert ok["status"] == "completed" and ok["rounds"] == 4
    assert bad["status"] == "stopped" and "diverged" in bad["message"] and bad["rounds"] == 0
    # the sweep's own config and grid let it resume; a finished sweep resumes to the same table
    assert main(["sweep", "--resume", "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "lr=0.1" / "seed_0" / "summary.json").read_text()) == ok


def test_every_metric_of_every_point_equals_its_plain_run():
    """Beyond the final accuracy: a grid over a traced key (lr: lanes of one program) and a shape (batch_size: one
    program per value), two seeds, gives for every point and seed the whole history of its plain `fljax.run`
    (every metric at every evaluation: accuracies, losses, train loss, bytes) to float tolerance."""
    grid = {"algo.lr": [0.05, 0.2], "algo.batch_size": [5, 10]}
    common = {**COMMON, "rounds": 2, "eval_every": 1}
    swept = fljax.sweep(grid, **common)
    for values in grid_points(grid):
        algo = {**COMMON["algo"], **{k.split(".", 1)[1]: v for k, v in values.items()}}
        plain = _records(fljax.run(**{**common, "algo": algo}))
        got = _records(swept[point_label(values)])
        assert [[sorted(r) for r in run] for run in got] == [[sorted(r) for r in run] for run in plain]
        for a, b in zip(plain, got):
            for ra, rb in zip(a, b):
                for key in ra:
                    np.testing.assert_allclose(rb[key], ra[key], rtol=2e-5, atol=1e-6,
                                               err_msg=f"{point_label(values)} {key} round {ra['round']}")


def test_a_two_key_grid_loads_with_one_column_per_key_and_draws_a_heatmap(tmp_path):
    """A sweep over two keys: sweep.md, load_sweep's (and load_compare's) frame have a column per grid key holding
    the point's value; the final accuracies are drawn as a heatmap; load_run on the sweep says what to call."""
    pd = pytest.importorskip("pandas")
    out = tmp_path / "sw"
    grid = {"algo.lr": [0.05, 0.1], "algo.mu": [0.0, 0.1]}
    config = {k: v for k, v in COMMON.items() if k != "progress"}
    results = fljax.sweep(grid, {**config, "seeds": 1, "rounds": 2, "eval_every": 2}, out=str(out), progress=False)
    assert set(results) == {point_label(p) for p in grid_points(grid)}
    header = [c.strip() for c in (out / "sweep.md").read_text().split("\n\n")[1].splitlines()[0].split("|")[1:-1]]
    assert header[:2] == ["lr", "mu"]
    assert (out / "sweep_heatmap.png").exists() and (out / "sweep_heatmap.pdf").exists()
    frame = fljax.load_sweep(out)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns[:3]) == ["run", "lr", "mu"]
    by_run = frame.groupby("run")[["lr", "mu"]].first()
    for point in grid_points(grid):
        assert tuple(by_run.loc[point_label(point)]) == (point["algo.lr"], point["algo.mu"])
    assert list(fljax.load_compare(out).columns[:3]) == ["run", "lr", "mu"]
    with pytest.raises(fljax.ConfigError, match="load_sweep"):
        fljax.load_run(out)


@pytest.mark.parametrize("data_seed,executor", [(0, "vmap"), (None, "vmap"), (0, "loop")])
def test_a_sweep_builds_one_simulation_per_program_and_resolves_privacy_once_per_data_set(monkeypatch, data_seed,
                                                                                           executor):
    """A private sweep of 3 learning rates × 2 seeds builds one Simulation per compiled program — one program of 6
    lanes on a shared data set; with a partition per seed, one program (data of one shape, stacked per lane) or one
    per seed; one per learning rate under the loop executor, which cannot batch — never one per point only to check
    it, and
    resolves the privacy once per data set: every run of a data set holds that one resolution. (Under the loop
    executor each run is a program of its own, and the runs of one learning rate run one compiled program, their
    seeds its arguments.)"""
    import fljax.privacy
    from fljax.config import from_dict
    from fljax.engine import Simulation
    from fljax.runner import Output, schedule
    from fljax.runner.collection import sweep_points
    from fljax.runner.points import run_points

    cfg = from_dict(fljax.ExperimentConfig, {
        "algorithm": "fedprox", "data": {"dataset": "digits", "num_clients": 8, "seed": data_seed},
        "model": {"name": "logreg"}, "algo": {"cohort_size": 4, "local_steps": 2}, "rounds": 2, "eval_every": 1,
        "seeds": 2, "executor": executor, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0}})
    points = sweep_points(cfg, {"algo.lr": [0.03, 0.1, 0.3]})  # (resolving them checks the privacy section)
    sims, resolutions, executed = [], [], []
    init, resolve_run, execute = Simulation.__init__, fljax.privacy.resolve_run, schedule.execute
    monkeypatch.setattr(Simulation, "__init__", lambda self, *a, **k: sims.append(self) or init(self, *a, **k))
    monkeypatch.setattr(fljax.privacy, "resolve_run", lambda *a, **k: resolutions.append(a) or resolve_run(*a, **k))
    monkeypatch.setattr(schedule, "execute", lambda program, built, *a: executed.append((program, built.sim))
                        or execute(program, built, *a))
    results = run_points(points, None, trace=("lr",), output=Output("quiet"))
    runs = [run for r in results for run in r.runs]
    assert len(runs) == 6 and all(run.progress.status == "completed" and run.point_seeds == 2 for run in runs)
    assert sorted(id(run) for program, _ in executed for run in program.runs) == sorted(map(id, runs))
    datas = {id(run.data) for run in runs}
    assert len(datas) == (1 if data_seed is not None else 2)
    compiled = {id(sim) for _, sim in executed}  # a seed is an argument of the program it runs in
    if executor == "loop":
        assert len(executed) == 6 and len(compiled) == 3  # each run alone, a learning rate's seeds in one program
    elif data_seed is not None:
        assert len(executed) == len(compiled) == 1
    assert len(sims) == len(compiled)
    assert len(resolutions) == len({id(run.privacy) for run in runs}) == len(datas)


def test_the_program_key_is_read_off_the_resolved_experiment():
    """Runs share a compiled program only when their resolved experiments agree (:func:`program_key`): every config
    key reaches the key — through the algorithm as it holds its hyperparameters, the resolved model, groups and
    components, the run settings, or the sections a simulation is built from — but the run's name, its seed and
    the folder of its client-state store (each run's own store, made by the runner: fljax.runner.stores);
    equal resolved values give one key however the config spells them (a default written out), and a traced key
    leaves it."""
    import dataclasses

    from fljax.config import load_config
    from fljax.experiment import RunSettings, resolve
    from fljax.runner.plan import COMPONENTS, SECTIONS, program_key

    read = {"algorithm", "algo", "model", "groups", *COMPONENTS, *SECTIONS, *(f.name for f in
                                                                          dataclasses.fields(RunSettings))}
    assert {f.name for f in dataclasses.fields(fljax.ExperimentConfig)} - read == {"name", "store_dir"}

    base = ["algorithm=fedavg", "data.num_clients=6", "data.max_samples=40", "model.name=logreg", "algo.cohort_size=3"]
    key = lambda *sets: program_key(resolve(load_config(None, [*base, *sets])))  # noqa: E731
    same = key()
    for sets in (["name=other"], ["seed=3"], ["seeds=2"], ["store_dir=elsewhere"], ["algo.lr=0.1"],  # lr: its default
                 ["model.name=logreg"]):
        assert key(*sets) == same, sets
    for sets in (["algo.lr=0.2"], ["rounds=7"], ["eval_every=3"], ["executor=loop"], ["data.num_clients=7"],
                 ["model.name=mlp"], ["precision=fp32"], ["participation.name=poisson"], ["diverge_factor=null"]):
        assert key(*sets) != same, sets
    lr = resolve(load_config(None, [*base, "algo.lr=0.2"]))
    assert program_key(lr, {"lr"}) == program_key(resolve(load_config(None, base)), {"lr"})
