"""A lean decode step for Llama-family models on packed weights, with the group's prompt attended once.

Why: after packing (:mod:`rlvr.cpu.packed`) the Hugging Face decode step of a small model spends a
large share of its time outside the products: about 80 small operations a layer (norms, rotary,
cache bookkeeping, mask building, module calls) and SDPA, where each of a group's G rows reads its
own copy of the shared prompt's keys and values (``benchmarks/NOTES.md``, "lean decode").

How: :class:`LeanDecoder` runs one decode step of a float32 ``LlamaForCausalLM`` or
``Qwen2ForCausalLM`` on the packed copies of its weights in about 30 operations a layer:

- q, k and v in one product of a [q; k; v] packed matrix; the residual adds, the SiLU and the
  gate's product fused into oneDNN's post-ops;
- rotary on the query and key heads at once, the attention's scaling folded in;
- attention on a :class:`CascadeCache`: the prompt's keys and values as the prefill computed
  them, once per prompt (a group's G·(heads per KV head) query rows multiply them in one
  product), each row's response keys and values in buffers reserved for the whole response, and
  one softmax over the concatenation of both parts' scores: the same softmax over the same
  positions as attention over the row's prompt + response cache;
- where the compiled kernels load and have the shape (head_dim 64 or 128, up to 8 query heads a
  key/value head), the whole step in one call of kernels compiled for this CPU at first use
  (:mod:`rlvr.cpu.kernels`): norms, products, rotary, cache write, attention, SiLU and residuals
  in one OpenMP region, after :func:`kernel_self_check` has compared one compiled step with the
  torch-operations step on a tiny model of the same head layout; elsewhere the same step in
  torch operations.

The prefill stays the model's own forward. The operations are the model's own, some in another
order: logits agree up to float rounding (``tests/cpu/test_lean.py`` checks them against a full
forward for Llama and Qwen2 shapes with grouped- and multi-query attention, biases, left padding and
dropped rows, and that the engine samples the same tokens either way). :func:`unsupported` says why a
model cannot use it (another architecture, a dtype other than float32, sliding-window layers, an
activation other than SiLU, a LoRA wrapper, no packed weights); decoding then runs the model's forward.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from rlvr.cpu import kernels
from rlvr.cpu.packed import PackedLinears, pack_weight, packed_linear
from rlvr.models.forward import output_cache

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


class LeanUnavailable(ValueError):
    """Lean decode was required for a model it cannot run (the message says why)."""


def unsupported(model, packed: PackedLinears | None) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (one line), or None when it can."""
    name = type(model).__name__
    if name not in ARCHITECTURES:
        return f"{name} is not one of {', '.join(ARCHITECTURES)}"
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:  # before the packing: a bf16 model may be unpackable too, but this is the reason
        return f"a {str(dtype).removeprefix('torch.')} model (it runs float32 models)"
    if packed is None:
        return "it multiplies by packed weights (model.packed_weights), which are off or unavailable here"
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act={cfg.hidden_act!r} (only silu)"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return f"pretraining_tp={cfg.pretraining_tp}"
    packed_modules = {id(m) for m in packed.linears}
    for name, m in _products(model):
        if type(m) is not nn.Linear:
            return f"its {name} is a {type(m).__name__}, not a plain linear layer (a LoRA adapter's?)"
        if id(m) not in packed_modules:
            return f"its {name} is not packed"
    return None


def _projections(layer) -> dict[str, nn.Module]:
    """A decoder layer's seven projections by name: attention's q, k, v, o and the MLP's gate, up, down."""
    a, m = layer.self_attn, layer.mlp
    return {
        "q_proj": a.q_proj,
        "k_proj": a.k_proj,
        "v_proj": a.v_proj,
        "o_proj": a.o_proj,
        "gate_proj": m.gate_proj,
        "up_proj": m.up_proj,
        "down_proj": m.down_proj,
    }


