"""Metric sinks (JSONL always, TensorBoard and W&B optional), run reports, plots, aha moments, sweeps.

The sinks are imported by the trainer; plotting modules import matplotlib only when used.
"""

from rlvr.reporting.sinks import JsonlWriter, MetricsLogger, peak_memory, read_jsonl, truncate_jsonl

__all__ = ["JsonlWriter", "MetricsLogger", "peak_memory", "read_jsonl", "truncate_jsonl"]
