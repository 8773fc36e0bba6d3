"""Which precision to compute in, chosen from the hardware: bf16 only where it runs natively.

A CPU without AVX512-BF16/AMX emulates bf16 matmuls, hundreds of times slower than fp32. A CPU with
AVX512-BF16 but no AMX runs them natively, at a rate that differs by CPU: 0.55x fp32's on one such
CPU, 2x on another (``benchmarks/NOTES.md``, "precision"). So ``auto`` (the default of
``rollout.dtype`` and ``model.autocast_bf16``) means bf16 on

- a CUDA device that supports bf16, or
- a CPU whose *dispatched* ATen capability is AVX512 (or newer) and that has AMX tiles (where
  bf16 matmuls ran faster than fp32);

and, on a CPU whose dispatched capability is AVX512 with AVX512-BF16 but no AMX, bf16 autocast in
training alone where bf16 products run at least :data:`AUTOCAST_MIN_SPEEDUP` times as fast as fp32's
(sampling stays fp32 there: its packed weights and compiled decode step are float32). That rate is
measured once per machine (:func:`machine_bf16_speedup`) and kept with its figures in the rlvr cache,
so one machine and one config always train in one precision: a stopwatch at each run's start read
1.49x to 9.9x on one machine within 20 minutes under other load, and two runs of one config trained
in different precisions (issue 58).

The dispatched capability (``torch.backends.cpu.get_cpu_capability()``) is what PyTorch's kernels
actually use, so ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine reads as AVX2 here, as it
runs. Everything else computes in fp32. Master weights are never touched: ``model.dtype``
stays an explicit choice (fp32 by default; ~1e-6 updates vanish in bf16 weights).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

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
    hardware: str = ""
    """What the device has, without what training makes of it (``why`` may say that): the reason
    generation commands print (empty: ``why`` is that already)."""

    @property
    def trains_bf16(self) -> bool:
        """``model.autocast_bf16=auto`` turns bf16 autocast on: native bf16, or measured to pay here."""
        return self.native or self.autocast


AUTOCAST_MIN_SPEEDUP = 1.5
"""On a CPU with AVX512-BF16 but no AMX, ``model.autocast_bf16=auto`` turns bf16 autocast on where
bf16 products run at least this many times fp32's rate (:func:`bf16_speedup`). The products are
about three quarters of the update's time and autocast adds its casts, so a smaller edge would buy
little or nothing; the two CPUs of this kind measured so far were far on either side (0.55x, 2x)."""


def bf16_speedup(rounds: int = 10) -> float:
    """bf16 products' rate over fp32's on this CPU at torch's current thread count: the best of
    ``rounds`` interleaved [512, 1024] x [1024, 1024] products each way, after a warm-up (under a
    fifth of a second in all), so that a slow spell of a shared machine slows both sides alike.
    The stopwatch alone: :func:`machine_bf16_speedup` runs it once per machine. Written here rather
    than taken from a library: no library reports a CPU's bf16-over-fp32 product rate, which is the
    number the choice needs."""
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


def cpu_identity() -> dict:
    """What names this CPU as PyTorch runs on it: /proc/cpuinfo's model name, family, model and stepping
    (Linux; ``platform.processor()`` elsewhere), the dispatched capability and the torch version."""
    ident = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__.split("+")[0]}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                if key.strip() in ("vendor_id", "model name", "cpu family", "model", "stepping"):
                    ident[key.strip()] = value.strip()
    except OSError:
        ident["processor"] = platform.processor() or platform.machine()
    return ident


def speed_cache_path() -> Path:
    """Where this machine's bf16-over-fp32 measurement is kept: ``$RLVR_CACHE/cpu/bf16_speed-<key>.json``
    (default ``~/.cache/rlvr``), the key a hash of :func:`cpu_identity`."""
    root = Path(os.environ.get("RLVR_CACHE") or Path.home() / ".cache" / "rlvr")
    key = hashlib.sha256(json.dumps(cpu_identity(), sort_keys=True).encode()).hexdigest()[:12]
    return root / "cpu" / f"bf16_speed-{key}.json"


@functools.cache
def machine_bf16_speedup() -> tuple[float, Path]:
    """(bf16 products' rate over fp32's on this machine, the file it is kept in): read from
    :func:`speed_cache_path`, or measured by :func:`bf16_speedup` and written there (atomically, under
    a lock, so that two runs starting together measure once) with its figures: the CPU, the thread
    count and the date. Delete the file to measure again. Where the cache cannot be written the
    measurement is used for this process alone."""
    path = speed_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return float(json.loads(path.read_text(encoding="utf-8"))["bf16_over_fp32"]), path
            except (OSError, ValueError, KeyError, TypeError):
                pass  # none yet, or unreadable: measure
            speedup = bf16_speedup()
            figures = {
                "bf16_over_fp32": round(speedup, 4),
                "threads": torch.get_num_threads(),
                "measured": datetime.datetime.now().isoformat(timespec="seconds"),
                "how": "best of 10 interleaved [512,1024]x[1024,1024] products each way (rlvr.models.precision)",
                "cpu": cpu_identity(),
            }
            part = path.with_name(f".{path.name}.{os.getpid()}")
            part.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
            os.replace(part, path)
            return round(speedup, 4), path
    except OSError:
        return round(bf16_speedup(), 4), path


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
        speedup, kept = machine_bf16_speedup()
        pays = speedup >= AUTOCAST_MIN_SPEEDUP
        return BF16Support(
            False,
            f"this CPU has AVX512_BF16 but no AMX ({capability}): bf16 products ran at {speedup:.2f}x fp32's rate "
            + (
                "here, so training autocasts to bf16 and sampling stays float32"
                if pays
                else f"here, under the {AUTOCAST_MIN_SPEEDUP}x that bf16 autocast needs to pay"
            )
            + f"; measured once on this machine and kept in {kept} (delete it to measure again)",
            unsure=not pays,
            autocast=pays,
            hardware=f"this CPU has AVX512_BF16 but no AMX ({capability}): bf16 is native for products, not sampling",
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
