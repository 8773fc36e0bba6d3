"""What the trainer writes while it runs: metric sinks (``metrics.jsonl`` always, TensorBoard and
W&B optional) and the console. Reading a finished run is :mod:`rlvr.analysis`."""

from rlvr.tracking.sinks import MetricsLogger, peak_memory, train_state_bytes

__all__ = ["MetricsLogger", "peak_memory", "train_state_bytes"]
