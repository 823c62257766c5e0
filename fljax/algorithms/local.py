"""Local: every client trains its own model on its own data; nothing is communicated.

Each round the sampled clients (all clients when ``cohort_size`` is None) run local SGD from their own parameters.
Evaluation uses each client's own model; there is no global model. A model's BatchNorm statistics stay with
their client (``batch_stats: local``, the only choice).
"""
from __future__ import annotations

import dataclasses

from fljax import tree
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.local_training import LocalSGD
from fljax.algorithms.model_state import TrainsModelState
from fljax.errors import OptionError

__all__ = ["Local"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Local(TrainsModelState, Centralized, LocalSGD):
    name = "local"
    summary = "Local: each client trains alone on its own data, no communication"
    mixed_architectures = True
    batch_stats: str = "local"

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        self.validate_local()
        if self.batch_stats != "local":
            raise OptionError("batch_stats", f"must be 'local' (Local communicates nothing), got {self.batch_stats!r}.")

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))  # one shared initialisation, as the papers' code does
        return None, {"params": tree.broadcast_clients(params, ctx.num_clients)}

    def broadcast(self, server):
        return None

    def client_update(self, inp: ClientInput) -> ClientResult:
        params, loss = self.train(inp.model.loss, inp.state["params"], inp)
        return ClientResult(state={"params": params}, upload=None, weight=inp.train.count,
                            metrics={"train_loss": loss})

    def server_update(self, ctx, server, clients, cohort, result):
        return server

    def personal_params(self, inp: ClientInput):
        return inp.state["params"]
