"""fljax.algorithms: one module per algorithm family, and the registry that names them."""
from fljax.algorithms.apfl import APFL
from fljax.algorithms.asynchronous import Asynchronous, FedAsync, FedBuff
from fljax.algorithms.base import Algorithm, Centralized, ClientInput, ClientResult, TestStats
from fljax.algorithms.decentralized import DFedAvg, DFedAvgM, DFedSAM, Decentralized
from fljax.algorithms.dfedalt import DFedAlt, DFedSalt
from fljax.algorithms.dispfl import DisPFL
from fljax.algorithms.ditto import Ditto
from fljax.algorithms.augfl import AugFL
from fljax.algorithms.fedavg import FedAvg, FedAvgFT, FedLP, FedProx
from fljax.algorithms.fedbabu import FedBABU
from fljax.algorithms.feddyn import FedDyn
from fljax.algorithms.fedgia import FedGiA
from fljax.algorithms.fedgia_baselines import FedAvgGD, FedPD, FedProxGD
from fljax.algorithms.fednova import FedNova
from fljax.algorithms.fedrod import FedRoD
from fljax.algorithms.fedslr import FedSLR
from fljax.algorithms.fml import FML
from fljax.algorithms.local import Local
from fljax.algorithms.local_training import EVERY, LocalTraining, local_options, run_steps
from fljax.algorithms.partial import FedPer, FedRep, LGFedAvg
from fljax.algorithms.perfedavg import PerFedAvg
from fljax.algorithms.pfedme import PFedMe
from fljax.algorithms.quped import QuantizedLocal, QuPeD
from fljax.algorithms.qupel import QuPeL
from fljax.algorithms.registry import ALGORITHMS, get_algorithm, make_algorithm, register
from fljax.algorithms.regression import ConsensusRegression
from fljax.algorithms.scaffold import Scaffold

for _cls in (FedAvg, FedProx, FedAvgFT, Local, FedPer, FedRep, LGFedAvg, Ditto, FedSLR, FedDyn, Scaffold, APFL,
             PerFedAvg, PFedMe, FedBABU, FedRoD, DFedAvg, DFedAvgM, DFedSAM, DisPFL, DFedAlt, DFedSalt, AugFL, FedLP,
             FedGiA, FedAvgGD, FedProxGD, FedPD, QuPeD, QuantizedLocal, QuPeL, FML, FedNova, FedBuff, FedAsync):
    register(_cls)

__all__ = ["Algorithm", "Centralized", "ClientInput", "ClientResult", "TestStats", "APFL", "AugFL", "FedLP", "Ditto",
           "FedAvg", "FedAvgFT", "FedDyn",
           "FedProx", "FedSLR", "Local", "FedPer", "FedRep", "LGFedAvg", "PerFedAvg", "PFedMe", "Scaffold",
           "FedBABU", "FedRoD", "Decentralized", "DFedAvg", "DFedAvgM", "DFedSAM", "DisPFL", "DFedAlt", "DFedSalt",
           "ConsensusRegression", "FedGiA", "FedNova", "Asynchronous", "FedBuff", "FedAsync", "FedAvgGD", "FedProxGD", "FedPD", "QuPeD", "QuantizedLocal", "QuPeL", "FML",
           "LocalTraining", "local_options", "EVERY", "run_steps", "ALGORITHMS", "get_algorithm", "make_algorithm",
           "register"]
