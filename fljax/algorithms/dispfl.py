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
from typing import Literal

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import ClientInput, ClientResult
from fljax.algorithms.decentralized import BASELINE, Decentralized
from fljax.algorithms.families import DECENTRALIZED
from fljax.algorithms.local_training import LocalTraining, local_training, train_steps
from fljax.algorithms.registry import register
from fljax.data.batching import Batch
from fljax.engine.context import INIT
from fljax.ops import partition, sparsity
from fljax.options import at_least, between, interval, option

__all__ = ["DisPFL"]


def _apply_mask(params, mask):
    return jax.tree.map(lambda p, m: jnp.where(m, p, 0).astype(p.dtype), params, mask)


@register("dispfl", family=DECENTRALIZED, example="configs/dispfl.yaml",
          summary="DisPFL: per-client sparse masks, prune/regrow, mask-aware neighbour averaging (Dai et al. 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DisPFL(Decentralized):
    """Local training and topology as :class:`~fljax.algorithms.decentralized.DFedAvgM`'s (no SAM); sparse masks as
    above. The communication is the mask-aware average over the 0/1 adjacency, in dense form."""

    local: LocalTraining = local_training(**BASELINE)
    density: float = option(0.5,
                            "overall fraction of kernel entries each client's sparse mask keeps (ERK or uniform per "
                            "layer)", interval(0, 1, "(]"))
    layer_density: Literal["erk", "uniform"] = option("erk", "per-layer densities: 'erk' (Erdős–Rényi-kernel) or "
                                                             "'uniform'")
    anneal_factor: float = option(0.5, "fraction a_0 of active entries pruned and regrown at round 0 (cosine-annealed)",
                                  between(0, 1))
    anneal_rounds: int = option(500, "rounds over which the prune/regrow fraction anneals to 0", at_least(1))
    regrow: Literal["random", "gradient"] = option(
        "random", "'random' regrowth or 'gradient' (largest |∇F_i| on the client's train split)")

    def init_clients(self, ctx, params) -> dict:
        densities = sparsity.layer_densities(jax.tree.map(lambda x: x[0], params), self.density, self.layer_density)
        # every client's masks, planned against the initialisation's memory budget (jitted: one compile when the
        # initialisation runs eagerly, under the loop executor)
        draw = lambda _, kp: sparsity.random_masks(jax.random.fold_in(kp[0], 1), kp[1], densities)  # noqa: E731
        masks = jax.jit(lambda k, p: ctx.map_init(draw, None, (k, p)))(
            ctx.client_keys(jnp.arange(ctx.num_clients), INIT), params)
        return {"params": _apply_mask(params, masks), "mask": masks}

    def client_update(self, inp: ClientInput) -> ClientResult:
        """Masked local training, then prune/regrow; the message is the trained sparse model with its mask."""
        mask, train = inp.state["mask"], inp.train
        local = self.local
        opt = local.client_optimizer(local.lr_at(inp.round))
        params, loss = train_steps(inp.model.loss, inp.state["params"], inp, local.plan(), opt,
                                   post=lambda p: _apply_mask(p, mask))
        scores = None
        if self.regrow == "gradient":
            scores = jax.grad(inp.model.loss)(params, Batch(train.x, train.y, train.mask))
        fraction = sparsity.anneal_fraction(inp.round, self.anneal_rounds, self.anneal_factor)
        new_mask = sparsity.prune_regrow(params, mask, fraction, jax.random.fold_in(inp.key, 1), scores)
        density = partition.count(mask) / tree.size(params)
        return ClientResult(state={"params": params, "mask": new_mask}, upload={"params": params, "mask": mask},
                            weight=train.count, metrics={"train_loss": loss, "density": density})

    def aggregate(self, mixing, result: ClientResult) -> dict:
        m = mixing.W.shape[0]
        adjacency = (mixing.W > 0) | jnp.eye(m, dtype=bool)
        mean = partition.masked_average(result.upload["params"], result.upload["mask"], adjacency)
        return {"params": _apply_mask(mean, result.state["mask"]), "mask": result.state["mask"]}

    def message_bytes(self, result: ClientResult):
        params = result.upload["params"]
        kept = partition.count(result.upload["mask"]) / tree.num_clients(params)
        return 4.0 * kept + tree.size(params) / tree.num_clients(params) / 8
