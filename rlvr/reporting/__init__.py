"""Metric sinks (JSONL always, TensorBoard optional), sample logs and console output."""

from rlvr.reporting.sinks import JsonlWriter, MetricsLogger, read_jsonl, truncate_jsonl

__all__ = ["JsonlWriter", "MetricsLogger", "read_jsonl", "truncate_jsonl"]
