"""DisPFL (Dai et al. 2022): decentralized personalized FL with per-client sparse masks (DFedAlt spec §7, D24).

Client i holds a sparse model w_i = w_i ⊙ M_i. Initially M_i is a random mask with ERK layer densities at overall
``density`` (0.5) over the kernels (biases and normalisation parameters stay dense), drawn per client, and
w_i = w⁰ ⊙ M_i from one dense initialisation. One round t, every client:

    z_i ← ``local_epochs`` of momentum SGD from w_i, re-applying w ← w ⊙ M_i after every step
    M_i' ← prune the ⌈a_t·nnz⌉ active entries of smallest |z_i| per kernel, regrow as many inactive ones at random
           (``regrow='gradient'``: by largest |∇F_i(z_i)| on the client's whole train split), with the cosine
           anneal a_t = (``anneal_factor``/2)(1 + cos(π t / ``anneal_rounds``))
    w_i ← (Σ_{l ∈ N_t(i) ∪ {i}} z_l / max(1, Σ_{l ∈ N_t(i) ∪ {i}} M_l)) ⊙ M_i'     (entrywise; W_t's weights unused)

The average counts, per coordinate, the neighbours whose trained mask M_l holds it, so a coordinate that client i
has just regrown takes its neighbours' mean value (0 when none holds it, the regrowth's zero initialisation).
The headline personal model is the post-local z_i (``eval_point='local'``). Messages are sparse: the kept values
(4 bytes each) plus a 1-bit mask.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.decentralized import DFedAvgM
from fljax.algorithms.local_training import run_steps
from fljax.data.batching import Batch
from fljax.engine.context import INIT
from fljax.ops import partition, sparsity

__all__ = ["DisPFL"]


def _apply_mask(params, mask):
    return jax.tree.map(lambda p, m: jnp.where(m, p, 0).astype(p.dtype), params, mask)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DisPFL(DFedAvgM):
    """Local training settings and topology as :class:`DFedAvgM` (no SAM); sparse masks as above."""

    name = "dispfl"
    summary = "DisPFL: per-client sparse masks, prune/regrow, mask-aware neighbour averaging (Dai et al. 2022)"
    density: float = 0.5
    layer_density: str = "erk"
    anneal_factor: float = 0.5
    anneal_rounds: int = 500
    regrow: str = "random"

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1], got {self.density}.")
        if self.layer_density not in ("erk", "uniform"):
            raise ValueError(f"layer_density must be 'erk' or 'uniform', got {self.layer_density!r}.")
        if not 0 <= self.anneal_factor <= 1:
            raise ValueError(f"anneal_factor must be in [0, 1], got {self.anneal_factor}.")
        if self.anneal_rounds < 1:
            raise ValueError(f"anneal_rounds must be >= 1, got {self.anneal_rounds}.")
        if self.regrow not in ("random", "gradient"):
            raise ValueError(f"regrow must be 'random' or 'gradient', got {self.regrow!r}.")
        if self.gossip_form == "gather":
            raise ValueError("dispfl averages over the 0/1 adjacency in dense form; use gossip_form='dense' or 'auto'.")
        if self.rho:
            raise ValueError("dispfl has no SAM variant; leave rho at 0.")

    def init_clients(self, ctx, params) -> dict:
        densities = sparsity.layer_densities(jax.tree.map(lambda x: x[0], params), self.density, self.layer_density)
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(ctx.client_keys(jnp.arange(ctx.num_clients), INIT))
        masks = jax.jit(jax.vmap(lambda k, p: sparsity.random_masks(k, p, densities)))(keys, params)  # one compile
        return {"params": _apply_mask(params, masks), "mask": masks}

    def client_update(self, round_, per_client):
        state, train, key = per_client
        mask = state["mask"]
        opt = self.client_optimizer(self.lr_at(round_))
        sgd = self.sgd_step(self.model.loss, opt)

        def masked_step(carry, batch, k):
            (params, opt_state), loss = sgd(carry, batch, k)
            return (_apply_mask(params, mask), opt_state), loss

        (params, _), loss = run_steps(masked_step, (state["params"], opt.init(state["params"])), train, self.plan(),
                                      key, self.unroll)
        scores = None
        if self.regrow == "gradient":
            scores = jax.grad(self.model.loss)(params, Batch(train.x, train.y, train.mask))
        fraction = sparsity.anneal_fraction(round_, self.anneal_rounds, self.anneal_factor)
        new_mask = sparsity.prune_regrow(params, mask, fraction, jax.random.fold_in(key, 1), scores)
        density = partition.count(mask) / tree.size(params)
        return {"params": params, "mask": new_mask, "trained_mask": mask}, {"train_loss": loss, "density": density}

    def aggregate(self, mixing, local: dict) -> dict:
        m = mixing.W.shape[0]
        adjacency = (mixing.W > 0) | jnp.eye(m, dtype=bool)
        mean = partition.masked_average(local["params"], local["trained_mask"], adjacency)
        return {"params": _apply_mask(mean, local["mask"]), "mask": local["mask"]}

    def message_bytes(self, local: dict):
        kept = partition.count(local["trained_mask"]) / tree.num_clients(local["params"])
        return 4.0 * kept + tree.size(local["params"]) / tree.num_clients(local["params"]) / 8
