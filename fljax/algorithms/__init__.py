"""fljax.algorithms: one module per algorithm family, and the registry that names them."""
from fljax.algorithms.base import Algorithm, Centralized, ClientResult, TestStats
from fljax.algorithms.ditto import Ditto
from fljax.algorithms.fedavg import FedAvg, FedAvgFT, FedProx
from fljax.algorithms.local import Local
from fljax.algorithms.local_training import LocalSGD, run_steps
from fljax.algorithms.partial import FedPer, FedRep, LGFedAvg
from fljax.algorithms.registry import ALGORITHMS, get_algorithm, make_algorithm, register

for _cls in (FedAvg, FedProx, FedAvgFT, Local, FedPer, FedRep, LGFedAvg, Ditto):
    register(_cls)

__all__ = ["Algorithm", "Centralized", "ClientResult", "TestStats", "Ditto", "FedAvg", "FedAvgFT", "FedProx", "Local", "FedPer", "FedRep", "LGFedAvg",
           "LocalSGD", "run_steps", "ALGORITHMS", "get_algorithm", "make_algorithm", "register"]
