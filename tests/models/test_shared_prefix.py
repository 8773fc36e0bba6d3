"""The one-pass shared prompt (rlvr.models.shared_prefix): each group's prompt and its G rows in one
forward pass equal the per-row pass in log-probs, entropies and gradients, on left-padded prompts
of different lengths, with the fused head and with full logits, without a second model pass."""

from __future__ import annotations

import pytest
import torch
from host_syncs import HostSyncs

from rlvr.models import forward as F
from rlvr.models import shared_prefix
from rlvr.models.tiny import tiny_model, tiny_qwen2

V_PAD = 0


def _batch(G: int, P: int, prompt: int, T: int, seed: int = 0):
    """P groups of G rows: prompts of different real lengths, left-padded to ``prompt``; responses of
    different lengths, right-padded to T (padding id 0, attention mask 0 on padding)."""
    g = torch.Generator().manual_seed(seed)
    rows, masks = [], []
    for p in range(P):
        real = prompt - 3 * p  # group p has 3p tokens of left padding
        head = torch.randint(3, 40, (real,), generator=g)
        for _ in range(G):
            resp_len = int(torch.randint(1, T + 1, (1,), generator=g))
            resp = torch.randint(3, 40, (resp_len,), generator=g)
            ids = torch.cat([torch.full((prompt - real,), V_PAD), head, resp, torch.full((T - resp_len,), V_PAD)])
            m = torch.cat([torch.zeros(prompt - real), torch.ones(real + resp_len), torch.zeros(T - resp_len)])
            rows.append(ids)
            masks.append(m.long())
    return torch.stack(rows), torch.stack(masks)


def _logprobs_and_grads(model, ids, mask, T, G, *, fused: bool, entropy_grad: bool = False):
    model.zero_grad(set_to_none=True)
    tokens = ids[:, -T:]
    kw = dict(temperature=0.7, entropy=True, entropy_grad=entropy_grad, group_size=G, fused=fused)
    logp, ent = F.pass_logprobs(model, ids, mask, tokens, **kw)
    resp = mask[:, -T:].float()
    loss = -(logp * resp).sum() / resp.sum() + 0.01 * (ent * resp).sum() * entropy_grad
    loss.backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(params=["grouped", "sdpa"])
def kernel(request, monkeypatch):
    """Both attention kernels of the one pass: the CPU's grouped products (these tiny passes are far
    below MATH_SCORES_MAX) and sdpa (the limit set to 0), counting the grouped kernel's calls."""
    calls = []
    grouped = shared_prefix._grouped_attention
    monkeypatch.setattr(shared_prefix, "_grouped_attention", lambda *a: calls.append(1) or grouped(*a))
    if request.param == "sdpa":
        monkeypatch.setattr(shared_prefix, "MATH_SCORES_MAX", {torch.float32: 0, "low": 0})
    yield request.param, calls


@pytest.mark.parametrize("build", [tiny_model, tiny_qwen2], ids=["llama-tied", "qwen2-gqa-bias"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
def test_one_pass_equals_the_per_row_pass(build, fused, kernel, monkeypatch):
    model = build().train()
    G, P, prompt, T = 4, 2, 12, 6
    ids, mask = _batch(G, P, prompt, T)
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    want = _logprobs_and_grads(model, ids, mask, T, 1, fused=fused)
    calls.clear()
    got = _logprobs_and_grads(model, ids, mask, T, G, fused=fused)
    assert len(calls) == 1  # one model call for both groups: no separate prompt pass
    name, grouped = kernel
    assert (len(grouped) == model.config.num_hidden_layers) == (name == "grouped")  # one per layer
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(got[0][resp], want[0][resp], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][resp], want[1][resp], rtol=1e-5, atol=1e-5)
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_one_pass_keeps_the_attention_implementation_and_takes_no_host_reads():
    model = tiny_qwen2().eval()
    G, P, prompt, T = 4, 2, 10, 5
    ids, mask = _batch(G, P, prompt, T, seed=1)
    with torch.no_grad(), HostSyncs() as syncs:
        F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G)
    assert syncs.count == 0
    assert model.config._attn_implementation == "sdpa"


