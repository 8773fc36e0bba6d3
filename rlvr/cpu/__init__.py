"""CPU acceleration, in one package: what makes sampling and training fast on a CPU, and nothing else.

- ``packed``: oneDNN-prepacked copies of the linear weights (``model.packed_weights``), with a probe
  of which dtypes oneDNN packs on this CPU;
- ``kernels`` + ``decode_kernels.c``: the compiled decode step, built with the C compiler at first
  use and self-checked against the torch step before it is used;
- ``lean``: the lean decode step (``rollout.lean_decode``) that runs on them;
- ``update_attention`` + ``update_attention.c``: the update's shared-prompt attention compiled
  (``train.fused_attention``), forward and backward, on AVX512-BF16;
- ``runtime_env`` + ``mkl_intel_cpu.c``: the command line's process environment: glibc's malloc on
  transparent huge pages, keeping its freed heap, and oneMKL's AVX-512 kernels on AMD CPUs with AVX-512.

One switch turns all of it off: ``RLVR_CPU_ACCEL=0`` in the environment (the finer switches stay:
``model.packed_weights``, ``rollout.lean_decode``, ``train.fused_attention``, ``RLVR_DECODE_KERNELS``,
``RLVR_UPDATE_ATTENTION``, ``RLVR_HUGE_PAGES``,
``RLVR_MKL_AVX512``).

The rest of rlvr imports only the names in ``__all__`` from this package, never its modules
(``tests/test_import_graph.py`` checks it). They load on first use, so the command line's
``reexec_with_runtime_env`` (standard library only) loads no torch.
"""

from __future__ import annotations

import importlib
import os

SWITCH = "RLVR_CPU_ACCEL"


def enabled() -> bool:
    """False when ``RLVR_CPU_ACCEL=0``: no packed weights, no lean decode or kernels, no malloc tunables."""
    return os.environ.get(SWITCH, "1") != "0"


_EXPORTS = {
    "PackedLinears": ("packed", "PackedLinears"),
    "dtype_unpackable": ("packed", "dtype_unpackable"),
    "why_unpackable": ("packed", "why_unpackable"),
    "packable": ("packed", "packable"),
    "packed_training_pays": ("packed", "packed_training_pays"),
    "LeanDecoder": ("lean", "LeanDecoder"),
    "LeanUnavailable": ("lean", "LeanUnavailable"),
    "lean_unsupported": ("lean", "unsupported"),
    "decode_kernels": ("kernels", "load"),
    "update_attention_kernel": ("update_attention", "kernel"),
    "reexec_with_runtime_env": ("runtime_env", "reexec_with_runtime_env"),
    "huge_pages_env": ("runtime_env", "huge_pages_env"),
    "keep_freed_env": ("runtime_env", "keep_freed_env"),
    "process_env": ("runtime_env", "process_env"),
    "mkl_avx512_note": ("runtime_env", "mkl_avx512_note"),
}

__all__ = ["SWITCH", "enabled", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
