"""Under autocast the rotary embedding's cosines and sines come in autocast's dtype
(rlvr.models.loading.rotary_in_autocast_dtype), so a layer's bf16 queries and keys stay bf16 through
the rotation; outside autocast nothing changes. Tiny models on CPU."""

from __future__ import annotations

import torch

from rlvr.models import load_model
from rlvr.models.loading import _autocast_rotary, rotary_in_autocast_dtype


def _rotary_outputs(model, ids):
    seen = []
    handle = model.model.rotary_emb.register_forward_hook(lambda m, a, out: seen.append(out))
    try:
        logits = model(input_ids=ids).logits
    finally:
        handle.remove()
    return logits, seen


def _without_hook(model):
    hooks = model.model.rotary_emb._forward_hooks
    for key in [k for k, fn in hooks.items() if fn is _autocast_rotary]:
        del hooks[key]
    return model


def test_rotary_is_bf16_under_autocast_and_float32_outside(tiny_model):
    model = load_model(tiny_model)
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain, seen = _rotary_outputs(model, ids)
        assert [t.dtype for t in seen[0]] == [torch.float32, torch.float32]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, seen = _rotary_outputs(model, ids)
        assert [t.dtype for t in seen[0]] == [torch.bfloat16, torch.bfloat16]
        _without_hook(model)
        assert torch.equal(model(input_ids=ids).logits, plain)  # float32: the hook changed nothing
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before = model(input_ids=ids).logits
    torch.testing.assert_close(low.float(), before.float(), rtol=0.05, atol=0.05)  # bf16 rounding only


def test_rotary_hook_is_registered_once(tiny_model):
    model = load_model(tiny_model)
    rotary_in_autocast_dtype(rotary_in_autocast_dtype(model))
    hooks = list(model.model.rotary_emb._forward_hooks.values())
    assert hooks.count(_autocast_rotary) == 1
