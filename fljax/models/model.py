"""A model = a Flax module + its input shape + a masked classification loss, as a hashable static object."""
from __future__ import annotations

import dataclasses
import difflib

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fljax.models import zoo

__all__ = ["Model", "make_model", "check_model_options", "MODELS", "masked_cross_entropy", "accuracy_stats"]


def masked_cross_entropy(logits, labels, mask):
    """Mean softmax cross-entropy over the samples with ``mask`` true (0 when none is)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    m = mask.astype(ce.dtype)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)


def accuracy_stats(logits, labels, mask):
    """(number correct, number counted) over the masked samples."""
    correct = (jnp.argmax(logits, -1) == labels) & mask
    return jnp.sum(correct), jnp.sum(mask)


@dataclasses.dataclass(frozen=True)
class Model:
    """Static description of a classifier. ``params`` are the module's ``'params'`` collection."""

    module: nn.Module
    input_shape: tuple
    num_classes: int
    name: str

    def init(self, key):
        return self.module.init(key, jnp.zeros((1,) + tuple(self.input_shape), jnp.float32))["params"]

    def apply(self, params, x):
        return self.module.apply({"params": params}, x)

    def features(self, params, x):
        """The representation h(x) that enters the last layer ``head`` (its input), computed by intercepting the
        ``head`` call. Every zoo model returns ``head``'s output as its logits, so logits = head(h(x)); used by
        methods with several heads on one body (Fed-RoD)."""

        def take_head_input(next_fun, args, kwargs, context):
            if context.module.name == "head" and context.method_name == "__call__":
                return args[0]
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(take_head_input):
            return self.apply(params, x)

    def loss(self, params, batch):
        """Masked mean cross-entropy of ``batch`` (a :class:`fljax.data.Batch`)."""
        return masked_cross_entropy(self.apply(params, batch.x), batch.y, batch.mask)

    @property
    def has_conv(self) -> bool:
        return hasattr(self.module, "conv_impl")

    def with_conv(self, impl: str) -> "Model":
        """The same model (same parameters) with convolutions run by ``impl`` ('native' or 'patches')."""
        if not self.has_conv:
            return self
        return dataclasses.replace(self, module=self.module.clone(conv_impl=impl))

    def num_params(self) -> int:
        shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        return int(sum(x.size for x in jax.tree.leaves(shapes)))


MODELS = {
    "logreg": "multinomial logistic regression",
    "mlp": "fully connected ReLU network (hidden widths: hidden=[200, 200])",
    "cnn1": "QuPeD's CNN1: 2 conv (5x5, 6 and 16 channels) + 3 dense (120, 84, C)",
    "fedslr_cnn": "FedSLR's reduced CNN: conv3x3(32) - GN - conv3x3(64, s2) - GN - GAP - Dense(64) - Dense(C), "
                  "no biases, GroupNorm(2), PyTorch init (weight_init='pytorch'|'flax')",
    "resnet18_gn": "CIFAR ResNet-18 with GroupNorm (groups=2, head_bias=False by default; "
                   "weight_init='flax'|'pytorch'); a GPU model",
}


_MODULES = {"logreg": zoo.LogisticRegression, "mlp": zoo.MLP, "cnn1": zoo.CNN1, "fedslr_cnn": zoo.FedSLRCNN,
            "resnet18_gn": zoo.ResNet18GN}
_IMAGE_MODELS = ("cnn1", "fedslr_cnn", "resnet18_gn")  # convolutional: take conv_impl, need (H, W, C) inputs


def check_model_options(name: str, options: dict) -> None:
    """Refuse options the module of model ``name`` does not have, suggesting the closest valid one."""
    valid = {f.name for f in dataclasses.fields(_MODULES[name]) if f.init} - {"parent", "name", "num_classes",
                                                                              "conv_impl"}
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"model {name!r} has no option {key!r}.{hint} Valid: {sorted(valid)}.")


def make_model(name: str, input_shape, num_classes: int, conv_impl: str = "native", **kwargs) -> Model:
    """Build a model by name (see :data:`MODELS`); ``kwargs`` go to the module (e.g. ``hidden``, ``groups``)."""
    if name not in _MODULES:
        close = difflib.get_close_matches(name, MODELS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}.{hint}")
    check_model_options(name, kwargs)
    options = {k: tuple(v) if k == "hidden" else v for k, v in kwargs.items()}
    if name in _IMAGE_MODELS:
        options["conv_impl"] = conv_impl
    module = _MODULES[name](num_classes, **options)
    if kwargs.get("weight_init", "flax") not in zoo.INITS:
        raise ValueError(f"model option weight_init={kwargs['weight_init']!r} is unknown; choose one of {zoo.INITS}.")
    if len(input_shape) == 1 and name in _IMAGE_MODELS:
        raise ValueError(f"model {name!r} needs image inputs (H, W, C), but the data has shape {tuple(input_shape)}; "
                         f"use 'mlp' or 'logreg'.")
    return Model(module, tuple(input_shape), num_classes, name)
