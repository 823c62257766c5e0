"""Results as data: run and comparison directories loaded back as pandas DataFrames, the results' short reprs and
``to_frame``, TensorBoard scalars."""
import glob
import os
import struct

import numpy as np
import pytest

import fljax
from fljax.config import ConfigError

pd = pytest.importorskip("pandas")

TINY = {"data": {"dataset": "synthetic", "num_clients": 8, "max_samples": 40}, "model": {"name": "logreg"},
        "algo": {"cohort_size": 4, "local_steps": 2, "batch_size": 10}, "rounds": 4, "eval_every": 2}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    pytest.importorskip("tensorboardX")
    root = tmp_path_factory.mktemp("results")
    results = fljax.compare(["fedavg", ("fedprox", {"mu": 0.1})], TINY, seeds=2, out=str(root / "cmp"),
                            tensorboard=str(root / "tb"), progress=False)
    return root, results


def _scalars(path: str) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a TensorBoard event file (TFRecord framing: length, its CRC, the Event, the Event's CRC)."""
    from tensorboardX.proto import event_pb2

    with open(path, "rb") as f:
        data = f.read()
    out, i = {}, 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        for v in event.summary.value:
            out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_load_compare_gives_every_run_seed_and_evaluation(compared):
    root, results = compared
    frame = fljax.load_compare(root / "cmp")
    assert list(frame.columns[:4]) == ["run", "algorithm", "seed", "round"]
    assert list(frame["run"].unique()) == ["fedavg", "fedprox(mu=0.1)"]
    assert frame.groupby("run")["algorithm"].first().to_dict() == {"fedavg": "fedavg", "fedprox(mu=0.1)": "fedprox"}
    assert len(frame) == 2 * 2 * 3  # runs × seeds × evaluations (rounds 0, 2, 4)
    got = frame[(frame.run == "fedprox(mu=0.1)") & (frame.seed == 1)]["personal_acc"].to_numpy()
    want = [h["personal_acc"] for h in results["fedprox(mu=0.1)"].runs[1].progress.log.history]
    np.testing.assert_array_equal(got, want)
    assert frame.attrs["config"]["rounds"] == 4
    assert frame.attrs["runs"]["fedavg"]["summary"]["seeds"] == [0, 1]


def test_load_run_equals_to_frame(compared):
    root, results = compared
    frame = fljax.load_run(root / "cmp" / "fedavg")
    pd.testing.assert_frame_equal(frame, results["fedavg"].to_frame())
    assert frame.attrs["config"]["algorithm"] == "fedavg" and frame.attrs["resolved"]["algo"]["lr"] == 0.1


def test_results_have_a_short_repr(compared):
    _, results = compared
    text = repr(results["fedavg"])
    assert text.startswith("ExperimentResult(fedavg on synthetic(1,1), 2 seeds: personal_acc=") and len(text) < 250
    run = results["fedavg"].runs[0].progress.result
    assert repr(run).startswith("RunResult(round=4, personal_acc=") and "Array" not in repr(run)
    assert list(run.to_frame()["round"]) == [0, 2, 4]


def test_tensorboard_scalars_per_run_and_seed(compared):
    root, results = compared
    dirs = sorted(os.path.relpath(d, root / "tb") for d in glob.glob(str(root / "tb" / "*" / "*")))
    assert dirs == ["fedavg/seed_0", "fedavg/seed_1", "fedprox_mu=0.1/seed_0", "fedprox_mu=0.1/seed_1"]
    (events,) = glob.glob(str(root / "tb" / "fedavg" / "seed_1" / "events.*"))
    scalars = _scalars(events)
    history = results["fedavg"].runs[1].progress.log.history
    assert [s for s, _ in scalars["personal_acc"]] == [0, 2, 4]
    np.testing.assert_allclose([v for _, v in scalars["personal_acc"]], [h["personal_acc"] for h in history])
    assert [s for s, _ in scalars["train_loss"]] == [2, 4]  # round 0 has no training loss


def test_loading_the_wrong_kind_of_directory_says_which_to_use(compared, tmp_path):
    root, _ = compared
    with pytest.raises(ConfigError, match="is a comparison: use fljax.load_compare"):
        fljax.load_run(root / "cmp")
    with pytest.raises(ConfigError, match="use fljax.load_run for a single run"):
        fljax.load_compare(root / "cmp" / "fedavg")
    with pytest.raises(ConfigError, match="holds no sweep .* use fljax.load_compare"):
        fljax.load_sweep(root / "cmp")
    with pytest.raises(ConfigError, match="not a run directory"):
        fljax.load_run(tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        fljax.load_run(tmp_path / "missing")
