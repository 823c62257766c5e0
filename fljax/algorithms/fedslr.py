"""FedSLR (Huang, Shen, Sun, Lin, Tao, "Fusion of Global and Local Knowledge for Personalized Federated Learning",
TMLR): a low-rank global model w (the GKR) and a sparse personal component p_i; client i infers with w + p_i.

Algorithm 2 (partial participation; typos fixed as in the FedSLR spec §3.2), round t with lr_t = η_l(t):

    S_t ← cohort;  broadcast w_t (as low-rank factors where smaller, Remark 2)
    for i ∈ S_t:
        Phase I, Eq. (4):  w_i ← argmin_w f_i(w) − ⟨γ_i, w⟩ + ‖w_t − w‖²/(2η_g)    (E1 epochs of SGD from w_t,
                           g = ∇CE(w; ξ) + wd·w − γ_i + (w − w_t)/η_g)
                   Eq. (5): γ_i ← γ_i + (w_t − w_i)/η_g
        Phase II, Eq. (7): E2 epochs from p_i (warm start):
                           p_i ← S_{μ·lr_t}(p_i − lr_t·[∇_p CE(w_t + p_i; ξ) + wd_p·p_i])
        upload w_i
    z ← (1/|S_t|) Σ_{i∈S_t} w_i − η_g·(1/M) Σ_{i=1..M} γ_i          (post-update γ, every client; Eq. (6))
    w_{t+1} ← Prox_{λη_g‖·‖_*}(z)                                      (SVT per matrix leaf, Eq. (15))

The server's copy of γ_i equals the client's (both follow Eq. (5) from w_t and w_i), so the simulation stores it
once, in the per-client state. Options (spec §4, §12):

* ``memory_efficient`` — Algorithm 3: the server keeps only γ̄ = (1/M) Σ_i γ_i, updated as
  γ̄ ← γ̄ + (1/M) Σ_{i∈S_t} (w_t − w_i)/η_g, and z = mean_{S_t} w_i − η_g·γ̄ (the same iterates).
* ``cohort_size=None`` — Algorithm 1 (full participation).
* ``solver='lpgd'`` — Eqs. (18)–(19): every local step w ← Prox_{lr_t·λ‖·‖_*}(w − lr_t·∇f_i(w; ξ)); no γ; the
  server takes the plain mean (dense downlink; the uplink is low-rank, counted as such if ``lpgd_factor_uplink``).
* ``solver='gpgd'`` — Eqs. (20)–(21): FedAvg clients, server w_{t+1} = Prox(mean_{S_t} w_i) with threshold λ·η_g
  (D19, ``gpgd_threshold='eta_g'``) or the paper-literal λ·η_l(t) (``'eta_l'``).
* ``global_prox`` × ``personal_prox``: nuclear × l1 = LR+S (default); l1 × nuclear, nuclear × nuclear, l1 × l1
  are App. A.3's S+LR, LR+LR, S+S; any other prox of :data:`fljax.ops.prox.PROXES` (group lasso, elastic net,
  box, ...) may be named too.
* ``p_init`` 'zeros' (D1) or 'copy_w0' (w_0 in every ≥2-D leaf of p, zeros elsewhere: the authors' code);
  ``personal_weight_decay`` wd_p (D3); ``conv_reshape`` (D10); ``downlink`` 'factored' or 'dense' (D11);
  ``nuclear_exclude``: a path regex of matrix leaves left out of the nuclear prox (D9).

Phase II runs under every solver (P2 is solved after P1 in every variant). Round 0 broadcasts the dense w_0.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
import optax

from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.algorithms.families import PERSONAL_SPLIT
from fljax.algorithms.local_training import LocalTraining, local_training, run_steps
from fljax.algorithms.registry import register
from fljax.data.batching import BatchPlan
from fljax.errors import OptionError
from fljax.ops import admm, prox
from fljax.options import at_least, greater_than, one_of, option, with_default

__all__ = ["FedSLR", "Downlink", "prox_with_stats"]


@flax.struct.dataclass
class Downlink:
    """What the server sends: the GKR ``params`` (as the client rebuilds it from the factors) and ``numel``, the
    number of values on the wire, Σ_matrices min(r(m+n), mn) + Σ_vectors numel (spec §2, §5)."""

    params: Any
    numel: Any


@functools.partial(jax.jit, static_argnums=0)
def prox_with_stats(op: prox.Nuclear, params, tau):
    """``op.with_stats(params, tau)``: SVT with threshold ``tau`` on the matrix leaves ``op`` selects, measured
    statistics elsewhere (``tau=None``: nothing thresholded). Jitted, so that the server step is one program under
    the eager loop executor too."""
    return op.with_stats(params, tau)


def wire_numel(stats):
    """Values on the wire for a model with these :class:`~fljax.ops.prox.LowRankStats`: Σ min(r(m+n), mn) over
    matrices + Σ numel over vectors."""
    return prox.transmission_bytes(stats, bytes_per_param=1)[0]


@register("fedslr", family=PERSONAL_SPLIT, example="configs/fedslr.yaml",
          summary="FedSLR: low-rank global model (server SVT, per-client dual) + sparse personal part (Huang et al.)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedSLR(Centralized):
    """Hyperparameters (paper defaults, spec §6): ``lam`` λ = 1e-4, ``mu`` μ = 1e-3, ``eta_g`` η_g = 10; Phase I:
    ``local_epochs`` E1 = 2 of plain SGD, B = 20, lr 0.1·0.998^t, wd 1e-3 (D4, D18); Phase II: ``personal_epochs``
    E2 = 1, ``personal_weight_decay`` wd_p = 1e-3 (D3). The cohort mean is uniform (``weighting='uniform'``)."""

    supports_groups = False  # Algorithm 2's server averages every client's dual state (one stacked pytree)
    local: LocalTraining = local_training(lr_decay=0.998, weight_decay=1e-3, local_epochs=2, local_steps=None)
    lam: float = option(1e-4, "λ of the global model's regulariser (nuclear norm: the SVT threshold λ·η_g)",
                        at_least(0))
    mu: float = option(1e-3, "μ of the personal component's regulariser (l1: the soft threshold μ·lr)", at_least(0))
    eta_g: float = option(10.0, "η_g: the proximal weight 1/(2η_g) of Eq. (4) and the server's step on the duals",
                          greater_than(0))
    personal_epochs: int = option(1, "E2: epochs of Phase II (the personal component) per round", at_least(0))
    personal_weight_decay: float = option(1e-3, "wd_p: weight decay of Phase II (D3)", at_least(0))
    solver: Literal["fedslr", "lpgd", "gpgd"] = option(
        "fedslr", "'fedslr' (Algorithm 2), 'lpgd' (prox at every local step) or 'gpgd' (FedAvg clients, server prox)")
    memory_efficient: bool = option(False, "Algorithm 3: the server keeps only the mean dual γ̄ (the same iterates)")
    global_prox: str = option("nuclear",
                              "prox of the global model's regulariser (default 'nuclear': low rank; any of "
                              "fljax.ops.prox.PROXES)", one_of(prox.PROXES))
    personal_prox: str = option("l1", "prox of the personal component's regulariser (default 'l1': sparse)",
                                one_of(prox.PROXES))
    p_init: Literal["zeros", "copy_w0"] = option(
        "zeros", "initial p_i: 'zeros' or 'copy_w0' (w_0 in every matrix leaf, as the authors' code)")
    conv_reshape: Literal["fedslr", "flat"] = option(
        "fedslr", "how conv kernels become matrices for the nuclear prox: 'fedslr' ((O·kh)×(I·kw)) or 'flat'")
    downlink: Literal["factored", "dense"] = option(
        "factored", "broadcast w_t as low-rank 'factored' matrices where smaller, or 'dense'")
    gpgd_threshold: Literal["eta_g", "eta_l"] = option(
        "eta_g", "gpgd's SVT threshold: λ·η_g ('eta_g') or the paper-literal λ·η_l(t) ('eta_l')")
    lpgd_factor_uplink: bool = option(False,
                                      "count lpgd's upload as low-rank factors (its local prox makes it low-rank)")
    nuclear_exclude: str | None = option(None, "path regex of matrix leaves left out of the nuclear prox (null: none)")
    weighting: str = with_default(Centralized, "weighting", "uniform")

    def check(self) -> None:
        super().check()
        if self.memory_efficient and self.solver != "fedslr":
            raise OptionError("memory_efficient", f"keeps the mean dual of solver='fedslr'; solver={self.solver!r} "
                                                  f"has no dual.")
        if self.solver == "lpgd" and self.global_prox != "nuclear":
            raise OptionError("solver", "='lpgd' runs the nuclear prox at every local step; use "
                                        "global_prox='nuclear'.")

    # ------------------------------------------------------------------------------------------ pieces
    @property
    def uses_dual(self) -> bool:
        return self.solver == "fedslr"

    def nuclear(self) -> prox.Nuclear:
        """The unit nuclear norm Σ_l ‖π(W_l)‖_* over the matrix leaves (FedSLR's conv reshape π, D10), without the
        leaves matching ``nuclear_exclude`` (D9)."""
        return prox.Nuclear(1.0, conv_reshape=self.conv_reshape, exclude=self.nuclear_exclude)

    def global_prox_step(self, z, tau):
        """(w, stats) = Prox_{τR}(z) for the global regulariser R = ``global_prox`` (nuclear: SVT, Eq. 15; any
        other prox of :data:`fljax.ops.prox.PROXES` at unit strength, App. A.3), with the GKR's low-rank stats."""
        if self.global_prox != "nuclear":
            if tau is not None:
                z = prox.make_prox(self.global_prox, 1.0)(z, tau)
            tau = None
        return prox_with_stats(self.nuclear(), z, tau)

    def personal_prox_op(self) -> prox.Prox:
        """Phase II's prox: μR for R = ``personal_prox``: ‖·‖₁ (LR+S), Σ‖·‖_* (LR+LR), none, or any prox of
        :data:`fljax.ops.prox.PROXES`."""
        options = {"conv_reshape": self.conv_reshape} if self.personal_prox == "nuclear" else {}
        return prox.make_prox(self.personal_prox, self.mu, **options)

    def steps_per_round(self, n_max: int) -> int:
        return super().steps_per_round(n_max) + BatchPlan(batch_size=self.local.batch_size,
                                                          epochs=self.personal_epochs).num_steps(n_max)

    # ------------------------------------------------------------------------------------------ state
    def init(self, ctx):
        w0 = ctx.model.init(self.init_key(ctx))
        server = {"params": w0, "stats": prox_with_stats(self.nuclear(), w0, None)[1]}
        if self.memory_efficient:
            server["gamma_bar"] = tree.zeros_like(w0)
        if self.p_init == "zeros":
            p0 = tree.zeros_like(w0)
        else:
            p0 = jax.tree.map(lambda x: x if x.ndim >= 2 else jnp.zeros_like(x), w0)
        clients = {"p": tree.broadcast_clients(p0, ctx.num_clients)}
        if self.uses_dual:
            clients["gamma"] = tree.broadcast_clients(tree.zeros_like(w0), ctx.num_clients)
        return server, clients

    def broadcast(self, server):
        numel = wire_numel(server["stats"])
        if self.downlink == "dense":
            numel = jnp.int32(tree.size(server["params"]))
        return Downlink(params=server["params"], numel=numel)

    # ------------------------------------------------------------------------------------------ client
    def phase_one(self, w_t, gamma, inp: ClientInput, key):
        """Eq. (4) by SGD from w_t: g = ∇CE(w; ξ) + wd·w − γ_i + (w − w_t)/η_g; then Eq. (5)."""
        pull = lambda w: admm.augmented_lagrangian_grad(w, w_t, gamma, sigma=1.0 / self.eta_g, dual_sign=-1)  # noqa
        w_i, loss = self.local.train(inp.model.loss, w_t, inp, key=key, extra_grad=pull)
        return w_i, admm.dual_ascent(gamma, w_t, w_i, 1.0 / self.eta_g), loss

    def lpgd_local(self, w_t, inp: ClientInput, key):
        """Eqs. (18)–(19): w ← Prox_{lr·λ‖·‖_*}(w − lr·(∇CE(w; ξ) + wd·w)) at every step; returns the number of
        values of the last iterate's factors too."""
        local = self.local
        lr = local.lr_at(inp.round)
        opt = local.client_optimizer(lr)
        sgd = local.sgd_step(inp.model.loss, opt)

        def step(carry, batch, k):
            (w, s), loss = sgd(carry[:2], batch, k)
            w, stats = prox_with_stats(self.nuclear(), w, lr * self.lam)
            return (w, s, wire_numel(stats)), loss

        numel0 = jnp.int32(tree.size(w_t))
        (w, _, numel), loss = run_steps(step, (w_t, opt.init(w_t), numel0), inp.train, local.plan(), key,
                                        inp.unroll)
        return w, numel, loss

    def phase_two(self, w_t, p, inp: ClientInput, key):
        """Eq. (7), E2 epochs from p_i: p ← Prox_{lr·μR}(p − lr·[∇_p CE(w_t + p; ξ) + wd_p·p]), anchored on the
        received w_t: the personal phase with plain SGD (weight decay wd_p) and the personal prox after every
        step."""
        local = self.local
        lr = local.lr_at(inp.round)
        sgd = optax.chain(optax.add_decayed_weights(self.personal_weight_decay), optax.sgd(lr))
        return local.personal_phase(lambda q, batch: inp.model.loss(tree.add(w_t, q), batch), p, inp, key,
                                   epochs=self.personal_epochs, optimizer=sgd, prox=self.personal_prox_op())

    def client_update(self, inp: ClientInput) -> ClientResult:
        w_t = inp.down.params
        k1, k2 = jax.random.split(inp.key)
        metrics, new_state = {}, {}
        if self.solver == "fedslr":
            w_i, new_state["gamma"], loss = self.phase_one(w_t, inp.state["gamma"], inp, k1)
        elif self.solver == "lpgd":
            w_i, metrics["upload_numel"], loss = self.lpgd_local(w_t, inp, k1)
        else:
            w_i, loss = self.local.train(inp.model.loss, w_t, inp, key=k1)
        new_state["p"], personal_loss = self.phase_two(w_t, inp.state["p"], inp, k2)
        metrics.update(train_loss=loss, personal_loss=personal_loss)
        return ClientResult(state=new_state, upload=w_i, weight=inp.train.count, metrics=metrics)

    # ------------------------------------------------------------------------------------------ server
    def server_update(self, ctx, server, clients, cohort, result):
        w_t = server["params"]
        z = tree.weighted_mean_clients(result.upload, self.aggregation_weights(result))
        out = {}
        if self.memory_efficient:  # Algorithm 3: γ̄ ← γ̄ + (1/M) Σ_{S_t} (w_t − w_i)/η_g
            drift = tree.sub(tree.scale(cohort.shape[0], w_t), tree.sum_clients(result.upload))
            out["gamma_bar"] = tree.axpy(1.0 / (self.eta_g * ctx.num_clients), drift, server["gamma_bar"])
            z = tree.axpy(-self.eta_g, out["gamma_bar"], z)
        elif self.uses_dual:  # Algorithm 2: the mean over ALL M clients of the post-update γ_i
            z = tree.axpy(-self.eta_g, tree.mean_clients(clients["gamma"]), z)
        if self.solver == "lpgd":
            tau = None
        elif self.solver == "gpgd" and self.gpgd_threshold == "eta_l":
            tau = self.lam * self.local.lr_at(ctx.round)
        else:
            tau = self.lam * self.eta_g
        out["params"], out["stats"] = self.global_prox_step(z, tau)
        return out

    def comm_bytes(self, down, result: ClientResult, cohort_size: int) -> tuple:
        """Down: the factorised GKR (``down.numel`` values) to every cohort member; up: dense w_i (footnote 2),
        or LPGD's low-rank iterates counted as factors when ``lpgd_factor_uplink``."""
        itemsize = jax.tree.leaves(down.params)[0].dtype.itemsize
        dn = down.numel.astype(jnp.float32) * itemsize * cohort_size
        if self.solver == "lpgd" and self.lpgd_factor_uplink:
            return jnp.sum(result.metrics["upload_numel"].astype(jnp.float32)) * itemsize, dn
        return float(tree.nbytes(result.upload)), dn

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        """The mixed model w_T + p_i (p_i from i's last participation; zeros if never sampled, D1)."""
        return tree.add(inp.down, inp.state["p"])

    def whole_population(self) -> str | None:
        if self.uses_dual and not self.memory_efficient:
            return ("its server averages every client's dual γ_i each round (Algorithm 2; algo.memory_efficient: "
                    "true keeps their mean on the server, Algorithm 3, the same iterates)")
        return None

    def client_values(self, state) -> dict:
        """nnz(p_i), the non-zeros of client i's sparse part."""
        return {"nnz": tree.count_nonzero(state["p"])}

    def eval_metrics(self, server, clients, values=None) -> dict:
        """GKR rank density Σ_l r_l / Σ_l min(m_l, n_l), each matrix leaf's rank (``rank/<path>``), the GKR's
        factorised parameter count D_T, and over clients (``values``, :meth:`client_values`; None: from
        ``clients``): the non-zero fraction of p_i and the mixed model's parameter count D_T + nnz(p_i) (mean and
        std; spec §5, D28)."""
        values = self.population_values(clients) if values is None else values
        stats = jax.tree.leaves(server["stats"], is_leaf=lambda st: isinstance(st, prox.LowRankStats))
        params, _ = jax.tree_util.tree_flatten_with_path(server["params"])
        matrices = [(tree.path_str(p), st) for (p, x), st in zip(params, stats) if x.ndim >= 2]
        gkr = wire_numel(server["stats"]).astype(jnp.float32)
        rank = sum(st.rank for _, st in matrices).astype(jnp.float32)
        max_rank = sum(st.max_rank for _, st in matrices).astype(jnp.float32)
        out = {"gkr_params": gkr, "gkr_rank_density": rank / jnp.maximum(max_rank, 1.0)}
        out.update({f"rank/{path}": st.rank.astype(jnp.float32) for path, st in matrices})
        nnz = values["nnz"].astype(jnp.float32)
        out["sparse_nnz_frac"] = jnp.mean(nnz) / tree.size(server["params"])
        out["mixed_params"] = gkr + jnp.mean(nnz)
        out["mixed_params_std"] = jnp.std(nnz)
        return out
