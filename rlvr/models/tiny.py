"""Tiny randomly initialised models and tokenizers for tests: no downloads, seconds on a CPU."""

from __future__ import annotations

from pathlib import Path

import torch

# A word-level vocabulary big enough for the R1 tags, digits and a few words.
TINY_WORDS = (
    ["<pad>", "<eos>", "<unk>", "<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "}"]
    + [str(i) for i in range(100)]
    + "what is the answer + - * = ? user assistant system a an and of to".split()
)


def tiny_tokenizer():
    """A whitespace word-level fast tokenizer over :data:`TINY_WORDS` (pad/eos are special)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(TINY_WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.padding_side = "left"
    return tok


def _tiny_shape(vocab_size: int, hidden: int, layers: int) -> dict:
    """The config fields :func:`tiny_model` and :func:`tiny_qwen2` share: size, heads, special tokens."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )


def _seeded(model_class, cfg, seed: int):
    """``model_class(cfg)`` initialised under ``seed``, generating with EOS 1 and padding 0."""
    torch.manual_seed(seed)
    model = model_class(cfg)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0
    return model


def tiny_model(
    vocab_size: int = len(TINY_WORDS),
    *,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 32,
    attention_dropout: float = 0.0,
):
    """A seeded Llama-architecture causal LM with ``layers`` layers and width ``hidden``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = _tiny_shape(vocab_size, hidden, layers)
    cfg = LlamaConfig(**shape, tie_word_embeddings=True, attention_dropout=attention_dropout)
    return _seeded(LlamaForCausalLM, cfg, seed)


def tiny_qwen2(*, seed: int = 6, **config):
    """A seeded Qwen2 causal LM of :func:`tiny_model`'s size: q/k/v biases, an untied LM head, 2 KV heads
    for 4 query heads; ``config`` overrides any Qwen2Config field."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = {**_tiny_shape(len(TINY_WORDS), 32, 2), "tie_word_embeddings": False}
    return _seeded(Qwen2ForCausalLM, Qwen2Config(**{**shape, **config}), seed)


def save_tiny_model(path: str | Path, *, seed: int = 0, hidden: int = 32) -> Path:
    """Write a tiny model + tokenizer as a Hugging Face directory (for end-to-end CLI tests); ``hidden``
    256 gives heads of 64, a size the compiled CPU kernels take (8, the default, is one they refuse)."""
    path = Path(path)
    tiny_model(seed=seed, hidden=hidden).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path
