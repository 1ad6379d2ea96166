"""Adapters to other libraries (optional dependencies, imported on demand)."""
