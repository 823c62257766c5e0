"""A model = a Flax module + its input shape + a masked classification loss, as a hashable static object."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fljax import tree
from fljax.data.text import EOS, PAD, TokenShape
from fljax.errors import OptionError
from fljax.models import sequence, zoo
from fljax.options import check_value, suggest

__all__ = ["Model", "make_model", "own_model", "check_model_options", "check_model_input",
           "auto_model", "model_options", "MODELS", "masked_cross_entropy", "accuracy_stats", "PRECISIONS",
           "precision_scope", "has_primitive"]

# precision option -> (the matmul and convolution precision of the model's own operations, its compute dtype).
# 'tf32' keeps the backend's default (TF32 tensor cores for float32 products on NVIDIA Ampere and newer; exact
# float32 on CPU); 'fp32' asks for full float32 products everywhere; 'bf16' computes the model in bfloat16 from
# float32 master weights. Outside the model (aggregation, algorithms' own linear algebra) products are float32
# (Simulation traces every program under precision_scope).
PRECISIONS = {"fp32": ("float32", None), "tf32": ("default", None), "bf16": ("default", jnp.bfloat16)}


def precision_scope(precision: str = "fp32"):
    """The matmul-precision context of ``precision`` (a key of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise OptionError("precision", f"must be one of {list(PRECISIONS)}, got {precision!r}.")
    return jax.default_matmul_precision(PRECISIONS[precision][0])


def _counted(logits, labels, mask, specials: bool):
    """What a loss or accuracy counts: the samples ``mask [n]`` marks for labels ``[n]``; for token labels ``[n, T]``
    (logits ``[n, T, V]``, the layout of :mod:`fljax.data.text`) every target of a marked sample but PAD, and
    without ``specials`` also but BOS, EOS and OOV (the last id)."""
    if labels.ndim == mask.ndim:
        return mask
    if logits.ndim != labels.ndim + 1:
        raise ValueError(f"labels of shape {labels.shape} are token sequences, but the model gives logits of shape "
                         f"{logits.shape}; use a sequence model (lstm or transformer).")
    keep = labels != PAD if specials else (labels > EOS) & (labels < logits.shape[-1] - 1)
    return mask[..., None] & keep


def masked_cross_entropy(logits, labels, mask):
    """Mean softmax cross-entropy over the counted targets (0 when none is), in float32 at least (float64 logits stay
    float64): the samples with ``mask`` true; with token labels ``[n, T]`` every non-padding target of those samples
    (the mean over the batch's tokens)."""
    counted = _counted(logits, labels, mask, specials=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)),
                                                         labels)
    m = counted.astype(ce.dtype)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)


def accuracy_stats(logits, labels, mask):
    """(number correct, number counted) over the masked samples; with token labels ``[n, T]`` over their regular
    targets: padding, BOS, EOS and OOV targets are not counted (Reddi et al. 2021; the accuracy with them is
    :func:`fljax.models.sequence.token_stats`)."""
    counted = _counted(logits, labels, mask, specials=False)
    return jnp.sum((jnp.argmax(logits, -1) == labels) & counted), jnp.sum(counted)


