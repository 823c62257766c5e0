"""Local: every client trains its own model on its own data; nothing is communicated.

Each round the sampled clients (all clients when ``cohort_size`` is None) run local SGD from their own parameters.
Evaluation uses each client's own model; there is no global model. A model's BatchNorm statistics stay with
their client (FedBN's ``local`` placement; there is nothing to choose).
"""
from __future__ import annotations

import dataclasses

from fljax import tree
from fljax.algorithms.base import ClientInput, ClientResult, CohortTemplate
from fljax.algorithms.families import NO_COMMUNICATION
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.model_state import TrainsModelState
from fljax.algorithms.registry import register

__all__ = ["Local"]


@register("local", family=NO_COMMUNICATION, example="configs/local.yaml",
          summary="Local: each client trains alone on its own data, no communication")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Local(TrainsModelState, CohortTemplate):
    """A model's BatchNorm statistics stay with their client, and there is no ``weighting``: Local communicates and
    aggregates nothing."""

    mixed_architectures = True
    local: LocalTraining = local_training()

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))  # one shared initialisation, as the papers' code does
        return None, {"params": tree.broadcast_clients(params, ctx.num_clients)}

    def broadcast(self, server):
        return None

    def client_update(self, inp: ClientInput) -> ClientResult:
        params, variables, loss = self.local.train_with_state(inp.model.train_loss, inp.state["params"], inp)
        return ClientResult(state={"params": params}, upload=None, weight=inp.train.count,
                            metrics={"train_loss": loss}, variables=variables)

    def server_update(self, ctx, server, clients, cohort, result):
        return server

    def personal_params(self, inp: ClientInput):
        return inp.state["params"]
