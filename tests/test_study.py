"""The study runner (fljax/runner/study.py, study_run.py) and the shipped study files: cells from axes, presets, rules and grids;
one run per distinct (config, seed) shared by every cell; runs reused after an interruption; tables, claims and
plots rendered by the one table module; every shipped study's every cell is a valid config."""
import os
import textwrap

import numpy as np
import pytest

from fljax.cli import main
from fljax.errors import ConfigError
from fljax.runner import files
from fljax.runner.study import StudyResults, evaluate, load_study, study_names
from fljax.runner.study_run import _experiments, render_study, results_from_file, run_study
from fljax.runner.tables import render_report, value_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = textwrap.dedent("""
    title: A tiny study
    seeds: 2
    base:
      data: {dataset: digits, num_clients: 6, partition: iid, test_per_client: 10}
      model: {name: mlp, options: {hidden: [8]}}
      rounds: 2
      eval_every: 1
      checkpoint_every: 0
    presets:
      sgd: {algo: {lr: 0.1, batch_size: 10, local_steps: 2, cohort_size: 3}}
    axes:
      method:
        FedAvg: {algorithm: fedavg, use: [sgd], tags: {reported: global}}
        Local: {algorithm: local, use: [sgd], tags: {reported: personal}}
      split:
        iid: {}
        dir: {data: {partition: dirichlet, alpha: 0.5}}
    rules:
      - when: {method: Local, split: dir}
        set: {algo: {lr: 0.05}}
    studies:
      main:
        cells: {method: all, split: [iid]}
      lr:
        cells: {method: [FedAvg], split: [iid]}
        grid: {algo.lr: [0.1, 0.3]}
      rules:
        cells: {method: [Local], split: all}
    tables:
      - title: Main
        study: main
        rows: method
        columns:
          - {title: reported model, tag: reported}
          - {axis: split, value: "{reported}_acc"}
          - {title: paper, paper: {FedAvg: 90.0}}
          - {title: "FedAvg − method", value: personal_acc, minus: {method: FedAvg}}
      - title: LR
        study: lr
        rows: algo.lr
        columns:
          - {title: acc, value: personal_acc}
          - {title: MB, value: (bytes_up + bytes_down) / 1e6, scale: 1, digits: 3}
    plots:
      - {file: curves.png, study: main, kind: curves, value: personal_acc, lines: method}
      - {file: lr.png, study: lr, kind: final, x: algo.lr, value: personal_acc, lines: [method]}
""")


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(STUDY)
    return load_study(str(path))


def test_cells_follow_axes_presets_rules_and_grids(tiny):
    cells = tiny.cells()
    assert [(c.study, c.labels) for c in cells[:2]] == [("main", {"method": "FedAvg", "split": "iid"}),
                                                       ("main", {"method": "Local", "split": "iid"})]
    by = {(c.study, tuple(c.labels.values())): c for c in cells}
    assert by[("main", ("FedAvg", "iid"))].config["algo"] == {"lr": 0.1, "batch_size": 10, "local_steps": 2,
                                                             "cohort_size": 3}
    assert by[("rules", ("Local", "dir"))].config["algo"]["lr"] == 0.05  # the rule applies
    assert by[("rules", ("Local", "iid"))].config["algo"]["lr"] == 0.1
    assert by[("lr", ("FedAvg", "iid", 0.3))].config["algo"]["lr"] == 0.3
    # equal configs are one run: main/FedAvg = lr/0.1, main/Local = rules/Local/iid
    keys = {c.key(s) for c in cells for s in c.seeds}
    assert len(keys) == 2 * (len(cells) - 2) and len(_experiments(cells)) == len(keys)
    assert tiny.cells(seeds=1)[0].seeds == [0]
    tiny.spec["studies"]["lr"]["seeds"] = [99]  # a study's own seeds (a tuning seed) stay whatever --seeds says
    assert {tuple(c.seeds) for c in tiny.cells(["lr"], seeds=1)} == {(99,)}
    tiny.spec["studies"]["lr"]["seeds"] = [-1]
    with pytest.raises(ConfigError, match="list of seeds"):
        tiny.cells(["lr"])
    with pytest.raises(ConfigError, match="no study 'nope'"):
        tiny.cells(["nope"])


