"""The static-cache decode (rlvr.rollout.static) gives what the dynamic decode gives: greedy token for token,
seeded samples draw for draw, stop strings, log-probs and token accounting; its step compiles to one graph
with no breaks (what CUDA graphs need), and sees weights changed in place. On a CPU the step runs eagerly
or under torch.compile's eager backend; on a GPU (``pytest --device cuda``) the engine compiles it."""

from __future__ import annotations

import pytest
import torch
from tiny_run import metrics, tiny_config

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.models.forward import output_cache
from rlvr.models.tiny import tiny_model, tiny_qwen2, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.decode import GreedyPicker, decode
from rlvr.rollout.hf import eos_token_ids, sample_seed
from rlvr.rollout.static import _step_fn, decode_static, static_cache

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?"]


MODELS = {"llama": lambda: tiny_model(seed=5), "qwen2": lambda: tiny_qwen2().eval()}


def _engines(model, device, **kw):
    tok = tiny_tokenizer()
    model = model.to(device)
    common = dict(max_new_tokens=14, batch_seqs=6, packed_weights=False, **kw)
    return (
        HFRolloutEngine(model, tok, static_decode=False, lean_decode=False, **common),
        HFRolloutEngine(model, tok, static_decode=True, **common),
    )


def _same(a, b, logprobs=False):
    assert a.texts == b.texts
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.truncated, b.truncated)
    if logprobs:
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(MODELS))
def test_greedy_is_token_identical_to_the_dynamic_decode(arch, device):
    dynamic, static = _engines(MODELS[arch](), device, stop=["7"])
    assert static.static and not dynamic.static
    a, b = (e.generate(PROMPTS, 3, greedy=True) for e in (dynamic, static))
    _same(a, b)


@pytest.mark.parametrize("arch", list(MODELS))
def test_seeded_samples_stop_strings_and_logprobs_equal_the_dynamic_decode(arch, device):
    dynamic, static = _engines(
        MODELS[arch](), device, temperature=0.9, top_k=30, stop=["</answer>", "7"], logprobs=True
    )
    seeds = [sample_seed(3, i) for i in range(len(PROMPTS) * 4)]
    a, b = (e.generate(PROMPTS, 4, seeds=seeds) for e in (dynamic, static))
    _same(a, b, logprobs=True)
    assert (a.response_mask.sum(-1) < 14).any()  # rows ended early: the static decode kept stepping them


def test_the_step_compiles_to_one_graph_without_breaks():
    """CUDA graphs capture a whole step only when dynamo traces it as one graph."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model(**enc, use_cache=True, logits_to_keep=1)
        cache = static_cache(model, output_cache(out), 2, 64)
        mask = torch.zeros(4, 64, dtype=torch.long)
        mask[:, : enc.input_ids.shape[1] + 1] = 1
        explained = torch._dynamo.explain(_step_fn(model))(
            torch.zeros(4, 1, dtype=torch.long), mask, torch.full((4, 1), 5), cache
        )
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.slow
def test_the_compiled_step_decodes_what_the_dynamic_decode_does_and_sees_new_weights():
    """torch.compile (eager backend on a CPU: the capture without a code generator) over two rollouts, with
    the weights changed in place between them, as an optimizer step changes them."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(max_new_tokens=10, pick=GreedyPicker(), eos_ids=eos_token_ids(model, tok), pad_id=tok.pad_token_id)
    for _ in range(2):
        want = decode(model, enc.input_ids, enc.attention_mask, 2, **kw)
        got = decode_static(model, enc.input_ids, enc.attention_mask, 2, compile="eager", **kw)
        assert torch.equal(got.response, want.response) and torch.equal(got.stop_at, want.stop_at)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)  # in place: the same tensors, new values


def test_static_and_lean_decode_together_are_one_config_error():
    with pytest.raises(UserError, match="rollout.lean_decode=true and rollout.static_decode=true are two decoders"):
        load_config(None, ["rollout.lean_decode=true", "rollout.static_decode=true"])


def test_auto_is_static_on_a_gpu_only():
    engine = HFRolloutEngine(tiny_model(), tiny_tokenizer(), max_new_tokens=4)
    assert engine.static is False


def test_training_with_the_static_decode_takes_the_steps_the_dynamic_decode_takes(tiny_dir, tmp_path):
    from rlvr.training import train

    runs = {}
    for how in ("true", "false"):
        train(
            tiny_config(
                tiny_dir,
                tmp_path / how,
                "train.steps=2",
                f"rollout.static_decode={how}",
                "rollout.lean_decode=false",
                "model.packed_weights=false",
            )
        )
        runs[how] = metrics(tmp_path / how, timings=False)
    assert runs["true"] == runs["false"]
