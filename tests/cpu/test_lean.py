"""The lean decode step (rlvr.cpu.lean) computes what the model's own forward computes: logits of
every live row against a full forward over prompt + response, for Llama and Qwen2 shapes (grouped-
and multi-query attention, biases, a head_dim of its own, left padding, dropped rows); the same
sampled tokens through the engine; never stale weights; a clear reason where it cannot run."""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.config import load_config
from rlvr.cpu.lean import LeanDecoder, LeanUnavailable, unsupported
from rlvr.cpu.packed import PackedLinears, packing_available
from rlvr.errors import UserError
from rlvr.models.forward import output_cache
from rlvr.models.tiny import TINY_WORDS, tiny_model, tiny_qwen2, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN prepacked linear")

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?"]  # unequal lengths: left padding
SHAPE = dict(
    vocab_size=len(TINY_WORDS),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=None,
)


def llama_with_biases():
    """Multi-query attention, biases on every projection, a head_dim other than hidden / heads."""
    torch.manual_seed(5)
    return LlamaForCausalLM(
        LlamaConfig(**SHAPE, num_key_value_heads=1, head_dim=16, attention_bias=True, mlp_bias=True)
    )


def qwen2():
    """Qwen2's q/k/v biases, an untied LM head."""
    return tiny_qwen2()


def llama_gqa_d64():
    """Grouped-query attention with head_dim 64: a shape the compiled decode kernels have (3 query heads a KV head)."""
    torch.manual_seed(8)
    return LlamaForCausalLM(
        LlamaConfig(**{**SHAPE, "hidden_size": 48, "num_attention_heads": 6}, num_key_value_heads=2, head_dim=64)
    )


def qwen2_mqa_d128():
    """Qwen2's biases with head_dim 128 and 4 query heads over one KV head: the kernel's other size."""
    torch.manual_seed(9)
    return Qwen2ForCausalLM(
        Qwen2Config(**{**SHAPE, "hidden_size": 512}, num_key_value_heads=1, tie_word_embeddings=False)
    )


MODELS = {
    "llama": lambda: tiny_model(seed=4),
    "llama-mqa-biases": llama_with_biases,
    "qwen2": qwen2,
    "llama-gqa-d64": llama_gqa_d64,
    "qwen2-mqa-d128": qwen2_mqa_d128,
}
KERNEL_SHAPES = ["llama-gqa-d64", "qwen2-mqa-d128"]  # the others run the attention as torch operations
HAVE_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
LONG_PROMPTS = [" ".join(["what is 3 + 4 ?"] * 5), "the answer", " ".join(["2 + 2 = 7 and 9 + 1 = ?"] * 3)]


def _eos(model):
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0
    return model.eval()


def _steps_match_a_full_forward(model, prompts, *, G, steps, drops, kernel, atol=2e-5):
    """Runs ``steps`` lean decode steps of G rows per prompt (teacher-forced random tokens; at each
    step in ``drops`` the live rows at those indices stay) and compares each step's logits with the
    model's full forward over prompt + response so far. Returns the decoder."""
    enc = tiny_tokenizer()(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    P = len(prompts)
    lean = LeanDecoder(model, PackedLinears(model), kernel=kernel)
    ids, mask = enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)
    prompt_len = mask.sum(-1)
    response = torch.randint(3, len(TINY_WORDS), (P * G, steps), generator=torch.Generator().manual_seed(0))
    live = torch.arange(P * G)
    with torch.no_grad():
        positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, position_ids=positions, use_cache=True)
        cache = lean.cache(output_cache(out), enc.attention_mask, G, steps)
        for t in range(steps):
            if t in drops:  # rows end: the rest move up in the cache
                keep = torch.tensor(drops[t])
                cache.select(keep)
                live = live[keep]
            got = lean.step(response[live, t], prompt_len[live] + t, cache)
            full_ids = torch.cat([ids[live], response[live, : t + 1]], 1)
            full_mask = torch.cat([mask[live], torch.ones(len(live), t + 1, dtype=mask.dtype)], 1)
            want = model(
                input_ids=full_ids, attention_mask=full_mask, position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)
            ).logits[:, -1]
            torch.testing.assert_close(got, want, atol=atol, rtol=atol)
    return lean


