"""Sparse matrix-vector product: CSR, ELL, JDS and panel formats."""
