"""QuPeD (Ozkara, Singh, Data, Diggavi, NeurIPS 2021): quantized personalization via distillation, and Algorithm 1 as
quantized Local Training. Spec: ``docs/quped.md``; equation numbers are the paper's, ``D#`` the spec's
decisions (each alternative is a hyperparameter).

Client i holds a personal model x_i of its own architecture (its client group's model, :mod:`fljax.engine.population`),
one sorted center vector c per quantized leaf (m = 2^b centers; FP clients have none) and, during a round, a copy w_i
of the global model w (the simulation's model, FP). Personalized objective (eqs. 2-3, P → ∞, D2)::

    F_i = (1 − λ_p)[f_i(x) + f_i(Q_c(x))] + λ R(x, c) + λ_p [f_KD(x, w) + f_KD(Q_c(x), w)],
    R(x, c) = ½ Σ_k min_j |x_k − c_j|,   f_KD(x, w) = KL(s(w) ‖ s(x)).

Algorithm 2, one iteration t of client i ∈ K_t on one minibatch ξ (epoch e = 1 + ⌊t/I⌋, D10)::

    z_w, vjp_w = vjp(logits(·; ξ), w_i)                                  one teacher pass, reused by lines 10-14
    10  g = (1 − λ_p) ∇CE(x_i) + λ_p ∇KL(sg z_w ‖ x_i) + wd·x_i            Q-terms vanish on quantized leaves (D3)
    11  x_i ← prox_x(x_i − η₁g; c_i, th = λ(e)η₁/2)  on quantized leaves (eqs. 8-11); x_i − η₁g elsewhere
    12  h = ∇_c[(1 − λ_p) CE(Q_c(x_i)) + λ_p KL(sg z_w ‖ Q_c(x_i))] at c = c_i     (segment-sum through c[sg idx])
    13  c_i ← sort(prox_c(c_i − η₂h; assignments of the new x_i under the old c_i))   (linearised c-prox, D1)
    14  g_z = ∇_z[KL(z ‖ sg logits(x_i)) + KL(z ‖ sg logits(Q_{c_i}(x_i)))] at z = z_w;
        w_i ← w_i − η₃(λ_p vjp_w(g_z) + wd·w_i)                           reverse-KL steps, η₃ = η₁(e) (D15)
    16-17 (every τ iterations) w ← (1/K) Σ_{i∈K_t} w_i                      post-update copies, unweighted (D12)

QuPeD (FP) drops c, R and the prox: line 11 is x_i − η₁g and line 14 keeps the single term KL(z ‖ sg logits(x_i))
(D20). Fine-tuning phase (§5.1, last ``finetune_epochs`` epochs, quantized clients): at the switch idx ← assign(x, c)
is frozen and x ← c[idx] on quantized leaves; afterwards the personal model is x̂ = (u, c[idx]) and one step is
(g_u, h) = ∇_{(u,c)}[(1 − λ_p)CE(x̂) + λ_p KL(sg z_w ‖ x̂)], u ← u − η₁(g_u + wd·u), c ← c − η₂h (no prox, no sort,
D18), line 14 with both students x̂ (D19). Unsampled clients change nothing (D13); the switch is applied when a
client next computes, which equals switching every client at the first iteration of the phase (its x, c have not
moved since). The deployed model is x̂_i = Q_{c_i}(x_i).

Schedules (§6, :mod:`fljax.ops.schedule`): η₁(e) = η₁,₀γ^(e−1), λ(e) = κe (1-bit: κe/γ^e), κ from the r-rule
S = Σ_{t<T_ft} λη₁/2 = r·σ₀ unless given, η₂ = 1e-4·20,160/l̄ unless given. Algorithm 1 per client
(:class:`QuantizedLocal`, "Local Training (b bits)") is the same client loop with λ_p = 0 and no server.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.algorithms.families import NO_COMMUNICATION, QUANTIZED
from fljax.algorithms.registry import register
from fljax.algorithms.base import Aggregating, Centralized, ClientInput, ClientResult, CohortTemplate
from fljax.algorithms.local_training import run_steps
from fljax.data.batching import ClockPlan, random_batch
from fljax.errors import OptionError
from fljax.models.model import masked_cross_entropy
from fljax.ops import quant, schedule
from fljax.ops.distill import kl_divergence
from fljax.options import at_least, between, greater_than, interval, one_of, option, with_default

__all__ = ["QuantizedClients", "QuantizedAveraging", "QuPeD", "QuantizedLocal"]

PENALTY_R = {1: 0.5, 2: 0.3}  # spec §6 r-rule: the cumulative pull before fine-tuning, in units of σ₀


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """The static quantization layout of one personal model: the quantized leaf paths (first and last layer FP, §7)
    and the key of each leaf's center vector (its own path, or one shared key per client: D6)."""

    paths: tuple
    shared: bool

    def key(self, path: str) -> str:
        return "client" if self.shared else path

    def keys(self) -> tuple:
        return ("client",) if self.shared and self.paths else self.paths

    def quantize(self, x, centers, rule: str, idx=None):
        """Q_c(x) on the quantized leaves (with frozen indices ``idx`` when given), x elsewhere."""
        def q(path, leaf):
            if path not in self.paths:
                return leaf
            c = centers[self.key(path)]
            return quant.hard_quantize(leaf, c, rule) if idx is None else c[idx[path]]
        return tree.map_with_path(q, x)

    def members(self, x, key: str):
        """The entries a center vector serves: its leaf, or every quantized leaf concatenated (D6)."""
        return jnp.concatenate([tree_leaf(x, p).ravel() for p in self.paths if self.key(p) == key])


