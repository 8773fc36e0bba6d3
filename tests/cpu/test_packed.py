"""oneDNN-prepacked linear weights (rlvr.cpu.packed) give what the plain forward gives (logits, gradients,
sampled tokens), never from stale weights."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlvr.cpu import packed as packed_mod
from rlvr.cpu.packed import PackedLinears, dtype_unpackable, pack_weight, packable, packing_available
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN prepacked linear")

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?"]


def batch(tok):
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 0.1)])
def test_packed_logits_equal_plain_logits(dtype, tol):
    if (why := dtype_unpackable(dtype)) is not None:  # test_bf16_falls_back_where_onednn_cannot_pack_it runs instead
        pytest.skip(f"not on this CPU: {why}")
    model = tiny_model(seed=1).to(dtype).eval()
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits.float()
        with packed.active():
            got = model(input_ids=ids, attention_mask=mask).logits.float()
        after = model(input_ids=ids, attention_mask=mask).logits.float()
    assert len(packed.linears) == 2 * 7 + 1  # 2 layers x (q, k, v, o, gate, up, down) + the LM head
    torch.testing.assert_close(got, plain, atol=tol, rtol=tol)
    assert torch.equal(after, plain)  # the plain forwards are back after the block


def test_packed_weights_follow_the_optimizer():
    """After an optimizer step (torch's fused AdamW, the trainer's, which leaves the parameters' version
    counters alone) and invalidate(), the packed forward sees the new weights; a changed version
    counter (load_state_dict) or a new tensor repacks without invalidate()."""
    model = tiny_model(seed=2)
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model)
    with torch.no_grad(), packed.active():
        before = model(input_ids=ids, attention_mask=mask).logits
    assert packed.refresh() == 0  # nothing changed: nothing repacked
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    opt.step()
    packed.invalidate()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with packed.active():
            got = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    assert (got - before).abs().max() > 1e-3  # the step moved the logits, and the packed forward saw it
    model.load_state_dict({k: v + 0.01 for k, v in model.state_dict().items()})
    assert packed.refresh() == len(packed.linears)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert packed.refresh() == 1


def test_engine_samples_from_the_weights_after_a_training_step():
    """The trainer's order: fused AdamW step, sync_weights(), generate: the packed engine samples what an
    engine without packing samples from the same updated weights."""
    tok = tiny_tokenizer()
    model = tiny_model(seed=7)
    engine = HFRolloutEngine(model, tok, max_new_tokens=16, logprobs=True, packed_weights=True)
    seeds = [sample_seed(8, i) for i in range(len(PROMPTS) * 4)]
    engine.generate(PROMPTS, 4, seeds=seeds)  # packs the starting weights
    ids, mask = batch(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    model(input_ids=ids, attention_mask=mask).logits[..., 1].sum().backward()  # push towards EOS
    opt.step()
    engine.sync_weights()
    got = engine.generate(PROMPTS, 4, seeds=seeds)
    plain = HFRolloutEngine(model, tok, max_new_tokens=16, logprobs=True, packed_weights=False).generate(
        PROMPTS, 4, seeds=seeds
    )
    assert torch.equal(got.input_ids, plain.input_ids)
    torch.testing.assert_close(got.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)


def test_gradients_through_packed_weights_equal_the_plain_ones():
    """The update's path (_PackedLinearFn): the same loss and gradients as the plain forward and backward."""
    model, ref = tiny_model(seed=3), tiny_model(seed=3)
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model, train=True)
    with packed.active():
        logits = model(input_ids=ids, attention_mask=mask).logits
        assert type(logits.grad_fn).__name__ == "_PackedLinearFnBackward"  # the LM head ran the packed path
        (logits.log_softmax(-1)[..., 5] * mask).sum().backward()
    plain = ref(input_ids=ids, attention_mask=mask).logits
    (plain.log_softmax(-1)[..., 5] * mask).sum().backward()
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen-weight"])
def test_a_linear_with_bias_and_a_frozen_weight(frozen):
    """Biases (Qwen2's q/k/v) get their gradient; a frozen weight (LoRA's base layer) passes the input's gradient on."""
    torch.manual_seed(0)
    lin, ref = torch.nn.Linear(24, 40), torch.nn.Linear(24, 40)
    ref.load_state_dict(lin.state_dict())
    for m in (lin, ref):
        m.weight.requires_grad_(not frozen)
    x = torch.randn(3, 5, 24, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    with PackedLinears(lin, train=True).active():
        y = lin(x)
    (y**2).sum().backward()
    (ref(xr) ** 2).sum().backward()
    torch.testing.assert_close(y, ref(xr), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad, atol=1e-4, rtol=1e-5)
    if frozen:
        assert lin.weight.grad is None
    else:
        torch.testing.assert_close(lin.weight.grad, ref.weight.grad, atol=1e-4, rtol=1e-5)


def test_an_optimizer_step_inside_the_block_is_seen_by_the_next_forward():
    """algo.num_iterations > 1: several fused-AdamW steps in one block; each forward after a step uses the new
    weights (watch() invalidates, the forward repacks), so the run equals the plain one."""
    runs = {}
    ids, mask = batch(tiny_tokenizer())
    for use in (True, False):
        model = tiny_model(seed=9)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        packed = PackedLinears(model, train=True)
        packed.watch(opt)
        losses = []
        with packed.active() if use else contextlib.nullcontext():
            for _ in range(3):
                loss = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)[..., 7].mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        runs[use] = losses, [p.detach().clone() for p in model.parameters()]
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-5)
    assert len(set(runs[True][0])) == 3  # the loss moved each step: the forwards saw the new weights
    for a, b in zip(runs[True][1], runs[False][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_without_train_gradient_forwards_take_the_plain_path():
    """train=False (the default with AVX2 dispatch): no-grad forwards packed, forwards that need gradients plain."""
    model = tiny_model(seed=11)
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model, train=False)
    with packed.active():
        logits = model(input_ids=ids, attention_mask=mask).logits
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    assert type(logits.grad_fn).__name__ != "_PackedLinearFnBackward"
    assert all(s.packed is not None for s in packed.slots)  # the no-grad forward packed them
    assert all(s._t is None for s in packed.slots)  # no transposes: no backward went through them


def test_autocast_forwards_take_the_plain_path():
    model = tiny_model(seed=10)
    ids, mask = batch(tiny_tokenizer())
    with PackedLinears(model).active(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert logits.dtype == torch.bfloat16 and type(logits.grad_fn).__name__ != "_PackedLinearFnBackward"


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_engine_samples_the_same_with_and_without_packing(temperature, top_k, top_p):
    """Seeded sampling draws the same tokens (and near-equal log-probs) from packed and plain weights."""
    tok = tiny_tokenizer()
    out = {}
    for packed in (True, False):
        engine = HFRolloutEngine(
            tiny_model(seed=4),
            tok,
            max_new_tokens=24,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            logprobs=True,
            packed_weights=packed,
        )
        assert (engine.packed is not None) == packed
        seeds = [sample_seed(5, i) for i in range(len(PROMPTS) * 4)]
        out[packed] = engine.generate(PROMPTS, 4, seeds=seeds)
    a, b = out[True], out[False]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


def test_engine_packs_by_default_where_it_applies_and_refuses_where_it_cannot():
    tok = tiny_tokenizer()
    assert packable(tiny_model())
    assert HFRolloutEngine(tiny_model(), tok, max_new_tokens=4).packed is not None
    half = tiny_model().to(torch.float16)
    assert HFRolloutEngine(half, tok, max_new_tokens=4, dtype="float16").packed is None  # auto: not for float16
    with pytest.raises(ValueError, match="packed weights: oneDNN packs float32 and bfloat16 weights, not float16"):
        HFRolloutEngine(half, tok, max_new_tokens=4, dtype="float16", packed_weights=True)


def _bf16_refused(monkeypatch) -> str:
    """The bf16 probe's answer on this CPU, or (where oneDNN can pack bf16) the answer of a CPU that cannot."""
    why = dtype_unpackable(torch.bfloat16)
    if why is None:
        why = "oneDNN cannot pack bfloat16 weights on this CPU: it needs avx512bw+avx512vl+avx512dq or avx_ne_convert"
        real = packed_mod.dtype_unpackable
        monkeypatch.setattr(packed_mod, "dtype_unpackable", lambda d: why if d == torch.bfloat16 else real(d))
    return why


def test_the_bf16_probe_matches_the_cpu_features():
    """The probe (a real pack, caught) agrees with the CPU features torch's bf16 check reads; a refusal names them."""
    flags = packed_mod.cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    has = all(f in flags for f in ("avx512bw", "avx512vl", "avx512dq")) or "avx_ne_convert" in flags
    why = dtype_unpackable(torch.bfloat16)
    assert (why is None) == has
    if why is not None:
        assert "avx512bw+avx512vl+avx512dq or avx_ne_convert" in why and "this CPU lacks" in why
    assert dtype_unpackable(torch.float32) is None


def test_bf16_falls_back_where_onednn_cannot_pack_it(monkeypatch):
    """auto: a bf16 rollout runs unpacked and says why, and samples what the plain forward samples;
    True: refused with that reason. The real probe on a CPU without the features, a faked one elsewhere."""
    why = _bf16_refused(monkeypatch)
    tok = tiny_tokenizer()
    engine = HFRolloutEngine(tiny_model(seed=2), tok, max_new_tokens=6, dtype="bfloat16", packed_weights=None)
    assert engine.packed is None and engine.lean is None and engine.unpacked == why
    plain = HFRolloutEngine(tiny_model(seed=2), tok, max_new_tokens=6, dtype="bfloat16", packed_weights=False)
    a, b = (e.generate(PROMPTS, 2, seeds=list(range(6))) for e in (engine, plain))
    assert a.texts == b.texts
    with pytest.raises(ValueError, match="packed weights: oneDNN cannot pack bfloat16"):
        HFRolloutEngine(tiny_model(seed=2), tok, max_new_tokens=6, dtype="bfloat16", packed_weights=True)
    assert HFRolloutEngine(tiny_model(seed=2), tok, max_new_tokens=6).unpacked is None  # float32 still packs


def test_the_block_multiplies_by_the_packed_copies():
    """Inside active() a no-grad forward reads the packed weights, not the module's: an LM head packed
    from zeros (with its record saying it is current) gives zero logits."""
    model = tiny_model(seed=6).eval()
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model)
    packed.refresh()
    head = packed.linears.index(model.lm_head)
    packed.slots[head].packed = pack_weight(torch.zeros_like(model.lm_head.weight), 16)
    with torch.no_grad(), packed.active():
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.count_nonzero(logits) == 0


def test_an_optimizer_step_repacks_only_the_weights_it_trains():
    """LoRA's case: the frozen base stays packed; the trained weights are repacked after a step and
    after sync_weights."""
    model = tiny_model(seed=12)
    for name, p in model.named_parameters():
        p.requires_grad_("mlp.down_proj" in name)  # the trained part: one linear per layer
    ids, mask = batch(tiny_tokenizer())
    packed = PackedLinears(model, train=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, fused=True)
    packed.watch(opt)
    with packed.active():
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    opt.step()
    assert packed.refresh() == 2  # the two down projections, nothing else
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with packed.active():
            torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, plain, atol=1e-5, rtol=1e-5)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=4, packed_weights=True)
    engine.packed.refresh()
    engine.sync_weights()
    assert engine.packed.refresh() == 2


def test_a_forward_set_on_the_instance_is_kept_and_restored():
    """A hook that replaced a linear's forward on the instance (accelerate's offloading does) still runs for the
    forwards the packed path leaves alone, and is back after the block."""
    lin = torch.nn.Linear(8, 4)
    calls = []
    plain = lin.forward

    def hooked(x):
        calls.append(1)
        return plain(x)

    lin.forward = hooked
    x = torch.randn(2, 8, requires_grad=True)
    with PackedLinears(lin, train=False).active():
        lin(x).sum().backward()  # with gradients and train=False: the instance's own forward
        assert calls == [1]
        with torch.no_grad():
            torch.testing.assert_close(lin(x), plain(x), atol=1e-6, rtol=1e-6)  # packed
    assert lin.forward is hooked
