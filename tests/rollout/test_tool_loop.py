"""Rollouts with tools (rlvr.environments.ToolCalls, run by rlvr.rollout.episodes) on a tiny random model:
results appended as masked,
attended tokens; the same responses from the dynamic, static and lean decoders and in any batch;
no tools = the single-turn tokens; the budget counts results; results change no loss or gradient
through their log-probs; the update's passes (length buckets, packing, shared prompts) agree."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed
from rlvr.tools import CallSyntax, Toolbox, tool_stats
from rlvr.training.loop import accumulate_gradients, update_passes

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?", "what is 5 * 6"]
G = 8
# words of the tiny vocabulary: a call is "= <args> ?", a result "the <output> answer"
SYNTAX = CallSyntax("= {args} ?", "the {output} answer")
SEEDS = [sample_seed(11, i) for i in range(len(PROMPTS) * G)]


def _engine(model=None, *, tools=True, max_calls=3, **kw):
    model = tiny_model(seed=5).eval() if model is None else model
    box = Toolbox(["calculator"], SYNTAX, workers=0, max_calls=max_calls) if tools else None
    common = dict(max_new_tokens=24, batch_seqs=16, packed_weights=False, lean_decode=False, static_decode=False)
    return HFRolloutEngine(model, tiny_tokenizer(), tools=box, **{**common, **kw})


def _rows(batch):
    """Each row's response tokens up to its end, its trained-token mask there, its text."""
    ext = batch.response_extent.tolist()
    return [
        (batch.response_ids[i, : ext[i]].tolist(), batch.response_mask[i, : ext[i]].tolist(), batch.texts[i])
        for i in range(len(ext))
    ]


@pytest.fixture(scope="module")
def sampled():
    engine = _engine(logprobs=True)
    return engine, engine.generate(PROMPTS, G, seeds=SEEDS)


def test_results_are_attended_but_not_trained_on(sampled):
    engine, batch = sampled
    tok = engine.tokenizer
    assert sum(batch.tool_calls) >= 3, "the seeds must give calls to test"
    T = batch.response_mask.shape[1]
    attended = batch.attention_mask[:, batch.prompt_len :]
    env = attended.bool() & ~batch.response_mask.bool()  # [B, T] the results' tokens
    assert (env.sum(-1) > 0).tolist() == [c > 0 for c in batch.tool_calls]
    assert torch.all(batch.logprobs[env] == 0) and torch.all(batch.logprobs[batch.response_mask.bool()] < 0)
    # each row: contiguous (attended up to its end), trained tokens then results then trained tokens
    for i in range(batch.input_ids.shape[0]):
        n = int(batch.response_extent[i])
        assert attended[i, :n].all() and not attended[i, n:].any() and n <= T
        if batch.tool_calls[i]:
            ids = batch.response_ids[i, :n][env[i, :n]].tolist()
            assert "?the" in batch.texts[i]  # the call's end, then the result, shown in the text
            assert ids[0] == tok.convert_tokens_to_ids("the")  # the result text's own tokens
            if not batch.truncated[i]:  # a whole result: "the <output> answer"
                assert tok.convert_tokens_to_ids("answer") in ids
    assert tool_stats(batch.tool_calls, batch.tool_errors, [1.0] * len(batch.texts))["tool_calls_mean"] > 0


def test_the_budget_counts_results_and_the_call_limit_holds():
    engine = _engine(max_calls=1)
    batch = engine.generate(PROMPTS, G, seeds=SEEDS)
    assert max(batch.tool_calls) == 1
    ext = batch.response_extent
    assert int(ext.max()) <= 24
    assert torch.equal(batch.truncated, batch.truncated & (ext == 24) | batch.truncated)
    assert all(int(e) == 24 for e, t in zip(ext, batch.truncated) if t)


def test_without_a_call_a_row_is_the_single_turn_rows_token_for_token(sampled):
    """Segment 0 draws with the row's own seed: a row that calls nothing is what a rollout without tools
    gives, and a row that calls is that rollout's row up to the call's end."""
    _, batch = sampled
    plain = _engine(tools=False, logprobs=True).generate(PROMPTS, G, seeds=SEEDS)
    assert plain.tool_calls is None and plain.tool_errors is None
    for (ids, mask, text), (ids0, mask0, text0), calls in zip(_rows(batch), _rows(plain), batch.tool_calls):
        if calls == 0:
            assert (ids, mask, text) == (ids0, mask0, text0)
        else:
            k = mask.index(0)  # the first result token: the call ended just before it
            assert ids[:k] == ids0[:k]
    assert any(c == 0 for c in batch.tool_calls) and any(c > 0 for c in batch.tool_calls)


