"""fljax: federated learning simulation as vectorised, jitted JAX programs.

    import fljax
    result = fljax.run(algorithm="fedavg", data={"dataset": "digits"}, rounds=20)
"""
import os as _os

__version__ = "0.1.0"

# LAPACK calls inside XLA:CPU programs (SVD, eigh, Cholesky: FedSLR's SVT, FedGiA's solves) run on OpenBLAS, whose
# thread pool stalls when every core is busy: on a 2-core machine a 64×64 SVD took 92 ms with 2 threads and 0.28 ms
# with one (benchmarks/lapack_threads.py). fljax therefore runs OpenBLAS single-threaded unless OPENBLAS_NUM_THREADS
# is set by the user.
if "OPENBLAS_NUM_THREADS" not in _os.environ:
    _os.environ["OPENBLAS_NUM_THREADS"] = "1"  # libraries loaded from now on (jaxlib's LAPACK loads lazily)
    import threadpoolctl as _threadpoolctl

    _threadpoolctl.threadpool_limits(1, user_api="blas")  # libraries already loaded (numpy's)

from fljax.api import (build, compare, hypergradient, load_compare, load_data, load_run, load_sweep,  # noqa: E402
                       make_config, run, sweep, tune)
from fljax.config import ConfigError, DataConfig, ExperimentConfig, ModelConfig  # noqa: E402
from fljax.engine import Simulation, State  # noqa: E402
from fljax.experiment import Experiment, resolve  # noqa: E402

__all__ = ["build", "compare", "hypergradient", "load_compare", "load_data", "load_run", "load_sweep", "make_config",
           "run", "sweep", "tune",
           "resolve",
           "ConfigError", "DataConfig", "Experiment", "ExperimentConfig", "ModelConfig", "Simulation", "State",
           "__version__"]
