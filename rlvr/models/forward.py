"""The one forward pass the trainer runs on sampled sequences: response log-probs, fused with the LM head."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from rlvr import algos
from rlvr.algos import logprobs as _logprobs_mod
from rlvr.errors import failure_line
from rlvr.models import shared_prefix


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


def pass_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    group_size: int = 1,
    fused: bool = True,
    unpadded: tuple[Tensor, tuple[int, ...]] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of the response tokens: the one forward pass of the update and of
    the old-policy and reference passes.

    The LM head is fused with the log-probs (:func:`rlvr.algos.lm_head_logprobs`): the model's own
    head is swapped, for the response pass only, for one that takes the hidden states of the kept
    positions and returns (log p, entropy) tile by tile, so the [b, T, V] logits never exist, in
    the forward or the backward. The swap happens inside the model's forward, where FSDP2 has
    gathered the head's weight; parameter names, state dicts and a tied embedding (its gradient
    flows into the one shared weight) are unchanged. Models whose head is not a plain
    ``nn.Linear`` or that post-process the logits (:data:`FUSED_HEAD_MODEL_TYPES` lists those that
    do not) take the full-logits path, :func:`response_logits` then
    :func:`rlvr.algos.token_logprobs_entropy`, as does ``fused=False``; both give the same values
    and gradients to float32 rounding (tests).

    ``group_size > 1`` shares each group's prompt (:func:`response_logits`) where
    :func:`prompt_sharing_pays`, otherwise the rows run in one plain pass.

    Args:
        input_ids: [b, L] left-padded prompt + response.
        attention_mask: [b, L].
        tokens: [b, T] the response tokens, ``input_ids[:, L - T:]``.
        temperature: the sampling temperature (> 0).
        entropy: also return the entropy of each position's distribution, detached (a metric).
        entropy_grad: return it with its gradient (an entropy bonus in the loss).
        group_size: rows per shared prompt (consecutive), as :func:`response_logits`.
        fused: False forces the full-logits path.
        unpadded: (lengths [b] on the device, the same lengths on the host): each row's response
            positions. Where the one-pass shared prompt runs (:func:`unpadded_applies`), each
            group's responses then go end to end without their padding, and the groups end to end
            in one row (:func:`rlvr.models.shared_prefix.unpadded_index`), so the model computes
            each group's summed lengths instead of G·T; elsewhere ignored. Positions past a row's
            length get a copy of its last log-prob (the caller masks them).

    Returns:
        (logp [b, T] float32, entropy [b, T] float32 or None).
    """
    T = tokens.shape[1]
    one_pass = shared_prefix.one_pass_applies(model)
    if group_size > 1 and not prompt_sharing_pays(
        input_ids.shape[0], group_size, input_ids.shape[1] - T, input_ids.device, one_pass=one_pass
    ):
        group_size = 1
    kw = dict(temperature=temperature, entropy=entropy, entropy_grad=entropy_grad, fused=fused)
    L = input_ids.shape[1]
    if unpadded is not None and group_size > 1 and L - T >= 2 and unpadded_applies(model, grad=torch.is_grad_enabled()):
        return _unpadded_logprobs(model, input_ids, attention_mask, tokens, group_size, unpadded, kw)
    run = functools.partial(_response_forward, model, input_ids, attention_mask, T, group_size)
    return _logprobs(model, run, tokens, **kw)


def unpadded_applies(model, *, grad: bool) -> bool:
    """Whether ``model``'s shared-prompt passes run as one pass whose segments can drop their padding
    (:func:`pass_logprobs`'s ``unpadded``): the one-pass shared prompt, and, for a pass with
    gradients, no checkpointed layers (those take the per-row pass, :func:`response_logits`)."""
    return shared_prefix.one_pass_applies(model) and not (grad and _checkpointed_modules(model))


