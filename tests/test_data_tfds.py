"""The TFDS path on a fresh install: a data set prepared from TFDS's mock data loads through make_federated, and a
package tensorflow_datasets needs but lacks is named as the cause; CIFAR-100 through the pachinko partitioner, whose
class hierarchy is checked against Krizhevsky's list."""
import numpy as np
import pytest

import fljax.data as D
from fljax.data import tfds as tfds_reader

tfds = pytest.importorskip("tensorflow_datasets")


def test_a_tfds_data_set_from_mock_data_loads(monkeypatch):
    # mock_data stands in for prepared files; the builder's own check of them (tfds_reader._prepared) is told so
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=40):
        data = D.make_federated("mnist", num_clients=4, partition="iid", seed=0, test_per_client=5)
    assert data.input_shape == (28, 28, 1) and data.num_clients == 4
    assert int(data.train.count.sum()) == 40 and int(data.test.count.sum()) == 20


def test_a_missing_package_is_named_as_the_cause(monkeypatch):
    def missing(*args):
        raise ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources")

    for step in ("_prepared", "_read_tfds"):  # whether checking the files or reading them needs the package
        monkeypatch.setattr(tfds_reader, step, missing)
    with pytest.raises(D.DataError, match=r"needs the package 'importlib_resources', which is not installed "
                                          r"\(pip install importlib-resources\)\.$"):
        tfds_reader.tfds_source("mnist")


# CIFAR-100's 20 superclasses and their 5 classes each (Krizhevsky 2009, "Learning Multiple Layers of Features from
# Tiny Images"; the list on the CIFAR page), in the names of the data set's meta file, whose label ids are both lists
# in alphabetical order (TFDS keeps those ids).
CIFAR100_SUPERCLASSES = {
    "aquatic_mammals": "beaver dolphin otter seal whale", "fish": "aquarium_fish flatfish ray shark trout",
    "flowers": "orchid poppy rose sunflower tulip", "food_containers": "bottle bowl can cup plate",
    "fruit_and_vegetables": "apple mushroom orange pear sweet_pepper",
    "household_electrical_devices": "clock keyboard lamp telephone television",
    "household_furniture": "bed chair couch table wardrobe", "insects": "bee beetle butterfly caterpillar cockroach",
    "large_carnivores": "bear leopard lion tiger wolf",
    "large_man-made_outdoor_things": "bridge castle house road skyscraper",
    "large_natural_outdoor_scenes": "cloud forest mountain plain sea",
    "large_omnivores_and_herbivores": "camel cattle chimpanzee elephant kangaroo",
    "medium_mammals": "fox porcupine possum raccoon skunk",
    "non-insect_invertebrates": "crab lobster snail spider worm",
    "people": "baby boy girl man woman", "reptiles": "crocodile dinosaur lizard snake turtle",
    "small_mammals": "hamster mouse rabbit shrew squirrel",
    "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
    "vehicles_1": "bicycle bus motorcycle pickup_truck train", "vehicles_2": "lawn_mower rocket streetcar tank tractor"}


def _coarse_of_fine() -> np.ndarray:
    coarse = {fine: k for k, name in enumerate(sorted(CIFAR100_SUPERCLASSES))
              for fine in CIFAR100_SUPERCLASSES[name].split()}
    assert len(coarse) == 100
    return np.array([coarse[fine] for fine in sorted(coarse)])


def test_the_pachinko_hierarchy_is_cifar_100_s():
    np.testing.assert_array_equal(D.partitioners.CIFAR100_COARSE, _coarse_of_fine())


def _rows(x) -> list[bytes]:
    return [np.round(np.asarray(img) * 255).astype(np.uint8).tobytes() for img in x]


def test_tfds_cifar100_through_pachinko(monkeypatch):
    """TFDS's mock CIFAR-100 (1,000 random images a split, uniform fine labels) split by Reddi et al.'s Pachinko
    allocation: every client holds rows of the pool, each at most once, with their fine labels, samples_per_client
    of them (test: an equal share of the test pool); with coarse_alpha near 0 (θ_i one-hot) a client's fine classes
    all lie in one superclass, and with the default sizes the clients use up both pools exactly."""
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=1_000):
        pool = {s: list(tfds.data_source("cifar100", split=s)) for s in ("train", "test")}
        skewed = D.make_federated("cifar100", 4, partition="pachinko", seed=0, coarse_alpha=1e-3, samples_per_client=10)
        full = D.make_federated("cifar100", 5, partition="pachinko", seed=1)
    label_of = {s: {np.asarray(ex["image"]).tobytes(): int(ex["label"]) for ex in pool[s]} for s in pool}
    assert all(len(label_of[s]) == 1_000 for s in pool)  # distinct images: a row names its pool example
    coarse = _coarse_of_fine()
    assert skewed.num_classes == full.num_classes == 100 and skewed.input_shape == (32, 32, 3)
    for fed, train, test in ((skewed, 10, 250), (full, 200, 200)):
        for split, per_client in (("train", train), ("test", test)):
            arrays = getattr(fed, split)
            np.testing.assert_array_equal(np.asarray(arrays.count), per_client)
            held = []
            for i in range(fed.num_clients):
                m = np.asarray(arrays.mask[i])
                rows, y = _rows(np.asarray(arrays.x[i])[m]), np.asarray(arrays.y[i])[m]
                assert [label_of[split][r] for r in rows] == y.tolist()  # the fine label of that very example
                held += rows
                if fed is skewed and split == "train":
                    assert len(set(coarse[y])) == 1 and len(set(y)) > 1, y  # one superclass, several of its classes
            assert len(set(held)) == len(held)  # without replacement
            if fed is full:
                assert set(held) == set(label_of[split])  # 5 x 200: the whole pool
    superclasses = {int(coarse[np.asarray(skewed.train.y[i])[0]]) for i in range(4)}
    assert len(superclasses) > 1  # the clients' θ_i differ
