"""Seeded sampling: each sequence draws from its own generator, so what it samples depends on its
seed, not on the batch it is generated in (what N data-parallel workers need)."""

from __future__ import annotations

import torch

from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.decode import SeededPicker
from rlvr.rollout.hf import sample_seed
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
    other = _responses(_engine().generate(PROMPTS, G, seeds=sequence_seeds(1, 5, 0, 0, len(PROMPTS), G)))
    assert other != together  # another seed, other samples


def test_seeds_differ_by_every_part_of_the_key():
    keys = [(0, 1, 0, 2, 3), (1, 1, 0, 2, 3), (0, 2, 0, 2, 3), (0, 1, 1, 2, 3), (0, 1, 0, 3, 3), (0, 1, 0, 2, 4)]
    assert len({sample_seed(*k) for k in keys}) == len(keys)
    assert sample_seed(*keys[0]) == sample_seed(*keys[0]) < 2**63


def test_seeded_sampler_draws_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    n, T = 4000, 0.7
    picks = torch.tensor([int(SeededPicker([sample_seed(i)], T, 0, 1.0)(logits.clone(), ROW0)) for i in range(n)])
    freq = torch.bincount(picks, minlength=5).float() / n
    expected = torch.softmax(logits[0] / T, -1)
    # binomial std at p = 0.75, n = 4000 is 0.007: 0.03 is > 4 sigma
    torch.testing.assert_close(freq, expected, atol=0.03, rtol=0)
    # top-k keeps only the k largest logits
    topk = {int(SeededPicker([sample_seed(i)], T, 2, 1.0)(logits.clone(), ROW0)) for i in range(300)}
    assert topk == {0, 1}


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
    from rlvr.rollout.decode import inverse_cdf

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
