"""The one typed config tree: frozen dataclasses, YAML presets, ``a.b=c`` overrides, validation.

Every field has a default and a one-line attribute docstring (shown by ``rlvr config``).
Cross-field rules live in ``__post_init__`` and raise :class:`~rlvr.errors.UserError`;
nothing downstream edits the config. This package imports nothing of rlvr but
:mod:`rlvr.errors` and :mod:`rlvr.choices` (the modes and names it validates), so loading a
config loads no torch, no data code and no reward pool (``tests/test_import_graph.py``).

- :mod:`rlvr.config.sections`: the sections (``model``, ``data``, ``rollout``, ``reward``, ``algo``,
  ``train``, ``offload``, ``log``, ``eval``, ``distributed``), each a dataclass whose
  ``__post_init__`` checks its own keys.
- :mod:`rlvr.config.tree`: :class:`Config`, the root, and the checks across sections.
- :mod:`rlvr.config.loading`: YAML presets and ``defaults:`` includes, overrides, typed values with
  one-line errors, YAML out, and the reference that ``rlvr config`` and ``docs/config.md`` show.

Every public name of the three is importable from ``rlvr.config``.
"""

from rlvr.config.loading import (
    MAX_CONFIG_VALUES,
    PRESETS_DIR,
    all_keys,
    build_config,
    config_markdown,
    field_docs,
    load_config,
    load_tree,
    parse_override,
    read_yaml,
    to_dict,
    to_yaml,
)
from rlvr.config.sections import (
    ALL_LINEAR,
    LORA_TARGETS,
    WORKER_ENV,
    AlgoConfig,
    DataConfig,
    DistributedConfig,
    EvalConfig,
    LogConfig,
    LoRAConfig,
    ModelConfig,
    OffloadConfig,
    RewardConfig,
    RolloutConfig,
    Switch,
    TrainConfig,
)
from rlvr.config.tree import Config

__all__ = [
    "ALL_LINEAR",
    "AlgoConfig",
    "Config",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "LORA_TARGETS",
    "LoRAConfig",
    "LogConfig",
    "MAX_CONFIG_VALUES",
    "ModelConfig",
    "OffloadConfig",
    "PRESETS_DIR",
    "RewardConfig",
    "RolloutConfig",
    "Switch",
    "TrainConfig",
    "WORKER_ENV",
    "all_keys",
    "build_config",
    "config_markdown",
    "field_docs",
    "load_config",
    "load_tree",
    "parse_override",
    "read_yaml",
    "to_dict",
    "to_yaml",
]
