"""The run layer: result files, atomic writes, resume equivalence, the NaN/Inf guard, seed sweeps, compare."""
import json
import os

import jax
import numpy as np
import pytest

import fljax.data as D
from fljax.cli import main
from fljax.engine import Lanes
from fljax.engine.loop import block_schedule
from fljax.engine.lanes import stack_data
from fljax.runner import files
from fljax.runner.checkpoint import Checkpointer, CheckpointTimer
from fljax.experiment import default_model

# A tiny experiment: 8 synthetic clients, logistic regression, 4 clients per round.
TINY = ["--dataset", "synthetic", "--set", "data.num_clients=8", "--set", "data.max_samples=40", "--set", "algo.cohort_size=4",
        "--set", "algo.local_steps=2", "--set", "algo.batch_size=10", "--set", "model.name=logreg"]


def _metrics(run_dir) -> list[dict]:
    return files.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def _without_time(records):
    return [{k: v for k, v in r.items() if k != "run_seconds"} for r in records]


def _final_params(run_dir):
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as c:
        state, log = c.restore()
    return state, log


# ------------------------------------------------------------------------------------------------ files


def test_atomic_writes_keep_the_old_file_on_failure(tmp_path, monkeypatch):
    path = str(tmp_path / "summary.json")
    files.write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        files.write_json(path, {"a": object()})  # fails while serialising
    assert files.read_json(path) == {"a": 1}

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)  # fails after the temporary file was written
    with pytest.raises(OSError):
        files.write_jsonl(path, [{"a": 2}] * 1000)
    monkeypatch.undo()
    assert files.read_json(path) == {"a": 1}
    assert os.listdir(tmp_path) == ["summary.json"]  # no temporary file left behind


def test_block_schedule_ends_at_evaluations_and_checkpoints():
    assert list(block_schedule(0, 6, 3, 2)) == [(2, False, True), (1, True, False), (1, False, True),
                                                (2, True, True)]
    assert list(block_schedule(4, 6, 3, 2)) == [(2, True, True)]  # resumed at 4: the same last block
    assert list(block_schedule(0, 5, 2)) == [(2, True, False), (2, True, False), (1, True, True)]


def test_checkpoint_timer_is_due_once_a_period_and_the_same_for_every_seed():
    now = [0.0]
    timer = CheckpointTimer(60, clock=lambda: now[0])
    now[0] = 30
    assert not timer.due(10) and not timer.due(10)
    now[0] = 61
    assert timer.due(20) and timer.due(20)  # the other seeds of round 20 get the same answer
    now[0] = 100
    assert not timer.due(30)  # 39 s since the last checkpoint
    now[0] = 122
    assert timer.due(40)


# ------------------------------------------------------------------------------------------------ a run


