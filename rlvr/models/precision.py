"""Which precision to compute in, chosen from the hardware: bf16 only where it runs natively.

A CPU without AVX512-BF16/AMX emulates bf16 matmuls, hundreds of times slower than fp32. A CPU with
AVX512-BF16 but no AMX runs them natively, at a rate that differs by CPU: 0.55x fp32's on one such
CPU, 2x on another (``benchmarks/NOTES.md``, "precision"). So ``auto`` (the default of
``rollout.dtype`` and ``model.autocast_bf16``) means bf16 on

- a CUDA device that supports bf16, or
- a CPU whose *dispatched* ATen capability is AVX512 (or newer) and that has AMX tiles (where
  bf16 matmuls ran faster than fp32);

and, on a CPU whose dispatched capability is AVX512 with AVX512-BF16 but no AMX, bf16 autocast in
training alone where :func:`bf16_speedup` measures bf16 products at least
:data:`AUTOCAST_MIN_SPEEDUP` times as fast as fp32's (sampling stays fp32 there: its packed weights
and compiled decode step are float32).

The dispatched capability (``torch.backends.cpu.get_cpu_capability()``) is what PyTorch's kernels
actually use, so ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine reads as AVX2 here, as it
runs. Everything else computes in fp32. Master weights are never touched: ``model.dtype``
stays an explicit choice (fp32 by default; ~1e-6 updates vanish in bf16 weights).
"""

from __future__ import annotations

import dataclasses
import functools
import time
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
    autocast: bool = False
    """Not native for sampling, but bf16 autocast in training was measured to pay on this CPU."""

    @property
    def trains_bf16(self) -> bool:
        """``model.autocast_bf16=auto`` turns bf16 autocast on: native bf16, or measured to pay here."""
        return self.native or self.autocast


AUTOCAST_MIN_SPEEDUP = 1.5
"""On a CPU with AVX512-BF16 but no AMX, ``model.autocast_bf16=auto`` turns bf16 autocast on where
bf16 products run at least this many times fp32's rate (:func:`bf16_speedup`). The products are
about three quarters of the update's time and autocast adds its casts, so a smaller edge would buy
little or nothing; the two CPUs of this kind measured so far were far on either side (0.55x, 2x)."""


@functools.cache
def bf16_speedup(rounds: int = 5) -> float:
    """bf16 products' rate over fp32's on this CPU at torch's current thread count: the best of
    ``rounds`` interleaved [512, 1024] x [1024, 1024] products each way, after a warm-up (under a
    tenth of a second in all), so that a slow spell of a shared machine slows both sides alike.
    Measured once per process. Written here rather than taken from a library: no library reports
    a CPU's bf16-over-fp32 product rate, which is the number the choice needs."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=gen), torch.randn(1024, 1024, generator=gen)
    sides = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = dict.fromkeys(sides, float("inf"))
    for i in range(rounds + 1):
        for dtype, (x, y) in sides.items():
            start = time.perf_counter()
            torch.mm(x, y)
            if i:  # the first round warms up (oneDNN builds its bf16 kernel)
                best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


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
        speedup = bf16_speedup()
        pays = speedup >= AUTOCAST_MIN_SPEEDUP
        return BF16Support(
            False,
            f"this CPU has AVX512_BF16 but no AMX ({capability}): bf16 products ran at {speedup:.2f}x fp32's rate "
            + (
                "here, so training autocasts to bf16 and sampling stays float32"
                if pays
                else f"here, under the {AUTOCAST_MIN_SPEEDUP}x that bf16 autocast needs to pay"
            ),
            unsure=not pays,
            autocast=pays,
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
        autocast = Switch.ON if support.trains_bf16 else Switch.OFF
    lines = [
        f"rollout dtype: {rollout_dtype}, training autocast bf16: {'on' if autocast == Switch.ON else 'off'} "
        f"({'auto: ' if 'auto' in (cfg.rollout.dtype, cfg.model.autocast_bf16) else ''}{support.why})"
    ]
    if warn_rollout:
        lines.append(f"warning: rollout.dtype={warn_rollout}")
    if cfg.model.autocast_bf16 == Switch.ON and not support.trains_bf16:
        slower = _slower(support)
        lines.append(f"warning: model.autocast_bf16=true but {support.why}; training {slower} than in float32")
    resolved = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, dtype=rollout_dtype),
        model=dataclasses.replace(cfg.model, autocast_bf16=autocast),
    )
    return resolved, lines


def bf16_micro_batch(cfg):
    """``cfg`` with ``train.micro_batch_seqs`` set to ``train.micro_batch_seqs_bf16`` where the update runs
    under bf16 autocast (``model.autocast_bf16`` resolved to on) and that key is set, plus the line that
    says so (None when nothing changes). Applied once the precision is resolved, so the run's recorded
    config, its estimate and every pass see the micro-batch the update uses."""
    from rlvr.config import Switch

    train = cfg.train
    mb = train.micro_batch(cfg.model.autocast_bf16 == Switch.ON)
    if mb == train.micro_batch_seqs:
        return cfg, None
    line = (
        f"micro-batches: {mb} sequences a pass under bf16 autocast "
        f"(train.micro_batch_seqs_bf16; {train.micro_batch_seqs} in float32)"
    )
    return dataclasses.replace(cfg, train=dataclasses.replace(train, micro_batch_seqs=mb)), line


def needs_resolving(cfg) -> bool:
    """True while ``cfg`` still holds an ``auto`` precision setting."""
    return cfg.rollout.dtype == "auto" or cfg.model.autocast_bf16 == "auto"


def reference_dtype(model_dtype: str, autocast: bool) -> str:
    """The dtype the reference model is kept in: bfloat16 when its passes run under bf16 autocast (its
    matrix products then read bf16 copies of the weights anyway, and it never trains, so fp32 masters
    buy nothing but twice the memory), else ``model.dtype``, so that an fp32 run's reference equals the
    policy it starts from exactly (KL 0 at step 1)."""
    return "bfloat16" if autocast else model_dtype
