"""Issue 41 (reliability, round 4), the checks that are not one-line refusals of the catalogue (tests/bad_inputs.py
has those): the host's memory under a limit, data files that declare more than they hold, links planted in a run
directory, the δ warning of a private run."""
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from fljax.cli import main
from fljax.data import DataError, load_source
from fljax.data import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--set", "data.dataset=synthetic", "--set", "data.num_clients=4", "--set", "data.max_samples=40", "--set",
        "model.name=logreg", "--set", "algo.cohort_size=2", "--set", "rounds=2", "--set", "eval_every=1", "--quiet"]


def _run(capsys, argv):
    capsys.readouterr()
    status = main(argv)
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ host memory


def test_the_host_memory_is_the_address_space_limit_when_one_is_set():
    """Under `ulimit -v` (prlimit --as) the memory a process may use is the limit, and the refusals and the CPU's
    memory plan (fljax.engine.budget.device_memory) use it: the probe's EMNIST-shaped evaluation failed inside
    XLA under a 10 GB limit the plan did not know of."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (6 * 2 ** 30, resource.RLIM_INFINITY)); "
            "from fljax.data.memory import host_memory; from fljax.engine.budget import device_memory; "
            "print(host_memory(), device_memory())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    limited = ("this process's address-space limit (ulimit -v)", 6 * 2 ** 30)
    assert out.stdout.strip() == f"{limited} {limited}"


def test_check_bytes_refuses_above_the_host_memory_only(monkeypatch):
    monkeypatch.setattr(memory, "host_memory", lambda: ("this machine", 1000))
    memory.check_bytes(1000, "lower data.x", "the arrays")
    with pytest.raises(DataError, match=r"^the arrays would take 1,001 bytes, more than the 1,000 bytes of this "
                                        r"machine; lower data.x\.$"):
        memory.check_bytes(1001, "lower data.x", "the arrays")
    assert memory.size_text(3 * 2 ** 40) == "3.0 TiB" and memory.size_text(1536) == "1.5 KiB"
    assert memory.sizes_apart(2 ** 30 + 1, 2 ** 30) == ("1,073,741,825 bytes", "1,073,741,824 bytes")


def _npz_declaring(path, shape):
    """A client .npz whose x.npy declares ``shape`` (float32) but holds no data: what a compressed member of zeros
    declares in a file of kilobytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    y = io.BytesIO()
    np.save(y, np.zeros(2, np.int32))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", header.getvalue())  # the magic string and the header, no data
        z.writestr("y.npy", y.getvalue())


def test_a_client_file_declaring_terabytes_is_refused_before_it_is_read(tmp_path):
    """A data file cannot make fljax allocate past the memory: the arrays' headers are read first (shape × item
    size) and their sum over the files is refused in one line naming the file, before any array is allocated."""
    folder = tmp_path / "clients"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.ones((2, 3), np.float32), y=np.array([0, 1]))
    _npz_declaring(folder / "b.npz", (10 ** 7, 10 ** 7))
    with pytest.raises(DataError) as e:
        load_source("files", num_clients=2, seed=0, path=str(folder))
    assert str(e.value).startswith("the arrays of the client files read so far (b.npz the last) would take 727.6 "
                                   "TiB, more than the ") and str(e.value).endswith("; make the client files smaller "
                                                                                    "(data.path).")
    assert memory.host_memory()[1] < 727 * 2 ** 40  # (any machine this runs on)


# ------------------------------------------------------------------------------------------------ run directories


