"""The TFDS path on a fresh install: a data set prepared from TFDS's mock data loads through make_federated, and a
package tensorflow_datasets needs but lacks is named as the cause."""
import pytest

import fljax.data as D
from fljax.data import sources

tfds = pytest.importorskip("tensorflow_datasets")


def test_a_tfds_data_set_from_mock_data_loads(monkeypatch):
    # mock_data stands in for prepared files; the builder's own check of them (sources._prepared) is told so
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=40):
        data = D.make_federated("mnist", num_clients=4, partition="iid", seed=0, test_per_client=5)
    assert data.input_shape == (28, 28, 1) and data.num_clients == 4
    assert int(data.train.count.sum()) == 40 and int(data.test.count.sum()) == 20


def test_a_missing_package_is_named_as_the_cause(monkeypatch):
    def missing(*args):
        raise ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources")

    for step in ("_prepared", "_read_tfds"):  # whether checking the files or reading them needs the package
        monkeypatch.setattr(sources, step, missing)
    with pytest.raises(D.DataError, match=r"needs the package 'importlib_resources', which is not installed "
                                          r"\(pip install importlib-resources\)\.$"):
        sources.tfds_source("mnist")