def _unpadded_logprobs(model, input_ids, attention_mask, tokens: Tensor, G: int, unpadded, kw: dict):
    """:func:`pass_logprobs` over the one-pass layout without segment padding: one row of the groups
    end to end, each its prompt and its rows' real response positions
    (:func:`rlvr.models.shared_prefix.unpadded_index`), whose head positions are those R responses,
    then gathered back to [b, T]."""
    lengths, host = unpadded
    (B, T), P = tokens.shape, tokens.shape[0] // G
    host, sums = shared_prefix.unpadded_span(host, T, G)
    ids, pos, masks, _ = shared_prefix.layout(input_ids, attention_mask, _positions(attention_mask), T, G)
    Lp = ids.shape[1] - G * T
    index = shared_prefix.unpadded_index(lengths.view(P, G).clamp(1, T), T, Lp, sums)  # once for every layer
    ids, pos = (x.reshape(-1)[index.back][None] for x in (ids, pos))  # [1, N]
    core = _core(model, ids.device, Lp, T, host, P, G)

    def run(response_pass):
        with shared_prefix.shared_attention(model), response_pass():
            out = model(
                input_ids=ids,
                attention_mask=None,  # the segment masks travel to the attention layers as shared_prefix
                position_ids=pos,
                logits_to_keep=index.keep,
                use_cache=False,
                shared_prefix=(G, T, masks, (index.into, index.back, host, core)),
            )
        return out.logits  # [1, R, ·]

    logp, ent = _logprobs(model, run, tokens.reshape(-1)[index.tokens][None], **kw)  # [1, R]
    idx = index.unpad.flatten()  # a gather, whose backward is a scatter-add (no host sync)

    def rows(x: Tensor | None) -> Tensor | None:  # [1, R] -> [b, T]
        return None if x is None else x.reshape(-1).gather(0, idx).view(B, T)

    return rows(logp), rows(ent)


def _core(model, device, Lp: int, T: int, lengths: tuple[int, ...], P: int, G: int):
    """The :class:`~rlvr.models.shared_prefix.Core` of an unpadded pass on a CPU whose attention
    costs less padded to a shorter length than to T (:func:`~rlvr.models.shared_prefix.core_length`),
    else None."""
    if torch.device(device).type != "cpu":
        return None
    low = torch.is_autocast_enabled("cpu") or next(model.parameters()).dtype != torch.float32
    c = shared_prefix.core_length(Lp, T, lengths, P, low)
    return shared_prefix.core_rows(lengths, Lp, G, c, device) if c < T else None


