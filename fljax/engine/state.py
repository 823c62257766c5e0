"""The simulation state: one explicit pytree, nothing hidden in Python objects."""
from __future__ import annotations

from typing import Any

import flax.struct
import jax

__all__ = ["State"]


@flax.struct.dataclass
class State:
    """``server``: the server's pytree (global model, server optimizer state, duals), or None when decentralized.
    ``clients``: every per-client quantity (personal parameters, duals, control variates, optimizer state) as ONE
    pytree whose leaves have a leading axis of size ``num_clients``; it never leaves the client.
    ``round``: rounds completed. ``key``: the run's base PRNG key; round t uses ``fold_in(key, t)``."""

    server: Any
    clients: Any
    round: jax.Array
    key: jax.Array
