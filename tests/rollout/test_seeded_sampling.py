"""Seeded sampling: a sequence's t-th draw is counter_uniform(its seed, t), so what it samples depends
on its seed, not on the batch it is generated in (what N data-parallel workers need), and a decoder
can compute the draws itself (a static decode inside a captured CUDA graph)."""

from __future__ import annotations

import torch

from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.decode import SeededPicker
from rlvr.rollout.hf import sample_seed
from rlvr.rollout.sampling import counter_uniform, draw, inverse_cdf
from rlvr.training.loop import batch_logprobs
from rlvr.training.sampling import sequence_seeds

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7"]
ROW0 = torch.tensor([0])  # the picker's one row


def _engine(**kw):
    return HFRolloutEngine(tiny_model(seed=4), tiny_tokenizer(), max_new_tokens=8, temperature=0.9, **kw)


def _responses(batch) -> list[list[int]]:
    """Each row's response tokens (padding cut), comparable across batches of other prompt lengths."""
    ids = batch.input_ids[:, batch.prompt_len :]
    return [row[m.bool()].tolist() for row, m in zip(ids, batch.response_mask)]


def test_a_sequence_samples_the_same_in_any_batch():
    G = 4
    seeds = sequence_seeds(0, 5, 0, 0, len(PROMPTS), G)
    together = _responses(_engine(batch_seqs=64).generate(PROMPTS, G, seeds=seeds))
    # one prompt at a time (other padding, other batch), in chunks of 3 rows (groups split across chunks)
    alone = [
        r
        for p, prompt in enumerate(PROMPTS)
        for r in _responses(_engine(batch_seqs=3).generate([prompt], G, seeds=seeds[p * G : (p + 1) * G]))
    ]
    assert together == alone
    # a fresh engine with the same seeds, whatever the global RNG: the same samples
    torch.manual_seed(123)
    assert _responses(_engine(batch_seqs=5).generate(PROMPTS, G, seeds=seeds)) == together
    other = _responses(_engine().generate(PROMPTS, G, seeds=sequence_seeds(1, 5, 0, 0, len(PROMPTS), G)))
    assert other != together  # another seed, other samples


def test_seeds_differ_by_every_part_of_the_key():
    keys = [(0, 1, 0, 2, 3), (1, 1, 0, 2, 3), (0, 2, 0, 2, 3), (0, 1, 1, 2, 3), (0, 1, 0, 3, 3), (0, 1, 0, 2, 4)]
    assert len({sample_seed(*k) for k in keys}) == len(keys)
    assert sample_seed(*keys[0]) == sample_seed(*keys[0]) < 2**63


def test_seeded_sampler_draws_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    n, T = 4000, 0.7
    expected = torch.softmax(logits[0] / T, -1)
    # across sequences: n seeds, each at position 0
    picks = torch.tensor([int(SeededPicker([sample_seed(i)], T, 0, 1.0)(logits.clone(), ROW0)) for i in range(n)])
    # binomial std at p = 0.75, n = 4000 is 0.007: 0.03 is > 4 sigma
    torch.testing.assert_close(torch.bincount(picks, minlength=5).float() / n, expected, atol=0.03, rtol=0)
    # along a sequence: one seed, positions 0 .. n-1
    pick = SeededPicker([sample_seed(0)], T, 0, 1.0)
    picks = torch.tensor([int(pick(logits.clone(), ROW0)) for _ in range(n)])
    torch.testing.assert_close(torch.bincount(picks, minlength=5).float() / n, expected, atol=0.03, rtol=0)
    # top-k keeps only the k largest logits
    topk = {int(SeededPicker([sample_seed(i)], T, 2, 1.0)(logits.clone(), ROW0)) for i in range(300)}
    assert topk == {0, 1}


def test_the_picker_draws_counter_uniform_at_its_call_count():
    """The t-th call draws counter_uniform(seeds[rows], t): what ``uniform`` gives and what a decoder
    that samples by itself (``draw`` at ``uniform(rows, t)``) picks."""
    seeds = [sample_seed(2, i) for i in range(5)]
    pick = SeededPicker(seeds, 0.8, 3, 0.9)
    assert pick.seeds.dtype == torch.int64 and pick.seeds.tolist() == seeds and pick.position == 0
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([4, 0, 2])
    for t in range(6):
        logits = torch.randn(3, 50, generator=g)
        u = pick.uniform(rows, t)
        assert torch.equal(u, counter_uniform(torch.tensor(seeds)[rows], t))
        assert torch.equal(pick(logits, rows), draw(logits, u, 0.8, 3, 0.9, SeededPicker.BLOCK))
        assert pick.position == t + 1
    assert not hasattr(pick, "gens")  # no per-row torch.Generator: nothing stateful but the count