@pytest.mark.parametrize("kernel", [None, False], ids=["auto", "torch-ops"])
@pytest.mark.parametrize("arch", list(MODELS))
def test_lean_step_logits_equal_a_full_forward(arch, kernel):
    lean = _steps_match_a_full_forward(
        _eos(MODELS[arch]()), PROMPTS, G=3, steps=6, drops={3: [0, 2, 3, 5, 7]}, kernel=kernel
    )
    compiled = kernel is None and arch in KERNEL_SHAPES and HAVE_CC
    assert lean.attention == ("kernel" if compiled else "torch")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the attention runs as torch operations")
@pytest.mark.parametrize("arch", KERNEL_SHAPES)
def test_compiled_attention_over_long_prompts_and_responses_equals_a_full_forward(arch):
    """Prompts of 10-50 tokens (left padding of up to 40) and 40 response positions: the kernel's
    16-position vector blocks and their scalar tails, on both parts of the cache, before and after
    rows end (twice, in different groups)."""
    lean = _steps_match_a_full_forward(
        _eos(MODELS[arch]()),
        LONG_PROMPTS,
        G=2,
        steps=40,
        drops={5: [0, 1, 3, 4, 5], 21: [0, 2, 4]},
        kernel=True,
        atol=5e-5,
    )
    assert lean.attention == "kernel" and "compiled kernel" in lean.describe()


def test_the_kernel_says_why_it_does_not_run(monkeypatch):
    """A shape it has no kernel for, no compiler, a compiler that fails, and the switch that turns it off:
    the lean step runs torch operations and says why; kernel=True then raises instead."""
    from rlvr.cpu import kernels

    model = tiny_model(seed=1)  # head_dim 8
    lean = LeanDecoder(model, PackedLinears(model))
    assert lean.attention == "torch"
    if HAVE_CC:
        assert "no kernel for 4 query heads over 2 key/value heads of size 8" in lean.describe()
        with pytest.raises(LeanUnavailable, match="no kernel for 4 query heads"):
            LeanDecoder(model, PackedLinears(model), kernel=True)
    d64 = llama_gqa_d64()
    try:
        for env, why in [
            ({"RLVR_DECODE_KERNELS": "0"}, "RLVR_DECODE_KERNELS=0"),
            ({"CC": "/nonexistent/cc"}, "could not build decode_kernels.c with /nonexistent/cc"),
            ({"CC": "false"}, "false failed to build decode_kernels.c"),
        ]:
            with monkeypatch.context() as m:
                for k, v in env.items():
                    m.setenv(k, v)
                kernels.load.cache_clear()
                lean = LeanDecoder(d64, PackedLinears(d64))
                assert lean.attention == "torch" and why in lean.describe(), lean.describe()
                with pytest.raises(LeanUnavailable, match="compiled decode kernels are unavailable"):
                    LeanDecoder(d64, PackedLinears(d64), kernel=True)
    finally:
        kernels.load.cache_clear()  # later tests build it again


@pytest.mark.parametrize("arch", ["llama", "qwen2", *KERNEL_SHAPES])
def test_engine_samples_the_same_tokens_with_and_without_lean_decode(arch):
    model, tok = _eos(MODELS[arch]()), tiny_tokenizer()
    G, seeds = 4, [sample_seed(3, i) for i in range(len(PROMPTS) * 4)]
    kwargs = dict(max_new_tokens=12, temperature=0.8, top_k=30, stop=["7"], logprobs=True, batch_seqs=8)
    lean_engine = HFRolloutEngine(model, tok, **kwargs)
    plain_engine = HFRolloutEngine(model, tok, **kwargs, lean_decode=False)
    assert lean_engine.lean is not None and plain_engine.lean is None
    got, want = lean_engine.generate(PROMPTS, G, seeds=seeds), plain_engine.generate(PROMPTS, G, seeds=seeds)
    assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.response_mask, want.response_mask)
    assert got.texts == want.texts
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
    assert got.response_mask.sum(-1).unique().numel() > 1  # rows ended at different steps: some were dropped
    greedy = [e.generate(PROMPTS, 2, greedy=True).input_ids for e in (lean_engine, plain_engine)]
    assert torch.equal(*greedy)


