"""The Hugging Face rollout engine: batched sampling on a ``transformers`` model with a KV cache
(:mod:`rlvr.rollout.decode`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys

import torch
from transformers import GenerationConfig, StoppingCriteria

from rlvr.cpu import LeanDecoder, PackedLinears, lean_unsupported, why_unpackable
from rlvr.errors import failure_line
from rlvr.models.loading import cast_copy, eval_mode, gather_parameters
from rlvr.rollout.base import RolloutBatch, cut_at_stop, response_mask_from_eos
from rlvr.rollout.decode import GlobalRNGPicker, GreedyPicker, SeededPicker, decode
from rlvr.rollout.sampling import sample_seed as sample_seed  # re-exported: callers import it from here
from rlvr.rollout.static import Sampler, StaticDecoder
from rlvr.tools import Toolbox


def eos_token_ids(model, tokenizer) -> list[int]:
    """All ids that end a response: the tokenizer's EOS plus the model's generation_config EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


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
        self.can_end = _can_end(tokenizer, tuple(self.stop))
        """[V] bool: the tokens whose text can hold a stop string's last character (see :func:`_can_end`)."""
        self.decoded_rows = 0
        """Rows decoded so far: the host's work, which the token check keeps to the candidates."""

    def hits(self, responses: torch.Tensor) -> torch.Tensor:
        """[b] bool: a stop string appears in the last tokens of each response so far ([b, t] tokens),
        checked as each token arrives: a string a row did not hold before can only end in its newest token,
        so only the rows whose newest token can end one (:attr:`can_end`) are decoded."""
        hit = torch.zeros(responses.shape[0], dtype=torch.bool)  # cpu: host work
        if responses.shape[1] == 0:
            return hit.to(responses.device)
        newest = responses[:, -1].cpu()  # cpu: the host reads the tokens it checks
        rows = torch.nonzero(self.can_end[newest.clamp(0, self.can_end.shape[0] - 1)]).flatten().tolist()
        if rows:
            self.decoded_rows += len(rows)
            tails = self.tokenizer.batch_decode(responses[rows, -self.window :], skip_special_tokens=True)
            for r, t in zip(rows, tails):
                hit[r] = any(s in t for s in self.stop)
        return hit.to(responses.device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        length = input_ids.shape[1]
        hit = self.hits(input_ids[:, self.prompt_len :]).to(self.at.device)
        latest = length - self.prompt_len - 1  # response index of the newest token
        self.at = torch.where((self.at < 0) & hit, torch.full_like(self.at, latest), self.at)
        return hit


@functools.lru_cache(maxsize=16)
def _can_end(tokenizer, stop: tuple[str, ...]) -> torch.Tensor:
    """[V] bool over the tokenizer's ids: True where the token's own text holds the last character of a
    stop string, or where its text alone is not its text in context (empty, a special token, a piece of a
    UTF-8 character, a SentencePiece word start): a stop string that newly appears ends in the newest
    token, so a token False here cannot complete one. Computed once per tokenizer and stop strings."""
    V = max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0) or 0))
    ends = {s[-1] for s in stop}
    if any(c.isspace() for c in ends):  # a token's leading space may exist in context only: check every row
        return torch.ones(V, dtype=torch.bool)  # cpu: a host table
    texts = tokenizer.batch_decode([[i] for i in range(V)], skip_special_tokens=True)
    out = torch.zeros(V, dtype=torch.bool)  # cpu: a host table
    for i, t in enumerate(texts):
        out[i] = not t or "\ufffd" in t or t != t.strip() or any(c in t for c in ends)
    return out


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


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a rollout samples: softmax(z / temperature), then top-k (0 = off) and top-p (1 = off)."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int