def test_layout_puts_each_rows_segment_after_its_groups_prompt():
    G, P, prompt, T = 2, 2, 5, 3
    ids, mask = _batch(G, P, prompt, T, seed=2)
    positions = F._positions(mask)
    packed, pos, (pm, sm), keep = shared_prefix.layout(ids, mask, positions, T, G)
    Lp = prompt + T - T - 1
    assert packed.shape == (P, Lp + G * T) and keep.tolist() == list(range(Lp, Lp + G * T))
    for p in range(P):
        assert torch.equal(packed[p, :Lp], ids[p * G, :Lp])
        for g in range(G):
            r = p * G + g
            assert torch.equal(packed[p, Lp + g * T : Lp + (g + 1) * T], ids[r, Lp:-1])
            assert torch.equal(pos[p, Lp + g * T : Lp + (g + 1) * T], positions[r, Lp:-1])
            assert torch.equal(sm[r, 0, :, :Lp], mask[r, :Lp].bool().expand(T, Lp))  # padding keys masked
            assert torch.equal(sm[r, 0, :, Lp:], torch.ones(T, T, dtype=torch.bool).tril())
        assert pm[p, 0].diagonal().all()  # a padding query attends to itself: no empty row of scores


def test_eager_models_keep_the_two_pass_shared_prompt():
    model = tiny_model()
    model.config._attn_implementation = "eager"
    assert not shared_prefix.one_pass_applies(model)
    G, T = 4, 6
    ids, mask = _batch(G, 2, 12, T, seed=3)
    with torch.no_grad():
        shared, _ = F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G)
        plain, _ = F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=1)
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(shared[resp], plain[resp], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "autocast"])
def test_grouped_kernel_equals_sdpa_on_padded_prompts(dtype):
    """The grouped kernel against transformers' sdpa on the same one-pass inputs: grouped query heads,
    a left-padded prompt, float32 and bf16 inputs and float32 ones under bf16 autocast (the update's
    case), outputs and input gradients."""
    import contextlib
    import types

    autocast = dtype == "autocast"
    dtype = torch.float32 if autocast else dtype

    torch.manual_seed(0)
    P, h, kv, Lp, G, T, d = 2, 6, 2, 7, 3, 4, 8
    L = Lp + G * T
    real = torch.ones(P * G, Lp + 1 + T, dtype=torch.long)
    real[G:, :3] = 0  # the second group's prompt has 3 tokens of left padding
    positions = (real.cumsum(1) - 1).clamp(min=0)
    *_, (pm, sm), _ = shared_prefix.layout(torch.zeros_like(real), real, positions, T, G)
    module = types.SimpleNamespace(num_key_value_groups=h // kv, is_causal=True, training=True)
    qkv = [torch.randn(P, n, L, d, dtype=dtype) for n in (h, kv, kv)]
    grad_out = torch.randn(P, L, h, d)

    def run(math: bool):
        q, k, v = (x.clone().requires_grad_() for x in qkv)
        if math:
            with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                out = shared_prefix._grouped_attention(q, k, v, pm, sm, G, T, 0.3)
        else:  # sdpa in float32, the reference
            q32, k32, v32 = (x.float() for x in (q, k, v))
            kw = dict(shared_prefix=(G, T, (pm, sm), None), scaling=0.3, dropout=0.0)
            with pytest.MonkeyPatch.context() as m:
                m.setattr(shared_prefix, "MATH_SCORES_MAX", {torch.float32: 0, "low": 0})
                out = shared_prefix._shared_prefix_attention(module, q32, k32, v32, None, **kw)[0]
        out.float().backward(grad_out)
        dtypes.append(out.dtype)
        return out.float(), [x.grad.float() for x in (q, k, v)]

    dtypes = []
    got, want = run(True), run(False)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 and not autocast else dict(rtol=2e-2, atol=2e-2)
    assert dtypes[0] == (torch.bfloat16 if autocast else dtype) and got[0].shape == (P, L, h, d)  # as sdpa's
    torch.testing.assert_close(got[0], want[0], **tol)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "autocast"])
