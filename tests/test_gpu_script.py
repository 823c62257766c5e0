"""benchmarks/gpu.sh: its CPU dry run goes through every part at toy sizes; without a GPU the real run refuses."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gpu_sh(*args, env_extra=None):
    env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           **(env_extra or {})}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # about 45 s of CPU time (2 min on the shared 2-core machine)
def test_dry_run_measures_every_part(tmp_path):
    done = _gpu_sh("--dry-run", "--out", str(tmp_path), env_extra={"FLJAX_COMPILE_CACHE": str(tmp_path / "cc")})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_dry_run.json").read_text())
    assert result["meta"]["dry_run"] and result["meta"]["backend"] == "cpu"
    rows = {(r["workload"], r["executor"]): r for r in result["throughput"]}
    assert set(rows) == {("cnn1-28x28-64", "vmap"), ("cnn1-28x28-64", "auto")}
    assert rows[("cnn1-28x28-64", "vmap")]["conv"] == "patches" and all(r["clients"] == 2 for r in rows.values())
    assert all(r["client_steps_per_s"] > 0 for r in rows.values())
    emnist = result["emnist"]
    assert emnist["clients"] == 34 and emnist["spec"]["rounds"] == 3 and emnist["run_wall_seconds"] > 0
    assert abs(emnist["train_samples"] - 3400) <= 34  # sizes rounded per client
    text = (tmp_path / "gpu_dry_run.md").read_text()
    assert "dry run" in text and "FedJAX's EMNIST workload" in text


def test_real_run_refuses_a_cpu_backend():
    done = _gpu_sh()
    assert done.returncode == 2 and "not gpu" in done.stderr
