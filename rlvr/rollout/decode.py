"""Batched decoding for rollouts: each prompt prefilled once for its G samples, finished rows dropped.

:func:`decode` is what ``model.generate`` does for one batch of a rollout (left-padded prompts,
a KV cache, one token per row per step, stop at EOS), minus two wastes that matter on a CPU:

- **Shared prefill.** The G samples of a prompt start from the same prompt, so its KV cache is
  computed once on P prompts and repeated G times (``DynamicCache.batch_repeat_interleave``)
  instead of on P·G identical rows: G times less prefill compute.
- **Finished rows leave the batch.** A row that produced EOS or a stop string is dropped from the
  batch and its KV cache (``DynamicCache.batch_select_indices``); ``generate`` keeps computing
  every row until the last one ends (and pads the finished ones).
- **The KV cache is reserved once.** After the prefill every layer's keys and values move into
  buffers with room for the whole response (:class:`ReservedLayer`); each step writes its one new
  position in place. ``DynamicCache`` concatenates instead, copying the whole cache of every layer
  at every step (O(T^2) bytes over a response: 18 % of the quickstart's decode time in a profile).

With a :class:`~rlvr.cpu.lean.LeanDecoder` (float32 Llama / Qwen2 models on packed CPU weights),
the decode steps run through it on its own cache, which keeps each prompt's keys and values once.

The plain implementation it must equal is ``model.generate`` on the P·G repeated prompts with the
same token picker as a logits processor (``tests/rollout/test_decode.py`` checks tokens, stop
positions and log-probs against it). A row's logits do not depend on which other rows share its
batch (up to float rounding of the matmuls), and each picker draws a row's t-th token from that
row's own logits (:class:`SeededPicker`: at counter_uniform(the row's seed, t)), so the same
completions come out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer

from rlvr.algos import entropy_from_logits
from rlvr.models.forward import cache_kwargs, output_cache
from rlvr.rollout.sampling import counter_uniform, draw, warpers
from rlvr.rollout.sampling import inverse_cdf as inverse_cdf  # re-exported: callers import it from here


class GreedyPicker:
    """The most likely token of each row."""

    def __call__(self, logits: Tensor, rows: Tensor) -> Tensor:
        return logits.argmax(-1)


class SeededPicker:
    """Samples each row by inverse CDF at a counter-based uniform keyed by (the row's seed, the position).

    Math: with p = softmax(z / T) after top-k / top-p have set the cut logits to −inf, the t-th
    draw of row r is u = counter_uniform(seed_r, t) (:func:`~rlvr.rollout.sampling.counter_uniform`),
    and the token is the first v with CDF(v) > u · CDF(V) (inverse-transform sampling,
    :func:`~rlvr.rollout.sampling.inverse_cdf`). The naive equivalent is
    ``torch.multinomial(p_r, 1)`` row by row (same distribution, other draws).

    Why: u depends only on the row's seed and the response position, so sequence r's t-th token
    depends only on its own seed and logits, not on which rows share its batch, whether finished
    rows were dropped, how many processes split the step, or the device the draw is computed on.
    The rule is pure integer arithmetic on tensors, so a static decoder computes the same draws
    inside a captured CUDA graph (:meth:`uniform` and :func:`~rlvr.rollout.sampling.draw`).

    How: every decoder calls the picker once per decode position with all its live rows, position
    0 first; the picker counts its calls in :attr:`position` (so one picker serves one decode).
    ``rows`` index :attr:`seeds`. A decoder that samples by itself draws, for position t,
    ``draw(logits, picker.uniform(rows, t), picker.temperature, picker.top_k, picker.top_p,
    picker.BLOCK)``: the tokens the picker returns.

    With ``kernel`` (the compiled decode kernels, :mod:`rlvr.cpu.kernels`) and no top-k / top-p,
    the temperature, the weights, both levels of sums and the search run in one compiled call
    (``lean_pick``) on float32 CPU logits, several times faster than in torch operations
    (``benchmarks/NOTES.md``). Its exp is within 2 ulp of torch's, so a draw within rounding of a CDF step could pick
    the neighbour (``tests/cpu/test_lean.py`` finds none in 30,000 draws).

    Args:
        seeds: one seed in [0, 2^63) per sequence of the batch (row ``r`` is sequence ``r``).
        kernel: a :class:`~rlvr.cpu.kernels.DecodeKernels` to pick with, or None.
    """

    BLOCK = 256

    def __init__(
        self, seeds: list[int], temperature: float, top_k: int = 0, top_p: float = 1.0, *, kernel=None, entropy=False
    ) -> None:
        bad = [s for s in seeds if not 0 <= s < 2**63]
        if bad:
            raise ValueError(f"seed {bad[0]} is outside [0, 2^63): make seeds with rlvr.rollout.hf.sample_seed")
        # cpu: the seeds' home copy; uniform() moves them to the rows' device once
        self.seeds = torch.tensor(seeds, dtype=torch.int64)
        """[B] int64, the row seeds the draws are keyed by."""
        self.position = 0
        """The response position of the next call's draws (the number of calls so far)."""
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.kernel = kernel if not top_k and top_p >= 1.0 else None
        self._seeds_on = {self.seeds.device: self.seeds}
        self.want_entropy = entropy
        self.entropy: Tensor | None = None
        """[b] entropy of softmax(logits / temperature) of the last call's rows, where ``entropy`` asked
        for it and the kernel sampled them (its sums are the kernel's own); else None."""

    def uniform(self, rows: Tensor, t: Tensor | int) -> Tensor:
        """[b] float64 on ``rows``' device: counter_uniform(seeds[rows], t), the draws of those rows at
        response position ``t`` (an int, or an int64 device scalar inside a captured step)."""
        if rows.device not in self._seeds_on:
            self._seeds_on[rows.device] = self.seeds.to(rows.device)
        return counter_uniform(self._seeds_on[rows.device][rows], t)

    def __call__(self, logits: Tensor, rows: Tensor) -> Tensor:
        u = self.uniform(rows, self.position)
        self.position += 1
        self.entropy = None
        if self.kernel is not None and logits.device.type == "cpu" and logits.dtype == torch.float32:
            if not self.want_entropy:
                return self.kernel.pick(logits, u, self.temperature, self.BLOCK)
            tokens, self.entropy = self.kernel.pick(logits, u, self.temperature, self.BLOCK, entropy=True)
            return tokens
        return draw(logits, u, self.temperature, self.top_k, self.top_p, self.BLOCK)


class GlobalRNGPicker:
    """Samples from the global torch RNG (``generate``'s ``torch.multinomial``), after the warpers."""

    def __init__(self, temperature: float, top_k: int = 0, top_p: float = 1.0) -> None:
        self.warpers = warpers(temperature, top_k, top_p)

    def __call__(self, logits: Tensor, rows: Tensor) -> Tensor:
        for warp in self.warpers:
            logits = warp(None, logits)
        return torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0]


