"""Virtual time in what a run leaves: the records' cumulative ``virtual_time`` (the rounds' durations summed, from 0 at
the initial model), the run directory's metrics and ``load_run``'s frame, the run plot against it, the run table's
column; and the study report's time to a target accuracy and curves against virtual time."""
import os

import numpy as np
import pytest

import fljax
from fljax.engine.loop import RunLog
from fljax.runner.study import StudyResults, load_study
from fljax.runner.tables import _plot, table

CONFIG = {"algorithm": "fedavg", "rounds": 4, "eval_every": 2, "checkpoint_every": 0,
          "data": {"dataset": "digits", "num_clients": 10, "partition": "iid", "test_per_client": 10},
          "model": {"name": "logreg"}, "algo": {"cohort_size": 4, "local_steps": 2, "batch_size": 10},
          "participation": {"name": "uniform", "speed": "synthetic"}}


def test_run_log_sums_round_times_from_zero():
    log = RunLog()
    log.add_initial({"global_acc": 0.1}, 0.0, 0.0)
    log.add_block({"round_time": np.array([1.5, 2.5]), "round_skipped": np.array([0.0, 1.0]),
                   "clients_reported": np.array([4.0, 0.0])}, 0.1, 0.0)
    record = log.add_record(2, {"clients_reported": np.array([4.0, 0.0])}, {"global_acc": 0.2})
    log.add_block({"round_time": np.array([3.0])}, 0.1, 0.0)
    last = log.add_record(3, {}, {"global_acc": 0.3})
    assert log.history[0]["virtual_time"] == 0.0 and log.history[0]["skipped_rounds"] == 0.0
    assert record["virtual_time"] == 4.0 and record["skipped_rounds"] == 1.0 and record["clients_reported"] == 2.0
    assert last["virtual_time"] == 7.0
    assert RunLog.from_json(log.to_json()).totals == log.totals  # a checkpoint carries the clock


def test_a_run_directory_carries_virtual_time(tmp_path):
    out = str(tmp_path / "run")
    result = fljax.run(CONFIG, out=out, progress=False)
    times = [r["virtual_time"] for r in result.history]
    assert times[0] == 0.0 and times[1] > 0 and times[2] > times[1]
    frame = fljax.load_run(out)
    np.testing.assert_allclose(frame["virtual_time"].to_numpy(), times)
    assert os.path.exists(os.path.join(out, "accuracy_vs_virtual_time.png"))
    from fljax.runner.report import summary_row
    import json

    with open(os.path.join(out, "summary.json")) as f:
        row = summary_row("fedavg", [json.load(f)])
    assert row["virtual s"] == f"{times[-1]:.1f}"


STUDY = """
title: time
seeds: 3
base:
  data: {dataset: digits, num_clients: 6}
  rounds: 4
axes:
  method:
    A: {algorithm: fedavg}
    B: {algorithm: fedprox}
studies:
  main:
    cells: {method: all}
tables:
  - title: T
    study: main
    rows: method
    columns:
      - {title: "time to 50%", value: virtual_time, first: {metric: global_acc, at_least: 0.5}, scale: 1, digits: 1}
"""


def test_time_to_a_target_and_curves_against_virtual_time(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    study = load_study(str(path))
    cells = study.cells()
    histories = {  # A reaches 50 % at round 3: 30, 45 and 60 s; B at 21 s in two seeds of three
        "A": [[{"round": r, "global_acc": 0.2 * r, "virtual_time": (10.0 + 5 * s) * r} for r in range(5)]
              for s in range(3)],
        "B": [[{"round": r, "global_acc": (0.2 if s else 0.1) * r, "virtual_time": 7.0 * r} for r in range(5)]
              for s in range(3)]}
    runs = {c.key(s): {"summary": {}, "history": histories[c.labels["method"]][i]}
            for c in cells for i, s in enumerate(c.seeds)}
    results = StudyResults(study, cells, runs, {})
    text = table(results, study.spec["tables"][0])
    assert "| A      | 45.0 ± 15.0" in text
    assert "21.0 ± 0.0 (2 of 3 seeds)" in text
    histories["B"] = [[{"round": r, "global_acc": 0.1, "virtual_time": 7.0 * r} for r in range(5)]] * 3
    runs = {c.key(s): {"summary": {}, "history": histories[c.labels["method"]][i]}
            for c in cells for i, s in enumerate(c.seeds)}
    assert "not reached" in table(StudyResults(study, cells, runs, {}), study.spec["tables"][0])
    fig = _plot(StudyResults(study, cells, runs, {}), {"file": "c.png", "study": "main", "kind": "curves",
                                                        "x": "virtual_time", "value": "global_acc",
                                                        "lines": ["method"]})
    line = fig.axes[0].lines[0]
    np.testing.assert_allclose(line.get_xdata(), 15.0 * np.arange(5))  # the mean clock of A's seeds
    assert fig.axes[0].get_xlabel().startswith("virtual time")
