"""Decoding on a static KV cache, with the step compiled (CUDA graphs) where the device is a GPU.

Why: on a GPU the dynamic decode (:func:`rlvr.rollout.decode.decode`) launches a few hundred small
kernels per step from Python, each far below what the GPU could do, so a small model's rollout runs
at a small fraction of its weights' read floor. A step whose every tensor has a fixed shape and a
fixed address can be captured once as a CUDA graph and replayed: transformers' ``StaticCache``
gives the fixed cache, ``torch.compile(mode="reduce-overhead")`` the capture.

How: :func:`decode_static` keeps what the dynamic decode guarantees:

- **shared prompt**: each prompt is prefilled once (the model's own forward, not compiled) and its
  keys and values are copied into its G rows of the static cache;
- **per-sequence seeded sampling**: every row steps every time (fixed shapes), but the picker is
  asked only for the live rows, so a row's generator draws exactly as in the dynamic decode;
- **stop strings, EOS and token accounting**: a finished row's later tokens are never recorded;
  the response, stop positions and log-probs come out as :class:`~rlvr.rollout.decode.Decoded`;
- **eval mode** is the caller's (``HFRolloutEngine`` decodes under ``eval_mode``).

Fixed shapes and addresses across rollouts (:class:`StaticBuffers`, which ``HFRolloutEngine`` keeps for
its life): one ``StaticCache`` and one attention mask of a fixed capacity (the run's longest prompt +
response, rounded up to :data:`CACHE_MULTIPLE`) by a fixed number of rows (``batch_seqs``: a smaller chunk
is padded with rows that are never live), allocated once, reset (transformers' ``StaticCache.reset``: keys,
values and lengths zeroed) and refilled in place by every rollout; the step is compiled once per engine.
So a run compiles the step once (plus a shape for evaluation where its prompts or responses outgrow the
cache: the capacity and rows only grow, so few shapes ever occur), rather than once per (batch, prompt
length) with a new capture each rollout and, from dynamo's 9th shape of the step on, an eager step.
The cache is held between rollouts (its memory stays in use through the update). The policy's weights
are updated in place (the optimizer, ``HFRolloutEngine.sync_weights``'s ``load_state_dict``), so the
compiled step reads the new weights after each step. What this does to a GPU's decode time is not
measured (no GPU was at hand).

The plain implementation it must equal is the dynamic decode: greedy output token for token and
seeded samples draw for draw, and a reused cache what a fresh one decodes
(``tests/rollout/test_static_decode.py``, on the CPU, where the step runs eagerly or under
``torch.compile``'s eager backend, which also counts its compiles).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from transformers import StaticCache

from rlvr.models.forward import cache_kwargs, output_cache
from rlvr.rollout.decode import Decoded

CACHE_MULTIPLE = 64
"""Cache capacities are rounded up to this: a capacity that grows grows in few steps."""


def round_capacity(positions: int) -> int:
    """``positions`` rounded up to :data:`CACHE_MULTIPLE` (at least one multiple)."""
    return max(1, -(-positions // CACHE_MULTIPLE)) * CACHE_MULTIPLE


def _step_fn(model) -> Callable:
    """``(tokens [B, 1], mask [B, cache length], positions [B, 1], cache) -> [B, V]`` float32 logits of one
    decode step of ``model``, writing into the static cache. The cache argument's name is looked up
    here, outside any compiled region (the lookup is cached, which torch.compile would trace through)."""
    name = next(iter(cache_kwargs(model, None)))

    def step(tokens: Tensor, mask: Tensor, positions: Tensor, cache) -> Tensor:
        out = model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{name: cache},
        )
        return out.logits[:, -1].float()

    return step


class StaticBuffers:
    """What the static decode of one model keeps between rollouts: one ``StaticCache`` and one attention
    mask of ``rows`` x ``capacity`` (the compiled step's inputs with fixed addresses), reset and refilled
    by each rollout, and the step (under ``torch.compile`` with ``compile`` as the backend, else eager).

    ``capacity`` (cache positions) and ``rows`` (batch rows) are fixed from the start where the caller
    knows the longest prompt + response and the batch (``HFRolloutEngine``'s ``static_capacity`` and
    ``batch_seqs``); a chunk that needs more grows them once, rounded up to :data:`CACHE_MULTIPLE`
    positions, and the buffers are allocated anew at the new shape (one more compile). They never
    shrink: a short prompt or a small last chunk runs at the same shape, its spare rows padding.
    """

    def __init__(self, model, *, capacity: int = 0, rows: int = 0, compile: str | None = None) -> None:
        self.model = model
        self.capacity = round_capacity(capacity) if capacity > 0 else 0
        self.rows = rows
        self.compile = compile
        self.cache: StaticCache | None = None
        self.mask: Tensor | None = None  # [rows, capacity]
        self.dtype: torch.dtype | None = None  # the cache's
        step = _step_fn(model)
        if compile is not None:
            mode = "reduce-overhead" if compile == "inductor" else None
            step = torch.compile(step, backend=compile, mode=mode, dynamic=False)
        self.step = step

    def fit(self, rows: int, positions: int) -> None:
        """Grow to at least ``rows`` rows and ``positions`` positions (rounded up); unchanged when they fit."""
        if positions > self.capacity:
            self.capacity, self.cache = round_capacity(positions), None
        if rows > self.rows:
            self.rows, self.cache = rows, None

    def load(self, prompt_cache, repeats: int, prompt_mask: Tensor) -> tuple[StaticCache, Tensor]:
        """(the cache, the mask), reset and holding each of the P prompts' keys and values (``prompt_cache``,
        the prefill's) and attention mask ([P, L]) in its ``repeats`` rows; the rows past P·``repeats`` are
        empty (all zero, masked). The same objects as the last rollout's where the shape, dtype and device
        are the same."""
        first = prompt_cache.layers[0].keys
        if self.cache is not None and (self.mask.device != first.device or self.dtype != first.dtype):
            self.cache = None
        if self.cache is None:
            self.cache = self._allocate(prompt_cache)
            self.mask = torch.zeros(self.rows, self.capacity, dtype=torch.long, device=first.device)
            torch._dynamo.mark_static_address(self.mask)  # like the cache's tensors: CUDA graphs read it in place
            self.dtype = first.dtype
        cache, mask = self.cache, self.mask
        cache.reset()  # zeroes every layer's keys, values and length: nothing of a longer earlier prompt stays
        G, (P, L) = repeats, prompt_mask.shape
        for layer, src in zip(cache.layers, prompt_cache.layers):
            _, H, n, _ = src.keys.shape
            # rows p·G .. p·G+G-1 hold prompt p: a broadcast copy, no repeated intermediate
            layer.keys[: P * G].view(P, G, H, self.capacity, -1)[:, :, :, :n].copy_(src.keys[:, None])
            layer.values[: P * G].view(P, G, H, self.capacity, -1)[:, :, :, :n].copy_(src.values[:, None])
            layer.cumulative_length.fill_(n)
        mask.zero_()
        mask[: P * G].view(P, G, self.capacity)[:, :, :L].copy_(prompt_mask[:, None])
        return cache, mask

    def _allocate(self, prompt_cache) -> StaticCache:
        cache = StaticCache(config=self.model.config, max_cache_len=self.capacity)
        if len(cache.layers) != len(prompt_cache.layers):
            raise ValueError(
                f"the static cache has {len(cache.layers)} layers, the prefill's {len(prompt_cache.layers)}"
            )
        for layer, src in zip(cache.layers, prompt_cache.layers):
            like = (src.keys[:1].expand(self.rows, -1, -1, -1), src.values[:1].expand(self.rows, -1, -1, -1))
            layer.lazy_initialization(*like)  # allocates [rows, heads, capacity, head_dim], zeroed
        return cache


def static_cache(model, prompt_cache, repeats: int, capacity: int) -> StaticCache:
    """A new ``StaticCache`` of ``capacity`` positions for P·``repeats`` rows, holding each of the P
    prompts' keys and values (``prompt_cache``, the prefill's) in its ``repeats`` rows."""
    P, _, L, _ = prompt_cache.layers[0].keys.shape
    buffers = StaticBuffers(model, capacity=capacity, rows=P * repeats)
    mask = torch.ones(P, L, dtype=torch.long, device=prompt_cache.layers[0].keys.device)
    return buffers.load(prompt_cache, repeats, mask)[0]


@torch.no_grad()
def decode_static(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    repeats: int,
    *,
    max_new_tokens: int,
    pick: Callable[[Tensor, Tensor], Tensor],
    eos_ids: list[int],
    pad_id: int,
    stopped: Callable[[Tensor], Tensor] | None = None,
    logprob_temperature: float | None = None,
    compile: str | None = None,
    buffers: StaticBuffers | None = None,
) -> Decoded:
    """:func:`rlvr.rollout.decode.decode` on a static cache (see the module docstring).

    Args:
        compile: None = the step runs eagerly; a ``torch.compile`` backend (``inductor`` on a GPU,
            with CUDA graphs; ``eager`` to check the capture on a CPU). Only without ``buffers``.
        buffers: the cache, mask and step kept between rollouts (:class:`StaticBuffers`, built with its
            own ``compile``); None = new ones of this call's shape, dropped after it.
        The rest: as :func:`~rlvr.rollout.decode.decode`.
    """
    P, L = input_ids.shape
    G, device = repeats, input_ids.device
    B = P * G
    if buffers is None:
        buffers = StaticBuffers(model, compile=compile)
    elif compile is not None and compile != buffers.compile:
        raise ValueError(f"compile={compile!r}, but the buffers compile with {buffers.compile!r}")
    buffers.fit(B, L + max_new_tokens)
    R = buffers.rows  # >= B: rows B.. pad the batch to its fixed size, never live, never recorded
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
    )
    cache, mask = buffers.load(output_cache(out), G, attention_mask)  # mask: [R, capacity]
    logits = out.logits[:, -1].float().repeat_interleave(G, dim=0)  # [B, V]; [R, V] after the first step
    prompt_len = mask[:, :L].sum(-1, keepdim=True)  # [R, 1]: response token t sits at prompt_len + t
    live = torch.arange(R, device=device) < B  # rows still generating
    response = torch.full((R, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(R, max_new_tokens, device=device) if logprob_temperature is not None else None
    stop_at = torch.full((R,), -1, dtype=torch.long, device=device)
    eos = torch.tensor(eos_ids, device=device)
    tokens = torch.full((R,), pad_id, dtype=torch.long, device=device)  # [R]: a finished row steps on padding
    T = 0
    for t in range(max_new_tokens):
        rows = live.nonzero()[:, 0]  # [b]
        picked = pick(logits[rows], rows)  # the live rows only: a row's generator draws as in the dynamic decode
        tokens = torch.full_like(tokens, pad_id).index_copy_(0, rows, picked)
        response[rows, t] = picked
        T = t + 1
        if logprobs is not None:
            logp = torch.log_softmax(logits[rows] / logprob_temperature, dim=-1).gather(-1, picked[:, None])[:, 0]
            logprobs[rows, t] = logp
        done = torch.isin(picked, eos)
        if stopped is not None:
            hit = stopped(response[rows, : t + 1]) & ~done
            stop_at[rows[hit]] = t
            done |= hit
        live[rows[done]] = False
        if t + 1 == max_new_tokens or not live.any():
            break
        mask[:, L + t] = 1
        logits = buffers.step(tokens[:, None], mask, prompt_len + t, cache)
    return Decoded(response[:B, :T], stop_at[:B], None if logprobs is None else logprobs[:B, :T])
