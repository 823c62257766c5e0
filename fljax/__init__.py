"""fljax: federated learning simulation as vectorised, jitted JAX programs.

    import fljax
    result = fljax.run(algorithm="fedavg", data={"dataset": "digits"}, rounds=20)
"""
__version__ = "0.1.0"

from fljax.api import build, compare, load_data, make_config, run  # noqa: E402
from fljax.config import ConfigError, DataConfig, ExperimentConfig, ModelConfig  # noqa: E402
from fljax.engine import Simulation, State  # noqa: E402

__all__ = ["build", "compare", "load_data", "make_config", "run", "ConfigError", "DataConfig", "ExperimentConfig",
           "ModelConfig", "Simulation", "State", "__version__"]
