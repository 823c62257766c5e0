"""Flax modules: multinomial logistic regression, MLP, QuPeD's CNN family (CNN1, CNN2 and the reduced CNN1-S, CNN2-S),
FedSLR's reduced CNN, ResNet-18 with GroupNorm.

Every convolution is :class:`fljax.models.layers.Conv`, whose ``impl`` ("native" or "patches") is a field of the
module, so the same parameters run with either implementation. A module's options (the fields a config's
``model.options`` may set) are declared with :func:`fljax.options.option`: a default, a one-line doc, a check.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Literal, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fljax.models.layers import Conv, max_pool_2x2
from fljax.options import at_least, each, option

__all__ = ["LogisticRegression", "MLP", "CNN1", "CNN2", "CNN1S", "CNN2S", "SmallCNN", "LargeCNN", "FedSLRCNN",
           "ResNet18GN", "CifarResNet", "CifarResNet32", "EmnistCNN", "INITS", "kernel_init", "qcnn"]

Init = Literal["flax", "pytorch"]
INITS = typing.get_args(Init)


def _divides(channels: int):
    """GroupNorm's groups must divide every normalised layer's channels (all multiples of ``channels``)."""
    return lambda g: None if g >= 1 and channels % g == 0 else \
        f"must divide {channels} (the channels of the first normalised layer), got {g}."


def kernel_init(init: str) -> nn.initializers.Initializer:
    """Kernel initialiser: 'flax' (LeCun normal, Flax's default) or 'pytorch' (FedSLR spec D17: PyTorch's default
    kaiming_uniform(a=√5) for Conv and Linear, i.e. U(±1/√fan_in) = ``variance_scaling(1/3, "fan_in", "uniform")``)."""
    if init == "flax":
        return nn.initializers.lecun_normal()
    if init == "pytorch":
        return nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
    raise ValueError(f"unknown init {init!r}; choose one of {INITS}.")


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: logits = W·flatten(x) + b."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


class MLP(nn.Module):
    """Fully connected ReLU network; the last Dense layer is named ``head``."""

    num_classes: int
    hidden: Sequence[int] = option((200, 200), "widths of the hidden layers", each(at_least(1)))

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes, name="head")(x)


Widths = Literal["lenet", "tf_tutorial"]
WIDTHS = {"lenet": ((6, 16), (120, 84), 32), "tf_tutorial": ((64, 64), (384, 192), 64)}  # convs, dense, extra conv


def _uniform_fan_in(fan_in: int) -> nn.initializers.Initializer:
    """PyTorch's default bias init U(±1/√fan_in)."""
    bound = 1.0 / max(fan_in, 1) ** 0.5
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _bias_init(init: str, fan_in: int) -> nn.initializers.Initializer:
    """Biases: zero ('flax'), or U(±1/√fan_in) ('pytorch', PyTorch's default for Conv and Linear; QuPeD D9)."""
    return _uniform_fan_in(fan_in) if init == "pytorch" else nn.initializers.zeros_init()


def qcnn(x, num_classes: int, convs: Sequence[int], extra: int, dense: Sequence[int], kernel: int, paddings,
         init: str, conv_impl: str):
    """The QuPeD CNN family (spec §9, §12; D21) inside a compact ``__call__``: [conv k×k – ReLU – maxpool2] for each
    width of ``convs`` (paddings ``paddings``), then, if ``extra`` > 0, conv k×k(→extra, SAME) – ReLU (CNN2's third
    convolution, after the second pool), flatten, [Dense – ReLU] for each of ``dense``, Dense(C) named ``head``.
    ``init``: 'flax' (LeCun-normal kernels, zero biases) or 'pytorch' (U(±1/√fan_in) kernels and biases)."""
    k = kernel_init(init)
    for width, pad in zip(convs, paddings):
        fan = kernel * kernel * x.shape[-1]
        x = nn.relu(Conv(width, (kernel, kernel), padding=pad, impl=conv_impl, kernel_init=k,
                         bias_init=_bias_init(init, fan))(x))
        x = max_pool_2x2(x)
    if extra:
        fan = kernel * kernel * x.shape[-1]
        x = nn.relu(Conv(extra, (kernel, kernel), padding="SAME", impl=conv_impl, kernel_init=k,
                         bias_init=_bias_init(init, fan))(x))
    x = x.reshape(x.shape[0], -1)
    for width in dense:
        x = nn.relu(nn.Dense(width, kernel_init=k, bias_init=_bias_init(init, x.shape[-1]))(x))
    return nn.Dense(num_classes, kernel_init=k, bias_init=_bias_init(init, x.shape[-1]), name="head")(x)