class HFRolloutEngine:
    """Samples G completions per prompt: :func:`rlvr.rollout.decode.decode` on the model, each
    prompt prefilled once for its G samples and finished rows dropped from the batch.

    With ``dtype="bfloat16"`` and a float32 policy, generation runs on a bf16 copy that
    :meth:`sync_weights` refreshes from the policy before each rollout (the trainer calls it);
    with the policy's own dtype the engine shares the policy's weights and syncing is a no-op.
    With ``logprobs=True`` sampled batches carry the engine's own log-probs of the sampled
    tokens (``RolloutBatch.logprobs``: full softmax at the temperature, before top-k/top-p, as
    vLLM reports them), for truncated importance sampling. With ``entropy=True`` they carry the
    entropy of that softmax at each sampled position (``RolloutBatch.entropy``), which the update
    logs as ``train/entropy`` (``train.rollout_entropy``); tool rollouts do not record it.

    Sampling is exactly softmax(logits / temperature), then top-k / top-p if set: nothing from the
    checkpoint's ``generation_config.json`` applies. With
    ``stop`` strings, a response ends after the token that completes the first one (vLLM's
    ``stop``, included in the text), as the EOS token ends it otherwise. A token can complete a
    stop string and carry more text (``></`` after ``</answer``): it is trained on, since it was
    sampled, but the text the rewards see ends with the stop string, as vLLM cuts it.

    ``packed_weights`` (None = wherever it applies: a float32 or bfloat16 model on a CPU where
    oneDNN packs that dtype, :func:`~rlvr.cpu.packed.why_unpackable`, else unpacked with the
    reason in :attr:`unpacked`; True = required, ValueError where it cannot) multiplies by oneDNN-prepacked
    copies of the linear weights while sampling
    (:mod:`rlvr.cpu`: faster decode products, ``benchmarks/NOTES.md``; one more copy
    of the linear weights in memory, repacked when the policy's weights change).

    ``tools`` (a :class:`~rlvr.tools.Toolbox`) lets a response call tools, and ``environment`` makes each
    sequence an environment's episode: :meth:`generate` then pauses where a turn ends, appends the
    environment's answer and goes on (:mod:`rlvr.rollout.episodes`), through :meth:`generate_ids` and
    whichever decoder the engine uses. Without either nothing changes.

    ``lean_decode`` (None = wherever it applies: a float32 Llama or Qwen2 model with packed weights;
    True = required, :class:`~rlvr.cpu.lean.LeanUnavailable` where it cannot run) runs the decode
    steps by :class:`~rlvr.cpu.lean.LeanDecoder` instead of the model's forward (the prefill stays
    the model's): the same logits up to float rounding, faster sampling (``benchmarks/NOTES.md``).
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
        entropy: bool = False,
        stop: list[str] | tuple[str, ...] = (),
        packed_weights: bool | None = None,
        lean_decode: bool | None = None,
        static_decode: bool | None = None,
        static_capacity: int = 0,
        gathered: bool = False,
        copy=None,
        tools: Toolbox | None = None,
        environment=None,
    ) -> None:
        self.tools = tools  # and the tool loop as the environment
        if environment is not None:
            self.environment = environment
        self.turn_prefix = ""
        """What opens each later assistant turn of an episode, as the prompt's does (``data.assistant_prefix``)."""
        self.logprobs = logprobs
        self.entropy = entropy
        self.stop = list(stop)
        self.policy = policy
        self.tokenizer = tokenizer
        self.batch_seqs = batch_seqs
        want = getattr(torch, dtype)
        self.gathered = gathered
        """The policy is sharded (FSDP): the engine keeps its own whole copy -- ``copy``, already filled
        from the shards, or else a cast copy of the policy before it is sharded -- which
        :meth:`gather_weights` refreshes (a collective) and :meth:`sync_weights` leaves alone."""
        # built in ``want`` directly, one tensor at a time: never a second copy in the policy's dtype
        if copy is None:
            copy = policy if want == policy.dtype and not gathered else cast_copy(policy, want)
        self.model = copy
        self.model.eval()
        self.eos_ids = eos_token_ids(policy, tokenizer)
        self.sampling = Sampling(temperature, top_p, top_k, max_new_tokens)
        self._stop = StopStrings(tokenizer, self.stop, 0, 0, "cpu") if self.stop else None
        why_not = why_unpackable(self.model)
        if packed_weights and why_not:
            raise ValueError(f"packed weights: {why_not}")
        use = why_not is None if packed_weights is None else packed_weights
        self.unpacked = why_not if packed_weights is None and self.model.device.type == "cpu" else None
        """Why packed weights were wanted (auto) but not used on the CPU (one line, for the caller to print);
        else None."""
        self.packed = PackedLinears(self.model, rows_hint=min(batch_seqs, 16)) if use else None
        if lean_decode is True and static_decode is True:
            raise ValueError("lean_decode and static_decode are two decoders: ask for one")
        on_gpu = next(self.model.parameters()).device.type == "cuda"
        self.static = (on_gpu if static_decode is None else static_decode) and lean_decode is not True
        """Decode on a static cache (:mod:`rlvr.rollout.static`), compiled on a GPU; else the dynamic decode."""
        want_lean = lean_decode is True or (
            not self.static and lean_decode is None and not lean_unsupported(self.model, self.packed)
        )
        self.lean = LeanDecoder(self.model, self.packed) if want_lean else None  # raises LeanUnavailable if it cannot
        self.decoder = None
        """The :class:`~rlvr.rollout.static.StaticDecoder` (static decode): one cache for the engine's life."""
        self.static_failure: str | None = None
        """Why the static decode failed, after which the engine decodes dynamically (:meth:`_static_failed`)."""
        if self.static:
            self.decoder = StaticDecoder(
                self.model, compile="inductor" if on_gpu else None, rows=batch_seqs, capacity=static_capacity
            )
        self.last_stats: dict[str, int] = {}
        """The last :meth:`generate`'s work: ``rows``, ``decode_steps`` (forwards after the prefills, all
        chunks), ``row_steps`` (rows computed over those steps) and ``tokens`` (response tokens kept)."""

    def _static_failed(self, e: BaseException) -> None:
        """Leaves the static decode for the dynamic one for the engine's life, in one line (fail soft: the
        compiled step has run on no GPU yet; a compile, recompile-limit or capture failure must not end a
        run that the dynamic decode can carry)."""
        why = failure_line(e)
        print(
            f"warning: the static decode failed ({why}); decoding with the dynamic decode from here on "
            "(rollout.static_decode=false always does)",
            file=sys.stderr,
            flush=True,
        )
        self.static, self.decoder = False, None
        self.static_failure = why

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the policy's current weights into the generation copy (no copy when shared), and
        mark the packed weights stale (repacked at the next :meth:`generate`): all of a copy's; of a
        shared policy, those that require grad (a frozen weight changed in place is still caught by
        its version counter, unless a fused kernel changed it). Call it after every change to the
        policy's weights."""
        if self.gathered:  # every rank refreshes it together after each change (gather_weights)
            return
        if self.model is not self.policy:
            self.model.load_state_dict(self.policy.state_dict())
            if self.packed is not None:
                self.packed.invalidate()
        elif self.packed is not None:  # the weights training changes; frozen ones (LoRA's base) stay packed
            self.packed.invalidate([p for p in self.model.parameters() if p.requires_grad])

    @torch.no_grad()
    def load_weights(self, named: dict) -> None:
        """Weights pushed from another process (a trainer's :meth:`pushed` tensors: every weight that
        training changes) copied into the generation model in place, by name, and the packed copies
        marked stale. A name the model lacks is an error: the two sides built different models."""
        params = dict(self.model.named_parameters())
        missing = sorted(set(named) - set(params))
        if missing:
            raise ValueError(f"pushed weights the rollout model lacks: {missing[:3]} (of {len(missing)})")
        for name, tensor in named.items():
            params[name].copy_(tensor)
        if self.packed is not None:
            self.packed.invalidate()

    def pushed(self, trainable: set[str]) -> dict:
        """The generation model's current weights named in ``trainable`` (what training changes), for
        :meth:`load_weights` elsewhere: in the rollout dtype, so a rollout worker holds what this
        engine samples with, bit for bit. Call after :meth:`sync_weights` (or :meth:`gather_weights`)."""
        return {n: p.detach() for n, p in self.model.named_parameters() if n in trainable}

    @torch.no_grad()
    def gather_weights(self) -> None:
        """A sharded policy's current weights into this engine's whole copy, one parameter at a
        time (``DTensor.full_tensor``, an all-gather: every rank calls it at the same point)."""
        gather_parameters(self.model, self.policy)
        if self.packed is not None:
            self.packed.invalidate()

    @property
    def tools(self) -> Toolbox | None:
        """The tools a response may call (:class:`~rlvr.tools.Toolbox`), or None. Setting them makes the
        tool loop the :attr:`environment` (None: single-turn)."""
        return self._tools

    @tools.setter
    def tools(self, box: Toolbox | None) -> None:
        from rlvr.environments import from_settings

        self._tools = box
        self.environment = from_settings("", toolbox=box)
        """What makes each episode's :class:`~rlvr.environments.Environment` (:func:`rlvr.environments.from_settings`:
        the tool loop, code feedback, a plugin), or None: single-turn rollouts."""

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
        rows: list[dict] | None = None,
    ) -> RolloutBatch:
        """Sample ``samples_per_prompt`` completions for each prompt text.

        With an :attr:`environment` (tools, code with execution feedback, a plugin), each completion is
        an episode: :func:`~rlvr.rollout.episodes.run_episodes` runs the segments (generation pauses where
        a turn ends, the environment answers, its answer is appended, generation goes on).

        Args:
            greedy: decode greedily (argmax) instead of sampling, e.g. for evaluation.
            seeds: one seed per sampled sequence (``len(prompts) * samples_per_prompt``, grouped
                by prompt): a sequence's t-th draw is a function of its seed and t alone
                (:func:`~rlvr.rollout.sampling.counter_uniform`), so what it samples does not depend on
                the batch it is in or the decoder. Default: the global torch RNG (which, for the static
                decode, draws the row seeds).
            temperature: sampling temperature for this call only (default: the engine's).
            max_new_tokens: response length limit for this call only (default: the engine's); with
                tools it counts the model's and the results' tokens together.
            rows: each prompt's data row (``question``, ``answer``, ``fields``), given to each of its
                episodes' :meth:`~rlvr.environments.Environment.reset` (code feedback reads the row's
                tests there); None: every episode is reset with an empty row.

        Returns:
            RolloutBatch with B = len(prompts) * samples_per_prompt rows, grouped by prompt.
        """
        device = next(self.model.parameters()).device
        kw = dict(greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens, seeds=seeds)
        if self.environment is None:
            enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
            return self.generate_ids(enc.input_ids.to(device), enc.attention_mask.to(device), samples_per_prompt, **kw)
        from rlvr.rollout.episodes import chat_turns, run_episodes

        if rows is not None and len(rows) != len(prompts):
            raise ValueError(f"{len(rows)} rows for {len(prompts)} prompts")
        envs, prompts = [], list(prompts)
        for p in range(len(prompts)):
            for _ in range(samples_per_prompt):
                env = self.environment()
                first = env.reset(rows[p] if rows is not None else {})
                envs.append(env)
            if first:  # the environment's first messages replace the templated prompt
                prompts[p] = chat_turns(self.tokenizer, first, opening=True, prefix=self.turn_prefix)
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        return run_episodes(
            self, enc.input_ids.to(device), enc.attention_mask.to(device), samples_per_prompt, envs, **kw
        )

    @torch.no_grad()
    def generate_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        samples_per_prompt: int,
        *,
        greedy: bool = False,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        seeds: list[int] | None = None,
        stop: list[str] | None = None,
    ) -> RolloutBatch:
        """:meth:`generate` from token ids: ``input_ids`` [P, L] left-padded prompts (``attention_mask``
        0 on the padding), on the engine's device; a continuation after a tool's result starts from
        its row's ids, never from re-tokenized text. ``stop``: stop strings for this call only
        (default: the engine's). No tools are called here."""
        how = self.sampling
        how = dataclasses.replace(
            how,
            temperature=how.temperature if temperature is None else temperature,
            max_new_tokens=how.max_new_tokens if max_new_tokens is None else max_new_tokens,
        )
        tok = self.tokenizer
        stops = self.stop if stop is None else list(stop)
        stopper = self._stop if stop is None else StopStrings(tok, stops, 0, 0, "cpu") if stops else None
        P = input_ids.shape[0]
        G, B = samples_per_prompt, P * samples_per_prompt
        seeded = seeds is not None and not greedy
        if seeded and len(seeds) != B:
            raise ValueError(f"{len(seeds)} seeds for {B} sequences")
        prompt_len = input_ids.shape[1]
        temp = how.temperature
        record = self.logprobs and not greedy
        entropy_temp = temp if self.entropy and not greedy else None
        per_chunk = max(1, self.batch_seqs // G)  # whole groups: a prompt is prefilled once for its G samples
        chunks = []
        if self.static and not greedy and not seeded:  # the global RNG gives the row seeds
            seeds = torch.randint(0, 2**62, (B,)).tolist()  # cpu: the global CPU RNG, as the dynamic decode draws
        for first in range(0, P, per_chunk):
            rows = slice(first * G, (first + per_chunk) * G)
            ids, mask = input_ids[first : first + per_chunk], attention_mask[first : first + per_chunk]
            common = dict(
                max_new_tokens=how.max_new_tokens,
                eos_ids=self.eos_ids,
                pad_id=tok.pad_token_id,
                stopped=stopper.hits if stopper is not None else None,
            )
            if self.static:  # compiled (CUDA graphs) on a GPU; eager elsewhere
                sampler = Sampler(greedy, temp, how.top_k, how.top_p, temp if record else None, entropy_temp)
                row_seeds = None if greedy else torch.tensor(seeds[rows], dtype=torch.long)  # cpu: moved by the decoder
                try:
                    with eval_mode(self.model), self.packed.active() if self.packed else contextlib.nullcontext():
                        chunks.append(self.decoder.decode(ids, mask, G, how=sampler, seeds=row_seeds, **common))
                    continue
                except torch.OutOfMemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 - a compile or capture failure: the dynamic decode has run
                    self._static_failed(e)
                    seeded = seeds is not None and not greedy  # the row seeds drawn for it: the same draws
            if greedy:
                pick = GreedyPicker()
            elif seeded:
                pick = SeededPicker(
                    seeds[rows], temp, how.top_k, how.top_p, kernel=self.lean.kernel if self.lean is not None else None,
                    entropy=entropy_temp is not None,
                )  # fmt: skip
            else:
                pick = GlobalRNGPicker(temp, how.top_k, how.top_p)
            with eval_mode(self.model), self.packed.active() if self.packed else contextlib.nullcontext():
                chunks.append(
                    decode(
                        self.model, ids, mask, G, pick=pick, logprob_temperature=temp if record else None,
                        entropy_temperature=entropy_temp, lean=self.lean, **common,
                    )
                )  # fmt: skip
        T = max(c.response.shape[1] for c in chunks)
        pad = tok.pad_token_id
        F = torch.nn.functional
        response = torch.cat([F.pad(c.response, (0, T - c.response.shape[1]), value=pad) for c in chunks])
        response_mask, truncated = response_mask_from_eos(
            response, self.eos_ids, stop_at=torch.cat([c.stop_at for c in chunks])
        )
        response = torch.where(response_mask.bool(), response, torch.full_like(response, pad))

        def recorded(name: str):  # the chunks' [b, T_c] records as one [B, T], 0 past each row's end
            x = torch.cat([F.pad(getattr(c, name), (0, T - getattr(c, name).shape[1])) for c in chunks])
            return torch.where(response_mask.bool(), x, torch.zeros_like(x))

        logprobs = recorded("logprobs") if record else None
        entropy = recorded("entropy") if entropy_temp is not None else None
        self.last_stats = {
            "rows": B,
            "decode_steps": sum(c.steps for c in chunks),
            "row_steps": sum(c.row_steps for c in chunks),
            "tokens": int(response_mask.sum()),
        }
        prompt_ids, prompt_mask = (
            input_ids.repeat_interleave(G, dim=0),
            attention_mask.repeat_interleave(G, dim=0),
        )
        return RolloutBatch(
            input_ids=torch.cat([prompt_ids, response], dim=1),
            attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
            response_mask=response_mask,
            prompt_len=prompt_len,
            texts=[cut_at_stop(t, stops) for t in tok.batch_decode(response, skip_special_tokens=True)],
            truncated=truncated,
            group_size=samples_per_prompt,
            logprobs=logprobs,
            entropy=entropy,
        )
