"""Decoding on a static KV cache kept for the run, one compiled step per token with sampling inside.

Why: on a GPU a small model's decode step is a few hundred small kernels; launched one by one from
Python, with the host reading the GPU's state at every token, the rollout runs at a small fraction
of its floor (the weights read once per token). A step whose tensors have fixed addresses can be
captured once as a CUDA graph and replayed (``torch.compile(mode="reduce-overhead")``), and the host
can run ahead of the GPU when it reads nothing back.

How (:class:`StaticDecoder`, one per rollout engine):

- **One step, no host reads.** The compiled step runs the model's forward for one token of every
  row, samples (temperature, top-k, top-p), records the log-prob, writes the token into the response
  buffer and clears the row's live flag at EOS: all on the device, the sample drawn by the
  counter-based rule of :mod:`rlvr.rollout.sampling` (row seed, position), so a row draws what the
  dynamic decode draws for it whatever shares its batch. The step returns nothing; every tensor it
  touches is a buffer with a fixed address (``torch._dynamo.mark_static_address``).
- **The host looks every** :attr:`StaticDecoder.sync_every` **tokens**: one copy of the response
  buffer into pinned memory (non-blocking, followed by an event), read one interval later, so the
  GPU is always an interval ahead. There it finds EOS and stop strings (cut at the first hit, as the
  dynamic decode cuts), marks string-stopped rows dead, and ends the decode when no row is live. A
  row's tokens past its end are discarded, so the output is what the dynamic decode gives.
- **Finished rows cost nothing.** The batch runs at the smallest size of a ladder (all rows, then
  powers of two down to 8) that holds the live rows; when the live rows fit a smaller size, they
  are compacted to the front of every buffer (keys, values, mask, per-row state) and the step runs
  on views of that size.
- **Attention reads the filled part.** The step attends a window of the cache that holds every
  filled position, rounded up to a power-of-two multiple of :data:`WINDOW` positions, not the
  whole capacity.
- **One cache for the run.** Keys, values and state are allocated once, for the rows and the
  capacity asked (the trainer asks for the data's longest prompt plus the longest response),
  and reused by every rollout; they grow (new buffers) only when a call needs more. Batch size
  and window are marked dynamic (``torch._dynamo.maybe_mark_dynamic``), so the step compiles once
  per sampling mode (training's sampling, evaluation's greedy), and CUDA graph trees record one
  cheap graph per (batch, window) pair they meet, never falling back to eager.

The prefill stays the model's own forward (uncompiled, one per prompt, repeated into its G rows).
The plain implementation it must equal is the dynamic decode (:func:`rlvr.rollout.decode.decode`):
at float32, greedy token for token, seeded samples draw for draw, the same stop positions and
log-probs (``tests/rollout/test_static_decode.py``, on a CPU, eager and under ``torch.compile``). At
bf16 that claim does not hold: compiled and eager code round differently and compaction changes the
batch size and so the kernels, so a row can part at a near-tie (a bf16 CPU check gave 63 of 64 rows
equal); ``benchmarks/gpu_check.py`` measures the share on a GPU against a stated tolerance.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import numpy as np
import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from rlvr.algos import entropy_from_logits
from rlvr.errors import failure_line
from rlvr.models.forward import cache_kwargs, output_cache
from rlvr.models.gqa_decode import gqa_decode
from rlvr.rollout.decode import Decoded
from rlvr.rollout.sampling import counter_uniform, draw

WINDOW = 256
"""Attention windows and the cache's capacity are multiples of this many positions."""
SMALLEST_BATCH = 8
"""The smallest batch of the compaction ladder: below it, compacting saves less than it costs."""
ATTENTION = ("sdpa", "eager")
"""Attention implementations the step's mask is built for (a boolean mask for SDPA, additive for eager)."""


@dataclasses.dataclass(frozen=True)
class Sampler:
    """How the step picks: greedy (argmax), or the counter-based draw at ``temperature`` after top-k /
    top-p; ``logprob_temperature`` records log-softmax(z / T) of the picked tokens and
    ``entropy_temperature`` the entropy of softmax(z / T) at each step (None = do not)."""

    greedy: bool
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    logprob_temperature: float | None = None
    entropy_temperature: float | None = None


