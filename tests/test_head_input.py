"""The LM head's input is made contiguous (rlvr.models.loading.contiguous_head_input): a frozen model
(LoRA's base, its bf16 generation copy, a reference copy) no longer copies the head's weight once per
row of a ``logits_to_keep`` slice, and freezing a model no longer changes its logits. Tiny models on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from packaging.version import Version
from torch.profiler import ProfilerActivity, profile

from rlvr.models import load_model, lora
from rlvr.models.loading import _contiguous_input, contiguous_head_input

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _ids(model, rows=16, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (rows, length), generator=g)


def _largest_allocation(model, ids, keep: int) -> int:
    """Bytes of the largest allocation (net, per operator) of one no-grad forward pass."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(input_ids=ids, logits_to_keep=keep)
    return max(e.cpu_memory_usage for e in prof.events())


def _without_fix(model):
    """The model as it ran before the fix: no pre-hook on its LM head."""
    old = copy.deepcopy(model)
    hooks = old.get_output_embeddings()._forward_pre_hooks
    for key in [k for k, fn in hooks.items() if fn is _contiguous_input]:
        del hooks[key]
    return old


def test_a_lora_models_bf16_generation_copy_does_not_copy_the_head_per_row(tiny_model):
    # as the trainer builds it: load, add the adapter (the base frozen), the engine's bf16 deep copy
    policy = lora.add_adapter(
        load_model(tiny_model), rank=4, alpha=8.0, dropout=0.0, target_modules=TARGETS, base="tiny"
    ).model
    gen = copy.deepcopy(policy).to(torch.bfloat16).eval()
    ids = _ids(gen)
    V, H = gen.config.vocab_size, gen.config.hidden_size
    per_row_copy = ids.shape[0] * V * H * 2  # the head's weight expanded to every row, bf16
    # generation's prefill keeps the last position: hidden[:, -1:, :] is not contiguous across rows.
    # Without the fix, transformers up to 5.23 copied the head per row here (so the test can fail);
    # 5.24 no longer does, so there the old path is not asserted, only the fixed one.
    if Version(transformers.__version__) < Version("5.24"):
        assert _largest_allocation(_without_fix(gen), ids, 1) >= per_row_copy
    assert _largest_allocation(gen, ids, 1) < per_row_copy / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("keep", [1, 4])
def test_freezing_a_model_does_not_change_its_logits(tiny_model, dtype, keep):
    model = load_model(tiny_model).to(dtype).eval()
    ids = _ids(model)
    with torch.no_grad():
        trained = model(input_ids=ids, logits_to_keep=keep).logits
        frozen = model.requires_grad_(False)(input_ids=ids, logits_to_keep=keep).logits
    assert torch.equal(frozen, trained)


@pytest.mark.parametrize("keep", [1, 4, 11])
@pytest.mark.parametrize("frozen", [False, True])
def test_logits_equal_the_old_path(tiny_model, keep, frozen):
    """Bit for bit where the old path already folded the rows into one matmul (a weight that requires
    grad: full fine-tuning) or kept more than one position (the log-prob passes, ``logits_to_keep=T+1``,
    and a whole sequence); a frozen model's 1-position prefill ran one matrix-vector product per row
    before, whose rounding differs in the last bits."""
    model = load_model(tiny_model).eval().requires_grad_(not frozen)
    ids = _ids(model)
    with torch.no_grad():
        new = model(input_ids=ids, logits_to_keep=keep).logits
        old = _without_fix(model)(input_ids=ids, logits_to_keep=keep).logits
    if frozen and keep == 1:
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(new, old)


def test_the_hook_is_added_once_and_survives_lora_merging(tiny_model, tmp_path):
    model = load_model(tiny_model)
    contiguous_head_input(contiguous_head_input(model))
    hooks = list(model.get_output_embeddings()._forward_pre_hooks.values())
    assert hooks.count(_contiguous_input) == 1
    adapted = lora.add_adapter(model, rank=4, alpha=8.0, dropout=0.0, target_modules=TARGETS, base=str(tiny_model))
    adapted.save_pretrained(tmp_path / "adapter")
    merged = lora.load_merged(tmp_path / "adapter", base=tiny_model)
    assert _contiguous_input in merged.get_output_embeddings()._forward_pre_hooks.values()
