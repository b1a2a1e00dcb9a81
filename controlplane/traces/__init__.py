"""Traces: the in-memory model, file readers (Bailian, Mooncake), synthesis and statistics."""

from controlplane.traces.model import UNKNOWN_CATEGORY, Trace, category_name

__all__ = ["UNKNOWN_CATEGORY", "Trace", "category_name"]