class _WindowLayer(CacheLayerMixin):
    """One layer's keys and values: views ``[b, heads, W, head_dim]`` of the decoder's buffers; the
    step's new key and value go to the shared cache position ``pos`` (every row's response token t
    sits at the same position, the prompts being left-padded to one length)."""

    is_compileable = True

    def __init__(self, keys: Tensor, values: Tensor, pos: Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.pos = keys, values, pos
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        raise RuntimeError("a window layer is allocated by its StaticDecoder")

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.keys.index_copy_(2, self.pos, key_states)
        self.values.index_copy_(2, self.pos, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


@dataclasses.dataclass
class _View:
    """The step's arguments for one (batch, window): views of the decoder's buffers, made once and
    marked static (fixed addresses for CUDA graphs) and dynamic in batch and window (one compile)."""

    cache: Cache
    mask: Tensor  # [b, 1, 1, W] bool
    tokens: Tensor  # [b] the last picked token of each slot
    plen: Tensor  # [b] prompt length (without padding): response token t has position plen + t
    live: Tensor  # [b] bool
    row: Tensor  # [b] the output row of each slot; the scratch row for padding slots
    seeds: Tensor  # [b] int64


pinning_failure: str | None = None
"""Why page-locked host memory was refused in this process (then host copies are pageable), or None."""


def _pinning_failed(e: BaseException) -> None:
    global pinning_failure
    pinning_failure = failure_line(e)
    print(
        f"warning: pinned host memory was refused ({pinning_failure}); the static decode copies through pageable "
        "memory from here on (each host read then waits for the device; rollout.static_decode=false avoids it)",
        file=sys.stderr,
        flush=True,
    )


def host_buffer(n: int, *, pinned: bool) -> Tensor:
    """[n] int64 zeros on the host, page-locked where ``pinned`` (the device copies into it without
    stopping the stream) and pinning works; else pageable, said once (:data:`pinning_failure`)."""
    if pinned and pinning_failure is None:
        try:
            return torch.zeros(n, dtype=torch.long, pin_memory=True)  # cpu: a host buffer
        except RuntimeError as e:
            _pinning_failed(e)
    return torch.zeros(n, dtype=torch.long)  # cpu: a host buffer


def _own_code(fn: Callable, n: int) -> Callable:
    """``fn`` with a code object of its own. Dynamo keeps compiled versions per code object and stops at
    ``recompile_limit`` versions (with ``fullgraph=True``, an error): the closures of one nested function
    share one code object, so every sampling mode, engine and cache size of a process would count against
    one limit. A copy per mode keeps each mode's versions apart."""
    import types

    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{n}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    own.__qualname__ = f"{fn.__qualname__}_{n}"
    return own


def copy_event(device: torch.device):
    """A CUDA event recorded on ``device``'s current stream -- the stream a copy from a tensor on ``device``
    was queued on, which need not be the current device's (``model.device=cuda:1``) -- or None off CUDA."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class StaticDecoder:
    """A model's decode on one static cache for the run (see the module docstring).

    Args:
        model: a causal LM with SDPA or eager attention, in eval mode while decoding.
        compile: a ``torch.compile`` backend for the step (``inductor`` on a GPU: CUDA graphs); None = eager.
        sync_every: decode steps between the host's reads of the response buffer (≥ 1).
        rows, capacity: the buffers' size to allocate at the first decode (the engine's largest batch;
            the data's longest prompt plus the longest response), so later calls reuse them.
    """

    def __init__(
        self, model, *, compile: str | None = None, sync_every: int = 16, rows: int = 0, capacity: int = 0
    ) -> None:
        attn = getattr(model.config, "_attn_implementation", None) or "eager"
        if attn not in ATTENTION:
            raise ValueError(
                f"the static decode builds masks for {' or '.join(ATTENTION)} attention, not {attn!r}: "
                "load the model with attn_implementation='sdpa' or set rollout.static_decode=false"
            )
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every}: the host must read the response buffer at least every step")
        self.model, self.backend, self.sync_every = model, compile, sync_every
        self.additive_mask = attn == "eager"
        self.rows = self.capacity = 0
        self.want_rows, self.want_capacity = rows, capacity
        self.compiled: dict[tuple, tuple[Callable, Tensor]] = {}
        self.raw_steps: dict[tuple, Callable] = {}
        """Each sampling mode's step before compiling: a code object of its own (:func:`_own_code`)."""
        self.host_reads = 0
        """Copies of the response buffer to the host so far (the decode's only device-to-host reads)."""

    # -- buffers ------------------------------------------------------------------------------

    def reserve(self, rows: int, capacity: int, like: Cache) -> None:
        """Buffers for ``rows`` rows and ``capacity`` cache positions (rounded up to :data:`WINDOW`; a
        response never outgrows the cache, so the response buffers are as long); kept when they are
        already as large. ``like`` (a prefill's cache) gives the layers' shapes and dtype."""
        rows, capacity = max(rows, 2), -(-capacity // WINDOW) * WINDOW
        if rows <= self.rows and capacity <= self.capacity:
            return
        rows, capacity = max(rows, self.rows), max(capacity, self.capacity)
        # the old cache is let go before the new one is made: never both at once (at 7B, GBs each)
        self.views = {}
        self.keys, self.values = [], []
        for name in ("mask", "out_tokens", "out_logprobs", "out_entropy", "staging"):
            self.__dict__.pop(name, None)
        device = next(self.model.parameters()).device
        for shape_k, shape_v, dtype in self._layer_shapes(like):
            # one position more than the capacity: a window never covers the whole buffer, so every view has
            # the same (non-contiguous) strides and one compiled step serves them all
            self.keys.append(torch.zeros(rows, shape_k[0], capacity + 1, shape_k[1], dtype=dtype, device=device))
            self.values.append(torch.zeros(rows, shape_v[0], capacity + 1, shape_v[1], dtype=dtype, device=device))
        self.mask = torch.zeros(rows, capacity + 1, dtype=torch.bool, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.plen = torch.zeros(rows, dtype=torch.long, device=device)
        self.live = torch.zeros(rows, dtype=torch.bool, device=device)
        self.row = torch.zeros(rows, dtype=torch.long, device=device)
        self.seeds = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # cache position of the token fed in
        self.t = torch.zeros(1, dtype=torch.long, device=device)  # response index of the token picked
        self.out_tokens = torch.zeros(rows + 1, capacity, dtype=torch.long, device=device)  # + the scratch row
        self.out_logprobs = torch.zeros(rows + 1, capacity, device=device)
        self.out_entropy = torch.zeros(rows + 1, capacity, device=device)
        # flat: each copy lands contiguous (a strided destination would not copy asynchronously)
        staging = rows * capacity
        self.staging = [host_buffer(staging, pinned=device.type == "cuda") for _ in range(2)]
        for buf in (*self.keys, *self.values, self.mask, self.tokens, self.plen, self.live, self.row, self.seeds):
            torch._dynamo.mark_static_address(buf, guard=False)
        for buf in (self.pos, self.t, self.out_tokens, self.out_logprobs, self.out_entropy):
            torch._dynamo.mark_static_address(buf, guard=False)
        self.rows, self.capacity = rows, capacity
        self.views: dict[tuple[int, int], _View] = {}

    @staticmethod
    def _layer_shapes(like: Cache):
        """(kv heads, head dim) of each layer's keys and values, and their dtype, from a prefill's cache."""
        for layer in like.layers:
            yield layer.keys.shape[1::2], layer.values.shape[1::2], layer.keys.dtype

    def nbytes(self) -> int:
        """Bytes the decoder holds on its device (keys, values, mask, state, responses)."""
        bufs = [*self.keys, *self.values, self.mask, self.out_tokens, self.out_logprobs, self.out_entropy]
        bufs = bufs if self.rows else []
        return sum(b.numel() * b.element_size() for b in bufs)

    def _view(self, b: int, W: int) -> _View:
        if (b, W) not in self.views:
            layers = [
                _WindowLayer(k[:b, :, :W], v[:b, :, :W], self.pos) for k, v in zip(self.keys, self.values, strict=True)
            ]
            view = _View(
                Cache(layers=layers),
                self.mask[:b, None, None, :W],
                *(x[:b] for x in (self.tokens, self.plen, self.live, self.row, self.seeds)),
            )
            for x in (*(y for layer in layers for y in (layer.keys, layer.values)), view.mask, view.tokens):
                torch._dynamo.mark_static_address(x, guard=False)
                torch._dynamo.maybe_mark_dynamic(x, 0)
            for x in (view.plen, view.live, view.row, view.seeds):
                torch._dynamo.mark_static_address(x, guard=False)
                torch._dynamo.maybe_mark_dynamic(x, 0)
            for layer in layers:
                torch._dynamo.maybe_mark_dynamic(layer.keys, 2)
                torch._dynamo.maybe_mark_dynamic(layer.values, 2)
            torch._dynamo.maybe_mark_dynamic(view.mask, 3)
            self.views[b, W] = view
        return self.views[b, W]

    def _ladder(self, n: int) -> int:
        """The batch size the step runs at for ``n`` live rows: the smallest power of two ≥ n (at least
        :data:`SMALLEST_BATCH`), capped at the rows allocated."""
        size = SMALLEST_BATCH
        while size < n:
            size *= 2
        return min(size, self.rows)

    def _window(self, filled: int) -> int:
        """The window for ``filled`` positions: a power-of-two multiple of :data:`WINDOW`, capped at the capacity."""
        w = WINDOW
        while w < filled:
            w *= 2
        return min(w, self.capacity)

    # -- the step -----------------------------------------------------------------------------

    def _pick(self, logits: Tensor, v: _View, how: Sampler, eos: Tensor) -> None:
        """Picks each slot's token t from ``logits`` [b, V] float32 and records it (no host reads)."""
        if how.greedy:
            picked = logits.argmax(-1)
        else:
            picked = draw(logits, counter_uniform(v.seeds, self.t), how.temperature, how.top_k, how.top_p)
        target = torch.where(v.live, v.row, self.rows)  # dead slots write to the scratch row
        at = self.t.expand_as(target)
        self.out_tokens.index_put_((target, at), picked)
        if how.logprob_temperature is not None:
            logp = torch.log_softmax(logits / how.logprob_temperature, dim=-1).gather(-1, picked[:, None])[:, 0]
            self.out_logprobs.index_put_((target, at), logp)
        if how.entropy_temperature is not None:
            ent = entropy_from_logits(logits[None], temperature=how.entropy_temperature)[0]
            self.out_entropy.index_put_((target, at), ent)
        v.live.copy_(v.live & ~torch.isin(picked, eos))
        v.tokens.copy_(picked)
        self.t.add_(1)

    def _step_fn(self, how: Sampler, eos: Tensor) -> Callable:
        model, name = self.model, next(iter(cache_kwargs(self.model, None)))
        additive = self.additive_mask

        def step(v: _View) -> None:
            """Feeds each slot's last token at cache position ``pos`` and picks the next one."""
            v.mask.index_fill_(3, self.pos, True)
            mask = v.mask
            if additive:
                dtype = next(model.parameters()).dtype
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                    ~mask, torch.finfo(dtype).min
                )
            out = model(
                input_ids=v.tokens[:, None],
                attention_mask=mask,
                position_ids=(v.plen + self.t - 1)[:, None],
                use_cache=True,
                logits_to_keep=1,
                **{name: v.cache},
            )
            self._pick(out.logits[:, -1].float(), v, how, eos)
            self.pos.add_(1)

        return step

    def _compiled(self, how: Sampler, eos_ids: list[int]) -> Callable:
        key = how, tuple(eos_ids)
        if key not in self.compiled:
            eos = torch.tensor(eos_ids, device=self.tokens.device)
            step = _own_code(self._step_fn(how, eos), len(self.compiled))
            self.raw_steps[key] = step
            if self.backend is not None:
                mode = "reduce-overhead" if self.backend == "inductor" else None
                step = torch.compile(step, backend=self.backend, mode=mode, fullgraph=True)
            self.compiled[key] = (step, eos)
        return self.compiled[key]

    # -- one decode ---------------------------------------------------------------------------

    @torch.no_grad()
    def decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        repeats: int,
        *,
        max_new_tokens: int,
        how: Sampler,
        seeds: Tensor | None,
        eos_ids: list[int],
        pad_id: int,
        stopped: Callable[[Tensor], Tensor] | None = None,
    ) -> Decoded:
        """G = ``repeats`` continuations of each of P left-padded prompts, as
        :func:`rlvr.rollout.decode.decode` gives them.

        Args:
            seeds: [P·G] int64 row seeds for the counter-based draw (ignored when greedy).
            stopped: ``(responses [b, t] on the host) -> [b] bool``: a stop string completed at the last token.
            The rest: as :func:`~rlvr.rollout.decode.decode`.
        """
        P, L = input_ids.shape
        G = repeats
        B = P * G
        if not how.greedy and (seeds is None or seeds.shape[0] != B):
            raise ValueError(f"the static decode samples by row seeds: {B} needed")
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        prefill = output_cache(out)
        self.reserve(max(B, self.want_rows), max(L + max_new_tokens, self.want_capacity), like=prefill)
        step, eos = self._compiled(how, eos_ids)
        b = self._ladder(B)
        for k, v, src in zip(self.keys, self.values, prefill.layers, strict=True):
            k[:B, :, :L] = src.keys.repeat_interleave(G, 0)
            v[:B, :, :L] = src.values.repeat_interleave(G, 0)
        self.mask[:b].zero_()
        self.mask[:B, :L] = attention_mask.bool().repeat_interleave(G, 0)
        self.mask[B:b, 0] = True  # a padding slot attends one position: no empty softmax
        self.plen[:B] = attention_mask.long().sum(-1).repeat_interleave(G)
        self.live[:b] = torch.arange(b, device=self.live.device) < B
        self.row[:b] = torch.where(self.live[:b], torch.arange(b, device=self.row.device), self.rows)
        if seeds is not None:
            self.seeds[:B] = seeds.to(self.seeds.device)
        self.out_tokens[:B, :max_new_tokens] = pad_id
        self.out_logprobs[:B, :max_new_tokens] = 0
        self.out_entropy[:B, :max_new_tokens] = 0
        self.t.zero_()
        self.pos.fill_(L)
        # token 0 from the prefill's logits, by the step's own picking (eager: once per decode)
        first = self._view(B, self._window(L + 1))
        self._pick(out.logits[:, -1].float().repeat_interleave(G, 0), first, how, eos)

        slots = list(range(B)) + [-1] * (b - B)  # the row each slot holds, -1 = padding
        ended = np.full(B, -1)  # response index where each row ended (EOS or stop string), -1 = not yet
        stop_at = np.full(B, -1)
        eos_np = np.array(eos_ids)
        pending: list[tuple[int, Tensor, object]] = []  # (tokens so far, host copy, event)
        checked = 0  # response positions the host has examined
        steps = row_steps = 0
        t = 1  # tokens picked
        self.host_reads = 0

        def examine(upto: int, host: Tensor) -> None:
            """Finds each unfinished row's end among positions [checked, upto) of its host copy."""
            nonlocal checked
            tok = host.numpy()
            for i in range(checked, upto):
                open_rows = np.flatnonzero(ended < 0)
                if open_rows.size == 0:
                    break
                at_eos = np.isin(tok[open_rows, i], eos_np)
                hit = np.zeros_like(at_eos)
                if stopped is not None:
                    hit = stopped(host[open_rows, : i + 1]).numpy() & ~at_eos
                    stop_at[open_rows[hit]] = i
                ended[open_rows[at_eos | hit]] = i
            checked = upto

        def snapshot() -> None:
            """Copies the picked tokens to the host (non-blocking into pinned memory on a GPU)."""
            flat = self.staging[self.host_reads % 2]  # at most two copies are pending: they alternate
            host = flat[: B * t].view(B, t)
            host.copy_(self.out_tokens[:B, :t], non_blocking=flat.is_pinned())
            event = copy_event(self.out_tokens.device)
            self.host_reads += 1
            pending.append((t, host, event))

        def settle() -> bool:
            """Reads the oldest pending copy: finds ends, marks string-stopped rows dead, compacts.
            False once every row has ended."""
            nonlocal b, slots
            upto, host, event = pending.pop(0)
            if event is not None:
                event.synchronize()
            before = ended.copy()
            examine(upto, host)
            if (ended >= 0).all():
                return False
            newly = [s for s, r in enumerate(slots) if r >= 0 and ended[r] >= 0 and before[r] < 0]
            if newly and stopped is not None:  # rows that ended by EOS are dead on the device already
                self.live[self._to_device(newly)] = False
            open_slots = [s for s, r in enumerate(slots) if r >= 0 and ended[r] < 0]
            smaller = self._ladder(len(open_slots))
            if smaller < b:
                self._compact(open_slots, smaller, self._window(L + t))
                slots = [slots[s] for s in open_slots] + [-1] * (smaller - len(open_slots))
                b = smaller
            return True

        done = False
        while t < max_new_tokens and not done:
            with gqa_decode(self.model):  # no copies of keys and values per query head
                step(self._view(b, self._window(L + t)))
            steps, row_steps, t = steps + 1, row_steps + b, t + 1
            if t % self.sync_every == 0:
                snapshot()
                done = len(pending) > 1 and not settle()  # the GPU stays one interval ahead of the host
        if not done:
            if not pending or pending[-1][0] != t:
                snapshot()
            while pending and settle():
                pass
        T = int(ended.max()) + 1 if (ended >= 0).all() else t
        end = torch.from_numpy(np.where(ended >= 0, ended, T - 1)).to(self.out_tokens.device)
        keep = torch.arange(T, device=end.device)[None] <= end[:, None]
        response = self.out_tokens[:B, :T].masked_fill(~keep, pad_id)
        logprobs = entropy = None
        if how.logprob_temperature is not None:
            logprobs = self.out_logprobs[:B, :T].masked_fill(~keep, 0.0)
        if how.entropy_temperature is not None:
            entropy = self.out_entropy[:B, :T].masked_fill(~keep, 0.0)
        stop = torch.from_numpy(stop_at).to(end.device)
        return Decoded(response, stop, logprobs, steps, row_steps, entropy)

    def _to_device(self, values: list[int]) -> Tensor:
        """An index tensor on the device without waiting for it: from pinned memory, a host-to-device copy
        is queued behind the steps (from pageable memory CUDA would first drain the stream)."""
        host = torch.tensor(values, dtype=torch.long)  # cpu: the host's indices, copied below
        if self.tokens.device.type != "cuda":
            return host
        if pinning_failure is None:
            try:
                return host.pin_memory().to(self.tokens.device, non_blocking=True)
            except RuntimeError as e:
                _pinning_failed(e)
        return host.to(self.tokens.device)

    def _compact(self, open_slots: list[int], size: int, window: int) -> None:
        """Moves the open slots to the front of every buffer (the first ``window`` cache positions: the
        filled ones); the rest of the first ``size`` slots become padding."""
        n = len(open_slots)
        src = self._to_device(open_slots + [open_slots[0]] * (size - n))
        for buf in (*self.keys, *self.values):
            buf[:size, :, :window] = buf[src, :, :window]  # advanced indexing copies first: overlap is safe
        for buf in (self.mask, self.tokens, self.plen, self.live, self.row, self.seeds):
            buf[:size] = buf[src]
        if n < size:
            self.live[n:size] = False
            self.row[n:size] = self.rows