def test_run_report_reuse_and_render(tiny, tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    results = run_study(tiny, out)
    assert results.meta["runs"] == 8 and results.meta["computed"] == 8
    readme = open(os.path.join(out, "README.md")).read()
    assert "## Main" in readme and "| FedAvg" in readme and "90.0" in readme and "## LR" in readme
    assert "Not run" not in readme
    # a report rendered before every run finished names the cells it lacks (a run shared by two cells: both)
    shared = next(c for c in results.cells if c.study == "lr" and c.labels["algo.lr"] == 0.1).key(1)
    partial = render_report(StudyResults(tiny, results.cells, {k: v for k, v in results.runs.items() if k != shared},
                                         results.meta))
    assert ("**Not run**: 1 run of 2 cells, whose rows are missing or hold fewer seeds: main method = FedAvg, "
            "split = iid; lr method = FedAvg, split = iid, algo.lr = 0.1.") in partial
    acc = results.final("main", "personal_acc", method="FedAvg", split="iid")
    assert acc.shape == (2,) and value_text(acc) in readme
    assert sorted(os.listdir(out)) == ["README.md", "curves.pdf", "curves.png", "directory.json", "lr.pdf", "lr.png",
                                       "results.json.gz", "runs"]
    # every run directory is a `fljax run` directory
    run = os.path.join(out, "runs", sorted(os.listdir(os.path.join(out, "runs")))[0])
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= set(os.listdir(run))
    # a second invocation reuses every finished run; a lost run directory is taken from the record in
    # results.json.gz (a committed report keeps its runs), and computed again when that is gone too
    import shutil

    shutil.rmtree(run)
    again = run_study(tiny, out)
    assert again.meta["computed"] == 0
    np.testing.assert_array_equal(again.final("main", "personal_acc", method="FedAvg", split="iid"), acc)
    os.remove(os.path.join(out, "results.json.gz"))
    again = run_study(tiny, out)
    assert again.meta["computed"] == 1
    np.testing.assert_array_equal(again.final("main", "personal_acc", method="FedAvg", split="iid"), acc)
    # --render rebuilds the report from results.json.gz alone
    rendered = results_from_file(tiny, out)
    assert rendered.final("lr", "personal_acc", **{"algo.lr": 0.3}).shape == (2,)
    # a study file whose settings changed is refused rather than mixed with old runs
    changed = load_study(str(tmp_path / "tiny.yaml"))
    changed.spec["base"]["rounds"] = 3
    with pytest.raises(ConfigError, match="other settings"):
        run_study(changed, out)


def test_render_of_an_interrupted_study_reads_its_finished_runs(tiny, tmp_path):
    """Without results.json.gz (a study stopped before its end), ``--render`` reports the chosen studies' runs that
    finished in runs/ (of the study's settings) and names the cells it lacks; with none finished it refuses."""
    import shutil

    out = str(tmp_path / "out")
    full = run_study(tiny, out, only=["main"])
    os.remove(os.path.join(out, "results.json.gz"))
    root = os.path.join(out, "runs")
    shutil.rmtree(os.path.join(root, "main.Local.iid.s1"))  # interrupted before Local's seed 1
    lost = next(c for c in full.cells if c.labels["method"] == "Local").key(1)
    results = results_from_file(tiny, out, ["main"])
    assert set(results.runs) == set(full.runs) - {lost} and results.meta["computed"] == 3
    np.testing.assert_array_equal(results.final("main", "personal_acc", method="FedAvg", split="iid"),
                                  full.final("main", "personal_acc", method="FedAvg", split="iid"))
    report = render_report(results)
    assert "**Not run**: 1 run of 1 cell" in report and "Runs: 4 (3 finished, read from the run directories" in report
    render_study(results, out)  # its results.json.gz, then the rest run: the earlier invocations' time stays unknown
    finished = run_study(tiny, out, only=["main"])
    assert finished.meta["computed"] == 1 and finished.meta["wall_seconds"] is None and "Not run" not in open(
        os.path.join(out, "README.md")).read()
    os.remove(os.path.join(out, "results.json.gz"))
    config = os.path.join(root, "main.FedAvg.iid.s0", "config.yaml")  # a run of other settings is not the cell's
    files.write_text(config, open(config).read().replace("rounds: 2", "rounds: 3"))
    assert len(results_from_file(tiny, out, ["main"]).runs) == 3
    shutil.rmtree(root)
    with pytest.raises(ConfigError, match="holds no finished run of main; run the study first"):
        results_from_file(tiny, out, ["main"])


def test_final_plot_against_a_measured_x_with_a_reference_level(tiny):
    """``x_value``: x is a measured metric's mean over seeds (accuracy against ε or MB sent), with its std as the
    horizontal error bar; ``reference``: another cell's mean final value as a dashed level."""
    from fljax.runner.study import StudyResults
    from fljax.runner.tables import _plot

    cells = tiny.cells(["lr", "main"])
    runs = {c.key(s): {"summary": {}, "history": [{"round": 2, "personal_acc": 0.5 + c.config["algo"]["lr"] + 0.01 * s,
                                                   "bytes_up": 1e6 * (1 + c.config["algo"]["lr"] + s)}]}
            for c in cells for s in c.seeds}
    spec = {"file": "x.png", "study": "lr", "kind": "final", "x": "algo.lr", "x_value": "bytes_up / 1e6",
            "value": "personal_acc", "lines": ["method"], "logx": True,
            "reference": {"study": "main", "where": {"method": "FedAvg"}, "label": "ref"}}
    ax = _plot(StudyResults(tiny, cells, runs, {}), spec).axes[0]
    data = ax.containers[0][0]  # the errorbar's data line; seeds 0 and 1
    np.testing.assert_allclose(np.asarray(data.get_xdata(), float), [1.6, 1.8])
    np.testing.assert_allclose(np.asarray(data.get_ydata(), float), [0.605, 0.805])
    np.testing.assert_allclose(ax.containers[0][2][0].get_segments()[0][:, 0], [1.6 - 0.5 ** 0.5, 1.6 + 0.5 ** 0.5])
    assert [line.get_ydata()[0] for line in ax.lines if line.get_label() == "ref"] == pytest.approx([0.605])
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "bytes_up / 1e6"
    del spec["x"]  # without x: one point per line (its cell picked by `where`)
    spec["where"] = {"algo.lr": 0.3}
    data = _plot(StudyResults(tiny, cells, runs, {}), spec).axes[0].containers[0][0]
    np.testing.assert_allclose(np.asarray(data.get_xdata(), float), [1.8])
    np.testing.assert_allclose(np.asarray(data.get_ydata(), float), [0.805])


def test_a_tables_where_picks_the_cells_of_an_axis_it_does_not_show(tiny):
    """A table's ``where: {algo.lr: 0.3}`` on a grid axis that is neither its rows nor its columns reads the cells at
    that value (the robust report's 20 % table once read the first fraction's cells, 10 %)."""
    from fljax.runner.study import StudyResults
    from fljax.runner.tables import table

    cells = tiny.cells(["lr"])
    runs = {c.key(s): {"summary": {}, "history": [{"round": 2, "personal_acc": c.config["algo"]["lr"] + 0.01 * s}]}
            for c in cells for s in c.seeds}
    results = StudyResults(tiny, cells, runs, {})
    for lr in (0.1, 0.3):
        text = table(results, {"study": "lr", "where": {"algo.lr": lr}, "rows": "method",
                               "columns": [{"title": "acc", "value": "personal_acc"}]})
        assert f"{100 * lr + 0.5:.2f} ± 0.71" in text, text  # seeds 0 and 1: mean lr + 0.005, std 0.01/√2


def test_curves_of_several_studies_in_one_figure(tiny):
    """``study: [a, b]``: the lines of every study listed, in one figure (``where`` picks the cells of each)."""
    from fljax.runner.study import StudyResults
    from fljax.runner.tables import _plot

    cells = tiny.cells(["main", "lr"])
    runs = {c.key(s): {"summary": {}, "history": [
        {"round": r, "personal_acc": r + c.config["algo"]["lr"] + (c.config["algorithm"] == "local")}
        for r in range(3)]} for c in cells for s in c.seeds}
    spec = {"file": "x.png", "study": ["main", "lr"], "where": {"split": "iid"}, "kind": "curves",
            "value": "personal_acc", "lines": ["method"], "panels": "algo.lr"}
    results = StudyResults(tiny, cells, runs, {})
    fig = _plot(results, spec)  # 'main' has no algo.lr axis: the panels are lr's grid, each with lr's line
    panels = [ax for ax in fig.axes if ax.lines]
    assert [[line.get_ydata()[0] for line in ax.lines] for ax in panels] == [[0.1], [0.3]]
    del spec["panels"]
    lines = _plot(results, spec).axes[0].lines  # main's two methods, then lr's FedAvg (its first cell)
    assert [line.get_label() for line in lines] == ["FedAvg", "Local", "FedAvg"]
    assert [line.get_ydata()[0] for line in lines] == [0.1, 1.1, 0.1]


def test_study_figures_share_a_metric_s_range_name_numeric_lines_and_label_axes_readably(tiny):
    """The panels of one metric (``panels``) share one y range covering every panel's data; a line of a numeric
    value names its key (``lr = 0.1``, or the plot's ``symbols``); rounds are ticked in whole numbers; a log axis
    over less than a decade labels at least three values."""
    from fljax.runner.study import StudyResults
    from fljax.runner.tables import _plot

    cells = tiny.cells(["rules", "lr"])
    runs = {c.key(s): {"summary": {}, "history": [
        {"round": r, "personal_acc": (0.1 if c.labels.get("split") == "iid" else 0.6) + 0.1 * r + 0.01 * s,
         "bytes_up": 1e6 * (1 + c.config["algo"]["lr"] + 0.1 * s)} for r in range(3)]}
            for c in cells for s in c.seeds}
    results = StudyResults(tiny, cells, runs, {})
    for kind in ("curves", "final"):  # lines with bands; points with error bars against a measured x
        fig = _plot(results, {"file": "x.png", "study": "rules", "kind": kind, "value": "personal_acc",
                              "lines": ["method"], "panels": "split", "x_value": "bytes_up / 1e6",
                              "logx": kind == "final"})
        panels = [ax for ax in fig.axes if ax.lines]
        fig.draw_without_rendering()
        assert len(panels) == 2 and panels[0].get_ylim() == panels[1].get_ylim()
        lo, hi = panels[0].get_ylim()
        low = 0.1 if kind == "curves" else 0.3  # the iid panel's lowest point (final: round 2), the dir's highest
        assert lo <= low and hi >= 0.6 + 0.2 + 0.01, (kind, lo, hi)
        for ax in panels if kind == "curves" else ():
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks == [0, 1, 2], ticks
    lines = [line.get_label() for line in _plot(results, {"file": "x.png", "study": "lr", "kind": "curves",
                                                          "value": "personal_acc", "lines": ["algo.lr"]}).axes[0].lines]
    assert lines == ["lr = 0.1", "lr = 0.3"]
    named = _plot(results, {"file": "x.png", "study": "lr", "kind": "curves", "value": "personal_acc",
                            "lines": ["algo.lr"], "symbols": {"algo.lr": "η"}}).axes[0].lines
    assert [line.get_label() for line in named] == ["η = 0.1", "η = 0.3"]
    ax = _plot(results, {"file": "x.png", "study": "lr", "kind": "final", "x": "algo.lr", "x_value": "bytes_up / 1e6",
                         "value": "personal_acc", "lines": ["method"], "logx": True}).axes[0]
    ax.figure.draw_without_rendering()
    lo, hi = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert hi / lo < 10 and len(labels) >= 3, labels


def test_a_saved_config_without_a_section_added_since_is_the_same_settings():
    """A run directory written before a config section or option existed (at its default) is reused; a changed
    value, or a key that no longer parses, is not."""
    from fljax.config import ExperimentConfig, from_dict, to_dict
    from fljax.experiment import resolve
    from fljax.runner.study_run import _same_settings

    cfg = resolve(from_dict(ExperimentConfig, {"algorithm": "fedavg", "rounds": 3})).config
    saved = to_dict(cfg)
    older = {k: v for k, v in saved.items() if k != "server"}
    assert _same_settings(older, cfg) and _same_settings(saved, cfg)
    assert not _same_settings({**older, "rounds": 4}, cfg)
    assert not _same_settings({**older, "roundz": 3}, cfg)


def test_one_mean_std_convention_in_every_table():
    """Study reports, sweep and comparison tables and summary.json: mean ± the sample standard deviation (ddof 1)."""
    from fljax.runner.report import mean_std, sample_std
    from fljax.runner.results import aggregate_summaries

    values = [0.8, 0.9]
    assert value_text(np.array(values)) == mean_std(values, 2, scale=100) == "85.00 ± 7.07"
    assert mean_std(values) == "0.8500 ± 0.0707" and mean_std([0.8]) == "0.8000" and float(sample_std([0.8])) == 0
    summaries = [{"name": "a", "algorithm": "fedavg", "dataset": "digits", "seed": s, "status": "completed",
                  "rounds": 1, "final": {"round": 1, "personal_acc": v}, "client_steps_per_second": 1.0,
                  "run_seconds": 1.0} for s, v in enumerate(values)]
    assert aggregate_summaries(summaries, False)["final"]["personal_acc"]["std"] == pytest.approx(0.0707107, 1e-5)
    assert value_text(np.array([0.8, np.nan])) == "80.00"  # a missing metric is left out of a report cell


def test_metric_expressions_are_arithmetic_only():
    record = {"a": 2.0, "b": 4.0, "rank/Dense_0/kernel": 3.0}
    assert evaluate("a", record) == 2.0 and evaluate("(a + b) / 2", record) == 3.0
    assert evaluate("rank/Dense_0/kernel", record) == 3.0 and np.isnan(evaluate("missing", record))
    assert evaluate("max(a, b) ** 2 - abs(-1)", record) == 15.0
    with pytest.raises(ConfigError, match="only metric names"):
        evaluate("__import__('os').system('true')", record)


@pytest.mark.parametrize("name", study_names())
def test_every_shipped_study_cell_is_a_valid_config(name):
    study = load_study(name)
    cells = study.cells()
    assert cells and _experiments(cells)
    for table in study.spec.get("tables", []):
        assert table["study"] in study.studies
    for plot in study.spec.get("plots", []):
        assert set(plot["study"] if isinstance(plot["study"], list) else [plot["study"]]) <= set(study.studies)


def test_reproduce_cli(tmp_path, capsys, monkeypatch):
    """Issue 41 item 0: without --out, `fljax reproduce` writes a new directory under runs/ as `fljax run` does;
    the committed report (the study file's out, benchmarks/results/NAME) is written only with --update-report, and
    --render names the report it rebuilds."""
    monkeypatch.chdir(tmp_path)
    quick = ["reproduce", "dfedalt", "--only", "more_seeds", "--seeds", "1", "--rounds", "2", "--quiet"]
    assert main(quick) == 0
    assert "Claim 1 with 10 seeds" in capsys.readouterr().out
    made = os.listdir("runs")
    assert len(made) == 1 and made[0].startswith("reproduce-dfedalt-") and not os.path.exists("benchmarks")
    out = os.path.join("runs", made[0])
    assert files.read_json(os.path.join(out, "results.json.gz"))["meta"]["runs"] == 4
    assert main(["reproduce", "dfedalt", "--render", "--out", out, "--quiet"]) == 0
    assert main(["reproduce", "dfedalt", "--render", "--quiet"]) == 2
    assert "--render rebuilds a report where it is: give --out DIR" in capsys.readouterr().err
    assert main(quick + ["--update-report", "--out", "d"]) == 2 and not os.path.exists("d")
    assert main(quick + ["--update-report"]) == 0 and os.listdir("runs") == made
    committed = os.path.join("benchmarks", "results", "dfedalt")
    assert files.read_json(os.path.join(committed, "results.json.gz"))["meta"]["computed"] == 4
    assert main(["reproduce", "dfedlat"]) == 2
    assert "Did you mean 'dfedalt'" in capsys.readouterr().err


def test_a_report_is_not_replaced_by_a_smaller_one_unless_asked(tiny, tmp_path, capsys):
    """Issue 41 item 0: `fljax reproduce fedgia --only smoke` into the committed Table IV report replaced its 804
    runs by the smoke set's. A study written into a folder whose results.json.gz records runs that the new report
    would not hold is refused, naming them, before anything is written; --fresh replaces it, saying so."""
    out = str(tmp_path / "out")
    run_study(tiny, out, only=["main"], seeds=1)  # FedAvg and Local; lr's 0.1 point is main's FedAvg run
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)}
    with pytest.raises(ConfigError, match=r"its report records 1 run of main that this invocation \(--only lr "
                                          r"--seeds 1\) would drop from it"):
        run_study(tiny, out, only=["lr"], seeds=1)
    assert {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)} == before
    from fljax.runner.report import Output

    replaced = run_study(tiny, out, only=["lr"], seeds=1, fresh=True, output=Output("bar"))
    assert set(files.read_json(os.path.join(out, "results.json.gz"))["runs"]) == set(replaced.runs)
    assert "--fresh: the report in" in capsys.readouterr().err
    # the probe's case: the smoke set over a copy of the committed FedGiA report
    committed = os.path.join(ROOT, "benchmarks", "results", "fedgia", "results.json.gz")
    recorded = files.read_json(committed)
    os.makedirs(tmp_path / "fedgia")
    import shutil

    shutil.copy(committed, tmp_path / "fedgia")
    assert main(["reproduce", "fedgia", "--only", "smoke", "--out", str(tmp_path / "fedgia")]) == 2
    studies = sorted({c["study"] for c in recorded["cells"]} - {"smoke"})
    assert (f"its report records {len(recorded['runs']):,} runs of {', '.join(studies)} that this invocation "
            f"(--only smoke) would drop") in capsys.readouterr().err
    assert os.listdir(tmp_path / "fedgia") == ["results.json.gz"]


