"""Transpose: naive to tiled, padded and vectorized CUDA C kernels."""
