"""A GRPO group's prompt and its G responses in one forward pass, each response attending to the
prompt and to itself.

Why: the trainer's passes over a group (the update, the old-policy and reference log-probs) would
otherwise run the prompt once per row, or (the two-pass shared prompt) once per group in a pass of
its own whose key/value cache the responses' pass reads. The second pass doubles the model's fixed
per-pass work (every linear runs twice, on two smaller products; every weight gets two gradient
contributions that autograd then adds), and FSDP2 cannot run it (two forwards per backward). One
pass computes the same thing with every linear run once, on all of the group's tokens.

How: each group becomes one row of the pass, ``[prompt (left-padded) | response 1 | … | response G]``,
with the position ids the rows had (each response continues from the prompt). transformers' attention
layers run under :data:`SHARED_ATTENTION`, which splits each layer's queries, keys and values by
segment: the prompt attends to itself causally, and the G responses are stacked as a batch of G whose
keys are the prompt's (expanded, not copied per row until the concatenation) followed by their own,
under a bottom-right causal mask. Left padding in the prompt is masked out as a key (a padding query
attends to itself, so no row of scores is empty). Everything is on the device: the masks come from the
attention mask tensor, and no host read is needed.

Three kernels compute that attention. On a CPU, where the scores are small (:data:`MATH_SCORES_MAX`),
:func:`_grouped_attention` writes it as a few batched products and a softmax: the G
segments' queries meet the prompt's keys in one product (no per-row copy of the prompt's keys), the
query heads of a key/value head are grouped instead of the keys being repeated, and autograd's
backward of those products replaces PyTorch's CPU flash-attention backward, which is slow on these
short blocks (and slower still on bf16 inputs). Rows without segment padding (``unpadded``) whose
padding would be most of that kernel's work, or that it does not take, go segment by segment
(:func:`_segment_attention`, the same grouped products on each segment's real length). Elsewhere both
parts are transformers' own ``sdpa_attention_forward``.

Exact: the logits and gradients equal the per-row pass to float rounding
(``tests/models/test_shared_prefix.py``).

Applies to models whose attention is sdpa with no sliding-window layers (:func:`one_pass_applies`);
others keep the two-pass shared prompt (:func:`rlvr.models.forward.response_logits`).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import Tensor

SHARED_ATTENTION = "rlvr_shared_prefix"
MATH_SCORES_MAX = {torch.float32: 1 << 20, "low": 5 << 19}
"""Most attention scores per layer (one group's heads × queries × keys) for which a CPU pass takes
:func:`_grouped_attention` rather than sdpa, by the inputs' dtype (``"low"``: bf16/fp16, whose flash
backward is slower). Above these the math path's float32 scores cost more than flash attention's
blocked loop saves (``benchmarks/NOTES.md``), and they would also be kept for the backward."""
"""The attention implementation the one-pass shared prompt runs under (:func:`_shared_prefix_attention`)."""


def one_pass_applies(model) -> bool:
    """Whether ``model``'s attention can run the one-pass shared prompt: sdpa (or already under
    :data:`SHARED_ATTENTION`), no sliding-window layers."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or [])
    return impl in ("sdpa", SHARED_ATTENTION) and not sliding and not getattr(config, "sliding_window", None)


@contextlib.contextmanager
def shared_attention(model):
    """Run ``model``'s attention layers under :data:`SHARED_ATTENTION` for the block (they read the
    implementation off the one config object at each call). Re-entrant."""
    config = model.config
    if config._attn_implementation == SHARED_ATTENTION:
        yield
        return
    prev, config._attn_implementation = config._attn_implementation, SHARED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = prev


