"""The rollout's decode loop (shared prefill, finished rows dropped) samples what ``model.generate``
samples on the P·G repeated prompts with the same token picker: the plain implementation."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteriaList

from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.base import response_mask_from_eos
from rlvr.rollout.decode import GreedyPicker, SeededPicker
from rlvr.rollout.hf import StopStrings, own_generation_settings, sample_seed

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?"]  # unequal lengths: left padding


class AsProcessor:
    """A picker as a ``generate`` logits processor: score 0 at the picked token, −inf elsewhere
    (``generate`` then runs greedily). Every row stays in ``generate``'s batch, so ``rows`` is all of them."""

    def __init__(self, pick) -> None:
        self.pick = pick

    def __call__(self, input_ids, scores):
        tokens = self.pick(scores.float(), torch.arange(scores.shape[0]))
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


def plain_generate(engine: HFRolloutEngine, prompts, G, pick, max_new_tokens):
    """(response tokens per row, truncated) from ``model.generate`` on every row, no sharing, no dropping."""
    tok, model = engine.tokenizer, engine.model
    enc = tok([p for p in prompts for _ in range(G)], return_tensors="pt", padding=True, add_special_tokens=False)
    enc = enc.to(model.device)
    L = enc.input_ids.shape[1]
    stopper = StopStrings(tok, engine.stop, L, enc.input_ids.shape[0], model.device) if engine.stop else None
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=engine.eos_ids, pad_token_id=tok.pad_token_id
    )
    with torch.no_grad(), own_generation_settings(model):
        out = model.generate(
            input_ids=enc.input_ids,
            attention_mask=enc.attention_mask,
            generation_config=config,
            logits_processor=[AsProcessor(pick)],
            stopping_criteria=StoppingCriteriaList([stopper]) if stopper else None,
        )
    response = out[:, L:]
    mask, truncated = response_mask_from_eos(response, engine.eos_ids, stop_at=stopper.at if stopper else None)
    return [r[m.bool()].tolist() for r, m in zip(response, mask)], truncated.tolist()


def responses(batch):
    ids = batch.input_ids[:, batch.prompt_len :]
    return [r[m.bool()].tolist() for r, m in zip(ids, batch.response_mask)], batch.truncated.tolist()


@pytest.mark.parametrize("lean_decode", [None, False], ids=["lean-where-it-runs", "model-forward"])
@pytest.mark.parametrize("stop", [[], ["</answer>", "7"]], ids=["eos-only", "stop-strings"])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 0.9)])
def test_decode_samples_what_generate_samples(stop, top_k, top_p, lean_decode, device):
    G, n = 4, 16
    engine = HFRolloutEngine(
        tiny_model(seed=3).to(device),
        tiny_tokenizer(),
        max_new_tokens=n,
        temperature=0.9,
        top_k=top_k,
        top_p=top_p,
        stop=stop,
        batch_seqs=8,  # 2 prompts per chunk: chunks of whole groups
        lean_decode=lean_decode,
    )
    # key 8: under these seeds rows both end early and run to the limit in every case (checked below)
    seeds = [sample_seed(8, i) for i in range(len(PROMPTS) * G)]
    got = responses(engine.generate(PROMPTS, G, seeds=seeds))
    want = plain_generate(engine, PROMPTS, G, SeededPicker(seeds, 0.9, top_k, top_p), n)
    assert got == want
    lengths = [len(r) for r in got[0]]
    assert min(lengths) < n and True in got[1]  # rows ended early (dropped from the batch) and rows ran to the limit


def test_greedy_decode_equals_generate(device):
    engine = HFRolloutEngine(tiny_model(seed=5).to(device), tiny_tokenizer(), max_new_tokens=12, stop=["</answer>"])
    assert responses(engine.generate(PROMPTS, 1, greedy=True)) == plain_generate(engine, PROMPTS, 1, GreedyPicker(), 12)


def test_sampled_logprobs_are_the_full_softmax_at_the_temperature(device):
    """The engine's log-probs (TIS) equal log-softmax(z / T) of the model's own forward on the sampled rows."""
    engine = HFRolloutEngine(
        tiny_model(seed=3).to(device),
        tiny_tokenizer(),
        max_new_tokens=10,
        temperature=0.7,
        top_k=5,
        logprobs=True,
        stop=["7"],
    )
    batch = engine.generate(PROMPTS, 3, seeds=[sample_seed(1, i) for i in range(9)])
    with torch.no_grad():
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
    L = batch.prompt_len
    resp = batch.input_ids[:, L:]
    want = torch.log_softmax(logits[:, L - 1 : -1].float() / 0.7, -1).gather(-1, resp[..., None])[..., 0]
    want = want * batch.response_mask
    torch.testing.assert_close(batch.logprobs, want, rtol=0, atol=2e-6)  # fp32: the same arithmetic up to rounding


