"""In-jit per-client batching.

A :class:`BatchPlan` turns (key, client count) into a static-shape schedule of minibatches for one round of
local training: index array ``idx [K, B]``, sample mask ``mask [K, B]`` and step mask ``active [K]``. It is a pure
function of traced values, so it runs inside ``jit`` and ``vmap`` over clients; padded rows (index >= count) are
never selected. Modes:

* ``epochs=E``: E passes over the client's data, reshuffled every epoch, ⌈n_i/B⌉ steps per epoch, the last batch
  partial (masked). Shapes are static, so the schedule has K = E·⌈N_max/B⌉ steps, of which the ones past a client's
  own ⌈n_i/B⌉ per epoch are inactive: :func:`fljax.algorithms.local_training.run_steps` runs only the active ones
  (a cohort under ``vmap`` as many as its largest member needs).
* ``steps=K``: K batches of B from the client's shuffled stream (concatenated epochs, a new permutation per
  epoch); every step is active, whatever the client's size.
* ``steps=K, replacement=True``: every sample drawn uniformly with replacement.
* ``steps=K, poisson=True``: Poisson batches (DP-SGD's lots, Abadi et al. 2016): in every step each of the client's
  n_i samples independently with probability q_i = min(1, B/n_i) (expected size B), in a buffer of all N_max rows
  with the sample mask marking the drawn ones (static shapes; never truncated, so the accountant's Poisson event
  is exact). Sample i is in iff its uniform 32-bit key is below ⌊q_i·2³²·(1 − 2⁻²²)⌋ (always when q_i = 1): the realised
  probability never exceeds q_i despite float32 rounding.
* ``batch_size=None``: full batch, one step over all valid rows.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ["BatchPlan", "ClockPlan", "Batch", "chunk_rows", "gather_batch", "random_batch"]


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    batch_size: int | None = 20
    epochs: int | None = None
    steps: int | None = None
    replacement: bool = False
    poisson: bool = False

    def __post_init__(self):
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None (full batch), got {self.batch_size}.")
        if self.batch_size is not None and (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs or steps for minibatch training.")
        if self.epochs is not None and self.epochs < 0 or self.steps is not None and self.steps < 0:
            raise ValueError(f"epochs and steps must be >= 0, got epochs={self.epochs}, steps={self.steps}.")
        if self.replacement and self.steps is None:
            raise ValueError("replacement=True needs steps=K (sampling with replacement has no epochs).")
        if self.poisson and (self.steps is None or self.batch_size is None or self.replacement):
            raise ValueError("poisson=True needs steps=K and a batch_size B (the expected batch), without "
                             "replacement.")

    def num_steps(self, n_max: int) -> int:
        """Static number of scan steps K for clients padded to ``n_max`` rows."""
        if self.batch_size is None:
            return 1 if self.steps is None and self.epochs is None else (self.epochs if self.steps is None else self.steps)
        if self.epochs is not None:
            return self.epochs * math.ceil(n_max / self.batch_size)
        return self.steps

    def active_steps(self, count, n_max: int):
        """Steps that actually train for a client with ``count`` valid rows (traced): E·⌈count/B⌉ in ``epochs``
        mode (the rest of the K static steps are padding), else K (SCAFFOLD's K in c_i⁺)."""
        if self.batch_size is not None and self.epochs is not None:
            return self.epochs * ((count + self.batch_size - 1) // self.batch_size)
        return jnp.asarray(self.num_steps(n_max), jnp.int32)

    @property
    def sampling(self) -> str:
        """How its batches are drawn, by the local-training option that asks for it (``algo.sampling``): 'poisson',
        'replacement' or 'shuffle' (shuffled batches, or full batches)."""
        return "poisson" if self.poisson else "replacement" if self.replacement else "shuffle"

    def width(self, n_max: int) -> int:
        return n_max if self.batch_size is None or self.poisson else self.batch_size

    def every_step_active(self, n_min: int, n_max: int) -> bool:
        """Whether every client with n_min … n_max rows runs all K scheduled steps (static): always in ``steps``
        mode and with full batches; in ``epochs`` mode when ⌈n_min/B⌉ = ⌈n_max/B⌉. Else a client's steps past its
        own E·⌈n_i/B⌉ are inactive, and :func:`fljax.algorithms.local_training.run_steps` skips them."""
        if self.batch_size is None or self.epochs is None:
            return True
        return -(-n_min // self.batch_size) == -(-n_max // self.batch_size)

    def schedule(self, key, count, n_min: int, n_max: int):
        """``(idx [K, B], mask [K, B], active [K])`` for one client with ``count`` valid rows."""
        k, b = self.num_steps(n_max), self.width(n_max)
        if self.batch_size is None:  # full batch, repeated K times
            idx = jnp.broadcast_to(jnp.arange(n_max), (k, n_max))
            mask = idx < count
            return idx, mask, jnp.ones((k,), bool)
        if self.poisson:
            rate = jnp.minimum(1.0, self.batch_size / jnp.maximum(count, 1).astype(jnp.float32))
            bound = jnp.floor(rate * (2.0 ** 32 * (1 - 2.0 ** -22)))  # < 2**32: no overflow, never above q_i
            drawn = (jax.random.bits(key, (k, n_max), jnp.uint32) < bound.astype(jnp.uint32)) | (rate >= 1)
            idx = jnp.broadcast_to(jnp.arange(n_max), (k, n_max))
            return idx, drawn & (idx < count), jnp.ones((k,), bool)
        if self.replacement:
            u = jax.random.uniform(key, (k, b))
            idx = jnp.minimum((u * count).astype(jnp.int32), count - 1)
            return idx, jnp.ones((k, b), bool), jnp.ones((k,), bool)
        if self.epochs is not None:
            per_epoch = math.ceil(n_max / b)
            orders = _epoch_orders(key, count, n_max, self.epochs)  # [E, N]
            pad = per_epoch * b - n_max
            orders = jnp.pad(orders, ((0, 0), (0, pad)))
            pos = jnp.arange(per_epoch * b)
            mask = jnp.broadcast_to(pos < count, (self.epochs, per_epoch * b))
            idx = orders.reshape(k, b)
            mask = mask.reshape(k, b)
            return idx, mask, mask[:, 0]
        # steps: a stream of concatenated shuffled epochs; enough epochs for the smallest client
        n_epochs = (k * b - 1) // max(n_min, 1) + 1  # position p < k·b lies in epoch p // count <= (k·b-1) // n_min
        orders = _epoch_orders(key, count, n_max, n_epochs)
        p = jnp.arange(k * b)
        idx = orders[p // count, p % count].reshape(k, b)
        return idx, jnp.ones((k, b), bool), jnp.ones((k,), bool)


@dataclasses.dataclass(frozen=True)
class ClockPlan:
    """Minibatches on a global iteration clock that spans rounds (QuPeD §1, §6): iteration t of a client lies in
    epoch ⌊t/I⌋ at position p = t mod I; epoch e draws its permutation π_e of the client's valid rows from
    ``fold_in(key, e)`` (pass the client's round-independent clock key). A round runs ``steps`` iterations from
    ``start`` (traced: t = round·τ), so epochs straddle rounds as in the paper. Two ways to cut an epoch:

    * ``batch_size=B``: I = ⌈N_max/B⌉ and position p takes π_e's rows [pB, pB + B), masked past the client's count
      n_i; a client smaller than N_max gets all-masked batches at the end of an epoch, which the step function must
      skip (``jnp.any(batch.mask)``).
    * ``chunks=K`` (``batch_size=None``; QuPeD §8, ragged FEMNIST): I = K for every client; position p takes the
      contiguous chunk π_e[⌊p·n_i/K⌋, ⌊(p+1)·n_i/K⌋) (:func:`chunk_rows`: sizes ⌊n_i/K⌋ or ⌈n_i/K⌉, summing to
      n_i), padded to B_max = ⌈N_max/K⌉ with a sample mask. Every chunk is non-empty when K <= N_min.

    Every step is active, so a step function that counts iterations stays on the clock."""

    batch_size: int | None
    steps: int
    start: object = 0
    chunks: int | None = None

    def __post_init__(self):
        if (self.batch_size is None) == (self.chunks is None):
            raise ValueError("give exactly one of batch_size and chunks.")

    def iters_per_epoch(self, n_max: int) -> int:
        return self.chunks or math.ceil(n_max / self.batch_size)

    def num_steps(self, n_max: int) -> int:
        return self.steps

    def width(self, n_max: int) -> int:
        return math.ceil(n_max / self.chunks) if self.chunks else self.batch_size

    def every_step_active(self, n_min: int, n_max: int) -> bool:
        return True  # every iteration of the clock runs (a step function skips all-masked batches itself)

    def schedule(self, key, count, n_min: int, n_max: int):
        """``(idx [K, B], mask [K, B], active [K])`` of iterations start … start + K − 1."""
        per_epoch, b = self.iters_per_epoch(n_max), self.width(n_max)
        t = self.start + jnp.arange(self.steps)
        epoch, pos = t // per_epoch, t % per_epoch
        orders = jax.vmap(lambda e: _epoch_orders(jax.random.fold_in(key, e), count, n_max, 1)[0])(epoch)
        if self.chunks:
            idx, mask = jax.vmap(lambda o, p: chunk_rows(o, count, p, self.chunks, b))(orders, pos)
            return idx, mask, jnp.ones((self.steps,), bool)
        rows = pos[:, None] * b + jnp.arange(b)
        idx = jnp.take_along_axis(jnp.pad(orders, ((0, 0), (0, per_epoch * b - n_max))), rows, axis=1)
        return idx, rows < count, jnp.ones((self.steps,), bool)


def chunk_rows(order, count, pos, chunks: int, width: int):
    """``(idx [width], mask [width])``: chunk ``pos`` of ``order``'s first ``count`` entries cut into ``chunks``
    contiguous chunks, [⌊pos·n/K⌋, ⌊(pos+1)·n/K⌋) with n = count, K = chunks (sizes ⌊n/K⌋ or ⌈n/K⌉, summing to n);
    positions past the chunk's size are masked (index 0). ``width`` >= ⌈n/K⌉."""
    lo, hi = pos * count // chunks, (pos + 1) * count // chunks
    j = jnp.arange(width)
    mask = j < hi - lo
    return jnp.where(mask, order[jnp.minimum(lo + j, order.shape[0] - 1)], 0), mask


PACKED_SORT_MAX_BITS = 12  # index bits under which the fast packed sort keeps >= 20 random bits per key


def _epoch_orders(key, count, n_max: int, n_epochs: int):
    """``[n_epochs, n_max]``: row e is a fresh uniformly random permutation of the valid rows [0, count), followed by
    the padded rows.

    Each row sorts random keys. For ``n_max <= 4096`` the row index is packed into the low bits of a random uint32
    and the packed keys are sorted as one operand, which XLA:CPU does ~7× faster than ``argsort`` (pairs); ties of
    the remaining >= 20 random bits (probability < 2^-20 per pair) are broken by row index. Larger clients use
    ``argsort`` of uniform floats.
    """
    nb = max(1, (n_max - 1).bit_length())
    valid = jnp.arange(n_max) < count
    if nb <= PACKED_SORT_MAX_BITS:
        low = jnp.uint32((1 << nb) - 1)
        bits = jax.random.bits(key, (n_epochs, n_max), jnp.uint32) & ~low
        bits = jnp.where(valid, bits & jnp.uint32(0x7FFFFFFF), jnp.uint32(0xFFFFFFFF) & ~low)  # padding last
        return (jnp.sort(bits | jnp.arange(n_max, dtype=jnp.uint32), axis=-1) & low).astype(jnp.int32)
    u = jax.random.uniform(key, (n_epochs, n_max))
    return jnp.argsort(jnp.where(valid, u, 2.0), axis=-1).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Batch:
    """A minibatch: inputs ``x [B, ...]``, labels ``y [B]``, sample mask ``mask [B]``."""

    x: jax.Array
    y: jax.Array
    mask: jax.Array


def gather_batch(x, y, idx, mask) -> Batch:
    """Rows ``idx`` of one client's arrays as a :class:`Batch`."""
    return Batch(x=jnp.take(x, idx, axis=0), y=jnp.take(y, idx, axis=0), mask=mask)


def random_batch(key, train, batch_size: int) -> Batch:
    """``batch_size`` rows drawn uniformly without replacement from one client's valid rows (``train`` a
    :class:`fljax.data.ClientArrays` slice), masked past its count: a fresh minibatch outside the epoch clock."""
    order = _epoch_orders(key, train.count, train.n_max, 1)[0]
    idx = jnp.pad(order, (0, max(0, batch_size - train.n_max)))[:batch_size]
    return gather_batch(train.x, train.y, idx, jnp.arange(batch_size) < train.count)
