"""Sequence models over token ids (:mod:`fljax.data.text` gives the vocabulary layout) and their metrics.

Language models map ``x [B, T]`` token ids to next-token logits ``[B, T, V]`` (V = ``num_classes``, the vocabulary
with its special ids); the classifier maps them to one row of logits per sequence ``[B, C]``. Each module casts its
input to int32 (the model's initialisation feeds float zeros).

* :class:`LSTMLanguageModel` (``lstm``): embedding, stacked LSTMs, optional projection, linear ``head``. The
  Shakespeare model of McMahan et al. (2017) and Reddi et al. (2021): 8-d embedding, two LSTMs of 256, V = 90;
  the Stack Overflow model of Reddi et al.: 96-d embedding, one LSTM of 670, a 96-d projection, V = 10,004.
  (FedJAX's Haiku models also apply tanh to every LSTM output; the Keras models of the paper do not, nor does
  this one.)
* :class:`TransformerDecoder` (``transformer``): a small causal pre-LayerNorm decoder with learned positions.
* :class:`LSTMClassifier` (``lstm_cls``): embedding, stacked LSTMs, the last LSTM's state at each sequence's last
  non-padding position, linear ``head`` (LEAF's Sent140 model, without its pretrained GloVe embedding).

:class:`LSTM` is one layer with the Keras parameterisation (fused gates i, f, g, o; Glorot-uniform input kernel,
orthogonal recurrent kernel, forget-gate bias 1): the input projection of every position is one matmul before the
``lax.scan`` over time, which then does only the recurrent matmul.

**Metrics** (:func:`token_stats`, :func:`token_summary`): the algorithms' evaluation scores token labels with
:func:`fljax.models.model.accuracy_stats` (accuracy without specials) and
:func:`fljax.models.model.masked_cross_entropy` (mean cross-entropy over the non-padding targets), and adds the
accuracy with specials and the perplexity exp(Σ_i n_i ℓ_i / Σ_i n_i), n_i and ℓ_i being client i's non-padding
targets and its mean cross-entropy over them.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fljax.data.text import PAD
from fljax.options import at_least, each, option

__all__ = ["LSTM", "LSTMLanguageModel", "LSTMClassifier", "TransformerDecoder", "token_stats", "token_summary"]


def _unit_forget_bias(key, shape, dtype=jnp.float32):
    """Zero biases except the forget gate's (the second quarter), which are 1 (Keras' unit_forget_bias)."""
    h = shape[0] // 4
    return jnp.zeros(shape, dtype).at[h:2 * h].set(1.0)


class LSTM(nn.Module):
    """One LSTM layer over ``x [B, T, D]`` → hidden states ``[B, T, H]`` from zero initial state:
    z_t = x_t W + h_{t−1} U + b = (i, f, g, o);  c_t = σ(f) ⊙ c_{t−1} + σ(i) ⊙ tanh(g);  h_t = σ(o) ⊙ tanh(c_t)."""

    features: int

    @nn.compact
    def __call__(self, x):
        h = self.features
        w = self.param("input_kernel", nn.initializers.glorot_uniform(), (x.shape[-1], 4 * h))
        u = self.param("recurrent_kernel", nn.initializers.orthogonal(), (h, 4 * h))
        b = self.param("bias", _unit_forget_bias, (4 * h,))
        xw = jnp.swapaxes(x @ w + b, 0, 1)  # [T, B, 4H]: every position's input projection at once

        def step(carry, z_x):
            h_prev, c_prev = carry
            i, f, g, o = jnp.split(z_x + h_prev @ u, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
            h_new = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h_new, c), h_new

        zeros = jnp.zeros((x.shape[0], h), xw.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), xw)
        return jnp.swapaxes(hs, 0, 1)


def _ids(x):
    return x.astype(jnp.int32)


class LSTMLanguageModel(nn.Module):
    """Next-token LSTM: Embed(V, embed) – LSTM(hidden[0]) – … – [Dense(projection)] – Dense(V) (``head``)."""

    num_classes: int
    embed: int = option(8, "embedding width (Shakespeare 8, Stack Overflow 96)", at_least(1))
    hidden: Sequence[int] = option((256, 256), "widths of the stacked LSTM layers (Shakespeare [256, 256], Stack "
                                               "Overflow [670])", each(at_least(1)))
    projection: int | None = option(None, "width of a linear projection of the last LSTM's outputs before the head "
                                          "(Stack Overflow 96; null: none)", at_least(1))

    @nn.compact
    def __call__(self, x):
        z = nn.Embed(self.num_classes, self.embed)(_ids(x))
        for width in self.hidden:
            z = LSTM(width)(z)
        if self.projection is not None:
            z = nn.Dense(self.projection, name="projection")(z)
        return nn.Dense(self.num_classes, name="head")(z)


class LSTMClassifier(nn.Module):
    """Sequence classifier: Embed(vocab, embed) – LSTM(hidden[0]) – … – the last LSTM's state at the sequence's last
    non-padding position – Dense(C) (``head``). ``vocab``: the input ids' vocabulary (the data's, set by
    :func:`~fljax.models.model.make_model`)."""

    num_classes: int
    vocab: int = 0
    embed: int = option(100, "embedding width", at_least(1))
    hidden: Sequence[int] = option((256, 256), "widths of the stacked LSTM layers (LEAF Sent140: [256, 256])",
                                   each(at_least(1)))

    @nn.compact
    def __call__(self, x):
        ids = _ids(x)
        z = nn.Embed(self.vocab, self.embed)(ids)
        for width in self.hidden:
            z = LSTM(width)(z)
        last = jnp.maximum(jnp.sum(ids != PAD, axis=1) - 1, 0)
        h = jnp.take_along_axis(z, last[:, None, None], axis=1)[:, 0]
        return nn.Dense(self.num_classes, name="head")(h)


class _Block(nn.Module):
    width: int
    heads: int

    @nn.compact
    def __call__(self, z, mask):
        a = nn.MultiHeadDotProductAttention(self.heads, qkv_features=self.width)(nn.LayerNorm()(z), mask=mask)
        z = z + a
        m = nn.Dense(4 * self.width)(nn.LayerNorm()(z))
        return z + nn.Dense(self.width)(nn.gelu(m))


class TransformerDecoder(nn.Module):
    """Causal decoder: token and learned position embeddings of ``width``, ``layers`` pre-LayerNorm blocks (causal
    multi-head self-attention with ``heads`` heads, then a GELU MLP of 4·width, each with a residual), LayerNorm,
    Dense(V) (``head``). Padding sits after a sequence's tokens, so the causal mask keeps it out of every real
    position."""

    num_classes: int
    width: int = option(128, "model width (embedding and attention features)", at_least(1))
    layers: int = option(2, "decoder blocks", at_least(1))
    heads: int = option(4, "attention heads (must divide width)", at_least(1))
    max_len: int = option(512, "longest sequence the position embedding covers", at_least(1))

    @nn.compact
    def __call__(self, x):
        ids = _ids(x)
        t = ids.shape[1]
        if t > self.max_len:
            raise ValueError(f"transformer: sequences of {t} tokens exceed max_len={self.max_len}; raise "
                             f"model.options.max_len.")
        if self.width % self.heads:
            raise ValueError(f"transformer: heads={self.heads} must divide width={self.width}.")
        z = nn.Embed(self.num_classes, self.width)(ids)
        z = z + self.param("positions", nn.initializers.normal(0.02), (self.max_len, self.width))[:t]
        mask = nn.make_causal_mask(ids)
        for i in range(self.layers):
            z = _Block(self.width, self.heads, name=f"block{i}")(z, mask)
        return nn.Dense(self.num_classes, name="head")(nn.LayerNorm()(z))


def token_stats(logits, labels, mask):
    """(correct, counted) over every non-padding target of token labels ``[n, T]`` (specials included, argmax over
    the whole vocabulary) of the samples ``mask [n]`` marks."""
    counted = mask[..., None] & (labels != PAD)
    return jnp.sum((jnp.argmax(logits, -1) == labels) & counted), jnp.sum(counted)


def token_summary(stats, prefix: str) -> dict:
    """Summaries of token metrics over clients (``stats``: per-client arrays ``tokens_correct``, ``tokens`` and
    ``loss``, the mean cross-entropy over each client's non-padding targets); {} for classification stats:
    ``<prefix>_acc_with_specials`` (mean over clients with a test split, as ``<prefix>_acc``) and
    ``<prefix>_perplexity`` = exp of the token-weighted mean cross-entropy."""
    if getattr(stats, "tokens", None) is None:
        return {}
    tokens = stats.tokens.astype(jnp.float32)
    valid = tokens > 0
    acc = stats.tokens_correct / jnp.maximum(tokens, 1.0)
    mean_ce = jnp.sum(stats.loss * tokens) / jnp.maximum(jnp.sum(tokens), 1.0)
    return {f"{prefix}_acc_with_specials": jnp.sum(jnp.where(valid, acc, 0.0)) / jnp.maximum(jnp.sum(valid), 1),
            f"{prefix}_perplexity": jnp.exp(mean_ce)}