def test_segment_kernel_equals_sdpa_by_segment(autocast):
    """The per-segment kernel of an unpadded row against sdpa (float32, repeated key/value heads) on
    each segment: grouped query heads, a left-padded prompt, segments of different lengths and
    groups of different sums, end to end; outputs and input gradients, in float32 and under bf16
    autocast."""
    import contextlib

    torch.manual_seed(0)
    P, h, kv, Lp, G, T, d = 2, 6, 2, 7, 3, 5, 8
    lengths = (5, 2, 4, 1, 3, 3)  # group 0: 11 positions, group 1: 7
    N = P * Lp + sum(lengths)
    real = torch.ones(P * G, Lp + 1 + T, dtype=torch.long)
    real[G:, :3] = 0  # the second group's prompt has 3 tokens of left padding
    positions = (real.cumsum(1) - 1).clamp(min=0)
    *_, (pm, sm), _ = shared_prefix.layout(torch.zeros_like(real), real, positions, T, G)
    qkv = [torch.randn(1, n, N, d) for n in (h, kv, kv)]
    grad_out = torch.randn(1, N, h, d)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def reference(q, k, v):
        q, k, v, outs, row = q[0], k[0], v[0], [], 0
        rep = lambda x: x.repeat_interleave(h // kv, 0)  # noqa: E731
        for p in range(P):
            prompt = slice(row, row + Lp)
            kp, vp = rep(k[:, prompt]), rep(v[:, prompt])
            outs.append(sdpa(q[:, prompt], kp, vp, attn_mask=pm[p, 0], scale=0.3))
            at = row + Lp
            for g in range(G):
                n, seg = lengths[p * G + g], slice(at, at + lengths[p * G + g])
                keys, values = torch.cat([kp, rep(k[:, seg])], 1), torch.cat([vp, rep(v[:, seg])], 1)
                mask = sm[p * G + g, 0, :n, : Lp + n]
                outs.append(sdpa(q[:, seg], keys, values, attn_mask=mask, scale=0.3))
                at += n
            row = at
        return torch.cat(outs, 1).transpose(0, 1)[None]

    def run(kernel: bool):
        q, k, v = (x.clone().requires_grad_() for x in qkv)
        if kernel:
            with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                out = shared_prefix._segment_attention(q, k, v, (pm, sm), lengths, {"scaling": 0.3, "dropout": 0.0})
        else:
            out = reference(q, k, v)
        out.float().backward(grad_out)
        return out.float(), [x.grad for x in (q, k, v)]

    got, want = run(True), run(False)
    assert got[0].shape == (1, N, h, d)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], want[0], **tol)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("kernel", ["grouped", "segments"])
def test_kernels_cast_each_input_once_under_autocast(kernel):
    """Under bf16 autocast the attention kernels cast their float32 queries, keys and values to bf16
    once each, not once per product (the grouped kernel reads the prompt's keys and values in two
    products each), and return bf16, as sdpa does there; bf16 inputs without autocast come back bf16.
    (The casts counted are of tensors of head-dimension rows, d wide: the softmax's float32 round
    trip of the scores is not one.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    P, h, kv, Lp, G, T, d = 2, 6, 2, 7, 3, 4, 8

    class Casts(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Casts.n += func is torch.ops.aten._to_copy.default and args[0].shape[-1] == d
            return func(*args, **(kwargs or {}))

    real = torch.ones(P * G, Lp + 1 + T, dtype=torch.long)
    *_, (pm, sm), _ = shared_prefix.layout(torch.zeros_like(real), real, (real.cumsum(1) - 1), T, G)
    q, k, v = (torch.randn(P, n, Lp + G * T, d) for n in (h, kv, kv))

    def attend(q, k, v):
        if kernel == "grouped":
            return shared_prefix._grouped_attention(q, k, v, pm, sm, G, T, 0.3)
        one_row = (x.transpose(0, 1).reshape(1, x.shape[1], -1, d) for x in (q, k, v))  # the groups end to end
        return shared_prefix._segment_attention(*one_row, (pm, sm), (T,) * (P * G), {"scaling": 0.3})

    with torch.autocast("cpu", dtype=torch.bfloat16), Casts():
        out = attend(q, k, v)
    assert out.dtype == torch.bfloat16 and Casts.n == 3
    assert attend(q.bfloat16(), k.bfloat16(), v.bfloat16()).dtype == torch.bfloat16  # float32 inside, bf16 out


def test_segment_kernel_dropout_drops_probabilities():
    """In training, the per-segment kernel's dropout acts on the attention probabilities as sdpa's
    ``dropout_p``: all of them dropped, the output is zero; none, it is the plain output."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    pm, sm = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril(), torch.ones(2, 1, 2, 7, dtype=torch.bool)
    plain = shared_prefix._segment_attention(q, k, v, (pm, sm), (2, 2), {"dropout": 0.0})
    assert plain.abs().sum() > 0
    assert not shared_prefix._segment_attention(q, k, v, (pm, sm), (2, 2), {"dropout": 1.0}).any()
    half = shared_prefix._segment_attention(q, k, v, (pm, sm), (2, 2), {"dropout": 0.5})
    assert not torch.equal(half, plain) and half.abs().sum() > 0


