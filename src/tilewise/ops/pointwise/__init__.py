"""Pointwise and row-reduction ops: vector add, elementwise map/zip, reductions, fusion, recomputation."""
