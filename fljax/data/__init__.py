"""fljax.data: federated data as padded or ragged arrays, partitioners, data sets and in-jit batching.

The modules form layers that import downwards only (tests/test_data_registry.py walks the graph): the types a
reader returns (:mod:`~fljax.data.types`) and the host-memory checks (:mod:`~fljax.data.memory`); the registries
(:mod:`~fljax.data.registry`: data sets and the data kind of each problem; :mod:`~fljax.data.partitioners`); the
readers, each registering its data sets where it is defined (:mod:`~fljax.data.synthetic_data`,
:mod:`~fljax.data.bundled`, :mod:`~fljax.data.tfds`, :mod:`~fljax.data.leaf`, :mod:`~fljax.data.stackoverflow`,
:mod:`~fljax.data.files`; :mod:`~fljax.data.meta` registers the partition ``meta_pairs``); the client arrays
(:mod:`~fljax.data.federated`, :mod:`~fljax.data.ragged`, :mod:`~fljax.data.batching`); and what reads the
registries (:mod:`~fljax.data.config`, :mod:`~fljax.data.build`). Importing this package imports the built-in
readers, so their data sets are registered; FedGiA's register from :mod:`fljax.problems`. A reader of one's own is
one module that calls :func:`register_source` (docs/data.md).
"""
# the built-in readers, which register their data sets (in this order in `fljax list`), and meta_pairs
from fljax.data import synthetic_data, bundled, tfds, leaf, stackoverflow, files, meta  # noqa: F401, I001
from fljax.data.arrays import from_arrays
from fljax.data.batching import Batch, BatchPlan, gather_batch
from fljax.data.build import (federate, holdout_mask, holdout_split, load_federated, make_federated, pool_test_split,
                              stack_clients)
from fljax.data.bundled import digits, mnist5k, qot, qot_arrays
from fljax.data.config import DataConfig
from fljax.data.federated import ClientArrays, FederatedData, ServerData, label_histogram, pad_clients, pad_flat
from fljax.data.partitioners import (PARTITIONERS, Partitioner, PartitionError, client_centric, dirichlet, iid,
                                     partition, pathological, power_law, register_partitioner)
from fljax.data.ragged import RaggedArrays, ragged_clients
from fljax.data.registry import (DATA_KINDS, SOURCES, DataKind, Source, load_source, register_data_kind,
                                 register_source)
from fljax.data.synthetic_data import synthetic
from fljax.data.tfds import tfds_source
from fljax.data.types import DataError, Natural, Pooled, Samples

__all__ = [
    "from_arrays", "Batch", "BatchPlan", "gather_batch", "federate", "holdout_mask", "holdout_split", "load_federated",
    "make_federated", "pool_test_split", "stack_clients", "digits", "mnist5k", "qot", "qot_arrays", "DataConfig",
    "ClientArrays", "FederatedData", "ServerData", "label_histogram", "pad_clients", "pad_flat", "PARTITIONERS",
    "Partitioner", "PartitionError", "client_centric", "dirichlet", "iid", "partition", "pathological", "power_law",
    "register_partitioner", "RaggedArrays", "ragged_clients", "DATA_KINDS", "SOURCES", "DataKind", "Source",
    "load_source", "register_data_kind", "register_source", "synthetic", "tfds_source", "DataError", "Natural",
    "Pooled", "Samples",
]
