"""CI executes every notebook in notebooks/ top to bottom (each sized to run in well under a minute; a notebook whose
committed outputs come from a larger size reads ``FLJAX_NOTEBOOK_SIZE=small``, which this test sets). The committed
copies carry their outputs so that they render on a code host; refresh them with
``jupyter execute --inplace notebooks/NAME.ipynb``."""
import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
# what each notebook must show: printed text, and the number of figures
EXPECTED = {"quickstart": (["fedavg  personalized accuracy", "local   personalized accuracy"], 2),
            "fedslr": ([], 3), "dfedalt": ([], 3),
            "throughput": (["float32 matmul peak here", "command: python benchmarks/throughput.py"], 2),
            "fedgia": (["Example V.1: 1 instance(s)"], 2), "quped": (["mixed population:"], 4),
            "augfl": (["server's pretrained model:"], 2),
            "privacy": (["non-private FedAvg", "ε =", "MB up"], 2),
            "tuning": (["hypergradient (reverse mode", "hypergradient (forward mode", "grid's best"], 2)}


def _outputs(nb):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def test_every_notebook_is_listed_and_committed_with_its_figures():
    nbformat = pytest.importorskip("nbformat")
    assert sorted(os.path.basename(p)[:-6] for p in NOTEBOOKS) == sorted(EXPECTED)
    for path in NOTEBOOKS:
        images = sum("image/png" in o.get("data", {}) for o in _outputs(nbformat.read(path, as_version=4)))
        assert images == EXPECTED[os.path.basename(path)[:-6]][1], f"{path}: run jupyter execute --inplace on it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: os.path.basename(p))
def test_notebook_executes(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # The kernel is ipykernel's 'python3' of this very interpreter: its kernelspec launches `python`, so put this
    # interpreter's directory first on PATH (in a fresh venv it is not activated), and make the kernel import the
    # fljax under test.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FLJAX_NOTEBOOK_SIZE", "small")
    monkeypatch.setenv("FLJAX_CACHE", str(tmp_path))  # a pretrained server model (AugFL) is cached here, not in ~
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows the figures
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": ROOT}})
    client.execute()
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    texts, images = EXPECTED[os.path.basename(path)[:-6]]
    assert all(t in text for t in texts)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == images
