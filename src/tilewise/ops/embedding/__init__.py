"""Embedding lookup and its backward (sort, scan, segment sum)."""
