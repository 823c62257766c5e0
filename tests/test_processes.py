"""One simulation over several processes (jax.distributed, Gloo on CPU): ``fljax run --processes 2`` gives the
metrics of one process, process 0 alone writes; bad process settings are one-line errors."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import yaml

import fljax
from fljax.cli import main
from fljax.engine import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = {"algorithm": "ditto", "data": {"dataset": "synthetic", "num_clients": 6, "max_samples": 40},
        "model": {"name": "logreg"}, "algo": {"cohort_size": 3, "local_steps": 2, "batch_size": 10},
        "rounds": 3, "eval_every": 1}


def _metrics(directory) -> list[dict]:
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("eval_clients", [None, 5])  # 5: a fixed evaluation sample, sharded with a padded slot
def test_two_processes_give_the_metrics_of_one(tmp_path, eval_clients):
    tiny = {**TINY, "eval_clients": eval_clients}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny))
    env = {**os.environ, "FLJAX_COMPILE_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "fljax.cli", "run", str(config), "--processes", "2", "--quiet",
                           "--out", str(tmp_path / "two")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("| ditto ") == 1  # process 1 prints nothing
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["executor"] == "sharded(2 devices)" and summary["environment"]["device_count"] == 2
    assert summary["eval_clients"] == (eval_clients or 6)
    one = fljax.run(tiny, executor="sharded", out=str(tmp_path / "one"), progress=False)
    assert one.runs[0].progress.summary["executor"] == "sharded(1 devices)"
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [r["round"] for r in a] == [r["round"] for r in b] == [0, 1, 2, 3]
    for x, y in zip(a, b):
        for k in x:
            if k != "run_seconds":
                np.testing.assert_allclose(y[k], x[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("argv, env, message", [
    (["--processes", "0"], {}, "--processes must be >= 1, got 0."),
    (["--processes", "2", "--resume", "--out", "x"], {}, "--resume continues a run in one process"),
    ([], {"FLJAX_NUM_PROCESSES": "2"}, "FLJAX_COORDINATOR must be set together with FLJAX_NUM_PROCESSES"),
    ([], {"FLJAX_COORDINATOR": "localhost", "FLJAX_NUM_PROCESSES": "2", "FLJAX_PROCESS_ID": "0"},
     "coordinator must be host:port, got 'localhost'"),
    ([], {"FLJAX_COORDINATOR": "h:1", "FLJAX_NUM_PROCESSES": "2", "FLJAX_PROCESS_ID": "2"},
     "process_id must be in [0, 2), got 2"),
    ([], {"FLJAX_COORDINATOR": "h:1", "FLJAX_NUM_PROCESSES": "two", "FLJAX_PROCESS_ID": "0"},
     "FLJAX_NUM_PROCESSES must be a non-negative integer, got 'two'"),
])
def test_bad_process_settings_are_one_line_errors(argv, env, message, monkeypatch, capsys):
    for name in processes.ENV.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["run", "--algorithm", "fedavg", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fljax: error: ") and message in err and err.count("\n") == 1


def test_one_process_programs_keep_their_default_shardings():
    assert processes.program_shardings() == {} and processes.is_lead() and processes.lead_only("d") == "d"
