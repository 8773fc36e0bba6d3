"""One-token attention of a grouped-query model without copying its keys and values.

Why by hand: transformers' sdpa attention folds a one-token query's heads onto their key/value head
(a view: ``[b, heads, 1, d] → [b, kv_heads, groups, d]``, the mask broadcast over the groups) only
when it is not being compiled (``integrations/sdpa_attention.py``, the ``is_torchdynamo_compiling``
branch). Compiled with a mask, as the static decode's step always is, it repeats each layer's keys and
values to every query head (``repeat_kv``) and so writes and reads the attended window ``groups``
times more per token (7× at Qwen2.5-0.5B and 7B), and at 7B holds gigabytes of those copies in the
CUDA-graph pool. :data:`DECODE_ATTENTION` is that fold, registered with transformers' attention
interface, compiled or not; every other call (a prompt's many queries, no groups, a per-head mask,
dropout, a position bias) is transformers' own sdpa attention unchanged.

:func:`gqa_decode` runs a model's layers under it for a block, as :mod:`rlvr.models.shared_prefix`
does for the shared prompt (the layers read the implementation off the one config object at each
call). :func:`attention_traffic` counts, from a step's traced graph, the keys and values its attention
reads and the bytes the repeats copy: ``benchmarks/decode.py`` reports both and the tests hold the
fold to zero copies.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

DECODE_ATTENTION = "rlvr_gqa_decode"
"""The attention implementation the static decode's step runs under (:func:`gqa_decode_attention`)."""


def gqa_decode_attention(
    module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs
) -> tuple[Tensor, None]:
    """transformers' sdpa attention, with a one-token query of a grouped-query layer folded onto its
    key/value heads (no ``repeat_kv``) whether compiled or not. Returns ``[b, 1, heads, d]`` as
    ``sdpa_attention_forward`` does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    plain = not any(kwargs.get(k) for k in ("dropout", "position_bias", "softcap", "output_attentions"))
    if query.shape[2] != 1 or groups == 1 or not shared_mask or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    b, heads, _, d = query.shape
    folded = query.reshape(b, heads // groups, groups, d)  # head h = kv head h // groups: a view
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling")
    )
    return out.reshape(b, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def gqa_decode(model):
    """Runs ``model``'s sdpa attention layers under :data:`DECODE_ATTENTION` for the block; other
    implementations are left as they are. Re-entrant. Only for steps that pass their own 4-D mask:
    transformers builds no mask for an implementation it does not know."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def attention_traffic(graph: torch.fx.GraphModule) -> dict:
    """What one traced step's attention moves, from the shapes dynamo recorded (symbolic sizes at their hints).

    Returns:
        ``attention_kv_bytes``: the keys and values the attention calls read; ``kv_copy_bytes``: the
        bytes the repeats of keys and values write and read again (an expanded 5-D view made
        contiguous: ``repeat_kv``); ``kv_copies``: how many such copies; ``attention_calls``; ``batch``
        and ``window``: the rows and key positions the step was traced at (the bytes scale with both).
    """
    out = {"attention_kv_bytes": 0, "kv_copy_bytes": 0, "kv_copies": 0, "attention_calls": 0}
    for node in graph.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if node.target is torch.nn.functional.scaled_dot_product_attention:
            out["attention_calls"] += 1
            key = _value(node.args[1])
            out["batch"], out["window"] = _hint(key.shape[0]), _hint(key.shape[2])
            out["attention_kv_bytes"] += sum(_bytes(a) for a in node.args[1:3])
        elif node.target in ("reshape", torch.reshape) and _ndim(node.args[0]) == 5:
            out["kv_copies"] += 1
            out["kv_copy_bytes"] += 2 * _bytes(node)  # written, then read by the attention
    return out


def _value(node):
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _ndim(node) -> int:
    v = _value(node)
    return v.dim() if isinstance(v, Tensor) else 0


def _bytes(node) -> int:
    v = _value(node)
    if not isinstance(v, Tensor):
        return 0
    n = 1
    for s in v.shape:
        n *= _hint(s)
    return n * v.element_size()


def _hint(s) -> int:
    """A size's value in the traced call: a symbolic size's hint (no guard added)."""
    if not isinstance(s, torch.SymInt):
        return int(s)
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint  # torch >= 2.10
    except ImportError:
        return int(s.node.hint)
    return optimization_hint(s)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, gqa_decode_attention)


_register()
