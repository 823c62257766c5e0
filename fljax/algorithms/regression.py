"""The template of FedGiA and its Table IV baselines: algorithms on consensus regression problems (spec §1, §4).

Problem (FedGiA (4), (6)): min_x f(x) = (1/m) Σ_i f_i(x), f_i a loss of :mod:`fljax.problems.regression` on client
i's rows. The data is one trial of :class:`fljax.problems.ClientBlocks`: clients padded per size class, each class
a group of the simulation's population (:mod:`fljax.engine.population`, grouped data); there is no model
(``Simulation(algorithm, data)``, ``ctx.model`` is None). The server keeps every client's last upload
(``server.uploads [m, n]``, zero at the start); a round, with every client taking part::

    x        ← aggregate(data, server)                         the mean of the uploads: FedGiA (11), the baselines'
    down     ← broadcast(ctx, server)                          x, and what the clients need from the server
    result_i ← client_update(ClientInput(state_i, rows_i, down, id_i))      every client i, its size class's program
               (f_i(x), ∇f_i(x)) at the broadcast x, then its local steps: metrics {"loss": f_i(x), "grad": ∇f_i(x)},
               its new state, and its upload
    server   ← server_update(server, down, result)            the uploads kept, the server's counters

The server averages the uploads when the next round starts, not when they arrive: the same x, but averaging at the
end of the round rounded the last bit of x differently, and the published Table IV was computed this way.

and the round's metrics describe x, the point the round started from (spec §4, D12)::

    train_loss   = f(x) = (1/m) Σ_i f_i(x)          Table IV's Obj.
    error        = ‖∇f(x)‖²/m²                      the reference code's Error (D1)
    grad_norm_sq = ‖∇f(x)‖²                         the paper's Error (35)
    local_steps  = the round's local iterations (k0; FedPD's random aggregation: its draw)

so Table IV's run is :func:`fljax.engine.run_until` with a :class:`~fljax.engine.Tolerance` on ``error``:
tol = min(tol0, 0.1·Error(x⁰)), stop at Error ≤ tol, CR = the completed rounds (an experiment config's ``stop:``
section). ``evaluate`` reports the same quantities (``objective``, ``error``, ``grad_norm_sq``) at the aggregate.
Everything runs in float64 when x64 is on (spec §10.1: a config's ``x64: true``, or ``with jax.enable_x64(True)``
from Python, the data moved to the device inside it).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Algorithm
from fljax.engine.cohort import run_all, run_every
from fljax.engine.context import EVAL, INIT
from fljax.engine.protocol import ClientInput, ClientResult
from fljax.errors import OptionError
from fljax.options import at_least, option
from fljax.problems.regression import Loss, as_loss

__all__ = ["ConsensusRegression", "total_rows"]


def total_rows(data):
    """d = Σ_i d_i, the rows of all clients (traced)."""
    return sum(jnp.sum(blk.d) for blk in data.blocks)


def _loss_check(value) -> str | None:
    return None if isinstance(value, Loss) else f"must be a fljax.problems loss (make_loss(name)), got {value!r}."


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConsensusRegression(Algorithm):
    """``loss``: the f_i (static; a :class:`~fljax.problems.Loss`, or in a config its name or ``{name, <option>:
    value}``); ``k0``: local steps per round (may be traced). Subclasses implement ``init_population`` (or
    ``init_server`` and ``init_client``), ``broadcast``, ``client_update`` and ``server_update``."""

    generic: ClassVar[bool] = False
    problem: ClassVar[str] = "consensus regression"
    supports_groups: ClassVar[bool] = False  # no model groups: the size classes are the data's own groups
    loss: Loss | str = option("least_squares", "the clients' loss f_i: least_squares, logistic or nonconvex_logistic "
                                               "(or {name, mu, ...} with its options)", _loss_check)
    k0: int = option(1, "local steps per round", at_least(1))

    def __post_init__(self):
        try:
            object.__setattr__(self, "loss", as_loss(self.loss))
        except (TypeError, ValueError) as e:
            raise OptionError("loss", str(e)) from None
        super().__post_init__()

    def participants(self, num_clients: int) -> int:
        return num_clients  # every client computes ∇f_i at the aggregate, every round

    def steps_per_round(self, n_max: int) -> int:
        return self.k0

    # ------------------------------------------------------------------------------------------ state
    def init(self, ctx):
        return self.init_population(ctx)

    def init_population(self, ctx):
        """The server from :meth:`init_server`, every client's state from :meth:`init_client` (a tuple per size
        class)."""
        server = self.init_server(ctx)
        clients = run_all(ctx, lambda g: self.init_client, self.origin(ctx), None, INIT, test=False, concat=False)
        return server, clients

    def init_server(self, ctx):
        raise NotImplementedError

    def init_client(self, inp: ClientInput):
        """A client's initial state (``inp.down`` = x⁰; default: none)."""
        return None

    @staticmethod
    def origin(ctx, clients: int | None = None):
        """x⁰ = 0 in the data's dtype (spec §3), ``[n]``, or ``[clients, n]``: every client's first upload."""
        shape = (ctx.data.dim,) if clients is None else (clients, ctx.data.dim)
        return jnp.zeros(shape, ctx.data.blocks[0].A.dtype)

    # ------------------------------------------------------------------------------------------ rounds
    def aggregate(self, data, server):
        """x, the point the round starts from: the mean of the clients' last uploads (FedGiA (11))."""
        return tree.mean_clients(server.uploads)

    def broadcast(self, ctx, server):
        """What the server sends every client this round (a named pytree holding x = :meth:`aggregate`)."""
        raise NotImplementedError

    def client_update(self, inp: ClientInput) -> ClientResult:
        raise NotImplementedError

    def server_update(self, server, down, result: ClientResult):
        """The server after the round: the clients' uploads kept (default), its counters."""
        return server.replace(uploads=result.upload)

    @staticmethod
    def measured(f, g, state, upload) -> ClientResult:
        """A client's result: its new ``state``, its ``upload`` and the round's measurement at the broadcast x,
        {"loss": f_i(x), "grad": ∇f_i(x)} (the weight is unused: :meth:`aggregate` weighs)."""
        return ClientResult(state=state, upload=upload, weight=jnp.ones((), f.dtype), metrics={"loss": f, "grad": g})

    def local_steps(self, down):
        """The round's local iterations (k0; FedPD's random aggregation: its draw)."""
        return self.k0

    def round(self, ctx, server, clients):
        down = self.broadcast(ctx, server)
        clients, result = run_every(ctx, lambda g: self.client_update, down, clients)
        metrics = self.round_metrics(result.metrics["loss"], result.metrics["grad"], ctx.num_clients,
                                     self.local_steps(down), up=result.upload, down=down.x)
        return self.server_update(server, down, result), clients, metrics

    # ------------------------------------------------------------------------------------------ metrics
    @staticmethod
    def progress(f, g, m: int) -> dict:
        """f(x), Error = ‖∇f(x)‖²/m² (D1) and ‖∇f(x)‖² (35) from the clients' f_i(x), ∇f_i(x)."""
        sq = jnp.sum(jnp.square(jnp.mean(g, axis=0)))
        return {"train_loss": jnp.mean(f), "error": sq / m ** 2, "grad_norm_sq": sq}

    def round_metrics(self, f, g, m: int, steps, up, down) -> dict:
        """The round's metrics: :meth:`progress` at x, the local iterations and the bytes sent up and down."""
        return {**self.progress(f, g, m), "local_steps": jnp.asarray(steps, jnp.int32),
                "bytes_up": jnp.float32(tree.nbytes(up)), "bytes_down": jnp.float32(tree.nbytes(down) * m)}

    def measure_client(self, inp: ClientInput):
        """(f_i(x), ∇f_i(x)) of one client at ``inp.down`` = x."""
        return self.loss.value_and_grad(inp.down, inp.train)

    def evaluate(self, ctx, server, clients):
        f, g = run_all(ctx, lambda g: self.measure_client, self.aggregate(ctx.data, server), None, EVAL, test=False)
        p = self.progress(f, g, ctx.num_clients)
        return {"objective": p["train_loss"], "error": p["error"], "grad_norm_sq": p["grad_norm_sq"]}, {}
