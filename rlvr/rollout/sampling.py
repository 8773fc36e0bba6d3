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
below 2^53 (the products by the mixer's 32-bit constants, taken in two 16-bit halves, below
2^49), so int64 arithmetic never overflows on any device or compiler, and the float64 division is
exact. For one seed, distinct positions give distinct first words (each stage is a bijection).
:func:`draw` then picks the token by inverse CDF (:func:`inverse_cdf`) on the logits after
``generate``'s warpers (:func:`warp`). ``tests/rollout/test_counter_sampling.py`` checks the
uniformity, the independence of neighbouring keys, pinned values and the int64 bound.

torch's own Philox (``torch.rand`` on CUDA) is counter-based too, but it is keyed per generator,
not per row, and its CPU and CUDA streams differ; NumPy's ``Philox`` runs on the host only.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

_MASK32 = 0xFFFFFFFF


def sample_seed(*key: int) -> int:
    """A 63-bit seed from a tuple of integers, e.g. ``(seed, step, group, sample)``: the same key gives
    the same seed in every process (unlike ``hash()``), and nearby keys give unrelated seeds."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


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
            broadcastable to ``seed`` (a device scalar inside a captured decode step); taken
            mod 2^32.
    """
    seed = seed.long()
    lo, hi = seed & _MASK32, (seed >> 32) & _MASK32
    pos = torch.as_tensor(position, dtype=torch.long, device=seed.device) & _MASK32
    a = _mix(lo ^ _mix(hi ^ _mix(pos ^ 0x9E3779B9)))
    b = _mix(hi ^ _mix(lo ^ _mix(pos ^ 0x7F4A7C15)))
    return ((a >> 5) * 67108864 + (b >> 6)).double() / 9007199254740992.0  # (27 bits · 2^26 + 26 bits) / 2^53


def warpers(temperature: float, top_k: int, top_p: float) -> list:
    """``generate``'s own warper classes in its order: temperature (1 = off: z / 1 is z), top-k (0 = off),
    top-p (1 = off)."""
    out = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    if top_k:
        out.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=top_p))
    return out


def warp(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``generate``'s warpers in its order: temperature (1 = off), top-k (0 = off), top-p (1 = off).
    Cut logits become −inf. Traceable: no host reads, so it runs inside a captured step. With both
    top-k and top-p, top-p runs on the k kept logits (:func:`top_k_top_p`), not a sort of the vocabulary."""
    if top_k and top_p < 1.0:
        if temperature != 1.0:
            logits = logits / temperature
        return top_k_top_p(logits, top_k, top_p)
    for w in warpers(temperature, top_k, top_p):
        logits = w(None, logits)
    return logits


def top_k_top_p(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """``TopKLogitsWarper`` then ``TopPLogitsWarper`` (at least one token kept), with top-p computed on the
    ``top_k`` largest logits alone: a [b, k] sort instead of a [b, V] one (152k entries per row per token at
    Qwen2.5's vocabulary). The cut tokens' probabilities are 0 after top-k, so the kept set is top-p's over
    the whole row, up to the rounding of the softmax's sum and to ties at the k-th logit (the warper keeps
    every tied token, this keeps k)."""
    k = min(top_k, logits.shape[-1])
    vals, idx = logits.topk(k, dim=-1)  # [b, k], descending
    ascending, where = vals.flip(-1), idx.flip(-1)
    cut = ascending.softmax(-1).cumsum(-1) <= (1 - top_p)
    cut[..., -1:] = False  # the largest always stays
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, where, ascending.masked_fill(cut, float("-inf")))


def inverse_cdf(logits: Tensor, u: Tensor, block: int = 256) -> Tensor:
    """[b] the first token v of each row with CDF(v) > u · CDF(V), CDF the cumsum of exp(logits − max).

    Math: inverse-transform sampling of p = softmax(logits) at u ~ U[0, 1). The naive equivalent is
    one float64 cumsum over the whole vocabulary and a search in it
    (``tests/rollout/test_seeded_sampling.py`` checks they pick the same tokens).

    How: the unnormalised weights w = exp(logits − max) are summed in blocks of ``block`` tokens
    (float64), the block holding u · CDF(V) is found on the block sums' cumsum, and the token on
    that block's own cumsum: the same token the full cumsum finds, up to the rounding of the partial
    sums, for about a tenth of the work (a float64 softmax and cumsum over a 49k-token vocabulary
    was a visible share of a decode step: ``benchmarks/NOTES.md``). A token whose logit is −inf has
    weight 0 and is never picked.

    Args:
        logits: [b, V] (after the warpers).
        u: [b] float64 uniforms in [0, 1), on the logits' device.
    """
    b, V = logits.shape
    w = torch.exp(logits.float() - logits.amax(-1, keepdim=True)).double()  # [b, V], max 1
    pad = -V % block
    blocks = torch.nn.functional.pad(w, (0, pad)).view(b, -1, block)  # [b, n, block]
    csum = blocks.sum(-1).cumsum(-1)  # [b, n]
    target = u * csum[:, -1]  # [b]
    # right=True: the first block whose cumsum exceeds the target (one with weight in it)
    k = torch.searchsorted(csum, target[:, None], right=True)[:, 0].clamp(max=csum.shape[1] - 1)  # [b]
    before = torch.where(k > 0, csum.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0], torch.zeros_like(target))
    inner = blocks[torch.arange(b, device=logits.device), k].cumsum(-1)  # [b, block]
    j = torch.searchsorted(inner, (target - before)[:, None], right=True)[:, 0]  # [b]
    # rounding can put the target just past the block's last weight: take its last token with weight
    last = (inner < inner[:, -1:]).sum(-1)  # index of the first position reaching the block's total
    return (k * block + torch.minimum(j, last)).clamp(max=V - 1)


def draw(logits: Tensor, u: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, block: int = 256) -> Tensor:
    """[b] tokens: inverse CDF of softmax(warped logits) at ``u`` [b] (:func:`warp`, :func:`inverse_cdf`).
    The draws of :class:`~rlvr.rollout.decode.SeededPicker`, which a static decoder computes itself."""
    return inverse_cdf(warp(logits, temperature, top_k, top_p), u.to(logits.device), block)
