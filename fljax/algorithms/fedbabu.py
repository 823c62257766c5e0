"""FedBABU (Oh et al. 2022): federated body training under a fixed random head, personalization by fine-tuning.

The head v⁰ (``personal``, default 'head') keeps its random initialisation, the same for every client, throughout
training. Selected client i, round t: u_i ← ``local_epochs`` of SGD on the body from the received body u_t with v⁰
frozen; the server averages the bodies, u_{t+1} = Σ_{i∈S_t} p_i u_i. Only bodies are communicated.

Evaluation (DFedAlt spec D22): client i fine-tunes the whole received model (u_{t+1}, v⁰) for ``finetune_epochs``
epochs of its optimizer on its own train split (``finetune='head'``: the head only), is scored, and the fine-tuned
model is discarded. The global model (u_{t+1}, v⁰) is scored as is.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_SPLIT
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.partial import PartialModel
from fljax.algorithms.registry import register
from fljax.data.batching import BatchPlan
from fljax.ops import partition
from fljax.options import at_least, option

__all__ = ["FedBABU"]


@register("fedbabu", family=PERSONAL_SPLIT, example="configs/fedbabu.yaml",
          summary="FedBABU: body trained under a fixed random head, fine-tuned per client at evaluation (Oh et al. 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedBABU(PartialModel, Aggregating):
    """Body averaging as :class:`~fljax.algorithms.partial.FedPer`; evaluation always fine-tunes the current server
    model."""

    local: LocalTraining = local_training()
    finetune_epochs: int = option(5,
                                  "epochs of fine-tuning of the received model on the client's train split before "
                                  "evaluation", at_least(0))
    finetune: Literal["all", "head"] = option("all", "what evaluation fine-tunes: 'all' the model or only the 'head'")

    def init(self, ctx):
        server, _ = super().init(ctx)  # checks that the split leaves something shared
        return server, {}

    def broadcast(self, server):
        return server["params"]  # the body, plus the fixed head every client already holds (not counted)

    def upload_reference(self, down):
        """The body u_t of the whole model it broadcasts: the model its upload (a body) is trained from."""
        return self.split(down)[0]

    def comm_bytes(self, down, result, cohort_size) -> tuple:
        body = self.split(down)[0]
        return float(tree.nbytes(result.upload)), float(tree.nbytes(body) * cohort_size)

    def client_update(self, inp: ClientInput) -> ClientResult:
        u, head = self.split(inp.down)
        u, loss = self.local.train(lambda u_, b: inp.model.loss(partition.merge(u_, head), b), u, inp)
        return ClientResult(state=inp.state, upload=u, weight=inp.train.count, metrics={"train_loss": loss})

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        local = self.local
        plan, lr = BatchPlan(batch_size=local.batch_size, epochs=self.finetune_epochs), local.lr_at(0)
        loss = inp.model.loss
        if self.finetune == "all":
            return local.train(loss, inp.down, inp, plan=plan, lr=lr)[0]
        u, head = self.split(inp.down)
        head, _ = local.train(lambda h, b: loss(partition.merge(u, h), b), head, inp, plan=plan, lr=lr)
        return partition.merge(u, head)