@dataclasses.dataclass(frozen=True)
class Model:
    """Static description of a classifier. ``params`` are the module's ``'params'`` collection.

    ``collections``: the module's other variable collections (``("batch_stats",)`` for BatchNorm, else empty);
    ``stochastic``: it draws dropout masks when training. Such a module is called as ``__call__(x, train)``; its
    non-parameter variables (``{"batch_stats": ...}``) are explicit values: :meth:`apply` (evaluation) reads them,
    :meth:`train_apply` and :meth:`train_loss` (training, with a dropout key) return them updated, as Flax's
    ``apply(variables, x, mutable=["batch_stats"])`` does. The parameters stay what is differentiated, averaged
    and personalized; the variables travel beside them (:mod:`fljax.algorithms.model_state`)."""

    module: nn.Module
    input_shape: tuple
    num_classes: int
    name: str
    collections: tuple = ()
    stochastic: bool = False
    precision: str = "tf32"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise OptionError("precision", f"must be one of {list(PRECISIONS)}, got {self.precision!r}.")

    @property
    def has_mode(self) -> bool:
        """True for a module with BatchNorm or Dropout (it runs differently in training and evaluation)."""
        return bool(self.collections) or self.stochastic

    def _init(self, key):
        x = jnp.zeros((1,) + tuple(self.input_shape), jnp.float32)
        return self.module.init(key, x, train=False) if self.has_mode else self.module.init(key, x)

    def init(self, key):
        return self._init(key)["params"]

    def init_variables(self, key) -> dict:
        """The non-parameter variables at initialisation (``{"batch_stats": ...}``; ``{}`` for other models)."""
        variables = self._init(key)
        return {c: variables[c] for c in self.collections}

    def apply(self, params, x, mask=None, variables=None):
        """Logits of ``x`` in evaluation mode: a module with BatchNorm normalises with the running statistics in
        ``variables`` (``{"batch_stats": ...}``, see :meth:`init_variables`; a model without BatchNorm needs none)
        and Dropout keeps every unit. ``mask`` only matters in training (:meth:`train_apply`).

        Precision (:data:`PRECISIONS`): the module's products run at the model's ``precision``; with 'bf16' the
        float32 parameters and inputs are cast to bfloat16 for the forward pass (so their gradients come back in
        float32: the master weights, the optimizer and aggregation stay float32), the logits cast back to
        float32."""
        return self._forward(params, x, mask, variables, train=False, key=None)[0]

    def train_apply(self, params, x, mask, variables, key=None):
        """``(logits, variables)`` of ``x`` in training mode, Flax's ``apply(..., train=True,
        mutable=["batch_stats"])``: BatchNorm normalises with the statistics of the batch's rows that ``mask``
        marks (all when None: padding rows of a small client's batch never enter them) and returns ``variables``
        with its running statistics moved toward them (kept in float32 under 'bf16'); Dropout draws its masks from
        ``key``. A model without BatchNorm or Dropout returns its logits and ``variables`` as given."""
        return self._forward(params, x, mask, variables, train=True, key=key)

    def _forward(self, params, x, mask, variables, train: bool, key):
        with precision_scope(self.precision):
            compute = PRECISIONS[self.precision][1]
            if compute is not None:
                params, x = _cast_floats((params, x), compute)
            logits, variables = self._apply(params, x, mask, variables, train, key)
            if compute is None:
                return logits, variables
            if train and self.has_mode:  # the running statistics it updated stay float32
                variables = _cast_floats(variables, jnp.float32, compute)
            return logits.astype(jnp.float32), variables

    def _apply(self, params, x, mask, variables, train: bool, key):
        if not self.has_mode:
            return self.module.apply({"params": params}, x), variables
        if self.collections and variables is None:
            raise ValueError(f"model {self.name} has BatchNorm: its applications need its statistics (variables="
                             f"{{'batch_stats': ...}}), which the algorithms that train it carry "
                             f"(fljax.algorithms.model_state).")
        full = {"params": params, **(variables or {})}
        if not train:
            return self.module.apply(full, x, train=False), variables
        if self.stochastic and key is None:
            raise ValueError(f"model {self.name} has Dropout: its training applications need a key.")
        rngs = {"dropout": key} if self.stochastic else None
        with nn.intercept_methods(_batch_norm_over(mask)):
            logits, updated = self.module.apply(full, x, train=True, rngs=rngs, mutable=list(self.collections))
        return logits, dict(updated)

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

    def features_and_logits(self, params, x):
        """(h(x), logits) from one forward pass: the input of the ``head`` layer and the model's output."""
        seen = []

        def record_head_input(next_fun, args, kwargs, context):
            if context.module.name == "head" and context.method_name == "__call__":
                seen.append(args[0])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record_head_input):
            logits = self.apply(params, x)
        return seen[-1], logits

    def loss(self, params, batch, variables=None):
        """Masked mean cross-entropy of ``batch`` (a :class:`fljax.data.Batch`) in evaluation mode (``variables``:
        see :meth:`apply`)."""
        return masked_cross_entropy(self.apply(params, batch.x, batch.mask, variables), batch.y, batch.mask)

    def train_loss(self, params, batch, variables, key=None):
        """``(loss, variables)``: the masked mean cross-entropy of ``batch`` in training mode and the model's
        updated variables (:meth:`train_apply`). The model-state form of a local objective, as Flax's ImageNet
        example's ``loss_fn`` returns its new ``batch_stats`` beside the loss (the aux output of
        ``jax.value_and_grad(..., has_aux=True)``: they are never differentiated)."""
        logits, variables = self.train_apply(params, batch.x, batch.mask, variables, key)
        return masked_cross_entropy(logits, batch.y, batch.mask), variables

    @property
    def has_conv(self) -> bool:
        """True when the model's traced forward pass contains a convolution (a ``conv_general_dilated`` primitive
        in its jaxpr), whoever wrote the module; fljax's own convolutions are traced in their native form."""
        return _has_conv(self)

    @property
    def conv_forms(self) -> bool:
        """True when the model's convolutions can run in another form (fljax's own modules: a ``conv_impl``
        field, see :mod:`fljax.models.layers`)."""
        return any(f.name == "conv_impl" for f in dataclasses.fields(self.module))

    @property
    def conv_impl(self) -> str | None:
        """The form its convolutions run in ('native', 'patches', 'shifts'); 'native' for a convolutional module of
        your own, None without convolutions."""
        if self.conv_forms:
            return self.module.conv_impl if self.has_conv else None
        return "native" if self.has_conv else None

    def with_conv(self, impl: str) -> "Model":
        """The same model (same parameters) with convolutions run by ``impl`` (see :data:`fljax.models.layers.
        CONV_FORMS`); itself when its convolutions have no other form."""
        if not self.conv_forms:
            return self
        return dataclasses.replace(self, module=self.module.clone(conv_impl=impl))

    def with_precision(self, precision: str) -> "Model":
        """The same model computing at ``precision`` (a key of :data:`PRECISIONS`)."""
        return dataclasses.replace(self, precision=precision)

    def num_params(self) -> int:
        shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        return int(sum(x.size for x in jax.tree.leaves(shapes)))

    def kernel_paths(self) -> list[str]:
        """The paths (``tree.path_str`` of the parameter tree, e.g. ``Conv_1/kernel``) of every layer's ``kernel``
        in the order the layers are called on an input (computed once per model)."""
        return list(_kernel_paths(self))

    def quant_mask(self):
        """QuPeD §7: a bool per parameter leaf, True for the kernels of every layer but the first and the last
        ("we let the first and last layers of networks to be in full precision"); biases and normalisation stay
        FP. CNN1: conv2, fc1, fc2; CNN2 adds conv3; ResNet: every conv kernel but the stem."""
        quantized = set(self.kernel_paths()[1:-1])
        shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        return jax.tree_util.tree_map_with_path(lambda p, _: tree.path_str(p) in quantized, shapes)


