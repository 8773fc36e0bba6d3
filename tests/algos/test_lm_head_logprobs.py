"""lm_head_logprobs (the LM head fused with the log-probs, tile by tile) against the plain head:
F.linear to the full [N, V] logits, then log_softmax + gather and the entropy -sum p log p."""

from __future__ import annotations

import pytest
import torch

import rlvr.algos.logprobs as logprobs_mod
from rlvr.algos import lm_head_logprobs, token_logprobs_entropy


def _naive(hidden, weight, bias, tokens, temperature):
    z = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias).float() / temperature, -1)
    return z.gather(-1, tokens[:, None])[:, 0], -(z.exp() * z).sum(-1)


def _inputs(seed: int, N: int = 37, H: int = 16, V: int = 53, bias: bool = True):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.5).requires_grad_()
    b = torch.randn(V, generator=gen).requires_grad_() if bias else None
    tokens = torch.randint(0, V, (N,), generator=gen)
    upstream = torch.randn(2, N, generator=gen)  # non-uniform gradients into the log-probs and the entropy
    return hidden, weight, b, tokens, upstream


# tiles: several that do not divide N=37 or V=53, one covering everything, tokens one at a time
@pytest.mark.parametrize("chunk_tokens, chunk_vocab", [(8, 16), (37, 53), (5, 100), (100, 7), (1, 53)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("keep", [True, False], ids=["tiles_kept", "tiles_recomputed"])
def test_values_and_gradients_equal_the_plain_head(chunk_tokens, chunk_vocab, temperature, keep, monkeypatch):
    if not keep:  # the path of logits above HEAD_KEEP_LOGITS_BYTES: the backward recomputes each tile
        monkeypatch.setattr(logprobs_mod, "HEAD_KEEP_LOGITS_BYTES", 0)
    hidden, weight, bias, tokens, (g_logp, g_ent) = _inputs(0)
    tiles = dict(chunk_tokens=chunk_tokens, chunk_vocab=chunk_vocab)
    logp, ent = lm_head_logprobs(hidden, weight, tokens, bias=bias, temperature=temperature, entropy=True, **tiles)
    ref_logp, ref_ent = _naive(hidden, weight, bias, tokens, temperature)
    assert logp.dtype == ent.dtype == torch.float32 and logp.shape == ent.shape == (37,)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ent, ref_ent)
    params = (hidden, weight, bias)
    fused = torch.autograd.grad((logp * g_logp).sum() + (ent * g_ent).sum(), params)
    plain = torch.autograd.grad((ref_logp * g_logp).sum() + (ref_ent * g_ent).sum(), params, retain_graph=True)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # the log-probs alone (an entropy metric brings no gradient)
    logp, none = lm_head_logprobs(hidden, weight, tokens, bias=bias, temperature=temperature, **tiles)
    assert none is None
    fused = torch.autograd.grad((logp * g_logp).sum(), params)
    plain = torch.autograd.grad((ref_logp * g_logp).sum(), params)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_equals_the_one_pass_logprobs_on_full_logits():
    """The same numbers as today's path, token_logprobs_entropy over the full logits (no bias)."""
    hidden, weight, _, tokens, _ = _inputs(1, bias=False)
    logp, ent = lm_head_logprobs(hidden, weight, tokens, temperature=0.8, entropy=True, chunk_tokens=8, chunk_vocab=16)
    full_logp, full_ent = token_logprobs_entropy((hidden @ weight.T)[None], tokens[None], temperature=0.8)
    torch.testing.assert_close(logp, full_logp[0])
    torch.testing.assert_close(ent, full_ent[0])


def test_a_frozen_weight_gets_no_gradient_and_the_hidden_states_do():
    """LoRA's case: the head is frozen, the gradient flows to the hidden states only."""
    hidden, weight, _, tokens, (g, _) = _inputs(2, bias=False)
    weight = weight.detach()
    logp, _ = lm_head_logprobs(hidden, weight, tokens, chunk_tokens=8, chunk_vocab=16)
    (logp * g).sum().backward()
    expected = torch.autograd.grad((_naive(hidden, weight, None, tokens, 1.0)[0] * g).sum(), hidden)[0]
    torch.testing.assert_close(hidden.grad, expected, rtol=1e-4, atol=1e-5)
    assert weight.grad is None


def test_bf16_autocast_matches_the_plain_head_under_autocast():
    """Under CPU bf16 autocast the product runs in bf16 (as nn.Linear's would) and the log-sum-exp
    in float32: close to the plain head under the same autocast within bf16 rounding."""
    hidden, weight, bias, tokens, (g_logp, g_ent) = _inputs(3, N=40, H=32, V=300)
    params = (hidden, weight, bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = lm_head_logprobs(hidden, weight, tokens, bias=bias, entropy=True, chunk_tokens=16, chunk_vocab=64)
        logits = torch.nn.functional.linear(hidden, weight, bias)
    assert logits.dtype == torch.bfloat16
    z = torch.log_softmax(logits.float(), -1)
    ref_logp, ref_ent = z.gather(-1, tokens[:, None])[:, 0], -(z.exp() * z).sum(-1)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-2, atol=2e-2)
    fused = torch.autograd.grad((logp * g_logp).sum() + (ent * g_ent).sum(), params)
    plain = torch.autograd.grad((ref_logp * g_logp).sum() + (ref_ent * g_ent).sum(), params)
    for a, b in zip(fused, plain):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2)


