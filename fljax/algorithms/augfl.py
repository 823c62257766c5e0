"""AugFL (Yue et al., *Augmenting Federated Learning with Pretrained Models*): federated meta-learning as a
linearised ADMM whose server step carries a knowledge-transfer regulariser from a pretrained model (PM) that only
the server holds (spec: AugFL §1–§5).

Problem (Eqs. 2–5): min_θ Σ_i w_i L_i(φ_i(θ), 𝒟_i^q) + λ R_h(θ, θ_p), φ_i(θ) = θ − α∇L_i(θ, 𝒟_i^s), in consensus
form with local copies θ_i, duals y_i and penalties ρ_i. One round t (Algorithm 1), every training client i at once
(θ^t broadcast, the client axis vmapped by the executor):

    k_i ← k_i + 1;  δ = 1/(10 k_i + 100)                                   (δ schedule; 'summable': 100/(10k+100)²)
    φ   = θ^t − α∇L_i(θ^t, 𝒟_i^s)                                          Eq. 7, one full-batch support step
    r   = ∇L_i(φ, 𝒟_i^q);   h ≈ ∇²L_i(θ^t, 𝒟_i^s)·r;   ĝ = r − α h         Eqs. 9–10 (hvp_mode fd | exact | none)
    θ_i = θ^t − (y_i + w_i ĝ)/ρ_i                                          Eq. 11  (ops.admm.linearised_prox)
    y_i ← y_i + ρ_i(θ_i − θ^t)                                             Eq. 12  (ops.admm.dual_ascent)
    server:  θ^{t+1} = [Σ_i (y_i + ρ_i θ_i) − λ G_t] / Σ_i ρ_i              Eq. 13  (ops.admm.admm_consensus)

G_t ≈ ∇_θ R_h(θ^t, θ_p) is computed by the server at θ^t on its own set with its frozen PM
(:mod:`fljax.algorithms.augfl_kt`: CRD with projection heads and memory banks by default). It reads ``ctx.server``;
the client update has no argument that could carry the PM. Evaluation (spec §7): a client's personalized model is
θ^t after ``adapt_steps`` full-batch gradient steps of size α on its support set, scored on its query set; target
clients (never trained) are reported as ``target_personal_*``.

``upload='pair'`` (default) sends the paper's (θ_i, y_i); ``upload='fused'`` sends the one vector y_i + ρ_i θ_i,
all that Eq. 13 uses (half the upload, the same θ^{t+1}; spec D11).

``only_kt=True`` is the "Only KT" arm: no clients, θ^{t+1} = θ^t − α G_t from the same θ^0.

Partial participation (``cohort_size`` = K < |𝓘|; spec D10, an extension, not in the paper): a uniform cohort S_t of
K training clients runs the client step (k_i, hence δ, counts a client's own updates), and the server keeps, for
every training client, the last term it received, s_i = y_i + ρ_i θ_i (stale for i ∉ S_t; s_i = ρ_i θ^0 before a
client's first round, i.e. θ_i^{−1} = θ^0, y_i^{−1} = 0), so that Eq. 13 still sums over all of 𝓘:

    s_i ← y_i^{t+1} + ρ_i θ_i^{t+1} for i ∈ S_t;    θ^{t+1} = [Σ_{i∈𝓘} s_i − λ G_t] / Σ_{i∈𝓘} ρ_i.

Defaults follow spec §5/§12: α = 0.03, ρ = 0.7·max(1, 40/|𝓘|) (``rho``), λ = 5, fd HVP with the δ schedule of
the code, w_i = D_i/Σ D_j over training clients (``weighting='uniform'``: 1/|𝓘|), full participation
(``cohort_size=None``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.families import PRETRAINED
from fljax.algorithms.registry import register
from fljax.algorithms.augfl_kt import KT_AUGMENTS, KT_KINDS, kt_grad, kt_init
from fljax.algorithms.base import Centralized, ClientInput, ClientResult
from fljax.engine.context import SERVER
from fljax.errors import ConfigError, OptionError
from fljax.ops import admm, meta
from fljax.options import at_least, each, greater_than, interval, one_of, option

__all__ = ["AugFL"]


@register("augfl", family=PRETRAINED, example="configs/augfl.yaml",
          summary="AugFL: federated meta-learning by linearised ADMM; the server transfers knowledge from its own "
                  "pretrained model (Yue et al.)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class AugFL(Centralized):
    generic = False  # needs a split with support/query sets (data.partition: meta_pairs)
    cohort_size: int | None = option(None, "training clients per round (null: all, the paper); K smaller: the others' "
                                           "last y_i + ρ_i θ_i stay in Eq. 13 (spec D10)", at_least(1))
    alpha: float = option(0.03,
                          "α of the one support step φ = θ − α∇L_i(θ, 𝒟_i^s) (and of the evaluation's adaptation)",
                          greater_than(0))
    rho: float | None = option(None, "ADMM penalty ρ_i for every client (null: 0.7·max(1, 40/clients))",
                               greater_than(0))
    rho_per_client: tuple[float, ...] | None = option(None, "one ADMM penalty per training client (instead of rho)",
                                                      each(greater_than(0)))
    lam: float = option(5.0, "λ: weight of the knowledge-transfer regulariser R_h in the server step (Eq. 13)",
                        at_least(0))
    hvp_mode: str = option("fd",
                           "Hessian-vector product of ĝ = r − α∇²L·r: 'fd' (finite difference), 'exact' or 'none'",
                           one_of(meta.HVP_MODES))
    delta_schedule: Literal["paper", "summable"] = option(
        "paper", "finite-difference width δ: 'paper' (1/(10k + 100)) or 'summable' (100/(10k + 100)²)")
    adapt_steps: int = option(1, "full-batch gradient steps of size α on the support set before a client is scored",
                              at_least(0))
    upload: Literal["pair", "fused"] = option(
        "pair", "'pair' sends (θ_i, y_i), 'fused' the one vector y_i + ρ_i θ_i (half the upload)")
    only_kt: bool = option(False, "the 'Only KT' arm: no clients, θ ← θ − α G_t")
    kt: str = option("crd", "knowledge-transfer regulariser: 'crd', 'crd_inbatch', 'kd', 'feat_l2' or 'param_l2'",
                     one_of(KT_KINDS))
    kt_ce_weight: float = option(1.0, "γ_CE: weight of the cross-entropy term of L_KT on the server's set",
                                 at_least(0))
    kt_weight: float = option(0.8, "β: weight of the transfer term of L_KT", at_least(0))
    kt_batch_size: int | None = option(128, "server minibatch size B of the knowledge-transfer gradient (null: one "
                                            "full batch of the server's set)", at_least(1))
    kt_dim: int = option(128, "embedding size d_e of the CRD projection heads", at_least(1))
    kt_tau: float = option(0.07, "CRD temperature τ", greater_than(0))
    kt_negatives: int | None = option(None, "CRD negatives N per sample (null: min(16384, D_s/2))", at_least(1))
    kt_momentum: float = option(0.5, "momentum m of the CRD memory banks", interval(0, 1, "[)"))
    kt_head_lr: float = option(0.002, "learning rate of the projection heads' SGD", greater_than(0))
    kt_head_momentum: float = option(0.9, "momentum of the projection heads' SGD", interval(0, 1, "[)"))
    kt_head_wd: float = option(5e-4, "weight decay of the projection heads' SGD", at_least(0))
    kd_temperature: float = option(4.0, "temperature T of kt='kd'", greater_than(0))
    kt_augment: str = option("none", "server-side augmentation of the knowledge-transfer batches: 'none' or "
                                     "'crop_flip' (random crop and mirror; the PM recomputed on them)",
                             one_of(KT_AUGMENTS))
    kt_crop_pad: int = option(4, "zero padding of kt_augment='crop_flip' before the random crop", at_least(0))

    def check(self) -> None:
        super().check()
        if self.rho_per_client is not None and self.rho is not None:
            raise OptionError("rho_per_client", f"cannot be set together with rho={self.rho}; give one of them.")

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if self.rho_per_client is not None and len(self.rho_per_client) != num_clients:
            raise OptionError("rho_per_client", f"must list one penalty per training client ({num_clients}), "
                                                f"got {len(self.rho_per_client)}.")

    # ------------------------------------------------------------------------------------------ pieces
    def partial(self, num_train: int) -> bool:
        """Whether the server keeps stale terms s_i = y_i + ρ_i θ_i (a cohort smaller than the training clients)."""
        return self.cohort_size is not None and self.cohort_size < num_train

    def uses_kt(self) -> bool:
        """False when λ is a Python 0 (G_t is then never computed); a traced λ (a grid) always computes it."""
        return self.only_kt or not (isinstance(self.lam, (int, float)) and self.lam == 0)

    def delta(self, k, dtype=jnp.float32):
        """δ of a client's k-th update: 1/(10k + 100) (paper and code) or the summable 100/(10k + 100)²; in
        ``dtype``, the parameters' (float64 in a float64 run)."""
        base = 10.0 * k.astype(dtype) + 100.0
        return 1.0 / base if self.delta_schedule == "paper" else 100.0 / base ** 2

    def penalties(self, num_train: int, num_clients: int, dtype=jnp.float32):
        """ρ_i for every client id (target clients get 1: they never train), in ``dtype`` (the parameters')."""
        if self.rho_per_client is not None:
            rho = jnp.asarray(self.rho_per_client, dtype)
        else:
            value = self.rho if self.rho is not None else 0.7 * max(1.0, 40.0 / num_train)
            rho = jnp.full((num_train,), value, dtype)
        return jnp.concatenate([rho, jnp.ones((num_clients - num_train,), dtype)])

    def meta_weights(self, counts, num_train: int, dtype=jnp.float32):
        """w_i = D_i/Σ_j D_j over the training clients ('samples') or 1/|𝓘| ('uniform'); 0 for target clients; in
        ``dtype`` (the parameters')."""
        train = jnp.arange(counts.shape[0]) < num_train
        raw = counts.astype(dtype) if self.weighting == "samples" else jnp.ones(counts.shape, dtype)
        raw = jnp.where(train, raw, 0.0)
        return raw / jnp.sum(raw)

    def _server_inputs(self, ctx):
        server = ctx.server
        if self.uses_kt() and (server is None or not server.has_pretrained):
            raise ConfigError(f"augfl with lam={self.lam}{' and only_kt' if self.only_kt else ''} needs a server "
                              f"set and a pretrained model: data.partition: meta_pairs and server.pretrained "
                              f"(e.g. cnn_l), or algo.lam: 0.")
        relabelled = ctx.data.server_classes != ctx.data.num_classes
        if relabelled and self.uses_kt() and (self.kt == "kd" or self.kt_ce_weight > 0):
            raise ConfigError(f"augfl kt={self.kt} with kt_ce_weight={self.kt_ce_weight} compares the meta-model's "
                              f"{ctx.data.num_classes}-way head with the server's {ctx.data.server_classes} classes; "
                              f"with relabelled clients use kt_ce_weight: 0 and kt crd, crd_inbatch or feat_l2.")
        if self.kt == "param_l2" and self.uses_kt():
            pm_shapes = jax.tree.map(jnp.shape, server.pm_params)
            if pm_shapes != jax.tree.map(jnp.shape, ctx.model.init(jax.random.PRNGKey(0))):
                raise ConfigError("augfl kt=param_l2 needs a pretrained model of the meta-model's own architecture "
                                  "(server.pretrained: same).")
        return server

    # ------------------------------------------------------------------------------------------ protocol
    def init(self, ctx):
        params = ctx.model.init(self.init_key(ctx))
        server = self._server_inputs(ctx)
        kt = kt_init(self, jax.random.fold_in(self.init_key(ctx), 1), ctx.model, server) if self.uses_kt() else {}
        n, k, dtype = ctx.num_clients, ctx.num_train_clients, tree.float_dtype(params)
        clients = {"y": tree.broadcast_clients(tree.zeros_like(params), n), "k": jnp.zeros((n,), jnp.int32),
                   "w": self.meta_weights(ctx.data.train.count, k, dtype), "rho": self.penalties(k, n, dtype)}
        server = {"params": params, "kt": kt}
        if self.partial(k):  # s_i = ρ_i θ^0 until client i first reports (θ_i^{−1} = θ^0, y_i^{−1} = 0)
            start = tree.broadcast_clients(params, k)
            server["terms"] = admm.consensus_terms(start, tree.zeros_like(start), clients["rho"][:k])
        return server, clients

    def client_update(self, inp: ClientInput) -> ClientResult:
        st, theta = inp.state, inp.down
        k = st["k"] + 1
        loss, g = meta.meta_value_and_grad(inp.model.loss, theta, inp.train.support_batch(),
                                           inp.train.query_batch(), self.alpha, mode=self.hvp_mode,
                                           delta=self.delta(k, tree.float_dtype(theta)))
        theta_i = admm.linearised_prox(theta, st["y"], g, st["w"], st["rho"])
        y = admm.dual_ascent(st["y"], theta_i, theta, st["rho"])
        upload = ({"theta": theta_i, "y": y} if self.upload == "pair"
                  else {"fused": jax.tree.map(lambda a, t: a + st["rho"] * t, y, theta_i)})
        return ClientResult(state={**st, "y": y, "k": k}, upload=upload,
                            weight=inp.train.count, metrics={"train_loss": loss, "meta_loss": loss * st["w"]})

    def knowledge_transfer(self, ctx, server):
        """(G_t, new KT state, metrics) at θ^t on the server's set (ctx.server)."""
        g, kt, metrics = kt_grad(self, ctx.model, server["params"], server["kt"], ctx.server,
                                 ctx.stream(SERVER), ctx.data.server_classes)
        return g, kt, metrics

    def whole_population(self) -> str | None:
        return "its server reads every client's ADMM penalty ρ_i (and keeps every client's stale term) each round"

    def server_update(self, ctx, server, clients, cohort, result):
        g, kt = None, server["kt"]
        if self.uses_kt():
            g, kt, _ = self.knowledge_transfer(ctx, server)
        up = result.upload if result.valid is None else tree.take_clients(result.upload, cohort)
        rho = clients["rho"][cohort]
        if self.upload == "fused":  # Σ_i (y_i + ρ_i θ_i) arrives summed per client: θ_i = 0, y_i = the fused vector
            up = {"theta": tree.zeros_like(up["fused"]), "y": up["fused"]}
        if "terms" not in server:
            return {"params": admm.admm_consensus(up["theta"], up["y"], rho, g, self.lam), "kt": kt}
        fresh = admm.consensus_terms(up["theta"], up["y"], rho)
        terms = tree.put_clients(server["terms"], cohort, fresh)  # the others' stale s_i stay in the sum
        k = ctx.num_train_clients
        theta = admm.admm_consensus(tree.zeros_like(terms), terms, clients["rho"][:k], g, self.lam)
        return {"params": theta, "kt": kt, "terms": terms}

    def round(self, ctx, server, clients):
        if not self.only_kt:
            server, clients, metrics = super().round(ctx, server, clients)
            metrics["meta_loss"] = metrics["meta_loss"] * ctx.num_train_clients  # Σ_i w_i L_i(φ_i, 𝒟_i^q)
            return server, clients, metrics
        g, kt, metrics = self.knowledge_transfer(ctx, server)
        theta = tree.axpy(-self.alpha, g, server["params"])
        metrics = {"train_loss": metrics["kt_loss"], "bytes_up": jnp.float32(0), "bytes_down": jnp.float32(0)}
        return {**server, "params": theta, "kt": kt}, clients, metrics

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared

    def personal_params(self, inp: ClientInput):
        """θ after ``adapt_steps`` full-batch steps of size α on the client's support set (spec §7)."""
        adapt = functools.partial(meta.adapt, inp.model.loss, batch=inp.train.support_batch(), alpha=self.alpha)
        params = inp.down
        for _ in range(self.adapt_steps):
            params = adapt(params)
        return params