def layout(
    input_ids: Tensor, attention_mask: Tensor, positions: Tensor, T: int, G: int
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor], Tensor]:
    """The one-pass inputs of a row micro-batch whose consecutive runs of G rows share a prompt.

    The prompt part is each group's first ``Lp = L - T - 1`` positions (the prompt but its last
    token, left padding included); each row's segment is its last prompt token and its response but
    the last token (T positions, whose outputs predict the T response tokens).

    Args:
        input_ids, attention_mask, positions: [B, L], L = prompt_len + T, B = P * G.
        T: response positions.
        G: rows per group.

    Returns:
        (input_ids [P, Lp + G·T], position_ids [P, Lp + G·T], (prompt_mask [P, 1, Lp, Lp] bool,
        segment_mask [P·G, 1, T, Lp + T] bool), keep [G·T]: the positions whose outputs predict the
        responses, row by row).
    """
    B, L = input_ids.shape
    P, Lp = B // G, L - T - 1
    device = input_ids.device
    seg = slice(Lp, L - 1)
    ids = torch.cat([input_ids[::G, :Lp], input_ids[:, seg].reshape(P, G * T)], 1)
    pos = torch.cat([positions[::G, :Lp], positions[:, seg].reshape(P, G * T)], 1)
    real = attention_mask[::G, :Lp].bool()  # [P, Lp] prompt keys that are not padding
    i = torch.arange(Lp, device=device)
    causal = i[:, None] >= i[None, :]
    prompt_mask = (causal & real[:, None, :]) | torch.eye(Lp, dtype=torch.bool, device=device)  # [P, Lp, Lp]
    t = torch.arange(T, device=device)
    own = t[:, None] >= t[None, :]  # [T, T] causal within the segment
    seg_keys = torch.cat([real.repeat_interleave(G, 0)[:, None, :].expand(B, T, Lp), own.expand(B, T, T)], 2)
    keep = torch.arange(Lp, Lp + G * T, device=device)
    return ids, pos, (prompt_mask[:, None], seg_keys[:, None]), keep


