"""Models: loading (HF dir, hub id, GGUF, built-in), forward passes returning per-token log-probs, tiny test models."""

from rlvr.models.forward import pass_logprobs, response_logits
from rlvr.models.loading import (
    BUILTIN_MODELS,
    cache_dir,
    context_tokens,
    eval_mode,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)

__all__ = [
    "BUILTIN_MODELS",
    "cache_dir",
    "context_tokens",
    "eval_mode",
    "load_model",
    "load_tokenizer",
    "pass_logprobs",
    "resolve_device",
    "resolve_model_path",
    "response_logits",
]
