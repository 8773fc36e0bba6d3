"""The draw rule every decoder samples by: a counter-based uniform keyed by (row seed, position).

Why: a rollout's samples must not depend on which rows share a batch, on whether finished rows
were dropped or compacted, on how many processes split the step, or on the device, and a resumed
run must draw what the first run drew. A stateful generator per row gives the first three on a
CPU, but it cannot run inside a captured CUDA graph (one host draw per row per token). A
counter-based generator can: the t-th draw of a row is a pure function of the row's seed and t,
computed by integer operations on whatever device holds the logits.

How: :func:`counter_uniform` hashes (seed, position) with Chris Wellons' ``lowbias32`` mixer, a
bijection of 32-bit words with good avalanche (https://nullprogram.com/blog/2018/07/31/), into two
32-bit words and joins 53 of their bits into a float64 in [0, 1). Every intermediate value stays
below 2^49, so int64 arithmetic never overflows on any device or compiler: products by the
mixer's 32-bit constants are taken in two 16-bit halves. For one seed, distinct positions give
distinct first words (each stage is a bijection). :func:`draw` then picks the token by inverse
CDF on the warped logits (:func:`rlvr.rollout.decode.inverse_cdf`).

torch's own Philox (``torch.rand`` on CUDA) is counter-based too, but it is keyed per generator,
not per row, and its CPU and CUDA streams differ; NumPy's ``Philox`` runs on the host only.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x · c) mod 2^32 for x in [0, 2^32), without an int64 product above 2^49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix(x: Tensor) -> Tensor:
    """``lowbias32``: a bijection of [0, 2^32) (int64 tensors holding 32-bit words)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: Tensor, position: Tensor | int) -> Tensor:
    """float64 uniforms in [0, 1), one per element of ``seed`` (int64, non-negative, up to 63 bits),
    keyed by (seed, position): the same key gives the same value on every device and in every batch.

    Args:
        seed: [b] int64 row seeds (:func:`rlvr.rollout.hf.sample_seed`).
        position: the response index of the token being drawn, an int or an int64 tensor
            broadcastable to ``seed`` (a device scalar inside a captured decode step).
    """
    seed = seed.long()
    lo, hi = seed & _MASK32, (seed >> 32) & _MASK32
    pos = torch.as_tensor(position, dtype=torch.long, device=seed.device) & _MASK32
    a = _mix(lo ^ _mix(hi ^ _mix(pos ^ 0x9E3779B9)))
    b = _mix(hi ^ _mix(lo ^ _mix(pos ^ 0x7F4A7C15)))
    return ((a >> 5) * 67108864 + (b >> 6)).double() / 9007199254740992.0  # (27 bits · 2^26 + 26 bits) / 2^53


def warp(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``generate``'s warpers in its order: temperature (1 = off), top-k (0 = off), top-p (1 = off).
    Cut logits become −inf. Traceable: no host reads, so it runs inside a captured step."""
    from rlvr.rollout.decode import warpers

    for w in warpers(temperature, top_k, top_p):
        logits = w(None, logits)
    return logits


def draw(logits: Tensor, u: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, block: int = 256) -> Tensor:
    """[b] tokens: inverse CDF of softmax(warped logits) at ``u`` [b] (see :class:`~rlvr.rollout.decode.SeededPicker`)."""
    from rlvr.rollout.decode import inverse_cdf

    return inverse_cdf(warp(logits, temperature, top_k, top_p), u.to(logits.device), block)
