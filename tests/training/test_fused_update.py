"""The update and the log-prob passes with the LM head fused into the log-probs give the gradients,
statistics and log-probs of the full-logits path (the path models that cannot fuse still take)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import rlvr.algos.logprobs as logprobs_mod
import rlvr.models.forward as fwd
from rlvr.config import load_config
from rlvr.models.loading import set_checkpointing
from rlvr.models.tiny import tiny_model, tiny_qwen2, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.training.loop import accumulate_gradients, batch_logprobs


def _features_batch(model):
    torch.manual_seed(0)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=8, dtype="float32", logprobs=True)
    batch = engine.generate(["what is 3 + 4 ?", "what is the answer"], 4)
    gen = torch.Generator().manual_seed(0)
    old_logp = batch.logprobs + 0.2 * torch.randn(batch.logprobs.shape, generator=gen)
    ref_logp = batch.logprobs + 0.2 * torch.randn(batch.logprobs.shape, generator=gen)
    return batch, torch.randn(8, generator=gen), old_logp, ref_logp


def _update(model, batch, adv, old_logp, ref_logp, *, shared: bool, mb: int, autocast, tokens: int = 0):
    cfg = load_config(
        None,
        [
            "rollout.samples_per_prompt=4",
            "rollout.temperature=0.7",
            "train.prompts_per_step=2",
            f"train.micro_batch_seqs={mb}",
            f"train.micro_batch_tokens={tokens}",
            f"train.shared_prompt_forward={str(shared).lower()}",
            "algo.dual_clip=1.5",
            "algo.tis_cap=1.5",
            "algo.kl_coef=0.1",
            "algo.entropy_coef=0.01",
            "algo.clip_low=0.1",
            "algo.clip_high=0.1",
        ],
    )
    model.zero_grad(set_to_none=True)
    stats = accumulate_gradients(model, batch, adv, old_logp, ref_logp, cfg, autocast)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    logp = batch_logprobs(
        model,
        batch,
        micro_batch_seqs=mb,
        group_size=4 if shared else 1,
        temperature=0.7,
        autocast=autocast,
        micro_batch_tokens=tokens,
    )
    return grads, stats, logp


@pytest.mark.parametrize("make", [tiny_model, tiny_qwen2], ids=["llama_tied", "qwen2_untied"])
@pytest.mark.parametrize("shared, mb, keep, tokens", [(True, 8, False, 0), (False, 4, True, 0), (False, 8, False, 48)])
def test_fused_update_equals_the_full_logits_update(make, shared, mb, keep, tokens, monkeypatch):
    """Dual-clip, TIS, KL and the entropy bonus (whose gradient goes through the fused head) on; the
    tiles recomputed in the backward (large logits) or kept (small ones); rows shared-prompt, plain
    or packed into 48-token passes (train.micro_batch_tokens)."""
    monkeypatch.setitem(fwd.SHARED_PROMPT_PASS_COST_TOKENS, "cpu", 0)  # share even the tiny prompts
    monkeypatch.setattr(logprobs_mod, "HEAD_CHUNK_TOKENS", 7)  # several tiles, none dividing the sizes
    monkeypatch.setattr(logprobs_mod, "HEAD_CHUNK_VOCAB", 40)
    if not keep:
        monkeypatch.setattr(logprobs_mod, "HEAD_KEEP_LOGITS_BYTES", 0)
    model = make()
    batch, adv, old_logp, ref_logp = _features_batch(model)
    args = (model, batch, adv, old_logp, ref_logp)
    kw = dict(shared=shared, mb=mb, autocast=contextlib.nullcontext, tokens=tokens)
    fused = _update(*args, **kw)
    with monkeypatch.context() as m:
        m.setattr(fwd, "fused_head", lambda model: None)
        full = _update(*args, **kw)
    for name, g in full[0].items():
        torch.testing.assert_close(fused[0][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert fused[1].keys() == full[1].keys()
    for key, value in full[1].items():
        torch.testing.assert_close(fused[1][key], value, rtol=1e-4, atol=1e-6, msg=key)
    torch.testing.assert_close(fused[2], full[2], rtol=1e-5, atol=1e-5)
    assert fused[1]["entropy"] > 0 and sum(g.abs().sum() for g in fused[0].values()) > 0


def test_fused_update_under_bf16_autocast_is_close_to_the_full_logits_update(monkeypatch):
    model = tiny_qwen2()
    batch, adv, old_logp, ref_logp = _features_batch(model)
    args = (model, batch, adv, old_logp, ref_logp)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    fused = _update(*args, shared=False, mb=8, autocast=bf16)
    with monkeypatch.context() as m:
        m.setattr(fwd, "fused_head", lambda model: None)
        full = _update(*args, shared=False, mb=8, autocast=bf16)
    flat = lambda gs: torch.cat([g.flatten() for g in gs.values()])  # noqa: E731
    a, b = flat(fused[0]), flat(full[0])
    assert ((a - b).norm() / b.norm()).item() < 2e-2  # bf16 rounding of the head's product, on both paths
    torch.testing.assert_close(fused[2], full[2], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_bf16_weights_are_cast_once_per_update_not_per_micro_batch(checkpointing):
    """One autocast region spans the update's micro-batches: each weight is cast to bf16 once (autocast's
    cache), and the gradients are bit-identical to casting afresh in every micro-batch (no cache)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model = tiny_qwen2()
    if checkpointing:
        set_checkpointing(model)  # as the trainer does
    batch, adv, old_logp, ref_logp = _features_batch(model)
    weights = {p.data_ptr() for p in model.parameters() if p.dim() == 2}

    class WeightCasts(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in weights:
                WeightCasts.n += (kwargs or {}).get("dtype") == torch.bfloat16
            return func(*args, **(kwargs or {}))

    def update(cache: bool):
        model.zero_grad(set_to_none=True)
        overrides = ["rollout.samples_per_prompt=4", "train.prompts_per_step=2", "train.micro_batch_seqs=2"]
        cfg = load_config(None, overrides)
        autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache)  # noqa: E731
        WeightCasts.n = 0
        with WeightCasts():
            accumulate_gradients(model, batch, adv, old_logp, ref_logp, cfg, autocast)
        return WeightCasts.n, {n: p.grad.clone() for n, p in model.named_parameters()}

    casts, grads = update(cache=True)
    fresh_casts, fresh = update(cache=False)
    linears = sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear))
    # each linear's weight once; the fused LM head's once per micro-batch (its backward reuses it)
    assert casts == linears - 1 + 4
    assert fresh_casts >= 4 * linears  # 4 micro-batches of 2 rows, each casting every weight
    for name, g in fresh.items():
        assert torch.equal(grads[name], g), name
    assert sum(g.abs().sum() for g in grads.values()) > 0


@pytest.mark.parametrize("make", [tiny_model, tiny_qwen2], ids=["llama_tied", "qwen2_untied"])
def test_a_tied_embedding_takes_a_sparse_gradient_into_the_dense_one(make, monkeypatch):
    """Tied: the embedding's gradient reaches the shared weight sparse (no dense [V, H] embedding
    backward), and every gradient equals the dense path's; untied: the dense path, unchanged."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    model = make()
    batch, adv, old_logp, ref_logp = _features_batch(model)

    def grads(sparse: bool):
        with monkeypatch.context() as m:
            if not sparse:
                m.setattr(fwd, "_sparse_tied_embedding_grad", lambda model: contextlib.nullcontext())
            with Ops() as ops:
                g = _update(model, batch, adv, old_logp, ref_logp, shared=True, mb=4, autocast=contextlib.nullcontext)
        return g[0], ops.names

    got, ops = grads(True)
    want, dense_ops = grads(False)
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert ("embedding_dense_backward.default" in ops) != tied
    assert "embedding_dense_backward.default" in dense_ops
    for name, g in want.items():
        assert got[name].layout == torch.strided
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6, msg=name)
    assert not model.get_input_embeddings().sparse  # switched back after the pass