def call_logprobs(
    model,
    call,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    fused: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`pass_logprobs` for a forward of the caller's own (a packed pass, for one):
    ``call(head=ctx)`` runs one call of ``model`` inside ``with ctx():`` and returns its
    ``out.logits``, the [b, T, V] logits (``logits_to_keep``) that predict ``tokens`` [b, T]. Inside
    that block the head returns the fused log-probs instead, which ``call`` passes on untouched.

    Returns:
        (logp [b, T] float32, entropy [b, T] float32 or None), as :func:`pass_logprobs`.
    """
    kw = dict(temperature=temperature, entropy=entropy, entropy_grad=entropy_grad, fused=fused)
    return _logprobs(model, lambda response_pass: call(head=response_pass), tokens, **kw)


FUSED_ENV = "RLVR_FUSED_LOGPROBS"
"""``auto`` (default): the fused LM-head log-probs where the head allows, and where they fail at run time,
the full logits from then on, said in one line; ``1``: the fused path or its error; ``0``: the full logits."""

fused_failure: str | None = None
"""Why the fused log-probs failed in this process (then every later pass computes the full logits), or None."""


def _fused_mode() -> str:
    mode = os.environ.get(FUSED_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        from rlvr.errors import UserError

        raise UserError(f"{FUSED_ENV}={mode}: use auto (default), 1 (fused or an error) or 0 (full logits)")
    return mode


def _logprobs(model, run, tokens: Tensor, *, temperature: float, entropy: bool, entropy_grad: bool, fused: bool):
    """(logp, entropy) of ``tokens`` from ``run(response_pass)``, which returns the ``out.logits`` of
    the model call it makes inside ``response_pass()``: fused when the head allows, else in full.

    Fail soft (:data:`FUSED_ENV`): a fused pass that raises in its forward (a kernel or a shape no GPU
    has run yet) is redone from the full logits, and so is every later pass of the process; one line
    says what failed and how to choose either path. Out of memory is not caught (the full logits need
    more)."""
    global fused_failure
    mode = _fused_mode()
    head = fused_head(model) if fused and mode != "0" and fused_failure is None else None
    if head is not None and mode == "auto":
        try:
            with _sparse_tied_embedding_grad(model):
                return _logprobs_of(
                    model, run, head, tokens, temperature=temperature, entropy=entropy, entropy_grad=entropy_grad
                )
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the path that never ran here: fall back
            fused_failure = failure_line(e)
            print(
                f"warning: the fused LM-head log-probs failed ({fused_failure}); computing them from the full "
                f"logits from here on ({FUSED_ENV}=0 always does, {FUSED_ENV}=1 makes this an error)",
                file=sys.stderr,
                flush=True,
            )
            head = None
    with _sparse_tied_embedding_grad(model):
        return _logprobs_of(
            model, run, head, tokens, temperature=temperature, entropy=entropy, entropy_grad=entropy_grad
        )


def _logprobs_of(model, run, head, tokens: Tensor, *, temperature: float, entropy: bool, entropy_grad: bool):
    if head is None:
        logits = run(contextlib.nullcontext)  # [b, T, V]
        with torch.autocast(logits.device.type, enabled=False):  # float32 math, as outside the forward's autocast
            return _full_logits_logprobs(logits, tokens, temperature, entropy, entropy_grad)
    with_entropy = entropy or entropy_grad
    out = run(
        functools.partial(_logprob_head, head, tokens, temperature=temperature, entropy=with_entropy, model=model)
    )
    if not with_entropy:  # out: [b, T, 1 or 2]
        return out[..., 0], None
    return out[..., 0], out[..., 1] if entropy_grad else out[..., 1].detach()


def _plain_cpu_training(model, module, param) -> bool:
    """Whether ``param`` of ``module`` trains here as a plain CPU leaf: grad mode on, a float32 leaf
    that requires grad, no hooks on it, neither the model nor the module sharded by FSDP2."""
    return (
        torch.is_grad_enabled()
        and param.is_leaf
        and param.requires_grad
        and param.dtype == torch.float32
        and param.device.type == "cpu"
        and not param._backward_hooks
        and not getattr(param, "_post_accumulate_grad_hooks", None)
        and not any(isinstance(m, FSDPModule) for m in (model, module))
    )


@contextlib.contextmanager
def _sparse_tied_embedding_grad(model):
    """On a CPU, a tied input embedding's gradient is made sparse for the block's passes.

    Why: its dense gradient is a zero-filled [V, H] tensor holding a few hundred rows, which autograd
    then adds to the LM head's [V, H] gradient of the same weight; as a sparse gradient, the add
    touches only those rows, and the weight's ``.grad`` stays dense (dense + sparse). Only where the
    head's gradient always joins it (tied), the weight trains, and it is not sharded (FSDP2 reduces
    dense unsharded gradients); elsewhere, or on other devices, nothing changes."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    applies = (
        isinstance(emb, torch.nn.Embedding)
        and not emb.sparse
        and emb.max_norm is None
        and _plain_cpu_training(model, emb, emb.weight)
        and getattr(out, "weight", None) is emb.weight
    )
    if not applies:
        yield
        return
    emb.sparse = True
    try:
        yield
    finally:
        emb.sparse = False


def _full_logits_logprobs(logits: Tensor, tokens: Tensor, temperature: float, entropy: bool, entropy_grad: bool):
    """The unfused path, over [b, T, V] logits :data:`rlvr.algos.logprobs.HEAD_CHUNK_TOKENS` positions
    at a time (a packed pass's one long row keeps one chunk's float32 temporaries, not the row's)."""
    chunk = _logprobs_mod.HEAD_CHUNK_TOKENS
    if tokens.shape[1] <= chunk:  # no split: its backward would write a second [b, T, V]
        chunks = [(logits, tokens)]
    else:
        chunks = zip(logits.split(chunk, 1), tokens.split(chunk, 1))
    parts = []
    for z, y in chunks:
        if entropy_grad:
            lp = algos.token_logprobs(z, y, temperature=temperature)
            parts.append((lp, algos.entropy_from_logits(z, temperature=temperature)))
        else:
            parts.append(algos.token_logprobs_entropy(z, y, temperature=temperature, entropy=entropy))
    if len(parts) == 1:
        return parts[0]
    logp = torch.cat([lp for lp, _ in parts], 1)
    return logp, torch.cat([e for _, e in parts], 1) if parts[0][1] is not None else None


FUSED_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "olmo2", "phi3", "gemma", "smollm3"}
)
"""``config.model_type`` of the causal LMs whose output logits are their LM head's output, untouched
(``logits = self.lm_head(hidden_states)`` and nothing after; a test reads it off their source).
Others may scale or soft-cap the logits (Gemma 2's ``final_logit_softcapping``, Cohere's
``logit_scale``, Granite's ``logits_scaling``) and take the full-logits path."""