def _products(model):
    """(name, module) of every projection the decode step multiplies by: each layer's seven and the LM head."""
    for i, layer in enumerate(model.model.layers):
        for name, lin in _projections(layer).items():
            yield f"layers.{i}.{name}", lin
    yield "lm_head", model.lm_head


def _product(x: Tensor, s, **post_op) -> Tensor:
    """``x W^T + b`` by a slot's packed weight and its module's bias, with :func:`packed_linear`'s post-ops."""
    return packed_linear(x, s.packed, s.module.bias, **post_op)


def _rms_norm(x: Tensor, norm) -> Tensor:
    """The Llama / Qwen2 RMSNorm of a float32 ``x``, its operations in the model's order."""
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


class _Fused:
    """Linear layers that read the same input (one or more), their weights stacked as one matrix in a
    product's layout: one product instead of several, remade when one of the parts' packed weights
    was repacked (its slot's ``generation`` moved on).

    Args:
        parts: the layers' :class:`~rlvr.cpu.packed` slots.
        layout: ``(weights [N_i, K] stacked along N, previous or None) -> tensor``: oneDNN's packed
            layout, or the compiled kernels' panels (which it may write into ``previous``, the last one
            it made).
    """

    def __init__(self, *parts, layout) -> None:
        self.parts, self.layout = parts, layout
        self.packed: Tensor | None = None
        self.bias: Tensor | None = None
        self._made_from: tuple | None = None

    @torch.no_grad()
    def refresh(self) -> None:
        made_from = tuple(s.generation for s in self.parts)
        if made_from == self._made_from:
            return
        modules = [s.module for s in self.parts]
        self.packed = self.layout([m.weight.detach() for m in modules], self.packed)
        self.bias = (
            None
            if all(m.bias is None for m in modules)
            else torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
            .detach()
            .contiguous()
        )
        self._made_from = made_from


class _Layer:
    """One decoder layer's norms and products.

    With oneDNN (torch operations): the packed products, [q; k; v] fused (faster: ``benchmarks/NOTES.md``).
    [gate; up] fused as well measured no faster within the noise for more memory, so the gate's product carries the
    SiLU and the up product the multiplication as oneDNN post-ops instead.

    With the compiled kernels: every product in the kernels' panel layout ([q; k; v] as one), a
    copy of all the layer's weights beside the oneDNN-packed one (the prefill and the update use that).
    """

    def __init__(self, layer, slot: dict, compiled=None) -> None:
        self.ln_attn, self.ln_mlp = layer.input_layernorm, layer.post_attention_layernorm
        q, k, v, self.o, self.gate, self.up, self.down = (slot[id(lin)] for lin in _projections(layer).values())
        if compiled is None:
            self.qkv = _Fused(q, k, v, layout=lambda w, _: pack_weight(torch.cat(w), q.rows_hint))
            self.fused = [self.qkv]
        else:
            panels = compiled.panels
            self.qkv = _Fused(q, k, v, layout=panels)
            self.o, self.gate, self.up, self.down = (
                _Fused(s, layout=panels) for s in (self.o, self.gate, self.up, self.down)
            )
            self.fused = [self.qkv, self.o, self.gate, self.up, self.down]