def test_bf16_weights_return_bf16_gradients_summed_in_float32():
    hidden, weight, _, tokens, (g, _) = _inputs(4, bias=False)
    h16, w16 = (t.detach().to(torch.bfloat16).requires_grad_() for t in (hidden, weight))
    logp, _ = lm_head_logprobs(h16, w16, tokens, chunk_tokens=8, chunk_vocab=16)
    assert logp.dtype == torch.float32
    gh, gw = torch.autograd.grad((logp * g).sum(), (h16, w16))
    assert gh.dtype == gw.dtype == torch.bfloat16
    ref_logp, _ = _naive(h16.float(), w16.float(), None, tokens, 1.0)
    rh, rw = torch.autograd.grad((ref_logp * g).sum(), (h16, w16))
    torch.testing.assert_close(logp, ref_logp, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(gh.float(), rh.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(gw.float(), rw.float(), rtol=3e-2, atol=3e-2)


def test_tiles_are_kept_below_the_budget_and_recomputed_above(monkeypatch):
    """Saved for backward: the [N, V] float32 logits in tiles below HEAD_KEEP_LOGITS_BYTES (N·V·4 =
    37·53·4 = 7844 bytes here), nothing vocabulary-sized above it, and nothing in a no-grad pass."""
    hidden, weight, _, tokens, _ = _inputs(5, bias=False)

    def saved_logit_elements(budget: int, grad: bool = True) -> int:
        monkeypatch.setattr(logprobs_mod, "HEAD_KEEP_LOGITS_BYTES", budget)
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            with torch.set_grad_enabled(grad):
                lm_head_logprobs(hidden, weight, tokens, chunk_tokens=8, chunk_vocab=16)
        return sum(n for n in sizes if n not in (hidden.numel(), weight.numel(), 37))

    assert saved_logit_elements(37 * 53 * 4) == 37 * 53
    assert saved_logit_elements(37 * 53 * 4 - 1) == 0
    assert saved_logit_elements(2**30, grad=False) == 0


@pytest.mark.parametrize("chunk_tokens", [8, 37], ids=["token_tiles", "one_token_tile"])
def test_accumulate_grad_adds_the_weight_gradient_into_dot_grad(chunk_tokens):
    """accumulate_grad=True: the weight's gradient lands in .grad directly, allocated on the first
    backward and added to on the next (gradient accumulation), equal to autograd's; the hidden states'
    and the bias's gradients still go through autograd."""
    hidden, weight, bias, tokens, (g_logp, g_ent) = _inputs(3)
    tiles = dict(chunk_tokens=chunk_tokens, chunk_vocab=16)

    def loss(direct: bool):
        logp, ent = lm_head_logprobs(hidden, weight, tokens, bias=bias, entropy=True, accumulate_grad=direct, **tiles)
        return (logp * g_logp).sum() + (ent * g_ent).sum()

    want = [g.clone() for g in torch.autograd.grad(loss(False), (hidden, weight, bias))]
    for micro_batch in (1, 2):
        loss(True).backward()
        for got, w in zip((hidden.grad, weight.grad, bias.grad), want):
            torch.testing.assert_close(got, micro_batch * w, rtol=1e-4, atol=1e-5)
    assert weight.grad.is_contiguous() and weight.grad.dtype == torch.float32
    # a non-contiguous .grad is added to once at the end, not written over
    weight.grad = torch.zeros(weight.shape[::-1]).t()
    loss(True).backward()
    torch.testing.assert_close(weight.grad, want[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_kept_tiles_give_the_recomputed_tiles_gradients_bit_for_bit(temperature, low, monkeypatch):
    """Under autocast the kept tiles are the low-precision products, not float32 logits; the backward
    rebuilds the float32 tiles from them exactly (the temperature too), so the values and gradients
    equal the recomputing path's bit for bit; the budget counts their 2-byte elements."""
    hidden, weight, bias, tokens, (g_logp, g_ent) = _inputs(6, N=40, H=32, V=300)
    params = (hidden, weight, bias)

    def run(budget: int):
        monkeypatch.setattr(logprobs_mod, "HEAD_KEEP_LOGITS_BYTES", budget)
        saved = []
        with (
            torch.autocast("cpu", dtype=low),
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.numel(), t.dtype)) or t, lambda t: t),
        ):
            logp, ent = lm_head_logprobs(
                hidden,
                weight,
                tokens,
                bias=bias,
                temperature=temperature,
                entropy=True,
                chunk_tokens=16,
                chunk_vocab=64,
            )
        grads = torch.autograd.grad((logp * g_logp).sum() + (ent * g_ent).sum(), params)
        tiles = [(n, dt) for n, dt in saved if n not in (hidden.numel(), weight.numel(), bias.numel(), 40)]
        return (logp, ent, *grads), tiles

    kept, kept_tiles = run(40 * 300 * 2)  # exactly the products' bytes
    recomputed, none = run(40 * 300 * 2 - 1)
    assert sum(n for n, _ in kept_tiles) == 40 * 300 and {dt for _, dt in kept_tiles} == {low}
    assert none == []
    for a, b in zip(kept, recomputed):
        assert torch.equal(a, b)
