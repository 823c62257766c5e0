"""benchmarks/gpu.sh: its CPU dry run goes through every part at toy sizes, each in its own process; without a GPU the
real run refuses; fljax imports and runs without tensorflow-datasets (the GPU machine has none)."""
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gpu_sh(*args, env_extra=None):
    env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           **(env_extra or {})}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_dry_run_measures_every_part(tmp_path):
    done = _gpu_sh("--dry-run", "--out", str(tmp_path), env_extra={"FLJAX_COMPILE_CACHE": str(tmp_path / "cc")})
    assert done.returncode == 0, done.stderr[-3000:]
    for part in ("emnist", "cnn", "dense", "resnet", "text"):
        assert f"part {part}: exit 0" in done.stderr
    result = json.loads((tmp_path / "gpu_dry_run.json").read_text())
    assert result["meta"]["dry_run"] and result["meta"]["backend"] == "cpu"
    emnist = result["emnist"]
    assert emnist["clients"] == 34 and emnist["spec"]["rounds"] == 3
    assert [(r["precision"], r["executor"]) for r in emnist["runs"]] == [("tf32", "vmap")]
    assert all(r["run_wall_seconds"] > 0 and 0 <= r["final"]["global_acc"] <= 1 for r in emnist["runs"])
    assert abs(emnist["train_samples"] - 680) <= 34  # sizes rounded per client
    cnn = result["cnn"]
    assert set(cnn["peaks"]) == {"tf32", "fp32", "bf16"} and all(v > 0 for v in cnn["peaks"].values())
    forms = {(r["conv"], r["precision"]) for r in cnn["rows"]}
    assert {("native", "tf32"), ("patches", "tf32"), ("shifts", "tf32")} <= forms
    assert any(p == "bf16" for _, p in forms) and all(r["clients"] == 2 for r in cnn["rows"])
    assert {r["workload"] for r in result["dense"]["rows"]} == {"logreg-synthetic-1k", "mlp-28x28-64"}
    try:
        import torch  # noqa: F401
        assert cnn["peer_torch"] and result["dense"]["peer_torch"]
    except ImportError:
        assert cnn["peer_torch"] == [] and "not installed" in cnn["torch"]
    targets, rows = result["text"]["targets"], result["text"]["rows"]
    assert [(t["workload"], t["full_rounds"]) for t in targets] == [("shakespeare-lstm", 1200),
                                                                    ("stackoverflow-lstm", 1500)]
    assert all(t["local_steps"] == "1 epoch" and t["projected_seconds"] > t["compile_seconds"] for t in targets)
    assert {r["workload"] for r in rows} == {"shakespeare-lstm", "stackoverflow-lstm"}
    text = (tmp_path / "gpu_dry_run.md").read_text()
    assert "dry run" in text and "FedJAX's EMNIST workload" in text and "ResNet-18-GN" in text
    assert "1,200 rounds:" in text and "1,500 rounds:" in text
    assert text.count("Measured on cpu") == 5  # each part stamps its device and its seconds
    assert all(result[p]["measured"]["seconds"] > 0 for p in ("emnist", "cnn", "dense", "resnet", "text"))

    # parts named: only those run again, the others' results are kept
    stamps = {p: result[p]["measured"] for p in ("emnist", "cnn", "dense", "resnet", "text")}
    again = _gpu_sh("--dry-run", "--out", str(tmp_path), "dense",
                    env_extra={"FLJAX_COMPILE_CACHE": str(tmp_path / "cc")})
    assert again.returncode == 0 and "part dense: exit 0" in again.stderr and "part emnist" not in again.stderr
    after = json.loads((tmp_path / "gpu_dry_run.json").read_text())
    assert after["emnist"] == emnist and after["text"]["targets"] == targets
    assert all(after[p]["measured"] == stamps[p] for p in ("emnist", "cnn", "resnet", "text"))


def test_the_parts_time_limits_fit_eight_minutes_with_their_kill_grace():
    """The whole run stays under 8 minutes: every default part's limit plus the grace before its kill add up to at
    most 480 s (a part's limit is the most it can take; the backend check and the final render take seconds); the
    asynchrony and attack-table parts, run only when named, each fit a call of their own."""
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    limits = dict(re.findall(r"\[(\w+)\]=(\d+)", re.search(r"declare -A limits=\((.*?)\)", script).group(1)))
    grace = int(re.search(r"^GRACE=(\d+)$", script, re.M).group(1))
    assert 'timeout -k "$GRACE" "$limit"' in script
    parts = re.search(r"parts=\((emnist[\w ]*)\)", script).group(1).split()
    assert sorted(parts) == sorted(("emnist", "cnn", "dense", "resnet", "text"))
    assert sorted(limits) == sorted(parts + ["async", "robust"])
    assert sum(int(limits[p]) for p in parts) + grace * len(parts) <= 480, (limits, grace)
    assert int(limits["async"]) + grace <= 480 and int(limits["robust"]) + grace <= 480