def unpadded_span(lengths: tuple[int, ...], T: int, G: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each row's response positions in an unpadded pass (1 to T) and each group's sum of them (the
    response positions its part of the unpadded row holds)."""
    host = tuple(min(max(1, n), T) for n in lengths)
    return host, tuple(sum(host[i : i + G]) for i in range(0, len(host), G))


class Unpadded(NamedTuple):
    """The indices of an unpadded pass (:func:`unpadded_index`), built once for all its layers."""

    into: Tensor
    """[P·(Lp + G·T)]: each position of :func:`layout`'s padded rows, as a position of the unpadded row."""
    back: Tensor
    """[N]: each position of the unpadded row, as a flat position of the padded rows."""
    keep: Tensor
    """[R]: the unpadded row's response positions (the LM head's), R = Σ l."""
    tokens: Tensor
    """[R]: each of those positions' place in the responses' [P, G·T] layout (its token)."""
    unpad: Tensor
    """[P·G, T]: each row's response positions among the R head outputs (padding repeats the last)."""


def unpadded_index(lengths: Tensor, T: int, Lp: int, sums: tuple[int, ...]) -> Unpadded:
    """Where each position goes when a one-pass micro-batch drops its segments' padding.

    Unpadded, the micro-batch is one row of its groups end to end, each ``[prompt | l_1 positions |
    … | l_G positions]``: the linears, norms and the LM head run on real positions only, and a group
    with shorter answers takes fewer positions than another (no group is padded to the longest).
    The attention still runs on the padded ``[P, Lp + G·T]`` rows (the gathered queries, keys and
    values; :func:`_core_attention` on shorter ones), where a segment's padding comes after its real
    positions, so the causal mask keeps it from every real query; its outputs are gathered back. A
    padding position is filled with its segment's last real position: it feeds only padding queries
    and outputs, which nothing reads, so values and gradients are those of the padded pass.

    Everything is computed on the lengths' device (no host read): ``sums``, the host copy of each
    group's Σ l (:func:`unpadded_span`), gives the sizes.

    Args:
        lengths: [P, G] real positions of each segment, 1 ≤ l ≤ T (on the pass's device).
        T: positions per padded segment.
        Lp: the prompt part's positions.
        sums: each group's Σ l, on the host.
    """
    P, G = lengths.shape
    dev = lengths.device
    ends = lengths.cumsum(1)
    starts = ends - lengths  # [P, G]: each segment's first position among its group's responses
    group = ends[:, -1]  # each group's Σ l, as ``sums`` holds it on the host (no host-to-device copy)
    resp_end = group.cumsum(0)
    resp_start = resp_end - group  # [P]: each group's first response among all R
    row_start = resp_start + torch.arange(P, device=dev) * Lp  # [P]: each group's first position
    t = torch.arange(T, device=dev)
    seg = starts[..., None] + torch.minimum(t, lengths[..., None] - 1)  # [P, G, T] within its group's responses
    prompt = torch.arange(Lp, device=dev)
    into = torch.cat([row_start[:, None] + prompt, row_start[:, None] + Lp + seg.reshape(P, G * T)], 1).flatten()
    unpad = (resp_start[:, None, None] + seg).reshape(P * G, T)
    s = torch.arange(P * Lp + sum(sums), device=dev)
    p = torch.searchsorted(resp_end + (torch.arange(P, device=dev) + 1) * Lp, s, right=True)  # each position's group
    local = s - row_start[p]
    r = (local - Lp).clamp(min=0)  # its place among its group's responses
    g = torch.searchsorted(ends[p], r[:, None], right=True)[:, 0].clamp(max=G - 1)
    padded = torch.where(local < Lp, local, Lp + g * T + r - starts[p, g])
    back = p * (Lp + G * T) + padded
    k = torch.arange(sum(sums), device=dev)
    pk = torch.searchsorted(resp_end, k, right=True)
    keep = k + (pk + 1) * Lp
    return Unpadded(into, back, keep, back[keep] - (pk + 1) * Lp, unpad)


def _rows(x: Tensor, flat: Tensor, rows: int) -> Tensor:
    """``x`` ([P, L, h, d]) at the flat positions ``flat`` of its P·L, as ``rows`` rows [rows, n, h, d]:
    one ``index_select`` (one ``index_add`` back), where a slice, a gather per row and their
    concatenation took ten operators a direction."""
    P, L, h, d = x.shape
    return x.reshape(P * L, h * d).index_select(0, flat).view(rows, -1, h, d)


def _shared_prefix_attention(module, query, key, value, attention_mask, *, shared_prefix: tuple, **kwargs):
    """Attention of one-pass rows ``[prompt | G segments of T]`` ([P, heads, Lp + G·T, d] queries, keys,
    values): the prompt by itself, the segments as a batch of P·G against the prompt's keys and
    their own; the outputs joined back to [P, Lp + G·T, heads, d], as ``sdpa_attention_forward``
    returns them. ``shared_prefix`` is (G, T, masks, unpadded): with ``unpadded`` = (into, back,
    lengths, core) (:class:`Unpadded`'s indices, the segments' host lengths and a :class:`Core` or
    None) the groups come end to end in one row without segment padding ([1, heads, N, d]) and
    return to [1, N, heads, d]: on a CPU segment by segment (:func:`_segment_attention`) where
    :func:`_by_segment` says so, else padded to the core's length with the longer segments' tails
    apart (:func:`_core_attention`), else padded to T."""
    G, T, masks, unpadded = shared_prefix
    if _kernel_applies(module, query, key, kwargs):
        P, Lp = masks[0].shape[0], masks[0].shape[-1]
        lengths = (T,) * (P * G) if unpadded is None else unpadded[2]
        real = masks[1][::G, 0, 0, :Lp]  # [P, Lp]: the prompt keys that are not padding
        scale = query.shape[-1] ** -0.5 if kwargs.get("scaling") is None else kwargs["scaling"]
        return _KERNEL[0](query, key, value, real, lengths, scale), None
    if unpadded is None:
        return _padded_attention(module, query, key, value, G, T, masks, kwargs)
    into, back, lengths, core = unpadded
    Lp, P = masks[0].shape[-1], len(lengths) // G
    if _by_segment(module, query, key, Lp, G, core.T if core is not None else T, kwargs, lengths):
        return _segment_attention(query, key, value, masks, lengths, kwargs), None
    if core is not None and _math_applies(module, query, key, Lp, G, core.T, kwargs):
        return _core_attention(query, key, value, masks, core, G, kwargs.get("scaling")), None
    query, key, value = (_rows(x.transpose(1, 2), into, P).transpose(1, 2) for x in (query, key, value))
    out = _padded_attention(module, query, key, value, G, T, masks, kwargs)[0]  # [P, Lp + G*T, heads, d]
    return _rows(out, back, 1), None


_KERNEL: list = [None]
"""The compiled kernel the trainer installed (:func:`use_kernel`), or None."""


def use_kernel(kernel) -> None:
    """Install ``kernel`` (or None to remove it) for the CPU passes under bf16 autocast that
    :func:`_kernel_applies` takes: ``kernel(query, key, value, real, lengths, scale)`` with ``query``
    [B, h, L, d], ``key`` and ``value`` [B, kv, L, d] (B·L positions: the groups end to end, each its
    prompt of Lp and its segments of ``lengths``), ``real`` [P, Lp] bool (the prompt keys that are
    not padding) returns the attention as [B, L, h, d] in bf16, with gradients
    (:func:`rlvr.cpu.update_attention.attention`). Set by the trainer (``train.fused_attention``):
    this package cannot import :mod:`rlvr.cpu`, which builds on it."""
    _KERNEL[0] = kernel


def kernel_shape(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the compiled kernel has this attention shape: head sizes that are multiples of 64 up to
    256, and at most 16 query heads per key/value head, evenly grouped."""
    grouped = kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 16
    return grouped and head_dim % 64 == 0 and 0 < head_dim <= 256


def _kernel_applies(module, query: Tensor, key: Tensor, kwargs: dict) -> bool:
    """Whether the installed kernel (:func:`use_kernel`) computes this call: a plain CPU call under bf16
    autocast without dropout, with head sizes and a head grouping the kernel has."""
    if _KERNEL[0] is None or not _plain_cpu_call(query, key, kwargs) or (module.training and kwargs.get("dropout")):
        return False
    bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    return bf16 and kernel_shape(query.shape[1], key.shape[1], query.shape[-1])


class Core(NamedTuple):
    """An unpadded pass's attention padded to ``T`` (< the pass's longest segment) rather than to the
    longest (:func:`core_rows`): ``into``/``back`` move the unpadded row into that layout and out (as
    :class:`Unpadded`'s do), ``tail_rows`` are the unpadded positions of the queries past ``T`` of the
    longer segments, and ``tails`` those segments: (group, segment, the group's first position, the
    segment's first position, its length)."""

    T: int
    into: Tensor
    back: Tensor
    tail_rows: Tensor
    tails: tuple[tuple[int, int, int, int, int], ...]


CORE_GAIN = 0.9
"""The most a core length's modeled cost may be, as a share of the cheaper of padding to T and going
by segment, for the core kernel to run: its gathers into and out of the core layout and its tails
cost more than :data:`SEGMENT_COST` counts (on ``vs_trl.py``'s bf16 shape a modeled 2 % gain over the
segments ran 3.6 % slower; one long answer among the quickstart's, modeled at 46 % of the padded
cost, ran 9.5 % faster; ``benchmarks/NOTES.md``)."""


def core_length(Lp: int, T: int, lengths: tuple[int, ...], P: int, low: bool) -> int:
    """The length the grouped kernel of an unpadded pass pads its segments to: T, or a shorter one
    where padding every segment to a few long ones costs more than attending their queries past it
    apart (:func:`_core_attention`; :data:`SEGMENT_COST` prices each such tail as a segment of
    :func:`_segment_attention`). The cheapest wins, the longest of equal cost, and a shorter one only
    where it costs at most :data:`CORE_GAIN` of the cheaper of T and the per-segment kernel."""
    cost = {c: _padded_cost(Lp, c, lengths, P, low) for c in {*lengths, T}}
    c = min(sorted(cost, reverse=True), key=cost.get)
    return c if cost[c] <= CORE_GAIN * min(cost[T], _segments_cost(Lp, lengths, P, low)) else T


def core_rows(lengths: tuple[int, ...], Lp: int, G: int, c: int, device) -> Core:
    """The :class:`Core` of an unpadded pass whose attention pads its segments to ``c``.

    A segment's first ``c`` queries attend (causally) to its first ``c`` positions and the prompt,
    so the padded kernel computes them exactly from each segment's first ``c`` positions; a longer
    segment's later queries are attended apart. Built on the host from the host lengths (a CPU
    pass's few thousand indices; no device read), once per pass for all its layers.

    Args:
        lengths: each row's real segment length (1 ≤ l ≤ T), P·G of them.
        Lp: the prompt part's positions.
        c: the core length (< the longest length).
    """
    into, back, tail_rows, tails = [], [], [], []
    row = 0  # the group's first position in the unpadded row
    for p in range(len(lengths) // G):
        n = lengths[p * G : (p + 1) * G]
        starts = [row + Lp + sum(n[:g]) for g in range(G)]
        into += [*range(row, row + Lp), *(starts[g] + min(t, n[g] - 1) for g in range(G) for t in range(c))]
        base = p * (Lp + G * c)  # the group's first position in the core layout
        back += [*range(base, base + Lp), *(base + Lp + g * c + min(t, c - 1) for g in range(G) for t in range(n[g]))]
        for g in range(G):
            if n[g] > c:
                tails.append((p, g, row, starts[g], n[g]))
                tail_rows += range(starts[g] + c, starts[g] + n[g])
        row += Lp + sum(n)
    index = (torch.tensor(x, dtype=torch.long, device=device) for x in (into, back, tail_rows))
    return Core(c, *index, tuple(tails))


def _core_attention(query: Tensor, key: Tensor, value: Tensor, masks, core: Core, G: int, scale) -> Tensor:
    """The shared-prefix attention of an unpadded row with the grouped kernel on segments padded to
    ``core.T`` and each longer segment's queries past it (its tail) attended apart, against the
    prompt and that segment's positions up to the query (:func:`_attend`).

    Why: one long response in a pass (a sample that ran to the token limit among short ones) would
    pad every segment to its length, and the padded kernel's scores grow with the square of it; its
    tail alone costs a few small products. Exact: the same scores, masks, softmax and dtypes as the
    padded kernel on each query.

    Args:
        query: [1, h, N, d]; key, value: [1, h_kv, N, d], the groups and their segments end to end.
        masks: :func:`layout`'s (prompt_mask, segment mask [P·G, 1, T, Lp + T]), T ≥ every length.

    Returns:
        [1, N, h, d] as :func:`_grouped_attention` returns it.
    """
    prompt_mask, seg_mask = masks
    _, h, N, d = query.shape
    P, Lp, c = prompt_mask.shape[0], prompt_mask.shape[-1], core.T
    scale = d**-0.5 if scale is None else scale
    q, k, v = (_rows(x.transpose(1, 2), core.into, P).transpose(1, 2) for x in (query, key, value))
    out = _grouped_attention(q, k, v, prompt_mask, seg_mask[:, :, :c, : Lp + c], G, c, scale)
    out = _rows(out, core.back, 1)  # [1, N, h, d]; the tails' rows are replaced below
    if not core.tails:
        return out
    dt, _ = _products_dtype(query)
    parts = []
    for p, g, row, a, n in core.tails:
        keys = torch.cat([key[0, :, row : row + Lp], key[0, :, a : a + n]], 1).to(dt)
        values = torch.cat([value[0, :, row : row + Lp], value[0, :, a : a + n]], 1).to(dt)
        mask = seg_mask[p * G + g, 0, c:n]
        mask = torch.cat([mask[:, :Lp], mask[:, Lp : Lp + n]], 1)
        q = (query[0, :, a + c : a + n].float() * scale).to(dt)
        parts.append(_attend(q, keys, values, mask, 0.0).transpose(0, 1))  # [n - c, h, d]
    flat = out.reshape(N, h, d).index_copy(0, core.tail_rows, torch.cat(parts).to(out.dtype))
    return flat.view(1, N, h, d)


def _padded_attention(module, query, key, value, G: int, T: int, masks: tuple[Tensor, Tensor], kwargs: dict):
    """:func:`_shared_prefix_attention` on rows whose segments are padded to T."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    prompt_mask, seg_mask = masks
    P, Lp = query.shape[0], query.shape[2] - G * T
    if _math_applies(module, query, key, Lp, G, T, kwargs):
        scale = kwargs.get("scaling")
        return _grouped_attention(query, key, value, prompt_mask, seg_mask, G, T, scale), None

    def rows(x: Tensor) -> Tensor:  # [P, h, G*T, d] -> [P*G, h, T, d]
        h, d = x.shape[1], x.shape[3]
        return x[:, :, Lp:].reshape(P, h, G, T, d).transpose(1, 2).reshape(P * G, h, T, d)

    def with_prompt(x: Tensor) -> Tensor:  # keys or values: [P*G, h, Lp + T, d]
        h, d = x.shape[1], x.shape[3]
        prompt = x[:, None, :, :Lp].expand(P, G, h, Lp, d).reshape(P * G, h, Lp, d)
        return torch.cat([prompt, rows(x)], 2)

    kw = dict(kwargs, is_causal=False)
    head = sdpa_attention_forward(module, query[:, :, :Lp], key[:, :, :Lp], value[:, :, :Lp], prompt_mask, **kw)[0]
    tail = sdpa_attention_forward(module, rows(query), with_prompt(key), with_prompt(value), seg_mask, **kw)[0]
    return torch.cat([head, tail.reshape(P, G * T, *tail.shape[2:])], 1), None  # [P, Lp + G*T, heads, d]


_SDPA_ONLY = ("softcap", "s_aux", "sinks", "sliding_window", "position_bias")


def _by_segment(module, query: Tensor, key: Tensor, Lp: int, G: int, T: int, kwargs: dict, lengths) -> bool:
    """Whether an unpadded CPU pass runs its segments' attention one segment at a time
    (:func:`_segment_attention`): a plain CPU call (:func:`_plain_cpu_call`) that the grouped kernel
    does not take, or where the segments' padding to T (the pass's core length, :func:`core_length`)
    costs that kernel more than the per-segment calls' own overhead (:func:`_segments_cheaper`)."""
    if not _plain_cpu_call(query, key, kwargs):
        return False
    if not _math_applies(module, query, key, Lp, G, T, kwargs):
        return True
    low = query.dtype != torch.float32 or torch.is_autocast_enabled(query.device.type)
    return _segments_cheaper(Lp, T, lengths, len(lengths) // G, low)


SEGMENT_COST = {torch.float32: (0.55, 3000), "low": (0.55, 9000)}
"""The per-segment kernel's cost in the grouped kernel's units (one score position of its padded
segments, all heads), by the inputs' dtype as :data:`MATH_SCORES_MAX` (``"low"``: bf16/fp16 or under
autocast): each real score position costs 0.55 of one, and each segment a fixed cost (its few small
operators, forward and backward, whatever its length), three times float32's in bf16, where the padded
kernel is faster. Fitted on a 2-core AVX-512 CPU to the built-in model's attention
(``benchmarks/NOTES.md``)."""


def _segments_cheaper(Lp: int, T: int, lengths: tuple[int, ...], P: int, low: bool) -> bool:
    """Whether :func:`_segment_attention` costs less than :func:`_grouped_attention` on the same rows
    padded to T (:data:`SEGMENT_COST`, ``low``: bf16/fp16 products), the longer segments' tails apart
    (:func:`_core_attention`): long, uneven responses in few groups, where the padding is most of the
    padded kernel's scores. Both also attend each group's prompt to itself."""
    return _segments_cost(Lp, lengths, P, low) < _padded_cost(Lp, T, lengths, P, low)


def _segments_cost(Lp: int, lengths: tuple[int, ...], P: int, low: bool) -> float:
    """:func:`_segment_attention`'s cost in the grouped kernel's units (:data:`SEGMENT_COST`)."""
    rate, fixed = SEGMENT_COST["low" if low else torch.float32]
    return rate * (P * Lp * Lp + sum(n * (Lp + n) for n in lengths)) + fixed * len(lengths)


def _padded_cost(Lp: int, c: int, lengths: tuple[int, ...], P: int, low: bool) -> float:
    """The grouped kernel's cost on segments padded to ``c``, in its units (:data:`SEGMENT_COST`), with
    each longer segment's tail priced as a segment of :func:`_segment_attention`."""
    rate, fixed = SEGMENT_COST["low" if low else torch.float32]
    tails = sum(fixed + rate * (n - c) * (Lp + n) for n in lengths if n > c)
    return P * Lp * Lp + len(lengths) * c * (Lp + c) + tails


def _plain_cpu_call(query: Tensor, key: Tensor, kwargs: dict) -> bool:
    """A CPU call whose query heads group evenly over the key/value heads, with none of sdpa's extras."""
    extras = any(kwargs.get(k) is not None for k in _SDPA_ONLY)
    return query.device.type == "cpu" and not query.shape[1] % key.shape[1] and not extras


def _segment_attention(query: Tensor, key: Tensor, value: Tensor, masks, lengths: tuple[int, ...], kwargs: dict):
    """The shared-prefix attention of unpadded rows, segment by segment, each as grouped products.

    Why: on a CPU, flash attention's cost follows its padded blocks, so a pass padded to its longest
    response pays for every shorter one; segment by segment each attends to exactly the prompt's keys
    and its own. Each call is :func:`_grouped_attention`'s form rather than sdpa's: a key/value
    head's r query heads are one batch of r·n queries against its keys, where sdpa with
    ``enable_gqa`` on a CPU takes its math path and repeats the keys and values r times (and sums
    their gradients back). The rows are split once (one concatenation in the backward, not a
    zero-filled full-size gradient per segment). The masks are :func:`layout`'s, cut to each
    segment's length, as additive biases of the scores' dtype; under bf16 autocast the products run
    in bf16 and the probabilities are bf16, as in :func:`_grouped_attention` (the inputs cast once,
    the queries scaled first; the softmax computed in float32, :class:`_LowSoftmax`), and the output
    is bf16.

    Args:
        query: [1, h, N, d]; key, value: [1, h_kv, N, d], the groups and their segments end to end.
        masks: (prompt_mask [P, 1, Lp, Lp], seg_mask [P·G, 1, T, Lp + T]) of :func:`layout`.
        lengths: each row's segment length (1 ≤ · ≤ T), P·G of them.
        kwargs: the attention call's; ``scaling`` and, in training, ``dropout`` (on the probabilities,
            as sdpa's ``dropout_p``) are used.

    Returns:
        [1, N, h, d] in the query's dtype (computed in float32) or autocast's.
    """
    prompt_mask, seg_mask = masks
    P, Lp = prompt_mask.shape[0], prompt_mask.shape[-1]
    G, d = len(lengths) // P, query.shape[-1]
    scale = kwargs.get("scaling")
    scale = d**-0.5 if scale is None else scale
    dropout = kwargs.get("dropout") or 0.0
    dt, out_dtype = _products_dtype(query)
    query, key, value = (query[0].float() * scale).to(dt), key[0].to(dt), value[0].to(dt)  # each cast once
    parts = [n for p in range(P) for n in (Lp, *lengths[p * G : (p + 1) * G])]
    qs, ks, vs = (x.split(parts, 1) for x in (query, key, value))  # [h or h_kv, part, d] each
    outs = []
    for p in range(P):
        at = p * (G + 1)  # the group's prompt part; its segments follow
        outs.append(_attend(qs[at], ks[at], vs[at], prompt_mask[p, 0], dropout))
        for g in range(G):
            n = lengths[p * G + g]
            keys, values = torch.cat([ks[at], ks[at + 1 + g]], 1), torch.cat([vs[at], vs[at + 1 + g]], 1)
            outs.append(_attend(qs[at + 1 + g], keys, values, seg_mask[p * G + g, 0, :n, : Lp + n], dropout))
    return torch.cat(outs, 1).transpose(0, 1)[None].to(out_dtype).contiguous()


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float) -> Tensor:
    """softmax(q kᵀ + bias(mask)) v for one segment, query heads grouped by key/value head.

    Args:
        q: [h, n, d], scaled; k, v: [h_kv, m, d]; mask: [n, m] bool (True = attend).

    Returns:
        [h, n, d] in the products' dtype.
    """
    h, n, d = q.shape
    kv, m = k.shape[0], k.shape[1]
    r = h // kv  # query head i·r + j reads key/value head i
    s = q.reshape(kv, r * n, d) @ k.transpose(-1, -2)  # [kv, r·n, m]
    probs = _masked_softmax(s.view(kv, r, n, m), _bias(mask, s.dtype))
    if dropout:
        probs = torch.nn.functional.dropout(probs, dropout)
    return (probs.view(kv, r * n, m) @ v).view(h, n, d)


def _math_applies(module, query: Tensor, key: Tensor, Lp: int, G: int, T: int, kwargs: dict) -> bool:
    """Whether :func:`_grouped_attention` computes this call: a CPU pass without dropout or
    attention extras, grouped heads that divide evenly, and at most :data:`MATH_SCORES_MAX` scores."""
    if not _plain_cpu_call(query, key, kwargs) or (module.training and kwargs.get("dropout", 0.0)):
        return False
    scores = query.shape[1] * (Lp * Lp + G * T * (Lp + T))
    return scores <= MATH_SCORES_MAX[torch.float32 if query.dtype == torch.float32 else "low"]


def _grouped_attention(
    query: Tensor, key: Tensor, value: Tensor, prompt_mask: Tensor, seg_mask: Tensor, G: int, T: int, scale
) -> Tensor:
    """The shared-prefix attention as batched products and a softmax, in float32 whatever the inputs'
    dtype; under bf16 autocast in bf16 (:func:`_products_dtype`: the queries scaled in float32, then
    each input cast once), the probabilities included (computed in float32 and rounded once,
    :class:`_LowSoftmax`, which keeps only the bf16 ones for the backward), with a bf16 output as
    sdpa's.

    Written out rather than left to sdpa because on a CPU, for the short blocks of a group (a prompt of
    a few hundred tokens, segments of tens), PyTorch's flash-attention backward costs more than
    these few products and their autograd backward; :func:`_math_applies` keeps larger passes on sdpa.
    Each key/value head's r query heads are one matrix of L·r query rows, in (position, head) order,
    so every product is a plain batched one over (P, kv): no repeated keys, and no key broadcast
    over the r heads (whose backward is a sum of the keys' gradients over them, and whose products
    copy the keys r times). All G segments' queries take their prompt scores in one product with
    the prompt's keys. The scores are the largest tensors here, so each costs one pass over them a
    direction: the scale goes on the queries, the masks are added as a bias (no backward of their
    own), and the probabilities are split, not sliced (whose backward would zero-fill two
    score-sized buffers); a bf16 softmax runs in float32 (:class:`_LowSoftmax`).

    Args:
        query: [P, h, Lp + G·T, d]; key, value: [P, h_kv, Lp + G·T, d].
        prompt_mask: [P, 1, Lp, Lp] bool; seg_mask: [P·G, 1, T, Lp + T] bool (:func:`layout`).

    Returns:
        [P, Lp + G·T, h, d] in the query's dtype (in float32) or autocast's.
    """
    P, h, L, d = query.shape
    kv = key.shape[1]
    r, Lp, GT = h // kv, L - G * T, G * T
    scale = d**-0.5 if scale is None else scale
    dt, out_dtype = _products_dtype(query)
    rows = torch.contiguous_format
    # query head i·r + j reads key/value head i: its r heads' queries are one [L·r, d] matrix, rows in
    # (position, head) order, so every product is a plain batched one over (P, kv)
    q = (query.float() * scale).view(P, kv, r, L, d).transpose(2, 3)  # [P, kv, L, r, d]
    q = q.to(dt, memory_format=rows).reshape(P, kv, L * r, d)  # cast once (in float32 the reshape copies)
    k, v = key.to(dt, memory_format=rows), value.to(dt, memory_format=rows)  # [P, kv, L, d]
    qp, qs = q.split([Lp * r, GT * r], 2)
    kp, ks = k.split([Lp, GT], 2)
    vp, vs = v.split([Lp, GT], 2)
    # the prompt by itself
    s = qp @ kp.transpose(-1, -2)  # [P, kv, Lp·r, Lp]
    probs = _masked_softmax(s.view(P, kv, Lp, r, Lp), _bias(prompt_mask[..., None, :], s.dtype))
    head = probs.view(P, kv, Lp * r, Lp) @ vp
    # the segments: their prompt keys in one product, their own keys segment by segment
    ks, vs = ks.reshape(P, kv, G, T, d), vs.reshape(P, kv, G, T, d)
    own = qs.view(P, kv, G, T * r, d) @ ks.transpose(-1, -2)  # [P, kv, G, T·r, T]
    s = torch.cat([qs @ kp.transpose(-1, -2), own.view(P, kv, GT * r, T)], -1)  # [P, kv, G·T·r, Lp + T]
    bias = _bias(seg_mask.reshape(P, 1, GT, 1, Lp + T), s.dtype)
    probs = _masked_softmax(s.view(P, kv, GT, r, Lp + T), bias).view(P, kv, GT * r, Lp + T)
    to_prompt, to_own = probs.split([Lp, T], -1)
    tail = to_prompt @ vp + (to_own.reshape(P, kv, G, T * r, T) @ vs).view(P, kv, GT * r, d)
    out = torch.cat([head, tail], 2).view(P, kv, L, r, d).permute(0, 2, 1, 3, 4)  # [P, L, kv, r, d]
    return out.to(out_dtype).reshape(P, L, h, d)


def _products_dtype(x: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """The dtype the attention kernels' products run in and the one they return, for inputs like
    ``x``: autocast's for both where it is on for ``x``'s device (the inputs cast once by the kernel
    rather than by every product, each of which would cast them again), else float32 and ``x``'s."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dt = torch.get_autocast_dtype(device)
        return dt, dt
    return torch.float32, x.dtype


def _masked_softmax(scores: Tensor, bias: Tensor) -> Tensor:
    """softmax(scores + bias) over the last dimension, in the scores' dtype; low-precision scores
    through :class:`_LowSoftmax`."""
    if scores.dtype == torch.float32:
        return (scores + bias).softmax(-1)
    return _LowSoftmax.apply(scores, bias)


class _LowSoftmax(torch.autograd.Function):
    """softmax(scores + bias) of bf16/fp16 scores, computed in float32 and rounded once to the
    scores' dtype; the backward is PyTorch's softmax backward on those probabilities.

    Written by hand because PyTorch's bf16 softmax forward on a CPU takes a slow path for the last
    ``n mod 32`` entries of each row: on rows of 126 or 147 keys (a prompt's length, a prompt and
    a segment) it costs twice its float32 forward, or more; at multiples of 32 the two are equal
    (``benchmarks/NOTES.md``). The probabilities saved for the backward stay in the low dtype, as
    the plain softmax's (a float32 softmax under autograd would keep float32 ones)."""

    @staticmethod
    def forward(ctx, scores: Tensor, bias: Tensor) -> Tensor:
        probs = torch.softmax(scores + bias, -1, dtype=torch.float32).to(scores.dtype)
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad: Tensor):
        (probs,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, probs, -1, probs.dtype), None


def _bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``mask`` (True = attend) as an additive score bias of ``dtype``: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SHARED_ATTENTION, _shared_prefix_attention)


_register()
