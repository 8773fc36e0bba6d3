"""The roofline floor of a GRPO step: FLOPs and bytes of each phase, from the model's config.json
shape alone, and the least time a machine with a given matmul rate and memory bandwidth needs.

For each phase, floor = max(FLOPs / matmul rate, bytes / bandwidth); phases run one after the
other, so their floors add. Measured time / floor says how far a phase is from what the hardware
allows (``benchmarks/roofline.py`` measures the rates and compares a run's phase times).

What is counted, per step (B sequences, Lp prompt tokens, T response tokens per sequence on
average, S decode steps = the longest response):

- **prefill** (rollout): each prompt once for the ``prompt_share`` sequences that start from it
  (rlvr's engine: G, the floor of the work; ``generate`` repeats the prompt for each of the G
  samples: 1): B/share·Lp tokens through every projection, causal attention over the prompt, the
  LM head on the last position only (it samples the first response token). The weights stream
  once; the prompt's key/values are written.
- **decode** (rollout): T − 1 more single-token passes per sequence; the k-th (k = 1 … T−1)
  attends to Lp + k positions and reads their key/values. The batch decodes in lockstep, so
  the weights stream once per decode step, S − 1 times.
- **forward** (reference or old log-probs, no grad): the prompt once per ``prompt_share``
  sequences (rlvr's shared-prompt forward; 1 = once per sequence), every response token, the LM
  head on the T positions that predict response tokens; the weights stream once per micro-batch.
- **update**: forward + backward = 3 × the forward's FLOPs; per micro-batch the weights stream
  twice (forward, backward) and the gradient is read and written; then AdamW reads parameters,
  gradients and both moments and writes parameters and moments (7 values per trained parameter).

FLOPs: 2 per multiply-add of each projection (q, k, v, o, gate, up, down) and of the LM head;
attention 4 · heads · head_dim per (query, key) pair (QKᵀ and AV); norms, activations, softmax,
rotary and the embedding lookup are left out (under 1 % for the built-in model). Bytes: weights
(in the phase's dtype; the update reads the master weights), the KV cache, gradients and AdamW
state; activations are assumed to stay in cache. So this is a lower bound, not an estimate.
Response lengths may be means (floats). LoRA is not modelled (full fine-tuning is counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlvr.estimate import ModelShape

ADAMW_VALUES = 7
"""Values AdamW moves per trained parameter: reads parameter, gradient, two moments; writes parameter, two moments."""


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes moved by one phase."""

    flops: float
    bytes: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, k: float) -> Cost:
        return Cost(self.flops * k, self.bytes * k)


@dataclass(frozen=True)
class Rates:
    """What the machine sustains: matmul FLOP/s in the phase's precision and memory bytes/s."""

    flops_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class Floor:
    """Least time of a phase (or of phases run one after the other: each term adds).

    Attributes:
        compute_s: FLOPs / matmul rate.
        memory_s: bytes / bandwidth.
        seconds: the floor, max(compute_s, memory_s) of each phase, summed over phases.
    """

    compute_s: float
    memory_s: float
    seconds: float

    @property
    def bound(self) -> str:
        """``compute`` or ``memory``: the larger term (for a sum of phases, of the sums)."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def __add__(self, other: Floor) -> Floor:
        return Floor(self.compute_s + other.compute_s, self.memory_s + other.memory_s, self.seconds + other.seconds)


def floor(cost: Cost, rates: Rates) -> Floor:
    """The floor of one phase: max(FLOPs / rate, bytes / bandwidth)."""
    compute, memory = cost.flops / rates.flops_per_s, cost.bytes / rates.bytes_per_s
    return Floor(compute, memory, max(compute, memory))


def layer_matmul_params(shape: ModelShape) -> int:
    """Weights of every layer's projections: each token multiplies by all of them once."""
    return shape.num_hidden_layers * sum(i * o for i, o in shape.linear_shapes().values())


def head_params(shape: ModelShape) -> int:
    """The LM head's hidden × vocab weights (the embedding matrix when tied)."""
    return shape.hidden_size * shape.vocab_size


def streamed_params(shape: ModelShape) -> int:
    """Parameters one pass over the model reads: all of them, less an untied embedding matrix
    (its lookup reads only the rows of the tokens in the batch)."""
    return shape.num_params() - (0 if shape.tie_word_embeddings else head_params(shape))


def attention_flops(shape: ModelShape, pairs: float) -> float:
    """FLOPs of QKᵀ and AV over ``pairs`` (query, key) pairs, all layers: 4 · heads · head_dim each."""
    return 4 * shape.num_attention_heads * shape.dim * shape.num_hidden_layers * pairs


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: float) -> float:
    """Key + value bytes one token holds in the cache, all layers."""
    return 2 * shape.num_hidden_layers * shape.kv_dim * dtype_bytes


def causal_pairs(tokens: float) -> float:
    """(query, key) pairs of causal attention over ``tokens`` positions: 1 + 2 + … + n."""
    return tokens * (tokens + 1) / 2


def prefill_cost(
    shape: ModelShape, *, sequences: int, prompt_tokens: float, dtype_bytes: float = 4, prompt_share: int = 1
) -> Cost:
    """The rollout's prompt pass (see the module docstring).

    Args:
        sequences: B, rows generated together.
        prompt_tokens: Lp.
        dtype_bytes: bytes per weight and per cached key/value element of the generating model.
        prompt_share: sequences that start from one prompt pass (G when the prompt is prefilled
            once for its group, 1 when every row runs its own copy).
    """
    prompts = sequences / prompt_share
    tokens = prompts * prompt_tokens
    flops = (
        2 * layer_matmul_params(shape) * tokens
        + 2 * head_params(shape) * prompts  # logits of the last prompt position only
        + attention_flops(shape, prompts * causal_pairs(prompt_tokens))
    )
    memory = streamed_params(shape) * dtype_bytes + tokens * kv_bytes_per_token(shape, dtype_bytes)
    return Cost(flops, memory)


