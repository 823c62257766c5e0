"""Partial personalization: a shared part averaged by the server and a personal part that never leaves the client.

The split is a regex over parameter paths (``personal``; default ``'head'``, the models' last Dense layer), turned
into a leaf mask by :func:`fljax.ops.partition.mask_from_paths`. Each client stores its whole model (u_i, v_i);
a never-sampled client keeps the shared initialisation w_0.

* FedPer (Arivazhagan et al. 2019): selected client i trains (u, v_i) jointly from (u_t, v_i); server
  u_{t+1} = Σ_{i∈S_t} p_i u_i.
* FedRep (Collins et al. 2021): selected client i first trains v_i with u_t frozen (``head_epochs``), then u with
  the new v_i frozen (``body_epochs``); the server averages bodies only.
* LG-FedAvg (Liang et al. 2020): the roles are swapped — the body is personal, the head shared.

Only the shared part is communicated (down and up). Evaluation uses the stored (u_i, v_i) (``eval_body='stored'``,
the client's model after its latest local training) or the current server body with the client's own personal part
(``eval_body='server'``).
"""
from __future__ import annotations

import dataclasses

import jax

from fljax import tree
from fljax.algorithms.base import Centralized, ClientResult
from fljax.algorithms.local_training import LocalSGD
from fljax.data.batching import BatchPlan
from fljax.ops import partition

__all__ = ["FedPer", "FedRep", "LGFedAvg"]

NOT_HEAD = "^(?!.*head)"  # every leaf whose path does not contain 'head'


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedPer(Centralized, LocalSGD):
    name = "fedper"
    summary = "FedPer: shared body averaged by the server, personal head kept by each client (Arivazhagan et al. 2019)"
    personal: str = "head"
    eval_body: str = "stored"

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        self.validate_local()
        if self.eval_body not in ("stored", "server"):
            raise ValueError(f"eval_body must be 'stored' or 'server', got {self.eval_body!r}.")

    def shared_mask(self, params):
        """Leaf mask of the shared part u (the complement of ``personal``)."""
        return partition.mask_not(partition.mask_from_paths(params, self.personal))

    def split(self, params):
        """(shared u, personal v), each with None in the other's slots."""
        return partition.split(params, self.shared_mask(params))

    def init(self, ctx):
        params = self.model.init(self.init_key(ctx))
        shared = jax.tree.leaves(self.shared_mask(params))
        if all(shared) or not any(shared):
            raise ValueError(f"personal={self.personal!r} selects {'no' if all(shared) else 'every'} parameter of "
                             f"{self.model.name}; choose a regex matching part of it (e.g. 'head').")
        return {"params": params}, {"params": tree.broadcast_clients(params, ctx.num_clients)}

    def broadcast(self, server):
        return self.split(server["params"])[0]

    def local_update(self, params, train, key, round_):
        """Joint local training of (u, v_i)."""
        return self.train(self.model.loss, params, train, key, round_, self.unroll)

    def client_update(self, shared, per_client) -> ClientResult:
        body, round_ = shared
        state, train, key = per_client
        params = partition.merge(body, self.split(state["params"])[1])
        params, loss = self.local_update(params, train, key, round_)
        return ClientResult(state={"params": params}, upload=self.split(params)[0], weight=train.count,
                            metrics={"train_loss": loss})

    def server_update(self, ctx, server, clients, cohort, result):
        mean = tree.weighted_mean_clients(result.upload, self.aggregation_weights(result))
        return {"params": partition.merge(mean, server["params"])}

    def eval_shared(self, server):
        return self.broadcast(server)

    def personal_params(self, shared, client_state, train, key):
        if self.eval_body == "stored":
            return client_state["params"]
        return partition.merge(shared, self.split(client_state["params"])[1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedRep(FedPer):
    """``head_epochs`` of training the personal part with the shared part frozen, then ``body_epochs`` of training
    the shared part with the new personal part frozen (defaults: FedSLR spec D22, 1 and 2 epochs; the DFedAlt
    spec uses 10 and 5). ``head_lr`` (default: ``lr``) is the personal phase's learning rate."""

    name = "fedrep"
    summary = "FedRep: train the personal head with the body frozen, then the shared body (Collins et al. 2021)"
    head_epochs: int = 1
    body_epochs: int = 2
    head_lr: float | None = None

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if self.head_epochs < 0 or self.body_epochs < 0:
            raise ValueError(f"head_epochs and body_epochs must be >= 0, got {self.head_epochs}, {self.body_epochs}.")
        if self.head_lr is not None and not self.head_lr > 0:
            raise ValueError(f"head_lr must be > 0, got {self.head_lr}.")

    def steps_per_round(self, n_max: int) -> int:
        per_epoch = BatchPlan(batch_size=self.batch_size, epochs=1).num_steps(n_max)
        return (self.head_epochs + self.body_epochs) * per_epoch

    def local_update(self, params, train, key, round_):
        u, v = self.split(params)
        k_head, k_body = jax.random.split(key)
        plan = lambda e: BatchPlan(batch_size=self.batch_size, epochs=e)
        head_sgd = self if self.head_lr is None else dataclasses.replace(self, lr=self.head_lr)
        v, _ = head_sgd.train(lambda v_, b: self.model.loss(partition.merge(u, v_), b), v, train, k_head, round_,
                              self.unroll, plan=plan(self.head_epochs))
        u, loss = self.train(lambda u_, b: self.model.loss(partition.merge(u_, v), b), u, train, k_body, round_,
                             self.unroll, plan=plan(self.body_epochs))
        return partition.merge(u, v), loss


@dataclasses.dataclass(frozen=True, kw_only=True)
class LGFedAvg(FedPer):
    """FedPer with the roles swapped: the body is personal and the head shared (no FedAvg warm start, FedSLR D25)."""

    name = "lg_fedavg"
    summary = "LG-FedAvg: personal body, shared head averaged by the server (Liang et al. 2020)"
    personal: str = NOT_HEAD