def _cnn1_paddings(h: int):
    """CNN1's paddings: 32×32 inputs VALID/VALID (flatten 400); 28×28 SAME/VALID (flatten 400, as the paper does for
    MNIST-like data); smaller inputs SAME/SAME."""
    return ("VALID", "VALID") if h >= 32 else ("SAME", "VALID") if h >= 20 else ("SAME", "SAME")


class CNN1(nn.Module):
    """QuPeD's CNN1 (the pFedMe authors' CifarNet; QuPeD spec §9, D21): 2 conv + 3 FC layers.

    conv5×5(→6) – ReLU – maxpool2 – conv5×5(6→16) – ReLU – maxpool2 – flatten – Dense120 – ReLU – Dense84 – ReLU –
    Dense(C) (``head``); paddings by input size (:func:`_cnn1_paddings`). ``widths='tf_tutorial'``: D21's option,
    the TF-tutorial CNN of McMahan et al. (conv 64-64, dense 384-192). ``weight_init``: 'flax' (LeCun normal, zero
    biases) or 'pytorch' (the paper scale, D9).
    """

    num_classes: int
    weight_init: Init = option("flax", "initialiser: flax (LeCun normal, zero biases) or pytorch (U(+-1/sqrt(fan_in)) "
                                       "kernels and biases, QuPeD D9 paper scale)")
    widths: Widths = option("lenet", "layer widths: lenet (6-16, 120-84; QuPeD D21) or tf_tutorial (64-64, 384-192)")
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x):
        convs, dense, _ = WIDTHS[self.widths]
        return qcnn(x, self.num_classes, convs, 0, dense, 5, _cnn1_paddings(x.shape[1]), self.weight_init,
                    self.conv_impl)


class CNN2(CNN1):
    """QuPeD's CNN2 (spec §9): CNN1 plus conv5×5(16→32, SAME) – ReLU after the second pool (flatten 800 for 32×32
    inputs; 122,838 parameters for CIFAR-10). ``widths='tf_tutorial'`` adds a 64-filter convolution."""

    @nn.compact
    def __call__(self, x):
        convs, dense, extra = WIDTHS[self.widths]
        return qcnn(x, self.num_classes, convs, extra, dense, 5, _cnn1_paddings(x.shape[1]), self.weight_init,
                    self.conv_impl)


class CNN1S(nn.Module):
    """QuPeD reduced CPU model CNN1-S (spec §12): conv3×3(→16, SAME) – ReLU – maxpool2 – conv3×3(16→32, SAME) – ReLU –
    maxpool2 – flatten – Dense256 – ReLU – Dense128 – ReLU – Dense(C) (``head``); 72,010 parameters on 8×8×1 inputs,
    70,144 of them in the quantized conv2, fc1 and fc2 kernels. LeCun-normal kernels, zero biases (D9)."""

    num_classes: int
    weight_init: Init = option("flax", "initialiser: flax (LeCun normal, zero biases; QuPeD D9 reduced scale) or "
                                       "pytorch")
    conv_impl: str = "native"
    extra: int = dataclasses.field(default=0, init=False)

    @nn.compact
    def __call__(self, x):
        return qcnn(x, self.num_classes, (16, 32), self.extra, (256, 128), 3, ("SAME", "SAME"), self.weight_init,
                    self.conv_impl)


class CNN2S(CNN1S):
    """CNN2-S (spec §12): CNN1-S plus conv3×3(32→64, SAME) – ReLU after the second pool (flatten 256; 123,274
    parameters on 8×8×1 inputs)."""

    extra: int = dataclasses.field(default=64, init=False)


