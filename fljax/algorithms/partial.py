"""Partial personalization: a shared part averaged by the server and a personal part that never leaves the client.

The split is a regex over parameter paths (``personal``; default ``'head'``, the models' last Dense layer), turned
into a leaf mask by :func:`fljax.ops.partition.mask_from_paths`. Each client stores its whole model (u_i, v_i);
a never-sampled client keeps the shared initialisation w_0.

* FedPer (Arivazhagan et al. 2019): selected client i trains (u, v_i) jointly from (u_t, v_i); server
  u_{t+1} = Σ_{i∈S_t} p_i u_i.
* FedRep (Collins et al. 2021): selected client i first trains v_i with u_t frozen (``head_epochs``), then u with
  the new v_i frozen (``body_epochs``); the server averages bodies only. Its local work is counted in those epochs:
  it takes no ``local_epochs``, ``local_steps`` or ``sampling`` (each phase shuffles the client's data).
* LG-FedAvg (Liang et al. 2020): the roles are swapped — the body is personal, the head shared.

Only the shared part is communicated (down and up). Evaluation uses the stored (u_i, v_i) (``eval_body='stored'``,
the client's model after its latest local training) or the current server body with the client's own personal part
(``eval_body='server'``).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax

from fljax import tree
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_SPLIT
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.data.batching import BatchPlan
from fljax.errors import OptionError
from fljax.ops import partition
from fljax.options import at_least, greater_than, option, with_default

__all__ = ["PartialModel", "PartialAveraging", "FedPer", "FedRep", "LGFedAvg"]

NOT_HEAD = "^(?!.*head)"  # every leaf whose path does not contain 'head'


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartialModel:
    """A model split by ``personal`` into a shared part u, averaged by the server, and a personal part v (the
    server keeps its initial v), mixed into an :class:`~fljax.algorithms.base.Aggregating` algorithm; the client
    update, evaluation and local training are the algorithm's."""

    personal: str = option("head", "path regex of the parameters that stay with the client, never averaged "
                                   "('head': the last Dense layer)")

    def shared_mask(self, params):
        """Leaf mask of the shared part u (the complement of ``personal``)."""
        return partition.mask_not(partition.mask_from_paths(params, self.personal))

    def split(self, params):
        """(shared u, personal v), each with None in the other's slots."""
        return partition.split(params, self.shared_mask(params))

    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        shared = jax.tree.leaves(self.shared_mask(params))
        if all(shared) or not any(shared):
            raise OptionError("personal", partition.selection_problem(self.personal, params,
                                                                      "no" if all(shared) else "every"))
        return {"params": params}, {"params": tree.broadcast_clients(params, ctx.num_clients)}

    def server_step(self, ctx, server, aggregate):
        return {"params": partition.merge(aggregate, server["params"])}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartialAveraging(PartialModel, Aggregating):
    """The round and evaluation of FedPer, FedRep and LG-FedAvg: client i trains (u, v_i) from (u_t, its own v_i)
    (``local_update``: jointly by default, FedRep in two phases), stores both and uploads u; evaluation per
    ``eval_body``."""

    eval_body: Literal["stored", "server"] = option(
        "stored", "'stored' (the client's model after its latest training) or 'server' (the server's shared part "
                  "with its own personal part)")

    def broadcast(self, server):
        return self.split(server["params"])[0]

    def local_update(self, params, inp: ClientInput):
        """(trained (u, v_i), mean loss): joint local training of (u, v_i) (FedPer, LG-FedAvg)."""
        return self.local.train(inp.model.loss, params, inp)

    def client_update(self, inp: ClientInput) -> ClientResult:
        params = partition.merge(inp.down, self.split(inp.state["params"])[1])
        params, loss = self.local_update(params, inp)
        return ClientResult(state={"params": params}, upload=self.split(params)[0], weight=inp.train.count,
                            metrics={"train_loss": loss})

    def eval_shared(self, server):
        return self.broadcast(server)

    def personal_params(self, inp: ClientInput):
        if self.eval_body == "stored":
            return inp.state["params"]
        return partition.merge(inp.down, self.split(inp.state["params"])[1])


@register("fedper", family=PERSONAL_SPLIT, example="configs/fedper.yaml",
          summary="FedPer: shared body averaged by the server, personal head kept by each client (Arivazhagan et al. 2019)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedPer(PartialAveraging):
    private_steps = True  # joint training through LocalTraining with its plan
    local: LocalTraining = local_training()


@register("fedrep", family=PERSONAL_SPLIT, example="configs/fedrep.yaml",
          summary="FedRep: train the personal head with the body frozen, then the shared body (Collins et al. 2021)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedRep(PartialAveraging):
    """``head_epochs`` of training the personal part with the shared part frozen, then ``body_epochs`` of training
    the shared part with the new personal part frozen (defaults: FedSLR spec D22, 1 and 2 epochs; the DFedAlt
    spec uses 10 and 5), each phase over shuffles of the client's data in minibatches of ``batch_size``.
    ``head_lr`` (default: ``lr``) is the personal phase's learning rate."""

    private_steps = False  # its phases run epochs of shuffled batches, which the accountant cannot model
    local: LocalTraining = local_training("lr", "lr_decay", "optimizer", "momentum", "weight_decay", "clip_norm",
                                          "batch_size")
    head_epochs: int = option(1, "epochs of the personal phase (the head, the body frozen) per round", at_least(0))
    body_epochs: int = option(2, "epochs of the shared phase (the body, the new head frozen) per round", at_least(0))
    head_lr: float | None = option(None, "learning rate of the personal phase (null: the client lr)",
                                   greater_than(0))

    def plan(self) -> BatchPlan:
        """The body phase's batches (the engine sizes the batch width and the loops' unroll from them)."""
        return BatchPlan(batch_size=self.local.batch_size, epochs=self.body_epochs)

    def steps_per_round(self, n_max: int) -> int:
        per_epoch = BatchPlan(batch_size=self.local.batch_size, epochs=1).num_steps(n_max)
        return (self.head_epochs + self.body_epochs) * per_epoch

    def local_update(self, params, inp: ClientInput):
        u, v = self.split(params)
        k_head, k_body = jax.random.split(inp.key)
        loss = inp.model.loss
        local = self.local
        v, _ = local.personal_phase(lambda v_, b: loss(partition.merge(u, v_), b), v, inp, k_head,
                                    epochs=self.head_epochs, lr=self.head_lr)
        u, body_loss = local.train(lambda u_, b: loss(partition.merge(u_, v), b), u, inp, key=k_body,
                                   plan=self.plan())
        return partition.merge(u, v), body_loss


@register("lg_fedavg", family=PERSONAL_SPLIT, example="configs/lg_fedavg.yaml",
          summary="LG-FedAvg: personal body, shared head averaged by the server (Liang et al. 2020)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LGFedAvg(PartialAveraging):
    """FedPer with the roles swapped: the body is personal and the head shared (no FedAvg warm start, FedSLR D25)."""

    private_steps = True  # joint training through LocalTraining with its plan
    personal: str = with_default(PartialModel, "personal", NOT_HEAD)
    local: LocalTraining = local_training()