def decode_cost(
    shape: ModelShape,
    *,
    sequences: int,
    prompt_tokens: float,
    response_tokens: float,
    decode_steps: float | None = None,
    dtype_bytes: float = 4,
) -> Cost:
    """The rollout's token-by-token passes after the prefill (see the module docstring).

    Args:
        sequences: B.
        prompt_tokens: Lp.
        response_tokens: T, response tokens per sequence (the mean; the prefill sampled the first).
        decode_steps: S, the longest response (the batch runs S − 1 decode passes); default ceil(T).
        dtype_bytes: bytes per weight and per cached key/value element.
    """
    T = response_tokens
    S = math.ceil(T) if decode_steps is None else decode_steps
    passes = max(T - 1, 0)  # per sequence
    pairs = sequences * (passes * prompt_tokens + causal_pairs(passes))  # pass k attends to Lp + k positions
    flops = 2 * (layer_matmul_params(shape) + head_params(shape)) * sequences * passes + attention_flops(shape, pairs)
    memory = max(S - 1, 0) * streamed_params(shape) * dtype_bytes + pairs * kv_bytes_per_token(shape, dtype_bytes)
    return Cost(flops, memory)


def forward_cost(
    shape: ModelShape,
    *,
    sequences: int,
    prompt_tokens: float,
    response_tokens: float,
    prompt_share: int = 1,
    micro_batches: int = 1,
    param_bytes: float = 4,
) -> Cost:
    """One no-grad pass over the step's sequences for their response log-probs (reference or old policy).

    Args:
        sequences: B.
        prompt_tokens: Lp.
        response_tokens: T per sequence (mean).
        prompt_share: sequences that share one prompt pass (rlvr's shared-prompt forward: G, or
            the micro-batch when it is smaller); 1 = every sequence runs its own prompt.
        micro_batches: passes the batch is split into; each streams the weights.
        param_bytes: bytes per weight read.
    """
    prompts = sequences / prompt_share
    T = response_tokens
    tokens = prompts * prompt_tokens + sequences * T
    pairs = prompts * causal_pairs(prompt_tokens) + sequences * (T * prompt_tokens + causal_pairs(T))
    flops = (
        2 * layer_matmul_params(shape) * tokens
        + 2 * head_params(shape) * sequences * T  # logits of the positions that predict response tokens
        + attention_flops(shape, pairs)
    )
    return Cost(flops, micro_batches * streamed_params(shape) * param_bytes)


def update_cost(
    shape: ModelShape,
    *,
    sequences: int,
    prompt_tokens: float,
    response_tokens: float,
    prompt_share: int = 1,
    micro_batches: int = 1,
    param_bytes: float = 4,
    trained_params: int | None = None,
    forward_only: float = 0.0,
    forward_only_pass: bool = True,
) -> Cost:
    """One optimizer step over the batch: forward + backward of every micro-batch, then AdamW.

    Args: as :func:`forward_cost`, plus
        trained_params: parameters AdamW updates (default all: full fine-tuning).
        forward_only: the fraction of the sequences that run a forward only (rlvr's
            ``train.zero_adv_forward_only``): their FLOPs are a forward's, not three times it.
        forward_only_pass: False where those sequences run no pass at all (their statistics from
            the rollout, rlvr's ``train.rollout_entropy``): no FLOPs.
    """
    trained = shape.num_params() if trained_params is None else trained_params
    fwd = forward_cost(
        shape,
        sequences=sequences * (1 - forward_only),
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        prompt_share=prompt_share,
        micro_batches=micro_batches,
        param_bytes=param_bytes,
    )
    per_micro_batch = (2 * streamed_params(shape) + 2 * trained) * param_bytes  # weights twice; gradient read + write
    memory = micro_batches * per_micro_batch + ADAMW_VALUES * trained * param_bytes
    if not forward_only or not forward_only_pass:
        return Cost(3 * fwd.flops, memory)
    frozen = forward_cost(
        shape,
        sequences=sequences * forward_only,
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        prompt_share=prompt_share,
    )
    return Cost(3 * fwd.flops + frozen.flops, memory)


def rollout_floor(
    shape: ModelShape,
    rates: Rates,
    *,
    sequences: int,
    prompt_tokens: float,
    response_tokens: float,
    decode_steps: float | None = None,
    dtype_bytes: float = 4,
    prompt_share: int = 1,
) -> Floor:
    """The rollout's floor, prefill + decode, for a batch of ``sequences`` (arguments as in
    :func:`prefill_cost` and :func:`decode_cost`); ``.seconds`` / measured rollout time is the
    fraction of this machine's roofline that generation reaches."""
    prefill = prefill_cost(
        shape, sequences=sequences, prompt_tokens=prompt_tokens, dtype_bytes=dtype_bytes, prompt_share=prompt_share
    )
    decode = decode_cost(
        shape,
        sequences=sequences,
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        decode_steps=decode_steps,
        dtype_bytes=dtype_bytes,
    )
    return floor(prefill, rates) + floor(decode, rates)