def test_lanes_default_comes_from_the_study_file(tiny, tmp_path, monkeypatch):
    import fljax.runner.study_run as study_module

    seen = set()
    monkeypatch.setattr(study_module, "_run_some", lambda root, items, lanes, progress: seen.add(lanes) or 0.0)

    def lanes_used(out, **kw):
        seen.clear()
        run_study(tiny, str(tmp_path / out), only=["lr"], seeds=1, rounds=1, **kw)
        return seen.copy()

    assert lanes_used("a") == {"vmap"}
    tiny.spec["lanes"] = "map"
    assert lanes_used("b") == {"map"}
    assert lanes_used("c", lanes="vmap") == {"vmap"}   # the command line wins
    assert load_study("dfedalt").spec["lanes"] == "map"  # its committed tables were made run by run


def test_parallel_jobs_replace_their_workers_and_match_one_job(tiny, tmp_path, monkeypatch):
    """--jobs runs the families in worker processes, a fresh pool every jobs × TASKS_PER_WORKER families (patched
    to 1 here, so the 4 families of the 'lr' and 'rules' studies take 2 pools of 2 workers); the results are those
    of one job. (A ProcessPoolExecutor with max_tasks_per_child hung here once a worker retired.)"""
    import fljax.runner.study_run as S

    monkeypatch.setattr(S, "TASKS_PER_WORKER", 1)
    serial = run_study(tiny, str(tmp_path / "one"), only=["lr", "rules"])
    parallel = run_study(tiny, str(tmp_path / "two"), only=["lr", "rules"], jobs=2)
    assert parallel.meta["computed"] == serial.meta["computed"] == 8
    for study, labels in (("lr", {"algo.lr": 0.3}), ("rules", {"split": "dir"})):
        np.testing.assert_array_equal(parallel.final(study, "personal_acc", **labels),
                                      serial.final(study, "personal_acc", **labels))


