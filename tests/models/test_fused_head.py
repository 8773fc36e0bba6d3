"""pass_logprobs with the LM head fused into the log-probs, against the full-logits path
(``fused=False``): the same log-probs, entropies and gradients of every parameter, on tiny models,
with the head put back afterwards; the models it must not fuse fall back; the cost rule of the
shared prompt."""

from __future__ import annotations

import inspect

import pytest
import torch

import rlvr.algos.logprobs as logprobs_mod
import rlvr.models.forward as fwd
from rlvr.models import lora
from rlvr.models.forward import fused_head, pass_logprobs, prompt_sharing_pays
from rlvr.models.tiny import tiny_model, tiny_qwen2

B, LP, T = 8, 6, 9


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles that divide neither the 72 response positions nor the 126-word vocabulary, recomputed
    in the backward as large logits are (the tiny logits would be kept)."""
    monkeypatch.setattr(logprobs_mod, "HEAD_CHUNK_TOKENS", 5)
    monkeypatch.setattr(logprobs_mod, "HEAD_CHUNK_VOCAB", 32)
    monkeypatch.setattr(logprobs_mod, "HEAD_KEEP_LOGITS_BYTES", 0)


@pytest.fixture
def always_share(monkeypatch):
    """Share the prompt whatever it saves, so the shared-prompt pass is the one tested."""
    monkeypatch.setitem(fwd.SHARED_PROMPT_PASS_COST_TOKENS, "cpu", 0)


def _batch(seed: int = 0, G: int = 4):
    """[B, LP + T] rows, G per prompt, left padding on some prompts."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 100, (B, LP + T), generator=gen)
    ids[:, :LP] = ids[::G, :LP].repeat_interleave(G, 0)
    am = torch.ones_like(ids)
    am[:G, :2] = 0  # the first prompt is two tokens shorter
    return ids, am, ids[:, LP:]


