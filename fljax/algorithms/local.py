"""Local: every client trains its own model on its own data; nothing is communicated.

Each round the sampled clients (all clients when ``cohort_size`` is None) run local SGD from their own parameters.
Evaluation uses each client's own model; there is no global model.
"""
from __future__ import annotations

import dataclasses

from fljax import tree
from fljax.algorithms.base import Centralized, ClientResult
from fljax.algorithms.local_training import LocalSGD

__all__ = ["Local"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Local(Centralized, LocalSGD):
    name = "local"
    summary = "Local: each client trains alone on its own data, no communication"

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        self.validate_local()

    def init(self, ctx):
        params = self.model.init(self.init_key(ctx))  # one shared initialisation, as the papers' code does
        return None, {"params": tree.broadcast_clients(params, ctx.num_clients)}

    def broadcast(self, server):
        return None

    def client_update(self, shared, per_client) -> ClientResult:
        _, round_ = shared
        state, train, key = per_client
        params, loss = self.train(self.model.loss, state["params"], train, key, round_, self.unroll)
        return ClientResult(state={"params": params}, upload=None, weight=train.count, metrics={"train_loss": loss})

    def server_update(self, ctx, server, clients, cohort, result):
        return server

    def personal_params(self, shared, client_state, train, key):
        return client_state["params"]