class ReservedLayer(DynamicLayer):
    """One layer's key/value cache in buffers with room for ``capacity`` positions.

    ``update`` writes the new positions in place and returns views of the filled part, where
    :class:`~transformers.cache_utils.DynamicLayer` concatenates (a copy of the whole layer's cache
    per step). Dropping rows (``batch_select_indices``) moves the kept rows to the front of the
    buffers; the attention sees the same keys and values either way."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        self.k_buf = keys.new_empty(b, h, capacity, d)
        self.v_buf = values.new_empty(b, values.shape[1], capacity, values.shape[3])
        self.k_buf[:, :, :n] = keys
        self.v_buf[:, :, :n] = values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.rows, self.length = b, n
        self._views()

    def _views(self) -> None:
        self.keys = self.k_buf[: self.rows, :, : self.length]
        self.values = self.v_buf[: self.rows, :, : self.length]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        n = key_states.shape[-2]
        if self.length + n > self.k_buf.shape[2]:
            raise ValueError(f"ReservedLayer holds {self.k_buf.shape[2]} positions; {self.length + n} asked for")
        self.k_buf[: self.rows, :, self.length : self.length + n] = key_states
        self.v_buf[: self.rows, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        rows, n = indices.numel(), self.length
        # only the filled positions move (not the reserved rest); advanced indexing copies first: overlap is safe
        self.k_buf[:rows, :, :n] = self.k_buf[indices, :, :n]
        self.v_buf[:rows, :, :n] = self.v_buf[indices, :, :n]
        self.rows = rows
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (a prompt's cache for its G samples): one copy of the
        filled positions into new buffers, where repeating a ``DynamicLayer`` and then reserving it
        copies them twice."""
        rows, length = self.rows, self.length
        for name in ("k_buf", "v_buf"):
            buf = getattr(self, name)
            new = buf.new_empty(rows * repeats, *buf.shape[1:])
            new.view(rows, repeats, *buf.shape[1:])[:, :, :, :length] = buf[:rows, None, :, :length]
            setattr(self, name, new)
        self.rows = rows * repeats
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` positions (``DynamicLayer.crop``'s convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): give a negative number of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        self._views()


def reserve(cache, capacity: int):
    """Moves every layer of a filled ``DynamicCache`` into a :class:`ReservedLayer` of ``capacity`` positions."""
    cache.layers = [ReservedLayer(layer.keys, layer.values, capacity) for layer in cache.layers]
    return cache


@dataclass
class Decoded:
    """What :func:`decode` returns for B = P·G rows (grouped by prompt)."""

    response: Tensor
    """[B, T] generated tokens, ``pad_id`` after a row's end; T = the longest row's length."""
    stop_at: Tensor
    """[B] response index of the token that completed a stop string, -1 where none did."""
    logprobs: Tensor | None
    """[B, T] log-softmax(z / T) of the sampled tokens (full vocabulary, before top-k/top-p), 0 after the end;
    None unless asked."""
    steps: int = 0
    """Decode steps run after the prefill (each a forward of one new token per row in the batch)."""
    row_steps: int = 0
    """Rows computed, summed over those steps: the work done, against the tokens kept (``benchmarks/decode.py``)."""
    entropy: Tensor | None = None
    """[B, T] entropy of softmax(z / T) at each sampled position (full vocabulary, before top-k/top-p), 0 after
    the end; None unless asked."""


@torch.no_grad()
def decode(
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
    entropy_temperature: float | None = None,
    lean=None,
) -> Decoded:
    """Generates ``repeats`` continuations of each of P left-padded prompts.

    Args:
        model: a causal LM (Hugging Face forward with a KV cache and ``logits_to_keep``), in eval mode.
        input_ids: [P, L] left-padded prompt tokens; attention_mask: [P, L] (0 on the padding).
        repeats: G, continuations per prompt; row ``p·G + j`` is prompt p's j-th.
        pick: ``(logits [b, V] float32, rows [b] long) -> tokens [b]``; ``rows`` are the live rows' indices in [0, B).
        eos_ids: tokens that end a row (kept in the response, as ``generate`` keeps them).
        stopped: ``(responses [b, t] so far of the live rows) -> [b] bool``: a stop string completed now.
        logprob_temperature: record log-softmax(z / T) of each picked token (TIS); None = do not.
        entropy_temperature: record the entropy of softmax(z / T) at each step (``train/entropy``,
            ``train.rollout_entropy``): ``pick``'s own where it computed it at this temperature
            (:class:`SeededPicker` on the compiled kernels), else a log-softmax; None = do not.
        lean: a :class:`~rlvr.cpu.lean.LeanDecoder` of ``model`` to run the decode steps with
            (the prefill is the model's own forward); None = the model's forward throughout.

    Returns:
        :class:`Decoded` with B = P·G rows.
    """
    P, G = input_ids.shape[0], repeats
    B, device = P * G, input_ids.device
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
    )
    cache = output_cache(out)
    if lean is not None:
        cache = lean.cache(cache, attention_mask, G, max_new_tokens)
        prompt_len = attention_mask.long().sum(-1).repeat_interleave(G)  # [B]: response token t sits at prompt_len + t
    else:
        reserve(cache, input_ids.shape[1] + max_new_tokens)
        if G > 1:
            cache.batch_repeat_interleave(G)
    logits = out.logits[:, -1].float().repeat_interleave(G, dim=0)  # [B, V]
    mask = attention_mask.repeat_interleave(G, dim=0)  # [b, L + t]: the live rows' attention mask
    live = torch.arange(B, device=device)  # the live rows' indices in [0, B)
    response = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(B, max_new_tokens, device=device) if logprob_temperature is not None else None
    entropy = torch.zeros(B, max_new_tokens, device=device) if entropy_temperature is not None else None
    stop_at = torch.full((B,), -1, dtype=torch.long, device=device)
    eos = torch.tensor(eos_ids, device=device)
    T = steps = row_steps = 0
    for t in range(max_new_tokens):
        tokens = pick(logits, live)  # [b]
        response[live, t] = tokens
        T = t + 1
        if logprobs is not None:
            logprobs[live, t] = torch.log_softmax(logits / logprob_temperature, dim=-1).gather(-1, tokens[:, None])[
                :, 0
            ]
        if entropy is not None:  # the picker's own sums where it computed them at this temperature
            own = getattr(pick, "entropy", None) if getattr(pick, "temperature", None) == entropy_temperature else None
            entropy[live, t] = (
                own if own is not None else entropy_from_logits(logits[None], temperature=entropy_temperature)[0]
            )
        done = torch.isin(tokens, eos)
        if stopped is not None:
            hit = stopped(response[live, : t + 1]) & ~done
            stop_at[live[hit]] = t
            done |= hit
        if t + 1 == max_new_tokens:
            break
        if done.any():
            keep = (~done).nonzero()[:, 0]
            if keep.numel() == 0:
                break
            live, tokens, mask = live[keep], tokens[keep], mask[keep]
            cache.select(keep) if lean is not None else cache.batch_select_indices(keep)
        steps, row_steps = steps + 1, row_steps + tokens.shape[0]
        if lean is not None:
            logits = lean.step(tokens, prompt_len[live] + t, cache)
            continue
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position_ids = mask.long().sum(-1, keepdim=True) - 1  # [b, 1]: the new token's position
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=position_ids,
            **cache_kwargs(model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = output_cache(out)
        logits = out.logits[:, -1].float()
    cut = lambda x: None if x is None else x[:, :T]  # noqa: E731 - the recorded columns
    return Decoded(response[:, :T], stop_at, cut(logprobs), steps, row_steps, cut(entropy))
