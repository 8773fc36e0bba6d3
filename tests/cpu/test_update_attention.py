"""The update's compiled shared-prompt attention (rlvr.cpu.update_attention, train.fused_attention):
its output and gradients against a float32 reference over head layouts, head sizes, padding and
segment lengths; the one-pass model passes with it against the torch kernels; its fences and argument
checks; its bits the same from call to call and at any thread count; and how the trainer installs it
or says why not. Where this CPU has no AVX512-BF16 the kernel's C runs on SIMDe's emulation of the
same intrinsics (tests/ua_emulated.py), so its logic is checked on every machine."""

from __future__ import annotations

import functools

import pytest
import torch
import ua_emulated
from tiny_run import tiny_config

from rlvr.cpu import update_attention as ua
from rlvr.errors import UserError
from rlvr.models import forward as F
from rlvr.models import shared_prefix
from rlvr.models.tiny import tiny_model
from rlvr.training.trainer import Trainer


@pytest.fixture(scope="module")
def lib():
    """The hardware's build where this CPU has AVX512-BF16, else the same C on SIMDe's emulation."""
    return ua_emulated.library()[0]


def _inputs(h, kv, d, pads, lengths, Lp, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    P = len(pads)
    real = torch.ones(P, Lp, dtype=torch.bool)
    for p, n in enumerate(pads):
        real[p, :n] = False
    N = P * Lp + sum(lengths)
    q, k, v = (torch.randn(1, n, N, d, generator=g).to(dtype) for n in (h, kv, kv))
    return q, k, v, real


def _rel(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(
    "h, kv, d, pads, lengths, Lp",
    [
        (6, 2, 64, (0, 3), (3, 1, 17, 2), 5),  # r 3, a padded prompt, a segment over a block
        (4, 4, 128, (7,), (1, 40, 33), 37),  # r 1, head size 128, segments over two blocks
        (10, 2, 64, (2, 0, 31), (5, 16, 16, 1, 9, 2), 33),  # r 5: two chunks of heads; 3 groups
        (7, 1, 256, (0,), (64, 1), 20),  # r 7, head size 256
    ],
    ids=["r3-d64", "r1-d128", "r5-3groups", "r7-d256"],
)
def test_kernel_matches_a_float32_reference(lib, h, kv, d, pads, lengths, Lp):
    q, k, v, real = _inputs(h, kv, d, pads, lengths, Lp)
    for x in (q, k, v):
        x.requires_grad_()
    got = ua.attention(lib, q, k, v, real, lengths, d**-0.5)
    assert got.dtype == torch.bfloat16 and got.shape == (1, q.shape[2], h, d)
    grad = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    got.backward(grad)
    grads = [x.grad for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = ua.reference(q, k, v, real, lengths, d**-0.5)
    want.backward(grad.float())
    assert _rel(got, want) < 0.02
    for a, x in zip(grads, (q, k, v)):
        assert _rel(a, x.grad) < 0.03
    # a padding query attends to itself alone: its output is its own value row
    if pads[0]:
        torch.testing.assert_close(got[0, 0].float(), v[0, :, 0].repeat_interleave(h // kv, 0).float(), atol=0, rtol=0)


def test_padded_rows_and_float32_inputs(lib):
    """[P, h, L, d] rows (the padded layout: every segment T long) and float32 inputs, whose gradients
    come back float32."""
    P, G, T, Lp, h, kv, d = 2, 3, 4, 6, 4, 2, 64
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(P, n, Lp + G * T, d, generator=g).requires_grad_() for n in (h, kv, kv))
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6], dtype=torch.bool)
    got = ua.attention(lib, q, k, v, real, (T,) * (P * G), 0.125)
    assert got.shape == (P, Lp + G * T, h, d)
    got.float().square().sum().backward()
    assert {x.grad.dtype for x in (q, k, v)} == {torch.float32}
    want = ua.reference(q.detach(), k.detach(), v.detach(), real, (T,) * (P * G), 0.125)
    assert _rel(got, want) < 0.02


def _batch(G: int, P: int, prompt: int, T: int, seed: int):
    """P groups of G rows: prompts left-padded by 3p tokens, responses of 1 to T tokens right-padded."""
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for p in range(P):
        head = torch.randint(3, 40, (prompt - 3 * p,), generator=g)
        for _ in range(G):
            n = int(torch.randint(1, T + 1, (1,), generator=g))
            answer = torch.randint(3, 40, (n,), generator=g)
            ids.append(torch.cat([torch.zeros(3 * p), head, answer, torch.zeros(T - n)]))
            masks.append(torch.cat([torch.zeros(3 * p), torch.ones(prompt - 3 * p + n), torch.zeros(T - n)]))
    return torch.stack(ids).long(), torch.stack(masks).long()


def _unpadded(model, ids, mask, T, G):
    model.zero_grad(set_to_none=True)
    lengths = mask[:, -T:].sum(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = F.pass_logprobs(
            model, ids, mask, ids[:, -T:], group_size=G, unpadded=(lengths, tuple(lengths.tolist()))
        )
    resp = mask[:, -T:].float()
    (-(logp * resp).sum() / resp.sum()).backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_one_pass_runs_it_and_matches_the_torch_kernels(lib, monkeypatch):
    """The unpadded shared-prompt pass of a Llama of head size 64 under bf16 autocast: every layer's
    attention takes the installed kernel, and the log-probs and gradients agree with the torch
    kernels' to bf16 rounding; so do the padded one pass's log-probs."""
    model = tiny_model(hidden=256, seed=4).train()  # 4 heads of 64 over 2 key/value heads
    G, P, prompt, T = 4, 2, 12, 6
    ids, mask = _batch(G, P, prompt, T, seed=3)
    resp = mask[:, -T:].bool()
    want = _unpadded(model, ids, mask, T, G)
    calls = []
    kernel = functools.partial(ua.attention, lib)
    monkeypatch.setattr(shared_prefix, "_KERNEL", [lambda *a: calls.append(1) or kernel(*a)])
    got = _unpadded(model, ids, mask, T, G)
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(got[0][resp], want[0][resp], rtol=0, atol=0.05)
    for n, g in want[1].items():
        assert _rel(got[1][n], g) < 0.05, n
    calls.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the padded one pass: segments of T
        padded = F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G)[0]
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(padded[resp], want[0][resp], rtol=0, atol=0.05)
    calls.clear()
    with torch.autocast("cpu", dtype=torch.float16):  # another autocast dtype: the torch kernels
        F.pass_logprobs(model, ids, mask, ids[:, -T:], group_size=G)
    assert not calls


def test_same_bits_from_call_to_call_and_at_any_thread_count(lib):
    """The output and the three gradients are bit-identical over repeated calls at 1, 2, 3 and 2 threads
    again: each key's gradient sums its query positions in an order fixed by the shape, never by which
    thread ran which (per-thread sums added at the end, the old way, differed between two calls at 2
    threads). Shapes with many work units a (group, head) pair and ragged segments."""
    q, k, v, real = _inputs(6, 2, 64, (4, 0, 9), (5, 40, 17, 33, 1, 20, 9, 64, 3, 2, 70, 11), 37, seed=5)
    lengths = (5, 40, 17, 33, 1, 20, 9, 64, 3, 2, 70, 11)
    grad = torch.randn(1, q.shape[2], 6, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    threads, first = torch.get_num_threads(), None
    try:
        for n in (1, 2, 3, 2):
            torch.set_num_threads(n)
            xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            out = ua.attention(lib, *xs, real, lengths, 0.125)
            out.backward(grad)
            got = [out.detach(), *(x.grad for x in xs)]
            first = first or got
            for name, a, b in zip(("output", "dq", "dk", "dv"), first, got):
                assert torch.equal(a, b), f"{name} at {n} threads differs from 1 thread's"
    finally:
        torch.set_num_threads(threads)


def test_arguments_are_checked_before_c_reads_them(lib):
    q, k, v, real = _inputs(2, 1, 64, (0,), (2, 3), 4)
    rows = [x[0].transpose(0, 1).contiguous() for x in (q, k, v)]
    lens, flags = torch.tensor([2, 3], dtype=torch.int32), real.to(torch.uint8)
    with pytest.raises(ValueError, match="contiguous bfloat16"):
        lib.forward(rows[0].float(), rows[1], rows[2], flags, lens, 2, 0.125)
    with pytest.raises(ValueError, match="do not make"):
        lib.forward(*rows, flags, torch.tensor([2, 4], dtype=torch.int32), 2, 0.125)
    with pytest.raises(ValueError, match="multiple of 64"):
        q2, k2, v2, _ = _inputs(2, 1, 32, (0,), (2, 3), 4)
        lib.forward(*(x[0].transpose(0, 1).contiguous() for x in (q2, k2, v2)), flags, lens, 2, 0.125)


def test_the_switch_turns_it_off_with_a_reason(monkeypatch):
    ua.load.cache_clear()
    try:
        monkeypatch.setenv("RLVR_UPDATE_ATTENTION", "0")
        assert ua.load() is None and ua.why_not == "RLVR_UPDATE_ATTENTION=0"
        assert ua.kernel() == (None, "RLVR_UPDATE_ATTENTION=0")
    finally:
        ua.load.cache_clear()


@pytest.mark.parametrize(
    "extra, match",
    [
        (["model.autocast_bf16=false"], "model.autocast_bf16 is off"),
        (["model.autocast_bf16=true"], "no kernel for head size 8"),
    ],
    ids=["autocast-off", "head-size"],
)
def test_the_trainer_refuses_a_required_kernel_it_cannot_run(tiny_dir, tmp_path, extra, match):
    cfg = tiny_config(tiny_dir, tmp_path / "run", "train.fused_attention=true", *extra)
    with pytest.raises(UserError, match=f"train.fused_attention=true, but .*{match}"):
        Trainer(cfg).setup()  # fails before the run directory changes: nothing to close


def test_the_trainer_leaves_the_torch_kernels_where_it_cannot_run(tiny_dir, tmp_path):
    shared_prefix.use_kernel(object())  # a previous trainer's
    trainer = Trainer(tiny_config(tiny_dir, tmp_path / "run", "model.autocast_bf16=true"))
    try:
        assert trainer.setup()
        assert shared_prefix._KERNEL[0] is None
    finally:
        trainer.close()


def test_the_shapes_the_kernel_takes():
    assert shared_prefix.kernel_shape(9, 3, 64) and shared_prefix.kernel_shape(28, 4, 128)
    assert shared_prefix.kernel_shape(16, 1, 256)
    assert not shared_prefix.kernel_shape(4, 2, 8)  # head size not a multiple of 64
    assert not shared_prefix.kernel_shape(4, 2, 320)  # above 256
    assert not shared_prefix.kernel_shape(34, 2, 64)  # 17 query heads a key/value head
    assert not shared_prefix.kernel_shape(4, 3, 64)  # uneven grouping
