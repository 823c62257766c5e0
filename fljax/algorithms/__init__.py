"""fljax.algorithms: one module per algorithm family, and the registry that names them.

Every algorithm registers itself where it is defined (:func:`register`: name, family, summary, example config);
importing this package imports the built-in modules, which fills :data:`ALGORITHMS`.
"""
# Imported in the order `fljax list` shows the built-in algorithms (each module registers its own).
from fljax.algorithms.base import (Aggregating, Algorithm, Centralized, ClientInput, ClientResult, CohortTemplate,
                                  TestStats)
from fljax.algorithms.fedavg import FedAvg, FedAvgFT, FedLP, FedProx
from fljax.algorithms.local import Local
from fljax.algorithms.partial import FedPer, FedRep, LGFedAvg
from fljax.algorithms.ditto import Ditto
from fljax.algorithms.fedslr import FedSLR
from fljax.algorithms.feddyn import FedDyn
from fljax.algorithms.scaffold import Scaffold
from fljax.algorithms.apfl import APFL
from fljax.algorithms.perfedavg import PerFedAvg
from fljax.algorithms.pfedme import PFedMe
from fljax.algorithms.fedbabu import FedBABU
from fljax.algorithms.fedrod import FedRoD
from fljax.algorithms.decentralized import DFedAvg, DFedAvgM, DFedSAM, Decentralized
from fljax.algorithms.dispfl import DisPFL
from fljax.algorithms.dfedalt import DFedAlt, DFedSalt
from fljax.algorithms.augfl import AugFL
from fljax.algorithms.regression import ConsensusRegression
from fljax.algorithms.fedgia import FedGiA
from fljax.algorithms.fedgia_baselines import FedAvgGD, FedPD, FedProxGD
from fljax.algorithms.quped import QuantizedLocal, QuPeD
from fljax.algorithms.qupel import QuPeL
from fljax.algorithms.fml import FML
from fljax.algorithms.fednova import FedNova
from fljax.algorithms.asynchronous import Asynchronous, FedAsync, FedBuff
from fljax.algorithms.local_training import LocalTraining, local_training, run_steps
from fljax.algorithms.registry import ALGORITHMS, get_algorithm, make_algorithm, register
from fljax.algorithms.server_optimizer import ServerOptimizer, server_optimizer

__all__ = ["Algorithm", "CohortTemplate", "Centralized", "Aggregating", "ClientInput", "ClientResult", "TestStats",
           "APFL", "AugFL", "FedLP", "Ditto", "FedAvg", "FedAvgFT", "FedDyn", "FedProx", "FedSLR", "Local", "FedPer",
           "FedRep", "LGFedAvg", "PerFedAvg", "PFedMe", "Scaffold", "FedBABU", "FedRoD", "Decentralized", "DFedAvg",
           "DFedAvgM", "DFedSAM", "DisPFL", "DFedAlt", "DFedSalt", "ConsensusRegression", "FedGiA", "FedNova",
           "Asynchronous", "FedBuff", "FedAsync", "FedAvgGD", "FedProxGD", "FedPD", "QuPeD", "QuantizedLocal", "QuPeL",
           "FML", "LocalTraining", "local_training", "ServerOptimizer", "server_optimizer", "run_steps", "ALGORITHMS",
           "get_algorithm", "make_algorithm", "register"]