def _run(model, fused: bool, *, group_size: int, temperature: float, entropy_grad: bool):
    """(logp, entropy, gradient of every parameter) of a loss on both."""
    model.zero_grad(set_to_none=True)
    ids, am, tokens = _batch()
    logp, ent = pass_logprobs(
        model,
        ids,
        am,
        tokens,
        temperature=temperature,
        entropy=True,
        entropy_grad=entropy_grad,
        group_size=group_size,
        fused=fused,
    )
    upstream = torch.linspace(-1, 1, T)
    loss = (logp * upstream).sum() + (0.3 * ent.sum() if entropy_grad else 0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


@pytest.mark.usefixtures("small_tiles", "always_share")
@pytest.mark.parametrize("make", [tiny_model, tiny_qwen2], ids=["llama_tied", "qwen2_untied"])
@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("temperature, entropy_grad", [(1.0, False), (0.7, True)])
def test_fused_equals_full_logits_values_and_gradients(make, group_size, temperature, entropy_grad):
    model = make()
    assert fused_head(model) is model.lm_head
    kw = dict(group_size=group_size, temperature=temperature, entropy_grad=entropy_grad)
    logp, ent, grads = _run(model, True, **kw)
    ref_logp, ref_ent, ref_grads = _run(model, False, **kw)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert "forward" not in vars(model.lm_head)  # the head is its own again


def test_a_tied_head_gets_the_gradient_of_both_its_uses(small_tiles):
    """SmolLM2 ties the head to the embedding: the fused head's weight gradient lands on the one
    shared parameter, next to the embedding's own."""
    model = tiny_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _, _, grads = _run(model, True, group_size=1, temperature=1.0, entropy_grad=False)
    _, _, ref = _run(model, False, group_size=1, temperature=1.0, entropy_grad=False)
    (name,) = [n for n in grads if "embed_tokens" in n or "lm_head" in n]
    torch.testing.assert_close(grads[name], ref[name], rtol=1e-4, atol=1e-6)
    # only the embedding's rows of the input tokens and the head's dense gradient: no row is zero
    assert (grads[name].abs().sum(1) > 0).all()


def test_no_grad_passes_equal_and_no_vocabulary_sized_tensor_is_saved(small_tiles):
    """The old-policy/reference passes (no grad) agree; with grad, nothing of [b, T, V] is kept for backward."""
    model = tiny_qwen2(vocab_size=512)
    ids, am, tokens = _batch()
    with torch.no_grad():
        fused, _ = pass_logprobs(model, ids, am, tokens)
        full, _ = pass_logprobs(model, ids, am, tokens, fused=False)
    torch.testing.assert_close(fused, full, rtol=1e-5, atol=1e-5)
    for use_fused in (True, False):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            pass_logprobs(model, ids, am, tokens, entropy=True, fused=use_fused)
        params = max(p.numel() for p in model.parameters())
        activations = [n for n in sizes if n != params]
        if use_fused:
            assert max(activations) < B * T * 512 // 4  # hidden states and [N] vectors; the largest is a weight
        else:
            assert sum(n for n in activations if n >= B * 512) >= B * T * 512  # the logits (in chunks of 5 tokens)


def test_the_head_is_put_back_when_the_forward_raises(monkeypatch):
    monkeypatch.setenv(fwd.FUSED_ENV, "1")  # the fused path's own error (auto would retry in full)
    model = tiny_model()
    ids, am, tokens = _batch()
    keys = list(model.state_dict())
    with pytest.raises(RuntimeError, match="LM head got hidden states"):
        pass_logprobs(model, ids, am, tokens[:-1])  # one row short of those the head runs on
    assert "forward" not in vars(model.lm_head)
    assert list(model.state_dict()) == keys


def test_bf16_autocast_is_close_to_the_full_logits_under_autocast(small_tiles):
    """Under bf16 autocast both paths round the head's product to bf16: each gradient is as far from
    the float32 one as the full-logits path's is (relative norm, bf16's ~0.4 % per rounding)."""
    model = tiny_qwen2()
    exact = _run(model, False, group_size=1, temperature=0.7, entropy_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(model, True, group_size=1, temperature=0.7, entropy_grad=True)
        want = _run(model, False, group_size=1, temperature=0.7, entropy_grad=True)
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[1], want[1], rtol=2e-2, atol=2e-2)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    for name, g in exact[2].items():
        assert rel(got[2][name], g) < max(2 * rel(want[2][name], g), 1e-2), name
        assert rel(got[2][name], want[2][name]) < 2e-2, name


def test_models_that_change_the_logits_take_the_full_path():
    """Gemma 2 soft-caps its logits after the head: not fused, and pass_logprobs still right."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=126,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=5.0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(cfg)
    assert fused_head(model) is None
    ids, am, tokens = _batch()
    logp, _ = pass_logprobs(model, ids, am, tokens)
    logits = fwd.response_logits(model, ids, am, T)
    want = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(logp, want)


@pytest.mark.parametrize("model_type", sorted(fwd.FUSED_HEAD_MODEL_TYPES))
def test_the_fused_model_types_return_their_heads_output_untouched(model_type):
    """Read off the installed transformers: ``logits = self.lm_head(...)`` on the kept positions and
    no other assignment to ``logits`` (a scale or soft-cap after the head would be lost)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    source = inspect.getsource(getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]).forward)
    assignments = [line.strip() for line in source.splitlines() if line.strip().startswith("logits =")]
    assert assignments == ["logits = self.lm_head(hidden_states)"], assignments
    assert "logits_to_keep" in source


def test_lora_fuses_a_plain_head_and_not_an_adapted_one(small_tiles):
    base = tiny_model(seed=1)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapted = lora.add_adapter(base, rank=4, alpha=8.0, dropout=0.0, target_modules=targets, base="tiny")
    with torch.no_grad():
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model = adapted.model
    assert fused_head(model) is base.lm_head
    logp, _, grads = _run(model, True, group_size=1, temperature=1.0, entropy_grad=False)
    ref_logp, _, ref_grads = _run(model, False, group_size=1, temperature=1.0, entropy_grad=False)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    assert ref_grads and all("lora_" in n for n in ref_grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    with_head = lora.add_adapter(  # untied: peft warns about adapting a tied head
        tiny_qwen2(), rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "lm_head"], base="tiny"
    )
    assert fused_head(with_head.model) is None  # peft's LoRA layer wraps the head: full logits


