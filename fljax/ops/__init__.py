"""fljax.ops: composable pytree transformations (prox, gossip, ADMM, SAM, partitions, quantizers, ...)."""