def fused_head(model):
    """The model's LM head if :func:`pass_logprobs` can fuse it, else None: a plain ``nn.Linear``
    (FSDP2's subclass of it included; not a LoRA-wrapped head, a quantized one or one behind an
    accelerate hook) of a model type in :data:`FUSED_HEAD_MODEL_TYPES`. A forward set on the
    instance must be ``rlvr.cpu.packed``'s, which computes the same product from a packed copy of
    the weight: the fused head then multiplies by the weight itself (no [N, V] logits beats a
    faster product into them) and the packed forward is put back after the pass."""
    base = _base_model(model)
    if getattr(getattr(base, "config", None), "model_type", None) not in FUSED_HEAD_MODEL_TYPES:
        return None
    head = base.get_output_embeddings()
    plain = isinstance(head, torch.nn.Linear) and type(head).forward is torch.nn.Linear.forward
    own = vars(head).get("forward") if plain else None
    if not plain or hasattr(head, "_hf_hook") or (own is not None and own.__module__ != _PACKED_LINEARS):
        return None
    return head


_PACKED_LINEARS = "rlvr.cpu.packed"
"""The module whose instance forwards on ``nn.Linear`` only change how the product is computed."""


@contextlib.contextmanager
def _logprob_head(head, tokens: Tensor, *, temperature: float, entropy: bool, model=None):
    """Make ``head`` return [b, T, 1] log-probs (or [b, T, 2] log-probs and entropies) of ``tokens``
    in place of [b, T, V] logits, for one forward pass; the weight and bias are read when the head
    runs, inside the model's forward (FSDP2 has gathered them there). On a CPU, an unsharded head
    weight without hooks takes its gradient straight into ``.grad``
    (``lm_head_logprobs(accumulate_grad=True)``): rlvr's update runs a plain ``loss.backward()``."""

    def forward(hidden: Tensor) -> Tensor:  # [b, T, H]: the positions logits_to_keep kept
        if hidden.shape[:-1].numel() != tokens.numel():  # a one-pass shared prompt's [P, G*T] is [B, T]
            raise RuntimeError(f"LM head got hidden states {tuple(hidden.shape)} for tokens {tuple(tokens.shape)}")
        logp, ent = algos.lm_head_logprobs(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            tokens.reshape(-1),
            bias=head.bias,
            temperature=temperature,
            entropy=entropy,
            accumulate_grad=_plain_cpu_training(model, head, head.weight),
        )
        # a new tensor, not a view: FSDP2 hooks the root's outputs for its backward (it warns on views)
        return torch.stack([t.view(tokens.shape) for t in (logp, ent) if t is not None], -1)  # [b, T, 1 or 2]

    prev = vars(head).get("forward")  # rlvr.cpu.packed's, or None (see fused_head)
    head.forward = forward  # an instance attribute: module hooks (FSDP2's) still run around it
    try:
        yield
    finally:
        if prev is None:
            del head.forward
        else:
            head.forward = prev


SHARED_PROMPT_PASS_COST_TOKENS = {"cpu": 64, "cuda": 4096}
"""What the second model pass of a shared prompt costs, in token positions of the same model's
forward + backward (its fixed per-pass work: Python, kernel launches, a second embedding
gradient, the key/value cache repeated per row). :func:`prompt_sharing_pays` shares a prompt when
the positions it saves exceed this. CPU: measured with the built-in model (benchmarks/NOTES.md,
"One pass per micro-batch"). CUDA: an estimate, not measured: a small model's update there is
bound by kernel launches (a Qwen2 layer runs about 300 operators in the shared pass against 144 in
one plain pass), so a pass costs thousands of token positions. Other device types use the CUDA
figure."""


