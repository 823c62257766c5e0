"""Evaluation on every client's own test split.

For the global model (when the algorithm has one) and for each client's personalized model: accuracy and loss per
client, summarised as the unweighted mean over clients (the papers' protocol), the sample-weighted mean (pooled
correct / pooled count) and the 10th-percentile client. Clients with an empty test split are left out. The
algorithm's :meth:`~fljax.algorithms.Algorithm.eval_metrics` (state diagnostics such as the consensus distance of
decentralized methods) are merged into the summary.
"""
from __future__ import annotations

import jax.numpy as jnp

from fljax.engine.context import EVAL, RoundContext

__all__ = ["evaluate", "summarize"]


def summarize(stats, prefix: str) -> dict:
    """Scalar summaries of per-client :class:`fljax.algorithms.TestStats` (arrays over clients)."""
    count = stats.count.astype(jnp.float32)
    valid = count > 0
    nvalid = jnp.maximum(jnp.sum(valid), 1)
    acc = stats.correct / jnp.maximum(count, 1.0)
    return {
        f"{prefix}_acc": jnp.sum(jnp.where(valid, acc, 0.0)) / nvalid,
        f"{prefix}_acc_weighted": jnp.sum(stats.correct) / jnp.maximum(jnp.sum(count), 1.0),
        f"{prefix}_acc_p10": jnp.nanpercentile(jnp.where(valid, acc, jnp.nan), 10),
        f"{prefix}_loss": jnp.sum(jnp.where(valid, stats.loss, 0.0)) / nvalid,
        f"{prefix}_loss_weighted": jnp.sum(stats.loss * count) / jnp.maximum(jnp.sum(count), 1.0),
    }


def evaluate(algorithm, ctx: RoundContext, server, clients) -> tuple[dict, dict]:
    """(scalar summaries, per-client accuracy arrays) for the global and personalized models."""
    data = ctx.data
    shared = algorithm.eval_shared(server)
    keys = ctx.client_keys(jnp.arange(data.num_clients), EVAL)
    stats = ctx.map_clients(algorithm.evaluate_client, shared, (clients, data.train, data.test, keys))
    summary, per_client = {}, {}
    for kind, s in stats.items():
        summary.update(summarize(s, kind))
        per_client[f"{kind}_acc"] = s.correct / jnp.maximum(s.count.astype(jnp.float32), 1.0)
    extra = algorithm.eval_metrics(server, clients)
    clash = sorted(set(extra) & set(summary))
    if clash:
        raise ValueError(f"{type(algorithm).__name__}.eval_metrics returns {clash}, which clash with the accuracy "
                         f"summaries; rename them.")
    summary.update(extra)
    return summary, per_client