def test_unpadded_passes_go_by_segment_where_padding_dominates():
    """An unpadded CPU pass goes segment by segment where the padding would be most of the grouped
    kernel's work (one group of long, uneven responses: vs_trl.py's shape), and stays on the grouped
    kernel where the segments are many and about equally long (the quickstart's), or on sdpa off a
    CPU. A segment's fixed cost is higher in bf16 (or under autocast), where the padded kernel is faster."""
    import types

    module = types.SimpleNamespace(training=True)
    uneven = (22, 128, 64, 90, 40, 128, 77, 100)
    short_uneven = (12, 40, 30, 20, 25, 33, 18, 22)
    even = tuple(range(12, 22)) * 3 + (20, 21)
    for low in (False, True):
        assert shared_prefix._segments_cheaper(127, 128, uneven, 1, low)
        assert not shared_prefix._segments_cheaper(125, 21, even, 4, low)
    assert shared_prefix._segments_cheaper(127, 40, short_uneven, 1, low=False)
    assert not shared_prefix._segments_cheaper(127, 40, short_uneven, 1, low=True)
    q, k = torch.zeros(1, 9, 127 + sum(short_uneven), 4), torch.zeros(1, 3, 127 + sum(short_uneven), 4)
    assert shared_prefix._math_applies(module, q, k, 127, 8, 40, {})
    assert shared_prefix._by_segment(module, q, k, 127, 8, 40, {}, short_uneven)
    assert not shared_prefix._by_segment(module, q.bfloat16(), k.bfloat16(), 127, 8, 40, {}, short_uneven)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the update's case: float32 inputs, bf16 products
        assert not shared_prefix._by_segment(module, q, k, 127, 8, 40, {}, short_uneven)
    short = (12, 20, 15, 18, 14, 16, 19, 13)
    q, k = torch.zeros(1, 9, 127 + sum(short), 4), torch.zeros(1, 3, 127 + sum(short), 4)
    assert not shared_prefix._by_segment(module, q, k, 127, 8, 20, {}, short)
    assert not shared_prefix._by_segment(module, q.to("meta"), k.to("meta"), 127, 8, 20, {}, uneven)


def test_large_passes_and_dropout_take_sdpa():
    """The grouped kernel only below MATH_SCORES_MAX, without dropout, on a CPU."""
    import types

    q, k = torch.zeros(1, 9, 126 + 8 * 21, 4), torch.zeros(1, 3, 126 + 8 * 21, 4)
    module = types.SimpleNamespace(training=True)
    assert shared_prefix._math_applies(module, q, k, 126, 8, 21, {"dropout": 0.0})
    assert not shared_prefix._math_applies(module, q, k, 126, 8, 21, {"dropout": 0.1})
    assert not shared_prefix._math_applies(module, q, k, 126, 8, 21, {"softcap": 30.0})
    long_q, long_k = torch.zeros(1, 9, 126 + 8 * 512, 4), torch.zeros(1, 3, 126 + 8 * 512, 4)
    assert not shared_prefix._math_applies(module, long_q, long_k, 126, 8, 512, {})