class CascadeCache:
    """Keys and values for decoding G samples of each of P prompts: the prompt's once, the response's per row.

    Keys are kept transposed (position last): a query's scores are then a product over the head
    dimension with the positions in the vector lanes (:mod:`rlvr.cpu.kernels`), and the torch
    operations' batched products read them as they are.

    Args:
        layers: per layer (keys, values) of the prompts, [P, kv_heads, L, head_dim] (the prefill's cache).
        attention_mask: [P, L] the prompts' mask (0 on left padding).
        group_size: G; row ``p·G + j`` is prompt p's j-th sample.
        capacity: response positions to reserve.
        heads: query heads (a multiple of the key/value heads).
        multiple: the prompt length and the capacity rounded up to a multiple of this (the compiled
            kernels' vector width: their scores are whole vectors, no scalar tail); the prompt's extra
            positions have zero keys and values and a -inf bias, so they take no attention.
        move_rows: :meth:`select` moves the kept rows' response caches to the front (the torch
            operations read rows 0..b-1); False = rows stay where they are and :attr:`live` says
            where (the compiled step reads each row's own; no copy when rows finish).
    """

    def __init__(
        self,
        layers: list[tuple[Tensor, Tensor]],
        attention_mask: Tensor,
        group_size: int,
        capacity: int,
        heads: int,
        multiple: int = 1,
        move_rows: bool = True,
    ) -> None:
        k0 = layers[0][0]
        P, kv, length, d = k0.shape
        L, capacity = -(-length // multiple) * multiple, -(-capacity // multiple) * multiple
        G, rep = group_size, heads // kv
        self.P, self.G, self.kv, self.rep, self.L, self.d = P, G, kv, rep, L, d
        self.prompt_kt = [k0.new_zeros(P * kv, d, L) for _ in layers]  # [P·kv, d, L]
        self.prompt_v = [k0.new_zeros(P * kv, L, d) for _ in layers]
        for (k, v), kt, vv in zip(layers, self.prompt_kt, self.prompt_v):
            kt[:, :, :length] = k.reshape(P * kv, length, d).transpose(1, 2)
            vv[:, :length] = v.reshape(P * kv, length, d)
        self.bias = torch.full((P, L), float("-inf"), dtype=k0.dtype, device=k0.device)  # 0, or -inf on padding
        self.bias[:, :length].masked_fill_(attention_mask != 0, 0.0)
        self.prompt_bias = self.bias[:, None, None, :].expand(P, kv, 1, L).reshape(P * kv, 1, L)
        # live row r's at index r (or live[r]); the compiled step reads and writes each row's [kv, d, capacity]
        # as [kv, capacity / multiple, d, multiple] (decode_kernels.c), which only it fills
        self.keys_t = k0.new_zeros(len(layers), P * G, kv, d, capacity)
        self.values = k0.new_zeros(len(layers), P * G, kv, capacity, d)
        self.q_groups = k0.new_zeros(P, kv, G, rep, d)
        self.p_groups = k0.new_zeros(P, kv, G, rep, L)
        self.length = 0  # response positions filled
        self.move_rows = move_rows
        self.set_live(torch.arange(P * G, device=k0.device))

    def set_live(self, live: Tensor) -> None:
        self.live, self.live_p, self.live_g = live, live // self.G, live % self.G

    def select(self, keep: Tensor) -> None:
        """Keeps the live rows at indices ``keep`` (in the live order); with ``move_rows`` their response
        caches move to the front (live row i's at index i), else stay at index ``live[i]``."""
        if self.move_rows:
            n, t = keep.numel(), self.length
            self.keys_t[:, :n, :, :, :t] = self.keys_t[:, keep, :, :, :t]
            self.values[:, :n, :, :t] = self.values[:, keep, :, :t]
        self.set_live(self.live[keep])


class LeanDecoder:
    """One decode step of a Llama-family causal LM (see the module docstring).

    Args:
        model: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (:func:`unsupported` returns None for it).
        packed: the model's :class:`PackedLinears`; :meth:`cache` (called once per rollout, before
            the first step) repacks the weights that changed since they were packed.
        kernel: the whole step by the compiled kernels (:mod:`rlvr.cpu.kernels`): None =
            where they build here and have this shape; False = oneDNN's products and torch operations;
            True = the kernels or :class:`LeanUnavailable`. :attr:`attention` names the one chosen.
        self_check: before using the kernels, compare one compiled step with the torch step on a
            tiny model of this head layout (:func:`kernel_self_check`, once per layout and process).
    """

    def __init__(self, model, packed: PackedLinears, *, kernel: bool | None = None, self_check: bool = True) -> None:
        why = unsupported(model, packed)
        if why is not None:
            raise LeanUnavailable(f"lean decode cannot run this model: {why}")
        slot = {id(s.module): s for s in packed.slots}
        base, cfg = model.model, model.config
        self.packed = packed
        H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
        attn = base.layers[0].self_attn
        D = attn.head_dim
        self.heads, self.kv_heads, self.head_dim, self.scaling = H, KV, D, float(attn.scaling)
        has_bias = any(getattr(m, "bias", None) is not None for _, m in _products(model))
        check = (
            (type(model).__name__, has_bias, model.lm_head.weight is base.embed_tokens.weight) if self_check else None
        )
        self.kernel, self.why_torch = (
            (None, "kernel=False") if kernel is False else _kernel_for(H, KV, D, required=kernel is True, check=check)
        )
        self.attention = "kernel" if self.kernel is not None else "torch"
        """How the products and the attention run: ``kernel`` (compiled, :mod:`rlvr.cpu.kernels`) or
        ``torch`` operations (oneDNN's packed products)."""
        self.layers = [_Layer(layer, slot, self.kernel) for layer in base.layers]
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.head = slot[id(model.lm_head)]
        if self.kernel is not None:
            self.head = _Fused(self.head, layout=self.kernel.panels)
            self.shape = kernels.StepShape(
                layers=len(self.layers),
                hidden=cfg.hidden_size,
                intermediate=cfg.intermediate_size,
                vocab=model.lm_head.out_features,
                heads=H,
                kv_heads=KV,
                head_dim=D,
                eps=float(self.norm.variance_epsilon),
                scaling=self.scaling,
            )
        # torch operations: rotary as x·cos + roll(x, D/2)·sin·sign (rotate_half(x) = roll(x, D/2) with the
        # first half negated), on the query and key heads at once, the attention's scaling folded into the queries
        p = next(model.parameters())
        scale = torch.full((H + KV, 1), attn.scaling, dtype=p.dtype, device=p.device)
        scale[H:] = 1
        sign = torch.ones(D, dtype=p.dtype, device=p.device)
        sign[: D // 2] = -1
        self._cos_scale, self._sin_scale = scale, scale * sign

    def describe(self) -> str:
        """One line for the run's log: lean decode is on, and how its attention runs (and why not compiled)."""
        if self.kernel is not None:
            return "decode: lean step (rollout.lean_decode), the whole step by the compiled kernels"
        return f"decode: lean step (rollout.lean_decode), products and attention as torch operations ({self.why_torch})"

    def cache(self, hf_cache, attention_mask: Tensor, group_size: int, capacity: int) -> CascadeCache:
        """A :class:`CascadeCache` from the prefill's Hugging Face cache of the P prompts; repacks stale weights."""
        self.packed.refresh()
        for fused in [f for layer in self.layers for f in layer.fused] + (
            [self.head] if self.kernel is not None else []
        ):
            fused.refresh()
        c = CascadeCache(
            [(layer.keys, layer.values) for layer in hf_cache.layers],
            attention_mask,
            group_size,
            capacity,
            self.heads,
            multiple=self.kernel.width if self.kernel is not None else 1,
            move_rows=self.kernel is None,
        )
        if self.kernel is not None:
            c.table = self.kernel.table(
                [
                    {
                        "ln_attn": layer.ln_attn.weight,
                        "qkv": layer.qkv.packed,
                        "qkv_bias": layer.qkv.bias,
                        "o": layer.o.packed,
                        "o_bias": layer.o.bias,
                        "ln_mlp": layer.ln_mlp.weight,
                        "gate": layer.gate.packed,
                        "gate_bias": layer.gate.bias,
                        "up": layer.up.packed,
                        "up_bias": layer.up.bias,
                        "down": layer.down.packed,
                        "down_bias": layer.down.bias,
                        "keys_t": c.keys_t[i],
                        "values": c.values[i],
                        "prompt_kt": c.prompt_kt[i],
                        "prompt_v": c.prompt_v[i],
                    }
                    for i, layer in enumerate(self.layers)
                ]
            )
        return c

    @torch.no_grad()
    def step(self, tokens: Tensor, positions: Tensor, cache: CascadeCache) -> Tensor:
        """Logits [b, V] of the next token of each live row, after ``tokens`` [b] at
        ``positions`` [b]; writes their keys and values into ``cache``."""
        b, t = tokens.shape[0], cache.length
        x = self.embed(tokens)  # [b, hidden]
        cos, sin = self.rotary(x, positions[:, None])  # [b, 1, D]
        if self.kernel is not None:
            return self._kernel_step(x, cos.reshape(b, -1).contiguous(), sin.reshape(b, -1).contiguous(), cache)
        tables = cos * self._cos_scale, sin * self._sin_scale  # [b, H + KV, D]
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.ln_attn)
            qkv = packed_linear(h, layer.qkv.packed, layer.qkv.bias)
            attn = self._torch_attention(qkv, tables, i, cache, b, t)
            x = _product(attn, layer.o, add=x)
            h = _rms_norm(x, layer.ln_mlp)
            act = _product(h, layer.up, mul=_product(h, layer.gate, silu=True))
            x = _product(act, layer.down, add=x)
        cache.length = t + 1
        return _product(_rms_norm(x, self.norm), self.head)

    def _kernel_step(self, x: Tensor, cos: Tensor, sin: Tensor, c: CascadeCache) -> Tensor:
        """:meth:`step` by the compiled kernels: the whole step in one call (``decode_kernels.c``'s ``lean_step``)."""
        logits = self.kernel.step(
            self.shape,
            c.table,
            self.norm.weight,
            self.head.packed,
            self.head.bias,
            c.bias,
            c.live_p,
            c.live,
            c.keys_t.shape[-1],
            c.length,
            cos,
            sin,
            x,
        )
        c.length += 1
        return logits

    def _torch_attention(self, qkv: Tensor, tables, i: int, c: CascadeCache, b: int, t: int) -> Tensor:
        """[b, H·D]: rotary, the cache write and the attention in torch operations (what the kernels' step
        does inside ``decode_kernels.c``'s ``lean_step``)."""
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        cos, sin = tables
        qk = qkv[:, : (H + KV) * D].view(b, H + KV, D)
        qk = torch.addcmul(qk * cos, qk.roll(D // 2, -1), sin)
        c.keys_t[i, :b, :, :, t] = qk[:, H:]
        c.values[i, :b, :, t] = qkv[:, (H + KV) * D :].view(b, KV, D)
        return self._attention(qk[:, :H], i, c, b, t + 1)

    @staticmethod
    def _attention(q: Tensor, i: int, c: CascadeCache, b: int, t: int) -> Tensor:
        """[b, H·D] attention of the live rows' (scaled) queries [b, H, D] over their prompt's and their own
        ``t`` response positions."""
        P, G, KV, rep, L, D = c.P, c.G, c.kv, c.rep, c.L, c.d
        qr = q.reshape(b, KV, rep, D)
        c.q_groups[c.live_p, :, c.live_g] = qr
        prompt = torch.baddbmm(c.prompt_bias, c.q_groups.view(P * KV, G * rep, D), c.prompt_kt[i])
        prompt = prompt.view(P, KV, G, rep, L)[c.live_p, :, c.live_g]  # [b, KV, rep, L]
        keys = c.keys_t[i, :b, :, :, :t].flatten(0, 1)  # [b·KV, D, t]
        own = torch.bmm(qr.reshape(b * KV, rep, D), keys).view(b, KV, rep, t)
        p = torch.cat([prompt, own], -1).softmax(-1)  # [b, KV, rep, L + t]
        c.p_groups[c.live_p, :, c.live_g] = p[..., :L]
        from_prompt = torch.bmm(c.p_groups.view(P * KV, G * rep, L), c.prompt_v[i]).view(P, KV, G, rep, D)[
            c.live_p, :, c.live_g
        ]
        values = c.values[i, :b, :, :t].flatten(0, 1)
        out = torch.baddbmm(from_prompt.reshape(b * KV, rep, D), p[..., L:].flatten(0, 1), values)
        return out.view(b, KV * rep * D)


def _kernel_for(heads: int, kv_heads: int, head_dim: int, *, required: bool, check: tuple | None = None):
    """(the compiled decode kernels, None) when they build here, have this shape and pass
    :func:`kernel_self_check` for ``check`` (architecture, biases, tied: None = no check); else
    (None, why), or :class:`LeanUnavailable` when ``required``."""
    k = kernels.load()
    why = kernels.why_not if k is None else None
    if k is not None and not k.supports(heads, kv_heads, head_dim):
        k, why = None, f"no kernel for {heads} query heads over {kv_heads} key/value heads of size {head_dim}"
    if k is not None and check is not None:
        why = kernel_self_check(check[0], heads, kv_heads, head_dim, bias=check[1], tied=check[2])
        k = None if why is not None else k
    if k is None and required:
        raise LeanUnavailable(f"the compiled decode kernels are unavailable: {why}")
    return k, why


SELF_CHECK_ROWS = (1, 17)
"""Rows of the self-check's steps: one, and more than the 16 the products keep in registers."""


@functools.cache
def kernel_self_check(
    arch: str, heads: int, kv_heads: int, head_dim: int, *, bias: bool = False, tied: bool = True
) -> str | None:
    """None when one compiled step of a tiny random model with this head layout (``arch``, query and
    key/value heads, head size, biases, tied embeddings) gives the logits of the torch-operations
    step at :data:`SELF_CHECK_ROWS` rows; else one line saying how they differ (the kernels are then
    not used). Once per layout and process; the global RNG is left as it was."""
    k = kernels.load()
    if k is None:
        return kernels.why_not
    shape = dict(
        vocab_size=96,
        hidden_size=8 * heads,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=1,
        bias=bias,
    )
    try:
        return _self_check(k, arch, heads, kv_heads, head_dim, shape)
    except Exception as e:  # noqa: BLE001 - whatever fails here, the torch step still runs
        return (
            "the compiled step's self-check could not run "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        )


def _self_check(k, arch: str, heads: int, kv_heads: int, head_dim: int, shape: dict) -> str | None:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    bias = shape.pop("bias")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if arch == "Qwen2ForCausalLM":
            model = Qwen2ForCausalLM(Qwen2Config(**shape))
        else:
            model = LlamaForCausalLM(LlamaConfig(**shape, attention_bias=bias, mlp_bias=bias))
        model.eval()
        with torch.no_grad():
            for p in model.parameters():  # weights large enough that a wrong step shows in the logits
                p.normal_(0, 0.2)
        prompt = torch.randint(2, 96, (1, 5))
        mask = torch.ones_like(prompt)
        packed = PackedLinears(model, rows_hint=16)
        decoders = {
            "compiled": LeanDecoder(model, packed, kernel=True, self_check=False),
            "torch": LeanDecoder(model, packed, kernel=False),
        }
        for rows in SELF_CHECK_ROWS:
            tokens = torch.randint(2, 96, (rows,))
            logits = {}
            with torch.no_grad():
                for name, dec in decoders.items():
                    out = model(input_ids=prompt, attention_mask=mask, use_cache=True)
                    cache = dec.cache(output_cache(out), mask, rows, k.width)
                    logits[name] = dec.step(tokens, torch.full((rows,), 5), cache)
            got, want = logits["compiled"], logits["torch"]
            diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            if not torch.isfinite(got).all() or diff > 1e-3 * (1 + want.abs().max().item()):
                return (
                    f"the compiled step disagrees with the torch step on a {arch} with {heads} query heads over "
                    f"{kv_heads} key/value heads of size {head_dim} at {rows} rows (max difference {diff:.3g}); "
                    "the decode runs as torch operations"
                )
    return None