def _cast_floats(tree_, dtype, source=jnp.float32):
    """Every ``source`` (float32) leaf of ``tree_`` cast to ``dtype`` (other leaves unchanged)."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.result_type(a) == source else a, tree_)


def has_primitive(jaxpr, name: str) -> bool:
    """True when the primitive ``name`` occurs in ``jaxpr`` or any jaxpr nested in it (called functions, loop
    bodies, branches, custom derivatives)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            return True
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)) and has_primitive(v, name):
                    return True
    return False


@functools.lru_cache(maxsize=256)
def _has_conv(model: Model) -> bool:
    """Whether tracing the model's initialisation (which runs its forward pass on one input) binds a convolution."""
    traced = model.with_conv("native") if model.conv_forms else model
    return has_primitive(jax.make_jaxpr(traced._init)(jax.random.PRNGKey(0)), "conv_general_dilated")


def _batch_norm_over(mask):
    """A method interceptor that computes every BatchNorm's batch statistics over the rows ``mask`` [B] marks."""

    def intercept(next_fun, args, kwargs, context):
        if mask is not None and isinstance(context.module, nn.BatchNorm) and context.method_name == "__call__":
            x = args[0]
            kwargs = {**kwargs, "mask": jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x.shape)}
        return next_fun(*args, **kwargs)

    return intercept


