"""Decentralized (serverless) FL over a communication graph: the round template and the full-model baselines.

Client i holds w_i = (u_i, v_i): a shared part u_i, gossiped with its neighbours, and a personal part v_i that never
leaves the client (empty for full-model methods). There is no server state. One round t (DFedAlt Algorithm 1, with
all clients active, D14, and the gossip at the end of the round, D13):

    (z_i^t, v_i^{t+1}) ← LocalUpdate_i(u_i^t, v_i^t)       every client at once, through ``ctx.map_clients``
    W_t ← topology.sample(fold_in(round key, MIXING))        inside jit; static topologies are built once
    u_i^{t+1} = Σ_l W_t[i,l] · z_l^t                          shared leaves only; v_i is untouched (bit-identical)

The round's metrics carry the consensus distance CD = (1/m) Σ_i ‖u_i − ū‖² of the shared part before gossip
(``consensus_local``, of z^t) and after it (``consensus``); every evaluation reports both too
(:meth:`Decentralized.eval_metrics`). Evaluation point (D11): ``eval_point='local'`` (default) scores
(z_i^t, v_i^{t+1}), the model right after local training and before gossip, which the client state then keeps as
``z``, and reports the post-gossip model (u_i^{t+1}, v_i^{t+1}) as ``post_gossip_acc`` beside it; ``'gossip'``
scores only (u_i^{t+1}, v_i^{t+1}), the paper's "output after the final communication".

Gossip form: ``'dense'`` is one einsum with W [m, m] (O(m²·d)); ``'gather'`` sums over each node's neighbour
slots (O(m·s·d), for topologies with a static degree s); ``'auto'`` picks gather from
:data:`GATHER_MIN_NODES` nodes on (measured crossover, ``benchmarks/gossip_scaling.py``).

Time-varying gossip (heterogeneity spec, "Decentralized"): with ``link_failure`` p each link of the round's graph
fails independently with probability p, and with ``node_dropout`` q each node is unavailable with probability q (it
neither trains nor gossips and keeps its whole state); the round's W_t is the surviving graph re-weighted by
Metropolis–Hastings, symmetric and doubly stochastic (:func:`fljax.ops.gossip.surviving`; dense form).

Full-model baselines (every parameter shared, no personal part):

* DFedAvg (Sun et al. 2022): E local epochs of SGD from w_i, then w_i ← Σ_l W_t[i,l] z_l; ``momentum`` 0.
* DFedAvgM: the same with momentum 0.9, reset every round (DFedAlt spec D25).
* DFedSAM (Shi et al. 2023): DFedAvgM whose every local step takes the SAM gradient with ρ = 0.01 on the full
  model.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.algorithms.base import Algorithm, ClientInput, ClientResult
from fljax.algorithms.families import DECENTRALIZED
from fljax.algorithms.local_training import LocalTraining, local_training
from fljax.algorithms.registry import register
from fljax.engine.context import INIT, MIXING, TRAIN
from fljax.errors import OptionError
from fljax.ops import gossip, partition
from fljax.options import at_least, between, interval, one_of, option, with_default

__all__ = ["Decentralized", "Gossip", "DFedAvg", "DFedAvgM", "DFedSAM", "GATHER_MIN_NODES", "BASELINE"]

# The DFedAlt spec's local training of its baselines (and of DFedAlt's shared phase): lr 0.1, momentum 0.9 reset
# every round, weight decay 5e-3, clipping at 10, batch 128, 5 epochs.
BASELINE = dict(lr=0.1, momentum=0.9, weight_decay=5e-3, clip_norm=10.0, batch_size=128, local_epochs=5)
# From this many nodes on, 'auto' gossips in the gather form (when the topology has one). Measured on the 2-core CPU
# (benchmarks/gossip_scaling.py, DFedAvg with a 610-parameter model, random_k k = 10): whole rounds are faster in the
# gather form from m = 1000 on (1.18× at 1000, 2.37× at 10,000; 0.96× at 300); see benchmarks/results/gossip_scaling.md.
GATHER_MIN_NODES = 1000


@functools.lru_cache(maxsize=64)
def _static_mixing(topology) -> gossip.Mixing:
    """A static topology's mixing matrix, built once per (hashable) topology, as host (numpy) arrays: inside jit they
    are compile-time constants (closed-over device arrays would become extra inputs of the compiled round)."""
    with jax.ensure_compile_time_eval():  # the first call may come from inside a trace
        return jax.tree.map(np.asarray, topology.sample(None))


@functools.lru_cache(maxsize=64)
def _mixing_problem(topology, name: str) -> str | None:
    """What is wrong with the topology's mixing matrix (the static W, or a redrawn topology's draw from
    ``PRNGKey(0)``), as :func:`fljax.ops.gossip.check_mixing` words it; ``None`` when nothing is. Every W must be
    row-stochastic (W ≥ 0, W1 = 1); a static W must also be strongly connected, except ``identity`` (no
    communication, by design). One draw of a redrawn topology need not be connected (the DFedAlt neighbours study's
    ``random_k`` with k = 2 over m = 50 clients gave no strongly connected draw in 20 keys), so only its
    row-stochasticity is checked. Cached per topology, so a configuration validated twice draws once."""
    static = topology.static
    mixing = _static_mixing(topology) if static else jax.jit(topology.sample)(jax.random.PRNGKey(0))
    require = ("row_stochastic", "connected") if static and name != "identity" else ("row_stochastic",)
    try:
        gossip.check_mixing(mixing, require)
    except ValueError as e:
        return str(e) if static else f"{e}, in its draw from PRNGKey(0)"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decentralized(Algorithm):
    """Template for decentralized algorithms.

    Topology hyperparameters: ``topology`` (a name of :data:`fljax.ops.gossip.TOPOLOGIES`), ``k`` (neighbours of
    ``random_k``/``random_k_mh``; expected degree of ``erdos_renyi`` when ``p`` is null), ``p`` (``erdos_renyi``),
    ``torus_rows`` (``torus``; default: the largest divisor of m ≤ √m). ``eval_point``: 'local' | 'gossip'.
    ``client_init``: 'shared' (one initialisation for all clients, D12) or 'independent' (one per client).
    :meth:`validate` refuses a topology whose mixing matrix is not row-stochastic, or (static topologies other than
    ``identity``) not connected, through :func:`fljax.ops.gossip.check_mixing`.

    Subclasses implement ``client_update(inp) -> ClientResult`` (local training: the result's ``state["params"]``
    holds (z_i, v_i) and its ``upload`` the message z_i to the neighbours) and ``aggregate`` (the communication
    step; :class:`Gossip`: the mixing u_i = Σ_l W[i,l] z_l) and, when they do not share everything,
    ``shared_mask``; they may override ``init_clients`` (extra per-client state).
    """

    supports_groups = False  # gossip mixes whole models between neighbours: one architecture for all

    topology: str = option("random_k", "communication graph (a topology from `fljax list`)", one_of(gossip.TOPOLOGIES))
    k: int = option(10, "neighbours per node of random_k / random_k_mh (erdos_renyi: expected degree when p is null)",
                    at_least(0))
    p: float | None = option(None, "edge probability of erdos_renyi (null: from k)", between(0, 1))
    torus_rows: int | None = option(None, "rows of the torus (null: the largest divisor of m that is <= √m)",
                                    at_least(1))
    eval_point: Literal["local", "gossip"] = option(
        "local", "the scored model: 'local' (after local training, before gossip; the post-gossip model is logged "
                 "beside it) or 'gossip' (after the round's communication)")
    client_init: Literal["shared", "independent"] = option(
        "shared", "initial models: one 'shared' initialisation for every client (D12) or one per client "
                  "('independent')")
    link_failure: float = option(0.0, "time-varying gossip: the probability that a link of the graph fails in a "
                                      "round (the surviving graph re-weighted by Metropolis–Hastings)",
                                 interval(0, 1, "[)"))
    node_dropout: float = option(0.0, "time-varying gossip: the probability that a node is unavailable in a round "
                                      "(it neither trains nor gossips and keeps its model)", interval(0, 1, "[)"))

    # ------------------------------------------------------------------------------------------ configuration
    def validate(self, num_clients: int) -> None:
        try:
            topo = self.make_topology(num_clients)
        except ValueError as e:
            raise OptionError("topology", f"{self.topology!r} with {num_clients} clients: {e}.") from None
        problem = _mixing_problem(topo, self.topology)
        if problem is not None:
            raise OptionError("topology", f"{self.topology!r} with {num_clients} clients: {problem}.")

    def make_topology(self, num_clients: int):
        """The topology object for ``num_clients`` nodes, from the hyperparameters."""
        kw = {}
        if self.topology in ("random_k", "random_k_mh"):
            kw["k"] = self.k
        elif self.topology == "erdos_renyi":
            kw = {"p": self.p} if self.p is not None else {"k": self.k}
        elif self.topology == "torus" and self.torus_rows is not None:
            kw["rows"] = self.torus_rows
        topo = gossip.make_topology(self.topology, num_clients, **kw)
        if self.topology == "torus":
            topo.shape()  # refuses an impossible layout now, not inside jit
        return topo

    @staticmethod
    def has_gather_form(topology) -> bool:
        """Whether the topology's mixing matrices come with the neighbour-gather form (static graphs and
        ``random_k`` do; the MH-weighted random graphs do not)."""
        mixing = _static_mixing(topology) if topology.static else jax.eval_shape(topology.sample,
                                                                                  jax.random.PRNGKey(0))
        return mixing.idx is not None

    # ------------------------------------------------------------------------------------------ parameter split
    def shared_mask(self, params):
        """Leaf mask of the shared part u (default: every parameter is shared)."""
        return jax.tree.map(lambda _: True, params)

    def split(self, params):
        """(shared u, personal v), each with None in the other's slots."""
        return partition.split(params, self.shared_mask(params))

    def shared_part(self, params):
        return self.split(params)[0]

    # ------------------------------------------------------------------------------------------ state
    def init(self, ctx):
        m = ctx.num_clients
        if self.client_init == "shared":
            params = tree.broadcast_clients(ctx.model.init(ctx.stream(INIT)), m)
        else:
            # every client's draw, planned against the initialisation's memory budget
            params = ctx.map_init(lambda _, key: ctx.model.init(key), None, ctx.client_keys(jnp.arange(m), INIT))
        clients = self.init_clients(ctx, params)
        if self.eval_point == "local":
            clients["z"] = self.shared_part(clients["params"])
        return None, clients

    def init_clients(self, ctx, params) -> dict:
        """Per-client state from the stacked initial parameters (subclasses add e.g. masks)."""
        return {"params": params}

    # ------------------------------------------------------------------------------------------ one round
    def client_update(self, inp: ClientInput) -> ClientResult:
        """Local training of one client (``inp.down`` is None: there is no server)."""
        raise NotImplementedError

    @property
    def time_varying(self) -> bool:
        """Whether links fail or nodes drop out (heterogeneity spec, "Decentralized")."""
        return bool(self.link_failure) or bool(self.node_dropout)

    def available(self, ctx):
        """[m] bool: the nodes available this round (None: every node, always)."""
        if not self.node_dropout:
            return None
        return jax.random.uniform(jax.random.fold_in(ctx.stream(MIXING), 2), (ctx.num_clients,)) >= self.node_dropout

    def mixing(self, ctx) -> gossip.Mixing:
        """This round's mixing matrix: redrawn inside jit from the round key, or the static one; time-varying
        (``link_failure``, ``node_dropout``): the topology's surviving graph, re-weighted
        (:func:`fljax.ops.gossip.surviving`)."""
        topo = self.make_topology(ctx.num_clients)
        mixing = _static_mixing(topo) if topo.static else topo.sample(ctx.stream(MIXING))
        if not self.time_varying:
            return mixing
        return gossip.surviving(mixing, jax.random.fold_in(ctx.stream(MIXING), 1), self.link_failure,
                                self.available(ctx))

    def use_gather(self, mixing: gossip.Mixing) -> bool:
        """Whether this round's communication runs in the neighbour-gather form (here: never, the dense one)."""
        return False

    def aggregate(self, mixing: gossip.Mixing, result: ClientResult) -> dict:
        """The clients' state after the round's communication (``result``: after local training)."""
        raise NotImplementedError

    def messages(self, mixing: gossip.Mixing):
        """Number of (sender → receiver) transfers in the round: the off-diagonal nonzeros of W."""
        if self.use_gather(mixing):
            m = mixing.idx.shape[0]
            return jnp.sum((mixing.wts > 0) & (mixing.idx != jnp.arange(m)[:, None]))
        return jnp.sum(mixing.W > 0) - jnp.sum(jnp.diagonal(mixing.W) > 0)

    def message_bytes(self, result: ClientResult):
        """Bytes of one client's message (default: its dense upload)."""
        return tree.nbytes(result.upload) / tree.num_clients(result.upload)

    def round(self, ctx, server, clients):
        m = ctx.num_clients
        trained = {k: v for k, v in clients.items() if k != "z"}
        result = ctx.run_clients(self.client_update, None, trained, ctx.data.train,
                                 ctx.client_keys(jnp.arange(m), TRAIN))
        mixing = self.mixing(ctx)
        z = self.shared_part(result.state["params"])
        new = self.aggregate(mixing, result)
        if self.eval_point == "local":
            new["z"] = z
        available = self.available(ctx)
        if available is not None:  # an unavailable node neither trained nor gossiped: it keeps its whole state
            new = tree.where(available, new, clients)
        out = {k: jnp.mean(v) for k, v in result.metrics.items()}
        volume = (self.messages(mixing) * self.message_bytes(result)).astype(jnp.float32)
        out.update(consensus_local=gossip.consensus_distance(z),
                   consensus=gossip.consensus_distance(self.shared_part(new["params"])),
                   bytes_up=volume, bytes_down=volume)
        return None, new, out

    # ------------------------------------------------------------------------------------------ evaluation
    def personal_params(self, inp: ClientInput):
        if self.eval_point == "local":
            return partition.merge(inp.state["z"], self.split(inp.state["params"])[1])
        return inp.state["params"]

    def evaluate_client(self, inp: ClientInput) -> dict:
        """The headline ``personal`` model (see ``eval_point``) and, when that is the pre-gossip one, also the
        post-gossip model (u_i^{t+1}, v_i^{t+1}) as ``post_gossip`` (spec §6: both are logged)."""
        out = {"personal": self.test_stats(inp.model, self.personal_params(inp), inp.test)}
        if self.eval_point == "local":
            out["post_gossip"] = self.test_stats(inp.model, inp.state["params"], inp.test)
        return out

    def eval_metrics(self, server, clients, values=None) -> dict:
        out = {"consensus": gossip.consensus_distance(self.shared_part(clients["params"]))}
        if "z" in clients:
            out["consensus_local"] = gossip.consensus_distance(clients["z"])
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gossip(Decentralized):
    """A decentralized algorithm whose communication is the gossip u_i ← Σ_l W_t[i,l] z_l of the shared part, in
    the dense form (one einsum with W, O(m²·d)) or the gather form (a sum over each node's neighbour slots,
    O(m·s·d), for topologies with a static degree s): ``gossip_form``."""

    gossip_form: Literal["auto", "dense", "gather"] = option(
        "auto", "how the gossip runs: 'dense' (W as a matrix), 'gather' (neighbour slots; static degree only) or "
                "'auto' (gather from GATHER_MIN_NODES nodes on)")

    def validate(self, num_clients: int) -> None:
        super().validate(num_clients)
        if self.gossip_form == "gather" and self.time_varying:
            raise OptionError("gossip_form", "='gather' needs a graph of static degree; with link_failure or "
                                             "node_dropout each round's graph is re-weighted densely: use 'dense' or "
                                             "'auto'.")
        if self.gossip_form == "gather" and not self.has_gather_form(self.make_topology(num_clients)):
            raise OptionError("gossip_form", f"='gather' is impossible: topology {self.topology!r} has no "
                                             f"neighbour-gather form (its degree is not static); use 'dense' or "
                                             f"'auto'.")

    def use_gather(self, mixing: gossip.Mixing) -> bool:
        if self.gossip_form == "auto":
            return mixing.idx is not None and mixing.W.shape[0] >= GATHER_MIN_NODES
        return self.gossip_form == "gather"

    def mix(self, mixing: gossip.Mixing, shared):
        """u_i ← Σ_l W[i,l] z_l on every leaf of ``shared`` (dense or gather form)."""
        if self.use_gather(mixing):
            return gossip.gossip_gather(mixing.idx, mixing.wts, shared)
        return gossip.gossip(mixing, shared)

    def aggregate(self, mixing: gossip.Mixing, result: ClientResult) -> dict:
        """The clients' state after gossip: the messages mixed, u_i = Σ_l W[i,l] z_l, into the shared slots of each
        client's params; everything else as trained."""
        v = self.split(result.state["params"])[1]
        return {**result.state, "params": partition.merge(self.mix(mixing, result.upload), v)}


