"""The one forward pass the trainer runs on sampled sequences."""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from torch import Tensor


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for a causal LM's forward: transformers 5.24 renamed ``past_key_values`` to
    ``cache`` (the old name still works until 5.40, with a FutureWarning on every call); older
    releases know only ``past_key_values``. The name is read off the model's own signature."""
    return {_cache_name(type(_base_model(model))): cache}


def output_cache(out):
    """The KV cache of a forward pass's output: ``out.cache`` from 5.24 on (``out.past_key_values``
    then warns), ``out.past_key_values`` before."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _base_model(model):
    """The transformers model under a peft wrapper (whose forward takes ``**kwargs``)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


@functools.cache
def _cache_name(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _positions(attention_mask: Tensor) -> Tensor:
    """Position ids as ``generate`` assigns them with left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(
    model, input_ids: Tensor, attention_mask: Tensor, num_response_tokens: int, *, group_size: int = 1
) -> Tensor:
    """Logits that predict the last ``num_response_tokens`` tokens of each row.

    Position ids come from the attention mask, as in ``generate`` with left padding, so the
    log-probs match the distribution the tokens were sampled from. Only the response positions
    go through the LM head (``logits_to_keep``).

    With ``group_size=G > 1``, consecutive runs of G rows share one prompt (a GRPO group).
    The prompt then goes through the model once per group and its key/value cache is repeated
    G times for the responses; autograd flows through the repeat, so logits *and gradients*
    equal the plain per-row pass (tests assert it) while the prompt costs 1/G as much.

    Gradient checkpointing (Hugging Face's, on a model in training mode) drops the key/value
    cache inside every checkpointed layer, so the shared pass cannot run under it. With
    gradients on, such a model gets the plain per-row pass instead (exact; the prompt then
    costs G times, as without sharing). Under ``no_grad`` nothing is saved for backward, so
    checkpointing is switched off for the call and the prompt is shared.

    Args:
        input_ids: [B, L] left-padded prompt + response.
        attention_mask: [B, L].
        num_response_tokens: T.
        group_size: rows per shared prompt; B must be a multiple of it.

    Returns:
        [B, T, V] logits; ``[:, t]`` predicts ``input_ids[:, L - T + t]``.
    """
    T = num_response_tokens
    positions = _positions(attention_mask)
    checkpointed = _checkpointed_modules(model) if group_size > 1 else []
    if checkpointed and torch.is_grad_enabled():
        group_size = 1  # the checkpointed layers would drop the prompt's cache (see docstring)
    L = input_ids.shape[1]
    if group_size == 1 or L - T < 2:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            logits_to_keep=_keep(L - T - 1, L - 1, input_ids.device),
            use_cache=False,
        )
        return out.logits  # [B, T, V]: positions L-T-1 .. L-2 predict the response
    with checkpointing_off(model):
        return _shared_prompt_logits(model, input_ids, attention_mask, positions, T, group_size)


def _keep(start: int, stop: int, device) -> Tensor:
    """``logits_to_keep`` as the positions [start, stop): the LM head runs on exactly those, and the
    logits come out contiguous (an int keeps the last n, and the causal shift then slices them)."""
    return torch.arange(start, stop, device=device)


def _shared_prompt_logits(
    model, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, T: int, G: int
) -> Tensor:
    """The ``group_size > 1`` branch of :func:`response_logits`: the prompt once per group.

    The shared pass covers the prompt but its last token; the per-row pass runs that token and the
    response, so its T logits are the ones needed, in one contiguous [B, T, V] tensor (the last
    prompt token, which predicts response token 0, costs G times instead of once: 1 of the
    prompt's tokens)."""
    Lp = input_ids.shape[1] - T - 1
    prompt = model(
        input_ids=input_ids[::G, :Lp],
        attention_mask=attention_mask[::G, :Lp],
        position_ids=positions[::G, :Lp],
        logits_to_keep=1,
        use_cache=True,
    )
    cache = output_cache(prompt)
    cache.batch_repeat_interleave(G)  # [P, ...] -> [P*G, ...] per layer, differentiable
    out = model(
        input_ids=input_ids[:, Lp:],
        attention_mask=attention_mask,
        position_ids=positions[:, Lp:],
        **cache_kwargs(model, cache),
        logits_to_keep=_keep(0, T, input_ids.device),
        use_cache=True,
    )
    return out.logits  # [B, T, V]


def _checkpointed_modules(model) -> list:
    """Modules that checkpoint now: Hugging Face's flag (set by ``*_checkpointing_enable``) on, training mode."""
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and m.training]


@contextlib.contextmanager
def checkpointing_off(model):
    """Switch Hugging Face gradient checkpointing off for a block, for no-grad passes that need the cache.

    A checkpointed layer in training mode drops the key/value cache: a shared-prompt pass
    loses the prompt, and ``generate`` silently decodes each new token without its context.
    Under ``no_grad`` checkpointing saves nothing, so switching it off costs no memory.
    """
    modules = _checkpointed_modules(model)
    for m in modules:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in modules:
            m.gradient_checkpointing = True


def shared_prompt_group(micro_batch_seqs: int, samples_per_prompt: int) -> int:
    """Rows per shared prompt inside a micro-batch that starts at a multiple of its size."""
    if micro_batch_seqs % samples_per_prompt == 0:
        return samples_per_prompt
    if samples_per_prompt % micro_batch_seqs == 0:
        return micro_batch_seqs
    return 1