@functools.lru_cache(maxsize=256)
def _kernel_paths(model: Model) -> tuple[str, ...]:
    calls: list[tuple] = []

    def record(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and context.module.path not in calls:
            calls.append(context.module.path)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    paths = [tree.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]
    order = {"/".join(c): i for i, c in enumerate(calls)}
    kernels = [p for p in paths if p.endswith("/kernel") and p.rsplit("/", 1)[0] in order]
    return tuple(sorted(kernels, key=lambda p: order[p.rsplit("/", 1)[0]]))


MODELS = {
    "logreg": "multinomial logistic regression",
    "mlp": "fully connected ReLU network (hidden widths: hidden=[200, 200])",
    "cnn1": "QuPeD's CNN1: 2 conv (5x5, 6 and 16 channels) + 3 dense (120, 84, C)",
    "cnn2": "QuPeD's CNN2: CNN1 plus a 5x5 conv (32 channels, SAME) after the second pool",
    "cnn1_s": "QuPeD's reduced CNN1-S: 2 conv (3x3, 16 and 32 channels, SAME) + 3 dense (256, 128, C)",
    "cnn2_s": "QuPeD's reduced CNN2-S: CNN1-S plus a 3x3 conv (64 channels, SAME) after the second pool",
    "cnn_s": "AugFL's CNN-S: conv3x3(16) - pool - conv3x3(32) - pool - Dense(64) - Dense(C) (channels, width)",
    "cnn_l": "AugFL's CNN-L (its reduced-scale pretrained model): CNN-S with widths 64/128 and Dense(256)",
    "resnet8x4": "AugFL's meta-model: CIFAR ResNet, 32-channel stem, 1 BasicBlock per stage (64/128/256), GroupNorm(8)",
    "resnet32x4": "AugFL's pretrained model: the same CIFAR ResNet with 5 BasicBlocks per stage (blocks=5)",
    "fedslr_cnn": "FedSLR's reduced CNN: conv3x3(32) - GN - conv3x3(64, s2) - GN - GAP - Dense(64) - Dense(C), "
                  "no biases, GroupNorm(2), PyTorch init (weight_init='pytorch'|'flax')",
    "resnet18_gn": "CIFAR ResNet-18 with GroupNorm (groups=2, head_bias=False by default; "
                   "weight_init='flax'|'pytorch'); a GPU model",
    "emnist_cnn": "Reddi et al.'s EMNIST CNN (FedJAX EMNIST_CONV): 2 conv (3x3, 32 and 64) + pool + dropout + "
                  "Dense(128) + dropout + Dense(C)",
    "lstm": "next-token LSTM: embedding, stacked LSTMs, optional projection (Shakespeare: embed 8, hidden "
            "[256, 256]; Stack Overflow: embed 96, hidden [670], projection 96); needs token sequences",
    "transformer": "small causal Transformer decoder (width 128, 2 layers, 4 heads); needs token sequences",
    "lstm_cls": "sequence classifier: embedding, stacked LSTMs, the last token's state, Dense(C) (Sent140)",
}


_MODULES = {"logreg": zoo.LogisticRegression, "mlp": zoo.MLP, "cnn1": zoo.CNN1, "cnn2": zoo.CNN2, "cnn1_s": zoo.CNN1S,
            "cnn2_s": zoo.CNN2S, "cnn_s": zoo.SmallCNN, "cnn_l": zoo.LargeCNN, "resnet8x4": zoo.CifarResNet,
            "resnet32x4": zoo.CifarResNet32, "fedslr_cnn": zoo.FedSLRCNN, "resnet18_gn": zoo.ResNet18GN,
            "emnist_cnn": zoo.EmnistCNN, "lstm": sequence.LSTMLanguageModel,
            "transformer": sequence.TransformerDecoder, "lstm_cls": sequence.LSTMClassifier}
# convolutional: take conv_impl, need (H, W, C) inputs
_IMAGE_MODELS = ("cnn1", "cnn2", "cnn1_s", "cnn2_s", "cnn_s", "cnn_l", "resnet8x4", "resnet32x4", "fedslr_cnn",
                 "resnet18_gn", "emnist_cnn")
_STOCHASTIC = ("emnist_cnn",)  # draw dropout masks while training
_LANGUAGE_MODELS = ("lstm", "transformer")  # token sequences in, next-token logits out
_SEQUENCE_CLASSIFIERS = ("lstm_cls",)  # token sequences in, one label per sequence


def auto_model(input_shape) -> str:
    """The model ``name: auto`` picks: logreg for vectors, cnn1 for images, lstm for next-token data, lstm_cls for
    labelled sequences (:class:`~fljax.data.text.TokenShape`); logreg when the shape is unknown (None: a data set of
    the user's files, whose model is picked once they are read)."""
    if isinstance(input_shape, TokenShape):
        return "lstm" if input_shape.per_token else "lstm_cls"
    return "logreg" if input_shape is None or len(input_shape) == 1 else "cnn1"


def model_options(name: str) -> list[dataclasses.Field]:
    """The options of model ``name``: its module's fields other than the number of classes, the convolution
    implementation (set by the engine) and the input vocabulary (set from the data)."""
    return [f for f in dataclasses.fields(_MODULES[name]) if f.init and f.name not in ("parent", "name", "num_classes",
                                                                                      "conv_impl", "vocab")]


def check_model_options(name: str, options: dict, note: str = "") -> dict:
    """``options`` checked against model ``name``'s module: unknown keys are refused with the closest valid one
    (``note`` follows the model's name in that message), values against the field's type (lists element by
    element) and its check. Returns them as the module takes them (lists as tuples); raises :class:`OptionError`
    naming the option."""
    fields = {f.name: f for f in model_options(name)}
    hints = typing.get_type_hints(_MODULES[name])
    out = {}
    for key, value in options.items():
        if key not in fields:
            raise OptionError(str(key), f"is not a valid key for model {name!r}{note}.{suggest(str(key), fields)} "
                                        f"Valid keys: {sorted(fields)}.")
        out[key] = check_value(key, value, hints[key])
        check = fields[key].metadata.get("check")
        problem = check(out[key]) if check is not None else None
        if problem:
            raise OptionError(key, problem)
    return out


def check_model_input(name: str, input_shape) -> None:
    """Refuse a model for inputs it cannot take (raises :class:`OptionError` for the key ``name``): a convolutional
    model for vectors, a sequence model for anything but token sequences
    (:class:`~fljax.data.text.TokenShape`), a language model for labelled sequences and the other way round, and
    any other model for token sequences. An unknown shape (None) is checked once the data are read."""
    if input_shape is None:
        return
    if isinstance(input_shape, TokenShape):
        fits = _LANGUAGE_MODELS if input_shape.per_token else _SEQUENCE_CLASSIFIERS
        if name not in fits:
            what = "next-token sequences" if input_shape.per_token else "labelled token sequences"
            raise OptionError("name", f"cannot be {name!r} for {what} of length {input_shape[0]}: use "
                                      f"{' or '.join(map(repr, fits))}.")
        return
    if name in _LANGUAGE_MODELS + _SEQUENCE_CLASSIFIERS:
        raise OptionError("name", f"cannot be {name!r} for inputs of shape {tuple(input_shape)}: it needs token "
                                  f"sequences (shakespeare, stackoverflow, sent140, or your token files).")
    if len(input_shape) == 1 and name in _IMAGE_MODELS:
        raise OptionError("name", f"cannot be {name!r} for inputs of shape {tuple(input_shape)}: it needs images "
                                  f"(H, W, C); use 'mlp' or 'logreg'.")


def make_model(name: str, input_shape, num_classes: int, conv_impl: str = "native", **kwargs) -> Model:
    """Build a model by name (see :data:`MODELS`); ``kwargs`` go to the module (e.g. ``hidden``, ``groups``)."""
    if name not in _MODULES:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}.{suggest(name, MODELS)}")
    options = check_model_options(name, kwargs)
    check_model_input(name, input_shape)
    if name in _IMAGE_MODELS:
        options["conv_impl"] = conv_impl
    if name in _SEQUENCE_CLASSIFIERS:
        options["vocab"] = input_shape.vocab
    return Model(_MODULES[name](num_classes, **options), tuple(input_shape), num_classes, name,
                 stochastic=name in _STOCHASTIC)


