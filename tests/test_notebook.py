"""CI executes the quick-start notebook (notebooks/quickstart.ipynb) top to bottom."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quickstart_notebook_executes(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # The kernel is ipykernel's 'python3' of this very interpreter: its kernelspec launches `python`, so put this
    # interpreter's directory first on PATH (in a fresh venv it is not activated), and make the kernel import the
    # fljax under test.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows the figures
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": ROOT}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "fedavg  personalized accuracy" in text and "local   personalized accuracy" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the label-mix and accuracy plots
