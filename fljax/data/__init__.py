"""fljax.data: federated data as padded or ragged arrays, partitioners, sources and in-jit batching."""
from fljax.data.arrays import from_arrays
from fljax.data.batching import Batch, BatchPlan, gather_batch
from fljax.data.build import (federate, holdout_mask, holdout_split, load_federated, make_federated, pool_test_split,
                              stack_clients)
from fljax.data.config import DataConfig
from fljax.data.federated import ClientArrays, FederatedData, ServerData, label_histogram, pad_clients, pad_flat
from fljax.data.ragged import RaggedArrays, ragged_clients
from fljax.data.partitioners import (PARTITIONERS, PartitionError, client_centric, dirichlet, iid, partition,
                                     pathological, power_law)
from fljax.data.sources import (SOURCES, DataError, Natural, Pooled, digits, load_source, mnist5k, qot, qot_arrays,
                                synthetic, tfds_source)

__all__ = [
    "from_arrays", "Batch", "BatchPlan", "gather_batch", "federate", "holdout_mask", "holdout_split", "load_federated",
    "make_federated", "pool_test_split", "stack_clients", "DataConfig",
    "ClientArrays", "FederatedData", "ServerData", "label_histogram", "pad_clients", "pad_flat", "RaggedArrays",
    "ragged_clients", "PARTITIONERS", "PartitionError",
    "client_centric", "dirichlet", "iid", "partition", "pathological", "power_law", "SOURCES", "DataError", "Natural",
    "Pooled",
    "digits", "load_source", "mnist5k", "qot", "qot_arrays", "synthetic", "tfds_source",
]