def test_prompt_sharing_cost_rule():
    # saved = (rows - rows/G) * (prompt_len - 1)
    # quickstart micro-batch: 8 rows, G 8, a 126-token prompt: 7 * 125 = 875 positions saved
    assert prompt_sharing_pays(8, 8, 126, "cpu")
    assert not prompt_sharing_pays(8, 8, 126, "cuda")  # 875 < the GPU's per-pass cost
    # 7 * 1 = 7 positions for a 2-token prompt: not worth a second pass anywhere
    assert not prompt_sharing_pays(8, 8, 2, "cpu")
    assert not prompt_sharing_pays(8, 1, 500, "cpu")  # no groups, nothing to share
    # 16 rows of G 16 with a 512-token prompt: 15 * 511 = 7665 positions saved
    assert prompt_sharing_pays(16, 16, 512, "cuda")


def test_packed_cpu_linears_keep_the_fused_head_and_get_their_forward_back():
    """rlvr.cpu.packed sets every linear's forward (a packed copy of the product) around the trainer's
    log-prob passes and update: the head is fused all the same, and its packed forward put back."""
    from rlvr.cpu.packed import PackedLinears, packing_available

    if not packing_available():
        pytest.skip("this torch has no oneDNN prepacked linears")
    model = tiny_qwen2()
    ids, am, tokens = _batch()
    with torch.no_grad():
        want, _ = pass_logprobs(model, ids, am, tokens, fused=False)
    packed = PackedLinears(model, train=True)
    with packed.active():
        packed_forward = vars(model.lm_head)["forward"]
        assert fused_head(model) is model.lm_head
        with torch.no_grad():
            got, _ = pass_logprobs(model, ids, am, tokens)
        assert vars(model.lm_head)["forward"] is packed_forward
    assert "forward" not in vars(model.lm_head)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_failing_fused_head_falls_back_to_the_full_logits_once_and_says_so(monkeypatch, capsys):
    """Issue 61 fail soft: a fused pass that raises (injected here: the kernel no GPU has run) is redone
    from the full logits, every later pass skips it, and one line says so; RLVR_FUSED_LOGPROBS=1 makes it
    an error and =0 never tries it."""
    model = tiny_qwen2(seed=3)
    ids, am, tokens = _batch()
    want, _ = pass_logprobs(model, ids, am, tokens, group_size=1, fused=False)
    calls = []

    def broken(*args, **kw):
        calls.append(1)
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(fwd.algos, "lm_head_logprobs", broken)
    monkeypatch.setattr(fwd, "fused_failure", None)
    monkeypatch.setenv(fwd.FUSED_ENV, "1")
    with pytest.raises(RuntimeError, match="no kernel image"):
        pass_logprobs(model, ids, am, tokens, group_size=1)
    monkeypatch.setenv(fwd.FUSED_ENV, "auto")
    for _ in range(2):
        got, _ = pass_logprobs(model, ids, am, tokens, group_size=1)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(calls) == 2 and fwd.fused_failure.startswith("RuntimeError: no kernel image")  # tried once in auto
    err = capsys.readouterr().err
    assert err.count("warning: the fused LM-head log-probs failed (RuntimeError: no kernel image") == 1
    assert "RLVR_FUSED_LOGPROBS=0 always does" in err
    monkeypatch.setattr(fwd, "fused_failure", None)
    monkeypatch.setenv(fwd.FUSED_ENV, "0")
    got, _ = pass_logprobs(model, ids, am, tokens, group_size=1)
    assert len(calls) == 2 and fwd.fused_failure is None  # never tried
    monkeypatch.setenv(fwd.FUSED_ENV, "maybe")
    with pytest.raises(Exception, match="RLVR_FUSED_LOGPROBS=maybe: use auto"):
        pass_logprobs(model, ids, am, tokens, group_size=1)
