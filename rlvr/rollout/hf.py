"""Reference rollout engine: batched sampling with Hugging Face ``generate`` (KV cache)."""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig

from rlvr.models.forward import checkpointing_off
from rlvr.rollout.base import RolloutBatch, response_mask_from_eos


def eos_token_ids(model, tokenizer) -> list[int]:
    """All ids that end a response: the tokenizer's EOS plus the model's generation_config EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


class _SampledLogprobs:
    """Logits processor that records log p(sampled token) at the sampling temperature.

    Custom processors run before generate's temperature/top-k/top-p warpers, so it sees the
    raw float32 logits of step t; the token sampled from them only appears at step t+1 (or in
    the final sequences), so one [B, V] row of log-probs is kept between calls.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.last: torch.Tensor | None = None  # [B, V] log-probs of the latest step
        self.picked: list[torch.Tensor] = []  # T x [B]

    def _take(self, tokens: torch.Tensor) -> None:
        if self.last is not None:
            self.picked.append(self.last.gather(-1, tokens[:, None])[:, 0])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, response: torch.Tensor) -> torch.Tensor:
        """[B, T] log-probs of ``response`` (the generated tokens)."""
        self._take(response[:, -1])
        return torch.stack(self.picked, dim=1)


class HFRolloutEngine:
    """Samples G completions per prompt with ``model.generate``.

    With ``dtype="bfloat16"`` and a float32 policy, generation runs on a bf16 copy that
    :meth:`sync_weights` refreshes from the policy before each rollout (the trainer calls it);
    with the policy's own dtype the engine shares the policy's weights and syncing is a no-op.
    With ``logprobs=True`` sampled batches carry the engine's own log-probs of the sampled
    tokens (``RolloutBatch.logprobs``: full softmax at the temperature, before top-k/top-p, as
    vLLM reports them), for truncated importance sampling.
    """

    def __init__(
        self,
        policy,
        tokenizer,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        dtype: str = "bfloat16",
        batch_seqs: int = 64,
        logprobs: bool = False,
    ) -> None:
        self.logprobs = logprobs
        self.policy = policy
        self.tokenizer = tokenizer
        self.batch_seqs = batch_seqs
        want = getattr(torch, dtype)
        self.model = policy if want == policy.dtype else copy.deepcopy(policy).to(want)
        self.model.eval()
        self.eos_ids = eos_token_ids(policy, tokenizer)
        self.gen_config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=tokenizer.pad_token_id,
            use_cache=True,
        )

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the policy's current weights into the generation copy (no-op when shared)."""
        if self.model is not self.policy:
            self.model.load_state_dict(self.policy.state_dict())

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        samples_per_prompt: int,
        *,
        greedy: bool = False,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
    ) -> RolloutBatch:
        """Sample ``samples_per_prompt`` completions for each prompt text.

        Args:
            greedy: decode greedily (argmax) instead of sampling, e.g. for evaluation.
            temperature: sampling temperature for this call only (default: the engine's).
            max_new_tokens: response length limit for this call only (default: the engine's).

        Returns:
            RolloutBatch with B = len(prompts) * samples_per_prompt rows, grouped by prompt.
        """
        gen_config = self.gen_config
        if greedy or temperature is not None or max_new_tokens is not None:
            gen_config = copy.deepcopy(gen_config)
            if greedy:  # drop the sampling knobs too, or transformers warns they are unused
                gen_config.do_sample, gen_config.temperature, gen_config.top_p, gen_config.top_k = False, None, None, None
            elif temperature is not None:
                gen_config.temperature = temperature
            if max_new_tokens is not None:
                gen_config.max_new_tokens = max_new_tokens
        tok = self.tokenizer
        device = next(self.model.parameters()).device
        texts = [p for p in prompts for _ in range(samples_per_prompt)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        prompt_len = enc.input_ids.shape[1]
        chunks, lp_chunks = [], []
        record = self.logprobs and not greedy
        for start in range(0, len(texts), self.batch_seqs):
            rows = slice(start, start + self.batch_seqs)
            recorder = _SampledLogprobs(gen_config.temperature) if record else None
            with checkpointing_off(self.model):  # a policy left in training mode would drop the cache
                out = self.model.generate(
                    input_ids=enc.input_ids[rows],
                    attention_mask=enc.attention_mask[rows],
                    generation_config=gen_config,
                    logits_processor=[recorder] if record else None,
                )
            chunks.append(out[:, prompt_len:])
            if record:
                lp_chunks.append(recorder.finish(chunks[-1]))
        T = max(c.shape[1] for c in chunks)
        pad = tok.pad_token_id
        response = torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=pad) for c in chunks])
        response_mask, truncated = response_mask_from_eos(response, self.eos_ids)
        response = torch.where(response_mask.bool(), response, torch.full_like(response, pad))
        logprobs = None
        if record:
            logprobs = torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1])) for c in lp_chunks])
            logprobs = torch.where(response_mask.bool(), logprobs, torch.zeros_like(logprobs))
        return RolloutBatch(
            input_ids=torch.cat([enc.input_ids, response], dim=1),
            attention_mask=torch.cat([enc.attention_mask, response_mask], dim=1),
            response_mask=response_mask,
            prompt_len=prompt_len,
            texts=tok.batch_decode(response, skip_special_tokens=True),
            truncated=truncated,
            group_size=samples_per_prompt,
            logprobs=logprobs,
        )