@register("dfedavgm", family=DECENTRALIZED, example="configs/dfedavgm.yaml",
          summary="DFedAvgM: decentralized FedAvg with local momentum, the full model gossiped (Sun et al. 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DFedAvgM(Gossip):
    """DFedAvgM: every client runs its local training (``local_epochs`` of momentum SGD) from its model, then gossips
    the whole model. ``rho`` > 0 takes SAM gradients on the full model (DFedSAM). Defaults: the DFedAlt spec's
    baselines (:data:`BASELINE`; ``random_k`` k = 10)."""

    local: LocalTraining = local_training(**BASELINE)
    rho: float = option(0.0, "SAM radius ρ of every local step on the full model (0: plain gradients)", at_least(0))

    def client_update(self, inp: ClientInput) -> ClientResult:
        params, loss = self.local.train(inp.model.loss, inp.state["params"], inp, sam_rho=self.rho)
        return ClientResult(state={"params": params}, upload=self.shared_part(params), weight=inp.train.count,
                            metrics={"train_loss": loss})


@register("dfedavg", family=DECENTRALIZED, example="configs/dfedavg.yaml",
          summary="DFedAvg: decentralized FedAvg, local SGD then gossip of the full model (Sun et al. 2022)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DFedAvg(DFedAvgM):
    """DFedAvg: DFedAvgM without momentum."""

    local: LocalTraining = local_training(**{**BASELINE, "momentum": 0.0})


@register("dfedsam", family=DECENTRALIZED, example="configs/dfedsam.yaml",
          summary="DFedSAM: DFedAvgM with sharpness-aware local steps on the full model (Shi et al. 2023)")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DFedSAM(DFedAvgM):
    """DFedSAM: DFedAvgM with SAM (ρ = 0.01) in every local step, on the full model."""

    rho: float = with_default(DFedAvgM, "rho", 0.01)