class SmallCNN(nn.Module):
    """AugFL spec §6's reduced-scale CNN-S: conv3×3(16) – ReLU – maxpool2 – conv3×3(32) – ReLU – maxpool2 – flatten –
    Dense(64) – ReLU (the 64-d penultimate feature) – Dense(C) (``head``); SAME padding. ``kernel=5, width=128``:
    the 5×5 16-32 CNN of the accelerator benchmarks (benchmarks/gpu.py)."""

    num_classes: int
    channels: Sequence[int] = option((16, 32), "output channels of the two convolutions", each(at_least(1)))
    width: int = option(64, "width of the penultimate dense layer (the feature dimension)", at_least(1))
    kernel: int = option(3, "the convolutions' kernel size (kernel x kernel)", at_least(1))
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x):
        for c in self.channels:
            x = max_pool_2x2(nn.relu(Conv(c, (self.kernel, self.kernel), padding="SAME", impl=self.conv_impl)(x)))
        x = nn.relu(nn.Dense(self.width)(x.reshape(x.shape[0], -1)))
        return nn.Dense(self.num_classes, name="head")(x)


class LargeCNN(SmallCNN):
    """AugFL spec §6's CNN-L, the reduced-scale pretrained model: CNN-S's layout with widths 64/128 and Dense(256)."""

    channels: Sequence[int] = option((64, 128), "output channels of the two 3x3 convolutions", each(at_least(1)))
    width: int = option(256, "width of the penultimate dense layer (the feature dimension)", at_least(1))


class EmnistCNN(nn.Module):
    """The EMNIST character-recognition CNN of Reddi et al. (2021) and FedJAX's ``EMNIST_CONV``: conv3×3(→32,
    VALID) – ReLU – conv3×3(→64, VALID) – ReLU – maxpool2 – Dropout(0.25) – flatten – Dense128 – ReLU –
    Dropout(0.5) – Dense(C) (``head``); 1,206,590 parameters for 28×28×1 inputs and 62 classes. Dropout draws masks
    only while training (``train``)."""

    num_classes: int
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(Conv(32, (3, 3), padding="VALID", impl=self.conv_impl)(x))
        x = nn.relu(Conv(64, (3, 3), padding="VALID", impl=self.conv_impl)(x))
        x = nn.Dropout(0.25, deterministic=not train)(max_pool_2x2(x))
        x = nn.relu(nn.Dense(128)(x.reshape(x.shape[0], -1)))
        x = nn.Dropout(0.5, deterministic=not train)(x)
        return nn.Dense(self.num_classes, name="head")(x)


class FedSLRCNN(nn.Module):
    """The FedSLR spec's reduced CPU model (§8), no biases, GroupNorm with 2 groups, ReLU:
    conv3×3(→32) – GN – conv3×3(32→64, stride 2) – GN – global average pool – Dense(64→64) – ReLU – Dense(64→C)
    (named ``head``). Nuclear-norm matrices for 8×8×1 inputs: (96, 3), (192, 96), (64, 64), (64, 10); 23,648
    parameters. ``weight_init``: 'pytorch' (D17, default) or 'flax'."""

    num_classes: int
    groups: int = option(2, "GroupNorm groups", _divides(32))
    weight_init: Init = option("pytorch", "kernel initialiser: pytorch (FedSLR D17) or flax")
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x):
        k = kernel_init(self.weight_init)
        conv = lambda f, s: Conv(f, (3, 3), (s, s), use_bias=False, impl=self.conv_impl, kernel_init=k)
        x = nn.relu(nn.GroupNorm(self.groups, epsilon=1e-5)(conv(32, 1)(x)))
        x = nn.relu(nn.GroupNorm(self.groups, epsilon=1e-5)(conv(64, 2)(x)))
        x = jnp.mean(x, axis=(1, 2))
        x = nn.relu(nn.Dense(64, use_bias=False, kernel_init=k)(x))
        return nn.Dense(self.num_classes, use_bias=False, kernel_init=k, name="head")(x)


