"""fljax: federated learning simulation as vectorised, jitted JAX programs."""
__version__ = "0.1.0"
