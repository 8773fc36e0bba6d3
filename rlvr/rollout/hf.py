"""Reference rollout engine: batched sampling with Hugging Face ``generate`` (KV cache)."""

from __future__ import annotations

import contextlib
import copy
import hashlib

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rlvr.models.loading import eval_mode
from rlvr.rollout.base import RolloutBatch, cut_at_stop, response_mask_from_eos


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


def sample_seed(*key: int) -> int:
    """A 63-bit seed from a tuple of integers, e.g. ``(seed, step, group, sample)``: the same key gives
    the same seed in every process (unlike ``hash()``), and nearby keys give unrelated seeds."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _SeededSampler:
    """Logits processor that samples each row from its own ``torch.Generator`` (inverse CDF).

    Math: with p = softmax(z / T) after top-k / top-p have set the cut logits to −inf (generate's
    own warper classes, in its order: temperature, top-k, top-p), draw u ~ U[0, 1) from the row's
    generator and take the first token v with CDF(v) > u · CDF(V) (inverse-transform sampling;
    the CDF is a float64 cumsum). The returned scores are 0 at that token and −inf elsewhere, so
    generate, running greedily, takes it.

    Why: with one generator per row, seeded from the row's key, row r's t-th token depends only
    on its own seed and logits, not on which rows share its batch or how many processes split the
    step; ``generate``'s ``torch.multinomial`` draws all rows from the global RNG in batch order.
    The naive equivalent is ``torch.multinomial(p_r, 1, generator=g_r)`` row by row (same
    distribution, other draws). Cost: one uniform per row and token, plus a softmax and cumsum
    over the vocabulary. The generators live on the CPU, so a GPU samples what a CPU samples.
    """

    def __init__(self, seeds: list[int], temperature: float, top_k: int, top_p: float, device=None) -> None:
        self.gens = [torch.Generator().manual_seed(s) for s in seeds]
        self.warpers = [TemperatureLogitsWarper(temperature)]
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)  # [B, V]
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.gens]).to(cdf.device)  # [B]
        # right=True: the first v with CDF(v) > u, which has p_v > 0 (a cut token never gets picked)
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=scores.shape[1] - 1)  # [B, 1]
        return torch.full_like(scores, float("-inf")).scatter_(1, picked, 0.0)


class StopStrings(StoppingCriteria):
    """Stops a row once its decoded response contains a stop string; records where.

    Each step decodes only the last few tokens of every row (enough to hold the longest stop
    string), so the check costs microseconds and sees text as the rewards see it, whatever the
    tokenizer (transformers' ``StopStringCriteria`` needs a vocabulary it can clean, which some
    tokenizers do not allow). ``at`` holds, per row, the response index of the token that completed
    the first stop string, -1 where none did; ``generate`` pads a stopped row after it.
    """

    def __init__(self, tokenizer, stop: list[str], prompt_len: int, rows: int, device) -> None:
        self.tokenizer, self.stop, self.prompt_len = tokenizer, list(stop), prompt_len
        self.window = max(len(s) for s in self.stop) + 4  # tokens; every real token is >= 1 character
        self.at = torch.full((rows,), -1, dtype=torch.long, device=device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        length = input_ids.shape[1]
        tails = self.tokenizer.batch_decode(input_ids[:, max(self.prompt_len, length - self.window) :], skip_special_tokens=True)
        hit = torch.tensor([any(s in t for s in self.stop) for t in tails], device=self.at.device)
        latest = length - self.prompt_len - 1  # response index of the newest token
        self.at = torch.where((self.at < 0) & hit, torch.full_like(self.at, latest), self.at)
        return hit


@contextlib.contextmanager
def own_generation_settings(model):
    """Generate with rlvr's settings alone.

    transformers fills every unset field of the ``GenerationConfig`` passed to ``generate`` from
    ``model.generation_config`` (the checkpoint's ``generation_config.json``): a shipped
    ``repetition_penalty``, ``top_p``, ``top_k``, ``min_p``, ``no_repeat_ngram_size``, suppressed
    tokens, even ``temperature`` and ``do_sample``. The trainer's log-probs assume plain
    softmax(z / T), so while rlvr generates, the model's own defaults are swapped for the library's
    neutral ones; the checkpoint's file is left as it was.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


class HFRolloutEngine:
    """Samples G completions per prompt with ``model.generate``.

    With ``dtype="bfloat16"`` and a float32 policy, generation runs on a bf16 copy that
    :meth:`sync_weights` refreshes from the policy before each rollout (the trainer calls it);
    with the policy's own dtype the engine shares the policy's weights and syncing is a no-op.
    With ``logprobs=True`` sampled batches carry the engine's own log-probs of the sampled
    tokens (``RolloutBatch.logprobs``: full softmax at the temperature, before top-k/top-p, as
    vLLM reports them), for truncated importance sampling.

    Sampling is exactly softmax(logits / temperature), then top-k / top-p if set: nothing from the
    checkpoint's ``generation_config.json`` applies (:func:`own_generation_settings`). With
    ``stop`` strings, a response ends after the token that completes the first one (vLLM's
    ``stop``, included in the text), as the EOS token ends it otherwise. A token can complete a
    stop string and carry more text (``></`` after ``</answer``): it is trained on, since it was
    sampled, but the text the rewards see ends with the stop string, as vLLM cuts it.
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
        dtype: str = "float32",
        batch_seqs: int = 64,
        logprobs: bool = False,
        stop: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.logprobs = logprobs
        self.stop = list(stop)
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
            top_k=top_k,  # 0 = off; left unset, transformers would apply its default of 50
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
        seeds: list[int] | None = None,
    ) -> RolloutBatch:
        """Sample ``samples_per_prompt`` completions for each prompt text.

        Args:
            greedy: decode greedily (argmax) instead of sampling, e.g. for evaluation.
            seeds: one seed per sampled sequence (``len(prompts) * samples_per_prompt``, grouped
                by prompt): each sequence draws from its own generator (:class:`_SeededSampler`),
                so what it samples does not depend on the batch it is in. Default: the global
                torch RNG (``generate``'s own sampling).
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
        seeded = seeds is not None and not greedy
        if seeded:
            if len(seeds) != len(texts):
                raise ValueError(f"{len(seeds)} seeds for {len(texts)} sequences")
            sampling = gen_config
            gen_config = copy.deepcopy(gen_config)  # argmax over the seeded sampler's noisy scores
            gen_config.do_sample, gen_config.temperature, gen_config.top_p, gen_config.top_k = False, None, None, None
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        prompt_len = enc.input_ids.shape[1]
        chunks, lp_chunks, stop_at = [], [], []
        record = self.logprobs and not greedy
        for start in range(0, len(texts), self.batch_seqs):
            rows = slice(start, start + self.batch_seqs)
            recorder = _SampledLogprobs(sampling.temperature if seeded else gen_config.temperature) if record else None
            processors = [recorder] if record else []
            if seeded:  # after the recorder, which must see the raw logits
                processors.append(_SeededSampler(seeds[rows], sampling.temperature, sampling.top_k, sampling.top_p))
            n = enc.input_ids[rows].shape[0]
            stopper = StopStrings(tok, self.stop, prompt_len, n, device) if self.stop else None
            with eval_mode(self.model), own_generation_settings(self.model):
                out = self.model.generate(
                    input_ids=enc.input_ids[rows],
                    attention_mask=enc.attention_mask[rows],
                    generation_config=gen_config,
                    logits_processor=processors or None,
                    stopping_criteria=StoppingCriteriaList([stopper]) if stopper else None,
                )
            chunks.append(out[:, prompt_len:])
            stop_at.append(stopper.at if stopper else torch.full((n,), -1, dtype=torch.long, device=device))
            if record:
                lp_chunks.append(recorder.finish(chunks[-1]))
        T = max(c.shape[1] for c in chunks)
        pad = tok.pad_token_id
        response = torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=pad) for c in chunks])
        response_mask, truncated = response_mask_from_eos(response, self.eos_ids, stop_at=torch.cat(stop_at))
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
            texts=[cut_at_stop(t, self.stop) for t in tok.batch_decode(response, skip_special_tokens=True)],
            truncated=truncated,
            group_size=samples_per_prompt,
            logprobs=logprobs,
        )
