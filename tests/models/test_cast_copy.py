"""The rollout engine's copy of the policy in another dtype (``cast_copy``): equal to the old
``copy.deepcopy(policy).to(dtype)`` with the floating buffers (rotary ``inv_freq``) kept float32, yet
never a second full-precision model, even for a moment."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlvr.models.loading import cast_copy
from rlvr.models.tiny import tiny_model, tiny_qwen2
from rlvr.rollout import HFRolloutEngine

MODELS = {"llama_tied": lambda: tiny_model(seed=1), "qwen2_untied_biases": lambda: tiny_qwen2(seed=2)}


class Allocations(TorchDispatchMode):
    """Bytes of the new tensors each op makes (in-place ops aside), by dtype, off the meta device."""

    def __init__(self):
        super().__init__()
        self.bytes = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.__name__.split(".")[0].endswith("_"):  # copy_, fill_...: write into what exists
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    self.bytes[t.dtype] += t.numel() * t.element_size()
        return out


def _tensors(model) -> dict:
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))  # non-persistent ones too (rotary inv_freq)
    return named


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # float32: FSDP's gathered copy
def test_cast_copy_equals_the_deepcopy_it_replaces(name, dtype):
    policy = MODELS[name]()
    old, new = copy.deepcopy(policy).to(dtype), cast_copy(policy, dtype)
    for key, buf in policy.named_buffers():  # the deepcopy, with its floating buffers as the policy's
        if buf.is_floating_point():
            owner, _, leaf = key.rpartition(".")
            old.get_submodule(owner)._buffers[leaf] = buf.clone()
    want, got = _tensors(old), _tensors(new)
    assert want.keys() == got.keys()
    for k, t in want.items():
        u = got[k]
        assert (u.dtype, u.device, u.requires_grad, type(u)) == (t.dtype, t.device, t.requires_grad, type(t)), k
        assert torch.equal(u, t), k
    mine = {id(t) for t in _tensors(policy).values()}
    assert not any(id(t) in mine or t.data_ptr() in {p.data_ptr() for p in policy.parameters()} for t in got.values())
    tied = policy.lm_head.weight is policy.model.embed_tokens.weight
    assert (new.lm_head.weight is new.model.embed_tokens.weight) == tied == (name == "llama_tied")
    ids = torch.tensor([[5, 9, 13, 2, 40]])
    torch.testing.assert_close(new(ids).logits, old(ids).logits, rtol=0, atol=0)
    with torch.no_grad():
        new.model.norm.weight.add_(1.0)  # its own storage: the policy does not change
    assert not torch.equal(new.model.norm.weight.float(), policy.model.norm.weight)


def test_no_second_full_precision_copy_while_it_is_built():
    policy = tiny_qwen2(seed=2)
    n = sum(p.numel() for p in policy.parameters())
    with Allocations() as made:
        cast_copy(policy, torch.bfloat16)
    buffers = sum(b.numel() for b in policy.buffers()) * 4
    assert made.bytes[torch.float32] == buffers, dict(made.bytes)  # the buffers alone in the policy's dtype
    assert made.bytes[torch.bfloat16] == 2 * n  # the bf16 copy itself, once
    with Allocations() as old:  # the negative control: the deepcopy clones the fp32 model first
        copy.deepcopy(policy).to(torch.bfloat16)
    assert old.bytes[torch.float32] >= 4 * n


def test_a_bf16_copy_keeps_the_rotary_frequencies_float32():
    policy = tiny_qwen2(seed=2)
    (name, inv_freq), *_ = [(k, b) for k, b in policy.named_buffers() if k.endswith("inv_freq")]
    copied = dict(cast_copy(policy, torch.bfloat16).named_buffers())[name]
    assert copied.dtype == torch.float32 and torch.equal(copied, inv_freq)
    # why: a bf16 inv_freq (the old copy) turns the angle at position 3,072 by radians on some frequencies
    angle = 3072 * torch.tensor([1.0, 1 / 3, 1 / 7, 0.0123])
    off = (angle - 3072 * torch.tensor([1.0, 1 / 3, 1 / 7, 0.0123]).bfloat16().float()).abs().max()
    assert off > 0.5


def test_the_engine_samples_from_a_cast_copy():
    policy = tiny_model(seed=1)
    from rlvr.models.tiny import tiny_tokenizer

    engine = HFRolloutEngine(
        policy, tiny_tokenizer(), max_new_tokens=4, dtype="bfloat16", packed_weights=False, lean_decode=False
    )
    assert engine.model is not policy and {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    for (k, p), q in zip(policy.named_parameters(), engine.model.parameters()):
        assert torch.equal(q, p.to(torch.bfloat16)), k
