"""fljax.algorithms: one module per algorithm family, and the registry that names them."""
from fljax.algorithms.base import Algorithm, Centralized, ClientResult, TestStats
from fljax.algorithms.fedavg import FedAvg, FedAvgFT, FedProx
from fljax.algorithms.fedgia import FedGiA
from fljax.algorithms.fedgia_baselines import FedAvgGD, FedPD, FedProxGD
from fljax.algorithms.local import Local
from fljax.algorithms.local_training import LocalSGD, run_steps
from fljax.algorithms.registry import ALGORITHMS, get_algorithm, make_algorithm, register

for _cls in (FedAvg, FedProx, FedAvgFT, Local):
    register(_cls)
# FedGiA and its regression baselines solve consensus regression problems (fljax.problems), not the classification
# Simulation, so they are not in the registry: see fljax.algorithms.fedgia.solve and `python -m fljax.reproduce.fedgia`.

__all__ = ["Algorithm", "Centralized", "ClientResult", "TestStats", "FedAvg", "FedAvgFT", "FedProx", "Local",
           "FedGiA", "FedAvgGD", "FedProxGD", "FedPD",
           "LocalSGD", "run_steps", "ALGORITHMS", "get_algorithm", "make_algorithm", "register"]