def test_a_row_samples_the_same_alone_in_a_batch_and_after_drops():
    """A decode's picker: six rows, some dropped along the way, the survivors reordered; each row
    picks at every position what a picker of that row alone picks (its own logits at each step)."""
    B, V, steps = 6, 40, 8
    seeds = [sample_seed(8, i) for i in range(B)]
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(steps, B, V, generator=g) * 2  # row r's logits at position t
    pick = SeededPicker(seeds, 0.9)
    live = torch.arange(B)
    got = {r: [] for r in range(B)}
    for t in range(steps):
        if t == 3:
            live = live[[0, 2, 3, 5]]  # rows 1 and 4 finished
        if t == 5:
            live = live[[3, 0, 1]]  # row 3 finished, the rest in another order
        tokens = pick(logits[t, live], live)
        for r, tok in zip(live.tolist(), tokens.tolist()):
            got[r].append(tok)
    for r in range(B):
        alone = SeededPicker([seeds[r]], 0.9)
        want = [int(alone(logits[t, r : r + 1], ROW0)) for t in range(len(got[r]))]
        assert got[r] == want, r


def test_seeded_engine_logprobs_match_the_trainer():
    engine = _engine(logprobs=True)
    G = 2
    batch = engine.generate(PROMPTS, G, seeds=sequence_seeds(0, 0, 0, 0, len(PROMPTS), G))
    lp = batch_logprobs(
        engine.policy,
        batch,
        micro_batch_seqs=8,
        group_size=1,
        temperature=0.9,
        autocast=lambda: torch.autocast("cpu", enabled=False),
    )
    torch.testing.assert_close(batch.logprobs, lp, rtol=1e-4, atol=1e-5)


def test_two_level_inverse_cdf_picks_what_a_full_cumsum_picks():
    """The sampler's block search equals the first v with cumsum(p)[v] > u * total over the whole
    vocabulary (float64), on rows with cut (-inf) tokens, ragged block ends and peaked rows."""
    gen = torch.Generator().manual_seed(0)
    rows, V = 3000, 1000  # 1000 = 3 blocks of 256 + a ragged 232
    logits = torch.randn(rows, V, generator=gen) * torch.rand(rows, 1, generator=gen) * 8
    logits[torch.rand(rows, V, generator=gen) < 0.3] = float("-inf")
    logits[::7, :900] = float("-inf")  # all mass in the ragged last block
    u = torch.rand(rows, generator=gen, dtype=torch.float64)
    w = torch.exp(logits.float() - logits.amax(-1, keepdim=True)).double()
    cdf = w.cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    got = inverse_cdf(logits, u, 256)
    assert torch.equal(got, want)
    assert torch.isfinite(logits.gather(1, got[:, None])).all()  # a cut token is never picked


def test_top_p_on_the_top_k_set_keeps_what_the_warpers_keep():
    """Issue 61.6: top-p over the k kept logits only (a [b, k] sort, not [b, V]) keeps the same tokens as
    transformers' TopK then TopP warpers, and the draws are the same."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    from rlvr.rollout.sampling import draw, top_k_top_p

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g) * 3
    for k, p in ((50, 0.9), (5, 0.5), (200, 0.99), (1, 0.3), (2000, 0.7)):
        want = TopPLogitsWarper(top_p=p)(None, TopKLogitsWarper(top_k=k)(None, logits))
        got = top_k_top_p(logits, k, p)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), (k, p)
        assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])
    u = torch.rand(64, generator=g, dtype=torch.float64)
    warped = TopPLogitsWarper(top_p=0.9)(None, TopKLogitsWarper(top_k=50)(None, logits / 0.7))
    from rlvr.rollout.sampling import inverse_cdf

    assert torch.equal(draw(logits, u, 0.7, 50, 0.9), inverse_cdf(warped, u))