def _unpadded_logprobs_and_grads(model, ids, mask, T, G, *, fused: bool, entropy_grad=False):
    model.zero_grad(set_to_none=True)
    lengths = mask[:, -T:].sum(1)
    kw = dict(temperature=0.7, entropy=True, entropy_grad=entropy_grad, group_size=G, fused=fused)
    logp, ent = F.pass_logprobs(model, ids, mask, ids[:, -T:], unpadded=(lengths, tuple(lengths.tolist())), **kw)
    resp = mask[:, -T:].float()
    loss = -(logp * resp).sum() / resp.sum() + 0.01 * (ent * resp).sum() * entropy_grad
    loss.backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("build", [tiny_model, tiny_qwen2], ids=["llama-tied", "qwen2-gqa-bias"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
@pytest.mark.parametrize("P", [1, 2], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("by_segment", [True, False], ids=["by-segment", "padded-attention"])
def test_unpadded_segments_equal_the_padded_pass(build, fused, P, by_segment, kernel, monkeypatch):
    """Responses end to end without padding: the same log-probs, entropies (entropy bonus on) and
    gradients as the padded one pass, with the head on exactly the real positions (with two groups,
    the shorter group takes fewer). The attention: the grouped kernel, or (sdpa) one call per
    segment on a CPU, or the padded segments (as on a GPU)."""
    model = build().train()
    G, prompt, T = 4, 12, 6
    ids, mask = _batch(G, P, prompt, T, seed=5)
    resp = mask[:, -T:].bool()
    assert resp.sum(1).min() < T and (P == 1 or resp.view(P, -1).sum(1).unique().numel() == P)
    segments = []
    attention = shared_prefix._segment_attention
    monkeypatch.setattr(shared_prefix, "_segment_attention", lambda *a: segments.append(1) or attention(*a))
    if not by_segment:
        monkeypatch.setattr(shared_prefix, "_by_segment", lambda *a: False)
    heads = []  # positions the LM head computes
    model.lm_head.register_forward_pre_hook(lambda m, a: heads.append(a[0].shape[:-1].numel()))
    want = _logprobs_and_grads(model, ids, mask, T, G, fused=fused, entropy_grad=True)
    assert heads == [P * G * T]
    heads.clear()
    got = _unpadded_logprobs_and_grads(model, ids, mask, T, G, fused=fused, entropy_grad=True)
    assert heads == [int(resp.sum())]  # exactly the real positions, the groups' sums unequal
    name, grouped = kernel
    layers = model.config.num_hidden_layers
    assert (len(grouped) == 2 * layers) == (name == "grouped")  # padded + unpadded
    assert len(segments) == (layers if name == "sdpa" and by_segment else 0)
    torch.testing.assert_close(got[0][resp], want[0][resp], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][resp], want[1][resp], rtol=1e-5, atol=1e-5)
    for n, g in want[2].items():
        torch.testing.assert_close(got[2][n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_unpadded_index_maps_positions_both_ways():
    """Groups of segments (2, 3, 1) and (1, 1, 3) after prompts of 2 positions, end to end in one row
    of 8 + 7 positions, against the padded layout's rows of 2 + 3·4."""
    lengths = torch.tensor([[2, 3, 1], [1, 1, 3]])
    index = shared_prefix.unpadded_index(lengths, 4, 2, (6, 5))
    # padded position -> unpadded: a segment's padding repeats its last real position
    assert index.into.view(2, -1).tolist() == [
        [0, 1, 2, 3, 3, 3, 4, 5, 6, 6, 7, 7, 7, 7],
        [8, 9, 10, 10, 10, 10, 11, 11, 11, 11, 12, 13, 14, 14],
    ]
    assert index.back.tolist() == [0, 1, 2, 3, 6, 7, 8, 10, 14, 15, 16, 20, 24, 25, 26]
    assert torch.equal(index.into[index.back], torch.arange(15))  # round trip on real positions
    assert index.keep.tolist() == [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14]  # the head's positions
    assert index.tokens.tolist() == [0, 1, 4, 5, 6, 8, 12, 16, 20, 21, 22]  # their tokens in [P, G·T]
    assert index.unpad.tolist() == [[0, 1, 1, 1], [2, 3, 4, 4], [5] * 4, [6] * 4, [7] * 4, [8, 9, 10, 10]]


def test_unpadded_index_copies_nothing_from_the_host():
    """The unpadded index is computed from the device lengths alone: no tensor made from host values
    (``lift_fresh``), which on a GPU would be a blocking host-to-device copy every pass."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Lifts(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Lifts.n += func is torch.ops.aten.lift_fresh.default
            return func(*args, **(kwargs or {}))

    lengths = torch.tensor([[2, 3, 1], [1, 1, 3]])
    with Lifts():
        index = shared_prefix.unpadded_index(lengths, 4, 2, (6, 5))
    assert Lifts.n == 0 and index.back.numel() == 15


def test_unpadded_pass_takes_no_host_reads(kernel):
    model = tiny_qwen2().eval()
    G, P, prompt, T = 4, 2, 10, 5
    ids, mask = _batch(G, P, prompt, T, seed=1)
    lengths = mask[:, -T:].sum(1)
    with torch.no_grad(), HostSyncs() as syncs:
        F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G, unpadded=(lengths, tuple(lengths.tolist())))
    assert syncs.count == 0


@pytest.mark.parametrize("n", [45, 64])
def test_low_precision_softmax_rounds_the_float32_one(n):
    """The kernels' bf16 softmax (a float32 softmax rounded once) equals the float32 softmax of the
    same scores rounded to bf16, masked keys included, whatever the row length (45: a length the
    bf16 CPU kernel handles partly outside its vector loop); its gradient is float32 softmax's
    to bf16 rounding."""
    torch.manual_seed(0)
    scores = (torch.randn(3, 5, n) * 4).bfloat16().requires_grad_()
    mask = torch.rand(1, 5, n) > 0.3
    mask[..., 0] = True
    bias = shared_prefix._bias(mask, torch.bfloat16)
    probs = shared_prefix._masked_softmax(scores, bias)
    ref_in = scores.detach().float().requires_grad_()
    ref = (ref_in + bias.float()).softmax(-1)
    assert probs.dtype == torch.bfloat16
    assert torch.equal(probs, ref.bfloat16()) and not probs[~mask.expand_as(probs)].any()
    grad = torch.randn(3, 5, n)
    probs.backward(grad.bfloat16())
    ref.backward(grad.bfloat16().float())
    torch.testing.assert_close(scores.grad.float(), ref_in.grad, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("build", [tiny_model, tiny_qwen2], ids=["llama-tied", "qwen2-gqa-bias"])
@pytest.mark.parametrize("c", [1, 3, 5])
def test_core_attention_equals_the_padded_pass(build, c, monkeypatch):
    """The grouped kernel on segments padded to a core length c, each longer segment's queries past c
    attended apart: the same log-probs, entropies and gradients as the padded one pass."""
    model = build().train()
    G, P, prompt, T = 4, 2, 12, 6
    ids, mask = _batch(G, P, prompt, T, seed=5)
    lengths = mask[:, -T:].sum(1)
    assert (lengths > c).any() and (lengths <= c).any() or c == 1
    cores = []
    monkeypatch.setattr(shared_prefix, "core_length", lambda *a: c)
    real = shared_prefix._core_attention
    monkeypatch.setattr(shared_prefix, "_core_attention", lambda *a: cores.append(a[4]) or real(*a))
    monkeypatch.setattr(shared_prefix, "_segments_cheaper", lambda *a: False)
    want = _logprobs_and_grads(model, ids, mask, T, G, fused=True, entropy_grad=True)
    got = _unpadded_logprobs_and_grads(model, ids, mask, T, G, fused=True, entropy_grad=True)
    assert len(cores) == model.config.num_hidden_layers and cores[0].T == c
    assert len(cores[0].tails) == int((lengths > c).sum()) > 0
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(got[0][resp], want[0][resp], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][resp], want[1][resp], rtol=1e-5, atol=1e-5)
    for n, g in want[2].items():
        torch.testing.assert_close(got[2][n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_core_attention_under_bf16_autocast_matches_the_padded_kernel(monkeypatch):
    """Under bf16 autocast (the update's case) the core kernel's log-probs equal the padded kernel's
    to bf16 rounding."""
    model = tiny_qwen2().train()
    G, P, prompt, T = 4, 2, 12, 6
    ids, mask = _batch(G, P, prompt, T, seed=5)
    lengths = mask[:, -T:].sum(1)
    monkeypatch.setattr(shared_prefix, "_segments_cheaper", lambda *a: False)
    out = {}
    for c in (T, 3):
        monkeypatch.setattr(shared_prefix, "core_length", lambda *a, c=c: c)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out[c] = _unpadded_logprobs_and_grads(model, ids, mask, T, G, fused=True)
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(out[3][0][resp], out[T][0][resp], rtol=0, atol=3e-2)
    for n, g in out[T][2].items():
        torch.testing.assert_close(out[3][2][n], g, rtol=5e-2, atol=5e-3, msg=n)
    assert (lengths > 3).any()


def test_core_length_leaves_out_a_few_long_segments():
    """One answer that ran to the limit among short ones: the kernel pads to the short ones' length
    and attends the long one's tail apart; answers of about equal length stay padded to T."""
    one_long = (48,) + (17,) * 31
    for low in (False, True):
        assert shared_prefix.core_length(125, 48, one_long, 4, low) == 17
        assert shared_prefix.core_length(125, 21, tuple(range(12, 22)) * 3 + (20, 21), 4, low) == 21
    assert shared_prefix.core_length(125, 48, (17,) * 32, 4, True) == 17  # a pass shorter than its T
    half_long = (48,) * 16 + (17,) * 16  # half of them long: padding to 48 is cheaper than 16 tails
    assert shared_prefix.core_length(125, 48, half_long, 4, True) == 48
    # vs_trl.py's answers (12 to 128, two groups): a core of 39 is modeled 2 % under the segments and
    # ran slower; it must win by CORE_GAIN
    spread = (22, 23, 28, 30, 33, 37, 39, 54, 54, 76, 77, 81, 94, 104, 120, 128)
    assert shared_prefix.core_length(127, 128, spread, 2, True) == 128


def test_core_rows_index_the_core_layout():
    """Segments of lengths (2, 3, 1) and (1, 1, 3) after prompts of Lp = 1, in one unpadded row of 7 + 6
    positions, padded to c = 2: the core layout's rows, the way back, and the long segments' tails."""
    core = shared_prefix.core_rows((2, 3, 1, 1, 1, 3), 1, 3, 2, "cpu")
    assert core.tails == ((0, 1, 0, 3, 3), (1, 2, 7, 10, 3))  # (group, segment, group row, start, length)
    assert core.tail_rows.tolist() == [5, 12]
    # into: per group, the prompt then each segment's first 2 positions (a 1-long one repeated)
    assert core.into.view(2, -1).tolist() == [[0, 1, 2, 3, 4, 6, 6], [7, 8, 8, 9, 9, 10, 11]]
    # back: each unpadded position's core position (a tail's rows are replaced afterwards)
    assert core.back.tolist() == [0, 1, 2, 3, 4, 4, 5, 7, 8, 10, 12, 13, 13]


def test_core_pass_takes_no_host_reads(monkeypatch):
    """The core layout is built from the host lengths: the pass reads nothing back from the device."""
    model = tiny_qwen2().eval()
    G, P, prompt, T = 4, 2, 10, 5
    ids, mask = _batch(G, P, prompt, T, seed=1)
    lengths = mask[:, -T:].sum(1)
    monkeypatch.setattr(shared_prefix, "core_length", lambda *a: 2)
    monkeypatch.setattr(shared_prefix, "_segments_cheaper", lambda *a: False)
    calls = []
    real = shared_prefix._core_attention
    monkeypatch.setattr(shared_prefix, "_core_attention", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad(), HostSyncs() as syncs:
        F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G, unpadded=(lengths, tuple(lengths.tolist())))
    assert syncs.count == 0 and calls