def _first_conv(module: nn.Module, takes_train: bool, x):
    """The first submodule with a ``kernel_size`` (a convolution) that ``module`` calls on ``x`` (None: none
    before it fails)."""
    seen = []

    def record(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and hasattr(context.module, "kernel_size") and not seen:
            seen.append(context.module)
        return next_fun(*args, **kwargs)

    init = functools.partial(module.init, train=False) if takes_train else module.init
    with nn.intercept_methods(record):
        try:
            jax.eval_shape(init, jax.random.PRNGKey(0), x)
        except Exception:  # noqa: BLE001 - the failure is what the caller reports; only the layer is wanted here
            pass
    return seen[0] if seen else None


def own_model(module: nn.Module, input_shape, num_classes: int, data: str = "the data") -> Model:
    """The user's own Flax module as a :class:`Model` (its ``__call__(x)`` maps a batch ``[B, *input_shape]`` to
    logits ``[B, num_classes]``). A module with BatchNorm (``batch_stats``) or Dropout is called as
    ``__call__(x, train)``: ``train=True`` while a client trains, ``train=False`` at evaluation (BatchNorm's
    ``use_running_average=not train``, Dropout's ``deterministic=not train``). Refused in one line: a module whose
    output is not such logits, one with variables other than ``params`` and ``batch_stats``, and one with BatchNorm
    or Dropout whose ``__call__`` takes no ``train``, and one that cannot take the inputs of ``data`` (its name):
    the message gives the data's input shape and, when a convolution received inputs of another rank than its
    kernel needs, the inputs that convolution takes."""
    if not isinstance(module, nn.Module):
        raise OptionError("model", f"must be a flax.linen Module, got {type(module).__name__}.")
    x = jnp.zeros((2,) + tuple(input_shape), jnp.float32)
    what = type(module).__name__
    takes_train = "train" in inspect.signature(module.__call__).parameters
    call = functools.partial(module.apply, train=True) if takes_train else module.apply
    try:
        variables = jax.eval_shape(functools.partial(module.init, train=False) if takes_train else module.init,
                                   jax.random.PRNGKey(0), x)
        collections = tuple(sorted(set(variables) - {"params"}))
        if set(collections) - {"batch_stats"}:
            raise OptionError("model", f"{what} keeps variables {list(collections)} besides its params: only "
                                       f"BatchNorm's 'batch_stats' is supported.")
        stochastic = False
        try:
            out = jax.eval_shape(lambda v: call(v, x, mutable=list(collections))[0], dict(variables))
        except flax.errors.InvalidRngError:
            stochastic = True
            out = jax.eval_shape(lambda v: call(v, x, rngs={"dropout": jax.random.PRNGKey(0)},
                                                mutable=list(collections))[0], dict(variables))
    except OptionError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module failing on these inputs, whatever it raises
        conv = _first_conv(module, takes_train, x)
        spatial = len(getattr(conv, "kernel_size", ()))
        if conv is not None and spatial + 1 != len(input_shape):
            needs = ", ".join(["H", "W", "D"][:spatial] if spatial <= 3 else [f"S{i}" for i in range(spatial)])
            raise OptionError("model", f"{what} takes inputs [batch, {needs}, channels] (its first "
                                       f"{type(conv).__name__}, kernel {tuple(conv.kernel_size)}), but {data} has "
                                       f"inputs of shape {tuple(input_shape)}: pass data of that rank (e.g. "
                                       f"data={{'dataset': 'digits'}}, images (8, 8, 1)) or a model for "
                                       f"{tuple(input_shape)} inputs.") from None
        if isinstance(e, ZeroDivisionError):  # jax's variance-scaling initializers divide by a layer's fans
            raise OptionError("model", f"{what} cannot be initialised for the inputs of {data}, of shape "
                                       f"{tuple(input_shape)}: an initializer divided by zero ({e}), as it does for a "
                                       f"layer with 0 features or a kernel with a 0-sized dimension; give every "
                                       f"layer at least one.") from None
        reason = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise OptionError("model", f"{what} cannot take the inputs of {data}, of shape {tuple(input_shape)}: "
                                   f"{reason}") from None
    if (collections or stochastic) and not takes_train:
        raise OptionError("model", f"{what} has {'BatchNorm' if collections else 'Dropout'}: its __call__ must take "
                                   f"train: bool (True while training, False at evaluation).")
    if getattr(out, "shape", None) != (2, num_classes):
        raise OptionError("model", f"{what} must return logits of shape [batch, {num_classes}], got "
                                   f"{getattr(out, 'shape', type(out).__name__)}.")
    return Model(module, tuple(input_shape), num_classes, what, collections, stochastic)