def tree_leaf(params, path: str):
    for part in path.split("/"):
        params = params[part]
    return params


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizedClients(CohortTemplate):
    """Algorithm 2's client loop on the epoch clock, shared by QuPeD, QuPeL and Local Training (b bits): every
    client-loop option here is honoured by all three (the server's ``weighting`` is :class:`QuantizedAveraging`'s:
    Local Training aggregates nothing); what ties a client to the global model (distillation, an l2 coupling, or
    nothing) is the subclass's. The clock: ``batch_size`` B (I = ⌈N_max/B⌉ iterations per epoch), or
    ``chunks_per_epoch`` K with ``batch_size`` null (§8, ragged FEMNIST: I = K, each epoch's permutation of a client's
    n_i rows cut into K contiguous chunks of ⌊n_i/K⌋ or ⌈n_i/K⌉, padded to ⌈N_max/K⌉ and masked; K must not exceed
    the smallest client's n_i, so no chunk is empty); ``local_steps`` τ iterations per round; the run's length is
    rounds = E·I/τ. The steps are proximal SGD at η₁(e) = η₁,₀·γ^(e−1) (no other client optimizer). Per-group values
    (a bit width, λ_p by architecture, D26) are client-group overrides."""

    mixed_architectures = True
    uses_server = True  # a global model w (False: Local Training, no communication)

    cohort_size: int | None = with_default(CohortTemplate, "cohort_size", None)
    cohort_mode: str = with_default(CohortTemplate, "cohort_mode", "mask")  # D32
    lr: float = option(0.1, "η₁,₀: the step size of epoch 1, η₁(e) = η₁,₀·γ^(e−1) (w's steps too, η₃ = η₁(e), D15)",
                       greater_than(0))
    weight_decay: float = option(1e-4, "wd: coupled weight decay on x and w (never on the centers)", at_least(0))
    momentum: float = option(0.0, "D16: heavy-ball momentum μ on x and w (PyTorch semantics; x's buffer kept in the "
                                  "client state, w_i's fresh every round; 0: plain SGD)", interval(0, 1, "[)"))
    batch_size: int | None = option(25, "B: minibatch size, I = ⌈N_max/B⌉ iterations per epoch (null: "
                                        "chunks_per_epoch)", at_least(1))
    local_steps: int = option(10, "τ: iterations per round on the epoch clock", at_least(1))
    chunks_per_epoch: int | None = option(None, "K: chunks per epoch with batch_size null (§8; K <= the smallest "
                                                "client's train size)", at_least(1))
    lr_gamma: float = option(0.99, "γ: per-epoch decay of η₁, in (0, 1]", interval(0, 1, "(]"))
    epochs: int = option(250, "E: epochs of the run (its rounds = E·I/τ)", at_least(1))
    finetune_epochs: int = option(50, "E_ft: the last epochs, the fine-tuning phase (§5.1; 0: none)", at_least(0))
    bits: int | None = option(2, "b: bits per quantized parameter, 1..8 (null: full precision)",
                              lambda v: None if 1 <= v <= 8 else f"must be in 1..8 or null (full precision), got {v}.")
    kappa: float | None = option(None, "κ of λ(e) = κe (null: the r-rule with penalty_r)", greater_than(0))
    penalty_r: float | None = option(None, "r of the r-rule Σ λη₁/2 = r·σ₀ (null: 0.3 at 2 bits, 0.5 at 1 bit)",
                                     greater_than(0))
    lam_compensated: bool | None = option(None, "λ(e) = κe/γ^e, compensating η₁'s decay (null: at 1 bit)")
    lr_center: float | None = option(None, "η₂: the centers' step size (null: 1e-4·20,160/l̄, l̄ the mean "
                                           "quantized leaf size)", greater_than(0))
    center_updates: bool = option(True, "update the centers (false: Table 7's ablation, lines 12-13 and the "
                                        "fine-tuning center step skipped)")
    center_prox: bool = option(True, "D1: the linearised prox of the centers after their gradient step")
    center_prox_sign: Literal["median", "printed"] = option("median", "D1: the sign of the centers' prox pull")
    fp_quant_grad: bool = option(False, "D3: the Q-terms' x-gradient on the full-precision leaves too")
    center_granularity: Literal["leaf", "client"] = option(
        "leaf", "D6: one center vector per quantized leaf, or one per 'client'")
    assign_rule: str = option("nearest", "D7: how entries are assigned to centers", one_of(quant.ASSIGN_RULES))
    center_init: Literal["quantile", "linspace"] = option("quantile", "D8: the centers' initialisation")
    personal_init: Literal["global", "independent"] = option(
        "global", "D9: personal models start as the global w⁰ (architecture permitting), or one init per client")
    lam_clock: Literal["epoch", "iteration"] = option("epoch", "D10: λ(e) on the epoch or the iteration clock")
    penalty_half: bool = option(True, "D11: the ½ of R(x, c) (false: λ doubled)")
    center_grad_clip: float | None = option(None, "D17: clip the centers' gradient to this magnitude (null: none)",
                                            greater_than(0))
    clamp_x: float | None = option(None, "D17: clamp quantized x to [−clamp_x, clamp_x] after the prox (null: none)",
                                   greater_than(0))
    fp_doubled: bool = option(False, "D20: the literal FP form, both terms of line 11 doubled")
    soft_sharpness: float | None = option(None, "D2: sharpness P of the soft quantizer Qs_c (null: P → ∞, hard)",
                                          greater_than(0))
    minibatches: Literal["shared", "fresh"] = option(
        "shared", "D14: one minibatch for lines 10, 12 and 14 ('shared'), or a fresh draw per sub-step")

    def check(self) -> None:
        super().check()
        if (self.batch_size is None) == (self.chunks_per_epoch is None):
            raise OptionError("chunks_per_epoch", "must be null with a batch_size B, or K (chunks per epoch) with "
                                                  f"batch_size null, got batch_size={self.batch_size}, "
                                                  f"chunks_per_epoch={self.chunks_per_epoch}.")
        if self.chunks_per_epoch is not None and self.minibatches == "fresh":
            raise OptionError("minibatches", "'fresh' draws batches of batch_size: it needs chunks_per_epoch null.")
        if self.finetune_epochs >= self.epochs:
            raise OptionError("finetune_epochs", f"must be in [0, epochs={self.epochs}), got {self.finetune_epochs}.")
        if self.assign_rule == "sign" and self.bits != 1:
            raise OptionError("assign_rule", f"'sign' needs bits=1 (two centers), got bits={self.bits}.")

    def lam_p_value(self) -> float:
        """λ_p, the weight of the tie to the global model (0 without one)."""
        return 0.0

    # ------------------------------------------------------------------------------------------ layout
    @property
    def quantized(self) -> bool:
        return self.bits is not None

    def model_warning(self, model) -> str | None:
        """Quantized training of a model with no layer between its first and last (kept FP, §7) trains FP."""
        if self.quantized and not self.spec(model).paths:
            return (f"algo.bits={self.bits} quantizes no layer of model {model.name}: its first and last layers stay "
                    f"full precision (QuPeD §7), so it trains at full precision (bits_per_param 32); use a model "
                    f"with at least 3 layers, e.g. --set model.options.hidden=[64,32].")
        return None

    def spec(self, model) -> QuantSpec:
        return QuantSpec(tuple(model.kernel_paths()[1:-1]), self.center_granularity == "client")

    def iters_per_epoch(self, n_max: int) -> int:
        return self.plan().iters_per_epoch(n_max)

    def plan(self, start=0):
        """The epoch clock's minibatches of iterations start … start + τ − 1 (fixed B or K chunks per epoch)."""
        return ClockPlan(self.batch_size, self.local_steps, start, self.chunks_per_epoch)

    def check_chunks(self, n_min: int) -> None:
        """K chunks per epoch need K <= N_min (else a client's epoch has empty chunks)."""
        if self.chunks_per_epoch is not None and self.chunks_per_epoch > n_min:
            raise OptionError("chunks_per_epoch", f"must be <= the smallest client's train size {n_min} (a larger "
                                                  f"K leaves empty chunks), got {self.chunks_per_epoch}.")

    def rates(self, t, n_max: int, kappa, dtype=jnp.float32):
        """(η₁(e), λ(e)) at global iteration t: e = 1 + ⌊t/I⌋; λ on the epoch or the iteration clock (D10), doubled
        when the ½ of R is dropped (D11); in ``dtype``, the parameters' (float64 in a float64 run)."""
        per_epoch = self.iters_per_epoch(n_max)
        e = schedule.epoch_of(t, per_epoch)
        e_lam = e if self.lam_clock == "epoch" else schedule.epoch_continuous(t, per_epoch, dtype)
        lam = schedule.penalty_lambda(kappa, e_lam, self.lr_gamma, self.compensated, dtype)
        return schedule.exp_decay(self.lr, self.lr_gamma, e, dtype), lam if self.penalty_half else 2 * lam

    @property
    def compensated(self) -> bool:
        return self.bits == 1 if self.lam_compensated is None else self.lam_compensated

    def finetune_start(self, n_max: int) -> int:
        """T_ft = (E − E_ft)·I: the first iteration of the fine-tuning phase."""
        return (self.epochs - self.finetune_epochs) * self.iters_per_epoch(n_max)

    # ------------------------------------------------------------------------------------------ init
    def init(self, ctx):
        """w⁰ = init(global model); personal models start as copies of w⁰ when they share its architecture, else
        one init per architecture from its own key (D9; ``personal_init='independent'``: one per client)."""
        key = self.init_key(ctx)
        w0 = ctx.server_model.init(key)
        n = ctx.num_clients
        model = ctx.model
        # the per-client maps, planned against the initialisation's memory budget
        if self.personal_init == "independent":
            x0 = ctx.map_init(lambda base, i: model.init(jax.random.fold_in(base, i)), jax.random.fold_in(key, 1),
                              jnp.asarray(ctx.client_ids))
        else:
            same = jax.eval_shape(model.init, key) == jax.eval_shape(ctx.server_model.init, key)
            x0 = tree.broadcast_clients(w0 if same else model.init(jax.random.fold_in(key, 1)), n)
        n_max = ctx.data.train.n_max
        clients = ctx.map_init(lambda _, x: self.client_init(model, n_max, x), None, x0)
        return ({"params": w0} if self.uses_server else None), clients

    def client_init(self, model, n_max: int, x0):
        """One client's state: x, and for quantized clients the centers (D8), the frozen indices of the fine-tuning
        phase and whether it switched, and κ (given, or the r-rule on σ₀ = the mean per-leaf std of x⁰'s quantized
        leaves)."""
        state = {"x": x0}
        if self.momentum:
            state["mom"] = tree.zeros_like(x0)
        if not self.quantized:
            return state
        spec = self.spec(model)
        state["c"] = {k: quant.init_centers(spec.members(x0, k), self.bits, self.center_init) for k in spec.keys()}
        state["idx"] = {p: jnp.zeros(tree_leaf(x0, p).shape, jnp.int32) for p in spec.paths}
        state["switched"] = jnp.bool_(False)
        if self.kappa is not None or not spec.paths:  # a model without hidden layers has nothing to quantize
            state["kappa"] = jnp.asarray(self.kappa or 0.0, tree.float_dtype(x0))
        else:
            sigma0 = jnp.mean(jnp.stack([jnp.std(tree_leaf(x0, p)) for p in spec.paths]))
            r = self.penalty_r or PENALTY_R.get(self.bits, 0.3)
            state["kappa"] = schedule.penalty_kappa(r, sigma0, self.epochs - self.finetune_epochs,
                                                    self.iters_per_epoch(n_max), self.lr, self.lr_gamma,
                                                    self.compensated, tree.float_dtype(x0))
        return state

    def center_lr(self, model) -> float:
        if self.lr_center is not None:
            return self.lr_center
        spec = self.spec(model)
        sizes = [int(np.prod(tree_leaf(jax.eval_shape(model.init, jax.random.PRNGKey(0)), p).shape))
                 for p in spec.paths]
        return schedule.center_lr(float(np.mean(sizes)))

    # ------------------------------------------------------------------------------------------ losses
    def personal_loss(self, model, params, zw, batch, lam_p):
        """CE(params; ξ), the client's own objective without a global model (``zw``, ``lam_p``: the subclass's
        tie to it)."""
        return masked_cross_entropy(model.apply(params, batch.x), batch.y, batch.mask)

    def quantize(self, spec: QuantSpec, x, c):
        """The student the Q-terms see: Q_c(x) (P → ∞), or Qs_c(x) for a finite ``soft_sharpness`` P (D2)."""
        if self.soft_sharpness is None:
            return spec.quantize(x, c, self.assign_rule)
        return tree.map_with_path(
            lambda p, v: quant.soft_quantize(v, c[spec.key(p)], self.soft_sharpness) if p in spec.paths else v, x)

    def link(self, gmodel, w, batch):
        """What ties a client to the global model on one minibatch (here: nothing, (None, None))."""
        return None, None

    def x_loss(self, model, spec: QuantSpec, c, zw, batch, lam_p):
        """Line 10's objective as a function of x (its gradient is g before weight decay)."""
        return lambda v: self.personal_loss(model, v, zw, batch, lam_p)

    def center_loss(self, model, q, zw, batch, lam_p):
        """Line 12's objective at the quantized student q = Q_c(x) (differentiated w.r.t. c through q)."""
        return self.personal_loss(model, q, zw, batch, lam_p)

    def sgd(self, params, g, buf, eta):
        """One SGD step with coupled weight decay (D16): d = g + wd·p; with momentum μ > 0, v ← μv + d and d = v
        (PyTorch semantics); p ← p − η d. Returns (p, v) (v = ``buf`` unchanged without momentum)."""
        d = tree.axpy(self.weight_decay, params, g)
        if self.momentum:
            d = tree.axpy(self.momentum, buf, d)
            buf = d
        return tree.axpy(-eta, d, params), buf

    # ------------------------------------------------------------------------------------------ one iteration
    def sub_batches(self, train, batch, key, t):
        """The minibatches of lines (10, 12, 14) at iteration t: the clock's batch three times (D14), or the clock's
        for line 10 and two fresh draws (``minibatches='fresh'``) from ``fold_in(key, t)``."""
        if self.minibatches == "shared":
            return batch, batch, batch
        k12, k14 = jax.random.split(jax.random.fold_in(key, t))
        return batch, random_batch(k12, train, self.batch_size), random_batch(k14, train, self.batch_size)

    def iteration(self, inp: ClientInput, carry, batches, t):
        """Lines 9-14 (or the fine-tuning step) of one client at global iteration t; carry = (state, w_i, w_i's
        momentum buffer), ``batches`` = the minibatches of lines 10, 12 and 14."""
        state, w, wbuf = carry
        model, gmodel = inp.model, inp.global_model
        lam_p = self.lam_p_value()
        eta1, lam = self.rates(t, inp.train.n_max, state.get("kappa", 0.0), tree.float_dtype(state["x"]))
        bx, bc, bw = batches
        lx = self.link(gmodel, w, bx)  # one teacher pass when the three batches are one
        subs = ((lx[0], bx), (lx[0] if bc is bx else self.link(gmodel, w, bc)[0], bc))
        if not self.quantized:
            state, students, loss = self.fp_step(model, state, subs, eta1, lam_p)
        elif self.finetune_epochs:
            in_ft = t >= self.finetune_start(inp.train.n_max)
            state, students, loss = jax.lax.cond(in_ft, functools.partial(self.finetune_step, model),
                                                 functools.partial(self.prox_step, model), state, subs, eta1,
                                                 lam, lam_p)
        else:
            state, students, loss = self.prox_step(model, state, subs, eta1, lam, lam_p)
        if self.uses_server:
            lw = lx if bw is bx else self.link(gmodel, w, bw)
            w, wbuf = self.global_step(model, gmodel, w, wbuf, lw, students, bw, eta1, lam_p)
        return (state, w, wbuf), loss

    def fp_step(self, model, state, subs, eta1, lam_p):
        """QuPeD (FP): x ← x − η₁(∇[(1 − λ_p)CE + λ_p KL] + wd·x); D20's literal form doubles both terms."""
        (zw, batch), _ = subs
        x = state["x"]
        loss, g = jax.value_and_grad(self.x_loss(model, None, None, zw, batch, lam_p))(x)
        factor = 2.0 if self.fp_doubled else 1.0
        x, mom = self.sgd(x, tree.scale(factor, g), state.get("mom"), eta1)
        return self.with_momentum({**state, "x": x}, mom), [x] * (2 if self.fp_doubled else 1), loss

    def with_momentum(self, state, mom):
        return {**state, "mom": mom} if self.momentum else state

    def prox_step(self, model, state, subs, eta1, lam, lam_p):
        """Lines 10-13: proximal x step with the old centers, then the center step at the new x."""
        (zx, bx), (zc, bc) = subs
        spec, rule = self.spec(model), self.assign_rule
        x, c = state["x"], state["c"]
        loss, g = jax.value_and_grad(self.x_loss(model, spec, c, zx, bx, lam_p))(x)
        if self.fp_quant_grad or self.soft_sharpness is not None:
            # the x-gradient of the Q-terms: zero on quantized leaves under P → ∞; on FP leaves only with D3's
            # option; on quantized leaves only with a finite P (D2)
            gq = jax.grad(lambda v: self.center_loss(model, self.quantize(spec, v, c), zx, bx, lam_p))(x)
            if not self.fp_quant_grad:
                gq = tree.map_with_path(lambda p, v: v if p in spec.paths else jnp.zeros_like(v), gq)
            g = tree.add(g, gq)
        y, mom = self.sgd(x, g, state.get("mom"), eta1)
        th = lam * eta1 / 2
        x = tree.map_with_path(lambda p, v: quant.prox_x(v, c[spec.key(p)], th, rule) if p in spec.paths else v, y)
        if self.clamp_x is not None:  # D17 option (authors' code)
            x = tree.map_with_path(lambda p, v: jnp.clip(v, -self.clamp_x, self.clamp_x) if p in spec.paths else v,
                                   x)
        if self.center_updates and c:
            h = jax.grad(lambda cc: self.center_loss(model, self.quantize(spec, x, cc), zc, bc, lam_p))(c)
            eta2 = self.center_lr(model)
            c = {k: quant.center_update(c[k], h[k], spec.members(x, k), eta2, lam, self.center_prox_sign,
                                        self.center_prox, rule, self.center_grad_clip) for k in c}
        return self.with_momentum({**state, "x": x, "c": c}, mom), [x, self.quantize(spec, x, c)], loss

    def switch(self, model, state):
        """The fine-tuning switch (§5.1): idx ← assign(x, c), frozen; x ← c[idx] on quantized leaves."""
        spec = self.spec(model)
        x, c = state["x"], state["c"]
        idx = {p: quant.assign(tree_leaf(x, p), c[spec.key(p)], self.assign_rule) for p in spec.paths}
        return {**state, "x": spec.quantize(x, c, self.assign_rule, idx), "idx": idx, "switched": jnp.bool_(True)}

    def finetune_step(self, model, state, subs, eta1, lam, lam_p):
        """x̂ = (u, c[idx]): u ← u − η₁(g_u + wd·u), c ← c − η₂h (no prox, no sort; frozen idx)."""
        (zw, batch), _ = subs
        spec = self.spec(model)
        state = jax.lax.cond(state["switched"], lambda s: s, functools.partial(self.switch, model), state)
        x, c, idx = state["x"], state["c"], state["idx"]

        def loss_fn(u, cc):
            return self.personal_loss(model, spec.quantize(u, cc, self.assign_rule, idx), zw, batch, lam_p)

        loss, (gu, h) = jax.value_and_grad(loss_fn, argnums=(0, 1))(x, c)
        u, mom = self.sgd(x, gu, state.get("mom"), eta1)  # quantized leaves are replaced below
        if self.center_updates and c:
            eta2 = self.center_lr(model)
            c = {k: c[k] - eta2 * (h[k] if self.center_grad_clip is None
                                   else jnp.clip(h[k], -self.center_grad_clip, self.center_grad_clip)) for k in c}
        x = spec.quantize(u, c, self.assign_rule, idx)
        return self.with_momentum({**state, "x": x, "c": c}, mom), [x, x], loss

    def global_step(self, model, gmodel, w, wbuf, link, students, batch, eta1, lam_p):
        """Line 14: the step of the client's copy w_i of the global model (the subclass's)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ protocol
    def broadcast(self, server):
        return server["params"] if self.uses_server else None

    def client_update(self, inp: ClientInput) -> ClientResult:
        """τ iterations t = round·τ … round·τ + τ − 1 on the epoch clock's minibatches; upload w_i."""
        start = inp.round * self.local_steps
        self.check_chunks(inp.train.n_min)
        plan = self.plan(start)

        def step(carry, batch, key):  # an all-masked batch (past a small client's data) changes nothing
            inner, t = carry
            new, loss = self.iteration(inp, inner, self.sub_batches(inp.train, batch, key, t), t)
            return (tree.where(jnp.any(batch.mask), new, inner), t + 1), loss

        wbuf = tree.zeros_like(inp.down) if self.momentum and self.uses_server else None
        ((state, w, _), _), loss = run_steps(step, ((inp.state, inp.down, wbuf), start), inp.train, plan,
                                             inp.clock_key, inp.unroll)
        return ClientResult(state=state, upload=w, weight=inp.train.count, metrics={"train_loss": loss})

    def server_update(self, ctx, server, clients, cohort, result):
        return server  # Local Training has no server (QuantizedAveraging's server_step averages the w_i)

    def eval_shared(self, server):
        return self.broadcast(server)

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        """The deployed model x̂_i = Q_{c_i}(x_i) (x_i for FP clients)."""
        state = inp.state
        if not self.quantized:
            return state["x"]
        return self.spec(inp.model).quantize(state["x"], state["c"], self.assign_rule)

    def evaluate_client(self, inp: ClientInput) -> dict:
        """Accuracies, plus teacher health (§12: the global model's mean max-probability on the client's test split)
        and the personal model's size (§7: bits per parameter, megabytes)."""
        out = super().evaluate_client(inp)
        bits, per_param, _ = self.size(inp.model)
        scalars = {"bits_per_param": jnp.float32(per_param), "model_mb": jnp.float32(bits / 8e6)}
        if self.uses_server:
            p = jax.nn.softmax(inp.global_model.apply(inp.down, inp.test.x), axis=-1)
            m = inp.test.mask.astype(jnp.float32)
            scalars["teacher_max_prob"] = jnp.sum(jnp.max(p, axis=-1) * m) / jnp.maximum(jnp.sum(m), 1.0)
        out["scalars"] = scalars
        return out

    def size(self, model) -> tuple[int, float, float]:
        """(total bits, bits/parameter, compression ratio) of the deployed personal model (§7)."""
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        if not self.quantized:
            d = tree.size(shapes)
            return 32 * d, 32.0, 1.0
        paths = set(self.spec(model).paths)
        return quant.bits_accounting(shapes, tree.map_with_path(lambda p, _: p in paths, shapes), self.bits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizedAveraging(QuantizedClients, Aggregating):
    """:class:`QuantizedClients` whose server averages the clients' copies w_i of the global model, unweighted by
    default (D12: ``weighting: uniform``)."""

    weighting: str = with_default(Centralized, "weighting", "uniform")  # D12

    def server_step(self, ctx, server, aggregate):
        return {"params": aggregate}


@register("quped", family=QUANTIZED, example="configs/quped.yaml",
          summary="QuPeD: quantized personal models of any architecture distilled with a global model (Ozkara et al. 2021)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class QuPeD(QuantizedAveraging):
    """Algorithm 2: the client loop distilled with the global model w (λ_p, f_KD; D4, D5)."""


    lam_p: float = option(0.25, "λ_p: weight of the distillation terms (1 − λ_p)CE + λ_p f_KD", between(0, 1))
    kd_temperature: float = option(1.0, "D4: temperature T of f_KD", greater_than(0))
    kd_softening: Literal["both", "teacher"] = option(
        "both", "D4: T on 'both' logits (with T² scaling) or on the 'teacher' only")
    global_ce_weight: float = option(0.0, "D5: weight of CE(w_i) in line 14 (0: the paper's label-free w)",
                                     at_least(0))

    def lam_p_value(self) -> float:
        return self.lam_p

    def kd(self, teacher_logits, student_logits, mask):
        """f_KD = KL(s(z_w) ‖ s(z_x)), T = 1 (D4; 'both': T on both logits with T² scaling, 'teacher': teacher
        only)."""
        t = self.kd_temperature
        if self.kd_softening == "teacher":
            return kl_divergence(teacher_logits, student_logits, t, mask, student_temperature=1.0)
        return kl_divergence(teacher_logits, student_logits, t, mask, scale_t2=t != 1.0)

    def personal_loss(self, model, params, zw, batch, lam_p):
        """(1 − λ_p) CE(params; ξ) + λ_p KL(sg z_w ‖ params; ξ)."""
        logits = model.apply(params, batch.x)
        return ((1 - lam_p) * masked_cross_entropy(logits, batch.y, batch.mask)
                + lam_p * self.kd(jax.lax.stop_gradient(zw), logits, batch.mask))

    def link(self, gmodel, w, batch):
        """The teacher logits z_w on one minibatch and their VJP (one teacher pass, reused by lines 10-14)."""
        return jax.vjp(lambda v: gmodel.apply(v, batch.x), w)

    def global_step(self, model, gmodel, w, wbuf, link, students, batch, eta1, lam_p):
        """Line 14: one VJP of the summed reverse-KL cotangent Σ_s ∇_z KL(z ‖ sg z_s) at z_w (z_s the logits of the
        student parameters s); w_i ← w_i − η₃(λ_p vjp + wd·w_i), η₃ = η₁(e) (D15); D5's option adds
        ``global_ce_weight``·∇CE(w_i). Returns (w_i, its momentum buffer)."""
        zw, vjp_w = link
        logits = [jax.lax.stop_gradient(model.apply(s, batch.x)) for s in students]

        def reverse_kl(z):
            return sum(self.kd(z, s, batch.mask) for s in logits)

        (gw,) = vjp_w(jax.grad(reverse_kl)(zw))
        g = tree.scale(lam_p, gw)
        if self.global_ce_weight:
            g = tree.axpy(self.global_ce_weight, jax.grad(lambda v: gmodel.loss(v, batch))(w), g)
        return self.sgd(w, g, wbuf, eta1)


@register("quped_local", family=NO_COMMUNICATION, example="configs/quped_local.yaml",
          summary="Local Training with Algorithm 1 (quantized) or SGD (FP) on QuPeD's epoch clock, no communication")
@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizedLocal(QuantizedClients):
    """Algorithm 1 run by every client alone ("Local Training (b bits)", §4, §10): the QuPeD client loop with
    λ_p = 0, no global model and no communication; ``bits=null`` is Local Training (FP) on the same clock. With one
    client holding all data it is centralized Algorithm 1."""

    uses_server = False
