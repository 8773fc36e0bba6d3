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
    logp, ent = F.pass_logprobs(model, ids, mask, tokens, temperature=0.7, entropy=True, group_size=G, fused=fused)
    resp = mask[:, -T:].float()
    loss = -(logp * resp).sum() / resp.sum() + 0.01 * (ent * resp).sum() * entropy_grad
    loss.backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("build", [tiny_model, tiny_qwen2], ids=["llama-tied", "qwen2-gqa-bias"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
def test_one_pass_equals_the_per_row_pass(build, fused, monkeypatch):
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
