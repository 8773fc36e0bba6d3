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

The compiled step is built once per (model, shape) and process (:func:`compiled_step`): the cache
length is rounded up to :data:`CACHE_MULTIPLE` so that few shapes occur. The policy's weights are
updated in place (the optimizer, ``HFRolloutEngine.sync_weights``'s ``load_state_dict``), so the
captured graphs read the new weights after each step.

The plain implementation it must equal is the dynamic decode: greedy output token for token and
seeded samples draw for draw (``tests/rollout/test_static_decode.py``, on the CPU, where the step
runs eagerly or under ``torch.compile``'s eager backend).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from transformers import StaticCache

from rlvr.models.forward import cache_kwargs, output_cache
from rlvr.rollout.decode import Decoded

CACHE_MULTIPLE = 64
"""The static cache's length is prompt + response rounded up to this: fewer shapes, fewer compiles."""

_COMPILED: dict[tuple, Callable] = {}


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


def compiled_step(model, key: tuple, backend: str = "inductor", mode: str | None = "reduce-overhead") -> Callable:
    """The decode step of ``model`` under ``torch.compile`` (``reduce-overhead``: CUDA graphs), built once
    per ``key`` (the model and the step's shapes) in this process."""
    full = (id(model), backend, mode, *key)
    if full not in _COMPILED:
        _COMPILED[full] = torch.compile(
            _step_fn(model), backend=backend, mode=mode if backend == "inductor" else None, dynamic=False
        )
    return _COMPILED[full]


def static_cache(model, prompt_cache, repeats: int, capacity: int) -> StaticCache:
    """A ``StaticCache`` of ``capacity`` positions for P·``repeats`` rows, holding each of the P
    prompts' keys and values (``prompt_cache``, the prefill's) in its ``repeats`` rows."""
    cache = StaticCache(config=model.config, max_cache_len=capacity)
    if len(cache.layers) != len(prompt_cache.layers):
        raise ValueError(f"the static cache has {len(cache.layers)} layers, the prefill's {len(prompt_cache.layers)}")
    for layer, src in zip(cache.layers, prompt_cache.layers):
        keys, values = src.keys.repeat_interleave(repeats, 0), src.values.repeat_interleave(repeats, 0)
        layer.lazy_initialization(keys, values)  # allocates [rows, heads, capacity, head_dim]
        n = keys.shape[2]
        layer.keys[:, :, :n] = keys
        layer.values[:, :, :n] = values
        layer.cumulative_length.fill_(n)
    return cache


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
) -> Decoded:
    """:func:`rlvr.rollout.decode.decode` on a static cache (see the module docstring).

    Args:
        compile: None = the step runs eagerly; a ``torch.compile`` backend (``inductor`` on a GPU,
            with CUDA graphs; ``eager`` to check the capture on a CPU) = the step compiled once per shape.
        The rest: as :func:`~rlvr.rollout.decode.decode`.
    """
    P, L = input_ids.shape
    G, device = repeats, input_ids.device
    B = P * G
    capacity = -(-(L + max_new_tokens) // CACHE_MULTIPLE) * CACHE_MULTIPLE
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
    )
    cache = static_cache(model, output_cache(out), G, capacity)
    logits = out.logits[:, -1].float().repeat_interleave(G, dim=0)  # [B, V]
    mask = torch.zeros(B, capacity, dtype=attention_mask.dtype, device=device)  # [B, capacity]
    mask[:, :L] = attention_mask.repeat_interleave(G, dim=0)
    prompt_len = mask[:, :L].long().sum(-1, keepdim=True)  # [B, 1]: response token t sits at prompt_len + t
    step = compiled_step(model, (B, capacity), backend=compile) if compile else _step_fn(model)
    live = torch.ones(B, dtype=torch.bool, device=device)  # rows still generating
    response = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(B, max_new_tokens, device=device) if logprob_temperature is not None else None
    stop_at = torch.full((B,), -1, dtype=torch.long, device=device)
    eos = torch.tensor(eos_ids, device=device)
    tokens = torch.full((B,), pad_id, dtype=torch.long, device=device)  # [B]: a finished row steps on padding
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
        logits = step(tokens[:, None], mask, prompt_len + t, cache)
    return Decoded(response[:, :T], stop_at, None if logprobs is None else logprobs[:, :T])