def prompt_sharing_pays(rows: int, group_size: int, prompt_len: int, device, *, one_pass: bool = False) -> bool:
    """Whether a pass over ``rows`` rows in groups of ``group_size`` saves more by running each
    prompt once than the second model pass costs (:data:`SHARED_PROMPT_PASS_COST_TOKENS`); with
    ``one_pass`` (:mod:`rlvr.models.shared_prefix`: no second pass) whenever it saves a position.

    Sharing computes ``rows / group_size`` prompts instead of ``rows``, all but the prompt's last
    token (which runs with the response, once per row): saved = (rows − rows/G) · (prompt_len − 1)."""
    if group_size <= 1:
        return False
    saved = (rows - rows // group_size) * (prompt_len - 1)
    if one_pass:
        return saved > 0
    cost = SHARED_PROMPT_PASS_COST_TOKENS.get(torch.device(device).type, SHARED_PROMPT_PASS_COST_TOKENS["cuda"])
    return saved > cost


def response_logits(
    model, input_ids: Tensor, attention_mask: Tensor, num_response_tokens: int, *, group_size: int = 1
) -> Tensor:
    """Logits that predict the last ``num_response_tokens`` tokens of each row.

    Position ids come from the attention mask, as in ``generate`` with left padding, so the
    log-probs match the distribution the tokens were sampled from. Only the response positions
    go through the LM head (``logits_to_keep``).

    With ``group_size=G > 1``, consecutive runs of G rows share one prompt (a GRPO group).
    The prompt then goes through the model once per group: for sdpa models in one pass with the
    G responses (:mod:`rlvr.models.shared_prefix`), for others in a pass of its own whose key/value
    cache is repeated G times for the responses. Autograd flows through either, so logits *and
    gradients* equal the plain per-row pass (tests assert it) while the prompt costs 1/G as much.

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
    return _response_forward(model, input_ids, attention_mask, num_response_tokens, group_size, contextlib.nullcontext)


def _response_forward(
    model, input_ids: Tensor, attention_mask: Tensor, T: int, group_size: int, response_pass
) -> Tensor:
    """:func:`response_logits` with ``response_pass()`` (a context manager) around the model call that
    yields the response's outputs (not the shared prompt's pass): ``out.logits`` of that call."""
    positions = _positions(attention_mask)
    checkpointed = _checkpointed_modules(model) if group_size > 1 else []
    if checkpointed and torch.is_grad_enabled():
        group_size = 1  # the checkpointed layers would drop the prompt's cache (see response_logits)
    L = input_ids.shape[1]
    if group_size == 1 or L - T < 2:
        with response_pass():
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                logits_to_keep=_keep(L - T - 1, L - 1, input_ids.device),
                use_cache=False,
            )
        return out.logits  # [B, T, V]: positions L-T-1 .. L-2 predict the response
    if shared_prefix.one_pass_applies(model):
        return _one_pass_logits(model, input_ids, attention_mask, positions, T, group_size, response_pass)
    with checkpointing_off(model):
        return _shared_prompt_logits(model, input_ids, attention_mask, positions, T, group_size, response_pass)


def _one_pass_logits(
    model, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, T: int, G: int, response_pass
) -> Tensor:
    """The ``group_size > 1`` branch of :func:`response_logits` for sdpa models: each group's prompt and
    its G rows in one pass (:mod:`rlvr.models.shared_prefix`). The head sees [P, G·T] positions, which
    are the B rows' T positions in order; a fused head returns them as [B, T, ·] (it reads the
    tokens' shape), full logits are reshaped to [B, T, V]."""
    ids, pos, masks, keep = shared_prefix.layout(input_ids, attention_mask, positions, T, G)
    with shared_prefix.shared_attention(model), response_pass():
        out = model(
            input_ids=ids,
            attention_mask=None,  # the segment masks travel to the attention layers as shared_prefix
            position_ids=pos,
            logits_to_keep=keep,
            use_cache=False,
            shared_prefix=(G, T, masks, None),
        )
    logits = out.logits
    return logits.reshape(input_ids.shape[0], T, *logits.shape[2:])


def _keep(start: int, stop: int, device) -> Tensor:
    """``logits_to_keep`` as the positions [start, stop): the LM head runs on exactly those, and the
    logits come out contiguous (an int keeps the last n, and the causal shift then slices them)."""
    return torch.arange(start, stop, device=device)


def _shared_prompt_logits(
    model, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, T: int, G: int, response_pass
) -> Tensor:
    """The ``group_size > 1`` branch of :func:`response_logits`: the prompt once per group.

    The shared pass covers the prompt but its last token; the per-row pass runs that token and the
    response, so its T logits are the ones needed, in one contiguous [B, T, V] tensor (the last
    prompt token, which predicts response token 0, costs G times instead of once: 1 of the
    prompt's tokens). Only that pass runs inside ``response_pass()``."""
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
    with response_pass():
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