def test_rows_do_not_depend_on_their_batch_or_on_the_decoder(sampled):
    _, batch = sampled
    want = _rows(batch)
    # another batch: the last two prompts alone, smaller decode batches
    alone = _engine(batch_seqs=4).generate(PROMPTS[2:], G, seeds=SEEDS[2 * G :])
    assert _rows(alone) == want[2 * G :]
    static = _engine(static_decode=True).generate(PROMPTS, G, seeds=SEEDS)
    assert _rows(static) == want
    lean = _engine(packed_weights=None, lean_decode=None)
    if lean.lean is not None:  # a float32 Llama on packed CPU weights
        assert _rows(lean.generate(PROMPTS, G, seeds=SEEDS)) == want


def test_greedy_runs_the_loop_alike_on_both_decoders():
    a = _engine().generate(PROMPTS, 1, greedy=True)
    b = _engine(static_decode=True).generate(PROMPTS, 1, greedy=True)
    assert _rows(a) == _rows(b) and a.tool_calls == b.tool_calls


def _cfg(mb: int, *extra: str):
    return load_config(
        None,
        [
            f"rollout.samples_per_prompt={G}",
            f"train.prompts_per_step={len(PROMPTS)}",
            f"train.micro_batch_seqs={mb}",
            "algo.kl_coef=0.1",
            "algo.tis_cap=2.0",
            "algo.num_iterations=2",
            *extra,
        ],
    )


def _grads(model, batch, adv, old, ref, cfg):
    model.zero_grad(set_to_none=True)
    stats = accumulate_gradients(model, batch, adv, old, ref, cfg, contextlib.nullcontext)
    return torch.cat([p.grad.flatten() for p in model.parameters()]), stats


@pytest.mark.parametrize(
    "algo",
    [
        (),
        ("algo.ratio_level=sequence", "algo.loss_agg=seq_mean_token_mean"),  # GSPO
        ("algo.loss_agg=seq_mean_token_sum_norm", "algo.entropy_coef=0.01"),  # Dr. GRPO's, an entropy bonus
    ],
    ids=["grpo", "gspo", "dr_grpo-entropy"],
)
def test_result_logprobs_change_no_loss_and_no_gradient(sampled, algo):
    _, batch = sampled
    model = tiny_model(seed=5)
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(batch.input_ids.shape[0], generator=gen)
    old = torch.randn(batch.response_mask.shape, generator=gen) * 0.1 - 3
    ref = torch.randn(batch.response_mask.shape, generator=gen) * 0.1 - 3
    cfg = _cfg(8, *algo)
    g0, s0 = _grads(model, batch, adv, old, ref, cfg)
    env = batch.attention_mask[:, batch.prompt_len :].bool() & ~batch.response_mask.bool()
    assert env.any()
    noisy = dataclasses.replace(batch, logprobs=batch.logprobs.masked_fill(env, 5.0))
    g1, s1 = _grads(model, noisy, adv, old.masked_fill(env, 7.0), ref.masked_fill(env, -9.0), cfg)
    assert torch.equal(g0, g1)
    assert all(torch.equal(s0[k], s1[k]) for k in s0)
    assert g0.abs().sum() > 0


@pytest.mark.parametrize(
    "extra",
    [
        ("train.length_buckets=true",),
        ("train.shared_prompt_forward=true", "train.length_buckets=true"),
        ("train.micro_batch_tokens=200", "train.shared_prompt_forward=false"),
    ],
)
def test_update_passes_run_to_each_rows_end(sampled, extra):
    """Length buckets, shared prompts and packing plan by the rows' extent, results included: the
    gradient equals one plain pass over the whole batch."""
    _, batch = sampled
    model = tiny_model(seed=5)
    adv = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(1))
    plain = _cfg(len(PROMPTS) * G, "train.length_buckets=false", "train.shared_prompt_forward=false")
    want, _ = _grads(model, batch, adv, None, None, plain)
    got, _ = _grads(model, batch, adv, None, None, _cfg(8, *extra))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    for cfg in (plain, _cfg(8, *extra)):  # every trained token lies in a pass (none cut off after a result)
        passes = update_passes(batch, cfg, model)
        assert sum(int(p.mask.sum()) for p in passes) == int(batch.response_mask.sum())


def test_a_call_may_open_in_the_prompt(tmp_path):
    """An assistant prefix can open the first call ("<think><tool>calculator:"): the response closes it."""
    plugin = tmp_path / "echo.py"
    plugin.write_text("def seven(args):\n    return '7'\n")
    box = Toolbox([f"{plugin}:seven"], SYNTAX, workers=0)
    engine = _engine()
    engine.tools = box
    batch = engine.generate([p + " =" for p in PROMPTS], G, seeds=SEEDS)
    called = [t for t, c in zip(batch.texts, batch.tool_calls) if c]
    assert called
    for text in called:  # the first call is whole (opened by the prompt), so its result is the tool's
        after = text.split(" ?", 1)[1]
        assert "the 7 answer".startswith(after[:12]), text  # (a result may be cut by the budget)