def test_a_checkpoints_link_in_a_run_directory_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """Issue 41 item 6: a `checkpoints` symlink planted in a run directory was followed outside it (checkpoints
    written, moved aside and deleted there); so was a link planted as the lock file (its target truncated). Both
    are refused in one line, the target untouched."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    os.makedirs("r")
    os.symlink("../outside", "r/checkpoints")
    status, err = _run(capsys, ["run", *TINY, "--out", "r"])
    assert status == 2 and len(err) == 1, err
    assert err[0] == ("fljax: error: 'r/checkpoints' is a symbolic link (to '../outside'); fljax writes, moves aside "
                      "and deletes checkpoints there and writes nothing outside the run directory: remove the link "
                      "(or move the checkpoints it points to into 'r/checkpoints').")
    assert sorted(os.listdir("r")) == ["checkpoints"] and os.listdir(outside) == ["keep.txt"]
    os.remove("r/checkpoints")
    os.symlink("../outside/keep.txt", "r/.lock")
    status, err = _run(capsys, ["run", *TINY, "--out", "r"])
    assert status == 2 and len(err) == 1 and "'r/.lock' cannot be opened as the run directory's lock" in err[0], err
    assert (outside / "keep.txt").read_text() == "mine\n"
    os.remove("r/.lock")
    os.makedirs("elsewhere")
    os.symlink("../elsewhere", "r/seed_1")  # a seed's directory of a run with two seeds
    status, err = _run(capsys, ["run", *TINY, "--seeds", "2", "--out", "r"])
    assert status == 2 and err == ["fljax: error: 'r/seed_1' is a symbolic link (to '../elsewhere'); fljax writes "
                                   "nothing outside the run directory it was given: remove the link."], err
    assert os.listdir("elsewhere") == []


# ------------------------------------------------------------------------------------------------ privacy


def test_a_private_run_with_a_weak_delta_warns_once_and_one_with_a_small_delta_does_not(tmp_path, monkeypatch,
                                                                                         capsys):
    """Issue 41 item 8: the run prints the plan's δ warning (fljax.privacy.delta_warning) once, on stderr; with
    privacy.delta at the threshold it prints none."""
    monkeypatch.chdir(tmp_path)
    private = ["--set", "privacy.noise_multiplier=1", "--set", "privacy.clip_norm=1"]
    status, err = _run(capsys, ["run", *TINY, *private, "--out", "a"])
    warnings = [line for line in err if line.startswith("fljax: warning: privacy: δ")]
    assert status == 0 and len(warnings) == 1, err
    assert warnings[0].startswith("fljax: warning: privacy: δ = 0.218 (the default N^-1.1 for N = 4 clients) is "
                                  "above 1e-05")
    status, err = _run(capsys, ["run", *TINY, *private, "--set", "privacy.delta=1e-5", "--out", "b"])
    assert status == 0 and not [line for line in err if "δ" in line], err
    assert json.load(open("b/summary.json"))["privacy"]["delta"] == 1e-5


def test_a_run_that_runs_out_of_memory_ends_in_one_line_naming_the_knob(tmp_path, monkeypatch, capsys):
    """Issue 41 items 1 and 7: under an address-space limit, NumPy's _ArrayMemoryError (a MemoryError) and XLA:CPU's
    'YNNPACK operation failed' ended in 40-50-line tracebacks. Such an error, wherever it comes from, is one line
    naming the memory the process may use and memory_budget; any other error is left alone."""
    import jax

    import fljax.runner as runner
    from fljax.engine.budget import out_of_memory

    assert out_of_memory(ValueError("RESOURCE_EXHAUSTED")) is None and out_of_memory(KeyError("x")) is None
    ynn = jax.errors.JaxRuntimeError("INTERNAL: YNNPACK operation failed")
    assert out_of_memory(ynn).startswith("out of memory while running (JaxRuntimeError: INTERNAL: YNNPACK operation "
                                         "failed): ")
    assert out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: something else")) is None
    monkeypatch.chdir(tmp_path)

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 13.4 TiB for an array with shape (251181, 100000000)")

    monkeypatch.setattr(runner, "run_experiment", exhausted)
    status, err = _run(capsys, ["run", *TINY, "--out", "r"])
    assert status == 1 and len(err) == 1, err
    assert err[0].startswith("fljax: error: out of memory while running (MemoryError: Unable to allocate 13.4 TiB")
    assert "can be used; lower memory_budget (GiB of temporaries per program)" in err[0]