def test_run_directory_layout_and_json_log(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--set", "rounds=4", "--set", "eval_every=2", "--out", str(out), "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # stdout: JSON only
    assert [e["event"] for e in events] == ["eval", "eval", "eval", "summary"]  # round 0: the initial model
    assert [e["round"] for e in events[:3]] == [0, 2, 4]
    plots = [f"{name}.{fmt}" for name in ("accuracy_vs_bytes", "accuracy_vs_round", "client_accuracy", "metrics",
                                          "partition") for fmt in ("pdf", "png")]  # metrics: the train loss
    assert sorted(os.listdir(out)) == sorted([*plots, "checkpoints", "config.yaml", "directory.json",
                                              "metrics.jsonl", "resolved.yaml", "summary.json"])
    records = _metrics(out)
    assert [r["round"] for r in records] == [0, 2, 4]
    for key in ("personal_acc", "personal_loss", "global_acc", "global_loss", "train_loss", "bytes_up",
                "bytes_down", "run_seconds"):
        assert key in records[1]
    assert "train_loss" not in records[0] and records[0]["bytes_up"] == 0  # the initial model: nothing trained yet
    assert records[2]["bytes_up"] == 2 * records[1]["bytes_up"] > 0  # cumulative
    summary = files.read_json(out / "summary.json")
    assert summary["status"] == "completed" and summary["rounds"] == 4
    assert summary["final"] == records[-1]
    assert summary["best"]["personal_acc"]["value"] == max(r["personal_acc"] for r in records)
    for key in ("run_seconds", "compile_seconds", "wall_seconds", "client_steps_per_second"):
        assert summary[key] > 0
    parts = ("setup_seconds", "compile_seconds", "run_seconds", "other_seconds")
    assert summary["wall_seconds"] == pytest.approx(sum(summary[k] for k in parts))
    assert open(out / "accuracy_vs_round.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(out / "checkpoints") == ["4"]  # default policy: a short run is checkpointed at its end
    before = sorted(os.listdir(out))
    assert "already holds results" in _one_error(capsys, ["run", *TINY, "--out", str(out)])
    assert sorted(os.listdir(out)) == before  # the refusal left no lock file behind


def _one_error(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip()


def test_resume_after_a_kill_is_bit_identical(tmp_path, monkeypatch, capsys):
    """6 rounds, evaluations every 3, checkpoints every 2; the run is killed right after the checkpoint of round 4
    and resumed: metrics.jsonl and the final state equal an uninterrupted run's bit for bit."""
    args = [*TINY, "--set", "rounds=6", "--set", "eval_every=3", "--checkpoint-every", "2", "--quiet"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(["run", *args, "--out", full]) == 0

    save = Checkpointer.save

    def save_then_die(self, state, log):
        save(self, state, log)
        if int(state.round) == 4:
            raise KeyboardInterrupt  # as if the process were killed here

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    assert main(["run", *args, "--out", cut]) == 130
    monkeypatch.undo()
    assert [r["round"] for r in _metrics(cut)] == [0, 3]
    assert not os.path.exists(os.path.join(cut, "summary.json"))

    assert main(["run", "--resume", "--out", cut, "--quiet"]) == 0
    assert [r["round"] for r in _metrics(cut)] == [0, 3, 6]  # no duplicate, no missing line
    assert _without_time(_metrics(cut)) == _without_time(_metrics(full))
    (state_full, log_full), (state_cut, log_cut) = _final_params(full), _final_params(cut)
    leaves_full, leaves_cut = jax.tree.leaves(state_full), jax.tree.leaves(state_cut)
    assert len(leaves_full) == len(leaves_cut) > 0
    for a, b in zip(leaves_full, leaves_cut):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (log_cut.bytes_up, log_cut.bytes_down) == (log_full.bytes_up, log_full.bytes_down)

    capsys.readouterr()
    assert main(["run", "--resume", "--out", cut]) == 0  # finished: nothing runs, and it says so
    assert f"nothing to run: every run in {cut} had completed" in capsys.readouterr().err
    assert [r["round"] for r in _metrics(cut)] == [0, 3, 6]

    # a finished run can be extended: the config is the run directory's own, plus --set
    assert main(["run", "--resume", "--out", cut, "--set", "rounds=9", "--quiet"]) == 0
    assert [r["round"] for r in _metrics(cut)] == [0, 3, 6, 9]


def test_nonfinite_round_stops_with_round_and_metric(tmp_path, capsys):
    out = str(tmp_path / "nan")
    argv = ["run", *TINY, "--set", "model.name=mlp", "--set", "model.options.hidden=[16]", "--set", "algo.lr=50",
            "--set", "diverge_factor=null",
            "--set", "algo.local_steps=5", "--set", "rounds=20", "--set", "eval_every=2", "--checkpoint-every", "2",
            "--out", out, "--quiet"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    import re

    m = re.match(r"fljax: error: round (\d+) produced NaN/Inf in (train_loss=\S+|the evaluation \(\w+_loss=)", err)
    assert m, err
    bad = int(m.group(1))
    assert 2 < bad < 20
    assert "lower the learning rate (algo.lr) or check the other hyperparameters and the data." in err
    last_good = (bad - 1) // 2 * 2
    assert err.endswith(f"Kept in {out}: metrics.jsonl up to round {last_good} and the last good checkpoint (round "
                        f"{last_good}).")
    assert [r["round"] for r in _metrics(out)] == list(range(0, last_good + 1, 2))
    with Checkpointer(os.path.join(out, "checkpoints")) as c:
        assert c.latest_round() == last_good
        state, _ = c.restore()
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state) if np.issubdtype(x.dtype, np.floating))
    summary = files.read_json(os.path.join(out, "summary.json"))
    assert summary["status"] == "stopped" and f"round {bad} produced NaN/Inf" in summary["message"]


# ------------------------------------------------------------------------------------------------ seeds


def test_vectorised_sweep_equals_separate_runs_and_resumes(tmp_path, monkeypatch):
    """--seeds 3 with a fixed data seed runs as one vmapped program; each seed matches its own separate run, and
    the sweep killed after its round-2 checkpoint and resumed matches the uninterrupted sweep bit for bit."""
    common = [*TINY, "--set", "data.seed=0", "--set", "rounds=4", "--set", "eval_every=2", "--quiet"]
    sweep = tmp_path / "sweep"
    assert main(["run", *common, "--seeds", "3", "--out", str(sweep)]) == 0
    top = files.read_json(sweep / "summary.json")
    assert top["vectorised"] is True and top["seeds"] == [0, 1, 2]
    for seed in (0, 1, 2):
        one = tmp_path / f"seed{seed}"
        assert main(["run", *common, "--set", f"seed={seed}", "--out", str(one)]) == 0
        a, b = _metrics(one), _metrics(sweep / f"seed_{seed}")
        assert [r["round"] for r in a] == [r["round"] for r in b] == [0, 2, 4]
        for ra, rb in zip(a, b):
            for key in ra:
                if key != "run_seconds":
                    np.testing.assert_allclose(rb[key], ra[key], rtol=1e-5, atol=1e-6, err_msg=key)
    values = top["final"]["personal_acc"]["values"]
    assert top["final"]["personal_acc"]["mean"] == pytest.approx(np.mean(values))
    assert top["final"]["personal_acc"]["std"] == pytest.approx(np.std(values, ddof=1))
    assert len(set(values)) > 1  # the seeds differ

    save = Checkpointer.save

    def save_then_die(self, state, log):
        save(self, state, log)
        if int(state.round) == 2 and self.directory.endswith("seed_2/checkpoints"):
            raise KeyboardInterrupt

    cut = tmp_path / "cut"
    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    assert main(["run", *common, "--seeds", "3", "--checkpoint-every", "2", "--out", str(cut)]) == 130
    monkeypatch.undo()
    assert main(["run", "--resume", "--out", str(cut), "--quiet"]) == 0
    assert files.read_json(cut / "summary.json")["vectorised"] is True
    for seed in (0, 1, 2):
        assert _without_time(_metrics(cut / f"seed_{seed}")) == _without_time(_metrics(sweep / f"seed_{seed}"))


def test_seeds_with_their_own_data_run_one_after_another(tmp_path):
    """data.seed follows the run seed and natural client sizes differ per seed: the sweep runs sequentially, and
    each seed is exactly the separate run."""
    common = [*TINY, "--set", "rounds=2", "--set", "eval_every=2", "--quiet"]
    assert main(["run", *common, "--seeds", "2", "--set", "seed=5", "--out", str(tmp_path / "sweep")]) == 0
    top = files.read_json(tmp_path / "sweep" / "summary.json")
    assert top["vectorised"] is False and top["seeds"] == [5, 6]
    assert main(["run", *common, "--set", "seed=6", "--out", str(tmp_path / "one")]) == 0
    assert _without_time(_metrics(tmp_path / "sweep" / "seed_6")) == _without_time(_metrics(tmp_path / "one"))


def test_seed_batch_refuses_data_of_different_shapes():
    iid = [D.make_federated("digits", 10, "iid", seed=s) for s in (0, 1)]
    assert stack_data(iid) is not None  # equal client sizes whatever the seed: stackable
    skewed = [D.make_federated("digits", 10, "dirichlet", seed=s, alpha=0.3) for s in (0, 1)]
    assert stack_data(skewed) is None
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation

    sim = Simulation(make_algorithm("fedavg", cohort_size=2), skewed[0], default_model(skewed[0]), executor="vmap")
    with pytest.raises(ValueError, match="cannot run as one program"):
        Lanes(sim, [0, 1], skewed)


# ------------------------------------------------------------------------------------------------ compare


def test_compare_writes_table_plot_and_runs(tmp_path, capsys):
    out = tmp_path / "cmp"
    digits = ["--set", "data.num_clients=8", *TINY[6:]]  # the quick-start data is digits: max_samples is synthetic's
    argv = ["compare", *digits, "--set", "model.options={}", "--set", "data.seed=0", "--set", "rounds=4", "--set", "eval_every=2",
            "--algorithms", "fedavg,local", "--seeds", "2", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip()
    table = [line for line in printed.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    assert header[:2] == ["algorithm", "personal acc"] and "p10 client" in header and "global acc" in header
    assert "seeds" not in header and any(line.startswith("[") and "] every row: 2 seeds" in line
                                         for line in printed.splitlines())  # the same in every row: a note
    assert [row.split("|")[1].strip() for row in table[2:]] == ["fedavg", "local"]
    assert all(" ± " in row.split("|")[2] for row in table[2:])  # mean ± std over the 2 seeds
    assert sorted(os.listdir(out)) == ["compare.md", "compare.pdf", "compare.png", "compare_metrics.pdf",
                                       "compare_metrics.png", "config.yaml", "directory.json", "fedavg", "local",
                                       "summary.json"]
    assert printed in (out / "compare.md").read_text()
    plots = [f"{name}.png" for name in ("accuracy_vs_bytes", "accuracy_vs_round", "client_accuracy", "metrics",
                                        "partition")]
    # a comparison's runs plot as PNG only; its own figures also as PDF
    assert sorted(os.listdir(out / "fedavg")) == sorted([*plots, "config.yaml", "directory.json", "resolved.yaml",
                                                          "seed_0", "seed_1", "summary.json"])
    assert "accuracy_vs_bytes.png" not in os.listdir(out / "local")  # Local communicates nothing
    summary = files.read_json(out / "summary.json")
    assert summary["status"] == "completed" and set(summary["results"]) == {"fedavg", "local"}
    # the local baseline communicates nothing; fedavg does
    assert summary["results"]["local"]["final"]["bytes_up"]["mean"] == 0
    assert summary["results"]["fedavg"]["final"]["bytes_up"]["mean"] > 0


def test_a_comparison_table_has_only_columns_that_say_something_and_notes_on_untuned_rows():
    """distinct_table: the weighted column goes when it repeats the unweighted one (a note says why), columns
    equal in every row become a note, a row equal to an earlier one says so, and a hint shows under a row that
    lags the best by LAG or more or repeats another row, not under one that does well."""
    from fljax.runner.report import distinct_table

    def row(name, acc, weighted=None):
        return {"algorithm": name, "seeds": 1, "personal acc": acc, "weighted": weighted or acc, "p10 client": acc,
                "global acc": acc}

    hints = {"fedprox": "fedprox: try mu", "perfedavg": "perfedavg: try beta", "ditto": "ditto: never shown"}
    text = distinct_table([row("fedavg", "0.9400"), row("fedprox", "0.9400"), row("perfedavg", "0.1850"),
                           row("ditto", "0.9500")], hints)
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["algorithm", "personal acc", "p10 client",
                                                               "global acc"]
    names = [line.split("|")[1].strip() for line in lines[2:6]]
    assert names == ["fedavg", "fedprox [3,4]", "perfedavg [5]", "ditto"]
    notes = lines[7:]
    assert notes[0].startswith("[1] the sample-weighted") and notes[1] == "[2] every row: 1 seed."
    assert notes[2].startswith("[3] fedprox ends with the same accuracies as fedavg")
    assert notes[3:] == ["[4] fedprox: try mu", "[5] perfedavg: try beta"]
    kept = distinct_table([row("fedavg", "0.9400", "0.9300"), row("local", "0.8000")])
    assert "| weighted " in kept.splitlines()[0] and "weighted" not in "".join(kept.splitlines()[4:])
    done = [{**row("fedavg", "0.9400"), "status": "completed"}, {**row("local", "0.8000"), "status": "completed"}]
    text = distinct_table(done)
    assert "status" not in text.splitlines()[0] and text.splitlines()[-1] == "[2] every row: 1 seed, completed."
    done[1]["status"] = "stopped: round 3 diverged"
    assert "| status " in distinct_table(done).splitlines()[0]


def test_json_round_trips_plain_and_gzipped(tmp_path):
    from fljax.runner.files import read_json, write_json

    value = {"runs": {"a": [0.1, 2, None]}, "meta": "x"}
    for name in ("r.json", "r.json.gz"):
        write_json(str(tmp_path / name), value, indent=None)
        assert read_json(str(tmp_path / name)) == value
    assert (tmp_path / "r.json.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip magic: really compressed
    assert sorted(os.listdir(tmp_path)) == ["r.json", "r.json.gz"]  # no temporary file left


def test_progress_bars_of_programs_are_named_apart():
    """A sweep of 4 points × 2 seeds whose seeds draw their own data runs as one program per seed: the two bars
    get different names (the first point, the others counted, and the seed); one seed: the label alone; a study's
    seeds as lanes: each named."""
    from types import SimpleNamespace as Run

    from fljax.runner.execute import bar_name

    points = ["lr=0.05,mu=0", "lr=0.05,mu=0.1", "lr=0.1,mu=0", "lr=0.1,mu=0.1"]
    names = [bar_name([Run(name=p, seed=s, point_seeds=2) for p in points]) for s in (0, 1)]
    assert names == ["lr=0.05,mu=0 +3 more, seed 0", "lr=0.05,mu=0 +3 more, seed 1"]
    assert bar_name([Run(name="fedavg", seed=0, point_seeds=1)]) == "fedavg"
    assert bar_name([Run(name="fedavg", seed=s, point_seeds=3) for s in range(3)]) == "fedavg, 3 seeds"
    assert bar_name([Run(name="fedavg", seed=s, point_seeds=3) for s in (1, 2)]) == "fedavg, seeds 1, 2"
    # a study's runs of one cell: an experiment of one seed each (named by its directory), as lanes of one program
    study = [Run(name=f"dp.z=1.s{s}", seed=s, point_seeds=1) for s in range(3)]
    assert bar_name(study) == "dp.z=1.s0 +2 more, seeds 0, 1, 2"


def test_the_same_result_is_written_as_the_same_bytes(tmp_path):
    """Rendering a report again rewrites no file whose content did not change (issue 40's small things): a gzipped
    JSON's header holds neither the temporary file's name nor a time, a PDF or SVG figure no creation date."""
    import time

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fljax.runner import files

    def written(name: str, write) -> list[bytes]:
        out = []
        for _ in range(2):
            write(str(tmp_path / name))
            out.append((tmp_path / name).read_bytes())
            time.sleep(1.1)  # a header's or a document's time would now differ
        return out

    first, second = written("r.json.gz", lambda p: files.write_json(p, {"runs": [1, 2, 3]}, indent=None))
    assert first == second and files.read_json(str(tmp_path / "r.json.gz")) == {"runs": [1, 2, 3]}
    for fmt in ("pdf", "svg", "png"):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        first, second = written(f"f.{fmt}", lambda p: files.write_figure(p, fig))
        plt.close(fig)
        assert first == second, fmt