def test_the_asynchrony_part_dry_run(tmp_path):
    """``gpu.sh --dry-run async``: FedBuff, FedAvg and the event loop at toy sizes, both workloads, into gpu.md's
    section 6."""
    done = _gpu_sh("--dry-run", "--out", str(tmp_path), "async", env_extra={"FLJAX_COMPILE_CACHE": str(tmp_path / "cc")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "part async: exit 0" in done.stderr and "part emnist" not in done.stderr
    rows = json.loads((tmp_path / "gpu_dry_run.json").read_text())["async"]["rows"]
    assert [(r["workload"], r["what"].split(",")[0]) for r in rows] == [
        (w, what) for w in ("logreg", "mlp") for what in ("FedAvg", "FedBuff", "FedBuff")]
    assert all(r["client_steps_per_second"] > 0 for r in rows)
    assert "## 6. Asynchrony" in (tmp_path / "gpu_dry_run.md").read_text()


def test_the_attack_table_part_dry_run(tmp_path):
    """``gpu.sh --dry-run robust``: the attack table of benchmarks/robust.py at toy sizes (1 attack × 2 defences × 3
    fractions × 2 seeds as one sweep of 2 programs; one pair's 6 runs cell by cell), into gpu.md's section 7."""
    done = _gpu_sh("--dry-run", "--out", str(tmp_path), "robust", env_extra={"FLJAX_COMPILE_CACHE": str(tmp_path / "cc")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "part robust: exit 0" in done.stderr and "part emnist" not in done.stderr
    rec = json.loads((tmp_path / "gpu_dry_run.json").read_text())["robust"]
    assert rec["table"]["runs"] == 12 and rec["table"]["programs"] == 2
    assert rec["cells"]["sampled_runs"] == 6 and rec["cells"]["seconds_per_run"] > 0
    assert "## 7. Attack × defence tables" in (tmp_path / "gpu_dry_run.md").read_text()


def test_the_committed_report_is_rendered_from_the_committed_results():
    """benchmarks/results/gpu.md is what ``python benchmarks/gpu.py`` renders from gpu.json (its notes included), and
    its peer tables compare the fastest fljax row with each peer twice: any precision, and TF32, the peer's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    result = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())
    text = (ROOT / "benchmarks" / "results" / "gpu.md").read_text()
    assert text == gpu.markdown(result), "re-render it: python benchmarks/gpu.py"
    cnn, peer = result["cnn"]["rows"], result["cnn"]["peer_torch"][0]
    mine = [r for r in cnn if r["clients"] == peer["clients"]]
    best = max(r["client_steps_per_s"] for r in mine) / peer["client_steps_per_s"]
    tf32 = max(r["client_steps_per_s"] for r in mine if r["precision"] == "tf32") / peer["client_steps_per_s"]
    assert f"| {peer['client_steps_per_s']:,.0f} | {best:.1f}× | {tf32:.1f}× |" in text and best > tf32
    assert all(note in text for note in result["notes"].values())


def test_an_unknown_argument_is_refused_in_one_line():
    done = _gpu_sh("--dry-run", "emnsit")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown argument 'emnsit'" in done.stderr


def test_real_run_refuses_a_cpu_backend():
    done = _gpu_sh()
    assert done.returncode == 2 and "not gpu" in done.stderr


def test_fljax_needs_no_tensorflow_datasets():
    """With tensorflow_datasets unimportable, fljax, its API and CLI import and a run completes (the GPU machine
    has no tensorflow-datasets); a TFDS data set then fails with a clear message, not at import."""
    script = textwrap.dedent("""
        import sys
        sys.modules["tensorflow_datasets"] = None  # any import of it raises ImportError
        import fljax, fljax.api, fljax.cli, fljax.runner, fljax.data, fljax.engine, fljax.models
        result = fljax.run({"rounds": 1, "data": {"num_clients": 4}, "algo": {"cohort_size": 2}}, progress=False)
        assert 0 <= result.final["personal_acc"] <= 1
        print("NO-TFDS-OK")
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "NO-TFDS-OK" in out.stdout, out.stderr[-3000:]
