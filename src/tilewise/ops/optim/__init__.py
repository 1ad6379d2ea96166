"""Optimizer updates over a model's parameters: AdamW, one fused pass over each parameter's tensors."""
