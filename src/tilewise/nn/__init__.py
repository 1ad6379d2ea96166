"""torch.nn modules built from tilewise ops (PyTorch where an op is not there yet: see
``tilewise.nn.functional.report()``)."""

from .classifier import BACKENDS, SentimentClassifier
from .layers import RMSNorm, SwiGLU

__all__ = ["BACKENDS", "RMSNorm", "SentimentClassifier", "SwiGLU"]