def test_lean_decode_sees_the_policys_new_weights_after_sync():
    """The engine samples from the policy itself; an in-place change of the value weights that leaves
    their version counters alone (as torch's fused AdamW does) is seen after sync_weights(): the
    packed v is repacked, and with it the lean decoder's fused [q; k; v]."""
    policy, tok = _eos(tiny_model(seed=7)), tiny_tokenizer()
    engine = HFRolloutEngine(policy, tok, max_new_tokens=10)
    before = engine.generate(PROMPTS, 2, greedy=True).input_ids
    with torch.no_grad():
        for layer in policy.model.layers:
            layer.self_attn.v_proj.weight.data.normal_(0, 1.0)  # .data: the parameter's version counter stays
    engine.sync_weights()
    after = engine.generate(PROMPTS, 2, greedy=True).input_ids
    fresh = HFRolloutEngine(policy, tok, max_new_tokens=10, lean_decode=False, packed_weights=False)
    assert torch.equal(after, fresh.generate(PROMPTS, 2, greedy=True).input_ids)
    assert not torch.equal(after, before)  # the change mattered


def test_where_lean_decode_cannot_run_it_says_why_and_the_engine_falls_back():
    model = tiny_model(seed=1)
    assert unsupported(model, PackedLinears(model)) is None
    assert "packed weights" in unsupported(model, None)
    bf16 = tiny_model(seed=1).to(torch.bfloat16)
    assert "bfloat16 model" in unsupported(bf16, PackedLinears(bf16))
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(**SHAPE, num_key_value_heads=2))
    assert "MistralForCausalLM is not one of" in unsupported(mistral, PackedLinears(mistral))
    windowed = Qwen2ForCausalLM(
        Qwen2Config(**SHAPE, num_key_value_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    )
    assert "sliding-window" in unsupported(windowed, PackedLinears(windowed))
    from rlvr.models import lora

    adapted = lora.add_adapter(
        tiny_model(seed=1), rank=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"], base="tiny"
    ).model
    assert "layers.0.q_proj is a Linear, not a plain linear layer" in unsupported(adapted, PackedLinears(adapted))
    tok = tiny_tokenizer()
    assert HFRolloutEngine(adapted, tok, max_new_tokens=4).lean is None
    assert HFRolloutEngine(model, tok, max_new_tokens=4, dtype="bfloat16").lean is None  # auto: the model's forward
    with pytest.raises(LeanUnavailable, match="bfloat16 model"):
        HFRolloutEngine(model, tok, max_new_tokens=4, dtype="bfloat16", lean_decode=True)
    with pytest.raises(LeanUnavailable, match="packed weights"):
        HFRolloutEngine(model, tok, max_new_tokens=4, packed_weights=False, lean_decode=True)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.packed_weights=false"], "but model.packed_weights=false"),
        (["model.device=cuda"], "model.device=cuda"),
        (["rollout.dtype=bfloat16"], "but rollout.dtype=bfloat16"),
        (["model.lora.rank=8"], "but model.lora.rank=8"),
    ],
)
def test_lean_decode_true_where_it_cannot_run_is_one_config_error(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config(None, ["rollout.lean_decode=true", *overrides])
    assert load_config(None, ["rollout.lean_decode=false", *overrides]).rollout.lean_decode.as_bool() is False


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the products run as oneDNN's")
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_compiled_products_equal_torch_linear(rows):
    """The kernels' product (``lean_linear``) against ``F.linear``: rows below, at and beyond the 16 it
    keeps in registers, output sizes that do not fill the last weight panel, with and without bias,
    then ``+`` or ``*`` another tensor; and panels rewritten in place keep their memory."""
    from rlvr.cpu import kernels

    k = kernels.load()
    assert k is not None, kernels.why_not
    g = torch.Generator().manual_seed(rows)
    for n, d in [(100, 64), (576, 576), (33, 1536), (k.width, 8)]:
        w, x = torch.randn(n, d, generator=g), torch.randn(rows, d, generator=g)
        bias, other = torch.randn(n, generator=g), torch.randn(rows, n, generator=g)
        panels = k.panels(w)
        assert panels.shape == (-(-n // k.width), d, k.width)
        plain = torch.nn.functional.linear(x, w, bias)
        torch.testing.assert_close(k.linear(x, panels, n, bias), plain, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(k.linear(x, panels, n), plain - bias, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(k.linear(x, panels, n, bias, add=other), plain + other, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(k.linear(x, panels, n, bias, mul=other), plain * other, atol=1e-4, rtol=1e-4)
        w2 = torch.randn(n, d, generator=g)
        again = k.panels(w2, out=panels)
        assert again.data_ptr() == panels.data_ptr()
        torch.testing.assert_close(k.linear(x, again, n), x @ w2.T, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the products run as oneDNN's")
def test_compiled_panels_of_stacked_parts_equal_the_layout_of_their_concatenation():
    """``panels`` of parts stacked along N (as [q; k; v], without their torch.cat) is, exactly, the panel
    layout of the concatenated matrix: parts that start and end inside a panel, a zero-padded last
    panel, and a reused buffer whose old contents do not leak into the padding."""
    from rlvr.cpu import kernels

    k = kernels.load()
    assert k is not None, kernels.why_not
    W, K = k.width, 70
    parts = [torch.randn(n, K) for n in (5, W + 4, W, 3)]
    full = torch.cat(parts)
    n = -(-full.shape[0] // W)
    want = torch.nn.functional.pad(full, (0, 0, 0, n * W - full.shape[0])).view(n, W, K).transpose(1, 2)
    stale = torch.full((n, K, W), float("nan"))
    for out in (None, stale):
        got = k.panels(parts, out=out)
        assert torch.equal(got, want)
    assert k.panels(parts, out=stale).data_ptr() == stale.data_ptr()
    shifted = torch.empty(n * K * W + 1)[1:].view(n, K, W)  # 4 bytes off: not a buffer streaming stores may write
    got = k.panels(parts, out=shifted)
    assert got.data_ptr() != shifted.data_ptr() and torch.equal(got, want)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the softmax and SiLU run as torch's")
def test_compiled_exp_is_within_two_ulp_of_torch():
    """The vector exp the compiled step's softmax and SiLU use: within 2 ulp of torch.exp over the range a
    softmax (x <= 0) and a SiLU (exp(-x)) see, exactly 0 for -inf and below float32's smallest normal
    result, and a length that leaves a partial last vector."""
    from rlvr.cpu import kernels

    k = kernels.load()
    assert k is not None, kernels.why_not
    x = torch.cat([torch.linspace(-87.3, 88.0, 100_003), torch.tensor([0.0, -1e-8, 1e-8])])
    want = torch.exp(x.double())
    got = k.exp(x).double()
    ulp = torch.exp2(torch.floor(torch.log2(want)) - 23)  # float32's spacing at each value
    assert ((got - want).abs() / ulp).max() <= 2.0
    low = k.exp(torch.tensor([float("-inf"), -1e4, -88.0, -100.0, -87.5]))
    assert torch.equal(low, torch.zeros(5))


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_compiled_step_requires_padded_lengths():
    """The step reads whole vectors of key positions: a prompt length or capacity that is not a multiple of
    the vector width (what CascadeCache(multiple=width) guarantees) is refused, not read past."""
    from rlvr.cpu import kernels

    k = kernels.load()
    assert k is not None, kernels.why_not
    shape = kernels.StepShape(
        layers=1, hidden=8, intermediate=8, vocab=8, heads=1, kv_heads=1, head_dim=64, eps=1e-6, scaling=0.125
    )
    x = torch.zeros(1, 8)
    with pytest.raises(ValueError, match="multiples of"):
        k.step(
            shape,
            torch.zeros(1, len(kernels.SLOTS), dtype=torch.int64),
            x,
            x,
            None,
            torch.zeros(1, k.width + 1),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
            k.width,
            0,
            x,
            x,
            x,
        )


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the torch sampler runs")
def test_compiled_sampler_picks_what_inverse_cdf_picks():
    """lean_pick (temperature, exp, two-level float64 CDF and search in one call) against
    rollout/sampling.py's inverse_cdf on z / T: the same token in 30,000 draws over a vocabulary with a
    partial last block and vector, peaked and flat rows, -inf logits and the extreme draws."""
    from rlvr.cpu import kernels
    from rlvr.rollout.sampling import inverse_cdf

    k = kernels.load()
    assert k is not None, kernels.why_not
    g = torch.Generator().manual_seed(0)
    V, rows, differ = 5003, 100, 0
    for T in (1.0, 0.7, 1.3):
        for _ in range(100):
            logits = torch.randn(rows, V, generator=g) * torch.rand(rows, 1, generator=g) * 6
            logits[: rows // 2, :50] += 6  # a peaked head, as a model's next-token logits
            logits[rows // 4 : rows // 2, V // 2 :] = float("-inf")  # cut tokens take no draws
            u = torch.rand(rows, generator=g, dtype=torch.float64)
            got = k.pick(logits, u, T)
            differ += int((got != inverse_cdf(logits / T if T != 1.0 else logits, u, 256)).sum())
            assert (got[rows // 4 : rows // 2] < V // 2).all()
    assert differ == 0
    ends = torch.tensor([0.0, 1 - 2**-53, 0.5], dtype=torch.float64)
    logits = torch.randn(3, V, generator=g)
    torch.testing.assert_close(k.pick(logits, ends), inverse_cdf(logits, ends, 256), rtol=0, atol=0)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the torch sampler runs")
def test_compiled_sampler_gives_the_entropy_with_the_same_tokens():
    """lean_pick's entropy from its own sums (log S - E / S) against entropy_from_logits at the
    temperature, on peaked and flat rows with a partial last block; the tokens as without it, and a
    -inf logit adding nothing (where torch's 0 * -inf would be NaN)."""
    from rlvr.algos import entropy_from_logits
    from rlvr.cpu import kernels

    k = kernels.load()
    assert k is not None, kernels.why_not
    g = torch.Generator().manual_seed(1)
    V, rows = 5003, 64
    for T in (1.0, 0.7):
        logits = torch.randn(rows, V, generator=g) * torch.rand(rows, 1, generator=g) * 6
        logits[: rows // 2, :50] += 8  # peaked rows: entropy far below log V
        u = torch.rand(rows, generator=g, dtype=torch.float64)
        tokens, ent = k.pick(logits, u, T, entropy=True)
        assert torch.equal(tokens, k.pick(logits, u, T)) and ent.dtype == torch.float32
        torch.testing.assert_close(ent, entropy_from_logits(logits[None], temperature=T)[0], rtol=1e-5, atol=1e-5)
    cut = logits[:2].clone()
    cut[:, 100:200] = float("-inf")
    _, ent = k.pick(cut, u[:2], entropy=True)
    assert torch.isfinite(ent).all()
    kept = torch.cat([cut[:, :100], cut[:, 200:]], 1)  # the same distribution without the cut tokens
    torch.testing.assert_close(ent, entropy_from_logits(kept[None])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the torch sampler runs")
def test_engine_samples_with_the_compiled_sampler_what_the_torch_sampler_samples():
    """Without top-k / top-p the lean engine samples by lean_pick, and records the entropy from its
    sums; the plain engine by inverse_cdf, its entropy from a log-softmax."""
    model, tok = _eos(MODELS["llama-gqa-d64"]()), tiny_tokenizer()
    G, seeds = 4, [sample_seed(5, i) for i in range(len(PROMPTS) * 4)]
    kwargs = dict(max_new_tokens=12, temperature=0.8, batch_seqs=8, entropy=True)
    lean_engine = HFRolloutEngine(model, tok, **kwargs)
    assert lean_engine.lean is not None and lean_engine.lean.kernel is not None
    got = lean_engine.generate(PROMPTS, G, seeds=seeds)
    want = HFRolloutEngine(model, tok, **kwargs, lean_decode=False).generate(PROMPTS, G, seeds=seeds)
    assert torch.equal(got.input_ids, want.input_ids) and got.texts == want.texts
    torch.testing.assert_close(got.entropy, want.entropy, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not HAVE_CC or platform.machine() != "x86_64", reason="needs a C compiler on x86-64")
@pytest.mark.parametrize("march", ["x86-64", "x86-64-v3"])
def test_the_kernels_assume_no_cpu_feature_beyond_their_build_target(march):
    """Built for the x86-64 baseline (SSE2: no AVX, FMA or F16C) and for x86-64-v3 (AVX2 + FMA + F16C,
    no AVX-512), whatever this CPU has above it, the products, the exp and the sampler still give
    torch's results: the file needs nothing -march=native does not give it."""
    from rlvr.cpu import kernels

    k = kernels.build(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"), march)
    assert k.width == 8  # neither level has AVX-512
    g = torch.Generator().manual_seed(0)
    for rows, (n, d) in [(1, (100, 64)), (17, (576, 576)), (40, (33, 1536))]:
        w, x, bias = torch.randn(n, d, generator=g), torch.randn(rows, d, generator=g), torch.randn(n, generator=g)
        torch.testing.assert_close(
            k.linear(x, k.panels(w), n, bias), torch.nn.functional.linear(x, w, bias), atol=1e-4, rtol=1e-4
        )
    x = torch.linspace(-87.0, 80.0, 10_001)
    torch.testing.assert_close(k.exp(x), torch.exp(x), rtol=3e-7, atol=0)
    logits, u = torch.randn(4, 1000, generator=g), torch.rand(4, generator=g, dtype=torch.float64)
    from rlvr.rollout.sampling import inverse_cdf

    assert torch.equal(k.pick(logits, u, 0.9), inverse_cdf(logits / 0.9, u))
