"""The template of FedGiA and its Table IV baselines: algorithms on consensus regression problems (spec §1, §4).

Problem (FedGiA (4), (6)): min_x f(x) = (1/m) Σ_i f_i(x), f_i a loss of :mod:`fljax.problems.regression` on client
i's rows. The data is one trial of :class:`fljax.problems.ClientBlocks`: clients padded per size class, each class
a group of :func:`fljax.engine.map_groups`; there is no model (``Simulation(algorithm, data)``, ``ctx.model`` is
None). Every round starts at an aggregate x (``aggregate``: FedGiA (11), the baselines' mean) and measures there,
once per client, (f_i(x), ∇f_i(x)); the round's metrics describe x (spec §4, D12)::

    train_loss   = f(x) = (1/m) Σ_i f_i(x)          Table IV's Obj.
    error        = ‖∇f(x)‖²/m²                      the reference code's Error (D1)
    grad_norm_sq = ‖∇f(x)‖²                         the paper's Error (35)
    local_steps  = the round's local iterations (k0; FedPD's random aggregation: its draw)

so Table IV's run is :func:`fljax.engine.run_until` with a :class:`~fljax.engine.Tolerance` on ``error``:
tol = min(tol0, 0.1·Error(x⁰)), stop at Error ≤ tol, CR = the completed rounds. ``evaluate`` reports the same
quantities (``objective``, ``error``, ``grad_norm_sq``) at the current aggregate. Everything runs in float64 when x64
is on (spec §10.1: ``with jax.enable_x64(True)``); the data should be moved to the device inside it.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from fljax import tree
from fljax.algorithms.base import Algorithm
from fljax.options import at_least, option
from fljax.problems.regression import LeastSquares, Loss

__all__ = ["ConsensusRegression", "total_rows"]


def total_rows(data):
    """d = Σ_i d_i, the rows of all clients (traced)."""
    return sum(jnp.sum(blk.d) for blk in data.blocks)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConsensusRegression(Algorithm):
    """``loss``: the f_i (static); ``k0``: local steps per round (may be traced)."""

    generic: ClassVar[bool] = False
    problem: ClassVar[str] = "consensus regression"
    loss: Loss = option(LeastSquares(), "the clients' loss f_i (a fljax.problems loss, make_loss(name))",
                        lambda v: None if isinstance(v, Loss) else
                        f"must be a fljax.problems loss (make_loss(name)), got {v!r}.")
    k0: int = option(1, "local steps per round", at_least(1))

    def participants(self, num_clients: int) -> int:
        return num_clients  # every client computes ∇f_i at the aggregate, every round

    def steps_per_round(self, n_max: int) -> int:
        return self.k0

    # ------------------------------------------------------------------------------------------ shared pieces
    def aggregate(self, data, server, clients):
        """The point x a round starts from (FedGiA (11); the baselines' mean)."""
        raise NotImplementedError

    def client_value_grad(self, x, per_client):
        """(f_i(x), ∇f_i(x)) of one client (``per_client`` = (its rows, -, -), as :func:`map_groups` passes it)."""
        blk, _, _ = per_client
        return self.loss.value_and_grad(x, blk)

    def measure(self, ctx, x):
        """(f_i(x) [m], ∇f_i(x) [m, n]) for every client."""
        return ctx.map_groups(self.client_value_grad, x, ctx.data.blocks)

    @staticmethod
    def progress(f, g, m: int) -> dict:
        """f(x), Error = ‖∇f(x)‖²/m² (D1) and ‖∇f(x)‖² (35) from the clients' f_i(x), ∇f_i(x)."""
        sq = jnp.sum(jnp.square(jnp.mean(g, axis=0)))
        return {"train_loss": jnp.mean(f), "error": sq / m ** 2, "grad_norm_sq": sq}

    def round_metrics(self, f, g, m: int, steps, up, down) -> dict:
        """The round's metrics: :meth:`progress` at x, the local iterations and the bytes sent up and down."""
        return {**self.progress(f, g, m), "local_steps": jnp.asarray(steps, jnp.int32),
                "bytes_up": jnp.float32(tree.nbytes(up)), "bytes_down": jnp.float32(tree.nbytes(down) * m)}

    def evaluate(self, ctx, server, clients):
        f, g = self.measure(ctx, self.aggregate(ctx.data, server, clients))
        p = self.progress(f, g, ctx.num_clients)
        return {"objective": p["train_loss"], "error": p["error"], "grad_norm_sq": p["grad_norm_sq"]}, {}
