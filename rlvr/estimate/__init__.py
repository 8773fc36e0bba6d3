"""Memory estimate of a run from the model's ``config.json`` and the run config; no weights load.

``rlvr estimate`` prints it, and the trainer prints it before training and the measured peak
beside it at the end. One module per question:

- :mod:`rlvr.estimate.shapes`: the model's shape (:class:`ModelShape`), from its config.json or, for a
  model that is not here, the published ones (:data:`KNOWN_MODELS`).
- :mod:`rlvr.estimate.peak`: the training peak, item by item (:func:`estimate`); each item's formula
  is in that module's docstring.
- :mod:`rlvr.estimate.load`: one process's peak while the models load, and a node's host RAM
  (:func:`load_memory`).
- :mod:`rlvr.estimate.checks`: the estimate against this machine: a GPU's free memory
  (:func:`memory_check`), the RAM available (:func:`ram_warning`), the measured peak at the end
  (:func:`measured_beside_estimate`).

Every public name of the four is importable from ``rlvr.estimate``.
"""

from rlvr.estimate.checks import REDUCE, available_ram, measured_beside_estimate, memory_check, ram_warning
from rlvr.estimate.load import GPU_HOST_RUNTIME_BYTES, GPUS_PER_NODE, LoadMemory, load_memory
from rlvr.estimate.peak import (
    ACT_BYTES_AUTOCAST,
    ACT_BYTES_FP32,
    ACT_ELEMENTS_HIDDEN,
    ACT_ELEMENTS_INTERMEDIATE,
    ACT_ELEMENTS_KV_COPIES,
    BACKWARD_FACTOR,
    BYTES,
    CPU_BACKWARD_FACTOR,
    CPU_RUNTIME_BYTES,
    DEFAULT_PROMPT_TOKENS,
    GRAPH_POOL_VOCAB_TENSORS,
    STATIC_CAPACITY_MULTIPLE,
    GiB,
    Item,
    MemoryEstimate,
    MiB,
    autocast_weight_copies,
    data_prompt_tokens,
    estimate,
    estimate_config,
    fused_head,
    fused_head_bytes,
    lora_settings,
    offloaded,
    prompt_tokens,
    shard_count,
    static_decodes,
)
from rlvr.estimate.shapes import ALL_LINEAR, KNOWN_MODELS, ModelShape, model_shape, shape_from_config

__all__ = [
    "ACT_BYTES_AUTOCAST",
    "ACT_BYTES_FP32",
    "ACT_ELEMENTS_HIDDEN",
    "ACT_ELEMENTS_INTERMEDIATE",
    "ACT_ELEMENTS_KV_COPIES",
    "ALL_LINEAR",
    "BACKWARD_FACTOR",
    "CPU_BACKWARD_FACTOR",
    "BYTES",
    "CPU_RUNTIME_BYTES",
    "DEFAULT_PROMPT_TOKENS",
    "GPUS_PER_NODE",
    "GPU_HOST_RUNTIME_BYTES",
    "GRAPH_POOL_VOCAB_TENSORS",
    "GiB",
    "Item",
    "KNOWN_MODELS",
    "LoadMemory",
    "MemoryEstimate",
    "MiB",
    "ModelShape",
    "REDUCE",
    "STATIC_CAPACITY_MULTIPLE",
    "autocast_weight_copies",
    "available_ram",
    "data_prompt_tokens",
    "estimate",
    "estimate_config",
    "fused_head",
    "fused_head_bytes",
    "load_memory",
    "lora_settings",
    "measured_beside_estimate",
    "memory_check",
    "model_shape",
    "offloaded",
    "prompt_tokens",
    "ram_warning",
    "shape_from_config",
    "shard_count",
    "static_decodes",
]
