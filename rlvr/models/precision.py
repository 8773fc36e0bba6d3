"""Which precision to compute in, chosen from the hardware: bf16 only where it runs natively.

A CPU without AVX512-BF16/AMX emulates bf16 matmuls, hundreds of times slower than fp32. A CPU with
AVX512-BF16 but no AMX runs them, but slower than fp32, and the quickstart's update took longer
under bf16 autocast than in fp32, with no faster rollout (``benchmarks/NOTES.md``, "precision").
So ``auto`` (the default of ``rollout.dtype`` and ``model.autocast_bf16``) means bf16 only on

- a CUDA device that supports bf16, or
- a CPU whose *dispatched* ATen capability is AVX512 (or newer) and that has AMX tiles (where
  bf16 matmuls ran faster than fp32).

The dispatched capability (``torch.backends.cpu.get_cpu_capability()``) is what PyTorch's kernels
actually use, so ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine reads as AVX2 here, as it
runs. Everything else computes in fp32. Master weights are never touched: ``model.dtype``
stays an explicit choice (fp32 by default; ~1e-6 updates vanish in bf16 weights).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BF16Support:
    native: bool
    """bf16 matmuls run at hardware speed on this device."""
    why: str
    """Short reason, e.g. 'this CPU has no native bf16: AVX2'."""
    unsure: bool = False
    """Not native, but bf16 may still beat fp32 here: measured both ways on CPUs of this kind."""


@functools.cache
def cpu_bf16() -> BF16Support:
    """Whether this CPU, as PyTorch dispatches on it, runs bf16 natively."""
    capability = torch.backends.cpu.get_cpu_capability()
    flag = lambda name: bool(getattr(torch.cpu, name, lambda: False)())  # noqa: E731 (private probes)
    hw = [n for n, f in (("AVX512_BF16", "_is_avx512_bf16_supported"), ("AMX", "_is_amx_tile_supported")) if flag(f)]
    if capability.startswith("AVX512") and "AMX" in hw:
        return BF16Support(True, f"this CPU has native bf16: {capability} with {'+'.join(hw)}")
    if hw and not capability.startswith("AVX512"):  # the hardware has it but PyTorch dispatches below AVX-512
        return BF16Support(False, f"this CPU has no native bf16 as PyTorch dispatches: {capability}")
    if hw:
        return BF16Support(
            False,
            f"this CPU has AVX512_BF16 but no AMX ({capability}): bf16 products ran at 0.55x fp32's rate on one "
            "such CPU and 2x on another (benchmarks/NOTES.md; benchmarks/roofline.py measures both here)",
            unsure=True,
        )
    return BF16Support(False, f"this CPU has no native bf16: {capability}")


def _slower(support: BF16Support) -> str:
    return "may run slower" if support.unsure else "will run slower"


def bf16_support(device: torch.device) -> BF16Support:
    """Native bf16 on ``device`` (a CUDA device, or the CPU)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return BF16Support(True, f"{name} supports bf16")
        return BF16Support(False, f"{name} has no bf16 support")
    return cpu_bf16()


def choose_dtype(setting: str, device: torch.device) -> tuple[str, str | None]:
    """(dtype name, warning or None) for a ``rollout.dtype``-style setting: auto, float32 or bfloat16."""
    support = bf16_support(device)
    if setting == "auto":
        return ("bfloat16" if support.native else "float32"), None
    if setting == "bfloat16" and not support.native:
        return setting, f"bfloat16 was asked for but {support.why}; it {_slower(support)} than float32"
    return setting, None


def resolve_precision(cfg, device: torch.device):
    """``cfg`` with ``rollout.dtype`` and ``model.autocast_bf16`` resolved, plus the lines to print.

    Returns:
        (config with no ``auto`` left, [one line saying the choice and why, warnings...])
    """
    from rlvr.config import Switch

    support = bf16_support(device)
    rollout_dtype, warn_rollout = choose_dtype(cfg.rollout.dtype, device)
    autocast = cfg.model.autocast_bf16
    if autocast == Switch.AUTO:
        autocast = Switch.ON if support.native else Switch.OFF
    lines = [
        f"rollout dtype: {rollout_dtype}, training autocast bf16: {'on' if autocast == Switch.ON else 'off'} "
        f"({'auto: ' if 'auto' in (cfg.rollout.dtype, cfg.model.autocast_bf16) else ''}{support.why})"
    ]
    if warn_rollout:
        lines.append(f"warning: rollout.dtype={warn_rollout}")
    if cfg.model.autocast_bf16 == Switch.ON and not support.native:
        slower = _slower(support)
        lines.append(f"warning: model.autocast_bf16=true but {support.why}; training {slower} than in float32")
    resolved = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, dtype=rollout_dtype),
        model=dataclasses.replace(cfg.model, autocast_bf16=autocast),
    )
    return resolved, lines


def needs_resolving(cfg) -> bool:
    """True while ``cfg`` still holds an ``auto`` precision setting."""
    return cfg.rollout.dtype == "auto" or cfg.model.autocast_bf16 == "auto"


def reference_dtype(model_dtype: str, autocast: bool) -> str:
    """The dtype the reference model is kept in: bfloat16 when its passes run under bf16 autocast (its
    matrix products then read bf16 copies of the weights anyway, and it never trains, so fp32 masters
    buy nothing but twice the memory), else ``model.dtype``, so that an fp32 run's reference equals the
    policy it starts from exactly (KL 0 at step 1)."""
    return "bfloat16" if autocast else model_dtype