class _BasicBlock(nn.Module):
    features: int
    strides: int
    groups: int
    conv_impl: str
    weight_init: str

    @nn.compact
    def __call__(self, x):
        conv = lambda f, k, s, name: Conv(f, (k, k), (s, s), use_bias=False, impl=self.conv_impl,
                                          kernel_init=kernel_init(self.weight_init), name=name)
        y = nn.relu(nn.GroupNorm(self.groups, epsilon=1e-5, name="gn1")(conv(self.features, 3, self.strides, "conv1")(x)))
        y = nn.GroupNorm(self.groups, epsilon=1e-5, name="gn2")(conv(self.features, 3, 1, "conv2")(y))
        if self.strides != 1 or x.shape[-1] != self.features:
            x = nn.GroupNorm(self.groups, epsilon=1e-5, name="gn_short")(
                conv(self.features, 1, self.strides, "conv_short")(x))
        return nn.relu(y + x)


class ResNet18GN(nn.Module):
    """CIFAR ResNet-18 with GroupNorm (FedSLR §7, DFedAlt §5): 3×3 stem, BasicBlocks [2,2,2,2] of widths
    64/128/256/512 with strides 1/2/2/2, no conv biases, global average pool, linear ``head``.

    ``groups``: GroupNorm groups (FedSLR 2, DFedAlt 32); ``head_bias``: FedSLR has none (11,173,952 parameters
    for 10 classes), DFedAlt has one. ``weight_init``: 'flax' (default) or 'pytorch' (FedSLR D17).
    """

    num_classes: int
    groups: int = option(2, "GroupNorm groups (FedSLR 2, DFedAlt 32)", _divides(64))
    head_bias: bool = option(False, "a bias in the linear head (DFedAlt) or none (FedSLR)")
    weight_init: Init = option("flax", "kernel initialiser: flax (LeCun normal) or pytorch (FedSLR D17)")
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x):
        k = kernel_init(self.weight_init)
        x = Conv(64, (3, 3), use_bias=False, impl=self.conv_impl, kernel_init=k, name="stem")(x)
        x = nn.relu(nn.GroupNorm(self.groups, epsilon=1e-5, name="gn_stem")(x))
        for stage, (width, stride) in enumerate(zip((64, 128, 256, 512), (1, 2, 2, 2))):
            for block in range(2):
                x = _BasicBlock(width, stride if block == 0 else 1, self.groups, self.conv_impl,
                                self.weight_init, name=f"layer{stage + 1}_{block}")(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, use_bias=self.head_bias, kernel_init=k, name="head")(x)


class CifarResNet(nn.Module):
    """AugFL spec §6's CIFAR ResNets with GroupNorm in place of BatchNorm (D19): 3×3 stem to 32 channels, three
    stages of ``blocks`` BasicBlocks of widths 64/128/256 and strides 1/2/2, global average pool (the 256-d
    penultimate feature), linear ``head``. ``blocks=1``: ResNet8×4 (the paper's meta-model); ``blocks=5``:
    ResNet32×4 (its pretrained model)."""

    num_classes: int
    blocks: int = option(1, "BasicBlocks per stage (1: ResNet8x4, 5: ResNet32x4)", at_least(1))
    groups: int = option(8, "GroupNorm groups", _divides(32))
    weight_init: Init = option("flax", "kernel initialiser: flax (LeCun normal) or pytorch")
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x):
        k = kernel_init(self.weight_init)
        x = Conv(32, (3, 3), use_bias=False, impl=self.conv_impl, kernel_init=k, name="stem")(x)
        x = nn.relu(nn.GroupNorm(self.groups, epsilon=1e-5, name="gn_stem")(x))
        for stage, (width, stride) in enumerate(zip((64, 128, 256), (1, 2, 2))):
            for block in range(self.blocks):
                x = _BasicBlock(width, stride if block == 0 else 1, self.groups, self.conv_impl,
                                self.weight_init, name=f"layer{stage + 1}_{block}")(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, kernel_init=k, name="head")(x)


class CifarResNet32(CifarResNet):
    """ResNet32×4 (:class:`CifarResNet` with 5 BasicBlocks per stage): AugFL's paper-scale pretrained model."""

    blocks: int = option(5, "BasicBlocks per stage (1: ResNet8x4, 5: ResNet32x4)", at_least(1))
