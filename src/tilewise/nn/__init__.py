"""torch.nn modules built from tilewise ops (PyTorch where an op is not there yet: see
``tilewise.nn.functional.report()``)."""

from .classifier import BACKENDS, SentimentClassifier
from ..ops.rowwise.linear_cross_entropy import FusedLinearCrossEntropyLoss
from .layers import Attention, Linear, RMSNorm, RotaryEmbedding, SwiGLU

__all__ = ["BACKENDS", "Attention", "FusedLinearCrossEntropyLoss", "Linear", "RMSNorm", "RotaryEmbedding",
           "SentimentClassifier", "SwiGLU"]
