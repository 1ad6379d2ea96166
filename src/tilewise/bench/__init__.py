"""Benchmark harness (harness.py), suites per op (suites/), tables (report.py), roofline plot (roofline.py)."""

from ..cost import Cost
from .harness import CSV_COLUMNS, CheckError, Row, Runner, append_csv, check, read_csv, time_ms

__all__ = ["Cost", "CSV_COLUMNS", "CheckError", "Row", "Runner", "append_csv", "check", "read_csv", "time_ms"]
