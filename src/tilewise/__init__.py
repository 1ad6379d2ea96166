"""tilewise: GPU kernels for LLM workloads, from naive to the roofline.

The public functional API; each function lives in ``tilewise.ops.<op>``.
"""

from .cost import Cost
from .ops.vector_add import vector_add

__version__ = "0.1.0"

__all__ = ["Cost", "vector_add", "__version__"]
