"""Summaries of per-client test statistics.

Each client's accuracy and loss on its own test split are summarised as the unweighted mean over clients (the papers'
protocol), the sample-weighted mean (pooled correct / pooled count) and the 10th-percentile client; clients with an
empty test split are left out. (Which models are scored, and how, is the algorithm's
:meth:`~fljax.engine.protocol.FederatedAlgorithm.evaluate`.)
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["summarize"]


def summarize(stats, prefix: str) -> dict:
    """Scalar summaries of per-client test statistics (``stats.correct``, ``stats.count``, ``stats.loss``: arrays
    over clients)."""
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
