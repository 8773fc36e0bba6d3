"""Metric sinks (JSONL always, TensorBoard and W&B optional), run reports, plots, aha moments, sweeps.

The sinks are imported by the trainer; plotting modules import matplotlib only when used.
"""

from rlvr.jsonl import JsonlWriter, truncate_jsonl
from rlvr.reporting.sinks import MetricsLogger, peak_memory

__all__ = ["JsonlWriter", "MetricsLogger", "peak_memory", "truncate_jsonl"]
