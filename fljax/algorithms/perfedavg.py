"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg on the MAML objective F_i(w) = f_i(w − α∇f_i(w)).

Selected client i, round t, from w ← w_t; every local step draws fresh, disjoint batches D, D′ (and D″):
    FO (Algorithm 1 with the first-order estimate):   w̃ = w − α∇f_i(w; D);   w ← w − β∇f_i(w̃; D′)
    HF (Hessian-free, Eq. (9)):                       w ← w − β(I − α∇²f_i(w; D″))∇f_i(w̃; D′)
with an exact Hessian-vector product (``hvp_mode='exact'``, forward-over-reverse) or a central difference
(``'fd'``); ``'none'`` is FO. The server takes the mean of the w_i. Client i is evaluated after one α-step on one
training batch from w_T. α = 0.01 (inner, fine-tune) and β = 0.001 (outer) as in the FedSLR paper; they are
fields of their own (not the ``lr`` of other algorithms; PFLlib silently sets β := lr), constant unless
``lr_decay`` < 1 (then both decay as ·lr_decay^t, D20 option). f_i includes wd/2‖·‖².

Batches: each step consumes 2 (FO) or 3 (HF) batches of ``batch_size``: one minibatch of 2B (3B) from the epoch's
shuffle, split by interleaving rows (D = rows 0, 2, 4, …; D′ = rows 1, 3, 5, …), so ``local_epochs`` passes take
E·⌈n_i/(2B)⌉ steps (D20) and D ≠ D′ always.

``batches='support_query'`` (AugFL spec §8, for data with support/query sets, ``partition: meta_pairs``): each of
``local_epochs`` steps uses D = 𝒟_i^s, D′ = 𝒟_i^q, D″ = 𝒟_i^s, all full batch, and the evaluation adapts with one
α-step on the full support set; HF then uses the same block as AugFL's ``fd`` direction ĝ.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.families import PERSONAL_REGULARISED
from fljax.algorithms.registry import register
from fljax.algorithms.base import Aggregating, ClientInput, ClientResult
from fljax.algorithms.local_training import run_steps
from fljax.data.batching import Batch, BatchPlan, gather_batch
from fljax.ops import meta
from fljax.options import at_least, greater_than, interval, one_of, option

__all__ = ["PerFedAvg"]


@register("perfedavg", family=PERSONAL_REGULARISED, example="configs/perfedavg.yaml",
          summary="Per-FedAvg: FedAvg on the one-step MAML objective, FO or Hessian-free (Fallah et al. 2020)",
          untuned=("beta", "its outer step β = {value} (the paper's) moves the model little in {rounds} rounds; "
                          "try algo.beta=0.1 (fljax run --algorithm perfedavg --set algo.beta=0.1)"))
@dataclasses.dataclass(frozen=True, kw_only=True)
class PerFedAvg(Aggregating):
    alpha: float = option(0.01,
                          "inner (adaptation) step size α of w̃ = w − α∇f_i(w; D), also the evaluation's one "
                          "fine-tuning step", greater_than(0))
    beta: float = option(0.001, "outer step size β of the meta-update w ← w − β∇f_i(w̃; D′)", greater_than(0))
    hvp_mode: str = option("none",
                           "'none' (first-order), 'exact' (forward-over-reverse HVP) or 'fd' (central difference) for "
                           "the Hessian term", one_of(meta.HVP_MODES))
    fd_delta: float = option(1e-3, "finite-difference width δ of hvp_mode='fd'", greater_than(0))
    lr_decay: float = option(1.0, "α and β at round t are multiplied by lr_decay^t (1: constant)",
                             interval(0, 1, "(]"))
    weight_decay: float = option(0.0, "coupled L2 weight decay wd: f_i includes wd/2‖w‖²", at_least(0))
    batch_size: int = option(20, "rows per batch B; one step draws 2B (FO) or 3B (HF) rows split into D, D′ (, D″)",
                             at_least(1))
    local_epochs: int = option(2, "passes over the client's data per round (E·⌈n_i/(2B)⌉ steps)", at_least(0))
    batches: Literal["minibatch", "support_query"] = option(
        "minibatch", "'minibatch' (disjoint batches of the epoch's shuffle) or 'support_query' (D, D′ = support, "
                     "query sets)")

    @property
    def batches_per_step(self) -> int:
        return 2 if self.hvp_mode == "none" else 3

    def plan(self) -> BatchPlan:
        return BatchPlan(batch_size=self.batches_per_step * self.batch_size, epochs=self.local_epochs)

    def rates(self, round_):
        decay = jnp.power(jnp.float32(self.lr_decay), round_)
        return self.alpha * decay, self.beta * decay

    def objective(self, model, params, batch):
        """f_i(params; batch) = CE + (wd/2)‖params‖²."""
        return model.loss(params, batch) + 0.5 * self.weight_decay * tree.sq_norm(params)

    def init(self, ctx):
        return {"params": ctx.model.init(self.init_key(ctx))}, {}

    def meta_step(self, model, w, batch: Batch, alpha, beta):
        """One Per-FedAvg step on the interleaved sub-batches D, D′ (, D″)."""
        n = self.batches_per_step
        d, d1, d2 = [Batch(batch.x[j::n], batch.y[j::n], batch.mask[j::n]) for j in range(n)] + [None] * (3 - n)
        return self.meta_step_on(model, w, d, d1, d2, alpha, beta)

    def meta_step_on(self, model, w, d: Batch, d1: Batch, d2: Batch | None, alpha, beta):
        """One Per-FedAvg step with inner batch D, outer batch D′ and Hessian batch D″."""
        f = functools.partial(self.objective, model)
        w_tilde = meta.adapt(f, w, d, alpha)
        loss, r = jax.value_and_grad(f)(w_tilde, d1)
        if self.hvp_mode != "none":
            r = tree.axpy(-alpha, meta.hvp(f, w, r, d2, mode=self.hvp_mode, delta=self.fd_delta), r)
        return tree.axpy(-beta, r, w), loss

    def client_update(self, inp: ClientInput) -> ClientResult:
        alpha, beta = self.rates(inp.round)
        if self.batches == "support_query":
            support, query = inp.train.support_batch(), inp.train.query_batch()
            step = lambda w, _: self.meta_step_on(inp.model, w, support, query, support, alpha, beta)  # noqa: E731
            w, losses = jax.lax.scan(step, inp.down, None, length=self.local_epochs)
            return ClientResult(state=inp.state, upload=w, weight=inp.train.count,
                                metrics={"train_loss": jnp.mean(losses)})
        step = lambda w, batch, k: self.meta_step(inp.model, w, batch, alpha, beta)  # noqa: E731
        w, loss = run_steps(step, inp.down, inp.train, self.plan(), inp.key, inp.unroll)
        return ClientResult(state=inp.state, upload=w, weight=inp.train.count, metrics={"train_loss": loss})

    def server_step(self, ctx, server, aggregate):
        return {"params": aggregate}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        """One α-step (round-0 α) on one training batch of ``batch_size`` from w_T (``batches='support_query'``: on
        the full support set)."""
        if self.batches == "support_query":
            return meta.adapt(functools.partial(self.objective, inp.model), inp.down, inp.train.support_batch(),
                              self.alpha)
        train = inp.train
        idx, mask, _ = BatchPlan(batch_size=self.batch_size, steps=1).schedule(inp.key, train.count, train.n_min,
                                                                               train.n_max)
        batch = gather_batch(train.x, train.y, idx[0], mask[0])
        return meta.adapt(functools.partial(self.objective, inp.model), inp.down, batch, self.alpha)
