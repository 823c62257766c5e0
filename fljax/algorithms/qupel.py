"""QuPeL (Ozkara et al., "QuPeL: quantized personalization with applications to federated learning", 2021; ref. [28]
of the QuPeD paper): QuPeD's client loop with an l2 coupling to the global model in place of distillation (QuPeD
spec §10, P1). Objective of client i (QuPeD App. A.2, P → ∞)::

    F_i(x, c, w) = f_i(x) + f_i(Q_c(x)) + λ R(x, c) + (λ_p/2)‖x − w‖²

One iteration t of client i ∈ K_t on one minibatch ξ (lines of QuPeD's Algorithm 2)::

    10  g = ∇CE(x_i; ξ) + λ_p (x_i − w_i) + wd·x_i
    11  x_i ← prox_x(x_i − η₁g; c_i, th = λ(e)η₁/2) on quantized leaves; x_i − η₁g elsewhere
    12  h = ∇_c CE(Q_c(x_i); ξ) at c = c_i                                   (the coupling does not reach c)
    13  c_i ← sort(prox_c(c_i − η₂h; assignments of the new x_i under the old c_i))
    14  w_i ← w_i − η₃ λ_p (w_i − x_i)                                       η₃ constant ("same as pFedMe")
    16-17 (every τ iterations) w ← (1/K) Σ_{i∈K_t} w_i

D30's option ``coupling='quantized'`` couples Q_c(x) instead of x (the authors' hook): the penalty becomes
(λ_p/2)‖Q_c(x) − w‖², so line 10 keeps λ_p(x − w) on FP leaves only (the x-gradient through Q_c vanishes), line 12
adds ∇_c (λ_p/2)‖Q_c(x) − w‖² (the coupling reaches the centers) and line 14 pulls w_i toward Q_c(x_i). The
fine-tuning phase is QuPeD's, on F_i at x̂ = Q_c(x) (where both couplings agree); FP clients run line 10 as plain
SGD. Personal and global models share one architecture (the coupling subtracts them).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from fljax import tree
from fljax.algorithms.families import QUANTIZED
from fljax.algorithms.registry import register
from fljax.algorithms.quped import QuantizedAveraging
from fljax.models.model import masked_cross_entropy
from fljax.options import between, greater_than, option

__all__ = ["QuPeL"]


@register("qupel", family=QUANTIZED, example="configs/qupel.yaml",
          summary="QuPeL: quantized personal models with an l2 coupling to the global model (Ozkara et al., QuPeD's P1)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class QuPeL(QuantizedAveraging):
    """QuPeD's client loop (:class:`~fljax.algorithms.quped.QuantizedClients`) tied to the global model by the l2
    coupling instead of distillation: ``lam_p`` its weight, ``global_lr`` η₃ (constant), ``coupling`` (D30). w never
    sees data, so QuPeD's distillation options do not exist here; ``momentum`` (D16) applies to x only."""

    mixed_architectures = False

    lam_p: float = option(0.2, "λ_p: weight of the l2 coupling (λ_p/2)‖x − w‖²", between(0, 1))
    global_lr: float = option(0.5, "η₃: the constant step of line 14, w_i ← w_i − η₃ λ_p (w_i − x_i)",
                              greater_than(0))
    coupling: Literal["x", "quantized"] = option("x", "D30: couple x, or its quantization Q_c(x) ('quantized')")

    def lam_p_value(self) -> float:
        return self.lam_p

    def link(self, gmodel, w, batch):
        """The coupling target: w_i itself (no teacher pass)."""
        return w, None

    def penalty(self, params, w, lam_p):
        """(λ_p/2)‖params − w‖²."""
        return 0.5 * lam_p * tree.sq_norm(tree.sub(params, w))

    def personal_loss(self, model, params, w, batch, lam_p):
        """CE(params; ξ) + (λ_p/2)‖params − w‖²."""
        ce = masked_cross_entropy(model.apply(params, batch.x), batch.y, batch.mask)
        return ce + self.penalty(params, w, lam_p)

    def x_loss(self, model, spec, c, w, batch, lam_p):
        """Line 10: CE(x) + (λ_p/2)‖x − w‖², or with D30's option CE(x) + (λ_p/2)‖Q_c(x) − w‖²."""
        if self.coupling == "x" or spec is None:
            return super().x_loss(model, spec, c, w, batch, lam_p)
        return lambda v: (masked_cross_entropy(model.apply(v, batch.x), batch.y, batch.mask)
                          + self.penalty(self.quantize(spec, v, c), w, lam_p))

    def center_loss(self, model, q, w, batch, lam_p):
        """Line 12 at q = Q_c(x): CE(q), plus (λ_p/2)‖q − w‖² with D30's option."""
        if self.coupling == "x":
            return masked_cross_entropy(model.apply(q, batch.x), batch.y, batch.mask)
        return self.personal_loss(model, q, w, batch, lam_p)

    def global_step(self, model, gmodel, w, wbuf, link, students, batch, eta1, lam_p):
        """Line 14: w_i ← w_i − η₃ λ_p (w_i − s), s = x_i (or Q_c(x_i) with D30's option; x̂_i once fine-tuning)."""
        s = students[0] if self.coupling == "x" else students[-1]
        return tree.axpy(-self.global_lr * lam_p, tree.sub(w, s), w), wbuf