def test_reserved_layer_does_what_a_dynamic_layer_does():
    """ReservedLayer (the decode's in-place KV cache) against transformers' DynamicLayer: repeat
    each row, append positions, drop rows, crop: the same keys and values after each."""
    from transformers.cache_utils import DynamicLayer

    from rlvr.rollout.decode import ReservedLayer

    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 3, 5, 4, generator=gen), torch.randn(2, 3, 5, 4, generator=gen)
    plain = DynamicLayer()
    plain.update(k, v)
    reserved = ReservedLayer(k, v, capacity=12)

    def same():
        torch.testing.assert_close(reserved.keys, plain.keys, rtol=0, atol=0)
        torch.testing.assert_close(reserved.values, plain.values, rtol=0, atol=0)
        assert reserved.get_seq_length() == plain.get_seq_length()

    for layer in (plain, reserved):
        layer.batch_repeat_interleave(3)
    same()
    for _ in range(4):
        nk, nv = torch.randn(6, 3, 1, 4, generator=gen), torch.randn(6, 3, 1, 4, generator=gen)
        torch.testing.assert_close(reserved.update(nk, nv), plain.update(nk, nv), rtol=0, atol=0)
    keep = torch.tensor([0, 2, 5])
    for layer in (plain, reserved):
        layer.batch_select_indices(keep)
    same()
    for layer in (plain, reserved):
        layer.crop(-2)
    same()
    with pytest.raises(ValueError, match="positions"):
        reserved.update(torch.zeros(3, 3, 6, 4), torch.zeros(3, 3, 6, 4))  # 7 + 6 > 12


def test_decode_and_the_shared_prompt_pass_use_the_installed_transformers_cache_names(monkeypatch):
    # transformers 5.24 renamed past_key_values to cache (kwarg and output) and warns once per process
    # on the old names; rlvr reads the name off the model's signature, so nothing warns on any release
    import warnings

    from transformers.utils import generic

    from rlvr.models.forward import response_logits

    logged = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a, **k: logged.append(msg))
    engine = HFRolloutEngine(tiny_model(seed=0), tiny_tokenizer(), max_new_tokens=6, temperature=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = engine.generate(PROMPTS[:2], 2, seeds=list(range(4)))
        response_logits(engine.model, batch.input_ids, batch.attention_mask, batch.response_mask.shape[1], group_size=2)
    old = [str(w.message) for w in caught if "past_key_values" in str(w.message)] + [
        m for m in logged if "past_key_values" in m
    ]
    assert old == []


def test_stop_strings_decode_only_rows_whose_newest_token_can_end_one():
    """Issue 61.6: the host decodes a row's tail only where its newest token can complete a stop string
    (its text holds a stop string's last character); every stop string that newly appears is still found,
    nothing else is, and most rows are not decoded."""
    import random

    from rlvr.models.tiny import tiny_tokenizer
    from rlvr.rollout.hf import StopStrings

    tok = tiny_tokenizer()
    rng = random.Random(0)
    responses = torch.tensor([[rng.randrange(len(tok)) for _ in range(30)] for _ in range(64)])
    for stop in (["7"], ["the answer", "= ?"], ["\\boxed{"]):
        check = StopStrings(tok, stop, 0, 64, "cpu")

        def holds(t: int) -> torch.Tensor:  # decoding every row's tail, as before
            tails = tok.batch_decode(responses[:, max(0, t - check.window) : t], skip_special_tokens=True)
            return torch.tensor([any(s in x for s in stop) for x in tails])

        found = 0
        for t in range(1, 31):
            got, every = check.hits(responses[:, :t]), holds(t)
            new = every & ~holds(t - 1)
            assert torch.equal(got & new, new), (stop, t)  # every new appearance is found
            assert not (got & ~every).any()  # and nothing that is not there
            found += int(new.sum())
        assert check.decoded_rows < 64 * 30 / 2, (stop, check.decoded_rows)
    assert found  # the last stop set appears somewhere: the check is not vacuous
