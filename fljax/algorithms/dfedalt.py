"""DFedAlt and DFedSalt (Shi et al. 2023, "Towards More Suitable Personalization in Federated Learning via
Decentralized Partial Model Training"): decentralized partial personalization by alternating updates.

Client i's model is w_i = (u_i, v_i) with a shared body u_i and a personal head v_i (``personal``: a path regex,
default 'head', the models' last Dense layer; spec §3 table, D16). One round t, every client (Algorithm 1):

    v ← v_i^t;  K_v = ``personal_epochs`` epochs of momentum SGD at η_v = ``personal_lr`` on ∇_v F_i(u_i^t, v; ξ)
    u ← u_i^t;  K_u = ``local_epochs`` epochs of momentum SGD at η_u = ``lr`` on ∇_u F_i(u, v_i^{t+1}; ξ)
    z_i^t = u;   u_i^{t+1} = Σ_l W_t[i,l] z_l^t   (the gossip of :class:`Decentralized`; v_i^{t+1} stays private)

Each phase starts a fresh optimizer (momentum buffer zeroed, D9): clip the gradient to ``clip_norm`` (D17), add
``weight_decay``·param (D7), then SGD with ``momentum`` (PyTorch semantics). DFedSalt replaces a phase's gradient
by the SAM gradient ∇F(part + e) with e = ρ·g/(‖g‖₂ + 1e-12), g the phase's own gradient on the same batch and one
global norm over that part's leaves (D10); weight decay is added at the unperturbed point. ``sam_on`` places SAM as
in the paper's Table 3: 'none' = DFedAlt (Option I), 'u' = DFedSalt-U (Option II, the paper's DFedSalt), 'v' =
DFedSalt-V, 'uv' = DFedSalt-UV; ρ = ``rho`` (0.7) for all.

Keys: the shared phase uses the client's round key and the personal phase a key folded from it, so DFedAlt with
nothing personal and ``personal_epochs=0`` is exactly DFedAvgM (spec §9, claim 5).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from fljax.algorithms.base import ClientInput, ClientResult
from fljax.algorithms.decentralized import BASELINE, Gossip
from fljax.algorithms.families import DECENTRALIZED
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.data.batching import BatchPlan
from fljax.errors import OptionError
from fljax.ops import partition
from fljax.options import at_least, greater_than, option, with_default

__all__ = ["DFedAlt", "DFedSalt"]


@register("dfedalt", family=DECENTRALIZED, example="configs/dfedalt.yaml",
          summary="DFedAlt: personal head then shared body each round, gossip of the body only (Shi et al. 2023)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DFedAlt(Gossip):
    """Defaults are the paper's CIFAR settings (spec §4): η_u = 0.1, η_v = 0.001, momentum 0.9, weight decay 5e-3,
    clipping at 10, batch 128, K_u = 5 epochs (``local_epochs``; ``local_steps`` minibatches when it is null),
    K_v = 1 epoch (Dirichlet; the paper uses 5 on Pathological), ``random_k`` with k = 10."""

    local: LocalTraining = local_training(**BASELINE)
    personal: str = option("head", "path regex of the personal part v_i (default 'head', the last Dense layer)")
    personal_epochs: int = option(1, "K_v: epochs of the personal phase per round", at_least(0))
    personal_lr: float = option(0.001, "η_v: learning rate of the personal phase", greater_than(0))
    sam_on: Literal["none", "u", "v", "uv"] = option(
        "none", "where SAM applies: 'none' (DFedAlt), 'u' (shared body, DFedSalt), 'v' or 'uv'")
    rho: float = option(0.7, "SAM radius ρ of the perturbation e = ρ·g/‖g‖", at_least(0))

    def shared_mask(self, params):
        return partition.mask_not(partition.mask_from_paths(params, self.personal))

    def init_clients(self, ctx, params) -> dict:
        if not any(jax.tree.leaves(self.shared_mask(params))):
            raise OptionError("personal", partition.selection_problem(self.personal, params, "every"))
        return {"params": params}

    def steps_per_round(self, n_max: int) -> int:
        return self.plan().num_steps(n_max) + BatchPlan(batch_size=self.local.batch_size,
                                                        epochs=self.personal_epochs).num_steps(n_max)

    def rho_for(self, part: str) -> float:
        """SAM radius of the 'u' or 'v' phase (0: plain gradient)."""
        return self.rho if self.sam_on in (part, "uv") else 0.0

    def client_update(self, inp: ClientInput) -> ClientResult:
        u, v = self.split(inp.state["params"])
        loss = inp.model.loss
        v_loss = jnp.zeros(())
        if self.personal_epochs > 0:  # personal phase: u frozen at u_i^t
            v, v_loss = self.local.personal_phase(lambda v_, b: loss(partition.merge(u, v_), b), v, inp,
                                                  jax.random.fold_in(inp.key, 1), epochs=self.personal_epochs,
                                                  lr=self.personal_lr, sam_rho=self.rho_for("v"))
        # shared phase: v frozen at the fresh v_i^{t+1}
        u, u_loss = self.local.train(lambda u_, b: loss(partition.merge(u_, v), b), u, inp,
                                     sam_rho=self.rho_for("u"))
        return ClientResult(state={"params": partition.merge(u, v)}, upload=u, weight=inp.train.count,
                            metrics={"train_loss": u_loss, "personal_loss": v_loss})


@register("dfedsalt", family=DECENTRALIZED, example="configs/dfedsalt.yaml",
          summary="DFedSalt: DFedAlt with sharpness-aware (SAM) updates of the shared body (Shi et al. 2023)",
          untuned=("rho", "its SAM radius ρ = {value} (the paper's, for CNNs on CIFAR) is too large for a small model; "
                          "try algo.rho=0.01 (fljax run --algorithm dfedsalt --set algo.rho=0.01)"))
@dataclasses.dataclass(frozen=True, kw_only=True)
class DFedSalt(DFedAlt):
    """DFedSalt: DFedAlt with SAM (ρ = 0.7) in the shared phase (``sam_on='u'``; 'v' and 'uv' are Table 3's
    variants)."""

    sam_on: Literal["none", "u", "v", "uv"] = with_default(DFedAlt, "sam_on", "u")
