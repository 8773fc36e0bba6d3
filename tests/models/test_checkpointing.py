"""Activation checkpointing is turned on by transformers' current name (rlvr.models.loading.
set_checkpointing): no FutureWarning for the name transformers 5 deprecated and v6 removes, on a
plain model and on a LoRA model (whose peft wrapper passes it to the base model). Tiny models on CPU."""

from __future__ import annotations

import warnings

import pytest

from rlvr.models import load_model, lora
from rlvr.models.loading import set_checkpointing


@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_checkpointing_turns_on_and_off_without_a_deprecation_warning(tiny_model, adapter):
    model = load_model(tiny_model)
    if adapter:
        model = lora.add_adapter(
            model, rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"], base="tiny"
        ).model
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning or DeprecationWarning fails the test
        set_checkpointing(model)
        assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
        set_checkpointing(model, False)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
