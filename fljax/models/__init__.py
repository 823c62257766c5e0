"""fljax.models: Flax classifiers with a client-vectorisation-friendly convolution."""
from fljax.models.layers import Conv
from fljax.models.model import MODELS, Model, accuracy_stats, make_model, masked_cross_entropy
from fljax.models.zoo import CNN1, MLP, LogisticRegression, ResNet18GN

__all__ = ["Conv", "MODELS", "Model", "accuracy_stats", "make_model", "masked_cross_entropy", "CNN1", "MLP",
           "LogisticRegression", "ResNet18GN"]