def test_grid_lanes_run_a_study_s_grid_points_as_lanes_of_one_program(tiny, tmp_path, monkeypatch):
    """The 'lr' study's two points × two seeds are one program of four lanes, with grid_lanes: true and, with
    --jobs 1, without it too: a study of one float width is one call of the run layer (one schedule), which groups
    runs differing only in traced values (algo.lr) into one program. The results agree to float tolerance."""
    import fljax.runner.schedule as schedule_module
    import fljax.runner.study_run as study_module

    calls, programs = [], []
    real, execute = study_module._run_some, schedule_module.execute
    monkeypatch.setattr(study_module, "_run_some", lambda root, items, *a: calls.append(len(items)) or
                        real(root, items, *a))
    monkeypatch.setattr(schedule_module, "execute", lambda program, *a: programs.append(len(program.runs)) or
                        execute(program, *a))
    apart = run_study(tiny, str(tmp_path / "apart"), only=["lr"])
    assert calls == [4] and programs == [4]
    calls.clear(), programs.clear()
    tiny.spec["grid_lanes"] = True
    together = run_study(tiny, str(tmp_path / "together"), only=["lr"])
    assert calls == [4] and programs == [4]
    for lr in (0.1, 0.3):
        np.testing.assert_allclose(together.final("lr", "personal_acc", **{"algo.lr": lr}),
                                   apart.final("lr", "personal_acc", **{"algo.lr": lr}), atol=1e-6)


def test_a_heatmap_plot_shows_each_cell_s_mean_final_value(tiny, tmp_path):
    """kind: heatmap draws the final value's mean over seeds of every (rows, columns) combination (× scale)."""
    from fljax.runner.tables import _plot

    results = run_study(tiny, str(tmp_path / "h"), only=["rules"])
    fig = _plot(results, {"study": "rules", "kind": "heatmap", "rows": "method", "columns": "split",
                          "value": "personal_acc", "scale": 100})
    image = fig.axes[0].images[0].get_array()
    want = [[100 * results.final("rules", "personal_acc", method="Local", split=s).mean() for s in ("iid", "dir")]]
    np.testing.assert_allclose(np.asarray(image), want, rtol=1e-6)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["iid", "dir"]
