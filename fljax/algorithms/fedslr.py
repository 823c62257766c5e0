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
* ``global_prox`` ∈ {nuclear, l1, none} × ``personal_prox`` ∈ {l1, nuclear, none}: LR+S (default), S+LR, LR+LR,
  S+S (App. A.3).
* ``p_init`` 'zeros' (D1) or 'copy_w0' (w_0 in every ≥2-D leaf of p, zeros elsewhere: the authors' code);
  ``personal_weight_decay`` wd_p (D3); ``conv_reshape`` (D10); ``downlink`` 'factored' or 'dense' (D11);
  ``nuclear_exclude``: a path regex of matrix leaves left out of the nuclear prox (D9).

Phase II runs under every solver (P2 is solved after P1 in every variant). Round 0 broadcasts the dense w_0.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from fljax import tree
import optax

from fljax.algorithms.base import Centralized, ClientInput, ClientResult, check_choice
from fljax.algorithms.local_training import LocalSGD, run_steps
from fljax.data.batching import BatchPlan
from fljax.errors import OptionError
from fljax.ops import prox

__all__ = ["FedSLR", "Downlink", "low_rank_step"]

SOLVERS = ("fedslr", "lpgd", "gpgd")
GLOBAL_PROXES = ("nuclear", "l1", "none")
PERSONAL_PROXES = ("l1", "nuclear", "none")


@flax.struct.dataclass
class Downlink:
    """What the server sends: the GKR ``params`` (as the client rebuilds it from the factors) and ``numel``, the
    number of values on the wire, Σ_matrices min(r(m+n), mn) + Σ_vectors numel (spec §2, §5)."""

    params: Any
    numel: Any


def _measured_stats(x, conv_reshape: str) -> prox.LowRankStats:
    """Statistics of a leaf that was not thresholded: numerical rank #{s > max(m, n)·eps·s_max} (jittable)."""
    if x.ndim < 2:
        n = jnp.int32(x.size)
        return prox.LowRankStats(rank=jnp.int32(0), params=n, max_rank=jnp.int32(0), dense=n)
    mat = prox.matricize(x, conv_reshape=conv_reshape)
    m, n = mat.shape
    s = jnp.linalg.svd(mat, compute_uv=False)
    r = jnp.sum(s > s[0] * max(m, n) * jnp.finfo(mat.dtype).eps).astype(jnp.int32)
    return prox.LowRankStats(rank=r, params=jnp.minimum(r * (m + n), m * n).astype(jnp.int32),
                             max_rank=jnp.int32(min(m, n)), dense=jnp.int32(m * n))


@functools.partial(jax.jit, static_argnames=("conv_reshape", "exclude"))
def low_rank_step(params, tau, conv_reshape: str = "fedslr", exclude: str | None = None):
    """``(Prox_{τ‖·‖_*}(params), stats)`` leaf by leaf: SVT with threshold ``tau`` on every matrix leaf (ndim ≥ 2)
    whose path does not match ``exclude``; other leaves are unchanged. ``tau=None`` thresholds nothing. Stats
    (:class:`fljax.ops.prox.LowRankStats`) come from the SVT, or are measured (numerical rank) on the rest.
    Jitted, so that the server step is one program under the eager loop executor too."""
    skip = re.compile(exclude) if exclude else None

    def leaf(path, x):
        if tau is None or x.ndim < 2 or (skip is not None and skip.search(path)):
            return x, _measured_stats(x, conv_reshape)
        z, stats = prox.svt(prox.matricize(x, conv_reshape=conv_reshape), tau)
        return prox.unmatricize(z, x.shape, conv_reshape=conv_reshape), stats

    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    pairs = [leaf(tree.path_str(p), x) for p, x in leaves]
    return jax.tree.unflatten(treedef, [a for a, _ in pairs]), jax.tree.unflatten(treedef, [b for _, b in pairs])


def _stats_leaves(stats) -> list[prox.LowRankStats]:
    return jax.tree.leaves(stats, is_leaf=lambda s: isinstance(s, prox.LowRankStats))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FedSLR(Centralized, LocalSGD):
    """Hyperparameters (paper defaults, spec §6): ``lam`` λ = 1e-4, ``mu`` μ = 1e-3, ``eta_g`` η_g = 10; Phase I:
    ``local_epochs`` E1 = 2 of plain SGD, B = 20, lr 0.1·0.998^t, wd 1e-3 (D4, D18); Phase II: ``personal_epochs``
    E2 = 1, ``personal_weight_decay`` wd_p = 1e-3 (D3). The cohort mean is uniform (``weighting='uniform'``)."""

    name = "fedslr"
    summary = "FedSLR: low-rank global model (server SVT, per-client dual) + sparse personal part (Huang et al.)"
    lam: float = 1e-4
    mu: float = 1e-3
    eta_g: float = 10.0
    personal_epochs: int = 1
    personal_weight_decay: float = 1e-3
    solver: str = "fedslr"
    memory_efficient: bool = False
    global_prox: str = "nuclear"
    personal_prox: str = "l1"
    p_init: str = "zeros"
    conv_reshape: str = "fedslr"
    downlink: str = "factored"
    gpgd_threshold: str = "eta_g"
    lpgd_factor_uplink: bool = False
    nuclear_exclude: str | None = None
    weighting: str = "uniform"
    lr_decay: float = 0.998
    weight_decay: float = 1e-3
    local_epochs: int | None = 2
    local_steps: int | None = None

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        self.validate_local()
        for key, choices in [("solver", SOLVERS), ("global_prox", GLOBAL_PROXES), ("personal_prox", PERSONAL_PROXES),
                             ("p_init", ("zeros", "copy_w0")), ("conv_reshape", ("fedslr", "flat")),
                             ("downlink", ("factored", "dense")), ("gpgd_threshold", ("eta_g", "eta_l"))]:
            check_choice(key, getattr(self, key), choices)
        for key in ("lam", "mu", "personal_weight_decay", "personal_epochs"):
            if getattr(self, key) < 0:
                raise OptionError(key, f"must be >= 0, got {getattr(self, key)}.")
        if not self.eta_g > 0:
            raise OptionError("eta_g", f"must be > 0, got {self.eta_g}.")
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

    def global_prox_step(self, z, tau):
        """(w, stats) = Prox_{τR}(z) for the global regulariser R (nuclear, l1 or none)."""
        if self.global_prox == "nuclear":
            return low_rank_step(z, tau, self.conv_reshape, self.nuclear_exclude)
        if self.global_prox == "l1" and tau is not None:
            z = prox.L1(1.0)(z, tau)
        return low_rank_step(z, None, self.conv_reshape)

    def personal_prox_op(self) -> prox.Prox:
        """Phase II's prox: μ‖·‖₁ (LR+S), μ Σ‖·‖_* (LR+LR) or none."""
        if self.personal_prox == "l1":
            return prox.L1(self.mu)
        if self.personal_prox == "nuclear":
            return prox.Nuclear(self.mu, conv_reshape=self.conv_reshape)
        return prox.Identity()

    def steps_per_round(self, n_max: int) -> int:
        return super().steps_per_round(n_max) + BatchPlan(batch_size=self.batch_size,
                                                          epochs=self.personal_epochs).num_steps(n_max)

    # ------------------------------------------------------------------------------------------ state
    def init(self, ctx):
        w0 = ctx.model.init(self.init_key(ctx))
        server = {"params": w0, "stats": low_rank_step(w0, None, self.conv_reshape)[1]}
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
        numel = sum(s.params for s in _stats_leaves(server["stats"]))
        if self.downlink == "dense":
            numel = jnp.int32(tree.size(server["params"]))
        return Downlink(params=server["params"], numel=numel)

    # ------------------------------------------------------------------------------------------ client
    def phase_one(self, w_t, gamma, inp: ClientInput, key):
        """Eq. (4) by SGD from w_t: g = ∇CE(w; ξ) + wd·w − γ_i + (w − w_t)/η_g; then Eq. (5)."""
        pull = lambda w: tree.sub(tree.scale(1.0 / self.eta_g, tree.sub(w, w_t)), gamma)  # noqa: E731
        w_i, loss = self.train(inp.model.loss, w_t, inp, key=key, extra_grad=pull)
        return w_i, tree.axpy(1.0 / self.eta_g, tree.sub(w_t, w_i), gamma), loss

    def lpgd_local(self, w_t, inp: ClientInput, key):
        """Eqs. (18)–(19): w ← Prox_{lr·λ‖·‖_*}(w − lr·(∇CE(w; ξ) + wd·w)) at every step; returns the number of
        values of the last iterate's factors too."""
        lr = self.lr_at(inp.round)
        opt = self.client_optimizer(lr)
        sgd = self.sgd_step(inp.model.loss, opt)

        def step(carry, batch, k):
            (w, s), loss = sgd(carry[:2], batch, k)
            w, stats = low_rank_step(w, lr * self.lam, self.conv_reshape, self.nuclear_exclude)
            return (w, s, sum(st.params for st in _stats_leaves(stats))), loss

        numel0 = jnp.int32(tree.size(w_t))
        (w, _, numel), loss = run_steps(step, (w_t, opt.init(w_t), numel0), inp.train, self.plan(), key,
                                        inp.unroll)
        return w, numel, loss

    def phase_two(self, w_t, p, inp: ClientInput, key):
        """Eq. (7), E2 epochs from p_i: p ← Prox_{lr·μR}(p − lr·[∇_p CE(w_t + p; ξ) + wd_p·p]), anchored on the
        received w_t: the personal phase with plain SGD (weight decay wd_p) and the personal prox after every
        step."""
        lr = self.lr_at(inp.round)
        sgd = optax.chain(optax.add_decayed_weights(self.personal_weight_decay), optax.sgd(lr))
        return self.personal_phase(lambda q, batch: inp.model.loss(tree.add(w_t, q), batch), p, inp, key,
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
            w_i, loss = self.train(inp.model.loss, w_t, inp, key=k1)
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
            tau = self.lam * self.lr_at(ctx.round)
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

    def eval_metrics(self, server, clients) -> dict:
        """GKR rank density Σ_l r_l / Σ_l min(m_l, n_l), each matrix leaf's rank (``rank/<path>``), the GKR's
        factorised parameter count D_T, and over clients: the non-zero fraction of p_i and the mixed model's
        parameter count D_T + nnz(p_i) (mean and std; spec §5, D28)."""
        stats = _stats_leaves(server["stats"])
        params, _ = jax.tree_util.tree_flatten_with_path(server["params"])
        matrices = [(tree.path_str(p), st) for (p, x), st in zip(params, stats) if x.ndim >= 2]
        gkr = sum(st.params for st in stats).astype(jnp.float32)
        rank = sum(st.rank for _, st in matrices).astype(jnp.float32)
        max_rank = sum(st.max_rank for _, st in matrices).astype(jnp.float32)
        out = {"gkr_params": gkr, "gkr_rank_density": rank / jnp.maximum(max_rank, 1.0)}
        out.update({f"rank/{path}": st.rank.astype(jnp.float32) for path, st in matrices})
        nnz = jax.vmap(tree.count_nonzero)(clients["p"]).astype(jnp.float32)
        out["sparse_nnz_frac"] = jnp.mean(nnz) / tree.size(server["params"])
        out["mixed_params"] = gkr + jnp.mean(nnz)
        out["mixed_params_std"] = jnp.std(nnz)
        return out
