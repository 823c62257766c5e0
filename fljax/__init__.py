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

# The public names below are imported on first use (PEP 562): ``import fljax`` and the command line's ``--help``,
# ``--version`` and ``list`` then start without importing JAX (benchmarks/first_run.py, case "help").
_PUBLIC = {"build": "fljax.api", "compare": "fljax.api", "hypergradient": "fljax.api", "load_compare": "fljax.api",
           "load_data": "fljax.api", "load_run": "fljax.api", "load_sweep": "fljax.api", "make_config": "fljax.api",
           "run": "fljax.api", "sweep": "fljax.api", "tune": "fljax.api", "resolve": "fljax.experiment",
           "ConfigError": "fljax.config", "DataConfig": "fljax.config", "ExperimentConfig": "fljax.config",
           "ModelConfig": "fljax.config", "Simulation": "fljax.engine", "State": "fljax.engine",
           "Experiment": "fljax.experiment"}


def __getattr__(name: str):
    """A public name (imported from its module on first use), or a submodule (``fljax.api``)."""
    import importlib

    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = ["build", "compare", "hypergradient", "load_compare", "load_data", "load_run", "load_sweep", "make_config",
           "run", "sweep", "tune",
           "resolve",
           "ConfigError", "DataConfig", "Experiment", "ExperimentConfig", "ModelConfig", "Simulation", "State",
           "__version__"]
