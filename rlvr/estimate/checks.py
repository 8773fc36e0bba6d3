"""The memory estimate against this machine: before training, a GPU run that does not fit its
device's free memory is refused (:func:`memory_check`) and a CPU run past the RAM available is warned
(:func:`ram_warning`), each naming the config keys that shrink its two largest items (:data:`REDUCE`);
after training, the measured peak is printed beside the estimate (:func:`measured_beside_estimate`).
"""

from __future__ import annotations

from rlvr.errors import UserError
from rlvr.estimate.peak import GiB, MemoryEstimate, MiB

REDUCE = {
    "activations": "train.micro_batch_seqs or train.micro_batch_tokens (smaller) or model.gradient_checkpointing=true",
    "KV cache": "rollout.batch_seqs or rollout.max_new_tokens (smaller)",
    "static KV cache": "rollout.batch_seqs or rollout.max_new_tokens (smaller); it stays allocated through the update "
    "(rollout.static_decode=false decodes dynamically and frees it, at the cost of the compiled step)",
    "CUDA-graph pool": "rollout.batch_seqs (smaller), or rollout.static_decode=false (no compiled step)",
    "AdamW state": "model.lora.rank (LoRA), or offload.params=true and offload.optimizer=true (FSDP on GPUs)",
    "gradients": "model.lora.rank (LoRA)",
    "parameters": "model.lora.rank (LoRA) with a bfloat16 model.dtype",
    "reference": "offload.reference=true (FSDP on GPUs) or algo.kl_coef=0",
    "rollout copy": "rollout.dtype=model.dtype (no copy)",
    "packed weights": "model.packed_weights=false",
}
"""For each estimate item, the config keys that make it smaller."""


def memory_check(est: MemoryEstimate, free_bytes: int, where: str) -> None:
    """UserError when the estimate exceeds the free memory of the device (``where`` names it), with the
    keys that reduce the two largest items; ``train.skip_memory_check=true`` is the way past it."""
    if est.total <= free_bytes:
        return
    raise UserError(
        f"this run needs about {est.total / GiB:.1f} GiB but {where} has {free_bytes / GiB:.1f} GiB free; reduce it "
        f"({_largest_reducible(est)}), or set train.skip_memory_check=true to start anyway"
    )


def ram_warning(est: MemoryEstimate, available_bytes: int | None) -> str | None:
    """A CPU run's warning line when the estimate exceeds the RAM the machine has available, with the
    keys that reduce the two largest items; None when it fits or the RAM is unknown. A warning, not
    the GPU's refusal: on a CPU the estimate is an upper bound (every row at
    ``rollout.max_new_tokens``), and a run past it swaps before it fails."""
    if available_bytes is None or est.total <= available_bytes:
        return None
    return (
        f"warning: this run may need up to {est.total / GiB:.1f} GiB but the machine has "
        f"{available_bytes / GiB:.1f} GiB of RAM available; if it swaps, reduce it ({_largest_reducible(est)})"
    )


def available_ram() -> int | None:
    """Bytes of RAM available to a new process (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _largest_reducible(est: MemoryEstimate) -> str:
    """The two largest items on the device with the config keys that make each smaller."""
    on_device = (i for i in est.items if i.name in REDUCE and i.bytes and i.phase != "host")
    largest = sorted(on_device, key=lambda i: -i.bytes)[:2]
    return "; ".join(f"{i.name} {i.bytes / GiB:.1f} GiB: {REDUCE[i.name]}" for i in largest)


def measured_beside_estimate(peak: dict[str, float], est: MemoryEstimate) -> str:
    """The trainer's last memory line: the measured peak (``peak_memory``'s MiB keys) beside the estimate."""
    from rlvr import metric_names as M

    key, what = (
        (M.CUDA_MAX_ALLOCATED_MIB, "torch.cuda.max_memory_allocated")
        if est.device == "cuda"
        else (M.PEAK_RSS_MIB, "RSS")
    )
    if key not in peak:
        return f"memory: estimated {est.total / GiB:.2f} GiB; the peak was not measured here"
    measured = peak[key] * MiB
    return (
        f"memory: measured peak {measured / GiB:.2f} GiB ({what}) beside the estimate {est.total / GiB:.2f} GiB "
        f"(estimate {100 * (est.total / measured - 1):+.0f} %)"
    )
